//! The gateway's P/D (prefill/decode disaggregation) mode: each request is prefilled on a
//! prefill worker and decoded on a decode worker, speaking vLLM's disaggregated protocol
//! (`pd_wire.rs`) as vLLM's own proxy does; the pair comes from a [`PairPlanner`]
//! (`pd_plan.rs`), the legs are sent by `pd_proxy.rs`.
//!
//! Routes:
//!
//! - `POST /v1/completions` and `POST /v1/chat/completions`: the requests, in two legs.
//! - `GET /v1/models`: the models the decode side's endpoints list, each once (they serve
//!   the model to the client); `503` when none answers.
//! - `GET /stats`: each side's targets and how requests went.
//! - `GET /metrics`: the gateway's own metrics in Prometheus text (`pd_telemetry.rs`):
//!   requests by plan and outcome, failed prefill legs, each side's targets, times to first
//!   token and latencies, the router's fleet signals.
//! - `GET /health`: up, with each side's available targets; `GET /ready`: `503` while no
//!   decode target is available or the gateway is shutting down.
//!
//! Every side's endpoint is probed at `/health`; one that fails is out of planning until it
//! answers again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use prefix_router::{RankLayout, WorkerId};
use serde_json::{Value, json};

use super::app::Options;
use super::pd_plan::{PairPlanner, Role};
use super::pd_proxy;
use super::pd_telemetry::PdTelemetry;
use super::prompt::{Endpoint, Prompts};
use super::telemetry;

/// One side of the fleet: its endpoints' base URLs, each of `layout`'s data-parallel
/// ranks, so target `t` is rank `layout.rank(t)` of `urls[layout.endpoint(t)]`.
pub(crate) struct Side {
    urls: Vec<String>,
    layout: RankLayout,
    /// By target: attempts that could not reach it.
    failures: Vec<AtomicU64>,
}

