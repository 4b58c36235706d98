//! `apply_event` throughput: stores of 8-block runs into a mirror of 10^6 blocks.
//!
//! A worker's engine stores 128-block prompts (2,048 tokens at block size 16) as 16 events
//! of 8 blocks, each continuing from the previous one's last block, as vLLM publishes a
//! request's blocks while it runs. The mirror is first loaded to 10^6 blocks; during the
//! measurement each batch of stores is timed, then removed again untimed, so the mirror stays
//! that size.
//!
//! Run: `cargo bench --bench sync`.

#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::Rng;
use criterion::{BenchmarkId, Criterion, Throughput, black_box, criterion_group, criterion_main};
use prefix_router::*;

const RUN: usize = 8;
const CHAIN: usize = 128;

/// The store events of one 128-block prompt, and the removal of all its blocks.
fn prompt_events(rng: &mut Rng) -> (Vec<CacheEvent>, CacheEvent) {
    let mut events = Vec::new();
    let mut parent = None;
    let mut all = Vec::new();
    for _ in 0..CHAIN / RUN {
        let blocks: Vec<u64> = (0..RUN).map(|_| rng.next_u64()).collect();
        let tokens: Vec<u32> = (0..RUN * 16).map(|_| rng.below(151_936) as u32).collect();
        all.extend(&blocks);
        parent = {
            events.push(CacheEvent::Stored {
                parent,
                blocks: blocks.clone(),
                tokens,
            });
            blocks.last().copied()
        };
    }
    (events, CacheEvent::Removed { blocks: all })
}

fn apply_stores(c: &mut Criterion) {
    let mut rng = Rng(5);
    let index = CacheIndex::new(IndexConfig::default()).unwrap();
    let worker = WorkerId::new(0);
    for _ in 0..1_000_000 / CHAIN {
        for e in prompt_events(&mut rng).0 {
            index.apply_event(worker, 0, &e).unwrap();
        }
    }
    let pool: Vec<_> = (0..512).map(|_| prompt_events(&mut rng)).collect();
    let mut group = c.benchmark_group("sync");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(RUN as u64));
    group.bench_function(
        BenchmarkId::new("apply_stored_8_blocks", "1e6_blocks"),
        |b| {
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                let mut done = 0;
                let mut p = 0;
                while done < iters {
                    let (stores, removal) = &pool[p % pool.len()];
                    let n = (iters - done).min(stores.len() as u64) as usize;
                    let start = Instant::now();
                    for e in &stores[..n] {
                        black_box(index.apply_event(worker, 0, e).unwrap());
                    }
                    timed += start.elapsed();
                    index.apply_event(worker, 0, removal).unwrap();
                    done += n as u64;
                    p += 1;
                }
                timed
            });
        },
    );
    group.finish();
    println!(
        "mirror fed by events: {} blocks, {:.1} B per block (tree and engine-hash map)",
        index.with_tree(RadixTree::block_count),
        index.memory_bytes() as f64 / index.with_tree(RadixTree::block_count) as f64
    );
}

criterion_group!(benches, apply_stores);
criterion_main!(benches);
