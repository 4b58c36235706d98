//! The real OpenAI Python client drives the gateway over loopback: chat and text prompts,
//! whole and streamed, against mock workers that tokenize with the same test tokenizer,
//! publish their KV events over ZMQ and serve Prometheus metrics. The client is installed
//! from the package registry into `target/openai-venv` by `tests/python/setup.sh` (which
//! `.ci/run` runs too); a failed install fails this test.

use std::process::Command;
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
