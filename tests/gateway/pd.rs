//! The gateway's P/D mode over loopback HTTP: mock prefill and decode workers that check
//! vLLM's disaggregated protocol (`examples/gateway/pd_mock.rs`), the P/D gateway in front,
//! requests whole and streamed on both endpoints.

use super::fleet::*;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use prefix_router::{AlwaysSplit, Decide, NeverSplit, PairView, RankLayout, RouteRequest};
use serde_json::{Value, json};

use pd_plan::{PdPlanner, Role};

/// A decider taking pairs in turn: the n-th request is split with the n-th prefill worker
/// and the n-th decode worker among those available, each list in turn.
#[derive(Default)]
struct Turns(AtomicUsize);

impl Decide for Turns {
    fn name(&self) -> &'static str {
        "turns"
    }

    fn decide(&self, _: &RouteRequest<'_>, view: &PairView<'_>) -> prefix_router::Plan {
        let n = self.0.fetch_add(1, Relaxed);
        let decoders: Vec<usize> = view.decoders().collect();
        let prefillers: Vec<usize> = view.prefillers().collect();
        prefix_router::Plan::Split {
            prefill: prefillers[n % prefillers.len()],
            decode: decoders[n % decoders.len()],
        }
    }
}

/// A P/D fleet: prefill and decode mocks (each of its side's ranks) and a gateway.
pub(super) struct Fleet {
    pub(super) prefill: Vec<Upstream>,
    pub(super) decode: Vec<Upstream>,
    pub(super) gw: String,
    pub(super) client: reqwest::Client,
}

/// The sides' shapes: endpoints and data-parallel ranks of each.
#[derive(Clone, Copy)]
pub(super) struct Shape {
    pub(super) prefill: (u32, u32),
    pub(super) decode: (u32, u32),
}

pub(super) const TWO_BY_ONE: Shape = Shape {
    prefill: (2, 1),
    decode: (2, 1),
};

impl Fleet {
    /// Mocks of `shape` reading prompts with `prompts`, and a gateway planning with the
    /// crate's pair router deciding with `decider`.
    pub(super) async fn start(
        shape: Shape,
        prompts: Option<Arc<prompt::Prompts>>,
        decider: impl Decide + 'static,
    ) -> Self {
        let mocks = |role, (n, ranks)| -> Vec<Upstream> {
            (0..n)
                .map(|_| Upstream::pd(role, ranks, prompts.clone()))
                .collect()
        };
        let (prefill, decode) = (
            mocks(Role::Prefill, shape.prefill),
            mocks(Role::Decode, shape.decode),
        );
        let urls = |ups: &[Upstream]| ups.iter().map(|u| u.url.clone()).collect();
        let ranks = (shape.prefill.1, shape.decode.1);
        let url = gateway(urls(&prefill), urls(&decode), ranks, prompts, decider).await;
        Self {
            prefill,
            decode,
            gw: url,
            client: client(),
        }
    }

    /// Posts `body` to the gateway's `path` (with `X-Request-Id: id` when given): the
    /// status, the headers and the body's text.
    pub(super) async fn send(
        &self,
        path: &str,
        body: &Value,
        id: Option<&str>,
    ) -> (u16, reqwest::header::HeaderMap, String) {
        let mut request = self
            .client
            .post(format!("{}{path}", self.gw))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(id) = id {
            request = request.header("x-request-id", id);
        }
        let response = request.send().await.unwrap();
        let (status, headers) = (response.status().as_u16(), response.headers().clone());
        (status, headers, response.text().await.unwrap())
    }

    /// Every leg the mocks of `role` accepted, by request id (each id once per side).
    pub(super) async fn legs(&self, role: Role) -> HashMap<String, Value> {
        let ups = match role {
            Role::Prefill => &self.prefill,
            Role::Decode => &self.decode,
        };
        let mut legs = HashMap::new();
        for up in ups {
            let list = get(&self.client, format!("{}/mock/legs", up.url)).await;
            for leg in list.as_array().unwrap() {
                let id = leg["request_id"].as_str().unwrap().to_owned();
                let mut leg = leg.clone();
                leg["upstream"] = json!(up.url);
                assert!(
                    legs.insert(id, leg).is_none(),
                    "one {role:?} leg per request"
                );
            }
        }
        legs
    }

