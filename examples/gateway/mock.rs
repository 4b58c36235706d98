//! A mock inference worker for tests and demos: an HTTP server with a real prefix cache of
//! its own (LRU over 16-token blocks, finite capacity) that answers `POST /v1/completions`
//! and `POST /v1/chat/completions` with OpenAI-shaped completions whose usage reports the
//! prompt tokens it found cached. Given the model's tokenizer and chat template it takes
//! text and chat prompts, tokenized as the gateway tokenizes them; without, token IDs only.
//! `GET /health` answers 200.
//! With several data-parallel ranks, each rank has its own cache, and a request names its
//! rank in vLLM's `X-data-parallel-rank` header (rank 0 without it); the response says which
//! rank served it (`served_by_rank`, a field of the mock's only).
//!
//! With `"stream": true` it answers with server-sent events as vLLM does: two content events,
//! the usage event when `stream_options.include_usage` asks for it, then `[DONE]`. A
//! request's `mock_pause_ms` (the mock's only) holds the stream that long after its first
//! event (and a whole answer that long before it), so that tests can look at the gateway
//! mid-stream and time requests out.
//!
//! `GET /metrics` answers in Prometheus text as vLLM does, per rank (`engine` label):
//! requests running (those being answered), none waiting, and the KV cache's usage.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use prefix_router::{PrefixHasher, TokenId};
use serde_json::{Map, Value, json};

use super::mock_cache::RankCache;
#[cfg(feature = "zmq")]
use super::mock_events::Publishers;
use super::prompt::{self, Endpoint, Prompts};

/// The mock engine: a KV cache per rank.
pub(crate) struct MockWorker {
    /// By rank.
    cache: Mutex<Vec<RankCache>>,
    ranks: u32,
    hasher: PrefixHasher,
    capacity_blocks: usize,
    /// Requests being answered, by rank.
    running: Vec<AtomicU64>,
    prompts: Option<Arc<Prompts>>,
    /// Where the caches' changes are published, when they are.
    #[cfg(feature = "zmq")]
    events: Option<Publishers>,
}

/// A request being answered on a rank: counted as running until dropped.
struct Running(Arc<MockWorker>, usize);

impl Running {
    fn new(worker: &Arc<MockWorker>, rank: u32) -> Self {
        worker.running[rank as usize].fetch_add(1, Relaxed);
        Self(Arc::clone(worker), rank as usize)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running[self.1].fetch_sub(1, Relaxed);
    }
}

impl MockWorker {
    /// A worker of `ranks` data-parallel ranks (at least 1), each caching at most
    /// `capacity_blocks` blocks of 16 tokens, reading text and chat prompts with `prompts`.
    pub(crate) fn new(capacity_blocks: usize, ranks: u32, prompts: Option<Arc<Prompts>>) -> Self {
        let ranks = ranks.max(1);
        // The engine's own hashing: a different seed from any router's.
        let hasher = PrefixHasher::new(16)
            .unwrap_or_else(|_| unreachable!("16 is a valid block size"))
            .with_seed(0xE61E);
        Self {
            cache: Mutex::new(
                (0..ranks)
                    .map(|_| RankCache::new(capacity_blocks))
                    .collect(),
            ),
            ranks,
            hasher,
            capacity_blocks,
            running: (0..ranks).map(|_| AtomicU64::new(0)).collect(),
            prompts,
            #[cfg(feature = "zmq")]
            events: None,
        }
    }

    /// The same worker, publishing its caches' changes as vLLM's KV events.
    #[cfg(feature = "zmq")]
    pub(crate) fn with_events(mut self, publishers: Publishers) -> Self {
        self.events = Some(publishers);
        self
    }

    /// Serves one prompt on `rank`: how many of its tokens were cached there before, then
    /// caches it there (publishing the changes, unless `quiet`).
    pub(crate) fn serve(&self, rank: u32, model: &str, tokens: &[TokenId], quiet: bool) -> usize {
        let blocks: Vec<u64> = self
            .hasher
            .hash_salted(model.as_bytes(), tokens)
            .iter()
            .map(|b| b.get())
            .collect();
        let mut caches = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        let (held, changes) = caches[rank as usize].serve(&blocks, tokens);
        // Published under the lock, so that batches go out in the order the cache changed.
        #[cfg(feature = "zmq")]
        if let Some(events) = &self.events {
            events.send(rank, &changes, quiet);
        }
        #[cfg(not(feature = "zmq"))]
        let _ = (changes, quiet);
        held * 16
    }
}

/// The mock's routes.
pub(crate) fn mock_app(worker: Arc<MockWorker>) -> axum::Router {
    axum::Router::new()
        .route("/v1/completions", post(complete))
        .route("/v1/chat/completions", post(chat))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { "ok" }))
        .with_state(worker)
}

/// `GET /v1/models`: the one model the mock serves (`m`), as vLLM lists it.
pub(crate) async fn models() -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({
        "object": "list",
        "data": [{"id": "m", "object": "model", "created": 0, "owned_by": "mock"}],
    }))
}

/// vLLM's scheduler and cache gauges, per rank, in Prometheus text.
async fn metrics(State(worker): State<Arc<MockWorker>>) -> String {
    let cache = worker.cache.lock().unwrap_or_else(PoisonError::into_inner);
    let mut text = String::new();
    for (name, kind) in [
        ("vllm:num_requests_running", 0),
        ("vllm:num_requests_waiting", 1),
        ("vllm:kv_cache_usage_perc", 2),
    ] {
        text.push_str(&format!("# TYPE {name} gauge\n"));
        for r in 0..worker.ranks {
            let value = match kind {
                0 => worker.running[r as usize].load(Relaxed) as f64,
                1 => 0.0,
                _ => cache[r as usize].len() as f64 / worker.capacity_blocks.max(1) as f64,
            };
            text.push_str(&format!(
                "{name}{{engine=\"{r}\",model_name=\"mock\"}} {value}\n"
            ));
        }
    }
    text
}

