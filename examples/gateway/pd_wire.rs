//! vLLM's disaggregated-prefill protocol (its NIXL connector's), as vLLM's own proxy
//! (`tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`) speaks it:
//!
//! 1. The **prefill leg**: the client's body, sent to the same endpoint of a prefill worker,
//!    with `kv_transfer_params` = `{"do_remote_decode": true, "do_remote_prefill": false,
//!    "remote_engine_id": null, "remote_block_ids": null, "remote_host": null,
//!    "remote_port": null}`, `"stream": false`, `"max_tokens": 1` (and
//!    `"max_completion_tokens": 1` when the client sent that), and without `stream_options`,
//!    `min_tokens` or `min_completion_tokens`.
//! 2. The prefill worker answers whole, with a top-level `kv_transfer_params` object
//!    (`do_remote_prefill: true`, `remote_block_ids`, `remote_engine_id`,
//!    `remote_request_id`, `remote_host`, `remote_port`, `tp_size`): where the decode
//!    worker reads the prompt's KV cache from.
//! 3. The **decode leg**: the client's body as it came (its `stream` setting kept) plus that
//!    object, copied unchanged; its answer, whole or streamed, is the client's.
//!
//! Both legs carry the same `X-Request-Id`; `X-data-parallel-rank` pins a data-parallel
//! rank, on each side separately. A request not split goes to the decode worker alone, with
//! the client's body and no `kv_transfer_params`: it prefills there.

use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use axum::http::HeaderMap;
use serde_json::{Map, Value, json};

/// The header naming a request on both legs.
pub(crate) const REQUEST_ID: &str = "x-request-id";

/// The header pinning a data-parallel rank (vLLM reads it case-insensitively).
pub(crate) const DP_RANK: &str = "x-data-parallel-rank";

/// The key of the transfer parameters, in both legs' bodies and the prefill's answer.
pub(crate) const PARAMS: &str = "kv_transfer_params";

/// The fields the prefill leg may not carry: vLLM's prefill cannot honour them (the
/// stream and its options, minimum output lengths above its one token).
const NOT_FOR_PREFILL: [&str; 3] = ["stream_options", "min_tokens", "min_completion_tokens"];

/// The body of the prefill leg for the client's `body` (see the module's docs).
pub(crate) fn prefill_body(body: &Map<String, Value>) -> Value {
    let mut prefill = body.clone();
    for key in NOT_FOR_PREFILL {
        prefill.remove(key);
    }
    prefill.insert(
        PARAMS.to_owned(),
        json!({
            "do_remote_decode": true,
            "do_remote_prefill": false,
            "remote_engine_id": null,
            "remote_block_ids": null,
            "remote_host": null,
            "remote_port": null,
        }),
    );
    prefill.insert("stream".to_owned(), Value::Bool(false));
    prefill.insert("max_tokens".to_owned(), json!(1));
    if prefill.contains_key("max_completion_tokens") {
        prefill.insert("max_completion_tokens".to_owned(), json!(1));
    }
    Value::Object(prefill)
}

/// The body of the decode leg: the client's `body` with the prefill's `params`, when it
/// gave some (without: the decode worker prefills itself).
pub(crate) fn decode_body(body: &Map<String, Value>, params: Option<&Value>) -> Value {
    let mut decode = body.clone();
    match params {
        Some(params) => decode.insert(PARAMS.to_owned(), params.clone()),
        None => decode.remove(PARAMS),
    };
    Value::Object(decode)
}

/// The transfer parameters of a prefill worker's answer: its top-level `kv_transfer_params`
/// when that is a non-empty object (vLLM's proxy passes nothing on otherwise).
pub(crate) fn transfer_params(answer: &[u8]) -> Option<Value> {
    let mut answer: Value = serde_json::from_slice(answer).ok()?;
    let params = answer.get_mut(PARAMS)?.take();
    params
        .as_object()
        .is_some_and(|p| !p.is_empty())
        .then_some(params)
}

/// The request's id for both legs: the client's `X-Request-Id` when it sent a non-empty
/// one of visible ASCII, else a fresh one.
pub(crate) fn request_id(headers: &HeaderMap) -> String {
    headers
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|id| !id.is_empty())
        .map_or_else(fresh_request_id, str::to_owned)
}

/// A random id in the form of a version-4 UUID (as vLLM's proxy makes one per request).
pub(crate) fn fresh_request_id() -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    // Each `RandomState` is seeded anew; hashing a count keeps ids distinct within a run.
    let random = || {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(COUNT.fetch_add(1, Relaxed));
        h.finish()
    };
    let (a, b) = (random(), random());
    let version = (a & 0xffff_ffff_ffff_0fff) | 0x4000;
    let variant = (b & 0x3fff_ffff_ffff_ffff) | 0x8000_0000_0000_0000;
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        version >> 32,
        (version >> 16) & 0xffff,
        version & 0xffff,
        variant >> 48,
        variant & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn the_prefill_leg_asks_one_token_whole_and_the_decode_leg_keeps_the_clients_body() {
        let client = object(json!({
            "model": "m", "prompt": [1, 2], "stream": true, "max_tokens": 50,
            "max_completion_tokens": 50, "min_tokens": 4, "stream_options": {"include_usage": true},
        }));
        let p = prefill_body(&client);
        assert_eq!((&p["stream"], &p["max_tokens"]), (&json!(false), &json!(1)));
        assert_eq!(p["max_completion_tokens"], 1);
        assert_eq!(p[PARAMS]["do_remote_decode"], true);
        assert_eq!(p[PARAMS]["remote_port"], Value::Null);
        for gone in NOT_FOR_PREFILL {
            assert!(p.get(gone).is_none(), "{gone}");
        }
        let bare = prefill_body(&object(json!({"prompt": [1]})));
        assert!(bare.get("max_completion_tokens").is_none());

        let params = json!({"do_remote_prefill": true, "remote_block_ids": [3], "extra": 1});
        let d = decode_body(&client, Some(&params));
        assert_eq!(d[PARAMS], params, "copied unchanged");
        assert_eq!((&d["stream"], &d["max_tokens"]), (&json!(true), &json!(50)));
        assert_eq!(d["min_tokens"], 4);
        assert!(decode_body(&client, None).get(PARAMS).is_none());
    }

    #[test]
    fn transfer_params_are_read_only_from_a_non_empty_object() {
        let answer = br#"{"choices":[],"kv_transfer_params":{"remote_port":5601}}"#;
        assert_eq!(transfer_params(answer), Some(json!({"remote_port": 5601})));
        assert_eq!(transfer_params(br#"{"kv_transfer_params":{}}"#), None);
        assert_eq!(transfer_params(br#"{"kv_transfer_params":null}"#), None);
        assert_eq!(transfer_params(b"not json"), None);
    }

    #[test]
    fn a_request_keeps_the_clients_id_or_gets_a_fresh_one() {
        let mut headers = HeaderMap::new();
        let fresh = request_id(&headers);
        assert_eq!(fresh.len(), 36);
        assert_eq!(&fresh[14..15], "4", "version 4: {fresh}");
        assert_ne!(fresh, request_id(&headers));
        headers.insert(REQUEST_ID, axum::http::HeaderValue::from_static("req-7"));
        assert_eq!(request_id(&headers), "req-7");
    }
}
