//! What the gateway's loopback tests share: the gateway example's modules, mock workers on
//! their own runtimes, a gateway in front of them, and a client's helpers.

#[path = "../../examples/gateway/app.rs"]
pub mod app;
#[path = "../../examples/gateway/chat.rs"]
pub mod chat;
#[path = "../../examples/common/cli.rs"]
pub mod cli;
#[path = "../../examples/common/engine_settings.rs"]
pub mod engine_settings;
#[path = "../../examples/gateway/engines.rs"]
pub mod engines;
#[cfg(feature = "zmq")]
#[path = "../../examples/gateway/events.rs"]
pub mod events;
#[path = "../../examples/gateway/flags.rs"]
pub mod flags;
#[path = "../../examples/gateway/metrics.rs"]
pub mod metrics;
#[path = "../../examples/gateway/mock.rs"]
pub mod mock;
#[path = "../../examples/gateway/mock_cache.rs"]
pub mod mock_cache;
#[cfg(feature = "zmq")]
#[path = "../../examples/gateway/mock_events.rs"]
pub mod mock_events;
#[path = "../../examples/gateway/models.rs"]
pub mod models;
#[path = "../../examples/gateway/pd.rs"]
pub mod pd;
#[path = "../../examples/gateway/pd_mock.rs"]
pub mod pd_mock;
#[path = "../../examples/gateway/pd_plan.rs"]
pub mod pd_plan;
#[path = "../../examples/gateway/pd_proxy.rs"]
pub mod pd_proxy;
#[path = "../../examples/gateway/pd_telemetry.rs"]
pub mod pd_telemetry;
#[path = "../../examples/gateway/pd_wire.rs"]
pub mod pd_wire;
#[path = "../../examples/common/policy.rs"]
pub mod policy;
#[path = "../../examples/gateway/probe.rs"]
pub mod probe;
#[path = "../../examples/gateway/prompt.rs"]
pub mod prompt;
#[path = "../../examples/gateway/replica.rs"]
pub mod replica;
#[path = "../../examples/gateway/signals.rs"]
pub mod signals;
#[path = "../../examples/gateway/stream.rs"]
pub mod stream;
#[path = "../../examples/gateway/telemetry.rs"]
pub mod telemetry;
#[path = "../../examples/gateway/tokenize.rs"]
pub mod tokenize;
#[cfg(feature = "zmq")]
#[path = "../../examples/vllm_events/zmq.rs"]
pub mod zmq;

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

