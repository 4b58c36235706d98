//! The gateway: an OpenAI-compatible reverse proxy that routes with `prefix_router`.
//! Completions are answered whole or, with `"stream": true`, streamed through as they come
//! (`stream.rs`).
//!
//! Shared by `examples/gateway/main.rs` (the binary) and the tests in `tests/gateway/`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use prefix_router::{
    Error, Priority, RankLayout, RouteDecision, RouteRequest, Router, Shed, TokenId, WorkerId,
    namespace_salt,
};
use serde_json::{Value, json};

use super::models;
use super::prompt::{self, Endpoint, Prompts};
use super::stream;
use super::telemetry::{self, Outcome, Telemetry};

/// Per-upstream counters the gateway keeps beside the router's load.
#[derive(Default)]
pub(crate) struct UpstreamStats {
    predicted_cached_tokens: AtomicU64,
    reported_cached_tokens: AtomicU64,
    prompt_tokens: AtomicU64,
    failures: AtomicU64,
    /// Streamed requests whose first content came, and the microseconds to it, summed.
    first_tokens: AtomicU64,
    first_token_us: AtomicU64,
    /// When its engine's metrics were last read, in microseconds since the gateway
    /// started; 0: never.
    scraped_at_us: AtomicU64,
    pub(crate) events: EventCounters,
}

/// What a target's KV-event stream did (`events.rs`).
#[derive(Default)]
pub(crate) struct EventCounters {
    /// Batches applied to the mirror.
    pub(crate) batches: AtomicU64,
    /// Events the mirror rejected (see the router's `SyncError`s).
    pub(crate) rejected: AtomicU64,
    /// Batches that came from the engine's replay socket to fill a gap.
    pub(crate) replayed: AtomicU64,
    /// Gaps the replay could not fill.
    pub(crate) unfilled_gaps: AtomicU64,
    /// Events that contradicted the settings assumed of the target's engine (`engines.rs`):
    /// its engine runs otherwise than the gateway was told.
    pub(crate) settings_conflicts: AtomicU64,
    /// The last batch's lag (the gateway's clock when it was applied, minus the engine's
    /// `ts`), in microseconds; 0 when negative or before the first batch.
    pub(crate) lag_us: AtomicU64,
}

impl EventCounters {
    fn json(&self) -> Value {
        let batches = self.batches.load(Relaxed);
        json!({
            "batches": batches,
            "rejected": self.rejected.load(Relaxed),
            "replayed": self.replayed.load(Relaxed),
            "unfilled_gaps": self.unfilled_gaps.load(Relaxed),
            "settings_conflicts": self.settings_conflicts.load(Relaxed),
            "lag_ms": (batches > 0).then(|| self.lag_us.load(Relaxed) as f64 / 1_000.0),
        })
    }
}

/// The gateway's state: the router, the upstream endpoints, and their data-parallel ranks.
/// Each (endpoint, rank) is a routing target, numbered by `layout`: target `t` is rank
/// `layout.rank(t)` of `upstreams[layout.endpoint(t)]`.
pub(crate) struct Gateway {
    router: Arc<dyn Router>,
    upstreams: Vec<String>,
    layout: RankLayout,
    /// By target.
    stats: Vec<UpstreamStats>,
    client: reqwest::Client,
    started: Instant,
    prompts: Option<Arc<Prompts>>,
    /// Whether the router's policy reads the prompt; when it does not (it routes on load
    /// alone), text and chat prompts are not tokenized unless admission needs their length.
    reads_prompt: bool,
    request_timeout: Duration,
    loras: Vec<String>,
    /// Set when the gateway stops taking requests: it is no longer ready.
    draining: AtomicBool,
    /// Requests admission refused, by the limit that bound them (`queue`, `kv`, ...).
    shed: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// The gateway's own metrics (`GET /metrics`).
    telemetry: Telemetry,
    /// Replica sync's counters (`replica.rs`), when it runs.
    sync: Arc<super::replica::SyncStatus>,
}

