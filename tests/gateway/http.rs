//! The gateway example over real loopback HTTP: mock workers with their own prefix caches,
//! the gateway in front, requests from a client. Everything is started and stopped here,
//! bounded in count and time.

use super::fleet::*;
use std::time::Duration;

use serde_json::{Value, json};

/// 300 requests: one-off questions on 3 shared system prompts, and 25 conversations of 10
/// turns (each turn the history plus a new message), shuffled within each round.
fn workload() -> Vec<(Vec<u32>, Option<String>)> {
    let mut seed = 7u64;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) as u32 % 150_000
    };
    let systems: Vec<Vec<u32>> = (0..3).map(|_| (0..128).map(|_| next()).collect()).collect();
    let mut histories: Vec<Vec<u32>> = (0..25).map(|s| systems[s % 3].clone()).collect();
    let mut out = Vec::new();
    for round in 0..10 {
        let mut batch = Vec::new();
        for (s, history) in histories.iter_mut().enumerate() {
            history.extend((0..160).map(|_| next()));
            batch.push((history.clone(), Some(format!("chat-{s}"))));
            history.extend((0..64).map(|_| next())); // the answer
        }
        for q in 0..5 {
            let mut p = systems[(round + q) % 3].clone();
            p.extend((0..256).map(|_| next()));
            batch.push((p, None));
        }
        for i in (1..batch.len()).rev() {
            batch.swap(i, next() as usize % (i + 1));
        }
        out.extend(batch);
    }
    out
}

