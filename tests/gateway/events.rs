//! The gateway fed by its engines' KV events over ZMQ (feature `zmq`): mock workers publish
//! vLLM event batches on loopback PUB sockets and serve replays on ROUTER sockets; the
//! gateway's mirror follows them. Bounded in count and time.

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
