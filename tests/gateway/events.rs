//! The gateway fed by its engines' KV events over ZMQ (feature `zmq`): mock workers publish
//! vLLM event batches on loopback PUB sockets and serve replays on ROUTER sockets; the
//! gateway's mirror follows them; a test's own PUB socket publishes events that contradict
//! an engine's settings. Bounded in count and time.

use std::time::Duration;

use super::fleet::*;
use serde_json::{Value, json};

/// A prompt of `blocks` 16-token blocks, distinct for each `seed`.
fn prompt(seed: u32, blocks: u32) -> Vec<u32> {
    (0..blocks * 16).map(|i| seed * 100_000 + i).collect()
}

async fn send(client: &reqwest::Client, gw: &str, body: Value) -> (u64, u64) {
    let (status, v, headers) = post(client, gw, &body, None).await;
    assert_eq!(status, 200, "{v}");
    predicted_and_reported(&v, &headers)
}

/// Waits until worker 0 has had `batches` event batches applied.
async fn applied(client: &reqwest::Client, gw: &str, batches: u64) -> Value {
    wait_for(client, gw, |w| {
        w["events"]["batches"].as_u64() >= Some(batches)
    })
    .await
}

/// The mock's cache holds 8 blocks: a second prompt of 8 blocks evicts the first. Miss
/// feedback alone would leave the first in the mirror (the worker computed it); the
/// engine's removal events take it out, so the gateway predicts the miss exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removal_events_take_evicted_prefixes_out_of_the_mirror() {
    let up = Upstream::with_events(8, None);
    let gw = gateway("cache_aware", &[&up]).await;
    let client = client();
    // Events flow once a first batch is through (what was published before the
    // subscription joined comes from the replay socket with it).
    send(&client, &gw, json!({"model": "m", "prompt": prompt(1, 4)})).await;
    applied(&client, &gw, 1).await;
    assert_eq!(
        send(&client, &gw, json!({"model": "m", "prompt": prompt(1, 4)})).await,
        (64, 64)
    );
    // 8 new blocks: stored, and the 4 old ones removed, in one batch.
    send(&client, &gw, json!({"model": "m", "prompt": prompt(2, 8)})).await;
    let stats = applied(&client, &gw, 2).await;
    assert_eq!(
        send(&client, &gw, json!({"model": "m", "prompt": prompt(1, 4)})).await,
        (0, 0)
    );
    let events = &stats["workers"][0]["events"];
    assert_eq!(events["rejected"], 0, "{stats}");
    assert!(events["lag_ms"].as_f64().unwrap() < 5_000.0, "{stats}");
}

/// A batch the PUB socket never sent is fetched from the replay socket when the next one
/// shows the gap, and applied before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_in_the_stream_is_filled_from_the_replay_socket() {
    let up = Upstream::with_events(64, None);
    let gw = gateway("cache_aware", &[&up]).await;
    let client = client();
    send(&client, &gw, json!({"model": "m", "prompt": prompt(1, 2)})).await;
    applied(&client, &gw, 1).await;
    let before = get(&client, format!("{gw}/stats")).await["workers"][0]["events"].clone();
    // Batch n is kept off the PUB socket; batch n + 1 shows the gap.
    send(
        &client,
        &gw,
        json!({"model": "m", "prompt": prompt(2, 2), "mock_drop_events": true}),
    )
    .await;
    send(&client, &gw, json!({"model": "m", "prompt": prompt(3, 2)})).await;
    let stats = applied(&client, &gw, before["batches"].as_u64().unwrap() + 2).await;
    let events = &stats["workers"][0]["events"];
    assert_eq!(
        events["replayed"].as_u64().unwrap(),
        before["replayed"].as_u64().unwrap() + 1,
        "{stats}"
    );
    assert_eq!(events["unfilled_gaps"], 0, "{stats}");
    assert_eq!(events["rejected"], 0, "{stats}");
}

