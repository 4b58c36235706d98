//! The gateway's `GET /metrics`: every outcome a request can have counted once, by worker,
//! the times to first token of streams, the latencies, and the cached tokens predicted and
//! delivered, each agreeing with `/stats` and with what the client saw.

use std::time::Duration;

use super::fleet::*;
use serde_json::{Value, json};

/// The cached tokens a streamed answer's usage event reported.
fn stream_usage(text: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .find_map(|e| {
            e.pointer("/usage/prompt_tokens_details/cached_tokens")?
                .as_u64()
        })
        .unwrap()
}

/// Sends four whole and four streamed completions over two prompts (all but the first of
/// each prompt find it cached); returns the cached tokens the answers reported.
async fn serve_eight(client: &reqwest::Client, gw: &str) -> u64 {
    let mut delivered = 0;
    for i in 0..8u32 {
        let prompt: Vec<u32> = (0..256).map(|t| t + 1_000 * (i % 2)).collect();
        let streamed = i >= 4;
        let body = json!({"model": "m", "prompt": prompt, "max_tokens": 2, "stream": streamed});
        let resp = post_json(client, format!("{gw}/v1/completions"), &body).await;
        assert_eq!(resp.status().as_u16(), 200);
        let text = resp.text().await.unwrap();
        delivered += if streamed {
            assert!(text.contains("[DONE]"), "{text}");
            stream_usage(&text)
        } else {
            let v: Value = serde_json::from_str(&text).unwrap();
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap()
        };
    }
    delivered
}

/// A request the gateway cannot read, one the upstream answers too late, and a stream the
/// client leaves: one `invalid`, one `timeout` and one `cancelled` outcome.
async fn fail_three(client: &reqwest::Client, gw: &str) {
    let resp = client
        .post(format!("{gw}/v1/completions"))
        .body("not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let slow = json!({"model": "m", "prompt": [1, 2, 3], "mock_pause_ms": 1_500});
    let (status, v, _) = post(client, gw, &slow, None).await;
    assert_eq!(status, 504, "{v}");
    let leave = json!({"model": "m", "prompt": [4, 5, 6], "stream": true, "mock_pause_ms": 1_000});
    let mut resp = post_json(client, format!("{gw}/v1/completions"), &leave).await;
    assert!(resp.chunk().await.unwrap().is_some());
    drop(resp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_every_outcome_and_agree_with_stats() {
    let ups: Vec<Upstream> = (0..2).map(|_| Upstream::start(4_096)).collect();
    let options = app::Options {
        request_timeout: Duration::from_millis(800),
        ..app::Options::default()
    };
    let refs: Vec<&Upstream> = ups.iter().collect();
    let gw = gateway_with("cache_aware", &refs, 1, Default::default(), options).await;
    let client = client();
    let delivered = serve_eight(&client, &gw).await;
    assert!(delivered > 0);
    fail_three(&client, &gw).await;
    let stats = wait_idle(&client, &gw).await;
    let scrape = scrape(&client, &gw).await;

    let requests = |with: &[(&str, &str)]| total(&scrape, "gateway_requests_total", with);
    assert_eq!(requests(&[]), 11.0);
    assert_eq!(requests(&[("outcome", "served")]), 8.0);
    assert_eq!(requests(&[("outcome", "invalid"), ("worker", "none")]), 1.0);
    assert_eq!(requests(&[("outcome", "timeout")]), 1.0);
    assert_eq!(requests(&[("outcome", "cancelled")]), 1.0);
    // Every request a worker took has a latency; the five streams a first token.
    let all = |name: &str| total(&scrape, name, &[]);
    assert_eq!(all("gateway_request_duration_seconds_count"), 10.0);
    assert_eq!(all("gateway_time_to_first_token_seconds_count"), 5.0);
    assert_eq!(
        all("gateway_delivered_cached_tokens_total"),
        delivered as f64
    );
    assert_eq!(all("gateway_worker_available"), 2.0);
    assert_eq!(all("gateway_worker_in_flight"), 0.0);
    for (i, w) in stats["workers"].as_array().unwrap().iter().enumerate() {
        let worker = i.to_string();
        let of = |name: &str| total(&scrape, name, &[("worker", &worker)]);
        let stat = |key: &str| w[key].as_u64().unwrap() as f64;
        assert_eq!(
            of("gateway_predicted_cached_tokens_total"),
            stat("predicted_cached_tokens")
        );
        assert_eq!(
            of("gateway_delivered_cached_tokens_total"),
            stat("reported_cached_tokens")
        );
        assert_eq!(
            of("gateway_reported_prompt_tokens_total"),
            stat("prompt_tokens")
        );
        assert_eq!(
            of("gateway_time_to_first_token_seconds_count"),
            stat("streamed_first_tokens")
        );
    }
    // The router's fleet signals: the prompts it routed (the mocks' tokens are the ids), of
    // which six of the eight found their prompt cached where they went.
    let tokens = |kind: &str| total(&scrape, "gateway_router_tokens_total", &[("kind", kind)]);
    let routed_prompts = 8.0 * 256.0 + 2.0 * 3.0;
    assert_eq!(tokens("prompt"), routed_prompts);
    assert_eq!(tokens("captured") + tokens("uncached"), routed_prompts);
    assert!(tokens("captured") >= 6.0 * 256.0, "{}", tokens("captured"));
    assert!(tokens("available") >= tokens("captured"));
    let ratio = all("gateway_router_predicted_hit_ratio");
    assert_eq!(ratio, tokens("captured") / routed_prompts);
    assert_eq!(
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == "gateway_router_worker_wait_seconds")
            .count(),
        2
    );
    // The streams' timed first tokens: each worker's prefill window is observed.
    assert_eq!(
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == "gateway_router_worker_prefill_factor")
            .count(),
        2
    );
    for name in [
        "gateway_router_tokens_total",
        "gateway_router_worker_wait_seconds",
        "gateway_requests_total",
        "gateway_shed_total",
        "gateway_time_to_first_token_seconds",
        "gateway_request_duration_seconds",
        "gateway_router_shed_total",
        "gateway_router_worker_prefill_factor",
        "gateway_router_worker_outstanding_prefill_tokens",
        "gateway_router_worker_step_seconds",
        "gateway_router_worker_prefill_share",
    ] {
        assert!(scrape.docs.contains_key(name), "no HELP for {name}");
    }
}
