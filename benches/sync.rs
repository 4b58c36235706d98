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
//! - `apply_stored_next_turn`: conversations that come back for another turn after the
//!   engine has stored other requests' blocks in between (512 conversations taking turns,
//!   more than the sync state remembers tips for). Each turn is routed first (untimed), so
//!   the mirror already holds the whole prompt and the previous turn's last block is inside
//!   an edge; the timed event stores the turn's 8 new blocks below that block.
//! - `apply_stored_decode`: 256 requests decoding at once, each storing one block at a time
//!   below its previous one, in turns (as an engine publishes a block each time a request's
//!   decoding fills one), after a 128-block prefill stored untimed; a request that has
//!   decoded 32 blocks is evicted and a new one takes its place.
//! - `map_insert_8_random`: a floor under any design with one hash-map insert per stored
//!   block: 8 inserts of random keys into a hashbrown map of 10^6 entries with 24-byte slots
//!   (the engine-hash map's shape before its records moved to an arena), with no hashing,
//!   tree or sync work around them.
//!
//! Run: `cargo bench --bench sync`.

#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{PROMPT_BLOCKS, Rng, event_fed_index, prompt_events};
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

/// Applies the timed events of every bench to worker 0, apart so that callgrind can count
/// their instructions alone (`valgrind --tool=callgrind --toggle-collect='*apply_timed*'
/// <bench binary> --bench <name> --profile-time 2`).
#[inline(never)]
fn apply_timed<'a, S: CacheSync>(sync: &S, events: impl IntoIterator<Item = &'a CacheEvent>) {
    for e in events {
        black_box(sync.apply_event(WorkerId::new(0), 0, e).unwrap());
    }
}

/// Splits `iters` timed events into rounds of at most `size`: `round(n)` runs one round of
/// `n` events and returns its timed part. The total, for `iter_custom`.
fn in_rounds(iters: u64, size: usize, mut round: impl FnMut(usize) -> Duration) -> Duration {
    let (mut timed, mut done) = (Duration::ZERO, 0);
    while done < iters {
        let n = (iters - done).min(size as u64) as usize;
        timed += round(n);
        done += n as u64;
    }
    timed
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
        apply_timed(index, &case.timed[..n]);
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
            let CacheEvent::Removed { blocks, .. } = removal else {
                unreachable!()
            };
            Case {
                before: stores.clone(),
                timed: blocks
                    .iter()
                    .rev()
                    .map(|&b| CacheEvent::removed(vec![b]))
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
    print_memory("apply_stored_8_blocks, apply_removed_1_block", &index);
}

/// Prints the memory of a bench's mirror once its runs are done.
fn print_memory(benches: &str, index: &CacheIndex) {
    let blocks = index.with_tree(RadixTree::block_count);
    println!(
        "mirror fed by events after {benches}: {blocks} blocks, {:.1} B per block (tree and \
         engine-hash map)",
        index.memory_bytes() as f64 / blocks as f64
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
                in_rounds(iters, CONCURRENT, |n| {
                    let start = Instant::now();
                    apply_timed(
                        &index,
                        running[..n].iter().map(|&(p, next)| &pool[p].0[next]),
                    );
                    let timed = start.elapsed();
                    for (p, next) in &mut running[..n] {
                        *next += 1;
                        if *next == pool[*p].0.len() {
                            index.apply_event(worker, 0, &pool[*p].1).unwrap();
                            (*p, *next) = (next_prompt % pool.len(), 0);
                            next_prompt += 1;
                        }
                    }
                    timed
                })
            });
        },
    );
    group.finish();
    print_memory("apply_stored_8_blocks_interleaved", &index);
}

/// Blocks a request decodes in `apply_stored_decode` before it finishes.
const DECODED: usize = 32;

/// One request of `apply_stored_decode`: the engine hashes it holds, the last one last.
struct Decoding {
    blocks: Vec<u64>,
}

impl Decoding {
    /// Prefills a new request: its 128 blocks stored (untimed).
    fn start(index: &CacheIndex, rng: &mut Rng) -> Self {
        let (stores, removal) = prompt_events(rng);
        for e in &stores {
            index.apply_event(WorkerId::new(0), 0, e).unwrap();
        }
        let CacheEvent::Removed { blocks, .. } = removal else {
            unreachable!()
        };
        Decoding { blocks }
    }

    /// The store of its next decoded block.
    fn next(&mut self, rng: &mut Rng) -> CacheEvent {
        let block = rng.next_u64();
        let tokens = (0..16).map(|_| rng.below(151_936) as u32).collect();
        let parent = self.blocks.last().copied();
        self.blocks.push(block);
        CacheEvent::stored(parent, vec![block], tokens)
    }
}

