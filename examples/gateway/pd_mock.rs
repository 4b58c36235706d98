//! Mock prefill and decode workers that check vLLM's disaggregated protocol (`pd_wire.rs`)
//! as an engine with the NIXL connector relies on it, for tests and demos. Each wraps a
//! mock worker (`mock.rs`: a prefix cache per data-parallel rank, the rank named by
//! `X-data-parallel-rank`, OpenAI-shaped answers).
//!
//! A **prefill** mock answers `400`, saying why, to a request without `X-Request-Id`,
//! without the prefill skeleton of `kv_transfer_params` (`do_remote_decode: true`,
//! `do_remote_prefill: false`, the four `remote_*` keys null), with `"stream": true`,
//! `stream_options`, `min_tokens` or `min_completion_tokens`, or with `max_tokens` (or a
//! given `max_completion_tokens`) other than 1. Otherwise it caches the prompt on its rank
//! and answers whole: one token, finish reason `length`, and `kv_transfer_params` =
//! `{do_remote_prefill: true, do_remote_decode: false, remote_block_ids (one per 16 prompt
//! tokens begun), remote_engine_id, remote_request_id (the X-Request-Id), remote_host
//! ("localhost"), remote_port (5600 + its rank), tp_size: 1, mock_check}`. `mock_check` is
//! the mock's own key: a hash binding the rest to the request's id and prompt. A request's
//! `mock_prefill_status` (the mock's only) makes it answer that status instead, once the
//! checks pass.
//!
//! A **decode** mock takes a request without `kv_transfer_params` (or with them null) as
//! one it prefills itself ("local"). One with them ("remote") must carry, unchanged, those a
//! prefill mock made for the same `X-Request-Id` and the same prompt (`mock_check` holds);
//! otherwise `400`, saying why. It answers as a mock worker does, whole or streamed.
//!
//! Both list the requests they accepted at `GET /mock/legs`, oldest first (each: `role`,
//! `path`, `request_id`, `rank`, `stream`, `prompt_tokens`; a decode mock's also `prefill`,
//! `remote_engine_id` and `remote_port`), so tests can see both legs. `GET /v1/models`
//! lists the mock's model as a mock worker does; `GET /health` answers 200.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Map, Value, json};
use xxhash_rust::xxh3::xxh3_64;

use super::mock::{self, MockRequest, MockWorker, Shape};
use super::pd_plan::Role;
use super::pd_wire::{PARAMS, REQUEST_ID};
use super::prompt::Endpoint;

/// The side-channel port of rank 0 (vLLM's `VLLM_NIXL_SIDE_CHANNEL_PORT` default); rank
/// `r` reports this plus `r`.
pub(crate) const SIDE_CHANNEL_PORT: u64 = 5600;

/// A mock worker in one role of a disaggregated fleet.
pub(crate) struct PdMock {
    worker: Arc<MockWorker>,
    role: Role,
    /// The `remote_engine_id` a prefill mock reports.
    engine_id: String,
    /// The next KV block id a prefill mock hands out.
    next_block: AtomicU64,
    /// The requests it accepted, oldest first.
    legs: Mutex<Vec<Value>>,
}

impl PdMock {
    /// `worker` in `role`; a prefill mock reports `engine_id` as its `remote_engine_id`.
    pub(crate) fn new(worker: MockWorker, role: Role, engine_id: String) -> Self {
        Self {
            worker: Arc::new(worker),
            role,
            engine_id,
            next_block: AtomicU64::new(0),
            legs: Mutex::default(),
        }
    }

    fn record(&self, leg: Value) {
        self.legs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(leg);
    }

    /// The transfer parameters of `request`'s prefill, named `id`, on the mock's `rank`.
    fn params(&self, id: &str, request: &MockRequest) -> Value {
        let blocks = blocks_for(request.tokens.len());
        let first = self.next_block.fetch_add(blocks, Relaxed);
        let mut params = json!({
            "do_remote_prefill": true,
            "do_remote_decode": false,
            "remote_block_ids": (first..first + blocks).collect::<Vec<u64>>(),
            "remote_engine_id": self.engine_id,
            "remote_request_id": id,
            "remote_host": "localhost",
            "remote_port": SIDE_CHANNEL_PORT + u64::from(request.rank),
            "tp_size": 1,
        });
        params["mock_check"] = json!(check(id, &params, request));
        params
    }