/// The policies that route on load alone: they read neither the prompt nor the cache.
const LOAD_ONLY_POLICIES: [&str; 3] = ["round_robin", "least_loaded", "power_of_two"];

/// How a gateway handles requests, beside its router and upstreams.
pub(crate) struct Options {
    /// The model's tokenizer and chat template, for text and chat prompts; without them only
    /// token-ID prompts are routed.
    pub(crate) prompts: Option<Arc<Prompts>>,
    /// How long an upstream may take to answer a request whole, or to start a stream.
    pub(crate) request_timeout: Duration,
    /// The model names that are LoRA adapters: a request naming one is routed in the
    /// adapter's cache namespace, as the engine's events for it are. Any other name is the
    /// base model's.
    pub(crate) loras: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            prompts: None,
            request_timeout: Duration::from_secs(300),
            loras: Vec::new(),
        }
    }
}

impl Gateway {
    /// Counts a request admission refused.
    fn count_shed(&self, shed: &Shed) {
        if let Ok(mut by_limit) = self.shed.lock() {
            *by_limit.entry(shed.limit.name()).or_insert(0) += 1;
        }
        self.telemetry.shed(shed);
    }

    /// The gateway's own metrics.
    pub(crate) fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    /// A gateway routing over `upstreams` (base URLs such as `http://127.0.0.1:8001`), each
    /// with `layout`'s data-parallel ranks, with `router`, which must route over targets
    /// `0..layout.targets(upstreams.len())`. An upstream gets 2 s to accept a connection
    /// and may then stay silent for 120 s at most between bytes (a stream may last longer
    /// than `options.request_timeout`; its start may not).
    pub(crate) fn new(
        router: Arc<dyn Router>,
        upstreams: Vec<String>,
        layout: RankLayout,
        options: Options,
    ) -> Arc<Self> {
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(2))
            .read_timeout(std::time::Duration::from_secs(120))
            .build()
            .unwrap_or_default();
        let targets = layout.targets(upstreams.len() as u32) as usize;
        Arc::new(Self {
            stats: (0..targets).map(|_| UpstreamStats::default()).collect(),
            reads_prompt: !LOAD_ONLY_POLICIES.contains(&router.name()),
            router,
            upstreams,
            layout,
            client,
            started: Instant::now(),
            prompts: options.prompts,
            request_timeout: options.request_timeout,
            loras: options.loras,
            draining: AtomicBool::new(false),
            shed: std::sync::Mutex::default(),
            telemetry: Telemetry::new(targets),
            sync: Arc::default(),
        })
    }

    /// Replica sync's counters.
    pub(crate) fn sync_status(&self) -> &Arc<super::replica::SyncStatus> {
        &self.sync
    }

    /// The gateway stops taking requests: `/ready` says so from now on.
    pub(crate) fn drain(&self) {
        self.draining.store(true, Relaxed);
    }

    /// How many targets the router may send requests to now.
    fn available_targets(&self) -> usize {
        (0..self.stats.len())
            .filter(|&i| {
                self.router
                    .load(WorkerId::new(i as u32))
                    .is_some_and(|l| l.available)
            })
            .count()
    }

    /// How many upstream endpoints there are.
    pub(crate) fn endpoints(&self) -> u32 {
        self.upstreams.len() as u32
    }

    /// The endpoints' data-parallel ranks.
    pub(crate) fn layout(&self) -> &RankLayout {
        &self.layout
    }

    /// The text at `path` of `endpoint` (its metrics), read within 2 s; `None` on failure.
    pub(crate) async fn get_text(&self, endpoint: u32, path: &str) -> Option<String> {
        let url = format!("{}{path}", self.upstreams.get(endpoint as usize)?);
        let response = self
            .client
            .get(url)
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()?;
        if !response.status().is_success() {
            return None;
        }
        response.text().await.ok()
    }

    /// Makes every rank of `endpoint` available to the router, or takes them out.
    pub(crate) fn set_endpoint_available(&self, endpoint: u32, available: bool) {
        for rank in 0..self.layout.ranks() {
            if let Ok(target) = self.layout.target(endpoint, rank) {
                let _ = self.router.set_available(target, available);
            }
        }
    }

    /// The gateway's clock: time since it started, on which load reports and requests are
    /// timed for the router.
    pub(crate) fn clock(&self) -> Duration {
        self.started.elapsed()
    }

    /// `target`'s engine reported `load` just now: the router hears it.
    pub(crate) fn scraped(&self, target: WorkerId, load: prefix_router::EngineLoad) {
        if self.router.report_load(target, load).is_ok() {
            let now = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.stats[target.index()]
                .scraped_at_us
                .store(now.max(1), Relaxed);
        }
    }

    /// Milliseconds since `target`'s metrics were last read; `None` if never.
    fn metrics_age_ms(&self, target: usize) -> Option<f64> {
        let at = self.stats[target].scraped_at_us.load(Relaxed);
        let now = self.started.elapsed().as_micros() as f64;
        (at > 0).then(|| (now - at as f64).max(0.0) / 1_000.0)
    }

    /// The URL of target `t`'s endpoint.
    fn upstream(&self, t: WorkerId) -> &str {
        &self.upstreams[self.layout.endpoint(t) as usize]
    }

    /// Target `t`'s counters (`events.rs` counts KV events there).
    #[cfg_attr(not(feature = "zmq"), allow(dead_code))]
    pub(crate) fn target_stats(&self, t: WorkerId) -> Option<&UpstreamStats> {
        self.stats.get(t.index())
    }

    /// The router.
    pub(crate) fn router(&self) -> &dyn Router {
        self.router.as_ref()
    }

    /// A streamed request's first content came `elapsed` after it arrived: the router
    /// learns the worker's speed from it.
    pub(crate) fn first_token_after(&self, decision: &RouteDecision, elapsed: Duration) {
        self.router.first_token_after(decision, elapsed);
        let s = &self.stats[decision.worker().index()];
        s.first_tokens.fetch_add(1, Relaxed);
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        s.first_token_us.fetch_add(us, Relaxed);
        self.telemetry.first_token(decision.worker(), elapsed);
    }

    /// The upstream reported `cached` of the request's `tokens` (salted with `salt`) cached,
    /// of a prompt of `prompt_tokens` by its count: counted, and fed back to the router's
    /// mirror. The prompt's length is `tokens`' unless the gateway did not tokenize it
    /// (`tokens` is empty), then the upstream's count.
    pub(crate) fn reported(
        &self,
        decision: &RouteDecision,
        tokens: &[TokenId],
        salt: &[u8],
        (cached, prompt_tokens): (u64, Option<u64>),
    ) {
        let w = decision.worker();
        let stats = &self.stats[w.index()];
        let prompt = match tokens.len() {
            0 => prompt_tokens.unwrap_or(0),
            n => n as u64,
        };
        let predicted = decision.cached_tokens() as u64;
        stats.reported_cached_tokens.fetch_add(cached, Relaxed);
        stats.predicted_cached_tokens.fetch_add(predicted, Relaxed);
        stats.prompt_tokens.fetch_add(prompt, Relaxed);
        self.telemetry.cached(w, predicted, cached, prompt);
        if let Some(sync) = self.router.cache_sync().filter(|_| !tokens.is_empty()) {
            let _ = sync.report_cached_salted(w, salt, tokens, cached as usize);
        }
    }
}

