//! `apply_event` throughput in a mirror of 10^6 blocks.
//!
//! - `apply_stored_8_blocks`: a worker's engine stores 128-block prompts (2,048 tokens at
//!   block size 16) as 16 events of 8 blocks, each continuing from the previous one's last
//!   block, as vLLM publishes a request's blocks while it runs. Each batch of stores is
//!   timed, then removed again untimed, so the mirror stays that size.
//! - `apply_removed_1_block`: the eviction of a finished 128-block prompt as vLLM reports it,
//!   one `Removed` event per block, last block first. The prompt is stored untimed first.
//! - `apply_stored_8_blocks_interleaved`: the same stores from 256 requests running at once,
//!   taking turns (more chains than the sync state remembers tips for).
//! - `map_insert_8_random`: a floor under any design with one hash-map insert per stored
//!   block: 8 inserts of random keys into a hashbrown map of 10^6 entries with 24-byte slots
//!   (the engine-hash map's shape before its records moved to an arena), with no hashing,
//!   tree or sync work around them.
//!
//! Run: `cargo bench --bench sync`.

#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{Rng, event_fed_index, prompt_events};
use criterion::{BenchmarkId, Criterion, Throughput, black_box, criterion_group, criterion_main};
use prefix_router::*;

const RUN: usize = common::EVENT_BLOCKS;

/// The benches' group: timing settings, throughput in blocks (events of `RUN` blocks).
fn sync_group(
    c: &mut Criterion,
) -> criterion::BenchmarkGroup<'_, criterion::measurement::WallTime> {
    let mut group = c.benchmark_group("sync");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(RUN as u64));
    group
}

/// One prompt's events: `before` applied untimed, `timed` timed, `after` (untimed) restores
/// the mirror's size.
struct Case {
    before: Vec<CacheEvent>,
    timed: Vec<CacheEvent>,
    after: CacheEvent,
}

/// Time of `iters` timed events, taken from the cases in turn.
fn time_events(index: &CacheIndex, cases: &[Case], iters: u64) -> Duration {
    let worker = WorkerId::new(0);
    let mut timed = Duration::ZERO;
    let (mut done, mut p) = (0, 0);
    while done < iters {
        let case = &cases[p % cases.len()];
        for e in &case.before {
            index.apply_event(worker, 0, e).unwrap();
        }
        let n = (iters - done).min(case.timed.len() as u64) as usize;
        let start = Instant::now();
        for e in &case.timed[..n] {
            black_box(index.apply_event(worker, 0, e).unwrap());
        }
        timed += start.elapsed();
        index.apply_event(worker, 0, &case.after).unwrap();
        done += n as u64;
        p += 1;
    }
    timed
}

fn apply_stores(c: &mut Criterion) {
    let mut rng = Rng(5);
    let index = event_fed_index(&mut rng, 1_000_000);
    let pool: Vec<_> = (0..512).map(|_| prompt_events(&mut rng)).collect();
    let mut group = sync_group(c);
    let stores: Vec<Case> = pool
        .iter()
        .map(|(stores, removal)| Case {
            before: Vec::new(),
            timed: stores.clone(),
            after: removal.clone(),
        })
        .collect();
    group.bench_function(
        BenchmarkId::new("apply_stored_8_blocks", "1e6_blocks"),
        |b| b.iter_custom(|iters| time_events(&index, &stores, iters)),
    );
    let evictions: Vec<Case> = pool
        .iter()
        .map(|(stores, removal)| {
            let CacheEvent::Removed { blocks } = removal else {
                unreachable!()
            };
            Case {
                before: stores.clone(),
                timed: blocks
                    .iter()
                    .rev()
                    .map(|&b| CacheEvent::Removed { blocks: vec![b] })
                    .collect(),
                after: removal.clone(),
            }
        })
        .collect();
    group.throughput(Throughput::Elements(1));
    group.bench_function(
        BenchmarkId::new("apply_removed_1_block", "1e6_blocks"),
        |b| b.iter_custom(|iters| time_events(&index, &evictions, iters)),
    );
    group.finish();
    println!(
        "mirror fed by events: {} blocks, {:.1} B per block (tree and engine-hash map)",
        index.with_tree(RadixTree::block_count),
        index.memory_bytes() as f64 / index.with_tree(RadixTree::block_count) as f64
    );
}

