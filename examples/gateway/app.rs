//! The gateway: an OpenAI-compatible reverse proxy that routes with `prefix_router`.
//! Completions are answered whole or, with `"stream": true`, streamed through as they come
//! (`stream.rs`).
//!
//! Shared by `examples/gateway/main.rs` (the binary) and `tests/gateway.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use prefix_router::{Error, RankLayout, RouteDecision, RouteRequest, Router, TokenId, WorkerId};
use serde_json::{Value, json};

use super::stream;

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
}

impl Gateway {
    /// A gateway routing over `upstreams` (base URLs such as `http://127.0.0.1:8001`), each
    /// with `layout`'s data-parallel ranks, with `router`, which must route over targets
    /// `0..layout.targets(upstreams.len())`. An upstream gets 2 s to accept a connection
    /// and may then stay silent for 120 s at most between bytes (a stream may last longer).
    pub(crate) fn new(
        router: Arc<dyn Router>,
        upstreams: Vec<String>,
        layout: RankLayout,
    ) -> Arc<Self> {
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(2))
            .read_timeout(std::time::Duration::from_secs(120))
            .build()
            .unwrap_or_default();
        let targets = layout.targets(upstreams.len() as u32) as usize;
        Arc::new(Self {
            stats: (0..targets).map(|_| UpstreamStats::default()).collect(),
            router,
            upstreams,
            layout,
            client,
            started: Instant::now(),
        })
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

    /// `target`'s engine reported `load` just now: the router hears it.
    pub(crate) fn scraped(&self, target: WorkerId, load: prefix_router::ReportedLoad) {
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

    /// The router.
    pub(crate) fn router(&self) -> &dyn Router {
        self.router.as_ref()
    }

    /// A streamed request's first content came `elapsed` after it arrived.
    pub(crate) fn first_token_after(&self, decision: &RouteDecision, elapsed: Duration) {
        let s = &self.stats[decision.worker().index()];
        s.first_tokens.fetch_add(1, Relaxed);
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        s.first_token_us.fetch_add(us, Relaxed);
    }

    /// The upstream reported `cached` of the request's `tokens` (salted with `salt`) cached:
    /// counted, and fed back to the router's mirror.
    pub(crate) fn reported(
        &self,
        decision: &RouteDecision,
        tokens: &[TokenId],
        salt: &str,
        cached: u64,
    ) {
        let w = decision.worker();
        let stats = &self.stats[w.index()];
        stats.reported_cached_tokens.fetch_add(cached, Relaxed);
        stats
            .predicted_cached_tokens
            .fetch_add(decision.cached_tokens() as u64, Relaxed);
        stats.prompt_tokens.fetch_add(tokens.len() as u64, Relaxed);
        if let Some(sync) = self.router.cache_sync() {
            let _ = sync.report_cached_salted(w, salt.as_bytes(), tokens, cached as usize);
        }
    }
}

/// The HTTP routes: `POST /v1/completions`, `GET /stats`, `GET /health`.
pub(crate) fn app(gateway: Arc<Gateway>) -> axum::Router {
    axum::Router::new()
        .route("/v1/completions", post(completions))
        .route("/stats", get(stats))
        .route("/health", get(health))
        .with_state(gateway)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let kind = if status == StatusCode::BAD_REQUEST {
        "invalid_request_error"
    } else {
        "upstream_error"
    };
    (
        status,
        Json(json!({"error": {"message": message.into(), "type": kind}})),
    )
        .into_response()
}

/// What the gateway takes from a request body; the body itself is forwarded unchanged (a
/// streamed one asks for the usage event too).
struct Parsed {
    tokens: Vec<TokenId>,
    model: Option<String>,
    user: Option<String>,
    /// The body, parsed.
    value: Value,
}

fn parse(body: &[u8]) -> Result<Parsed, String> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not valid JSON: {e}"))?;
    let fields = fields(&value)?;
    Ok(Parsed { value, ..fields })
}

/// The prompt's token IDs, the model and the user of a parsed body.
fn fields(value: &Value) -> Result<Parsed, String> {
    let Some(object) = value.as_object() else {
        return Err("the body must be a JSON object".into());
    };
    let tokens = match object.get("prompt") {
        None => return Err("missing \"prompt\": an array of token IDs".into()),
        Some(Value::String(_)) => {
            return Err(
                "\"prompt\" is text: this gateway routes on token IDs, send an array of integers"
                    .into(),
            );
        }
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, t)| {
                t.as_u64()
                    .and_then(|t| TokenId::try_from(t).ok())
                    .ok_or_else(|| {
                        format!(
                            "\"prompt\"[{i}] = {t} is not a token ID (an integer 0..=4294967295)"
                        )
                    })
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err("\"prompt\" must be an array of token IDs".into()),
    };
    if tokens.is_empty() {
        return Err("\"prompt\" is empty: send at least one token ID".into());
    }
    let text = |key: &str| object.get(key).and_then(Value::as_str).map(str::to_owned);
    Ok(Parsed {
        tokens,
        model: text("model"),
        user: text("user"),
        value: Value::Null,
    })
}

