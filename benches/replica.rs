//! Replica sync's costs: recording routes, applying peers' frames, memory per peer.
//!
//! - `route_recorded` / `route_plain`: `route()` + `first_token()` + `complete()` of a
//!   2,048-token prompt on a 16-worker `BalancedRouter`, with replica sync on (each route
//!   recorded: its prompt hashed again, the record encoded) and off; frames are drained
//!   every 64 requests, timed.
//! - `apply_frames`: a peer's frames of 64 requests each (routed, first token, completed:
//!   3 records per request, 2,048-token prompts of which the first 1,024 are shared by
//!   groups of 8), applied to a fresh 16-worker `BalancedRouter`; throughput in records.
//!   Each routed record books the request and inserts its 128 blocks into the mirror.
//! - Before the benches it prints the wire bytes per request of those frames and the memory
//!   one peer holds at its bound of bookings (the process's resident memory before and
//!   after 4 peers each book `max_bookings_per_peer` requests).
//!
//! Run: `cargo bench --bench replica`.

#![allow(missing_docs, clippy::unwrap_used)]

use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, black_box, criterion_group, criterion_main};
use prefix_router::replica::{Frame, Record};
use prefix_router::*;

const WORKERS: u32 = 16;
const PROMPT: u32 = 2_048;
const REQUESTS: u32 = 1_024;
const PER_FRAME: u32 = 64;

fn router(id: Option<u64>) -> BalancedRouter {
    let r = BalancedRouter::new(WORKERS).unwrap();
    match id {
        Some(id) => r.with_replica_sync(ReplicaConfig::new(id, 1)).unwrap(),
        None => r,
    }
}

/// Request `i`'s prompt: its group's 1,024 shared tokens, then 1,024 of its own.
fn prompt(i: u32) -> Vec<u32> {
    let group = i / 8;
    (0..PROMPT)
        .map(|t| {
            if t < PROMPT / 2 {
                group * 1_000_000 + t
            } else {
                i * 1_000_000 + t + 7
            }
        })
        .collect()
}

/// A peer's frames: every request routed, first-tokened and completed, drained every
/// `PER_FRAME` requests.
fn frames() -> Vec<Vec<u8>> {
    let peer = router(Some(1));
    let mut out = Vec::new();
    for chunk in 0..REQUESTS / PER_FRAME {
        for i in chunk * PER_FRAME..(chunk + 1) * PER_FRAME {
            let tokens = prompt(i);
            let d = peer.route(&RouteRequest::new(&tokens)).unwrap();
            peer.first_token(&d);
            peer.complete(&d);
        }
        let mut frame = Vec::new();
        peer.drain_replica_sync(&mut frame, 1 << 20);
        out.push(frame);
    }
    out
}

/// Resident memory of the process, bytes (Linux; 0 elsewhere).
fn resident() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<usize>().ok())
        .map_or(0, |pages| pages * 4_096)
}

/// Prints the bytes per request of `frames` and the memory of peers at their bound.
fn report(frames: &[Vec<u8>]) {
    let bytes: usize = frames.iter().map(Vec::len).sum();
    println!(
        "wire: {bytes} bytes for {REQUESTS} requests of {PROMPT} tokens = {:.0} bytes per request \
         ({} frames of {PER_FRAME} requests)",
        bytes as f64 / f64::from(REQUESTS),
        frames.len()
    );
    let bound = ReplicaConfig::new(0, 1).max_bookings_per_peer;
    let r = router(Some(0));
    let peers = 4u64;
    let before = resident();
    for replica in 1..=peers {
        let records = (1..=bound as u64)
            .map(|request| Record::Routed {
                request,
                endpoint: (request % u64::from(WORKERS)) as u32,
                rank: 0,
                prompt_tokens: 2_048,
                prefill_tokens: 1_024,
                output_tokens: 256,
                blocks: Vec::new(),
            })
            .collect();
        let mut bytes = Vec::new();
        Frame {
            replica,
            incarnation: 1,
            seq: 0,
            open: 1,
            awaiting: 1,
            records,
        }
        .encode(&mut bytes);
        r.apply_replica_sync(&bytes, Duration::ZERO).unwrap();
    }
    let grown = resident().saturating_sub(before);
    println!(
        "memory: {peers} peers × {bound} bookings: {grown} bytes resident more = {:.0} bytes per booking, {:.1} MiB per peer at its bound",
        grown as f64 / (peers as f64 * bound as f64),
        grown as f64 / peers as f64 / f64::from(1 << 20)
    );
    black_box(r.replica_sync_stats());
}

fn bench(c: &mut Criterion) {
    let frames = frames();
    report(&frames);
    let mut group = c.benchmark_group("replica");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    let prompts: Vec<Vec<u32>> = (0..REQUESTS).map(prompt).collect();
    group.throughput(Throughput::Elements(1));
    for (name, id) in [("route_recorded", Some(1)), ("route_plain", None)] {
        let r = router(id);
        let mut i = 0usize;
        let mut frame = Vec::new();
        group.bench_function(name, |b| {
            b.iter(|| {
                let d = r
                    .route(&RouteRequest::new(&prompts[i % prompts.len()]))
                    .unwrap();
                r.first_token(&d);
                r.complete(&d);
                i += 1;
                if i % PER_FRAME as usize == 0 {
                    r.drain_replica_sync(&mut frame, 1 << 20);
                }
                black_box(d.worker())
            });
        });
    }
    group.throughput(Throughput::Elements(u64::from(REQUESTS) * 3));
    group.bench_function("apply_frames", |b| {
        b.iter_batched(
            || router(Some(2)),
            |r| {
                for f in &frames {
                    black_box(r.apply_replica_sync(f, Duration::ZERO).unwrap());
                }
                r
            },
            BatchSize::LargeInput,
        );
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
