//! A mock inference worker for tests and demos: an HTTP server with a real prefix cache of
//! its own (LRU over 16-token blocks, finite capacity) that answers `POST /v1/completions`
//! with an OpenAI-shaped completion whose usage reports the prompt tokens it found cached.

use std::sync::{Arc, Mutex, PoisonError};

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use prefix_router::{PrefixHasher, RadixTree, TokenId, WorkerId};
use serde_json::{Value, json};

/// The mock's KV cache.
pub(crate) struct MockWorker {
    cache: Mutex<RadixTree>,
    hasher: PrefixHasher,
}

impl MockWorker {
    /// A worker caching at most `capacity_blocks` blocks of 16 tokens.
    pub(crate) fn new(capacity_blocks: usize) -> Arc<Self> {
        let mut cache = RadixTree::new();
        cache.set_capacity(WorkerId::new(0), capacity_blocks);
        // The engine's own hashing: a different seed from any router's.
        let hasher = PrefixHasher::new(16)
            .unwrap_or_else(|_| unreachable!("16 is a valid block size"))
            .with_seed(0xE61E);
        Arc::new(Self {
            cache: Mutex::new(cache),
            hasher,
        })
    }

    /// Serves one prompt: how many of its tokens were cached before, then caches it.
    fn serve(&self, model: &str, tokens: &[TokenId]) -> usize {
        let blocks = self.hasher.hash_salted(model.as_bytes(), tokens);
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        let cached = cache.held_prefix(WorkerId::new(0), &blocks) * 16;
        cache.insert(WorkerId::new(0), &blocks);
        cached
    }
}

/// The mock's routes.
pub(crate) fn mock_app(worker: Arc<MockWorker>) -> axum::Router {
    axum::Router::new()
        .route("/v1/completions", post(complete))
        .with_state(worker)
}

async fn complete(State(worker): State<Arc<MockWorker>>, body: Bytes) -> Response {
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
    let cached = worker.serve(model, &tokens);
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
        }
    }))
    .into_response()
}
