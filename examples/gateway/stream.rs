//! Streamed completions: the upstream's server-sent events pass through to the client as
//! they arrive, and the gateway watches them go by.
//!
//! Glossary: an **event** is one `data: ...` line of the stream; a **content event** is one
//! output token's event: its first choice has a `text` (or, for chat, a `delta.content`
//! that is not the role-only first delta's), even empty, since a token may decode to no
//! text; the **usage event** carries `usage`, which vLLM sends last when the request asks
//! for it (`stream_options.include_usage`, which the gateway adds).
//!
//! The router hears `first_token` at the first content event, the stream's progress every
//! [`PROGRESS_EVERY`] content events after it and at its end (`tokens_after`, cumulative:
//! vLLM sends a content event per output token), the cached-token report at the usage
//! event, and `complete` when the stream ends, fails or the client goes away
//! (whichever comes first: the watcher is dropped then). The gateway's metrics count the
//! request then too: served when a 2xx stream ran to its end, an error when the upstream
//! answered with an error status or its stream broke, cancelled when the client went away
//! first.

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use futures_util::StreamExt;
use prefix_router::{RouteDecision, TokenId};
use serde_json::Value;

use super::app::Gateway;
use super::telemetry::Outcome;

/// Every how many output tokens after the first the router hears a stream's progress.
pub(crate) const PROGRESS_EVERY: u32 = 16;

/// Whether the request asks for a stream (`"stream": true`).
pub(crate) fn is_streamed(body: &Value) -> bool {
    body.get("stream").and_then(Value::as_bool) == Some(true)
}

/// The body to send upstream for a streamed request: the client's, asking for the usage
/// event unless the client said otherwise.
pub(crate) fn with_usage(mut body: Value) -> Bytes {
    if let Some(object) = body.as_object_mut() {
        let options = object
            .entry("stream_options")
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
        if let Some(options) = options.as_object_mut() {
            options.entry("include_usage").or_insert(Value::Bool(true));
        }
    }
    Bytes::from(body.to_string())
}

/// What the events of a stream said so far.
#[derive(Debug, Default)]
pub(crate) struct Events {
    /// Bytes of an event line not complete yet.
    partial: Vec<u8>,
    /// Whether a content event came.
    content: bool,
    /// Content events so far.
    content_events: u32,
    /// The usage event's cached prompt tokens.
    cached_tokens: Option<u64>,
    /// The usage event's prompt tokens.
    prompt_tokens: Option<u64>,
}

impl Events {
    /// Reads `chunk`; true when it held the stream's first content event.
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> bool {
        let before = self.content;
        self.partial.extend_from_slice(chunk);
        while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            self.line(&line);
        }
        !before && self.content
    }

    /// Content events so far: output tokens, one per event.
    pub(crate) fn content_events(&self) -> u32 {
        self.content_events
    }

    /// The cached prompt tokens the usage event reported, if it came.
    pub(crate) fn cached_tokens(&self) -> Option<u64> {
        self.cached_tokens
    }

    /// The prompt tokens the usage event reported, if it came.
    pub(crate) fn prompt_tokens(&self) -> Option<u64> {
        self.prompt_tokens
    }

    fn line(&mut self, line: &[u8]) {
        let Ok(line) = std::str::from_utf8(line) else {
            return;
        };
        let Some(data) = line.trim_end().strip_prefix("data:") else {
            return;
        };
        let Ok(event) = serde_json::from_str::<Value>(data.trim()) else {
            return; // `[DONE]` or a malformed event: nothing to learn
        };
        if event.pointer("/choices/0").is_some_and(is_token_event) {
            self.content = true;
            self.content_events = self.content_events.saturating_add(1);
        }
        let count = |path: &str| event.pointer(path).and_then(Value::as_u64);
        if let Some(cached) = count("/usage/prompt_tokens_details/cached_tokens") {
            self.cached_tokens = Some(cached);
            self.prompt_tokens = count("/usage/prompt_tokens");
        }
    }
}

/// Whether a stream's first `choice` is one output token's event: a completion's choice
/// with a `text`, or a chat choice whose `delta` has a `content`, even empty (vLLM sends one
/// event per token, and a token that ends inside a UTF-8 character or is a skipped special
/// token has no text). A chat's role-only first delta (`role` with an empty or no
/// `content`) is not a token.
fn is_token_event(choice: &Value) -> bool {
    if choice.get("text").is_some_and(Value::is_string) {
        return true;
    }
    let Some(delta) = choice.get("delta") else {
        return false;
    };
    match delta.get("content").and_then(Value::as_str) {
        Some(content) => !content.is_empty() || delta.get("role").is_none(),
        None => false,
    }
}

