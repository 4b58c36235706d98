//! The gateway's P/D mode against vLLM's own NIXL connector, scheduler side: two prefill and
//! two decode workers of `tests/conformance/nixl_worker.py`, each a Python process running
//! vLLM 0.33.0's `KVCacheManager` (prefix caching on) and `NixlPullConnectorScheduler` from
//! the wheel (`tests/conformance/setup.sh` fetches it), the P/D gateway in front. Every leg
//! the gateway sends goes through vLLM's scheduler hooks, and the workers list what vLLM
//! returned and planned for each (`GET /debug/legs`): the test checks that each decode
//! worker's vLLM planned the one receive the prefill worker's vLLM answered for that
//! request, on the workers the pair router chose, for the tokens it did not hold itself.
//!
//! No GPU: NIXL's agents, handshakes and the transfer itself are not run (the worker's docs
//! say how it stands in for them). A failed setup fails the test; it never passes by
//! skipping.

use super::fleet::*;
use super::pd::{events, gateway, header};

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use prefix_router::{Decide, PairView, Plan, RouteRequest};
use serde_json::{Value, json};

use prompt::Endpoint;

/// The session that asks the decider not to split a request.
const AGGREGATED: &str = "aggregated";

/// Pairs in turn (the n-th request: the n-th prefill and the n-th decode worker, each list
/// in turn), except that a request of the session [`AGGREGATED`] goes whole to the next
/// decode worker in turn.
#[derive(Default)]
struct TurnsOrAggregated(AtomicUsize);

impl Decide for TurnsOrAggregated {
    fn name(&self) -> &'static str {
        "turns_or_aggregated"
    }

    fn decide(&self, request: &RouteRequest<'_>, view: &PairView<'_>) -> Plan {
        let n = self.0.fetch_add(1, Relaxed);
        let decoders: Vec<usize> = view.decoders().collect();
        let prefillers: Vec<usize> = view.prefillers().collect();
        let decode = decoders[n % decoders.len()];
        if request.session() == Some(AGGREGATED) {
            return Plan::Aggregated { decode };
        }
        Plan::Split {
            prefill: prefillers[n % prefillers.len()],
            decode,
        }
    }
}

/// The Python workers, killed when dropped (also when the test panics). Each also exits
/// when its stdin closes, should the test process die without dropping this.
struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One worker: its base URL, vLLM engine id and NIXL side-channel port.
struct Worker {
    url: String,
    engine_id: String,
    side_port: u64,
}

/// A leg as a worker listed it, with the index of that worker on its side.
type Legs = HashMap<String, (usize, Value)>;

/// Runs `tests/conformance/setup.sh`: the harness's python and vLLM's sources.
fn setup() -> (PathBuf, PathBuf) {
    let out = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/conformance/setup.sh"
        ))
        .output()
        .expect("bash runs tests/conformance/setup.sh");
    assert!(
        out.status.success(),
        "tests/conformance/setup.sh failed (it downloads the vLLM wheel and installs the \
         harness's Python dependencies from the package registry):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "setup.sh prints python and site: {stdout}");
    (PathBuf::from(lines[0]), PathBuf::from(lines[1]))
}

/// Starts `n` prefill then `n` decode workers and waits until each serves.
fn start_workers(n: usize) -> (Processes, Vec<Worker>, Vec<Worker>) {
    let (python, site) = setup();
    let root = env!("CARGO_MANIFEST_DIR");
    let roles = ["prefill", "decode"].map(|r| std::iter::repeat_n(r, n));
    let mut processes = Processes(Vec::new());
    let mut workers = Vec::new();
    for (i, role) in roles.into_iter().flatten().enumerate() {
        let engine_id = format!("vllm-{role}-{i}");
        // Distinct side channels, as workers on one host need.
        let side_port = 5600 + i as u64;
        let child = Command::new(&python)
            .arg(format!("{root}/tests/conformance/nixl_worker.py"))
            .arg("--site")
            .arg(&site)
            .args(["--role", role, "--engine-id", &engine_id])
            .args(["--side-channel-port", &side_port.to_string()])
            .args([
                "--tokenizer",
                &format!("{root}/tests/data/tokenizer/bytelevel"),
            ])
            .arg("--exit-with-stdin")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the harness's python starts");
        processes.0.push(child);
        workers.push((engine_id, side_port));
    }
    let mut started = Vec::new();
    for (child, (engine_id, side_port)) in processes.0.iter_mut().zip(workers) {
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let Some(url) = line.trim().strip_prefix("listening ") else {
            panic!("{engine_id} did not start: {line:?}");
        };
        started.push(Worker {
            url: url.to_owned(),
            engine_id,
            side_port,
        });
    }
    let decode = started.split_off(n);
    (processes, started, decode)
}

