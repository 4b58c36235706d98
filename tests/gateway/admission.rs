//! Admission at the gateway: the `x-ttft-target-ms` and `x-priority` headers, `429` with an
//! OpenAI-style error and `Retry-After` for a refused request, `400` for bad headers.

use super::fleet::*;
use std::time::Duration;

use prefix_router::{BalancedRouter, EngineLoad, Error, RouteRequest, Router, WorkerId};
use serde_json::{Value, json};

/// Posts a 2,048-token completion with `headers`.
async fn post_with(gw: &str, headers: &[(&str, &str)]) -> (u16, Value, reqwest::header::HeaderMap) {
    let tokens: Vec<u32> = (0..2_048).collect();
    let body = json!({"model": "m", "prompt": tokens, "max_tokens": 1});
    let mut req = client()
        .post(format!("{gw}/v1/completions"))
        .header("content-type", "application/json")
        .body(body.to_string());
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    read(req.send().await.unwrap()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_no_worker_can_meet_is_refused_with_429_unless_critical() {
    let ups: Vec<Upstream> = (0..2).map(|_| Upstream::start(1_000)).collect();
    let gw = gateway("balanced", &ups.iter().collect::<Vec<_>>()).await;
    // 2,048 uncached tokens take about 62 ms on an idle worker: a 1 ms target is out of
    // reach, and waiting cannot help (no Retry-After).
    let (status, v, headers) = post_with(&gw, &[("x-ttft-target-ms", "1")]).await;
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["type"], "overloaded", "{v}");
    assert_eq!(v["error"]["code"], "shed_prompt", "{v}");
    assert_eq!(v["error"]["gate"], "prompt", "{v}");
    assert!(v["error"]["measured_s"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(headers["x-shed-gate"], "prompt");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("standard request shed")
    );
    assert!(headers.get("retry-after").is_none());
    // The same request, critical, is served; so is one with a target it can meet.
    let (status, v, _) = post_with(
        &gw,
        &[("x-ttft-target-ms", "1"), ("x-priority", "critical")],
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let (status, v, _) = post_with(&gw, &[("x-ttft-target-ms", "60000")]).await;
    assert_eq!(status, 200, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_admission_headers_are_400() {
    let up = Upstream::start(1_000);
    let gw = gateway("balanced", &[&up]).await;
    for headers in [
        &[("x-ttft-target-ms", "abc")][..],
        &[("x-ttft-target-ms", "0")],
        &[("x-ttft-target-ms", "-5")],
        &[("x-tpot-target-ms", "0")],
        &[("x-tpot-target-ms", "fast")],
        &[("x-priority", "urgent")],
    ] {
        let (status, v, _) = post_with(&gw, headers).await;
        assert_eq!(status, 400, "{headers:?}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    }
}

/// A refusal the queue bounds says when to retry: `Retry-After` is the predicted wait,
/// rounded up to whole seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_bound_refusal_carries_retry_after() {
    let router = BalancedRouter::new(2).unwrap();
    for w in 0..2 {
        let load = EngineLoad::new(50, 8, Duration::ZERO).with_prefill_tokens(200_000);
        router.report_load(WorkerId::new(w), load).unwrap();
    }
    let tokens: Vec<u32> = (0..2_048).collect();
    let request = RouteRequest::new(&tokens).with_ttft_target(Duration::from_secs(2));
    let Err(Error::Shed(shed)) = router.route(&request) else {
        panic!("expected a refusal");
    };
    let wait = shed.retry_after.unwrap();
    let response = app::shed_response(&shed);
    assert_eq!(response.status().as_u16(), 429);
    let after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(after, wait.as_secs() + u64::from(wait.subsec_nanos() > 0));
    let body = axum::body::to_bytes(response.into_body(), 1 << 16)
        .await
        .unwrap();
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "shed_queue", "{v}");
    assert_eq!(v["error"]["gate"], "model", "{v}");
    assert_eq!(v["error"]["threshold_s"], 2.0, "{v}");
}

/// `GET /v1/models` lists what the upstreams serve, each model once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_are_listed_from_the_upstreams() {
    let ups: Vec<Upstream> = (0..2).map(|_| Upstream::start(1_000)).collect();
    let gw = gateway("balanced", &ups.iter().collect::<Vec<_>>()).await;
    let (status, v, _) = read(
        client()
            .get(format!("{gw}/v1/models"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "list", "{v}");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["m"], "{v}");
}
