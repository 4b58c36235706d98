//! Seeded workloads shared by the benches: Zipf-popular system prompts plus unique tails.

#![allow(dead_code, unreachable_pub)]

use prefix_router::{
    BlockHash, CacheEvent, CacheIndex, CacheSync, IndexConfig, RadixTree, TreeConfig, WorkerId,
};

/// SplitMix64: small, seeded, deterministic.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Zipf(s) over ranks `0..n`, by inverse CDF.
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub fn new(n: usize, s: f64) -> Self {
        let mut cdf = Vec::with_capacity(n);
        let mut total = 0.0;
        for r in 1..=n {
            total += 1.0 / (r as f64).powf(s);
            cdf.push(total);
        }
        cdf.iter_mut().for_each(|c| *c /= total);
        Self { cdf }
    }

    pub fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.unit();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

/// Blocks per prompt: 2,048 tokens at block size 16.
pub const PROMPT_BLOCKS: usize = 128;
/// Blocks of each shared system prompt.
pub const SYSTEM_BLOCKS: usize = 32;
/// Distinct system prompts.
pub const SYSTEMS: usize = 200;

/// Seeded prompts: a Zipf-chosen system prompt, then a tail unique to the request,
/// `PROMPT_BLOCKS` blocks of `unit` items in all. Items are block hashes (synthetic random
/// values, as a hasher would produce; `unit` 1) or token IDs (`unit` 16).
pub struct Prompts<T> {
    rng: Rng,
    zipf: Zipf,
    systems: Vec<Vec<T>>,
    unit: usize,
    item: fn(&mut Rng) -> T,
}

/// Prompts as chained block hashes.
pub type Workload = Prompts<BlockHash>;

/// Prompts as token IDs (2,048 tokens).
pub type TokenWorkload = Prompts<u32>;

impl Prompts<BlockHash> {
    pub fn new(seed: u64) -> Self {
        Self::with(seed, 1, |rng| BlockHash::new(rng.next_u64()))
    }
}

impl Prompts<u32> {
    pub fn new(seed: u64) -> Self {
        Self::with(seed, 16, |rng| rng.below(151_936) as u32)
    }
}

impl<T: Clone> Prompts<T> {
    fn with(seed: u64, unit: usize, item: fn(&mut Rng) -> T) -> Self {
        let mut rng = Rng(seed);
        let systems = (0..SYSTEMS)
            .map(|_| (0..SYSTEM_BLOCKS * unit).map(|_| item(&mut rng)).collect())
            .collect();
        Self {
            rng,
            zipf: Zipf::new(SYSTEMS, 1.0),
            systems,
            unit,
            item,
        }
    }

    /// A new request: shared system prompt plus a unique tail.
    pub fn prompt(&mut self) -> Vec<T> {
        let mut p = self.systems[self.zipf.sample(&mut self.rng)].clone();
        while p.len() < PROMPT_BLOCKS * self.unit {
            p.push((self.item)(&mut self.rng));
        }
        p
    }

    /// A prompt that shares only a system prompt with what is cached.
    pub fn partial(&mut self) -> Vec<T> {
        self.prompt()
    }

    /// A prompt that shares nothing.
    pub fn miss(&mut self) -> Vec<T> {
        (0..PROMPT_BLOCKS * self.unit)
            .map(|_| (self.item)(&mut self.rng))
            .collect()
    }

    pub fn worker(&mut self, workers: u32) -> WorkerId {
        WorkerId::new(self.rng.below(u64::from(workers)) as u32)
    }
}

/// A tree loaded with prompts until it holds `pairs` (block, worker) pairs; returns it with
/// the prompts inserted (and the worker each went to).
pub fn loaded_tree(
    workers: u32,
    pairs: usize,
    seed: u64,
) -> (RadixTree, Vec<(WorkerId, Vec<BlockHash>)>, Workload) {
    let mut wl = Workload::new(seed);
    // Chained comparison, as the routers' cache index uses it: the workload's block hashes
    // name their prefixes, as a PrefixHasher's do.
    let mut config = TreeConfig::default();
    config.chained = true;
    let mut tree = RadixTree::with_config(config).unwrap();
    let mut inserted = Vec::new();
    let mut held = 0;
    while held < pairs {
        let w = wl.worker(workers);
        let p = wl.prompt();
        let before = tree.worker_block_count(w);
        tree.insert(w, &p);
        held += tree.worker_block_count(w) - before;
        inserted.push((w, p));
    }
    (tree, inserted, wl)
}

/// (block, worker) pairs held in the tree.
pub fn pairs(tree: &RadixTree, workers: u32) -> usize {
    (0..workers)
        .map(|w| tree.worker_block_count(WorkerId::new(w)))
        .sum()
}

/// Blocks per `Stored` event in the sync benches.
pub const EVENT_BLOCKS: usize = 8;

/// The `Stored` events of one 128-block prompt as an engine publishes them while it runs
/// (8-block runs, each continuing the previous one's last block; random engine hashes and
/// tokens), and the `Removed` event of all its blocks.
pub fn prompt_events(rng: &mut Rng) -> (Vec<CacheEvent>, CacheEvent) {
    let mut events = Vec::new();
    let mut parent = None;
    let mut all = Vec::new();
    for _ in 0..PROMPT_BLOCKS / EVENT_BLOCKS {
        let blocks: Vec<u64> = (0..EVENT_BLOCKS).map(|_| rng.next_u64()).collect();
        let tokens: Vec<u32> = (0..EVENT_BLOCKS * 16)
            .map(|_| rng.below(151_936) as u32)
            .collect();
        all.extend(&blocks);
        let next = blocks.last().copied();
        events.push(CacheEvent::stored(parent, blocks, tokens));
        parent = next;
    }
    (events, CacheEvent::removed(all))
}

/// A cache index holding `blocks` blocks of one worker (worker 0), fed by store events.
pub fn event_fed_index(rng: &mut Rng, blocks: usize) -> CacheIndex {
    let index = CacheIndex::new(IndexConfig::default()).unwrap();
    for _ in 0..blocks / PROMPT_BLOCKS {
        for e in prompt_events(rng).0 {
            index.apply_event(WorkerId::new(0), 0, &e).unwrap();
        }
    }
    index
}
