//! The gateway under a burst it cannot serve in time: slow mock workers (each answer held
//! 500 ms), more concurrent requests with a time-to-first-token target than the fleet's
//! queues can take within it. The excess is refused with `429`, nothing is lost (every
//! request gets a completion or a refusal, and `/stats` and `/metrics` count what the
//! clients saw), and every admitted request completes. The split between served and shed
//! depends on the load model and on timing: only its sums, and that both happen, are
//! checked.

use std::collections::BTreeMap;

use super::fleet::*;
use serde_json::{Value, json};

const BURST: usize = 32;
/// How long a mock worker holds each answer.
const PAUSE_MS: u64 = 500;
/// The requests' target: a 2,048-token prefill takes about 62 ms on an idle worker, so a
/// worker's queue meets it for a few requests only.
const TARGET_MS: &str = "300";

/// Request `i`'s priority: standard and sheddable in turn.
fn priority(i: usize) -> &'static str {
    if i % 2 == 0 { "standard" } else { "sheddable" }
}

/// Request `i`: 2,048 tokens no other request shares, answered after [`PAUSE_MS`].
async fn send(client: reqwest::Client, gw: String, i: usize) -> (u16, Value) {
    let start = (i * 4_096) as u32;
    let tokens: Vec<u32> = (start..start + 2_048).collect();
    let body = json!({"model": "m", "prompt": tokens, "max_tokens": 1, "mock_pause_ms": PAUSE_MS});
    let resp = client
        .post(format!("{gw}/v1/completions"))
        .header("content-type", "application/json")
        .header("x-ttft-target-ms", TARGET_MS)
        .header("x-priority", priority(i))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let (status, v, headers) = read(resp).await;
    if status == 429 {
        assert!(headers.contains_key("retry-after"), "{v}");
    }
    (status, v)
}

/// What the clients saw: requests served, and those refused by priority and by limit.
#[derive(Default)]
struct Seen {
    served: usize,
    shed_by_priority: BTreeMap<&'static str, u64>,
    shed_by_limit: BTreeMap<String, u64>,
}

impl Seen {
    fn shed(&self) -> u64 {
        self.shed_by_priority.values().sum()
    }

    /// Counts request `i`'s answer; anything but a completion or a refusal fails the test.
    fn count(&mut self, i: usize, status: u16, v: &Value) {
        match status {
            200 => {
                assert_eq!(v["choices"][0]["text"], " ok done", "{v}");
                self.served += 1;
            }
            429 => {
                assert_eq!(v["error"]["type"], "overloaded", "{v}");
                let code = v["error"]["code"].as_str().unwrap();
                let limit = code.strip_prefix("shed_").unwrap().to_owned();
                *self.shed_by_limit.entry(limit).or_default() += 1;
                *self.shed_by_priority.entry(priority(i)).or_default() += 1;
            }
            _ => panic!("request {i}: {status} {v}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_beyond_the_fleet_is_shed_and_nothing_is_lost() {
    let ups: Vec<Upstream> = (0..2).map(|_| Upstream::start(65_536)).collect();
    let gw = gateway("balanced", &ups.iter().collect::<Vec<_>>()).await;
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(20))
        .pool_max_idle_per_host(BURST)
        .build()
        .unwrap();
    let tasks: Vec<_> = (0..BURST)
        .map(|i| tokio::spawn(send(client.clone(), gw.clone(), i)))
        .collect();
    let mut seen = Seen::default();
    for (i, task) in tasks.into_iter().enumerate() {
        let (status, v) = task.await.unwrap();
        seen.count(i, status, &v);
    }
    let shed = seen.shed();
    eprintln!(
        "served {}, shed {:?} by limit",
        seen.served, seen.shed_by_limit
    );
    assert_eq!(seen.served + shed as usize, BURST);
    assert!(seen.served > 0 && shed > 0, "served {}", seen.served);

    let stats = wait_idle(&client, &gw).await;
    check_stats(&stats, &seen);
    check_metrics(&scrape(&client, &gw).await, &seen);

    // With the burst gone, the same request is admitted again.
    let (status, v) = send(client.clone(), gw.clone(), BURST).await;
    assert_eq!(status, 200, "{v}");
}

/// `/stats` routed exactly the requests served and refused exactly those shed, by limit.
fn check_stats(stats: &Value, seen: &Seen) {
    let workers = stats["workers"].as_array().unwrap();
    let routed: u64 = workers.iter().map(|w| w["routed"].as_u64().unwrap()).sum();
    assert_eq!(routed, seen.served as u64, "{stats}");
    for w in workers {
        assert_eq!(w["failures"], 0, "{stats}");
        assert_eq!(w["prefill_tokens"], 0, "{stats}");
    }
    let by_limit: BTreeMap<String, u64> = serde_json::from_value(stats["shed"].clone()).unwrap();
    assert_eq!(by_limit, seen.shed_by_limit, "{stats}");
}

/// `/metrics` counts every request once, with the clients' outcomes, refusals by limit and
/// priority, and a latency for each request served that covers the worker's pause.
fn check_metrics(scrape: &prometheus_parse::Scrape, seen: &Seen) {
    let requests = |with: &[(&str, &str)]| total(scrape, "gateway_requests_total", with);
    assert_eq!(requests(&[]), BURST as f64);
    assert_eq!(requests(&[("outcome", "served")]), seen.served as f64);
    assert_eq!(
        requests(&[("outcome", "shed"), ("worker", "none")]),
        seen.shed() as f64
    );
    for (priority, count) in &seen.shed_by_priority {
        let with = [("priority", *priority)];
        assert_eq!(total(scrape, "gateway_shed_total", &with), *count as f64);
    }
    for (limit, count) in &seen.shed_by_limit {
        let with = [("limit", limit.as_str())];
        assert_eq!(total(scrape, "gateway_shed_total", &with), *count as f64);
    }
    let latency = |name: &str| total(scrape, name, &[]);
    assert_eq!(
        latency("gateway_request_duration_seconds_count"),
        seen.served as f64
    );
    let pause_s = PAUSE_MS as f64 / 1_000.0;
    assert!(latency("gateway_request_duration_seconds_sum") >= seen.served as f64 * pause_s);
    assert_eq!(total(scrape, "gateway_worker_in_flight", &[]), 0.0);
    assert_eq!(total(scrape, "gateway_worker_available", &[]), 2.0);
}