/// The HTTP routes: `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models`,
/// `GET /stats`, `GET /metrics` (the gateway's own, in Prometheus text), `GET /health` (the
/// gateway is up) and `GET /ready` (it can route: some worker is available and it is not
/// shutting down).
pub(crate) fn app(gateway: Arc<Gateway>) -> axum::Router {
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

/// `listener` with Nagle's algorithm off on every connection it accepts, so that each
/// streamed event leaves when it is written (with it on, small writes wait for the client's
/// delayed acknowledgement, up to 40 ms).
pub(crate) fn no_delay(
    listener: tokio::net::TcpListener,
) -> impl axum::serve::Listener<Addr = std::net::SocketAddr> {
    use axum::serve::ListenerExt;
    listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    })
}

/// An OpenAI-style error answer with `status`.
pub(crate) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let kind = match status {
        StatusCode::BAD_REQUEST => "invalid_request_error",
        StatusCode::GATEWAY_TIMEOUT => "timeout",
        _ => "upstream_error",
    };
    (
        status,
        Json(json!({"error": {"message": message.into(), "type": kind}})),
    )
        .into_response()
}

/// A request as the gateway routes it; the body goes upstream unchanged (a streamed one asks
/// for the usage event too).
pub(crate) struct Incoming {
    pub(crate) endpoint: Endpoint,
    pub(crate) tokens: Vec<TokenId>,
    /// The request's cache namespace: its LoRA adapter and `cache_salt` (see
    /// [`prefix_router::namespace_salt`]), as the engine's KV events name it.
    pub(crate) salt: Vec<u8>,
    session: Option<String>,
    pub(crate) streamed: bool,
    /// Whether the client asked for the routing receipt (`x-routing-receipt`).
    explain: bool,
    /// The time-to-first-token target (`x-ttft-target-ms`): the request asks for admission.
    ttft_target: Option<Duration>,
    /// The time-per-output-token target (`x-tpot-target-ms`): the request asks for
    /// admission.
    tpot_target: Option<Duration>,
    /// Its priority under admission (`x-priority`: critical, standard or sheddable).
    priority: Priority,
    body: Bytes,
}

