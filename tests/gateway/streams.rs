//! Streams through the gateway from scripted upstreams: events that carry a token with no
//! text, and a stream's relay while another request's long prompt is tokenized.

use super::fleet::*;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// A gateway with `policy` over `upstream`, reading prompts with `prompts`, on a runtime of
/// its own with one worker thread: what holds that thread holds every relay. Dropping the
/// sender stops it.
fn gateway_on_one_thread(
    policy: &str,
    upstream: &Upstream,
    prompts: Arc<prompt::Prompts>,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    let router = policy::build(policy, 1, &policy::PolicyOptions::default())
        .unwrap()
        .unwrap();
    let layout = prefix_router::RankLayout::new(1).unwrap();
    let options = app::Options {
        prompts: Some(prompts),
        ..app::Options::default()
    };
    let gw = app::Gateway::new(router, vec![upstream.url.clone()], layout, options);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let server = axum::serve(app::no_delay(listener), app::app(gw));
            tokio::select! {
                _ = server => {}
                _ = stopped => {}
            }
        });
    });
    (url, stop)
}

/// The longest wait between consecutive instants of `at`.
fn longest_gap(at: &[Instant]) -> Duration {
    at.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default()
}

/// A long text prompt is tokenized off the runtime's worker threads: a stream already in
/// flight through a gateway of one worker thread keeps coming (an event every 5 ms from
/// its upstream) while another request's prompt of about 100k tokens is tokenized: no
/// wait between its chunks is a quarter of the time that request takes to be answered (a
/// relay held for the tokenization would wait about all of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_prompts_tokenization_holds_up_no_stream_in_flight() {
    let paced = Script {
        events: vec![json!({"choices": [{"index": 0, "text": " x"}]}); 4_000],
        every: Duration::from_millis(5),
    };
    let up = paced.upstream();
    // Words drawn pseudo-randomly: no two of the prompt's pieces repeat, so none comes
    // from the tokenize cache.
    let words = [
        "routing", "cache", "prefix", "worker", "token", "request", "stream", "model", "engine",
        "block", "policy", "gateway", "load", "queue", "time", "answer",
    ];
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let long: String = (0..100_000)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            format!(" {}", words[(state >> 60) as usize])
        })
        .collect();
    let (gw, _stop) = gateway_on_one_thread("cache_aware", &up, test_prompts());
    let client = client();
    let body = json!({"model": "m", "prompt": [1, 2, 3], "stream": true});
    let mut stream = post_json(&client, format!("{gw}/v1/completions"), &body).await;
    assert_eq!(stream.status().as_u16(), 200);
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&arrivals);
    let reader = tokio::spawn(async move {
        while let Ok(Some(_)) = stream.chunk().await {
            seen.lock().unwrap().push(Instant::now());
        }
    });
    while arrivals.lock().unwrap().len() < 5 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let sent = Instant::now();
    let body = json!({"model": "m", "prompt": long, "max_tokens": 1});
    let (status, v, _) = post_to(&client, format!("{gw}/v1/completions"), &body).await;
    assert_eq!(status, 200, "{v}");
    let answered = Instant::now();
    tokio::time::sleep(Duration::from_millis(50)).await;
    reader.abort();
    let mut during: Vec<Instant> = arrivals.lock().unwrap().clone();
    during.retain(|&t| t >= sent);
    during.insert(0, sent);
    let stats = get(&client, format!("{gw}/stats")).await;
    assert!(
        stats["workers"][0]["prompt_tokens"].as_u64().unwrap() >= 100_000,
        "the long prompt was tokenized: {stats}"
    );
    // The long request's answer waits for its tokenization: a stream held up by it waits
    // about as long; one relayed beside it, its upstream's 5 ms and the machine's delays.
    let answering = answered - sent;
    let bound = (answering / 4).max(Duration::from_millis(100));
    let gap = longest_gap(&during);
    assert!(
        gap < bound,
        "the stream waited {gap:?} (bound {bound:?}) while the prompt was tokenized \
         ({answering:?} to answer)"
    );
}