    /// The prefill leg: checked, served on its rank, answered with transfer parameters.
    fn prefill(&self, id: Option<&str>, request: &MockRequest) -> Response {
        let id = match prefill_leg(id, &request.body) {
            Ok(id) => id,
            Err(why) => return refuse(&why),
        };
        if let Some(status) = request
            .body
            .get("mock_prefill_status")
            .and_then(Value::as_u64)
        {
            let status = u16::try_from(status)
                .ok()
                .and_then(|s| StatusCode::from_u16(s).ok())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return (status, "mock prefill failure, as the request asked").into_response();
        }
        let (model, tokens) = (request.model(), &request.tokens);
        let cached = self.worker.serve(request.rank, model, tokens, false);
        let params = self.params(id, request);
        self.record(leg(Role::Prefill, id, request, None));
        let shape = Shape {
            endpoint: request.endpoint,
            model,
        };
        let mut whole = shape.event(&[(" ok", json!("length"))], false);
        whole["usage"] = json!({
            "prompt_tokens": tokens.len(),
            "completion_tokens": 1,
            "total_tokens": tokens.len() + 1,
            "prompt_tokens_details": {"cached_tokens": cached},
        });
        whole[PARAMS] = params;
        whole["served_by_rank"] = json!(request.rank);
        Json(whole).into_response()
    }

    /// The decode leg: its transfer parameters, if any, checked; answered as a mock worker.
    async fn decode(&self, id: Option<&str>, request: &MockRequest) -> Response {
        let remote = match request.body.get(PARAMS).filter(|p| !p.is_null()) {
            None => None,
            Some(params) => match remote_params(id, params, request) {
                Ok(params) => Some(params),
                Err(why) => return refuse(&format!("{PARAMS}: {why}")),
            },
        };
        self.record(leg(Role::Decode, id.unwrap_or(""), request, remote));
        mock::reply(&self.worker, request).await
    }
}

/// KV blocks of 16 tokens a prompt of `tokens` fills or begins.
fn blocks_for(tokens: usize) -> u64 {
    tokens.div_ceil(16) as u64
}

/// A hash binding `params` (but `mock_check`) to the request's id and prompt.
fn check(id: &str, params: &Value, request: &MockRequest) -> String {
    let mut prompt = request.model().as_bytes().to_vec();
    prompt.push(0xff);
    prompt.extend(request.tokens.iter().flat_map(|t| t.to_le_bytes()));
    let text = format!(
        "{id}\n{}\n{}\n{}\n{}\n{}\n{:016x}",
        params["remote_engine_id"],
        params["remote_host"],
        params["remote_port"],
        params["remote_block_ids"],
        params["tp_size"],
        xxh3_64(&prompt)
    );
    format!("{:016x}", xxh3_64(text.as_bytes()))
}

/// What a decode request's leg record says of its prefill: none (local), or where it was.
type Remote = Map<String, Value>;

/// A leg record (see the module's docs).
fn leg(role: Role, id: &str, request: &MockRequest, remote: Option<Remote>) -> Value {
    let mut leg = json!({
        "role": role.name(),
        "path": request.endpoint.path(),
        "request_id": id,
        "rank": request.rank,
        "stream": request.body.get("stream") == Some(&json!(true)),
        "prompt_tokens": request.tokens.len(),
    });
    if role == Role::Decode {
        let remote = remote.as_ref();
        leg["prefill"] = json!(if remote.is_some() { "remote" } else { "local" });
        leg["remote_engine_id"] = remote.map_or(Value::Null, |r| r["remote_engine_id"].clone());
        leg["remote_port"] = remote.map_or(Value::Null, |r| r["remote_port"].clone());
    }
    leg
}