/// Requests decoding at once, one block each per round (timed); see the file's docs.
fn apply_decode(c: &mut Criterion) {
    let mut rng = Rng(7);
    let index = event_fed_index(&mut rng, 1_000_000);
    let mut running: Vec<Decoding> = (0..CONCURRENT)
        .map(|_| Decoding::start(&index, &mut rng))
        .collect();
    let mut group = sync_group(c);
    group.throughput(Throughput::Elements(1));
    group.bench_function(
        BenchmarkId::new("apply_stored_decode", "256_requests"),
        |b| {
            b.iter_custom(|iters| {
                in_rounds(iters, CONCURRENT, |n| {
                    let events: Vec<CacheEvent> =
                        running[..n].iter_mut().map(|r| r.next(&mut rng)).collect();
                    let start = Instant::now();
                    apply_timed(&index, &events);
                    let timed = start.elapsed();
                    for r in &mut running[..n] {
                        if r.blocks.len() >= PROMPT_BLOCKS + DECODED {
                            let removal = CacheEvent::removed(core::mem::take(&mut r.blocks));
                            index.apply_event(WorkerId::new(0), 0, &removal).unwrap();
                            *r = Decoding::start(&index, &mut rng);
                        }
                    }
                    timed
                })
            });
        },
    );
    group.finish();
    print_memory("apply_stored_decode", &index);
}

/// Conversations taking turns in `apply_stored_next_turn`.
const CONVERSATIONS: usize = 512;
/// Turns per conversation before it ends (and is evicted).
const TURNS: usize = 8;

/// One conversation: its tokens and the engine's hashes of its blocks, the first turn 128
/// blocks, each later one `RUN` more.
struct Conversation {
    tokens: Vec<u32>,
    engine: Vec<u64>,
}

impl Conversation {
    fn new(rng: &mut Rng) -> Self {
        let blocks = common::PROMPT_BLOCKS + RUN * (TURNS - 1);
        Self {
            tokens: (0..blocks * 16)
                .map(|_| rng.below(151_936) as u32)
                .collect(),
            engine: (0..blocks).map(|_| rng.next_u64()).collect(),
        }
    }

    /// Blocks of the prompt of turn `turn` (0-based).
    fn blocks(turn: usize) -> usize {
        common::PROMPT_BLOCKS + RUN * turn
    }

    /// The store of blocks `from..to`, continuing from block `from - 1`.
    fn stored(&self, from: usize, to: usize) -> CacheEvent {
        CacheEvent::stored(
            from.checked_sub(1).map(|i| self.engine[i]),
            self.engine[from..to].to_vec(),
            self.tokens[from * 16..to * 16].to_vec(),
        )
    }

    /// Routes turn `turn` (the router inserts the whole prompt for the worker it picks).
    fn route(&self, router: &BalancedRouter, turn: usize) {
        let prompt = &self.tokens[..Self::blocks(turn) * 16];
        let decision = router.route(&RouteRequest::new(prompt)).unwrap();
        router.complete(&decision);
    }

    /// Routes the first turn and applies its stores, `RUN` blocks per event.
    fn start(&self, router: &BalancedRouter) {
        self.route(router, 0);
        for from in (0..common::PROMPT_BLOCKS).step_by(RUN) {
            let e = self.stored(from, from + RUN);
            router.apply_event(WorkerId::new(0), 0, &e).unwrap();
        }
    }
}

fn apply_next_turn(c: &mut Criterion) {
    let mut rng = Rng(7);
    let router = BalancedRouter::new(1).unwrap();
    let worker = WorkerId::new(0);
    for _ in 0..1_000_000 / common::PROMPT_BLOCKS {
        for e in prompt_events(&mut rng).0 {
            router.apply_event(worker, 0, &e).unwrap();
        }
    }
    // (conversation, its next turn) per slot; turns staggered so that conversations end in
    // different rounds.
    let mut slots: Vec<(Conversation, usize)> = (0..CONVERSATIONS)
        .map(|i| {
            let conversation = Conversation::new(&mut rng);
            conversation.start(&router);
            for turn in 1..1 + i % (TURNS - 1) {
                conversation.route(&router, turn);
                let to = Conversation::blocks(turn);
                router
                    .apply_event(worker, 0, &conversation.stored(to - RUN, to))
                    .unwrap();
            }
            (conversation, 1 + i % (TURNS - 1))
        })
        .collect();
    let mut group = sync_group(c);
    group.bench_function(
        BenchmarkId::new("apply_stored_next_turn", "512_conversations"),
        |b| {
            b.iter_custom(|iters| {
                in_rounds(iters, CONVERSATIONS, |n| {
                    let events: Vec<CacheEvent> = slots[..n]
                        .iter()
                        .map(|(conversation, turn)| {
                            conversation.route(&router, *turn);
                            let to = Conversation::blocks(*turn);
                            conversation.stored(to - RUN, to)
                        })
                        .collect();
                    let start = Instant::now();
                    apply_timed(&router, &events);
                    let timed = start.elapsed();
                    for (conversation, turn) in &mut slots[..n] {
                        *turn += 1;
                        if *turn == TURNS {
                            let blocks = conversation.engine.clone();
                            router
                                .apply_event(worker, 0, &CacheEvent::removed(blocks))
                                .unwrap();
                            *conversation = Conversation::new(&mut rng);
                            conversation.start(&router);
                            *turn = 1;
                        }
                    }
                    timed
                })
            });
        },
    );
    group.finish();
    print_memory("apply_stored_next_turn", router.index());
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

criterion_group!(
    benches,
    apply_stores,
    apply_interleaved,
    apply_next_turn,
    apply_decode,
    map_floor
);
criterion_main!(benches);