impl Incoming {
    /// Reads a request as `gw` routes it: its text or chat prompt is tokenized only when
    /// the policy reads the prompt or the request asks for admission (which weighs the
    /// prompt's length); otherwise `tokens` is empty, or the token IDs the client sent.
    fn parse(
        gw: &Gateway,
        endpoint: Endpoint,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Self, String> {
        let tokenize =
            |targets: &Targets| gw.reads_prompt || targets.ttft.is_some() || targets.tpot.is_some();
        let prompts = gw.prompts.as_deref();
        Self::read_if(prompts, &gw.loras, endpoint, headers, body, tokenize)
    }

    /// Reads a request to `endpoint`: its prompt with `prompts`, in the namespace of its
    /// model when `loras` lists it. The error is the message of a `400`.
    pub(crate) fn read(
        prompts: Option<&Prompts>,
        loras: &[String],
        endpoint: Endpoint,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Self, String> {
        Self::read_if(prompts, loras, endpoint, headers, body, |_| true)
    }

    /// [`read`](Self::read), tokenizing a text or chat prompt only when `tokenize` says so
    /// of the request's admission headers (the prompt is checked all the same).
    fn read_if(
        prompts: Option<&Prompts>,
        loras: &[String],
        endpoint: Endpoint,
        headers: &HeaderMap,
        body: Bytes,
        tokenize: impl FnOnce(&Targets) -> bool,
    ) -> Result<Self, String> {
        let value: Value = serde_json::from_slice(&body)
            .map_err(|e| format!("the body is not valid JSON: {e}"))?;
        let Some(object) = value.as_object() else {
            return Err("the body must be a JSON object".into());
        };
        let targets = admission_headers(headers)?;
        let tokens = if tokenize(&targets) {
            prompt::request_tokens(prompts, endpoint, object)?
        } else {
            prompt::untokenized_request(prompts, endpoint, object)?
        };
        let text = |key: &str| object.get(key).and_then(Value::as_str).map(str::to_owned);
        let session = headers
            .get("x-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .or_else(|| text("user"));
        let lora = text("model").filter(|m| loras.contains(m));
        let salt = namespace_salt(lora.as_deref(), text("cache_salt").as_deref());
        let streamed = stream::is_streamed(&value);
        let Targets {
            ttft: ttft_target,
            tpot: tpot_target,
            priority,
        } = targets;
        Ok(Self {
            endpoint,
            tokens,
            salt,
            session,
            streamed,
            explain: headers.contains_key("x-routing-receipt"),
            ttft_target,
            tpot_target,
            priority,
            body: if streamed {
                stream::with_usage(value)
            } else {
                body
            },
        })
    }

    /// The request the router sees.
    pub(crate) fn route_request(&self) -> RouteRequest<'_> {
        let mut request = RouteRequest::new(&self.tokens)
            .with_salt(&self.salt)
            .with_priority(self.priority);
        if let Some(target) = self.ttft_target {
            request = request.with_ttft_target(target);
        }
        if let Some(target) = self.tpot_target {
            request = request.with_tpot_target(target);
        }
        match &self.session {
            Some(s) => request.with_session(s),
            None => request,
        }
    }
}

/// The admission headers: `x-ttft-target-ms` and `x-tpot-target-ms` (each a whole number of
/// milliseconds above 0) and `x-priority` (`critical`, `standard` or `sheddable`; default
/// standard).
fn admission_headers(headers: &HeaderMap) -> Result<Targets, String> {
    let text = |name: &str| {
        headers
            .get(name)
            .map(|v| {
                v.to_str()
                    .map(str::trim)
                    .map_err(|_| format!("{name}: not text"))
            })
            .transpose()
    };
    let millis = |name: &str| -> Result<Option<Duration>, String> {
        match text(name)? {
            None => Ok(None),
            Some(v) => match v.parse::<u64>() {
                Ok(ms) if ms > 0 => Ok(Some(Duration::from_millis(ms))),
                _ => Err(format!(
                    "{name}: {v:?} is not a number of milliseconds above 0"
                )),
            },
        }
    };
    let priority = match text("x-priority")? {
        None => Priority::Standard,
        Some(v) => Priority::parse(v)
            .map_err(|_| format!("x-priority: {v:?} is not critical, standard or sheddable"))?,
    };
    Ok(Targets {
        ttft: millis("x-ttft-target-ms")?,
        tpot: millis("x-tpot-target-ms")?,
        priority,
    })
}

/// A request's admission headers.
struct Targets {
    /// `x-ttft-target-ms`.
    ttft: Option<Duration>,
    /// `x-tpot-target-ms`.
    tpot: Option<Duration>,
    /// `x-priority` (default standard).
    priority: Priority,
}

/// The answer to a request admission refused: `429` with an OpenAI-style error (type
/// `overloaded`, code `shed_` and the limit that bound the best worker: `queue`, `kv`,
/// `decode`, `prompt` or `stale`; `gate`, the check that refused it: `model`, `prompt`,
/// `prefill_window` or `decode_bound`, with its measured value and threshold in seconds),
/// the header `x-shed-gate` naming the gate and, when waiting can help, `Retry-After` in
/// whole seconds (at least 1). A prompt whose own prefill misses the target on an idle
/// worker gets no `Retry-After`: retrying will not help.
pub(crate) fn shed_response(shed: &Shed) -> Response {
    let body = json!({"error": {
        "message": shed.to_string(),
        "type": "overloaded",
        "code": format!("shed_{}", shed.limit.name()),
        "param": Value::Null,
        "gate": shed.gate.name(),
        "measured_s": shed.measured.as_secs_f64(),
        "threshold_s": shed.threshold.as_secs_f64(),
    }});
    let mut response = (StatusCode::TOO_MANY_REQUESTS, Json(body)).into_response();
    response.headers_mut().insert(
        HeaderName::from_static("x-shed-gate"),
        HeaderValue::from_static(shed.gate.name()),
    );
    if let Some(after) = shed.retry_after {
        let seconds = after.as_secs() + u64::from(after.subsec_nanos() > 0);
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    }
    response
}

async fn completions(State(gw): State<Arc<Gateway>>, headers: HeaderMap, body: Bytes) -> Response {
    handle(gw, Endpoint::Completions, headers, body).await
}

async fn chat(State(gw): State<Arc<Gateway>>, headers: HeaderMap, body: Bytes) -> Response {
    handle(gw, Endpoint::Chat, headers, body).await
}

/// Routes a request and answers it from the chosen upstream, trying one other worker when
/// the first cannot be reached. The request is parsed and tokenized on the runtime's
/// blocking pool: a long prompt's tokenization holds no worker thread that relays the
/// streams in flight.
async fn handle(gw: Arc<Gateway>, endpoint: Endpoint, headers: HeaderMap, body: Bytes) -> Response {
    let started = Instant::now();
    let reader = Arc::clone(&gw);
    let parsed =
        tokio::task::spawn_blocking(move || Incoming::parse(&reader, endpoint, &headers, body))
            .await;
    let incoming = match parsed {
        Ok(Ok(incoming)) => incoming,
        Ok(Err(message)) => {
            gw.telemetry
                .finished(None, Outcome::Invalid, started.elapsed());
            return error(StatusCode::BAD_REQUEST, message);
        }
        Err(e) => {
            gw.telemetry
                .finished(None, Outcome::Error, started.elapsed());
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("reading the request failed: {e}"),
            );
        }
    };
    let request = incoming.route_request().with_time(gw.clock());
    for _ in 0..2 {
        let routed = if incoming.explain {
            gw.router
                .route_with_receipt(&request)
                .map(|(d, r)| (d, Some(r.to_string())))
        } else {
            gw.router.route(&request).map(|d| (d, None))
        };
        let (decision, explained) = match routed {
            Ok(d) => d,
            Err(Error::NoWorkers) => break,
            Err(Error::Shed(shed)) => {
                gw.count_shed(&shed);
                return shed_response(&shed);
            }
            Err(e) => {
                gw.telemetry
                    .finished(None, Outcome::Error, started.elapsed());
                return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
            }
        };
        let receipt = (decision.worker(), decision.cached_tokens() as u64);
        let Some(response) = forward(&gw, &incoming, decision, started).await else {
            continue;
        };
        let mut response = with_receipt(&gw, receipt, incoming.streamed, response);
        if let Some(line) = explained.and_then(|l| HeaderValue::from_str(&l).ok()) {
            response.headers_mut().insert("x-routing-receipt", line);
        }
        return response;
    }
    gw.telemetry
        .finished(None, Outcome::Unavailable, started.elapsed());
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "no upstream worker is available: every worker is down or draining",
    )
}

