//! prefix-router against kv-index 2.0.0 and dynamo-kv-router 1.6.1, on identical data, in
//! one criterion run.
//!
//! Workload (seeded): 2,048-token prompts at block size 16 (128 blocks): one of 200 system
//! prompts of 512 tokens chosen by Zipf(1.0), then a unique tail; each prompt cached by one
//! random worker, until the structures hold 10^4, 10^5 and 10^6 (block, worker) pairs; 16
//! and 256 workers. Each crate is fed the same token prompts and hashes them its own way.
//!
//! Paths and settings used, each crate's fastest documented path for the operation:
//! - prefix-router: `RadixTree` with `TreeConfig::chained` (as its routers' `CacheIndex`
//!   uses it) and `match_prefix_into` into a reused `PrefixMatch`; hashing with
//!   `PrefixHasher` (XXH3, block size 16); event stores through `CacheIndex::apply_event`
//!   (which recomputes the router's hashes from the event's tokens).
//! - kv-index: `ChainIndex::new()` (256 workers) with one `ChainBlockMap` per worker, fed
//!   with `apply_stored`; lookups with `score_into` (no allocation); request hashing with
//!   `compute_request_content_hashes`. Also `TokenTree` (`insert_tokens`,
//!   `match_prefix_with_counts`), which hashes nothing and matches tokens directly.
//! - dynamo-kv-router: `RadixTree` fed with `RouterEvent`s (`KvCacheEventData::Stored`),
//!   lookups with `find_matches(.., early_exit = false)` (it takes the hashes by value: the
//!   clone is part of its cost); request hashing with `compute_block_hash_for_seq`. Also its
//!   default concurrent front end, `ThreadPoolIndexer<ConcurrentRadixTreeCompressed>` (2
//!   event threads), loaded with `apply_event_and_wait` and matched inline on the caller's
//!   thread with `SyncIndexer::find_matches` (its documented read path).
//! - remove a worker: measured at 10^4 and 10^5 pairs on a freshly loaded structure each
//!   iteration (the load is not timed).
//!
//! - kv-index's `ShardedChainIndex::new(2, 256)`: two shards (one per core of this machine,
//!   as its docs advise one per socket), worker `w` in shard `w % 2`, fed and queried on one
//!   thread with the same calls as `ChainIndex` (`score_into` walks both shards).
//!
//! The counting allocator is the one place in this project with `unsafe`: a `GlobalAlloc`
//! cannot be written without it. It lives in this standalone benchmark, never in the crate.
//!
//! Memory: bytes allocated while loading each structure, counted by a global allocator in
//! this binary, divided by the (block, worker) pairs held.
//!
//! Run: `benches/peers/run.sh` (or `cargo bench --manifest-path benches/peers/Cargo.toml`).
//! With `PEERS_ONLY=load` in the environment, only the 10^6-pair loads and memory are run.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, black_box, criterion_group, criterion_main};
use dynamo_kv_router::ConcurrentRadixTreeCompressed;
use dynamo_kv_router::indexer::{SyncIndexer, ThreadPoolIndexer};
use dynamo_kv_router::protocols::{
    BlockHashOptions, ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData,
    KvCacheStoreData, KvCacheStoredBlockData, LocalBlockHash, RouterEvent,
    compute_block_hash_for_seq,
};
use kv_index::{
    ChainBlockMap, ChainIndex, ContentHash, SequenceHash, ShardedChainIndex, StoredBlock, TokenTree,
};
use prefix_router::{
    BlockHash, CacheEvent, CacheIndex, CacheSync, IndexConfig, PrefixHasher, PrefixMatch,
    RadixTree, TreeConfig, WorkerId,
};

/// Counts bytes currently allocated.
struct Counting;

