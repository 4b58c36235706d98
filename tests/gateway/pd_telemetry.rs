//! The P/D gateway's `GET /metrics` over loopback HTTP: split and local requests, whole,
//! streamed and left, one the gateway cannot read and one whose prefill leg fails, each
//! counted once by plan and outcome, agreeing with `/stats`, with the mocks' legs and with
//! what the client saw.

use super::fleet::*;
use super::pd::{Fleet, TWO_BY_ONE, events, header};

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use prefix_router::{Decide, PairView, Plan, RouteRequest};
use serde_json::{Value, json};

use pd_plan::Role;

/// Prompts of at least this many tokens are split.
const LONG: usize = 64;

/// A decider splitting long prompts ([`LONG`]) and keeping short ones local, taking each
/// side's workers in turn.
#[derive(Default)]
struct SplitLong(AtomicUsize);

impl Decide for SplitLong {
    fn name(&self) -> &'static str {
        "split_long"
    }

    fn decide(&self, request: &RouteRequest<'_>, view: &PairView<'_>) -> Plan {
        let n = self.0.fetch_add(1, Relaxed);
        let decoders: Vec<usize> = view.decoders().collect();
        let prefillers: Vec<usize> = view.prefillers().collect();
        let decode = decoders[n % decoders.len()];
        if request.tokens().len() >= LONG && !prefillers.is_empty() {
            let prefill = prefillers[n % prefillers.len()];
            Plan::Split { prefill, decode }
        } else {
            Plan::Aggregated { decode }
        }
    }
}

/// What the client sent and saw.
#[derive(Default, Debug)]
struct Sent {
    /// Answered 200, by plan (split, local), and of those, streamed.
    served: [u64; 2],
    streamed: [u64; 2],
    /// Prompt tokens of the requests planned, by plan.
    prompt_tokens: [u64; 2],
}

/// Sends four split and three local requests (long and short prompts of their own), every
/// other one streamed, each answered 200 by the plan its length asks for.
async fn serve_seven(f: &Fleet, sent: &mut Sent) {
    for i in 0..7u32 {
        let split = i < 4;
        let len = if split { 2 * LONG as u32 } else { 8 };
        let stream = i % 2 == 1;
        let prompt: Vec<u32> = (0..len).map(|t| t + 1_000 * i).collect();
        let body = json!({"model": "m", "prompt": prompt, "stream": stream});
        let (status, headers, answer) = f.send("/v1/completions", &body, None).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(header(&headers, "x-prefill-worker").is_some(), split);
        if stream {
            assert!(events(&answer).1, "the stream ran to its end: {answer}");
        }
        let plan = usize::from(!split);
        sent.served[plan] += 1;
        sent.streamed[plan] += u64::from(stream);
        sent.prompt_tokens[plan] += u64::from(len);
    }
}

