//! A mock inference worker for tests and demos: an HTTP server with a real prefix cache of
//! its own (LRU over 16-token blocks, finite capacity) that answers `POST /v1/completions`
//! with an OpenAI-shaped completion whose usage reports the prompt tokens it found cached.
//! With several data-parallel ranks, each rank has its own cache, and a request names its
//! rank in vLLM's `X-data-parallel-rank` header (rank 0 without it); the response says which
//! rank served it (`served_by_rank`, a field of the mock's only).
//!
//! With `"stream": true` it answers with server-sent events as vLLM does: two content events,
//! the usage event when `stream_options.include_usage` asks for it, then `[DONE]`. A
//! request's `mock_pause_ms` (the mock's only) holds the stream that long after its first
//! event, so that tests can look at the gateway mid-stream.
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
use axum::routing::post;
use prefix_router::{PrefixHasher, RadixTree, TokenId, WorkerId};
use serde_json::{Value, json};

/// The mock's KV caches: one tree whose worker `r` is rank `r`'s cache.
pub(crate) struct MockWorker {
    cache: Mutex<RadixTree>,
    ranks: u32,
    hasher: PrefixHasher,
    capacity_blocks: usize,
    /// Requests being answered, by rank.
    running: Vec<AtomicU64>,
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
    /// `capacity_blocks` blocks of 16 tokens.
    pub(crate) fn new(capacity_blocks: usize, ranks: u32) -> Arc<Self> {
        let ranks = ranks.max(1);
        let mut cache = RadixTree::new();
        for r in 0..ranks {
            cache.set_capacity(WorkerId::new(r), capacity_blocks);
        }
        // The engine's own hashing: a different seed from any router's.
        let hasher = PrefixHasher::new(16)
            .unwrap_or_else(|_| unreachable!("16 is a valid block size"))
            .with_seed(0xE61E);
        Arc::new(Self {
            cache: Mutex::new(cache),
            ranks,
            hasher,
            capacity_blocks,
            running: (0..ranks).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// Serves one prompt on `rank`: how many of its tokens were cached there before, then
    /// caches it there.
    fn serve(&self, rank: u32, model: &str, tokens: &[TokenId]) -> usize {
        let blocks = self.hasher.hash_salted(model.as_bytes(), tokens);
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        let cached = cache.held_prefix(WorkerId::new(rank), &blocks) * 16;
        cache.insert(WorkerId::new(rank), &blocks);
        cached
    }
}

/// The mock's routes.
pub(crate) fn mock_app(worker: Arc<MockWorker>) -> axum::Router {
    axum::Router::new()
        .route("/v1/completions", post(complete))
        .route("/metrics", axum::routing::get(metrics))
        .with_state(worker)
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
                _ => {
                    let held = cache.worker_block_count(WorkerId::new(r));
                    held as f64 / worker.capacity_blocks.max(1) as f64
                }
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
    let rank = match headers.get("x-data-parallel-rank").map(|v| v.to_str()) {
        None => 0,
        Some(Ok(v)) => match v.parse::<u32>() {
            Ok(r) if r < worker.ranks => r,
            _ => return (StatusCode::BAD_REQUEST, "bad data-parallel rank").into_response(),
        },
        Some(Err(_)) => return (StatusCode::BAD_REQUEST, "bad data-parallel rank").into_response(),
    };
    let Ok(value) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "bad json").into_response();
    };
    let tokens: Vec<TokenId> = value["prompt"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| t.as_u64())
                .map(|t| t as TokenId)
                .collect()
        })
        .unwrap_or_default();
    let model = value["model"].as_str().unwrap_or("");
    let running = Running::new(&worker, rank);
    let cached = worker.serve(rank, model, &tokens);
    let usage = json!({
        "prompt_tokens": tokens.len(),
        "completion_tokens": 2,
        "total_tokens": tokens.len() + 2,
        "prompt_tokens_details": {"cached_tokens": cached}
    });
    if value["stream"] == true {
        let pause = value["mock_pause_ms"].as_u64().unwrap_or(0);
        let with_usage = value.pointer("/stream_options/include_usage") == Some(&json!(true));
        return stream(model, with_usage.then_some(usage), pause, running);
    }
    Json(json!({
        "id": "cmpl-mock",
        "object": "text_completion",
        "model": model,
        "choices": [{"index": 0, "text": " ok", "finish_reason": "length"}],
        "usage": usage,
        "served_by_rank": rank
    }))
    .into_response()
}

/// A streamed answer: two content events `pause_ms` apart, the usage event if given, and
/// `[DONE]`.
fn stream(model: &str, usage: Option<Value>, pause_ms: u64, running: Running) -> Response {
    let chunk = |text: &str, finish: Value| {
        let event = json!({
            "id": "cmpl-mock",
            "object": "text_completion",
            "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish}]
        });
        format!("data: {event}\n\n")
    };
    let mut events = vec![chunk(" ok", Value::Null), chunk(" done", json!("length"))];
    if let Some(usage) = usage {
        let event = json!({"id": "cmpl-mock", "object": "text_completion", "model": model,
            "choices": [], "usage": usage});
        events.push(format!("data: {event}\n\n"));
    }
    events.push("data: [DONE]\n\n".to_owned());
    let body = futures_util::stream::unfold(0, move |i| {
        let event = events.get(i).cloned();
        let _running = &running; // counted until the stream is done
        async move {
            if i == 1 {
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