/// A batch of one store of group 1, stating a sliding window of `window` tokens, as rank
/// `rank` publishes it (a map-encoded vLLM `KVEventBatch`).
fn window_store(rank: u32, window: u32, hash: u64) -> Vec<u8> {
    use rmpv::Value as Msg;
    let pair = |k: &str, v: Msg| (Msg::from(k), v);
    let tokens = (0..16u32)
        .map(|t| Msg::from(hash as u32 * 100 + t))
        .collect();
    let event = Msg::Map(vec![
        pair("type", Msg::from("BlockStored")),
        pair("block_hashes", Msg::Array(vec![Msg::from(hash)])),
        pair("parent_block_hash", Msg::Nil),
        pair("token_ids", Msg::Array(tokens)),
        pair("block_size", Msg::from(16)),
        pair("medium", Msg::from("GPU")),
        pair("group_idx", Msg::from(1)),
        pair("kv_cache_spec_kind", Msg::from("sliding_window")),
        pair("kv_cache_spec_sliding_window", Msg::from(window)),
    ]);
    let batch = Msg::Map(vec![
        pair("ts", Msg::from(1.0)),
        pair("events", Msg::Array(vec![event])),
        pair("data_parallel_rank", Msg::from(rank)),
    ]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &batch).unwrap();
    out
}

/// Publishes `batches` (seq, payload) on `publisher` every 50 ms (a subscriber misses what
/// is sent before it joins; the gateway skips the copies it has applied) until `done` holds
/// for the gateway's `/stats`, for at most 5 s.
async fn publish_until(
    publisher: &mut zeromq::PubSocket,
    batches: &[(u64, Vec<u8>)],
    client: &reqwest::Client,
    gw: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    use zeromq::SocketSend;
    for _ in 0..100 {
        for (seq, payload) in batches {
            let mut message = zeromq::ZmqMessage::from(b"kv".to_vec());
            message.push_back(seq.to_be_bytes().to_vec().into());
            message.push_back(payload.clone().into());
            publisher.send(message).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let stats = get(client, format!("{gw}/stats")).await;
        if done(&stats) {
            return stats;
        }
    }
    panic!("the gateway's stats never got there");
}

/// `--engine-settings 0:window=1:1024` on an upstream of two ranks: a store stating that
/// window agrees; one stating 512 contradicts it, on either rank (both took the upstream's
/// settings), and each is counted for its worker in `/stats`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_that_contradict_an_engines_settings_are_counted_on_every_rank() {
    use zeromq::Socket;
    let up = Upstream::with_ranks(64, 2);
    let mut publisher = zeromq::PubSocket::new();
    let at = publisher
        .bind("tcp://127.0.0.1:0")
        .await
        .unwrap()
        .to_string();
    let (gw, said) = gateway_from_flags(&[
        "--policy",
        "cache_aware",
        "--upstream",
        &up.url,
        "--dp-ranks",
        "2",
        "--kv-events",
        &at,
        "--engine-settings",
        "0:window=1:1024",
    ])
    .await;
    assert!(
        said[1].contains(
            "assuming host-chunk-blocks=1,full-reports=false,window=1:1024 \
             (--engine-settings 0:window=1:1024, the rest by default)"
        ),
        "{said:?}"
    );
    let client = client();
    let conflicts =
        |stats: &Value, w: usize| stats["workers"][w]["events"]["settings_conflicts"].clone();
    // The window as given: applied, no conflict.
    let agreed = [(0, window_store(0, 1024, 1))];
    let stats = publish_until(&mut publisher, &agreed, &client, &gw, |s| {
        s["workers"][0]["events"]["batches"] == 1
    })
    .await;
    assert_eq!(conflicts(&stats, 0), 0, "{stats}");
    // Another window, from rank 0 and from rank 1 (both on the socket the gateway follows).
    let contradicting = [(1, window_store(0, 512, 2)), (2, window_store(1, 512, 3))];
    let stats = publish_until(&mut publisher, &contradicting, &client, &gw, |s| {
        s["workers"][0]["events"]["batches"] == 3 && conflicts(s, 1) == 1
    })
    .await;
    assert_eq!(conflicts(&stats, 0), 1, "{stats}");
    assert_eq!(conflicts(&stats, 1), 1, "{stats}");
    assert_eq!(stats["workers"][0]["events"]["rejected"], 0, "{stats}");
}
