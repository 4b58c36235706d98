//! A mock inference worker for tests and demos: an HTTP server with a real prefix cache of
//! its own (LRU over 16-token blocks, finite capacity) that answers `POST /v1/completions`
//! with an OpenAI-shaped completion whose usage reports the prompt tokens it found cached.
//! With several data-parallel ranks, each rank has its own cache, and a request names its
//! rank in vLLM's `X-data-parallel-rank` header (rank 0 without it); the response says which
//! rank served it (`served_by_rank`, a field of the mock's only).

use std::sync::{Arc, Mutex, PoisonError};

use axum::Json;
use axum::body::Bytes;
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
        .with_state(worker)
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
    let cached = worker.serve(rank, model, &tokens);
    Json(json!({
        "id": "cmpl-mock",
        "object": "text_completion",
        "model": model,
        "choices": [{"index": 0, "text": " ok", "finish_reason": "length"}],
        "usage": {
            "prompt_tokens": tokens.len(),
            "completion_tokens": 1,
            "total_tokens": tokens.len() + 1,
            "prompt_tokens_details": {"cached_tokens": cached}
        },
        "served_by_rank": rank
    }))
    .into_response()
}