/// A mock worker on its own thread and runtime, so that killing it closes every socket.
pub struct Upstream {
    pub url: String,
    /// Per rank, its KV-event and replay sockets, when it publishes events.
    pub events: Vec<(String, String)>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Upstream {
    pub fn start(capacity_blocks: usize) -> Self {
        Self::with_ranks(capacity_blocks, 1)
    }

    /// A mock endpoint of `ranks` data-parallel ranks, each caching `capacity_blocks`.
    pub fn with_ranks(capacity_blocks: usize, ranks: u32) -> Self {
        Self::spawn(capacity_blocks, ranks, None)
    }

    /// A mock endpoint reading text and chat prompts with `prompts`.
    pub fn with_prompts(capacity_blocks: usize, prompts: &Arc<prompt::Prompts>) -> Self {
        Self::spawn(capacity_blocks, 1, Some(Arc::clone(prompts)))
    }

    pub fn spawn(
        capacity_blocks: usize,
        ranks: u32,
        prompts: Option<Arc<prompt::Prompts>>,
    ) -> Self {
        Self::spawn_with(capacity_blocks, ranks, prompts, false)
    }

    /// A mock endpoint of one rank that publishes its KV events over ZMQ.
    #[cfg(feature = "zmq")]
    pub fn with_events(capacity_blocks: usize, prompts: Option<Arc<prompt::Prompts>>) -> Self {
        Self::spawn_with(capacity_blocks, 1, prompts, true)
    }

    fn spawn_with(
        capacity_blocks: usize,
        ranks: u32,
        prompts: Option<Arc<prompt::Prompts>>,
        events: bool,
    ) -> Self {
        Self::launch(move |_| async move {
            let worker = mock::MockWorker::new(capacity_blocks, ranks, prompts);
            let (worker, published) = publishing(worker, ranks, events).await;
            (mock::mock_app(Arc::new(worker)), published)
        })
    }

    /// A mock P/D worker in `role` of `ranks` data-parallel ranks, reading text and chat
    /// prompts with `prompts`; its engine id names its URL.
    pub fn pd(role: pd_plan::Role, ranks: u32, prompts: Option<Arc<prompt::Prompts>>) -> Self {
        Self::launch(move |url| async move {
            let worker = mock::MockWorker::new(4_096, ranks, prompts);
            let engine = format!("mock-{}@{url}", role.name());
            let mock = pd_mock::PdMock::new(worker, role, engine);
            (pd_mock::pd_mock_app(Arc::new(mock)), Vec::new())
        })
    }

    /// Serves `app`, a scripted upstream, on a loopback port, on a thread and runtime of
    /// its own.
    pub fn serving(app: axum::Router) -> Self {
        Self::launch(move |_| async move { (app, Vec::new()) })
    }

    /// Serves the app `make` builds (given its URL; with its KV-event sockets, if any) on
    /// a loopback port, on a thread and runtime of its own.
    fn launch<F, Fut>(make: F) -> Self
    where
        F: FnOnce(String) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = (axum::Router, Vec<(String, String)>)>,
    {
        let (bound, endpoints) = std::sync::mpsc::channel();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let own = url.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let (app, published) = make(own).await;
                bound.send(published).unwrap();
                let server = axum::serve(app::no_delay(listener), app);
                tokio::select! {
                    _ = server => {}
                    _ = stopped => {}
                }
            });
            // Dropping the runtime here ends every connection task.
        });
        Self {
            url,
            events: endpoints.recv().unwrap(),
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn kill(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

/// `worker`, publishing its events when asked, and where it publishes them.
#[cfg(feature = "zmq")]
async fn publishing(
    worker: mock::MockWorker,
    ranks: u32,
    events: bool,
) -> (mock::MockWorker, Vec<(String, String)>) {
    if !events {
        return (worker, Vec::new());
    }
    let publishers = mock_events::Publishers::bind("127.0.0.1", ranks)
        .await
        .unwrap();
    let endpoints = publishers.endpoints.clone();
    (worker.with_events(publishers), endpoints)
}

#[cfg(not(feature = "zmq"))]
async fn publishing(
    worker: mock::MockWorker,
    _: u32,
    events: bool,
) -> (mock::MockWorker, Vec<(String, String)>) {
    assert!(!events, "KV events need the zmq feature");
    (worker, Vec::new())
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts a gateway with `policy` over `upstreams`; returns its base URL.
pub async fn gateway(policy: &str, upstreams: &[&Upstream]) -> String {
    gateway_with_ranks(policy, upstreams, 1).await
}

/// Starts a gateway with `policy` over `upstreams` of `ranks` data-parallel ranks each.
pub async fn gateway_with_ranks(policy: &str, upstreams: &[&Upstream], ranks: u32) -> String {
    gateway_with_options(policy, upstreams, ranks, policy::PolicyOptions::default()).await
}

/// Starts a gateway with `policy` built with `options`.
pub async fn gateway_with_options(
    policy: &str,
    upstreams: &[&Upstream],
    ranks: u32,
    options: policy::PolicyOptions,
) -> String {
    gateway_with(policy, upstreams, ranks, options, app::Options::default()).await
}

/// Follows the KV events of every upstream that publishes them, replay socket included.
#[cfg(feature = "zmq")]
fn follow_events(
    gw: &Arc<app::Gateway>,
    upstreams: &[&Upstream],
    layout: &prefix_router::RankLayout,
) {
    if upstreams.iter().all(|u| u.events.is_empty()) {
        return;
    }
    let values: Vec<String> = upstreams
        .iter()
        .map(|u| format!("{},{}", u.events[0].0, u.events[0].1))
        .collect();
    for source in events::sources(&values, layout, upstreams.len() as u32).unwrap() {
        tokio::spawn(events::follow_forever(Arc::clone(gw), source));
    }
}

#[cfg(not(feature = "zmq"))]
fn follow_events(_: &Arc<app::Gateway>, _: &[&Upstream], _: &prefix_router::RankLayout) {}

/// Starts a gateway as its command line `flags` (after the program's name) asks, following
/// the KV events its `--kv-events` name with the engine settings its flags give; returns
/// its base URL and the lines it says at start of what it assumes of each engine.
#[cfg(feature = "zmq")]
pub async fn gateway_from_flags(flags: &[&str]) -> (String, Vec<String>) {
    let f = flags::parse_from(std::iter::once("gateway").chain(flags.iter().copied())).unwrap();
    let layout = prefix_router::RankLayout::new(f.ranks).unwrap();
    let targets = layout.targets(f.upstreams.len() as u32);
    let router = policy::build(&f.policy, targets, &f.options)
        .unwrap()
        .unwrap();
    let lines = engines::apply(
        router.as_ref(),
        &layout,
        &f.upstreams,
        &f.engine_settings,
        &f.options,
    )
    .unwrap();
    let endpoints = f.upstreams.len() as u32;
    let gw = app::Gateway::new(router, f.upstreams, layout, app::Options::default());
    for source in events::sources(&f.kv_events, &layout, endpoints).unwrap() {
        tokio::spawn(events::follow_forever(Arc::clone(&gw), source));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(app::no_delay(listener), app::app(gw)).await });
    (url, lines)
}

/// Starts a gateway with `policy` built with `options`, handling requests with `app`.
pub async fn gateway_with(
    policy: &str,
    upstreams: &[&Upstream],
    ranks: u32,
    options: policy::PolicyOptions,
    app: app::Options,
) -> String {
    let layout = prefix_router::RankLayout::new(ranks).unwrap();
    let targets = layout.targets(upstreams.len() as u32);
    let router = policy::build(policy, targets, &options).unwrap().unwrap();
    let urls = upstreams.iter().map(|u| u.url.clone()).collect();
    let gw = app::Gateway::new(router, urls, layout, app);
    follow_events(&gw, upstreams, &layout);
    tokio::spawn(probe::probe_forever(
        Arc::clone(&gw),
        Duration::from_millis(100),
    ));
    tokio::spawn(metrics::scrape_forever(
        std::sync::Arc::clone(&gw),
        "/metrics".to_owned(),
        Duration::from_millis(100),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(app::no_delay(listener), app::app(gw)).await });
    url
}

pub async fn get(client: &reqwest::Client, url: String) -> Value {
    let text = client.get(url).send().await.unwrap().text().await.unwrap();
    serde_json::from_str(&text).unwrap()
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

pub async fn post(
    client: &reqwest::Client,
    gw: &str,
    body: &Value,
    session: Option<&str>,
) -> (u16, Value, reqwest::header::HeaderMap) {
    let mut req = client
        .post(format!("{gw}/v1/completions"))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(s) = session {
        req = req.header("x-session-id", s);
    }
    read(req.send().await.unwrap()).await
}

/// Polls the gateway's `/stats` until `done` holds for worker 0, for at most 5 s.
pub async fn wait_for(client: &reqwest::Client, gw: &str, done: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..100 {
        let stats = get(client, format!("{gw}/stats")).await;
        if done(&stats["workers"][0]) {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the gateway's stats never got there");
}

/// Polls the gateway's `/stats` until no worker has a request in flight, for at most 5 s.
pub async fn wait_idle(client: &reqwest::Client, gw: &str) -> Value {
    for _ in 0..100 {
        let stats = get(client, format!("{gw}/stats")).await;
        let workers = stats["workers"].as_array().unwrap();
        if workers.iter().all(|w| w["in_flight"] == 0) {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the gateway's workers never went idle");
}

/// The gateway's `GET /metrics`, checked to be Prometheus text, parsed.
pub async fn scrape(client: &reqwest::Client, gw: &str) -> prometheus_parse::Scrape {
    let resp = client.get(format!("{gw}/metrics")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let kind = resp.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
    let text = resp.text().await.unwrap();
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap()
}

/// The sum of the samples named `name` that carry every `(label, value)` of `with`: a
/// histogram's count is its `_count` sample.
pub fn total(scrape: &prometheus_parse::Scrape, name: &str, with: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| with.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}

/// The byte-level test tokenizer and its ChatML template.
pub fn test_prompts() -> Arc<prompt::Prompts> {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tokenizer/bytelevel");
    let p = prompt::Prompts::load(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
        1 << 20,
    )
    .unwrap();
    Arc::new(p)
}

/// A gateway with the test tokenizer over two mock workers that tokenize alike.
pub async fn chat_fleet(prompts: &Arc<prompt::Prompts>) -> (Vec<Upstream>, String) {
    let ups: Vec<Upstream> = (0..2)
        .map(|_| Upstream::with_prompts(4_096, prompts))
        .collect();
    let gw = gateway_reading("cache_aware", &ups, prompts).await;
    (ups, gw)
}

/// A gateway with `policy` over `upstreams` that reads text and chat prompts with
/// `prompts`.
pub async fn gateway_reading(
    policy: &str,
    upstreams: &[Upstream],
    prompts: &Arc<prompt::Prompts>,
) -> String {
    let options = app::Options {
        prompts: Some(Arc::clone(prompts)),
        ..app::Options::default()
    };
    let refs: Vec<&Upstream> = upstreams.iter().collect();
    gateway_with(policy, &refs, 1, policy::PolicyOptions::default(), options).await
}

pub async fn post_to(
    client: &reqwest::Client,
    url: String,
    body: &Value,
) -> (u16, Value, reqwest::header::HeaderMap) {
    let resp = post_json(client, url, body).await;
    read(resp).await
}

/// A response's status, body (`null` when it is not JSON) and headers.
pub async fn read(resp: reqwest::Response) -> (u16, Value, reqwest::header::HeaderMap) {
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::Null),
        headers,
    )
}

/// A completion's cached tokens as the gateway predicted them (its
/// `x-predicted-cached-tokens` header) and as the worker reported them (its usage).
pub fn predicted_and_reported(v: &Value, headers: &reqwest::header::HeaderMap) -> (u64, u64) {
    let predicted = headers["x-predicted-cached-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let reported = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    (predicted, reported)
}

/// Posts `body` as JSON to `url`.
pub async fn post_json(client: &reqwest::Client, url: String, body: &Value) -> reqwest::Response {
    client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}