    /// The gateway's `/stats` once nothing is in flight on either side (within 5 s).
    pub(super) async fn idle_stats(&self) -> Value {
        for _ in 0..100 {
            let stats = get(&self.client, format!("{}/stats", self.gw)).await;
            let busy = ["prefill", "decode"].iter().any(|side| {
                stats[side]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|t| t["in_flight"] != 0)
            });
            if !busy {
                return stats;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("requests were left in flight on the P/D gateway");
    }
}

/// A P/D gateway over the `prefill` and `decode` endpoints (base URLs, `ranks` data-parallel
/// ranks on each side) reading prompts with `prompts`, planning with the crate's pair router
/// deciding with `decider`, probing the endpoints every 100 ms: its URL.
pub(super) async fn gateway(
    prefill: Vec<String>,
    decode: Vec<String>,
    ranks: (u32, u32),
    prompts: Option<Arc<prompt::Prompts>>,
    decider: impl Decide + 'static,
) -> String {
    let side = |urls, ranks| pd::Side::new(urls, RankLayout::new(ranks).unwrap());
    let (p, d) = (side(prefill, ranks.0), side(decode, ranks.1));
    let planner = PdPlanner::new(p.targets(), d.targets(), 16, Box::new(decider)).unwrap();
    let options = app::Options {
        prompts,
        request_timeout: Duration::from_secs(10),
        ..app::Options::default()
    };
    let gw = pd::PdGateway::new(Arc::new(planner), p, d, options);
    tokio::spawn(pd::probe_forever(
        Arc::clone(&gw),
        Duration::from_millis(100),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(app::no_delay(listener), pd::app(gw)).await });
    url
}

pub(super) fn header(headers: &reqwest::header::HeaderMap, name: &str) -> Option<String> {
    headers.get(name).map(|v| v.to_str().unwrap().to_owned())
}

/// The JSON events of a server-sent stream, and whether it ended with `[DONE]`.
pub(super) fn events(text: &str) -> (Vec<Value>, bool) {
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    let done = data.last() == Some(&"[DONE]");
    let events = data
        .iter()
        .filter(|d| **d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    (events, done)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_requests_are_served_whole_and_streamed_on_both_endpoints() {
    let prompts = test_prompts();
    let f = Fleet::start(TWO_BY_ONE, Some(Arc::clone(&prompts)), AlwaysSplit).await;
    let chat = |stream: bool| {
        json!({"model": "m", "stream": stream, "max_tokens": 40, "min_tokens": 2,
            "messages": [{"role": "user", "content": "Where is my KV cache?"}]})
    };
    let text = |stream: bool| {
        json!({"model": "m", "stream": stream, "max_completion_tokens": 40,
            "prompt": "Prefill here, decode there."})
    };
    let mut sent = Vec::new();
    for stream in [false, true] {
        for (path, body) in [
            ("/v1/chat/completions", chat(stream)),
            ("/v1/completions", text(stream)),
        ] {
            let (status, headers, answer) = f.send(path, &body, None).await;
            assert_eq!(status, 200, "{path} stream {stream}: {answer}");
            if stream {
                let (events, done) = events(&answer);
                assert!(done && events.len() == 2, "{answer}");
                assert!(
                    events.iter().all(|e| e.get("usage").is_none()),
                    "the decode leg got the client's stream options, none added: {answer}"
                );
            } else {
                let v: Value = serde_json::from_str(&answer).unwrap();
                assert_eq!(v["usage"]["completion_tokens"], 2, "{v}");
            }
            let id = header(&headers, "x-request-id").unwrap();
            assert_eq!(id.len(), 36, "a fresh id: {id}");
            sent.push((id, path, stream, headers));
        }
    }
    let (prefills, decodes) = (f.legs(Role::Prefill).await, f.legs(Role::Decode).await);
    assert_eq!((prefills.len(), decodes.len()), (4, 4));
    for (id, path, stream, headers) in &sent {
        let (p, d) = (&prefills[id], &decodes[id]);
        assert_eq!((&p["path"], &d["path"]), (&json!(path), &json!(path)));
        assert_eq!(p["stream"], false, "the prefill leg is whole");
        assert_eq!(
            d["stream"], *stream,
            "the decode leg streams as the client asked"
        );
        assert_eq!(d["prefill"], "remote");
        assert_eq!(d["prompt_tokens"], p["prompt_tokens"]);
        let engine = format!("mock-prefill@{}", p["upstream"].as_str().unwrap());
        assert_eq!(
            d["remote_engine_id"], engine,
            "read from the prefill worker that ran"
        );
        let worker = |name| header(headers, name).unwrap().parse::<usize>().unwrap();
        assert_eq!(
            p["upstream"].as_str(),
            Some(f.prefill[worker("x-prefill-worker")].url.as_str())
        );
        assert_eq!(
            d["upstream"].as_str(),
            Some(f.decode[worker("x-routed-worker")].url.as_str())
        );
    }
    let stats = f.idle_stats().await;
    assert_eq!(stats["requests"]["split"], 4, "{stats}");
    assert_eq!(stats["requests"]["local"], 0, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_request_id_names_both_legs() {
    let f = Fleet::start(TWO_BY_ONE, None, AlwaysSplit).await;
    for (i, stream) in [false, true].into_iter().enumerate() {
        let id = format!("client-request-{i}");
        let body = json!({"model": "m", "prompt": [5, 6, 7, 8], "stream": stream});
        let (status, headers, answer) = f.send("/v1/completions", &body, Some(&id)).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(header(&headers, "x-request-id"), Some(id));
    }
    let (prefills, decodes) = (f.legs(Role::Prefill).await, f.legs(Role::Decode).await);
    for id in ["client-request-0", "client-request-1"] {
        assert!(
            prefills.contains_key(id) && decodes.contains_key(id),
            "{id}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_parallel_ranks_are_pinned_on_each_side() {
    // One prefill endpoint of 2 ranks, one decode endpoint of 3: pairs in turn, so every
    // rank of each side is used.
    let shape = Shape {
        prefill: (1, 2),
        decode: (1, 3),
    };
    let f = Fleet::start(shape, None, Turns::default()).await;
    let mut ranks = Vec::new();
    for i in 0..12u32 {
        let body = json!({"model": "m", "prompt": (0..40).map(|t| i * 100 + t).collect::<Vec<_>>(),
            "stream": i % 2 == 1});
        let (status, headers, answer) = f.send("/v1/completions", &body, None).await;
        assert_eq!(status, 200, "{answer}");
        let rank = |name| header(&headers, name).unwrap().parse::<u64>().unwrap();
        let id = header(&headers, "x-request-id").unwrap();
        ranks.push((id, rank("x-prefill-rank"), rank("x-routed-rank")));
    }
    let (prefills, decodes) = (f.legs(Role::Prefill).await, f.legs(Role::Decode).await);
    for (id, prefill_rank, decode_rank) in &ranks {
        assert_eq!(prefills[id]["rank"], *prefill_rank, "{id}");
        assert_eq!(decodes[id]["rank"], *decode_rank, "{id}");
        let port = pd_mock::SIDE_CHANNEL_PORT + prefill_rank;
        assert_eq!(decodes[id]["remote_port"], port, "the prefill rank's port");
    }
    let seen = |side: usize| {
        let mut r: Vec<u64> = ranks
            .iter()
            .map(|x| if side == 0 { x.1 } else { x.2 })
            .collect();
        r.sort_unstable();
        r.dedup();
        r
    };
    assert_eq!((seen(0), seen(1)), (vec![0, 1], vec![0, 1, 2]));
    f.idle_stats().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_without_prefill_goes_to_the_decode_worker_alone() {
    let f = Fleet::start(TWO_BY_ONE, None, NeverSplit).await;
    for stream in [false, true] {
        let body = json!({"model": "m", "prompt": [1, 2, 3], "stream": stream});
        let (status, headers, answer) = f.send("/v1/completions", &body, None).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(header(&headers, "x-prefill-worker"), None);
    }
    assert!(f.legs(Role::Prefill).await.is_empty(), "no prefill leg");
    let decodes = f.legs(Role::Decode).await;
    assert_eq!(decodes.len(), 2);
    assert!(
        decodes.values().all(|d| d["prefill"] == "local"),
        "{decodes:?}"
    );
    let stats = f.idle_stats().await;
    assert_eq!(
        (&stats["requests"]["local"], &stats["requests"]["split"]),
        (&json!(2), &json!(0))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_prefill_worker_up_the_decode_worker_prefills() {
    let shape = Shape {
        prefill: (1, 1),
        decode: (1, 1),
    };
    let mut f = Fleet::start(shape, None, AlwaysSplit).await;
    f.prefill[0].kill();
    for stream in [false, true] {
        let body = json!({"model": "m", "prompt": [9, 8, 7], "stream": stream});
        let (status, headers, answer) = f.send("/v1/completions", &body, None).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(header(&headers, "x-prefill-worker"), None);
    }
    let decodes = f.legs(Role::Decode).await;
    assert!(
        decodes.values().all(|d| d["prefill"] == "local"),
        "{decodes:?}"
    );
    let stats = f.idle_stats().await;
    assert_eq!(stats["requests"]["local"], 2, "{stats}");
    assert_eq!(stats["prefill"][0]["available"], false, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_prefill_worker_is_a_502_and_leaves_nothing_charged() {
    let f = Fleet::start(TWO_BY_ONE, None, AlwaysSplit).await;
    for stream in [false, true] {
        let body = json!({"model": "m", "prompt": [4, 4, 4], "stream": stream,
            "mock_prefill_status": 500});
        let (status, _, answer) = f.send("/v1/completions", &body, None).await;
        assert_eq!(status, 502, "{answer}");
        let v: Value = serde_json::from_str(&answer).unwrap();
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("prefill worker") && message.contains("500"),
            "{message}"
        );
    }
    assert!(
        f.legs(Role::Decode).await.is_empty(),
        "no decode leg after a failed prefill"
    );
    let stats = f.idle_stats().await;
    assert_eq!(stats["requests"]["prefill_failed"], 2, "{stats}");
    for side in ["prefill", "decode"] {
        for t in stats[side].as_array().unwrap() {
            assert_eq!(
                (&t["in_flight"], &t["available"]),
                (&json!(0), &json!(true)),
                "{t}"
            );
        }
    }
    // The failure was the request's: the same fleet serves the next one.
    let body = json!({"model": "m", "prompt": [4, 4, 4]});
    assert_eq!(f.send("/v1/completions", &body, None).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mocks_refuse_what_breaks_the_protocol() {
    let client = client();
    let prefill = Upstream::pd(Role::Prefill, 2, None);
    let decode = Upstream::pd(Role::Decode, 2, None);
    let post = |url: String, body: Value, id: &str| {
        let request = client
            .post(format!("{url}/v1/completions"))
            .header("x-request-id", id)
            .header("x-data-parallel-rank", "1")
            .body(body.to_string());
        async move {
            let response = request.send().await.unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        }
    };
    let client_body = json!({"model": "m", "prompt": [1, 2, 3], "max_tokens": 9});
    let leg = pd_wire::prefill_body(client_body.as_object().unwrap());
    let broken = |key: &str, value: Value| {
        let mut b = leg.clone();
        b[key] = value;
        b
    };
    for (body, why) in [
        (client_body.clone(), "kv_transfer_params"),
        (broken("stream", json!(true)), "stream"),
        (broken("max_tokens", json!(2)), "max_tokens"),
        (broken("min_tokens", json!(1)), "min_tokens"),
    ] {
        let (status, text) = post(prefill.url.clone(), body, "r1").await;
        assert_eq!(status, 400, "{why}: {text}");
        assert!(text.contains(why), "{why}: {text}");
    }
    let (status, text) = post(prefill.url.clone(), leg.clone(), "r1").await;
    assert_eq!(status, 200, "{text}");
    let params = pd_wire::transfer_params(text.as_bytes()).unwrap();
    assert_eq!(params["remote_port"], pd_mock::SIDE_CHANNEL_PORT + 1);
    assert_eq!(params["remote_request_id"], "r1");

    let decode_body =
        |params: &Value| pd_wire::decode_body(client_body.as_object().unwrap(), Some(params));
    let mut moved = params.clone();
    moved["remote_port"] = json!(5600);
    let prompt = json!({"model": "m", "prompt": [1, 2, 4], "max_tokens": 9});
    for (body, id, why) in [
        (decode_body(&params), "r2", "remote_request_id"),
        (decode_body(&moved), "r1", "mock_check"),
        (
            decode_body(&leg[pd_wire::PARAMS]),
            "r1",
            "do_remote_prefill",
        ),
        (
            pd_wire::decode_body(prompt.as_object().unwrap(), Some(&params)),
            "r1",
            "mock_check",
        ),
    ] {
        let (status, text) = post(decode.url.clone(), body, id).await;
        assert_eq!(status, 400, "{why}: {text}");
        assert!(text.contains(why), "{why}: {text}");
    }
    let (status, text) = post(decode.url.clone(), decode_body(&params), "r1").await;
    assert_eq!(status, 200, "{text}");
}

#[test]
fn a_pd_fleet_without_a_decode_worker_is_refused_with_a_clear_error() {
    let parse =
        |flags: &[&str]| flags::parse_from(std::iter::once("gateway").chain(flags.iter().copied()));
    let e = parse(&["--prefill", "http://127.0.0.1:8101"]).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    let line = cli::one_line(&e);
    assert!(
        line.contains("required") && line.contains("--decode <URL>"),
        "{line}"
    );
    let e = parse(&[
        "--decode",
        "http://d",
        "--upstream",
        "http://u",
        "--prefill",
        "http://p",
    ])
    .unwrap_err();
    assert!(cli::one_line(&e).contains("cannot be used with"), "{e}");
    let f = parse(&[
        "--pd-decider",
        "never",
        "--prefill",
        "http://p/",
        "--decode",
        "http://d",
        "--dp-ranks",
        "4",
        "--prefill-dp-ranks",
        "2",
    ])
    .unwrap();
    assert_eq!(
        (f.prefill, f.decode),
        (vec!["http://p".to_owned()], vec!["http://d".to_owned()])
    );
    assert_eq!((f.prefill_ranks, f.ranks), (2, 4));
    assert_eq!(f.pd_decider, "never");
    let e = parse(&[
        "--prefill",
        "http://p",
        "--decode",
        "http://d",
        "--policy",
        "balanced",
    ]);
    let e = e.unwrap_err();
    assert!(cli::one_line(&e).contains("cannot be used with"), "{e}");
    let f = parse(&["--prefill", "http://p", "--decode", "http://d"]).unwrap();
    assert_eq!(f.pd_decider, "cost", "the default");
    assert!(policy::pd_decider(&f.pd_decider, 16).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cost_decider_plans_pairs_the_legs_follow() {
    // Whatever the cost decides for each prompt (short and long, repeated), the legs go
    // where the answer's headers say: a split request to both sides, with its parameters;
    // an aggregated one to the decode worker alone.
    let f = Fleet::start(TWO_BY_ONE, None, prefix_router::ByCost).await;
    let mut sent = Vec::new();
    for (i, len) in [8u32, 4_000, 8, 4_000, 20_000].into_iter().enumerate() {
        let body =
            json!({"model": "m", "prompt": (0..len).collect::<Vec<_>>(), "stream": i % 2 == 0});
        let (status, headers, answer) = f.send("/v1/completions", &body, None).await;
        assert_eq!(status, 200, "{answer}");
        let id = header(&headers, "x-request-id").unwrap();
        sent.push((id, header(&headers, "x-prefill-worker").is_some()));
    }
    let (prefills, decodes) = (f.legs(Role::Prefill).await, f.legs(Role::Decode).await);
    for (id, split) in &sent {
        assert_eq!(prefills.contains_key(id), *split, "{id}");
        let expected = if *split { "remote" } else { "local" };
        assert_eq!(decodes[id]["prefill"], expected, "{id}");
    }
    let stats = f.idle_stats().await;
    let (split, local) = (&stats["requests"]["split"], &stats["requests"]["local"]);
    eprintln!("the cost decider split {split} of 5 requests: {sent:?}");
    assert_eq!(
        split.as_u64().unwrap() + local.as_u64().unwrap(),
        5,
        "{stats}"
    );
    assert_eq!(stats["planner"], "cost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cost_decider_splits_a_long_prompt_off_a_decoding_worker_then_finds_it_there() {
    // Streams held open after their first token are decoding on the one decode worker: a
    // long prompt prefilled there would stall them, so the cost decider prefills it apart;
    // the same prompt again is cached on the decode worker and stays there.
    let shape = Shape {
        prefill: (1, 1),
        decode: (1, 1),
    };
    let f = Fleet::start(shape, None, prefix_router::ByCost).await;
    // Four streams held open after their first token decode on the one decode worker.
    let mut streams = Vec::new();
    for k in 0..4u32 {
        let prompt: Vec<u32> = (0..64).map(|t| t + 100_000 * k).collect();
        let held = json!({"model": "m", "prompt": prompt, "stream": true, "mock_pause_ms": 60_000});
        let mut stream = f
            .client
            .post(format!("{}/v1/completions", f.gw))
            .body(held.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(
            stream.headers().get("x-prefill-worker"),
            None,
            "a short prompt stays"
        );
        assert!(
            stream.chunk().await.unwrap().is_some(),
            "its first token came"
        );
        streams.push(stream);
    }
    let long = json!({"model": "m", "prompt": (1_000..21_000).collect::<Vec<u32>>()});
    let (status, headers, answer) = f.send("/v1/completions", &long, None).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(header(&headers, "x-prefill-worker").as_deref(), Some("0"));
    let id = header(&headers, "x-request-id").unwrap();
    assert_eq!(f.legs(Role::Decode).await[&id]["prefill"], "remote");
    // The handoff credited the decode worker with the prompt: asked again, it is cached
    // there, and decoded where it is.
    let (status, headers, answer) = f.send("/v1/completions", &long, None).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(header(&headers, "x-prefill-worker"), None);
    assert_eq!(
        header(&headers, "x-predicted-cached-tokens").as_deref(),
        Some("20000")
    );
    let v: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 20_000);
    drop(streams);
    let stats = f.idle_stats().await;
    let requests = &stats["requests"];
    assert_eq!(
        (&requests["split"], &requests["local"]),
        (&json!(1), &json!(5)),
        "{stats}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_are_listed_from_the_decode_side_once() {
    let mut f = Fleet::start(TWO_BY_ONE, None, AlwaysSplit).await;
    let models = |f: &Fleet| {
        let request = f.client.get(format!("{}/v1/models", f.gw));
        async move { read(request.send().await.unwrap()).await }
    };
    let (status, v, _) = models(&f).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "list", "{v}");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["m"], "two decode endpoints list it, once: {v}");
    // With the decode side gone, the prefill side (still up) is not asked: none answers.
    for d in &mut f.decode {
        d.kill();
    }
    let (status, v, _) = models(&f).await;
    assert_eq!(status, 503, "{v}");
    assert!(v["error"]["message"].is_string(), "{v}");
}

/// Admission in P/D mode: a target no plan can meet (2,048 uncached tokens take about 62 ms
/// anywhere) is refused with `429` before either leg is sent; the same request critical,
/// or with a target it can meet, is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_no_plan_can_meet_is_refused_before_any_leg() {
    let f = Fleet::start(TWO_BY_ONE, None, prefix_router::ByCost).await;
    let tokens: Vec<u32> = (0..2_048).collect();
    let body = json!({"model": "m", "prompt": tokens, "max_tokens": 1});
    let post = |headers: &'static [(&'static str, &'static str)]| {
        let mut request = f
            .client
            .post(format!("{}/v1/completions", f.gw))
            .header("content-type", "application/json")
            .body(body.to_string());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let text = response.text().await.unwrap();
            (
                status,
                serde_json::from_str::<Value>(&text).unwrap_or(Value::Null),
            )
        }
    };
    let (status, v) = post(&[("x-ttft-target-ms", "1")]).await;
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["code"], "shed_prompt", "{v}");
    assert!(f.legs(Role::Prefill).await.is_empty(), "no prefill leg");
    assert!(f.legs(Role::Decode).await.is_empty(), "no decode leg");
    let (status, v) = post(&[("x-ttft-target-ms", "1"), ("x-priority", "critical")]).await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = post(&[("x-ttft-target-ms", "60000")]).await;
    assert_eq!(status, 200, "{v}");
    f.idle_stats().await;
}
