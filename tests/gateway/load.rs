//! A bounded load test of the gateway: 2,000 streamed chat requests from 64 concurrent
//! clients over four mock workers, first straight to the workers (round robin), then
//! through the gateway. Every request must come back whole, and the gateway's load counters
//! must return to zero. The gateway's overhead (time to first byte and to the stream's end,
//! through the gateway minus straight to the workers, at p50 and p99) is printed for
//! `benches/README.md`:
//!
//! `cargo test --release --test gateway load -- --nocapture`

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::fleet::*;
use serde_json::{Value, json};

const REQUESTS: usize = 2_000;
const CLIENTS: usize = 64;

/// Request `i`: turn `i / 100` of chat `i % 100`, on one of 4 system prompts.
fn body(i: usize) -> Value {
    let (chat, turn) = (i % 100, i / 100);
    let mut messages = vec![json!({"role": "system",
        "content": format!("System prompt {}: route requests to the worker holding their prefix.", chat % 4)})];
    for t in 0..=turn {
        messages
            .push(json!({"role": "user", "content": format!("Chat {chat} asks question {t}.")}));
        if t < turn {
            messages.push(json!({"role": "assistant", "content": "ok done"}));
        }
    }
    json!({"model": "m", "messages": messages, "stream": true,
        "stream_options": {"include_usage": true}, "max_tokens": 2})
}

/// Per request: time to the first byte of the body, and to the end of the stream.
type Timing = (Duration, Duration);

/// Sends requests `0..requests`, `clients` at a time, request `i` to
/// `urls[i % urls.len()]`.
async fn run(urls: Arc<Vec<String>>, clients: usize, requests: usize) -> Vec<Timing> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(clients)
        .build()
        .unwrap();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (client, urls, next) = (client.clone(), Arc::clone(&urls), Arc::clone(&next));
        tasks.push(tokio::spawn(async move {
            let mut timings = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= requests {
                    return timings;
                }
                timings.push(one(&client, &urls[i % urls.len()], &body(i)).await);
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

/// One streamed request, checked whole.
async fn one(client: &reqwest::Client, url: &str, body: &Value) -> Timing {
    let started = Instant::now();
    let mut resp = post_json(client, format!("{url}/v1/chat/completions"), body).await;
    assert_eq!(resp.status().as_u16(), 200);
    let mut text = Vec::new();
    let mut first = None;
    while let Some(chunk) = resp.chunk().await.unwrap() {
        first.get_or_insert_with(|| started.elapsed());
        text.extend_from_slice(&chunk);
    }
    let text = String::from_utf8(text).unwrap();
    assert!(text.contains("\"content\":\" done\""), "{text}");
    assert!(text.contains("\"usage\""), "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    (first.unwrap(), started.elapsed())
}

fn percentile(mut values: Vec<Duration>, p: f64) -> Duration {
    values.sort();
    values[((values.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1_000.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_streamed_chats_from_64_clients_lose_nothing() {
    let prompts = test_prompts();
    let ups: Vec<Upstream> = (0..4)
        .map(|_| Upstream::with_prompts(65_536, &prompts))
        .collect();
    let urls: Arc<Vec<String>> = Arc::new(ups.iter().map(|u| u.url.clone()).collect());
    let direct = run(Arc::clone(&urls), CLIENTS, REQUESTS).await;
    let gw = gateway_reading("balanced", &ups, &prompts).await;
    let through = run(Arc::new(vec![gw.clone()]), CLIENTS, REQUESTS).await;
    assert_eq!((direct.len(), through.len()), (REQUESTS, REQUESTS));
    report("64 clients", &direct, &through);

    let stats = get(&client(), format!("{gw}/stats")).await;
    let workers = stats["workers"].as_array().unwrap();
    let routed: u64 = workers.iter().map(|w| w["routed"].as_u64().unwrap()).sum();
    assert_eq!(routed, REQUESTS as u64, "{stats}");
    for w in workers {
        assert_eq!(
            (w["in_flight"].as_u64(), w["prefill_tokens"].as_u64()),
            (Some(0), Some(0)),
            "{stats}"
        );
        assert_eq!(w["failures"], 0, "{stats}");
    }
    let streamed: u64 = workers
        .iter()
        .map(|w| w["streamed_first_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(streamed, REQUESTS as u64, "{stats}");

    // One client at a time: the gateway's own cost, without queueing behind other requests.
    let direct = run(Arc::clone(&urls), 1, 200).await;
    let through = run(Arc::new(vec![gw.clone()]), 1, 200).await;
    report("1 client", &direct, &through);
}

/// Prints p50 and p99 of both runs and their differences.
fn report(load: &str, direct: &[Timing], through: &[Timing]) {
    for (name, pick) in [("first byte", 0), ("whole stream", 1)] {
        let of = |t: &[Timing]| {
            t.iter()
                .map(|x| if pick == 0 { x.0 } else { x.1 })
                .collect::<Vec<_>>()
        };
        let (d, g) = (of(direct), of(through));
        let (d50, d99) = (percentile(d.clone(), 0.5), percentile(d, 0.99));
        let (g50, g99) = (percentile(g.clone(), 0.5), percentile(g, 0.99));
        eprintln!(
            "{load}, {name}: straight to the workers p50 {:.2} ms p99 {:.2} ms; through the gateway p50 {:.2} ms p99 {:.2} ms; overhead p50 {:.2} ms p99 {:.2} ms",
            ms(d50),
            ms(d99),
            ms(g50),
            ms(g99),
            ms(g50) - ms(d50),
            ms(g99) - ms(d99)
        );
    }
}