/// Sends the request to the upstream of `decision` and answers from it: `None` when the
/// upstream could not be reached (the decision is completed and the worker marked down), a
/// 504 when it did not answer within the request timeout. A whole answer's outcome is
/// counted here, a stream's when it ends (`stream.rs`).
async fn forward(
    gw: &Arc<Gateway>,
    incoming: &Incoming,
    decision: RouteDecision,
    started: Instant,
) -> Option<Response> {
    let upstream = match send(gw, incoming, &decision).await {
        Sent::Answered(u) => u,
        Sent::Unreachable => {
            failed(gw, &decision);
            return None;
        }
        Sent::TimedOut => return Some(timed_out(gw, &decision, started)),
    };
    let status =
        StatusCode::from_u16(upstream.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    if incoming.streamed {
        let body = stream::pass_through(
            Arc::clone(gw),
            decision,
            incoming.tokens.clone(),
            incoming.salt.clone(),
            started,
            upstream,
        );
        return Some((status, body).into_response());
    }
    let bytes = match upstream.bytes().await {
        Ok(b) => b,
        Err(e) if e.is_timeout() => return Some(timed_out(gw, &decision, started)),
        Err(_) => {
            failed(gw, &decision);
            return None;
        }
    };
    gw.router.first_token(&decision);
    let response = respond(
        gw,
        &decision,
        &incoming.tokens,
        &incoming.salt,
        status,
        bytes,
    );
    gw.router.complete(&decision);
    let outcome = if status.is_success() {
        Outcome::Served
    } else {
        Outcome::Error
    };
    gw.telemetry
        .finished(Some(decision.worker()), outcome, started.elapsed());
    Some(response)
}

/// The upstream of `decision` did not answer in time: the decision is completed, the
/// timeout counted, and the client gets a 504.
fn timed_out(gw: &Gateway, decision: &RouteDecision, started: Instant) -> Response {
    gw.router.complete(decision);
    gw.telemetry
        .finished(Some(decision.worker()), Outcome::Timeout, started.elapsed());
    error(
        StatusCode::GATEWAY_TIMEOUT,
        format!(
            "the upstream did not answer within the gateway's request timeout ({} s)",
            gw.request_timeout.as_secs_f64()
        ),
    )
}

/// The upstream of `decision` could not be reached: counted, marked unavailable, and the
/// decision completed.
fn failed(gw: &Gateway, decision: &RouteDecision) {
    gw.stats[decision.worker().index()]
        .failures
        .fetch_add(1, Relaxed);
    gw.telemetry.failure(decision.worker());
    let _ = gw.router.set_available(decision.worker(), false);
    gw.router.complete(decision);
}

/// How sending a request upstream went.
enum Sent {
    Answered(reqwest::Response),
    Unreachable,
    TimedOut,
}

/// Sends the request to the chosen upstream, naming the chosen rank in vLLM's
/// `X-data-parallel-rank` header when endpoints have more than one. A whole answer must come
/// within the request timeout; a stream's response headers must.
async fn send(gw: &Gateway, incoming: &Incoming, decision: &RouteDecision) -> Sent {
    let target = decision.worker();
    let url = format!("{}{}", gw.upstream(target), incoming.endpoint.path());
    let mut request = gw
        .client
        .post(url)
        .header(header::CONTENT_TYPE, "application/json")
        .body(incoming.body.clone());
    if gw.layout.ranks() > 1 {
        request = request.header("x-data-parallel-rank", gw.layout.rank(target));
    }
    if !incoming.streamed {
        request = request.timeout(gw.request_timeout);
    }
    match tokio::time::timeout(gw.request_timeout, request.send()).await {
        Err(_) => Sent::TimedOut,
        Ok(Err(e)) if e.is_connect() => Sent::Unreachable,
        Ok(Err(e)) if e.is_timeout() => Sent::TimedOut,
        Ok(Err(_)) => Sent::Unreachable,
        Ok(Ok(response)) => Sent::Answered(response),
    }
}

/// Reads the upstream's reported cached tokens and feeds them back to the router.
fn respond(
    gw: &Gateway,
    decision: &RouteDecision,
    tokens: &[TokenId],
    salt: &[u8],
    status: StatusCode,
    body: Bytes,
) -> Response {
    let usage = serde_json::from_slice::<Value>(&body).ok();
    let usage = usage.as_ref().and_then(|v| v.get("usage"));
    let count = |path: &str| usage.and_then(|u| u.pointer(path)).and_then(Value::as_u64);
    if let Some(cached) = count("/prompt_tokens_details/cached_tokens") {
        gw.reported(decision, tokens, salt, (cached, count("/prompt_tokens")));
    }
    (status, body).into_response()
}

/// The response with its content type and the routing decision (the target, the cached
/// tokens it predicted) in headers.
fn with_receipt(
    gw: &Gateway,
    (w, predicted): (WorkerId, u64),
    streamed: bool,
    mut response: Response,
) -> Response {
    let h = response.headers_mut();
    let kind = if streamed {
        "text/event-stream"
    } else {
        "application/json"
    };
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert("x-routed-worker", HeaderValue::from(w.get()));
    h.insert("x-routed-rank", HeaderValue::from(gw.layout.rank(w)));
    h.insert("x-predicted-cached-tokens", HeaderValue::from(predicted));
    response
}

async fn stats(State(gw): State<Arc<Gateway>>) -> Json<Value> {
    let workers: Vec<Value> = (0..gw.stats.len())
        .map(|i| {
            let w = WorkerId::new(i as u32);
            let load = gw.router.load(w);
            let s = &gw.stats[i];
            json!({
                "worker": i,
                "upstream": gw.upstream(w),
                "rank": gw.layout.rank(w),
                "available": load.map(|l| l.available),
                "in_flight": load.map(|l| l.in_flight),
                "peer_in_flight": load.map(|l| l.peer_in_flight),
                "routed": load.map(|l| l.routed),
                "predicted_cached_tokens": s.predicted_cached_tokens.load(Relaxed),
                "reported_cached_tokens": s.reported_cached_tokens.load(Relaxed),
                "prompt_tokens": s.prompt_tokens.load(Relaxed),
                "failures": s.failures.load(Relaxed),
                "prefill_tokens": load.map(|l| l.prefill_tokens),
                "streamed_first_tokens": s.first_tokens.load(Relaxed),
                "reported_waiting": load.and_then(|l| l.reported).map(|r| r.waiting),
                "reported_running": load.and_then(|l| l.reported).map(|r| r.running),
                "reported_kv_usage": load.and_then(|l| l.reported).map(|r| r.kv_usage),
                "estimated_requests": load.map(|l| l.estimated_requests),
                "speed": load.map(|l| l.speed),
                "metrics_age_ms": gw.metrics_age_ms(i),
                "events": s.events.json(),
                "mean_time_to_first_token_ms": mean_ms(
                    s.first_token_us.load(Relaxed),
                    s.first_tokens.load(Relaxed),
                ),
            })
        })
        .collect();
    let cache = gw.prompts.as_ref().map(|p| {
        let (segments, bytes) = p.tokens().cached();
        json!({"segments": segments, "bytes": bytes})
    });
    let shed = gw.shed.lock().map(|m| json!(*m)).unwrap_or(Value::Null);
    Json(json!({
        "policy": gw.router.name(),
        "workers": workers,
        "shed": shed,
        "tokenize_cache": cache,
        "replica_sync": gw.router.replica_sync_stats().map(|_| gw.sync.json(&gw)),
    }))
}

/// `GET /metrics`: the gateway's own metrics in Prometheus text (`telemetry.rs`).
async fn metrics(State(gw): State<Arc<Gateway>>) -> Response {
    telemetry::response(gw.telemetry.render(gw.router(), gw.stats.len()))
}

/// `GET /v1/models` (OpenAI clients ask it first): the models the upstream endpoints list
/// (`models.rs`).
async fn models(State(gw): State<Arc<Gateway>>) -> Response {
    models::list(&gw.client, &gw.upstreams).await
}

/// `total_us / count` in milliseconds; `None` for no count.
fn mean_ms(total_us: u64, count: u64) -> Option<f64> {
    (count > 0).then(|| total_us as f64 / count as f64 / 1_000.0)
}

async fn health(State(gw): State<Arc<Gateway>>) -> Json<Value> {
    Json(json!({"status": "ok", "available_workers": gw.available_targets()}))
}

/// 200 when the gateway can route a request now, 503 when no worker is available or it is
/// shutting down (a load balancer in front should then send requests elsewhere).
async fn ready(State(gw): State<Arc<Gateway>>) -> Response {
    let available = gw.available_targets();
    let draining = gw.draining.load(Relaxed);
    let status = if available > 0 && !draining {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({"ready": status == StatusCode::OK, "available_workers": available, "draining": draining});
    (status, Json(body)).into_response()
}
