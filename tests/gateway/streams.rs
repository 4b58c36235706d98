//! Streams through the gateway from scripted upstreams: events that carry a token with no
//! text.

use super::fleet::*;

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

/// A scripted upstream's answers: a streamed request gets `events` (each a `data:` line's
/// JSON), `every` apart, then the usage event and `[DONE]`; any other gets a whole
/// completion.
#[derive(Clone)]
struct Script {
    events: Vec<Value>,
    every: Duration,
}

impl Script {
    fn upstream(self) -> Upstream {
        let answer = move |body: Bytes| {
            let script = self.clone();
            async move { script.answer(&body) }
        };
        let app = axum::Router::new()
            .route("/v1/completions", post(answer.clone()))
            .route("/v1/chat/completions", post(answer))
            .route("/health", axum::routing::get(|| async { "ok" }));
        Upstream::serving(app)
    }

    fn answer(&self, body: &[u8]) -> Response {
        let request: Value = serde_json::from_slice(body).unwrap_or_default();
        let usage = json!({"prompt_tokens": 3, "completion_tokens": self.events.len(),
            "prompt_tokens_details": {"cached_tokens": 0}});
        if request["stream"] != true {
            let whole = json!({"choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
                "usage": usage});
            return axum::Json(whole).into_response();
        }
        let mut lines: Vec<String> = self
            .events
            .iter()
            .map(|e| format!("data: {e}\n\n"))
            .collect();
        lines.push(format!(
            "data: {}\n\n",
            json!({"choices": [], "usage": usage})
        ));
        lines.push("data: [DONE]\n\n".to_owned());
        let every = self.every;
        let body = futures_util::stream::unfold(lines.into_iter(), move |mut lines| async move {
            let line = lines.next()?;
            tokio::time::sleep(every).await;
            Some((Ok::<_, std::io::Error>(Bytes::from(line)), lines))
        });
        (
            [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
            Body::from_stream(body),
        )
            .into_response()
    }
}

/// vLLM sends one event per output token, and a token that ends inside a UTF-8 character
/// (or a skipped special token) has no text: such events are tokens all the same, the first
/// of them the stream's first token. A chat's role-only first delta is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_text_events_count_as_the_first_token() {
    let empty_text = Script {
        events: vec![json!({"choices": [{"index": 0, "text": ""}]}); 3],
        every: Duration::ZERO,
    };
    let up = empty_text.upstream();
    let gw = gateway("round_robin", &[&up]).await;
    let client = client();
    let body = json!({"model": "m", "prompt": [1, 2, 3], "stream": true});
    let resp = post_json(&client, format!("{gw}/v1/completions"), &body).await;
    assert_eq!(resp.status().as_u16(), 200);
    assert!(resp.text().await.unwrap().contains("[DONE]"));
    let stats = wait_for(&client, &gw, |w| w["in_flight"] == 0).await;
    assert_eq!(stats["workers"][0]["streamed_first_tokens"], 1, "{stats}");

    let role_only =
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]});
    let chat = Script {
        events: vec![role_only],
        every: Duration::ZERO,
    };
    let ups = [chat.upstream()];
    let gw = gateway_reading("round_robin", &ups, &test_prompts()).await;
    let body = json!({"model": "m", "stream": true,
        "messages": [{"role": "user", "content": "hi"}]});
    let resp = post_json(&client, format!("{gw}/v1/chat/completions"), &body).await;
    assert_eq!(resp.status().as_u16(), 200);
    assert!(resp.text().await.unwrap().contains("[DONE]"));
    let stats = wait_for(&client, &gw, |w| w["in_flight"] == 0).await;
    assert_eq!(stats["workers"][0]["streamed_first_tokens"], 0, "{stats}");
}