/// Reported hit ratio (from the workers' own usage numbers) of `policy` on the workload.
/// Each worker caches 1,000 blocks (16,000 tokens): together the three hold most of the
/// conversations' prefixes once (about 59,000 tokens by the last round), nowhere near three
/// times over, which is what spreading every conversation over every worker needs.
async fn hit_ratio(policy: &str) -> f64 {
    let ups: Vec<Upstream> = (0..3).map(|_| Upstream::start(1_000)).collect();
    let gw = gateway(policy, &ups.iter().collect::<Vec<_>>()).await;
    let client = client();
    let (mut cached, mut total) = (0u64, 0u64);
    for (tokens, session) in workload() {
        let body = json!({"model": "m", "prompt": tokens, "max_tokens": 1});
        let (status, v, _) = post(&client, &gw, &body, session.as_deref()).await;
        assert_eq!(status, 200, "{v}");
        cached += v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        total += v["usage"]["prompt_tokens"].as_u64().unwrap();
    }
    cached as f64 / total as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_aware_routing_doubles_the_hit_ratio_of_round_robin() {
    let rr = hit_ratio("round_robin").await;
    let balanced = hit_ratio("balanced").await;
    let cache_aware = hit_ratio("cache_aware").await;
    eprintln!(
        "reported hit ratio: round robin {rr:.3}, balanced {balanced:.3}, cache_aware {cache_aware:.3}"
    );
    assert!(
        balanced >= 2.0 * rr,
        "balanced {balanced} vs round robin {rr}"
    );
    assert!(
        cache_aware >= 2.0 * rr,
        "cache_aware {cache_aware} vs round robin {rr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_told_the_capacity_predicts_an_aggressively_evicting_worker() {
    // 8 blocks of capacity for prompts of 20 blocks: the worker keeps only the first 8 of
    // the last prompt. The gateway's mirror is told the capacity (`--capacity-blocks`); miss
    // feedback keeps each served prompt, which the worker computed, and the mirror's LRU
    // then evicts as the worker's does.
    let up = Upstream::start(8);
    let options = policy::PolicyOptions {
        capacity_tokens: Some(8 * 16),
        ..policy::PolicyOptions::default()
    };
    let gw = gateway_with_options("balanced", &[&up], 1, options).await;
    let client = client();
    let prompts: Vec<Vec<u32>> = (0..3u32)
        .map(|p| (0..320).map(|i| p * 1_000 + i).collect())
        .collect();
    for round in 0..4 {
        for (i, prompt) in prompts.iter().enumerate() {
            let (status, v, headers) = post(&client, &gw, &json!({"prompt": prompt}), None).await;
            assert_eq!(status, 200);
            let (predicted, reported) = predicted_and_reported(&v, &headers);
            if round >= 1 {
                assert_eq!(predicted, reported, "round {round}, prompt {i}");
            }
        }
    }
    let stats = get(&client, format!("{gw}/stats")).await;
    assert_eq!(stats["workers"][0]["routed"], 12);
    assert_eq!(stats["workers"][0]["in_flight"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_loses_no_request() {
    let mut ups: Vec<Upstream> = (0..3).map(|_| Upstream::start(4_096)).collect();
    let gw = gateway("balanced", &ups.iter().collect::<Vec<_>>()).await;
    let client = client();
    let (mut ok, mut unavailable) = (0, 0);
    for i in 0..60u32 {
        if i == 20 {
            ups[1].kill();
        }
        let prompt: Vec<u32> = (0..64).map(|t| (i % 7) * 1_000 + t).collect();
        let (status, v, _) = post(&client, &gw, &json!({"prompt": prompt}), None).await;
        match status {
            200 => ok += 1,
            503 => {
                assert!(v["error"]["message"].is_string(), "{v}");
                unavailable += 1;
            }
            other => panic!("request {i}: status {other}: {v}"),
        }
    }
    assert_eq!(ok + unavailable, 60, "every request got an answer");
    assert_eq!(ok, 60, "two workers remain: the retry always finds one");
    let health = get(&client, format!("{gw}/health")).await;
    assert_eq!(health["available_workers"], 2);
    let stats = get(&client, format!("{gw}/stats")).await;
    assert_eq!(stats["workers"][1]["available"], false);
    for w in 0..3 {
        assert_eq!(stats["workers"][w]["in_flight"], 0, "worker {w}");
    }
    // With every worker gone the gateway answers 503 with a JSON error, and keeps serving.
    ups[0].kill();
    ups[2].kill();
    let (status, v, _) = post(&client, &gw, &json!({"prompt": [1, 2, 3]}), None).await;
    assert_eq!(status, 503);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no upstream worker")
    );
    let health = client.get(format!("{gw}/health")).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_a_400_with_a_clear_message() {
    let up = Upstream::start(64);
    let gw = gateway("cache_aware", &[&up]).await;
    let client = client();
    let cases: [(&str, &str); 8] = [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        (
            r#"{"prompt": "hello world"}"#,
            "no tokenizer for a text prompt",
        ),
        (
            r#"{"prompt": [1, 4294967296]}"#,
            "[1] = 4294967296 is not a token ID",
        ),
        (r#"{"prompt": [-3]}"#, "is not a token ID"),
        (r#"{"prompt": []}"#, "is empty"),
        (r#"{"model": "m"}"#, "missing \"prompt\""),
        (
            r#"{"messages": [{"role": "user", "content": "hi"}]}"#,
            "no tokenizer for chat",
        ),
    ];
    for (body, needle) in cases {
        let path = if body.contains("messages") {
            "chat/completions"
        } else {
            "completions"
        };
        let resp = client
            .post(format!("{gw}/v1/{path}"))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 400, "{body}");
        let v: Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{body}: {message}");
    }
}

/// One endpoint of two data-parallel ranks: the gateway routes over both and names the rank
/// it chose in `X-data-parallel-rank`, so each prompt's second request is served, fully
/// cached, by the rank that cached it the first time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_parallel_ranks_are_targets_named_by_a_header() {
    let up = Upstream::with_ranks(1_000, 2);
    let gw = gateway_with_ranks("balanced", &[&up], 2).await;
    let client = client();
    let prompts: Vec<Vec<u32>> = (0..4u32)
        .map(|p| (0..320).map(|i| p * 1_000 + i).collect())
        .collect();
    let mut ranks_used = std::collections::HashSet::new();
    for round in 0..2 {
        for prompt in &prompts {
            let body = json!({"model": "m", "prompt": prompt, "max_tokens": 1});
            let (status, v, headers) = post(&client, &gw, &body, None).await;
            assert_eq!(status, 200, "{v}");
            let routed: u64 = headers["x-routed-rank"].to_str().unwrap().parse().unwrap();
            assert_eq!(v["served_by_rank"].as_u64(), Some(routed));
            ranks_used.insert(routed);
            let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap();
            assert_eq!(cached, if round == 0 { 0 } else { 320 }, "round {round}");
        }
    }
    assert_eq!(ranks_used.len(), 2, "both ranks serve");
    let stats = get(&client, format!("{gw}/stats")).await;
    assert_eq!(stats["workers"].as_array().unwrap().len(), 2);
    assert_eq!(stats["workers"][1]["rank"], 1);
}

/// Posts a streamed completion of `prompt_len` tokens whose mock upstream pauses `pause_ms`
/// after its first event; returns the response and its first chunk.
async fn start_stream(
    client: &reqwest::Client,
    gw: &str,
    prompt_len: u32,
    pause_ms: u64,
) -> (reqwest::Response, axum::body::Bytes) {
    let body = json!({"model": "m", "prompt": (0..prompt_len).collect::<Vec<u32>>(),
        "stream": true, "mock_pause_ms": pause_ms});
    let mut resp = post_json(client, format!("{gw}/v1/completions"), &body).await;
    let first = resp.chunk().await.unwrap().unwrap();
    (resp, first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_completions_pass_through_and_fire_first_token_at_the_first_chunk() {
    let up = Upstream::start(4_096);
    let gw = gateway("balanced", &[&up]).await;
    let client = client();
    for round in 0..2u64 {
        let (mut resp, first) = start_stream(&client, &gw, 64, 300).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        assert!(String::from_utf8_lossy(&first).contains(" ok"));
        // Mid-stream: still in flight, its prefill known done.
        let mid = get(&client, format!("{gw}/stats")).await;
        assert_eq!(mid["workers"][0]["in_flight"], 1, "round {round}");
        assert_eq!(mid["workers"][0]["prefill_tokens"], 0, "round {round}");
        assert_eq!(mid["workers"][0]["streamed_first_tokens"], round + 1);
        let mut rest = Vec::new();
        while let Some(chunk) = resp.chunk().await.unwrap() {
            rest.extend_from_slice(&chunk);
        }
        let rest = String::from_utf8(rest).unwrap();
        assert!(
            rest.contains(" done") && rest.ends_with("data: [DONE]\n\n"),
            "{rest}"
        );
        assert!(
            rest.contains("\"usage\""),
            "the gateway asked for the usage event"
        );
        let stats = wait_for(&client, &gw, |w| w["in_flight"] == 0).await;
        // The second round finds the first's 64 tokens cached, reported by the usage event.
        assert_eq!(stats["workers"][0]["reported_cached_tokens"], 64 * round);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_stream_completes_its_request() {
    let up = Upstream::start(4_096);
    let gw = gateway("balanced", &[&up]).await;
    let client = client();
    let (resp, _) = start_stream(&client, &gw, 32, 3_000).await;
    assert_eq!(
        get(&client, format!("{gw}/stats")).await["workers"][0]["in_flight"],
        1
    );
    drop(resp);
    let stats = wait_for(&client, &gw, |w| w["in_flight"] == 0).await;
    assert_eq!(stats["workers"][0]["routed"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_metrics_are_scraped_into_the_routers_load_reports() {
    let up = Upstream::start(64);
    let gw = gateway("balanced", &[&up]).await;
    let client = client();
    let (mut resp, _) = start_stream(&client, &gw, 128, 1_500).await;
    // Mid-stream the engine reports one request running and 8 of its 64 blocks in use.
    let stats = wait_for(&client, &gw, |w| w["reported_running"] == 1).await;
    let w = &stats["workers"][0];
    assert!(
        (w["reported_kv_usage"].as_f64().unwrap() - 8.0 / 64.0).abs() < 1e-6,
        "{w}"
    );
    assert!(w["metrics_age_ms"].as_f64().unwrap() < 1_000.0, "{w}");
    assert_eq!(w["reported_waiting"], 0, "{w}");
    assert!(w["estimated_requests"].as_u64().unwrap() >= 1, "{w}");
    while resp.chunk().await.unwrap().is_some() {}
    wait_for(&client, &gw, |w| w["reported_running"] == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_asks_gets_the_routing_receipt() {
    let ups: Vec<Upstream> = (0..2).map(|_| Upstream::start(4_096)).collect();
    let gw = gateway("balanced", &ups.iter().collect::<Vec<_>>()).await;
    let client = client();
    let body = json!({"prompt": (0..64).collect::<Vec<u32>>()});
    let plain = client
        .post(format!("{gw}/v1/completions"))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert!(plain.headers().get("x-routing-receipt").is_none());
    let asked = client
        .post(format!("{gw}/v1/completions"))
        .header("x-routing-receipt", "1")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let worker = asked.headers()["x-routed-worker"]
        .to_str()
        .unwrap()
        .to_owned();
    let receipt = asked.headers()["x-routing-receipt"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        receipt.starts_with(&format!("balanced chose worker {worker} for 64 tokens:")),
        "{receipt}"
    );
    assert!(receipt.contains(&format!("[*w{worker} ")), "{receipt}");
}

/// Eight chats of four turns through `/v1/chat/completions`: the workers, which render and
/// tokenize the forwarded body themselves, report the whole history cached from the second
/// turn on (each chat stays on the worker that holds it), exactly as the gateway predicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chats_are_rendered_tokenized_and_routed_to_their_history() {
    let prompts = test_prompts();
    let (_ups, gw) = chat_fleet(&prompts).await;
    let client = client();
    let system = "You are a router's test assistant. Answer in one short sentence, please.";
    let mut chats: Vec<Vec<Value>> = (0..8)
        .map(|_| vec![json!({"role": "system", "content": system})])
        .collect();
    let (mut cached, mut total) = (0, 0);
    for turn in 0..4 {
        for (c, messages) in chats.iter_mut().enumerate() {
            messages.push(json!({"role": "user", "content": format!("Chat {c} asks question {turn} about prefix caches.")}));
            let body = json!({"model": "m", "messages": messages, "max_tokens": 2});
            let (status, v, headers) =
                post_to(&client, format!("{gw}/v1/chat/completions"), &body).await;
            assert_eq!(status, 200, "{v}");
            assert_eq!(v["object"], "chat.completion");
            assert_eq!(v["choices"][0]["message"]["content"], " ok done");
            let (predicted, reported) = predicted_and_reported(&v, &headers);
            assert_eq!(predicted, reported, "chat {c} turn {turn}");
            if turn > 0 {
                assert!(reported >= 32, "chat {c} turn {turn}: {reported}");
            }
            cached += reported;
            total += v["usage"]["prompt_tokens"].as_u64().unwrap();
            messages.push(v["choices"][0]["message"].clone());
        }
    }
    let ratio = cached as f64 / total as f64;
    assert!(ratio > 0.5, "hit ratio {ratio}");
    let stats = get(&client, format!("{gw}/stats")).await;
    assert!(
        stats["tokenize_cache"]["segments"].as_u64().unwrap() > 8,
        "{stats}"
    );
}

/// A text prompt is tokenized with the tokenizer's special tokens, as vLLM does, and the
/// body goes upstream unchanged (the worker tokenizes the same text to the same count); a
/// streamed chat fires `first_token` at its first content event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_prompts_and_streamed_chats_are_routed() {
    let prompts = test_prompts();
    let (_ups, gw) = chat_fleet(&prompts).await;
    let client = client();
    let text = "The router sends each request to the worker that holds its prefix.";
    let expected = prompts.tokens().encode(text, true).unwrap().len() as u64;
    for round in 0..2 {
        let body = json!({"model": "m", "prompt": text, "max_tokens": 2});
        let (status, v, _) = post_to(&client, format!("{gw}/v1/completions"), &body).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["usage"]["prompt_tokens"], expected);
        let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert_eq!(cached, if round == 0 { 0 } else { expected / 16 * 16 });
    }
    let body = json!({"model": "m", "stream": true,
        "messages": [{"role": "user", "content": text}]});
    let resp = post_json(&client, format!("{gw}/v1/chat/completions"), &body).await;
    assert_eq!(resp.status().as_u16(), 200);
    let events = resp.text().await.unwrap();
    assert!(
        events.contains("\"delta\":{\"content\":\" ok\"}"),
        "{events}"
    );
    assert!(events.trim_end().ends_with("data: [DONE]"), "{events}");
    let stats = wait_for(&client, &gw, |w| w["in_flight"] == 0).await;
    assert_eq!(stats["workers"][1]["in_flight"], 0);
    let first_tokens: u64 = stats["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["streamed_first_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(first_tokens, 1, "{stats}");
}

/// An upstream slower than the request timeout: the client gets a 504 and the request is
/// completed, but the worker stays in routing (slow is not down). A stream that starts in
/// time may run past the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upstream_times_out_with_a_504_and_stays_in_routing() {
    let up = Upstream::start(64);
    let options = app::Options {
        request_timeout: Duration::from_millis(300),
        ..app::Options::default()
    };
    let gw = gateway_with(
        "balanced",
        &[&up],
        1,
        policy::PolicyOptions::default(),
        options,
    )
    .await;
    let client = client();
    let slow = json!({"model": "m", "prompt": [1, 2, 3], "mock_pause_ms": 1_500});
    let (status, v, _) = post(&client, &gw, &slow, None).await;
    assert_eq!(status, 504, "{v}");
    assert_eq!(v["error"]["type"], "timeout");
    let stats = get(&client, format!("{gw}/stats")).await;
    assert_eq!(stats["workers"][0]["in_flight"], 0, "{stats}");
    assert_eq!(stats["workers"][0]["available"], true, "{stats}");
    let stream = json!({"model": "m", "prompt": [1, 2, 3], "stream": true, "mock_pause_ms": 600});
    let resp = post_json(&client, format!("{gw}/v1/completions"), &stream).await;
    assert_eq!(resp.status().as_u16(), 200);
    assert!(resp.text().await.unwrap().contains("[DONE]"));
    let (status, _, _) = post(
        &client,
        &gw,
        &json!({"model": "m", "prompt": [1, 2, 3]}),
        None,
    )
    .await;
    assert_eq!(status, 200);
}

/// Health probes take a dead worker out of routing before any request finds it dead, and
/// `/ready` answers 503 once no worker is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_take_dead_workers_out_and_ready_says_when_none_is_left() {
    let mut a = Upstream::start(64);
    let mut b = Upstream::start(64);
    let gw = gateway("balanced", &[&a, &b]).await;
    let client = client();
    let ready = |client: reqwest::Client, gw: String| async move {
        let resp = client.get(format!("{gw}/ready")).send().await.unwrap();
        let status = resp.status().as_u16();
        (
            status,
            serde_json::from_str::<Value>(&resp.text().await.unwrap()).unwrap(),
        )
    };
    let (status, v) = ready(client.clone(), gw.clone()).await;
    assert_eq!(
        (status, v["available_workers"].clone()),
        (200, json!(2)),
        "{v}"
    );
    a.kill();
    wait_for(&client, &gw, |w| w["available"] == false).await;
    assert_eq!(ready(client.clone(), gw.clone()).await.0, 200);
    b.kill();
    for _ in 0..100 {
        if ready(client.clone(), gw.clone()).await.0 == 503 {
            let stats = get(&client, format!("{gw}/stats")).await;
            assert_eq!(
                stats["workers"][0]["failures"], 0,
                "no request was sent: {stats}"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("/ready never said 503");
}

/// A policy that routes on load alone reads no prompt: a `round_robin` gateway with a
/// tokenizer forwards text and chat prompts without tokenizing them (its tokenize cache
/// stays empty) and counts their prompt tokens as the workers report them; a request that
/// asks for admission is tokenized, since admission weighs its prompt's length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_that_routes_on_load_alone_tokenizes_no_prompt() {
    let worker_prompts = test_prompts();
    let ups: Vec<Upstream> = (0..2)
        .map(|_| Upstream::with_prompts(4_096, &worker_prompts))
        .collect();
    let gateway_prompts = test_prompts();
    let gw = gateway_reading("round_robin", &ups, &gateway_prompts).await;
    let client = client();
    let text = "The router sends each request to the worker that holds its prefix.";
    let expected = gateway_prompts.tokens().encode(text, true).unwrap().len() as u64;
    let body = json!({"model": "m", "prompt": text, "max_tokens": 2});
    let (status, v, _) = post_to(&client, format!("{gw}/v1/completions"), &body).await;
    assert_eq!(
        (status, &v["usage"]["prompt_tokens"]),
        (200, &json!(expected)),
        "{v}"
    );
    let body = json!({"model": "m", "messages": [{"role": "user", "content": text}]});
    let (status, v, _) = post_to(&client, format!("{gw}/v1/chat/completions"), &body).await;
    assert_eq!(status, 200, "{v}");
    let chat_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
    let stats = wait_idle(&client, &gw).await;
    assert_eq!(stats["tokenize_cache"]["segments"], 0, "{stats}");
    let counted: u64 = stats["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["prompt_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(counted, expected + chat_tokens, "{stats}");
    let empty = json!({"model": "m", "prompt": "", "max_tokens": 2});
    let (status, v, _) = post_to(&client, format!("{gw}/v1/completions"), &empty).await;
    assert_eq!(status, 400, "{v}");

    let resp = client
        .post(format!("{gw}/v1/completions"))
        .header("content-type", "application/json")
        .header("x-ttft-target-ms", "60000")
        .body(json!({"model": "m", "prompt": text, "max_tokens": 2}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let stats = get(&client, format!("{gw}/stats")).await;
    assert!(
        stats["tokenize_cache"]["segments"].as_u64().unwrap() > 0,
        "{stats}"
    );
}