async fn complete(
    State(worker): State<Arc<MockWorker>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    answer(&worker, Endpoint::Completions, &headers, &body).await
}

async fn chat(State(worker): State<Arc<MockWorker>>, headers: HeaderMap, body: Bytes) -> Response {
    answer(&worker, Endpoint::Chat, &headers, &body).await
}

/// The rank a request names in `X-data-parallel-rank` (0 without it).
fn rank(worker: &MockWorker, headers: &HeaderMap) -> Option<u32> {
    match headers.get("x-data-parallel-rank") {
        None => Some(0),
        Some(v) => v
            .to_str()
            .ok()?
            .parse::<u32>()
            .ok()
            .filter(|&r| r < worker.ranks),
    }
}

async fn answer(
    worker: &Arc<MockWorker>,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    match read(worker, endpoint, headers, body) {
        Ok(request) => reply(worker, &request).await,
        Err(why) => (StatusCode::BAD_REQUEST, why).into_response(),
    }
}

/// A completion request as the mock read it.
pub(crate) struct MockRequest {
    pub(crate) endpoint: Endpoint,
    /// The rank it names (`X-data-parallel-rank`), below the worker's ranks.
    pub(crate) rank: u32,
    pub(crate) body: Map<String, Value>,
    /// Its prompt's token IDs (not empty).
    pub(crate) tokens: Vec<TokenId>,
}

impl MockRequest {
    /// The model it names (`""` without one).
    pub(crate) fn model(&self) -> &str {
        self.body.get("model").and_then(Value::as_str).unwrap_or("")
    }
}

/// Reads a completion request; the error, when its rank, JSON or prompt is bad, is the
/// message of a `400`.
pub(crate) fn read(
    worker: &MockWorker,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<MockRequest, String> {
    let rank = rank(worker, headers).ok_or("bad data-parallel rank")?;
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(body) else {
        return Err("bad json".into());
    };
    let tokens = prompt::request_tokens(worker.prompts.as_deref(), endpoint, &body)?;
    Ok(MockRequest {
        endpoint,
        rank,
        body,
        tokens,
    })
}

/// Serves `request` on its rank (caching its prompt there) and answers it: two tokens, whole
/// or, with `"stream": true`, streamed.
pub(crate) async fn reply(worker: &Arc<MockWorker>, request: &MockRequest) -> Response {
    let value = &request.body;
    let (tokens, rank, model) = (&request.tokens, request.rank, request.model());
    let running = Running::new(worker, rank);
    let quiet = value.get("mock_drop_events") == Some(&json!(true));
    let cached = worker.serve(rank, model, tokens, quiet);
    let usage = json!({
        "prompt_tokens": tokens.len(),
        "completion_tokens": 2,
        "total_tokens": tokens.len() + 2,
        "prompt_tokens_details": {"cached_tokens": cached}
    });
    let shape = Shape {
        endpoint: request.endpoint,
        model,
    };
    let pause = value
        .get("mock_pause_ms")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    if value.get("stream") == Some(&json!(true)) {
        let with_usage = value
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            == Some(&json!(true));
        return stream(&shape, with_usage.then_some(usage), pause, running);
    }
    if pause > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
    }
    let mut whole = shape.event(&[(" ok done", json!("length"))], false);
    whole["usage"] = usage;
    whole["served_by_rank"] = json!(rank);
    Json(whole).into_response()
}

/// How answers look on an endpoint.
pub(crate) struct Shape<'a> {
    pub(crate) endpoint: Endpoint,
    pub(crate) model: &'a str,
}

impl Shape<'_> {
    /// An answer (`streamed`: a stream event) with one choice per `(text, finish_reason)`.
    pub(crate) fn event(&self, choices: &[(&str, Value)], streamed: bool) -> Value {
        let choices: Vec<Value> = choices
            .iter()
            .enumerate()
            .map(|(i, (text, finish))| match (self.endpoint, streamed) {
                (Endpoint::Completions, _) => {
                    json!({"index": i, "text": text, "finish_reason": finish})
                }
                (Endpoint::Chat, true) => {
                    json!({"index": i, "delta": {"content": text}, "finish_reason": finish})
                }
                (Endpoint::Chat, false) => json!({"index": i,
                    "message": {"role": "assistant", "content": text}, "finish_reason": finish}),
            })
            .collect();
        let object = match (self.endpoint, streamed) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Chat, false) => "chat.completion",
        };
        json!({"id": "cmpl-mock", "object": object, "created": 0, "model": self.model, "choices": choices})
    }
}

/// A streamed answer: two content events `pause_ms` apart, the usage event if given, and
/// `[DONE]`.
fn stream(shape: &Shape<'_>, usage: Option<Value>, pause_ms: u64, running: Running) -> Response {
    let data = |event: Value| format!("data: {event}\n\n");
    let mut events = vec![
        data(shape.event(&[(" ok", Value::Null)], true)),
        data(shape.event(&[(" done", json!("length"))], true)),
    ];
    if let Some(usage) = usage {
        let mut event = shape.event(&[], true);
        event["usage"] = usage;
        events.push(data(event));
    }
    events.push("data: [DONE]\n\n".to_owned());
    let body = futures_util::stream::unfold(0, move |i| {
        let event = events.get(i).cloned();
        let _running = &running; // counted until the stream is done
        async move {
            if i == 1 && pause_ms > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(pause_ms)).await;
            }
            event.map(|e| (Ok::<_, std::io::Error>(Bytes::from(e)), i + 1))
        }
    });
    (
        [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
        Body::from_stream(body),
    )
        .into_response()
}