/// A request the test sent through the gateway, and how it was answered.
struct Sent {
    id: String,
    endpoint: Endpoint,
    body: Value,
    /// The prompt as the gateway reads it.
    tokens: Vec<u32>,
    status: u16,
    headers: reqwest::header::HeaderMap,
    answer: String,
}

impl Sent {
    fn worker(&self, name: &str) -> Option<usize> {
        header(&self.headers, name).map(|v| v.parse().unwrap())
    }
}

/// The workers and the gateway in front of them.
struct VllmFleet {
    _processes: Processes,
    prefill: Vec<Worker>,
    decode: Vec<Worker>,
    gw: String,
    client: reqwest::Client,
    prompts: Arc<prompt::Prompts>,
}

impl VllmFleet {
    async fn start() -> Self {
        let (processes, prefill, decode) = tokio::task::block_in_place(|| start_workers(2));
        let prompts = test_prompts();
        let urls = |ws: &[Worker]| ws.iter().map(|w| w.url.clone()).collect();
        let decider = TurnsOrAggregated::default();
        let gw = gateway(
            urls(&prefill),
            urls(&decode),
            (1, 1),
            Some(Arc::clone(&prompts)),
            decider,
        );
        Self {
            gw: gw.await,
            _processes: processes,
            prefill,
            decode,
            client: client(),
            prompts,
        }
    }

    /// Sends `body` (with model `m`) to the gateway's `endpoint` as request `id`, in
    /// `session` when given.
    async fn send(
        &self,
        id: &str,
        endpoint: Endpoint,
        mut body: Value,
        session: Option<&str>,
    ) -> Sent {
        body["model"] = json!("m");
        let mut request = self
            .client
            .post(format!("{}{}", self.gw, endpoint.path()))
            .header("content-type", "application/json")
            .header("x-request-id", id)
            .body(body.to_string());
        if let Some(session) = session {
            request = request.header("x-session-id", session);
        }
        let response = request.send().await.unwrap();
        let (status, headers) = (response.status().as_u16(), response.headers().clone());
        let object = body.as_object().unwrap();
        Sent {
            id: id.to_owned(),
            endpoint,
            tokens: prompt::request_tokens(Some(&self.prompts), endpoint, object).unwrap(),
            body,
            status,
            headers,
            answer: response.text().await.unwrap(),
        }
    }

    /// Every leg the workers of a side took, by X-Request-Id.
    async fn legs(&self, side: &[Worker]) -> Legs {
        let mut legs = HashMap::new();
        for (i, w) in side.iter().enumerate() {
            let list = get(&self.client, format!("{}/debug/legs", w.url)).await;
            for leg in list.as_array().unwrap() {
                let id = leg["x_request_id"].as_str().unwrap().to_owned();
                assert!(
                    legs.insert(id, (i, leg.clone())).is_none(),
                    "one leg a side"
                );
            }
        }
        legs
    }

    /// Checks a split request end to end; returns the decode worker's local hit.
    fn check_split(&self, s: &Sent, prefills: &Legs, decodes: &Legs) -> u64 {
        let id = &s.id;
        assert_eq!(s.status, 200, "{id}: {}", s.answer);
        let ((pi, p), (di, d)) = (&prefills[id], &decodes[id]);
        // The legs went to the pair the router chose.
        assert_eq!(s.worker("x-prefill-worker"), Some(*pi), "{id}");
        assert_eq!(s.worker("x-routed-worker"), Some(*di), "{id}");
        let (pw, dw) = (&self.prefill[*pi], &self.decode[*di]);
        assert_eq!(
            (&p["engine_id"], &d["engine_id"]),
            (&json!(pw.engine_id), &json!(dw.engine_id))
        );
        // Both workers' vLLM got the gateway's prompt, token for token.
        assert_eq!(
            p["prompt_token_ids"],
            json!(s.tokens),
            "{id}: prefill tokens"
        );
        assert_eq!(
            d["prompt_token_ids"],
            json!(s.tokens),
            "{id}: decode tokens"
        );
        let answered = check_prefill(s, p, pw);
        let local = check_decode(s, d, answered);
        // The router's prediction for the prefill worker is vLLM's own prefix hit there.
        let predicted = header(&s.headers, "x-predicted-cached-tokens").unwrap();
        assert_eq!(
            json!(predicted.parse::<u64>().unwrap()),
            p["matched"][0]["local_hit_tokens"],
            "{id}"
        );
        // The client's answer is the decode worker's; it reports the prefill worker's hit.
        let usage = if s.body["stream"] == true {
            let (events, done) = events(&s.answer);
            assert!(done && events.len() >= 2, "{id}: {}", s.answer);
            events.last().unwrap()["usage"].clone()
        } else {
            serde_json::from_str::<Value>(&s.answer).unwrap()["usage"].clone()
        };
        if s.body["stream"] != true || s.body["stream_options"]["include_usage"] == true {
            assert_eq!(usage["prompt_tokens"], s.tokens.len(), "{id}");
            let cached = &usage["prompt_tokens_details"]["cached_tokens"];
            assert_eq!(
                *cached, p["matched"][0]["local_hit_tokens"],
                "{id}: the prefill's hit"
            );
        }
        local
    }
}