static ALLOCATED: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size() as isize, Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        ALLOCATED.fetch_sub(layout.size() as isize, Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATED.fetch_add(new_size as isize - layout.size() as isize, Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocated() -> isize {
    ALLOCATED.load(Relaxed)
}

const BLOCK: usize = 16;
const PROMPT: usize = 2_048;
const SYSTEMS: usize = 200;
const SYSTEM_TOKENS: usize = 512;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
}

/// The seeded prompts and the worker each is cached on.
fn workload(pairs: usize, workers: u32, seed: u64) -> Vec<(u32, Vec<u32>)> {
    let mut rng = Rng(seed);
    let systems: Vec<Vec<u32>> = (0..SYSTEMS)
        .map(|_| {
            (0..SYSTEM_TOKENS)
                .map(|_| rng.below(151_936) as u32)
                .collect()
        })
        .collect();
    let cdf: Vec<f64> = {
        let w: Vec<f64> = (1..=SYSTEMS).map(|r| 1.0 / r as f64).collect();
        let total: f64 = w.iter().sum();
        w.iter()
            .scan(0.0, |acc, x| {
                *acc += x / total;
                Some(*acc)
            })
            .collect()
    };
    let mut out = Vec::new();
    let mut held = std::collections::HashSet::new();
    let mut count = 0;
    while count < pairs {
        let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
        let s = cdf.partition_point(|&c| c < u).min(SYSTEMS - 1);
        let w = rng.below(u64::from(workers)) as u32;
        let mut p = systems[s].clone();
        while p.len() < PROMPT {
            p.push(rng.below(151_936) as u32);
        }
        // Pairs: the system prompt's blocks count once per worker holding them.
        let new_system = held.insert((w, s));
        count += PROMPT / BLOCK - if new_system { 0 } else { SYSTEM_TOKENS / BLOCK };
        out.push((w, p));
    }
    out
}

/// The engine's sequence hashes for a prompt (opaque to every index): ours, chained.
fn seq_hashes(hasher: &PrefixHasher, tokens: &[u32]) -> Vec<u64> {
    hasher
        .hash(tokens)
        .into_iter()
        .map(BlockHash::get)
        .collect()
}

struct Ours {
    tree: RadixTree,
}

/// kv-index's two chain indexes behind the calls this bench makes, with this bench's worker
/// numbers (the sharded index's ids carry the shard).
trait KvChain {
    fn with_workers(workers: u32) -> Self;
    fn store(&self, w: u32, blocks: &[StoredBlock], parent: Option<u64>, map: &mut ChainBlockMap);
    fn remove(&self, w: u32, seq: &[u64], map: &mut ChainBlockMap);
    fn score(&self, hashes: &[ContentHash]) -> u32;
    fn remove_worker(&self, w: u32, map: ChainBlockMap);
}

fn sequence_hashes(seq: &[u64]) -> Vec<SequenceHash> {
    seq.iter().map(|&s| SequenceHash(s)).collect()
}

impl KvChain for ChainIndex {
    fn with_workers(_: u32) -> Self {
        ChainIndex::new()
    }
    fn store(&self, w: u32, blocks: &[StoredBlock], parent: Option<u64>, map: &mut ChainBlockMap) {
        let _ = self.apply_stored(w, blocks, parent.map(SequenceHash), map);
    }
    fn remove(&self, w: u32, seq: &[u64], map: &mut ChainBlockMap) {
        self.apply_removed(w, &sequence_hashes(seq), map);
    }
    fn score(&self, hashes: &[ContentHash]) -> u32 {
        let mut n = 0;
        self.score_into(hashes, |h| h.0, false, |_, s| n += s);
        n
    }
    fn remove_worker(&self, w: u32, map: ChainBlockMap) {
        ChainIndex::remove_worker(self, w, map);
    }
}

const SHARDS: u32 = 2;

fn sharded_id(w: u32) -> u32 {
    ((w % SHARDS) << kv_index::sharded::SHARD_SHIFT) | (w / SHARDS)
}

impl KvChain for ShardedChainIndex {
    fn with_workers(workers: u32) -> Self {
        ShardedChainIndex::new(SHARDS as usize, workers.div_ceil(SHARDS) as usize)
    }
    fn store(&self, w: u32, blocks: &[StoredBlock], parent: Option<u64>, map: &mut ChainBlockMap) {
        let _ = self.apply_stored(sharded_id(w), blocks, parent.map(SequenceHash), map);
    }
    fn remove(&self, w: u32, seq: &[u64], map: &mut ChainBlockMap) {
        self.apply_removed(sharded_id(w), &sequence_hashes(seq), map);
    }
    fn score(&self, hashes: &[ContentHash]) -> u32 {
        let mut n = 0;
        self.score_into(hashes, |h| h.0, false, |_, s| n += s);
        n
    }
    fn remove_worker(&self, w: u32, map: ChainBlockMap) {
        ShardedChainIndex::remove_worker(self, sharded_id(w), map);
    }
}

/// A kv-index chain index with one lane map per worker.
struct KvIndex<C> {
    index: C,
    maps: Vec<ChainBlockMap>,
}

impl<C: KvChain> KvIndex<C> {
    fn load(workers: u32, prompts: &[(u32, Vec<u32>)], seqs: &[Vec<u64>]) -> Self {
        let mut kv = KvIndex {
            index: C::with_workers(workers),
            maps: (0..workers).map(|_| ChainBlockMap::new()).collect(),
        };
        for ((w, p), s) in prompts.iter().zip(seqs) {
            kv.index
                .store(*w, &kv_blocks(p, s), None, &mut kv.maps[*w as usize]);
        }
        kv
    }

    /// Stores a run (or removes blocks) as the store8 bench's `op`.
    fn op(&mut self, remove: bool, w: u32, parent: Option<u64>, tokens: &[u32], seq: &[u64]) {
        let map = &mut self.maps[w as usize];
        if remove {
            self.index.remove(w, seq, map);
        } else {
            self.index.store(w, &kv_blocks(tokens, seq), parent, map);
        }
    }
}

struct Dynamo {
    tree: dynamo_kv_router::RadixTree,
    events: u64,
}

fn kv_blocks(tokens: &[u32], seq: &[u64]) -> Vec<StoredBlock> {
    tokens
        .chunks_exact(BLOCK)
        .zip(seq)
        .map(|(t, &s)| StoredBlock {
            seq_hash: SequenceHash(s),
            content_hash: kv_index::compute_content_hash(t),
        })
        .collect()
}

fn dynamo_store(
    worker: u32,
    id: u64,
    parent: Option<u64>,
    tokens: &[u32],
    seq: &[u64],
) -> RouterEvent {
    let local = compute_block_hash_for_seq(tokens, BLOCK as u32, BlockHashOptions::default());
    let blocks = local
        .iter()
        .zip(seq)
        .map(|(&l, &s)| KvCacheStoredBlockData {
            block_hash: ExternalSequenceBlockHash(s),
            tokens_hash: l,
            mm_extra_info: None,
        })
        .collect();
    RouterEvent::new(
        u64::from(worker),
        KvCacheEvent {
            event_id: id,
            data: KvCacheEventData::Stored(KvCacheStoreData {
                parent_hash: parent.map(ExternalSequenceBlockHash),
                start_position: None,
                blocks,
            }),
            dp_rank: 0,
        },
    )
}

fn dynamo_remove(worker: u32, id: u64, seq: &[u64]) -> RouterEvent {
    RouterEvent::new(
        u64::from(worker),
        KvCacheEvent {
            event_id: id,
            data: KvCacheEventData::Removed(KvCacheRemoveData {
                block_hashes: seq.iter().map(|&s| ExternalSequenceBlockHash(s)).collect(),
            }),
            dp_rank: 0,
        },
    )
}

/// The median time of `routine` over 15 fresh setups, printed as criterion prints a result.
/// The routine returns the structure, so that dropping it is not timed.
fn remove_worker_median<T, R: FnOnce() -> T>(id: &str, mut setup: impl FnMut() -> R) {
    let mut times: Vec<Duration> = (0..15)
        .map(|_| {
            let routine = setup();
            let start = Instant::now();
            let kept = routine();
            let elapsed = start.elapsed();
            drop(kept);
            elapsed
        })
        .collect();
    times.sort();
    let ns = |d: Duration| d.as_nanos();
    println!(
        "peers/remove_worker/{id}\n                        time:   [{} ns {} ns {} ns]",
        ns(times[3]),
        ns(times[7]),
        ns(times[11])
    );
}

/// A freshly loaded kv-index chain index, and the timed removal of `victim` from it.
fn kv_remove_worker<C: KvChain>(
    workers: u32,
    prompts: &[(u32, Vec<u32>)],
    seqs: &[Vec<u64>],
    victim: u32,
) -> impl FnOnce() -> C {
    let mut kv = KvIndex::<C>::load(workers, prompts, seqs);
    let map = std::mem::take(&mut kv.maps[victim as usize]);
    move || {
        kv.index.remove_worker(victim, map);
        kv.index
    }
}

fn chained_tree() -> RadixTree {
    let mut c = TreeConfig::default();
    c.chained = true;
    c.max_blocks = usize::MAX;
    c.max_nodes = usize::MAX;
    RadixTree::with_config(c).unwrap()
}

/// Every structure loaded with the same prompts (128-block store events where the structure
/// takes events), with the bytes each allocated per (block, worker) pair recorded.
struct Loaded {
    ours: Ours,
    index: CacheIndex,
    kv: KvIndex<ChainIndex>,
    sharded: KvIndex<ShardedChainIndex>,
    token_tree: TokenTree,
    dynamo: Dynamo,
    pool: ThreadPoolIndexer<ConcurrentRadixTreeCompressed>,
}

impl Loaded {
    fn new(
        hasher: &PrefixHasher,
        workers: u32,
        pairs: usize,
        prompts: &[(u32, Vec<u32>)],
        seqs: &[Vec<u64>],
        memory_rows: &mut Vec<String>,
    ) -> Self {
        // Load each structure, counting what it allocates.
        let before = allocated();
        let mut ours = Ours {
            tree: chained_tree(),
        };
        for (w, p) in prompts {
            ours.tree.insert(WorkerId::new(*w), &hasher.hash(p));
        }
        let ours_bytes = allocated() - before;
        let before = allocated();
        let index = CacheIndex::new(IndexConfig::default()).unwrap();
        for ((w, p), s) in prompts.iter().zip(seqs) {
            let e = CacheEvent::stored(None, s.clone(), p.clone());
            index.apply_event(WorkerId::new(*w), 0, &e).unwrap();
        }
        let ours_events_bytes = allocated() - before;
        let before = allocated();
        let kv = KvIndex::<ChainIndex>::load(workers, prompts, seqs);
        let kv_bytes = allocated() - before;
        let before = allocated();
        let sharded = KvIndex::<ShardedChainIndex>::load(workers, prompts, seqs);
        let sharded_bytes = allocated() - before;
        let before = allocated();
        let token_tree = TokenTree::new();
        let names: Vec<String> = (0..workers).map(|w| format!("w{w}")).collect();
        for (w, p) in prompts {
            token_tree.insert_tokens(p, &names[*w as usize]);
        }
        let token_tree_bytes = allocated() - before;
        let before = allocated();
        let mut dynamo = Dynamo {
            tree: dynamo_kv_router::RadixTree::new(),
            events: 0,
        };
        for ((w, p), s) in prompts.iter().zip(seqs) {
            dynamo.events += 1;
            dynamo
                .tree
                .apply_event(dynamo_store(*w, dynamo.events, None, p, s))
                .unwrap();
        }
        let dynamo_bytes = allocated() - before;
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let before = allocated();
        let pool = ThreadPoolIndexer::new(ConcurrentRadixTreeCompressed::new(), 2, BLOCK as u32);
        for (i, ((w, p), s)) in prompts.iter().zip(seqs).enumerate() {
            rt.block_on(pool.apply_event_and_wait(dynamo_store(*w, i as u64 + 1, None, p, s)))
                .unwrap();
        }
        let pool_bytes = allocated() - before;
        let held: usize = (0..workers)
            .map(|w| ours.tree.worker_block_count(WorkerId::new(w)))
            .sum();
        for (name, bytes) in [
            ("prefix-router RadixTree (routing mirror)", ours_bytes),
            ("prefix-router CacheIndex fed by events", ours_events_bytes),
            ("kv-index ChainIndex", kv_bytes),
            ("kv-index ShardedChainIndex (2 shards)", sharded_bytes),
            ("kv-index TokenTree", token_tree_bytes),
            ("dynamo-kv-router RadixTree", dynamo_bytes),
            (
                "dynamo-kv-router ThreadPoolIndexer<ConcurrentRadixTreeCompressed>",
                pool_bytes,
            ),
        ] {
            memory_rows.push(format!(
                "memory,{workers},{pairs},{name},{:.1}",
                bytes as f64 / held as f64
            ));
        }

        Loaded {
            ours,
            index,
            kv,
            sharded,
            token_tree,
            dynamo,
            pool,
        }
    }
}

/// One structure loaded from empty by timed 128-block store events, as a router replica that
/// joins late replays the engines' events: the time per stored block, as criterion prints a
/// result (the fastest, median and slowest of 3 loads) for run.sh.
fn bulk_loads(workers: u32, label: &str, prompts: &[(u32, Vec<u32>)], seqs: &[Vec<u64>]) {
    let blocks: usize = seqs.iter().map(Vec::len).sum();
    let events: Vec<CacheEvent> = prompts
        .iter()
        .zip(seqs)
        .map(|((_, p), s)| CacheEvent::stored(None, s.clone(), p.clone()))
        .collect();
    let timed = |name: &str, load: &mut dyn FnMut() -> Duration| {
        let mut ns: Vec<f64> = (0..3)
            .map(|_| load().as_nanos() as f64 / blocks as f64)
            .collect();
        ns.sort_by(f64::total_cmp);
        println!(
            "peers/load/{name}/{label}\n                        time:   [{:.1} ns {:.1} ns {:.1} ns]",
            ns[0], ns[1], ns[2]
        );
    };
    timed("prefix-router", &mut || {
        let index = CacheIndex::new(IndexConfig::default()).unwrap();
        let start = Instant::now();
        for ((w, _), e) in prompts.iter().zip(&events) {
            index.apply_event(WorkerId::new(*w), 0, e).unwrap();
        }
        start.elapsed()
    });
    timed("kv-index-ChainIndex", &mut || {
        let start = Instant::now();
        let kv = KvIndex::<ChainIndex>::load(workers, prompts, seqs);
        let elapsed = start.elapsed();
        drop(kv);
        elapsed
    });
    timed("dynamo-RadixTree", &mut || {
        let mut tree = dynamo_kv_router::RadixTree::new();
        let start = Instant::now();
        for (i, ((w, p), s)) in prompts.iter().zip(seqs).enumerate() {
            tree.apply_event(dynamo_store(*w, i as u64 + 1, None, p, s))
                .unwrap();
        }
        start.elapsed()
    });
}

/// Bytes per additional holder: every prompt of a loaded event-fed mirror stored again by
/// the next worker, the growth divided by the pairs added.
fn extra_holders(
    workers: u32,
    pairs: usize,
    prompts: &[(u32, Vec<u32>)],
    seqs: &[Vec<u64>],
    memory_rows: &mut Vec<String>,
) {
    let index = CacheIndex::new(IndexConfig::default()).unwrap();
    let mut dynamo = dynamo_kv_router::RadixTree::new();
    for (i, ((w, p), s)) in prompts.iter().zip(seqs).enumerate() {
        let e = CacheEvent::stored(None, s.clone(), p.clone());
        index.apply_event(WorkerId::new(*w), 0, &e).unwrap();
        dynamo
            .apply_event(dynamo_store(*w, i as u64 + 1, None, p, s))
            .unwrap();
    }
    let held = |index: &CacheIndex| -> usize {
        index.with_tree(|t| {
            (0..workers)
                .map(|w| t.worker_block_count(WorkerId::new(w)))
                .sum()
        })
    };
    let before_pairs = held(&index);
    let before = allocated();
    for ((w, p), s) in prompts.iter().zip(seqs) {
        let e = CacheEvent::stored(None, s.clone(), p.clone());
        index
            .apply_event(WorkerId::new((*w + 1) % workers), 0, &e)
            .unwrap();
    }
    let added = (held(&index) - before_pairs).max(1);
    let ours = (allocated() - before) as f64 / added as f64;
    let before = allocated();
    let offset = prompts.len() as u64 + 1;
    for (i, ((w, p), s)) in prompts.iter().zip(seqs).enumerate() {
        dynamo
            .apply_event(dynamo_store(
                (*w + 1) % workers,
                offset + i as u64,
                None,
                p,
                s,
            ))
            .unwrap();
    }
    let theirs = (allocated() - before) as f64 / added as f64;
    memory_rows.push(format!(
        "memory,{workers},{pairs},prefix-router CacheIndex fed by events: per additional holder,{ours:.1}"
    ));
    memory_rows.push(format!(
        "memory,{workers},{pairs},dynamo-kv-router RadixTree: per additional holder,{theirs:.1}"
    ));
}

fn bench(c: &mut Criterion) {
    let hasher = PrefixHasher::new(BLOCK).unwrap();
    let mut memory_rows = Vec::new();
    let mut group = c.benchmark_group("peers");
    group
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(30);
    let load_only = std::env::var("PEERS_ONLY").is_ok_and(|v| v == "load");
    for workers in [16u32, 256] {
        for pairs in [10_000usize, 100_000, 1_000_000] {
            if load_only && pairs != 1_000_000 {
                continue;
            }
            let prompts = workload(pairs, workers, 7);
            let seqs: Vec<Vec<u64>> = prompts
                .iter()
                .map(|(_, p)| seq_hashes(&hasher, p))
                .collect();
            let label = format!("w{workers}/pairs{pairs}");
            let loaded = Loaded::new(&hasher, workers, pairs, &prompts, &seqs, &mut memory_rows);
            let Loaded {
                ours,
                index,
                mut kv,
                mut sharded,
                token_tree,
                mut dynamo,
                pool,
            } = loaded;
            if pairs == 1_000_000 {
                bulk_loads(workers, &label, &prompts, &seqs);
                extra_holders(workers, pairs, &prompts, &seqs, &mut memory_rows);
            }
            if load_only {
                continue;
            }
            // Full-hit queries: recently cached prompts.
            let queries: Vec<&Vec<u32>> = prompts.iter().rev().take(64).map(|(_, p)| p).collect();
            let our_blocks: Vec<Vec<BlockHash>> = queries.iter().map(|p| hasher.hash(p)).collect();
            let kv_hashes: Vec<Vec<ContentHash>> = queries
                .iter()
                .map(|p| kv_index::compute_request_content_hashes(p, BLOCK))
                .collect();
            let dyn_hashes: Vec<Vec<LocalBlockHash>> = queries
                .iter()
                .map(|p| compute_block_hash_for_seq(p, BLOCK as u32, BlockHashOptions::default()))
                .collect();
            let mut m = PrefixMatch::new();
            let mut i = 0;
            let mut next = move || {
                i = (i + 1) % 64;
                i
            };
            group.bench_function(BenchmarkId::new("match/prefix-router", &label), |b| {
                b.iter(|| {
                    ours.tree
                        .match_prefix_into(black_box(&our_blocks[next()]), &mut m);
                    m.len()
                })
            });
            group.bench_function(BenchmarkId::new("match/kv-index-ChainIndex", &label), |b| {
                b.iter(|| kv.index.score(black_box(&kv_hashes[next()])))
            });
            group.bench_function(BenchmarkId::new("match/kv-index-Sharded", &label), |b| {
                b.iter(|| sharded.index.score(black_box(&kv_hashes[next()])))
            });
            group.bench_function(BenchmarkId::new("match/dynamo-RadixTree", &label), |b| {
                b.iter(|| {
                    dynamo
                        .tree
                        .find_matches(black_box(dyn_hashes[next()].clone()), false)
                        .scores
                        .len()
                })
            });
            group.bench_function(BenchmarkId::new("match/dynamo-ThreadPool", &label), |b| {
                b.iter(|| {
                    pool.backend()
                        .find_matches(black_box(&dyn_hashes[next()]), false)
                        .scores
                        .len()
                })
            });
            group.bench_function(BenchmarkId::new("hash+match/prefix-router", &label), |b| {
                let mut out = Vec::new();
                b.iter(|| {
                    hasher.hash_into(black_box(queries[next()]), &mut out);
                    ours.tree.match_prefix_into(&out, &mut m);
                    m.len()
                })
            });
            let kv_hash = |q: &[u32]| kv_index::compute_request_content_hashes(q, BLOCK);
            group.bench_function(
                BenchmarkId::new("hash+match/kv-index-ChainIndex", &label),
                |b| b.iter(|| kv.index.score(&kv_hash(black_box(queries[next()])))),
            );
            group.bench_function(
                BenchmarkId::new("hash+match/kv-index-Sharded", &label),
                |b| b.iter(|| sharded.index.score(&kv_hash(black_box(queries[next()])))),
            );
            group.bench_function(
                BenchmarkId::new("hash+match/kv-index-TokenTree", &label),
                |b| {
                    b.iter(|| {
                        token_tree
                            .match_prefix_with_counts(black_box(queries[next()]))
                            .matched_token_count
                    })
                },
            );
            let dyn_hash = |q: &[u32]| {
                compute_block_hash_for_seq(q, BLOCK as u32, BlockHashOptions::default())
            };
            group.bench_function(
                BenchmarkId::new("hash+match/dynamo-ThreadPool", &label),
                |b| {
                    b.iter(|| {
                        let h = dyn_hash(black_box(queries[next()]));
                        pool.backend().find_matches(&h, false).scores.len()
                    })
                },
            );
            group.bench_function(
                BenchmarkId::new("hash+match/dynamo-RadixTree", &label),
                |b| {
                    b.iter(|| {
                        let h = dyn_hash(black_box(queries[next()]));
                        dynamo.tree.find_matches(h, false).scores.len()
                    })
                },
            );

            // Stores of 8-block runs continuing a chain, each batch removed again untimed.
            let runs: Vec<(u32, Vec<u32>, Vec<u64>)> = workload(PROMPT / BLOCK * 64, workers, 99)
                .into_iter()
                .map(|(w, p)| {
                    let s = seq_hashes(&hasher, &p);
                    (w, p, s.into_iter().map(|h| h ^ 0xA5A5).collect())
                })
                .collect();
            // `op(remove, worker, parent, tokens, seq)`: store a run, or remove blocks.
            type Op<'a> = dyn FnMut(bool, u32, Option<u64>, &[u32], &[u64]) + 'a;
            let store = |b: &mut criterion::Bencher<'_>, op: &mut Op<'_>| {
                b.iter_custom(|iters| {
                    let mut timed = Duration::ZERO;
                    let (mut done, mut p) = (0u64, 0usize);
                    while done < iters {
                        let (w, tokens, seq) = &runs[p % runs.len()];
                        let n = (iters - done).min(16) as usize;
                        let start = Instant::now();
                        for k in 0..n {
                            let parent = k.checked_sub(1).map(|j| seq[j * 8 + 7]);
                            op(
                                false,
                                *w,
                                parent,
                                &tokens[k * 128..k * 128 + 128],
                                &seq[k * 8..k * 8 + 8],
                            );
                        }
                        timed += start.elapsed();
                        op(true, *w, None, &[], &seq[..n * 8]);
                        done += n as u64;
                        p += 1;
                    }
                    timed
                })
            };
            group.bench_function(BenchmarkId::new("store8/prefix-router", &label), |b| {
                store(b, &mut |remove, w, parent, tokens, seq| {
                    let e = if remove {
                        CacheEvent::removed(seq.to_vec())
                    } else {
                        CacheEvent::stored(parent, seq.to_vec(), tokens.to_vec())
                    };
                    index.apply_event(WorkerId::new(w), 0, &e).unwrap();
                })
            });
            group.bench_function(
                BenchmarkId::new("store8/kv-index-ChainIndex", &label),
                |b| store(b, &mut |r, w, parent, t, seq| kv.op(r, w, parent, t, seq)),
            );
            group.bench_function(BenchmarkId::new("store8/kv-index-Sharded", &label), |b| {
                store(b, &mut |r, w, parent, t, seq| {
                    sharded.op(r, w, parent, t, seq)
                })
            });
            group.bench_function(BenchmarkId::new("store8/dynamo-RadixTree", &label), |b| {
                store(b, &mut |remove, w, parent, tokens, seq| {
                    dynamo.events += 1;
                    let event = if remove {
                        dynamo_remove(w, dynamo.events, seq)
                    } else {
                        dynamo_store(w, dynamo.events, parent, tokens, seq)
                    };
                    let _ = dynamo.tree.apply_event(event);
                })
            });
            drop(pool);

            if pairs <= 100_000 {
                // Removing a worker destroys the structure, so each measurement needs a fresh
                // one: the median of 15 removals, each on a newly loaded structure (untimed),
                // printed in criterion's format for run.sh.
                let victim = prompts[0].0;
                remove_worker_median(&format!("prefix-router/{label}"), || {
                    let mut tree = chained_tree();
                    for (w, p) in &prompts {
                        tree.insert(WorkerId::new(*w), &hasher.hash(p));
                    }
                    move || {
                        tree.remove_worker(WorkerId::new(victim));
                        tree
                    }
                });
                remove_worker_median(&format!("kv-index-ChainIndex/{label}"), || {
                    kv_remove_worker::<ChainIndex>(workers, &prompts, &seqs, victim)
                });
                remove_worker_median(&format!("kv-index-Sharded/{label}"), || {
                    kv_remove_worker::<ShardedChainIndex>(workers, &prompts, &seqs, victim)
                });
                remove_worker_median(&format!("dynamo-RadixTree/{label}"), || {
                    let mut tree = dynamo_kv_router::RadixTree::new();
                    for (i, ((w, p), s)) in prompts.iter().zip(&seqs).enumerate() {
                        tree.apply_event(dynamo_store(*w, i as u64 + 1, None, p, s))
                            .unwrap();
                    }
                    move || {
                        tree.remove_worker(u64::from(victim));
                        tree
                    }
                });
            }
        }
    }
    group.finish();
    for row in memory_rows {
        println!("{row}");
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
