//! Arbitrary bytes as replica sync frames, and frames of arbitrary records: no panic, the
//! router routes on, and once the peers' last frames say every request is complete no
//! booking is left.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use prefix_router::replica::{Frame, Record};
use prefix_router::{BalancedRouter, BlockHash, ReplicaConfig, RouteRequest, Router};

fuzz_target!(|data: &[u8]| {
    let router = || {
        BalancedRouter::new(3)
            .and_then(|r| r.with_replica_sync(ReplicaConfig::new(0, 1).with_max_peers(4)))
            .expect("a router with sync")
    };
    let raw = router();
    let _ = raw.apply_replica_sync(data, Duration::ZERO);
    let d = raw.route(&RouteRequest::new(&[1; 64])).expect("routes on");
    raw.complete(&d);
    let router = router();
    // The same bytes read as records of peers 1 to 3.
    for (k, chunk) in data.chunks(24).enumerate() {
        let byte = |i: usize| u64::from(*chunk.get(i).unwrap_or(&0));
        let request = byte(1) % 16 + 1;
        let record = match byte(0) % 3 {
            0 => Record::Routed {
                request,
                endpoint: (byte(2) % 4) as u32,
                rank: (byte(3) % 2) as u32,
                prompt_tokens: byte(4) * 16,
                prefill_tokens: byte(5) * 8,
                output_tokens: byte(6) as u32,
                blocks: (0..byte(7) % 8)
                    .map(|b| BlockHash::new(b * 31 + byte(8)))
                    .collect(),
            },
            1 => Record::FirstToken { request },
            _ => Record::Completed { request },
        };
        let frame = Frame {
            replica: byte(9) % 3 + 1,
            incarnation: byte(10) % 2,
            seq: k as u64,
            open: byte(11) % 4,
            awaiting: byte(12) % 4,
            records: vec![record],
        };
        let mut bytes = Vec::new();
        frame.encode(&mut bytes);
        let _ = router.apply_replica_sync(&bytes, Duration::from_millis(k as u64));
    }
    let d = router
        .route(&RouteRequest::new(&[1; 64]))
        .expect("routes on");
    router.complete(&d);
    for replica in 1..=3 {
        for incarnation in 0..2 {
            let mut bytes = Vec::new();
            let done = Frame {
                replica,
                incarnation,
                seq: 1 << 20,
                open: 64,
                awaiting: 64,
                records: Vec::new(),
            };
            done.encode(&mut bytes);
            let _ = router.apply_replica_sync(&bytes, Duration::ZERO);
        }
    }
    let stats = router.replica_sync_stats().expect("sync is on");
    assert_eq!(stats.bookings, 0, "{stats:?}");
});
