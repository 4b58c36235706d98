//! The ZMQ path of `examples/vllm_events` over real loopback TCP: a PUB socket publishes the
//! test vectors framed as vLLM frames them, the example's SUB side reads them into a mirror,
//! which must match a mirror fed the same payloads from the files, batch by batch. Bounded in
//! count and time.

#![cfg(feature = "zmq")]
#![allow(clippy::unwrap_used, dead_code, unreachable_pub)]

#[path = "../examples/common/engine_settings.rs"]
mod engine_settings;
#[path = "../examples/vllm_events/feed.rs"]
mod feed;
#[path = "../examples/vllm_events/zmq.rs"]
mod zmq;

use std::path::PathBuf;
use std::time::Duration;

use feed::Feed;
use prefix_router::{IndexConfig, Router};
use zeromq::{Socket, SocketSend, ZmqMessage};

/// Seq of the warm-up messages sent until the subscription is live (ZMQ drops what a PUB
/// socket sends before a subscriber has joined).
const WARM_UP: u64 = u64::MAX;

fn vectors() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/vllm/map_u64")
}

fn message(frames: &[&[u8]]) -> ZmqMessage {
    let mut m = ZmqMessage::from(frames[0].to_vec());
    for f in &frames[1..] {
        m.push_back(f.to_vec().into());
    }
    m
}

/// What a mirror holds, per worker and in all.
fn state(feed: &Feed) -> (Vec<(u32, usize)>, usize, usize) {
    let (blocks, nodes) = feed
        .router
        .index()
        .with_tree(|t| (t.block_count(), t.node_count()));
    (feed.blocks(), blocks, nodes)
}

#[test]
fn malformed_messages_are_errors_not_panics() {
    assert!(zmq::parse(vec![b"kv".to_vec(), 0u64.to_be_bytes().to_vec()]).is_err());
    assert!(zmq::parse(vec![b"kv".to_vec(), vec![0; 4], vec![1]]).is_err());
    let f = zmq::parse(vec![
        b"kv".to_vec(),
        7u64.to_be_bytes().to_vec(),
        vec![1, 2],
    ])
    .unwrap();
    assert_eq!((f.seq, f.payload.as_slice()), (7, &[1u8, 2][..]));
}

#[tokio::test(flavor = "current_thread")]
async fn a_live_stream_builds_the_same_mirror_as_the_files() {
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(vectors().join("expected.json")).unwrap())
            .unwrap();
    let mut publisher = zeromq::PubSocket::new();
    let endpoint = publisher.bind("tcp://127.0.0.1:0").await.unwrap();
    let mut subscriber = zmq::subscribe(&endpoint.to_string(), "kv").await.unwrap();

    // Warm up until a message gets through (at most 5 s).
    let mut joined = false;
    for _ in 0..100 {
        let warm = WARM_UP.to_be_bytes();
        publisher.send(message(&[b"kv", &warm, b""])).await.unwrap();
        let got = tokio::time::timeout(Duration::from_millis(50), zmq::next_frame(&mut subscriber));
        if let Ok(Ok(Ok(frame))) = got.await {
            joined = frame.seq == WARM_UP;
            break;
        }
    }
    assert!(joined, "the subscriber never received a message");

    let live = Feed::new(1, IndexConfig::default(), Vec::new()).unwrap();
    let reference = Feed::new(1, IndexConfig::default(), Vec::new()).unwrap();
    let mut peak = 0;
    for batch in expected.as_array().unwrap() {
        let payload = std::fs::read(vectors().join(batch["file"].as_str().unwrap())).unwrap();
        let seq = batch["seq"].as_u64().unwrap();
        // A malformed message first: reported, and the stream goes on.
        publisher.send(message(&[b"kv", b"bad"])).await.unwrap();
        publisher
            .send(message(&[b"kv", &seq.to_be_bytes(), &payload]))
            .await
            .unwrap();
        reference.apply(0, seq, &payload).unwrap();
        let mut malformed = 0;
        loop {
            let next =
                tokio::time::timeout(Duration::from_secs(5), zmq::next_frame(&mut subscriber));
            let next = next.await.expect("a published batch did not arrive");
            match next.expect("the socket stays open") {
                Ok(frame) if frame.seq == WARM_UP => {}
                Ok(frame) => {
                    assert_eq!(frame.seq, seq);
                    let lines = live.apply(0, frame.seq, &frame.payload).unwrap();
                    assert!(
                        lines
                            .iter()
                            .all(|l| !l.contains("rejected") && !l.contains("gap"))
                    );
                    break;
                }
                Err(_) => malformed += 1,
            }
        }
        assert_eq!(
            malformed, 1,
            "batch {seq}: the malformed message is reported once"
        );
        assert_eq!(state(&live), state(&reference), "after batch {seq}");
        peak = peak.max(state(&live).1);
    }
    assert!(peak > 0, "the vectors stored blocks at some point");
    assert_eq!(state(&live).1, 0, "the last batch clears the cache");
    assert_eq!(live.router.workers().len(), 1);
}