/// Checks a prefill leg (see the module's docs); its request id when it passes.
fn prefill_leg<'a>(id: Option<&'a str>, body: &Map<String, Value>) -> Result<&'a str, String> {
    let id = id.ok_or("no X-Request-Id header")?;
    let params = body
        .get(PARAMS)
        .and_then(Value::as_object)
        .ok_or(format!("no {PARAMS} object: not a prefill leg"))?;
    if params.get("do_remote_decode") != Some(&json!(true)) {
        return Err(format!("{PARAMS}.do_remote_decode is not true"));
    }
    if params.get("do_remote_prefill") != Some(&json!(false)) {
        return Err(format!("{PARAMS}.do_remote_prefill is not false"));
    }
    for key in [
        "remote_engine_id",
        "remote_block_ids",
        "remote_host",
        "remote_port",
    ] {
        if params.get(key) != Some(&Value::Null) {
            return Err(format!("{PARAMS}.{key} is not null"));
        }
    }
    if body.get("stream") == Some(&json!(true)) {
        return Err("a prefill leg must not stream".into());
    }
    for key in ["stream_options", "min_tokens", "min_completion_tokens"] {
        if body.contains_key(key) {
            return Err(format!("a prefill leg must not carry {key}"));
        }
    }
    if body.get("max_tokens") != Some(&json!(1)) {
        return Err("a prefill leg must ask max_tokens 1".into());
    }
    match body.get("max_completion_tokens") {
        None => Ok(id),
        Some(v) if v == &json!(1) => Ok(id),
        Some(_) => Err("a prefill leg must ask max_completion_tokens 1 when it names it".into()),
    }
}

/// Checks a decode leg's transfer parameters; their fields when they pass.
fn remote_params(
    id: Option<&str>,
    params: &Value,
    request: &MockRequest,
) -> Result<Remote, String> {
    let id = id.ok_or("no X-Request-Id header")?;
    let p = params.as_object().ok_or("not an object")?;
    if p.get("do_remote_prefill") != Some(&json!(true)) {
        return Err("do_remote_prefill is not true: not what a prefill worker answers".into());
    }
    if p.get("do_remote_decode") != Some(&json!(false)) {
        return Err("do_remote_decode is not false: not what a prefill worker answers".into());
    }
    let remote_id = p.get("remote_request_id").and_then(Value::as_str);
    if remote_id != Some(id) {
        return Err(format!(
            "remote_request_id {remote_id:?} is not this request's X-Request-Id {id:?}"
        ));
    }
    let blocks = p.get("remote_block_ids").and_then(Value::as_array);
    if blocks.map(Vec::len) != Some(blocks_for(request.tokens.len()) as usize) {
        return Err(format!(
            "remote_block_ids are not the blocks of a prompt of {} tokens",
            request.tokens.len()
        ));
    }
    if p.get("mock_check").and_then(Value::as_str) != Some(check(id, params, request).as_str()) {
        return Err(
            "mock_check does not hold: not what a prefill mock answered for this \
                    request's id and prompt"
                .into(),
        );
    }
    Ok(p.clone())
}

fn refuse(why: &str) -> Response {
    (StatusCode::BAD_REQUEST, why.to_owned()).into_response()
}

/// The mock's routes.
pub(crate) fn pd_mock_app(mock: Arc<PdMock>) -> axum::Router {
    axum::Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(mock::models))
        .route("/mock/legs", get(legs))
        .route("/health", get(|| async { "ok" }))
        .with_state(mock)
}

async fn completions(State(m): State<Arc<PdMock>>, headers: HeaderMap, body: Bytes) -> Response {
    answer(&m, Endpoint::Completions, &headers, &body).await
}

async fn chat(State(m): State<Arc<PdMock>>, headers: HeaderMap, body: Bytes) -> Response {
    answer(&m, Endpoint::Chat, &headers, &body).await
}

async fn answer(m: &PdMock, endpoint: Endpoint, headers: &HeaderMap, body: &[u8]) -> Response {
    let request = match mock::read(&m.worker, endpoint, headers, body) {
        Ok(request) => request,
        Err(why) => return refuse(&why),
    };
    let id = headers.get(REQUEST_ID).and_then(|v| v.to_str().ok());
    match m.role {
        Role::Prefill => m.prefill(id, &request),
        Role::Decode => m.decode(id, &request).await,
    }
}

async fn legs(State(m): State<Arc<PdMock>>) -> Json<Value> {
    let legs = m.legs.lock().unwrap_or_else(PoisonError::into_inner);
    Json(Value::Array(legs.clone()))
}