async fn completions(State(gw): State<Arc<Gateway>>, headers: HeaderMap, body: Bytes) -> Response {
    let started = Instant::now();
    let parsed = match parse(&body) {
        Ok(p) => p,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let session = headers
        .get("x-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or(parsed.user);
    let salt = parsed.model.unwrap_or_default();
    let mut request = RouteRequest::new(&parsed.tokens).with_salt(salt.as_bytes());
    if let Some(s) = &session {
        request = request.with_session(s);
    }
    let streamed = stream::is_streamed(&parsed.value);
    // A client that sends `x-routing-receipt` gets why its request went where it went.
    let explain = headers.contains_key("x-routing-receipt");
    let body = if streamed {
        stream::with_usage(parsed.value)
    } else {
        body
    };
    // One retry on another worker when an upstream cannot be reached.
    for _ in 0..2 {
        let routed = if explain {
            gw.router
                .route_with_receipt(&request)
                .map(|(d, r)| (d, Some(r.to_string())))
        } else {
            gw.router.route(&request).map(|d| (d, None))
        };
        let (decision, explained) = match routed {
            Ok(d) => d,
            Err(Error::NoWorkers) => break,
            Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        };
        let Ok(upstream) = send(&gw, &decision, &body).await else {
            failed(&gw, &decision);
            continue;
        };
        let status =
            StatusCode::from_u16(upstream.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
        let receipt = (decision.worker(), decision.cached_tokens() as u64);
        let response = if streamed {
            let tokens = parsed.tokens.clone();
            let body = stream::pass_through(
                Arc::clone(&gw),
                decision,
                tokens,
                salt.clone(),
                started,
                upstream,
            );
            (status, body).into_response()
        } else {
            let Ok(bytes) = upstream.bytes().await else {
                failed(&gw, &decision);
                continue;
            };
            gw.router.first_token(&decision);
            let response = respond(&gw, &decision, &parsed.tokens, &salt, status, bytes);
            gw.router.complete(&decision);
            response
        };
        let mut response = with_receipt(&gw, receipt, streamed, response);
        if let Some(line) = explained.and_then(|l| HeaderValue::from_str(&l).ok()) {
            response.headers_mut().insert("x-routing-receipt", line);
        }
        return response;
    }
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "no upstream worker is available: every worker is down or draining",
    )
}

/// The upstream of `decision` could not be reached: counted, marked unavailable, and the
/// decision completed.
fn failed(gw: &Gateway, decision: &RouteDecision) {
    gw.stats[decision.worker().index()]
        .failures
        .fetch_add(1, Relaxed);
    let _ = gw.router.set_available(decision.worker(), false);
    gw.router.complete(decision);
}

/// Sends `body` to the chosen upstream, naming the chosen rank in vLLM's
/// `X-data-parallel-rank` header when endpoints have more than one; `Err` when it cannot be
/// reached.
async fn send(
    gw: &Gateway,
    decision: &RouteDecision,
    body: &Bytes,
) -> Result<reqwest::Response, ()> {
    let target = decision.worker();
    let url = format!("{}/v1/completions", gw.upstream(target));
    let mut request = gw
        .client
        .post(url)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.clone());
    if gw.layout.ranks() > 1 {
        request = request.header("x-data-parallel-rank", gw.layout.rank(target));
    }
    request.send().await.map_err(|_| ())
}

/// Reads the upstream's reported cached tokens and feeds them back to the router.
fn respond(
    gw: &Gateway,
    decision: &RouteDecision,
    tokens: &[TokenId],
    salt: &str,
    status: StatusCode,
    body: Bytes,
) -> Response {
    let reported = serde_json::from_slice::<Value>(&body).ok().and_then(|v| {
        v.pointer("/usage/prompt_tokens_details/cached_tokens")
            .and_then(Value::as_u64)
    });
    if let Some(cached) = reported {
        gw.reported(decision, tokens, salt, cached);
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
                "routed": load.map(|l| l.routed),
                "predicted_cached_tokens": s.predicted_cached_tokens.load(Relaxed),
                "reported_cached_tokens": s.reported_cached_tokens.load(Relaxed),
                "prompt_tokens": s.prompt_tokens.load(Relaxed),
                "failures": s.failures.load(Relaxed),
                "prefill_tokens": load.map(|l| l.prefill_tokens),
                "streamed_first_tokens": s.first_tokens.load(Relaxed),
                "reported_queue": load.map(|l| l.reported.queue_len),
                "reported_kv_usage": load.map(|l| l.reported.kv_usage),
                "metrics_age_ms": gw.metrics_age_ms(i),
                "mean_time_to_first_token_ms": mean_ms(
                    s.first_token_us.load(Relaxed),
                    s.first_tokens.load(Relaxed),
                ),
            })
        })
        .collect();
    Json(json!({"policy": gw.router.name(), "workers": workers}))
}

/// `total_us / count` in milliseconds; `None` for no count.
fn mean_ms(total_us: u64, count: u64) -> Option<f64> {
    (count > 0).then(|| total_us as f64 / count as f64 / 1_000.0)
}

async fn health(State(gw): State<Arc<Gateway>>) -> Json<Value> {
    let available = (0..gw.stats.len())
        .filter(|&i| {
            gw.router
                .load(WorkerId::new(i as u32))
                .is_some_and(|l| l.available)
        })
        .count();
    Json(json!({"status": "ok", "available_workers": available}))
}