/// A body the gateway cannot read (400), a split request whose prefill leg fails (502),
/// and a local stream the client leaves after its first event.
async fn fail_three(f: &Fleet, sent: &mut Sent) {
    let resp = f
        .client
        .post(format!("{}/v1/completions", f.gw))
        .body("not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let prompt: Vec<u32> = (50_000..50_000 + 2 * LONG as u32).collect();
    let failing = json!({"model": "m", "prompt": prompt, "mock_prefill_status": 500});
    let (status, _, answer) = f.send("/v1/completions", &failing, None).await;
    assert_eq!(status, 502, "{answer}");
    sent.prompt_tokens[0] += 2 * LONG as u64;
    let leave = json!({"model": "m", "prompt": [7, 7, 7], "stream": true, "mock_pause_ms": 1_000});
    let mut resp = post_json(&f.client, format!("{}/v1/completions", f.gw), &leave).await;
    assert_eq!(resp.headers().get("x-prefill-worker"), None, "local");
    assert!(
        resp.chunk().await.unwrap().is_some(),
        "its first event came"
    );
    drop(resp);
    sent.prompt_tokens[1] += 3;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pd_metrics_count_plans_and_outcomes_and_agree_with_stats() {
    let f = Fleet::start(TWO_BY_ONE, None, SplitLong::default()).await;
    let mut sent = Sent::default();
    serve_seven(&f, &mut sent).await;
    fail_three(&f, &mut sent).await;
    let stats = f.idle_stats().await;
    let scrape = scrape(&f.client, &f.gw).await;
    let requests = |with: &[(&str, &str)]| total(&scrape, "gateway_requests_total", with);
    let of = |plan: &str, outcome: &str| requests(&[("plan", plan), ("outcome", outcome)]);
    let stat = |key: &str| stats["requests"][key].as_u64().unwrap() as f64;

    // Every request the client sent, once, by plan and outcome.
    assert_eq!(requests(&[]), 10.0, "{stats}");
    assert_eq!(of("split", "served"), sent.served[0] as f64);
    assert_eq!(of("local", "served"), sent.served[1] as f64);
    assert_eq!(of("split", "error"), 1.0, "the failed prefill leg");
    assert_eq!(of("local", "cancelled"), 1.0, "the stream the client left");
    assert_eq!(of("none", "invalid"), 1.0);
    // ... agreeing with /stats, which counts a plan once its decode leg answered.
    assert_eq!(
        of("split", "served"),
        stat("split") + stat("without_params")
    );
    assert_eq!(requests(&[("plan", "local")]), stat("local"));
    let all = |name: &str| total(&scrape, name, &[]);
    assert_eq!(
        all("gateway_prefill_failures_total"),
        stat("prefill_failed")
    );
    assert_eq!(all("gateway_prefill_failures_total"), 1.0);
    assert_eq!(
        all("gateway_prefill_without_params_total"),
        stat("without_params")
    );
    // ... and with the legs the mocks accepted (a failing prefill leg records none).
    let (prefills, decodes) = (f.legs(Role::Prefill).await, f.legs(Role::Decode).await);
    assert_eq!(prefills.len() as f64, of("split", "served"));
    assert_eq!(
        decodes.len() as f64,
        of("split", "served") + requests(&[("plan", "local")])
    );

    // Times: a latency for every request a plan took, a first token for every stream.
    let count = |name: &str, plan: &str| total(&scrape, name, &[("plan", plan)]);
    let latency = "gateway_request_duration_seconds_count";
    assert_eq!(count(latency, "split"), sent.served[0] as f64 + 1.0);
    assert_eq!(count(latency, "local"), sent.served[1] as f64 + 1.0);
    let ttft = "gateway_time_to_first_token_seconds_count";
    assert_eq!(count(ttft, "split"), sent.streamed[0] as f64);
    assert_eq!(count(ttft, "local"), sent.streamed[1] as f64 + 1.0);

    sides_agree_with_stats(&scrape, &stats);
    router_signals_count_both_legs(&scrape, &sent);
    for name in [
        "gateway_requests_total",
        "gateway_prefill_failures_total",
        "gateway_upstream_failures_total",
        "gateway_time_to_first_token_seconds",
        "gateway_request_duration_seconds",
        "gateway_worker_in_flight",
        "gateway_router_tokens_total",
    ] {
        assert!(scrape.docs.contains_key(name), "no HELP for {name}");
    }
}

/// Each side's targets: in flight, available and failures as `/stats` has them.
fn sides_agree_with_stats(scrape: &prometheus_parse::Scrape, stats: &Value) {
    for role in ["prefill", "decode"] {
        let targets = stats[role].as_array().unwrap();
        assert_eq!(targets.len(), 2, "{stats}");
        for t in targets {
            let worker = t["worker"].to_string();
            let of = |name: &str| total(scrape, name, &[("role", role), ("worker", &worker)]);
            let available = if t["available"] == true { 1.0 } else { 0.0 };
            assert_eq!(of("gateway_worker_available"), available, "{role} {t}");
            assert_eq!(of("gateway_worker_available"), 1.0, "{role} {t}");
            assert_eq!(
                of("gateway_worker_in_flight"),
                t["in_flight"].as_f64().unwrap()
            );
            assert_eq!(
                of("gateway_upstream_failures_total"),
                t["failures"].as_f64().unwrap()
            );
            let waits = scrape.samples.iter().filter(|s| {
                s.metric == "gateway_router_worker_wait_seconds"
                    && s.labels.get("role") == Some(role)
                    && s.labels.get("worker") == Some(worker.as_str())
            });
            assert_eq!(waits.count(), 1, "{role} {worker} has its wait");
        }
    }
}

/// The router's fleet signals: a split request's prompt is routed to both its workers, and
/// predicted cached on the decode worker; every prompt is predicted uncached where it is
/// prefilled (each is new).
fn router_signals_count_both_legs(scrape: &prometheus_parse::Scrape, sent: &Sent) {
    let tokens = |kind: &str| total(scrape, "gateway_router_tokens_total", &[("kind", kind)]);
    let [split, local] = sent.prompt_tokens.map(|t| t as f64);
    assert_eq!(tokens("prompt"), 2.0 * split + local);
    assert_eq!(tokens("uncached"), split + local);
    assert_eq!(tokens("captured"), split);
    let waits = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "gateway_router_worker_wait_seconds");
    assert_eq!(waits.count(), 4, "one per target of each side, none else");
}