/// Requests running at once on one engine in `apply_stored_8_blocks_interleaved`.
const CONCURRENT: usize = 256;

/// Stores of `CONCURRENT` requests taking turns, as an engine running that many at once
/// publishes them: each round applies every request's next 8-block event (timed), then
/// (untimed) a request that has stored its 128 blocks is evicted and a new one takes its
/// place. Requests start at staggered points, so that evictions spread over rounds.
fn apply_interleaved(c: &mut Criterion) {
    let mut rng = Rng(6);
    let index = event_fed_index(&mut rng, 1_000_000);
    let pool: Vec<_> = (0..4 * CONCURRENT)
        .map(|_| prompt_events(&mut rng))
        .collect();
    let worker = WorkerId::new(0);
    // (prompt in the pool, next event) per running request.
    let mut running: Vec<(usize, usize)> = (0..CONCURRENT).map(|r| (r, r % 16)).collect();
    for &(p, next) in &running {
        for e in &pool[p].0[..next] {
            index.apply_event(worker, 0, e).unwrap();
        }
    }
    let mut next_prompt = CONCURRENT;
    let mut group = sync_group(c);
    group.bench_function(
        BenchmarkId::new("apply_stored_8_blocks_interleaved", "256_requests"),
        |b| {
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                let mut done = 0;
                while done < iters {
                    let n = (iters - done).min(CONCURRENT as u64) as usize;
                    let start = Instant::now();
                    for &(p, next) in &running[..n] {
                        black_box(index.apply_event(worker, 0, &pool[p].0[next]).unwrap());
                    }
                    timed += start.elapsed();
                    for (p, next) in &mut running[..n] {
                        *next += 1;
                        if *next == pool[*p].0.len() {
                            index.apply_event(worker, 0, &pool[*p].1).unwrap();
                            (*p, *next) = (next_prompt % pool.len(), 0);
                            next_prompt += 1;
                        }
                    }
                    done += n as u64;
                }
                timed
            });
        },
    );
    group.finish();
}

/// A multiply-fold hasher like the crate's own (deterministic, one multiply per word).
#[derive(Default)]
struct Fold(u64);

impl std::hash::Hasher for Fold {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        let p = u128::from(self.0 ^ v ^ 0x243F_6A88_85A3_08D3) * 0x9E37_79B9_7F4A_7C15_u128;
        self.0 = (p as u64) ^ ((p >> 64) as u64);
    }
}

fn map_floor(c: &mut Criterion) {
    type Map = hashbrown::HashMap<u64, [u64; 2], std::hash::BuildHasherDefault<Fold>>;
    let mut rng = Rng(11);
    let mut map = Map::default();
    let mut live = std::collections::VecDeque::new();
    for _ in 0..1_000_000 {
        let k = rng.next_u64();
        map.insert(k, [k, k]);
        live.push_back(k);
    }
    let mut group = sync_group(c);
    group.bench_function(
        BenchmarkId::new("map_insert_8_random", "1e6_entries"),
        |b| {
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    let keys: [u64; RUN] = std::array::from_fn(|_| rng.next_u64());
                    let start = Instant::now();
                    for k in keys {
                        black_box(map.insert(k, [k, k]));
                    }
                    timed += start.elapsed();
                    // Keep the map at 10^6 entries, untimed, oldest first.
                    live.extend(keys);
                    for _ in 0..RUN {
                        map.remove(&live.pop_front().unwrap());
                    }
                }
                timed
            });
        },
    );
    group.finish();
}

criterion_group!(benches, apply_stores, apply_interleaved, map_floor);
criterion_main!(benches);