/// The prefill leg's skeleton of `kv_transfer_params`, as vLLM's toy proxy sends it.
fn prefill_skeleton() -> Value {
    json!({"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
        "remote_block_ids": null, "remote_host": null, "remote_port": null})
}

/// The prefill leg `p` of `s` on worker `w`: vLLM computed the prompt itself and finished
/// it holding its blocks for the reader; the answer carried the parameters vLLM returned.
/// Returns them.
fn check_prefill<'a>(s: &Sent, p: &'a Value, w: &Worker) -> &'a Value {
    let (id, n) = (&s.id, s.tokens.len() as u64);
    assert_eq!(p["status"], 200, "{id}: {p}");
    assert_eq!(p["kv_transfer_params"], prefill_skeleton(), "{id}");
    assert_eq!(p["stream"], false, "{id}: the prefill leg is whole");
    let matched = &p["matched"][0];
    assert_eq!(
        (&matched["external_tokens"], &matched["load_async"]),
        (&json!(0), &json!(false))
    );
    assert_eq!(p["finished"]["status"], "FINISHED_LENGTH_CAPPED", "{id}");
    assert_eq!(
        p["finished"]["delay_free"], true,
        "{id}: blocks held for the reader"
    );
    assert_eq!(
        p["lease_listed"], true,
        "{id}: in the next step's reqs_to_send"
    );
    let answered = &p["kv_transfer_params_answered"];
    let mut returned = p["params_returned"].clone();
    returned["remote_prefill_cached_tokens"] = matched["local_hit_tokens"].clone();
    assert_eq!(
        *answered, returned,
        "{id}: the answer carries what vLLM returned"
    );
    assert_eq!(answered["do_remote_prefill"], true, "{id}");
    assert_eq!(answered["remote_engine_id"], w.engine_id.as_str(), "{id}");
    assert_eq!(answered["remote_request_id"], p["request_id"], "{id}");
    assert_eq!(answered["remote_host"], "localhost", "{id}: vLLM's default");
    assert_eq!(answered["remote_port"], w.side_port, "{id}");
    assert_eq!(answered["remote_num_tokens"], n, "{id}");
    let blocks = &answered["remote_block_ids"];
    assert_eq!(*blocks, p["finished"]["block_ids"], "{id}");
    let count = blocks[0].as_array().map(Vec::len);
    assert_eq!(
        count,
        Some(n.div_ceil(16) as usize),
        "{id}: a block per 16 tokens begun"
    );
    let prefix = match s.endpoint {
        Endpoint::Completions => format!("cmpl-{id}-0-"),
        Endpoint::Chat => format!("chatcmpl-{id}-"),
    };
    let request_id = p["request_id"].as_str().unwrap();
    assert!(
        request_id.starts_with(&prefix),
        "{id}: vLLM's request id {request_id}"
    );
    answered
}

