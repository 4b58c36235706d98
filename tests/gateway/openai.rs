//! The real OpenAI Python client drives the gateway over loopback: chat and text prompts,
//! whole and streamed, against mock workers that tokenize with the same test tokenizer,
//! publish their KV events over ZMQ and serve Prometheus metrics; refusals it gives up on,
//! and one it retries after `Retry-After` and gets served. The client is installed
//! from the package registry into `target/openai-venv` by `tests/python/setup.sh` (which
//! `.ci/run` runs too); a failed install fails this test.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;

use super::fleet::*;
use serde_json::Value;

/// The virtual environment's python, installing it first if needed.
fn python() -> String {
    let setup = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/setup.sh");
    let out = Command::new("bash").arg(setup).output().unwrap();
    assert!(
        out.status.success(),
        "tests/python/setup.sh failed (it installs the openai client from the package registry):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Runs `tests/python/<script>` with the real client against a balanced gateway over two
/// mock workers that publish KV events: the gateway's URL, its workers (kept running) and
/// the JSON line the script printed.
async fn run_client(script: &str) -> (String, Vec<Upstream>, Value) {
    let python = tokio::task::spawn_blocking(python).await.unwrap();
    let prompts = test_prompts();
    let ups: Vec<Upstream> = (0..2)
        .map(|_| Upstream::with_events(4_096, Some(Arc::clone(&prompts))))
        .collect();
    let gw = gateway_reading("balanced", &ups, &prompts).await;
    let script = format!("{}/tests/python/{script}", env!("CARGO_MANIFEST_DIR"));
    let base = format!("{gw}/v1");
    let out =
        tokio::task::spawn_blocking(move || Command::new(python).arg(script).arg(base).output())
            .await
            .unwrap()
            .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the client failed:\n{stderr}");
    (gw, ups, serde_json::from_slice(&out.stdout).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_client_chats_streams_and_completes_through_the_gateway() {
    let (gw, _ups, totals) = run_client("client.py").await;
    eprintln!("the client: {totals}");
    assert_eq!(totals["requests"], 22, "{totals}");
    assert_eq!(totals["streamed"], 11, "{totals}");
    // Turns 2 and 3 of each chat, and the repeated text prompt, find their prefixes cached.
    let ratio =
        totals["cached_tokens"].as_f64().unwrap() / totals["prompt_tokens"].as_f64().unwrap();
    assert!(ratio > 0.4, "hit ratio {ratio}: {totals}");

    let client = client();
    let stats = wait_for(&client, &gw, |w| w["in_flight"] == 0).await;
    let workers = stats["workers"].as_array().unwrap();
    let sum = |key: &str| -> u64 { workers.iter().map(|w| w[key].as_u64().unwrap()).sum() };
    // `first_token` fired once per streamed request, at its first content event.
    assert_eq!(sum("streamed_first_tokens"), 11, "{stats}");
    assert_eq!(
        sum("reported_cached_tokens"),
        totals["cached_tokens"].as_u64().unwrap(),
        "{stats}"
    );
    for w in workers {
        assert_eq!(w["in_flight"], 0, "{stats}");
        assert!(
            w["metrics_age_ms"].is_number(),
            "metrics were scraped: {stats}"
        );
        if w["routed"].as_u64().unwrap() > 0 {
            assert!(
                w["events"]["batches"].as_u64().unwrap() > 0,
                "events were applied: {stats}"
            );
            assert_eq!(w["events"]["rejected"], 0, "{stats}");
        }
    }
}

/// The real client meets a refusal: it retries the `429` as it retries any (its default
/// backoff: the refusal is bound by the prompt itself, so no `Retry-After`), then raises
/// `RateLimitError` with the gateway's error; the same request marked critical is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_client_retries_a_refusal_and_reports_it() {
    let (gw, _ups, seen) = run_client("shed.py").await;
    let refused = &seen["refused"];
    assert_eq!(refused["status"], 429, "{seen}");
    assert_eq!(refused["type"], "overloaded", "{seen}");
    assert_eq!(refused["code"], "shed_prompt", "{seen}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("request shed"),
        "{seen}"
    );
    assert_eq!(seen["critical"], "served", "{seen}");
    assert_eq!(seen["models"], serde_json::json!(["m"]), "{seen}");
    // The first attempt and the client's two retries were each refused, nothing else.
    let stats = wait_for(&client(), &gw, |w| w["in_flight"] == 0).await;
    assert_eq!(stats["shed"], serde_json::json!({"prompt": 3}), "{stats}");
}

/// Requests that occupy the worker in the retry test, each of this many tokens no other
/// shares, held by the mock this long: their prefill queued at the gateway is predicted to
/// take about a second, far past the client's 300 ms target, and they are done before the
/// shortest Retry-After (1 s) has passed.
const OCCUPYING: usize = 4;
const OCCUPYING_TOKENS: u32 = 8_192;
const OCCUPYING_MS: u64 = 600;

/// Sends occupying request `i` and checks it is served.
async fn occupy(client: reqwest::Client, gw: String, i: u32) {
    let start = i * 10_000;
    let tokens: Vec<u32> = (start..start + OCCUPYING_TOKENS).collect();
    let body = serde_json::json!({"model": "m", "prompt": tokens, "max_tokens": 1,
        "mock_pause_ms": OCCUPYING_MS});
    let (status, v, _) = post(&client, &gw, &body, None).await;
    assert_eq!(status, 200, "{v}");
}

/// The first line `stdout` gives, with the reader kept for the rest.
fn first_line(stdout: std::process::ChildStdout) -> (BufReader<std::process::ChildStdout>, String) {
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    (reader, line)
}

/// The real client's request meets a busy worker: refused with `429` and `Retry-After`, it
/// is retried by the client after that wait, when the worker's requests are done, and
/// served. The gateway counts one refusal and one completion for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_client_waits_retry_after_and_its_retry_is_served() {
    let python = tokio::task::spawn_blocking(python).await.unwrap();
    let prompts = test_prompts();
    let up = Upstream::with_prompts(65_536, &prompts);
    let gw = gateway_reading("balanced", std::slice::from_ref(&up), &prompts).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/retry.py");
    let mut child = Command::new(python)
        .arg(script)
        .arg(format!("{gw}/v1"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (mut reader, ready) = tokio::task::spawn_blocking(move || first_line(stdout))
        .await
        .unwrap();
    if ready.trim() != "ready" {
        let out = child.wait_with_output().unwrap();
        panic!("the client: {}", String::from_utf8_lossy(&out.stderr));
    }
    let client = client();
    let occupying: Vec<_> = (0..OCCUPYING as u32)
        .map(|i| tokio::spawn(occupy(client.clone(), gw.clone(), i)))
        .collect();
    wait_for(&client, &gw, |w| w["in_flight"] == OCCUPYING).await;
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    for task in occupying {
        task.await.unwrap();
    }
    let (rest, out) = tokio::task::spawn_blocking(move || {
        let mut rest = String::new();
        reader.read_to_string(&mut rest).unwrap();
        (rest, child.wait_with_output().unwrap())
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the client failed:\n{stderr}");
    let seen: Value = serde_json::from_str(rest.trim()).unwrap();
    eprintln!("the client: {seen}");
    check_retry(&seen);
    check_counted(&client, &gw).await;
}

/// The client saw a `429` with `Retry-After`, waited at least that long, and its one retry
/// was served.
fn check_retry(seen: &Value) {
    assert_eq!(seen["statuses"], serde_json::json!([429, 200]), "{seen}");
    assert_eq!(seen["retries_taken"], 1, "{seen}");
    let after: f64 = seen["retry_after"][0].as_str().unwrap().parse().unwrap();
    assert!(after >= 1.0, "{seen}");
    let waited = seen["waits_s"][0].as_f64().unwrap();
    assert!(waited >= after, "the client waited {waited} s: {seen}");
}

/// The gateway refused the client's request once and served it once, beside the occupying
/// requests it served.
async fn check_counted(client: &reqwest::Client, gw: &str) {
    let stats = wait_idle(client, gw).await;
    assert_eq!(stats["shed"], serde_json::json!({"queue": 1}), "{stats}");
    assert_eq!(stats["workers"][0]["routed"], OCCUPYING + 1, "{stats}");
    let scrape = scrape(client, gw).await;
    let requests =
        |outcome: &str| total(&scrape, "gateway_requests_total", &[("outcome", outcome)]);
    assert_eq!(requests("shed"), 1.0);
    assert_eq!(requests("served"), (OCCUPYING + 1) as f64);
    let with = [("priority", "standard"), ("limit", "queue")];
    assert_eq!(total(&scrape, "gateway_shed_total", &with), 1.0);
}