impl Side {
    /// A side of `urls` (base URLs such as `http://127.0.0.1:8001`), `layout`'s ranks each.
    pub(crate) fn new(urls: Vec<String>, layout: RankLayout) -> Self {
        let targets = layout.targets(urls.len() as u32) as usize;
        Self {
            urls,
            layout,
            failures: (0..targets).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// How many targets it has.
    pub(crate) fn targets(&self) -> u32 {
        self.layout.targets(self.urls.len() as u32)
    }

    /// The URL of `path` on target `t`'s endpoint.
    pub(crate) fn url(&self, t: WorkerId, path: &str) -> String {
        format!("{}{path}", self.urls[self.layout.endpoint(t) as usize])
    }

    /// The rank to name in `X-data-parallel-rank` for `t`: none with one rank per endpoint.
    pub(crate) fn rank_header(&self, t: WorkerId) -> Option<u32> {
        (self.layout.ranks() > 1).then(|| self.layout.rank(t))
    }

    /// The rank of `t`.
    pub(crate) fn rank(&self, t: WorkerId) -> u32 {
        self.layout.rank(t)
    }

    /// Counts an attempt that could not reach `t`.
    fn failed(&self, t: WorkerId) {
        if let Some(f) = self.failures.get(t.index()) {
            f.fetch_add(1, Relaxed);
        }
    }
}

/// How P/D requests went, counted once each.
#[derive(Default)]
pub(crate) struct PdCounts {
    /// Prefilled on a prefill worker, decoded with its transfer parameters.
    pub(crate) split: AtomicU64,
    /// Not split: sent to the decode worker alone.
    pub(crate) local: AtomicU64,
    /// Prefilled, but the answer had no transfer parameters: decoded without them (the
    /// decode worker prefilled again), as vLLM's proxy does.
    pub(crate) without_params: AtomicU64,
    /// The prefill leg failed (an error status, an unreadable answer, a timeout): the
    /// client got the error.
    pub(crate) prefill_failed: AtomicU64,
}

/// The P/D gateway's state.
pub(crate) struct PdGateway {
    pub(crate) planner: Arc<dyn PairPlanner>,
    pub(crate) prefill: Side,
    pub(crate) decode: Side,
    pub(crate) client: reqwest::Client,
    started: Instant,
    pub(crate) prompts: Option<Arc<Prompts>>,
    pub(crate) request_timeout: Duration,
    pub(crate) loras: Vec<String>,
    draining: AtomicBool,
    pub(crate) counts: PdCounts,
    /// The gateway's own metrics (`GET /metrics`).
    pub(crate) telemetry: PdTelemetry,
}

impl PdGateway {
    /// A gateway planning with `planner`, which must plan over `prefill.targets()` prefill
    /// and `decode.targets()` decode targets. Upstreams get 2 s to accept a connection and
    /// may stay silent 120 s at most between bytes.
    pub(crate) fn new(
        planner: Arc<dyn PairPlanner>,
        prefill: Side,
        decode: Side,
        options: Options,
    ) -> Arc<Self> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .read_timeout(Duration::from_secs(120))
            .build()
            .unwrap_or_default();
        let telemetry = PdTelemetry::new(prefill.targets(), decode.targets());
        Arc::new(Self {
            planner,
            prefill,
            decode,
            client,
            started: Instant::now(),
            prompts: options.prompts,
            request_timeout: options.request_timeout,
            loras: options.loras,
            draining: AtomicBool::new(false),
            counts: PdCounts::default(),
            telemetry,
        })
    }

    /// The gateway stops taking requests: `/ready` says so from now on.
    pub(crate) fn drain(&self) {
        self.draining.store(true, Relaxed);
    }

    /// The gateway's clock, on which requests are timed for the planner.
    pub(crate) fn clock(&self) -> Duration {
        self.started.elapsed()
    }

    /// `role`'s side.
    pub(crate) fn side(&self, role: Role) -> &Side {
        match role {
            Role::Prefill => &self.prefill,
            Role::Decode => &self.decode,
        }
    }

    /// `target` of `role`'s side could not be reached: counted, and out of planning until
    /// its health probe answers.
    pub(crate) fn unreachable(&self, role: Role, target: WorkerId) {
        self.side(role).failed(target);
        self.telemetry.unreachable(role, target);
        self.planner.set_available(role, target, false);
    }

    /// How many of `role`'s targets the planner may choose now.
    fn available(&self, role: Role) -> usize {
        (0..self.side(role).targets())
            .filter(|&t| {
                self.planner
                    .load(role, WorkerId::new(t))
                    .is_some_and(|l| l.available)
            })
            .count()
    }
}

/// The P/D gateway's HTTP routes.
pub(crate) fn app(gateway: Arc<PdGateway>) -> axum::Router {
    axum::Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/stats", get(stats))
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .with_state(gateway)
}

async fn completions(
    State(gw): State<Arc<PdGateway>>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    pd_proxy::handle(gw, Endpoint::Completions, headers, body).await
}

async fn chat(
    State(gw): State<Arc<PdGateway>>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    pd_proxy::handle(gw, Endpoint::Chat, headers, body).await
}

/// `GET /v1/models`: the models the decode side's endpoints list (`models.rs`): they serve
/// the model to the client.
async fn models(State(gw): State<Arc<PdGateway>>) -> Response {
    super::models::list(&gw.client, &gw.decode.urls).await
}

/// `GET /stats`: the planner, how requests went, and each side's targets.
async fn stats(State(gw): State<Arc<PdGateway>>) -> Json<Value> {
    let c = &gw.counts;
    Json(json!({
        "mode": "pd",
        "planner": gw.planner.name(),
        "requests": {
            "split": c.split.load(Relaxed),
            "local": c.local.load(Relaxed),
            "without_params": c.without_params.load(Relaxed),
            "prefill_failed": c.prefill_failed.load(Relaxed),
        },
        "prefill": targets(&gw, Role::Prefill),
        "decode": targets(&gw, Role::Decode),
    }))
}

/// `GET /metrics`: the gateway's own metrics in Prometheus text (`pd_telemetry.rs`).
async fn metrics(State(gw): State<Arc<PdGateway>>) -> Response {
    telemetry::response(gw.telemetry.render(gw.planner.as_ref()))
}

/// Each target of `role`'s side as the planner sees it.
fn targets(gw: &PdGateway, role: Role) -> Vec<Value> {
    let side = gw.side(role);
    (0..side.targets())
        .map(WorkerId::new)
        .map(|t| {
            let load = gw.planner.load(role, t);
            json!({
                "worker": t.get(),
                "upstream": side.urls[side.layout.endpoint(t) as usize],
                "rank": side.rank(t),
                "available": load.map(|l| l.available),
                "in_flight": load.map(|l| l.in_flight),
                "routed": load.map(|l| l.routed),
                "failures": side.failures[t.index()].load(Relaxed),
            })
        })
        .collect()
}

async fn health(State(gw): State<Arc<PdGateway>>) -> Json<Value> {
    Json(json!({
        "status": "ok",
        "available_prefill_workers": gw.available(Role::Prefill),
        "available_decode_workers": gw.available(Role::Decode),
    }))
}

/// 200 while a decode target is available and the gateway is not shutting down (without
/// prefill targets requests are decoded where they are prefilled).
async fn ready(State(gw): State<Arc<PdGateway>>) -> Response {
    let decode = gw.available(Role::Decode);
    let draining = gw.draining.load(Relaxed);
    let status = if decode > 0 && !draining {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({"ready": status == StatusCode::OK, "available_decode_workers": decode, "draining": draining});
    (status, Json(body)).into_response()
}

/// Probes every endpoint of both sides at `/health` every `interval`, forever: an endpoint
/// that answers 200 within 2 s has its ranks available to the planner, any other has them
/// out.
pub(crate) async fn probe_forever(gw: Arc<PdGateway>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    loop {
        tick.tick().await;
        for role in [Role::Prefill, Role::Decode] {
            let side = gw.side(role);
            for (endpoint, url) in side.urls.iter().enumerate() {
                let answer = gw
                    .client
                    .get(format!("{url}/health"))
                    .timeout(Duration::from_secs(2))
                    .send()
                    .await;
                let healthy = answer.is_ok_and(|a| a.status().is_success());
                for rank in 0..side.layout.ranks() {
                    if let Ok(t) = side.layout.target(endpoint as u32, rank) {
                        gw.planner.set_available(role, t, healthy);
                    }
                }
            }
        }
    }
}