/// The decode leg `d` of `s`: it carried the prefill's `answered` parameters unchanged, and
/// vLLM planned exactly one receive, from that prefill worker, of the tokens it did not
/// hold. Returns its local hit.
fn check_decode(s: &Sent, d: &Value, answered: &Value) -> u64 {
    let (id, n) = (&s.id, s.tokens.len() as u64);
    assert_eq!(d["status"], 200, "{id}: {d}");
    assert_eq!(
        d["kv_transfer_params"], *answered,
        "{id}: passed on unchanged"
    );
    assert_eq!(
        d["stream"], s.body["stream"],
        "{id}: the decode leg streams as asked"
    );
    let matched = d["matched"].as_array().unwrap();
    assert_eq!(matched.len(), 1, "{id}: {d}");
    let local = matched[0]["local_hit_tokens"].as_u64().unwrap();
    assert_eq!(
        matched[0]["external_tokens"],
        n - local,
        "{id}: the prompt less the local hit"
    );
    assert_eq!(matched[0]["load_async"], true, "{id}");
    let recv = d["recv"].as_array().unwrap();
    assert_eq!(recv.len(), 1, "{id}: one receive planned: {d}");
    let (r, remote) = (&recv[0], &recv[0]["remote"]);
    assert_eq!(r["awaiting_kvs"], true, "{id}");
    for (planned, key) in [
        ("engine_id", "remote_engine_id"),
        ("block_ids", "remote_block_ids"),
        ("host", "remote_host"),
        ("port", "remote_port"),
        ("request_id", "remote_request_id"),
        ("num_tokens", "remote_num_tokens"),
    ] {
        assert_eq!(remote[planned], answered[key], "{id}: {planned}");
    }
    assert_eq!(r["tp_size"], answered["tp_size"], "{id}");
    let blocks = r["local_block_ids"][0].as_array().map(Vec::len);
    let expected = n.div_ceil(16) - local / 16;
    assert_eq!(
        blocks,
        Some(expected as usize),
        "{id}: the blocks past the local hit receive"
    );
    assert_eq!(r["local_num_computed_blocks"], json!([local / 16]), "{id}");
    let lease = json!([answered["remote_engine_id"], answered["remote_request_id"]]);
    assert_eq!(
        d["heartbeat"], lease,
        "{id}: the lease is renewed with the prefill worker"
    );
    assert_eq!(d["finished"]["status"], "FINISHED_STOPPED", "{id}");
    assert_eq!(
        d["params_returned"],
        Value::Null,
        "{id}: nothing for a decode worker"
    );
    local
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_requests_follow_vllms_nixl_scheduler_on_both_sides() {
    let started = std::time::Instant::now();
    let f = VllmFleet::start().await;

    // Pairs in turn: requests 0, 2, 4 go to prefill 0 and decode 0, requests 1, 3, 5 to
    // prefill 1 and decode 1, so requests 2 and 5 find their prefixes cached on both sides.
    let a: Vec<u32> = (1000..1200).collect();
    let a_longer: Vec<u32> = (1000..1300).collect();
    let chat = json!([{"role": "system", "content": "You answer about KV caches, briefly."},
        {"role": "user", "content": "Where does the decode worker read the prompt's KV from?"}]);
    let mut chat_longer = chat.clone();
    let more = chat_longer.as_array_mut().unwrap();
    more.push(json!({"role": "assistant", "content": "From the prefill worker, over NIXL."}));
    more.push(json!({"role": "user", "content": "And which blocks does it read?"}));
    let (completions, chats) = (Endpoint::Completions, Endpoint::Chat);
    let requests = [
        (
            completions,
            json!({"prompt": a, "max_tokens": 40, "stream": false}),
        ),
        (
            completions,
            json!({"prompt": (3000..3100).collect::<Vec<u32>>(), "stream": true}),
        ),
        (
            completions,
            json!({"prompt": a_longer, "max_tokens": 40, "stream": true}),
        ),
        (
            chats,
            json!({"messages": chat, "max_tokens": 40, "min_tokens": 2, "stream": false}),
        ),
        (
            completions,
            json!({"prompt": "Prefill here, decode there.", "stream": false}),
        ),
        (
            chats,
            json!({"messages": chat_longer, "max_completion_tokens": 40, "stream": true,
            "stream_options": {"include_usage": true}}),
        ),
    ];
    let mut sent = Vec::new();
    for (i, (endpoint, body)) in requests.into_iter().enumerate() {
        sent.push(f.send(&format!("split-{i}"), endpoint, body, None).await);
    }
    // Not split: the decode worker's vLLM prefills it.
    let body = json!({"prompt": (5000..5090).collect::<Vec<u32>>()});
    let local = f
        .send("aggregated-0", completions, body, Some(AGGREGATED))
        .await;
    // A prefill answer without `remote_engine_id` (the worker drops it when asked): the
    // decode worker's vLLM announces a remote load but plans no receive for it.
    let body = json!({"prompt": (7000..7100).collect::<Vec<u32>>(),
        "nixl_worker_drop_params": ["remote_engine_id"]});
    let broken = f.send("broken-0", completions, body, None).await;

    let (prefills, decodes) = (f.legs(&f.prefill).await, f.legs(&f.decode).await);
    let hits: Vec<u64> = sent
        .iter()
        .map(|s| f.check_split(s, &prefills, &decodes))
        .collect();
    let sides = |legs: &Legs| -> Vec<usize> { sent.iter().map(|s| legs[&s.id].0).collect() };
    assert_eq!(sides(&prefills), [0, 1, 0, 1, 0, 1]);
    assert_eq!(sides(&decodes), [0, 1, 0, 1, 0, 1]);
    // Request 2 finds the 12 full blocks of request 0's prompt (200 tokens) on both workers,
    // request 5 the full blocks of request 3's chat.
    let chat_blocks = (sent[3].tokens.len() / 16 * 16) as u64;
    assert_eq!(
        hits,
        [0, 0, 192, 0, 0, chat_blocks],
        "the decode workers' local hits"
    );
    assert_eq!(prefills["split-2"].1["matched"][0]["local_hit_tokens"], 192);
    assert_eq!(
        prefills["split-5"].1["matched"][0]["local_hit_tokens"],
        chat_blocks
    );

    // Aggregated: no prefill leg; vLLM took it as a local prefill, with nothing to receive.
    assert_eq!(local.status, 200, "{}", local.answer);
    assert!(!prefills.contains_key("aggregated-0"), "no prefill leg");
    assert_eq!(local.worker("x-prefill-worker"), None);
    let (di, d) = &decodes["aggregated-0"];
    assert_eq!(local.worker("x-routed-worker"), Some(*di));
    assert_eq!(d["kv_transfer_params"], Value::Null, "{d}");
    assert_eq!(
        d["matched"],
        json!([{"local_hit_tokens": 0, "external_tokens": 0,
        "load_async": false}]),
        "{d}"
    );
    assert!(d.get("recv").is_none(), "no receive: {d}");
    assert_eq!(
        (&d["status"], &d["finished"]["status"]),
        (&json!(200), &json!("FINISHED_STOPPED"))
    );

    // The broken one: vLLM's scheduler refused it on the decode side, the worker answered
    // 500 saying why, and the gateway passed that on.
    assert_eq!(broken.status, 500, "{}", broken.answer);
    assert!(
        broken.answer.contains("Got invalid KVTransferParams"),
        "{}",
        broken.answer
    );
    let answered = &prefills["broken-0"].1["kv_transfer_params_answered"];
    assert!(answered.get("remote_engine_id").is_none(), "{answered}");
    let d = &decodes["broken-0"].1;
    assert_eq!(d["status"], 500, "{d}");
    assert_eq!(
        d["matched"][0]["load_async"], true,
        "vLLM announced a load: {d}"
    );
    assert!(d.get("recv").is_none(), "and planned no receive: {d}");
    assert!(
        d["error"]
            .as_str()
            .unwrap()
            .contains("will not utilize KVTransfer"),
        "{d}"
    );

    // Sent straight to a decode worker, empty remote_block_ids trip an assertion in vLLM's
    // update_state_after_alloc: a 500 too, after which the worker serves the next request.
    let mut params = answered.clone();
    params["remote_engine_id"] = json!(f.prefill[0].engine_id);
    params["remote_block_ids"] = json!([]);
    let body = json!({"model": "m", "prompt": (9000..9040).collect::<Vec<u32>>(),
        "kv_transfer_params": params});
    let url = format!("{}/v1/completions", f.decode[1].url);
    let (status, answer, _) = post_to(&f.client, url, &body).await;
    assert_eq!(status, 500, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("AssertionError"), "{message}");
    let body = json!({"prompt": (9000..9040).collect::<Vec<u32>>(), "stream": true});
    let after = f.send("split-after", completions, body, None).await;
    let (prefills, decodes) = (f.legs(&f.prefill).await, f.legs(&f.decode).await);
    f.check_split(&after, &prefills, &decodes);

    let stats = get(&f.client, format!("{}/stats", f.gw)).await;
    assert_eq!(stats["requests"]["split"], 8, "{stats}");
    assert_eq!(stats["requests"]["local"], 1, "{stats}");
    eprintln!("pd_vllm: {:.1} s", started.elapsed().as_secs_f64());
}