/// A streamed request in flight: what the router must hear about it, told as its events
/// pass and, for `complete`, when it is dropped.
struct Watch {
    gw: Arc<Gateway>,
    decision: RouteDecision,
    tokens: Vec<TokenId>,
    salt: Vec<u8>,
    started: Instant,
    events: Events,
    /// When the first content event came.
    first_at: Option<Instant>,
    /// Output tokens after the first last reported to the router.
    reported: u32,
    /// Whether the upstream answered with a 2xx status.
    answered: bool,
    /// Whether the upstream's stream ended, and whether it broke on the way.
    ended: bool,
    broken: bool,
}

impl Watch {
    /// The upstream's stream ended: the request counts as served if it answered 2xx.
    fn end(&mut self) {
        self.ended = true;
    }

    fn chunk(&mut self, chunk: &[u8]) {
        if self.events.feed(chunk) {
            self.first_at = Some(Instant::now());
            self.gw
                .first_token_after(&self.decision, self.started.elapsed());
        }
        let after = self.events.content_events().saturating_sub(1);
        if after >= self.reported + PROGRESS_EVERY {
            self.progress(after);
        }
    }

    /// Tells the router the stream's `after` output tokens after its first, cumulative.
    fn progress(&mut self, after: u32) {
        if let Some(first) = self.first_at {
            self.gw
                .router()
                .tokens_after(&self.decision, after, first.elapsed());
            self.reported = after;
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let after = self.events.content_events().saturating_sub(1);
        if self.ended && after > self.reported {
            self.progress(after);
        }
        if let Some(cached) = self.events.cached_tokens() {
            let usage = (cached, self.events.prompt_tokens());
            self.gw
                .reported(&self.decision, &self.tokens, &self.salt, usage);
        }
        self.gw.router().complete(&self.decision);
        let outcome = Outcome::of_stream(self.answered && !self.broken, self.ended);
        self.gw.telemetry().finished(
            Some(self.decision.worker()),
            outcome,
            self.started.elapsed(),
        );
    }
}

/// The client's body: `upstream`'s bytes as they come, watched for the router. `complete`
/// is called when the stream ends (the watcher is dropped with the stream's state when the
/// upstream has no more) or the client disconnects (dropping the body).
pub(crate) fn pass_through(
    gw: Arc<Gateway>,
    decision: RouteDecision,
    tokens: Vec<TokenId>,
    salt: Vec<u8>,
    started: Instant,
    upstream: reqwest::Response,
) -> Body {
    let watch = Watch {
        gw,
        decision,
        tokens,
        salt,
        started,
        events: Events::default(),
        first_at: None,
        reported: 0,
        answered: upstream.status().is_success(),
        ended: false,
        broken: false,
    };
    let chunks = Box::pin(upstream.bytes_stream());
    let body =
        futures_util::stream::unfold((chunks, watch), |(mut chunks, mut watch)| async move {
            let Some(chunk) = chunks.next().await else {
                watch.end();
                return None;
            };
            match &chunk {
                Ok(bytes) => watch.chunk(bytes),
                Err(_) => watch.broken = true,
            }
            Some((chunk, (chunks, watch)))
        });
    Body::from_stream(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event whose text is empty is a token's all the same: the first content is the
    /// first event, and both count.
    #[test]
    fn events_split_across_chunks_are_read_whole_and_empty_text_is_a_token() {
        let first = "data: {\"choices\":[{\"text\":\"\"}]}\n\n";
        let stream = [
            first,
            "data: {\"choices\":[{\"text\":\" hi\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n",
            "data: [DONE]\n\n",
        ]
        .concat();
        let mut events = Events::default();
        let firsts: Vec<bool> = stream
            .as_bytes()
            .chunks(7)
            .map(|c| events.feed(c))
            .collect();
        let at: Vec<usize> = (0..firsts.len()).filter(|&i| firsts[i]).collect();
        // The chunk holding the first event's newline.
        assert_eq!(
            at,
            [first.find('\n').unwrap_or_default() / 7],
            "one first content"
        );
        assert_eq!(events.content_events(), 2);
        assert_eq!(events.cached_tokens(), Some(32));
    }

    #[test]
    fn a_chats_role_only_first_delta_is_not_a_token_but_an_empty_content_is() {
        let mut events = Events::default();
        assert!(!events.feed(
            b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n"
        ));
        assert!(!events.feed(b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n"));
        assert!(events.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"\"}}]}\n"));
        assert!(!events.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n"));
        assert_eq!(events.content_events(), 2);
    }

    #[test]
    fn chat_deltas_count_as_content_and_usage_is_added_unless_set() {
        let mut events = Events::default();
        assert!(events.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n"));
        let body = with_usage(serde_json::json!({"stream": true}));
        let v: Value = serde_json::from_slice(&body).unwrap_or_default();
        assert_eq!(v["stream_options"]["include_usage"], true);
        let off = serde_json::json!({"stream": true, "stream_options": {"include_usage": false}});
        let v: Value = serde_json::from_slice(&with_usage(off)).unwrap_or_default();
        assert_eq!(v["stream_options"]["include_usage"], false);
    }
}
