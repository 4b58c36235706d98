//! The cache index: a `PrefixHasher` and a `RadixTree` shared by the cache-aware policies.

use std::sync::{Mutex, MutexGuard, PoisonError};

use smallvec::SmallVec;

use super::{Candidate, RouteRequest, Selection};
use crate::sync::{CacheEvent, CacheSync, SyncOutcome, SyncState};
use crate::{
    BlockHash, Error, HashAlgorithm, PrefixHasher, RadixTree, TokenId, TreeConfig, WorkerId,
};

/// How a [`CacheIndex`] hashes and bounds its mirror.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct IndexConfig {
    /// Tokens per block; must equal the engines' block size. Default 16 (vLLM's default).
    pub block_size: usize,
    /// Hash algorithm. Default [`HashAlgorithm::Xxh3`].
    pub algorithm: HashAlgorithm,
    /// Hash seed; keep it secret where clients may be hostile. Default
    /// [`PrefixHasher::DEFAULT_SEED`].
    pub seed: u64,
    /// Memory bounds of the mirror. Default: [`TreeConfig::default`] with `chained` set
    /// (the index only ever holds chains from its hasher).
    pub tree: TreeConfig,
    /// Blocks each worker is believed to cache at most (its KV capacity); beyond it the
    /// mirror forgets the worker's least recently routed blocks. Default `None`: unbounded
    /// per worker (the tree's global bounds still apply).
    pub worker_capacity_blocks: Option<usize>,
    /// For mirrors kept without events: a worker's blocks expire once this many prefixes
    /// have been routed (or stored) since they were last routed to it; checked every 16
    /// routes. Logical time, deterministic. Default `None`: no expiry.
    pub ttl: Option<u64>,
}

impl Default for IndexConfig {
    fn default() -> Self {
        Self {
            block_size: super::DEFAULT_BLOCK_SIZE,
            algorithm: HashAlgorithm::Xxh3,
            seed: PrefixHasher::DEFAULT_SEED,
            tree: TreeConfig {
                chained: true,
                ..TreeConfig::default()
            },
            worker_capacity_blocks: None,
            ttl: None,
        }
    }
}

/// Block hashes of one request, on the stack for prompts of up to 256 blocks.
pub(crate) type Blocks = SmallVec<[BlockHash; 256]>;

/// Matched blocks per worker id, on the stack for up to 64 workers.
pub(crate) type Matched = SmallVec<[u32; 64]>;

/// A thread-safe mirror of every worker's prefix cache: a [`PrefixHasher`] and a
/// [`RadixTree`] behind a mutex. Hashing happens outside the lock; the lock is held only for
/// a walk or an insert.
#[derive(Debug)]
pub struct CacheIndex {
    hasher: PrefixHasher,
    mirror: Mutex<Mirror>,
    capacity: Option<usize>,
    ttl: Option<u64>,
}

/// What the index's lock guards: the tree and the event-sync state that feeds it.
#[derive(Debug)]
struct Mirror {
    tree: RadixTree,
    sync: SyncState,
}

impl CacheIndex {
    /// An empty index.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidBlockSize`] for a block size of 0 or above
    /// [`PrefixHasher::MAX_BLOCK_SIZE`].
    pub fn new(config: IndexConfig) -> Result<Self, Error> {
        let hasher = PrefixHasher::with_algorithm(config.block_size, config.algorithm)?
            .with_seed(config.seed);
        Ok(Self {
            hasher,
            mirror: Mutex::new(Mirror {
                tree: RadixTree::with_config(config.tree),
                sync: SyncState::default(),
            }),
            capacity: config.worker_capacity_blocks,
            ttl: config.ttl,
        })
    }

    /// A fleet of workers `0..num_workers` and an index over it, each worker's mirror
    /// bounded as configured: what every cache-aware policy starts from.
    pub(crate) fn with_fleet(
        num_workers: u32,
        config: IndexConfig,
    ) -> Result<(super::Fleet, Self), Error> {
        let fleet = super::Fleet::new(num_workers)?;
        let index = Self::new(config)?;
        for w in fleet.workers() {
            index.reset_worker(w);
        }
        Ok((fleet, index))
    }

    /// The hasher the index uses.
    #[must_use]
    pub fn hasher(&self) -> &PrefixHasher {
        &self.hasher
    }

    fn lock(&self) -> MutexGuard<'_, Mirror> {
        // Nothing panics while holding the lock; a poisoned lock still holds a valid tree.
        self.mirror.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the tree under the lock (inspection, validation, tests).
    pub fn with_tree<T>(&self, f: impl FnOnce(&RadixTree) -> T) -> T {
        f(&self.lock().tree)
    }

    /// Bytes allocated by the mirror: the tree and the engine-hash maps of event sync.
    #[must_use]
    pub fn memory_bytes(&self) -> usize {
        let mirror = self.lock();
        mirror.tree.memory_bytes() + mirror.sync.memory_bytes() + core::mem::size_of::<Self>()
    }

    /// How many leading tokens of `tokens` (salted with `salt`) `worker` is believed to hold.
    #[must_use]
    pub fn cached_tokens(&self, worker: WorkerId, salt: &[u8], tokens: &[crate::TokenId]) -> usize {
        let mut blocks = Blocks::new();
        self.hasher.hash_salted_small(salt, tokens, &mut blocks);
        self.lock().tree.held_prefix(worker, &blocks) * self.hasher.block_size()
    }

    /// Hashes the request's full blocks into `out` (no lock held).
    pub(crate) fn hash_request(&self, request: &RouteRequest<'_>, out: &mut Blocks) {
        out.clear();
        self.hasher
            .hash_salted_small(request.salt(), request.tokens(), out);
    }

    /// Under one lock: matches the request's blocks (filling `scored.matched` per worker id,
    /// for the candidates' ids), lets `choose` pick a candidate from that, and records the
    /// prefix as held by the chosen worker (optimistically: it will be cached there once the
    /// request runs). Returns the chosen index.
    fn match_choose_insert(
        &self,
        scored: &mut Scored,
        candidates: &[Candidate],
        choose: impl FnOnce(&Scored) -> usize,
    ) -> usize {
        let slots = candidates.last().map_or(0, |c| c.worker.index() + 1);
        scored.matched.clear();
        scored.matched.resize(slots, 0);
        if scored.blocks.is_empty() {
            return choose(scored);
        }
        let mut mirror = self.lock();
        let tree = &mut mirror.tree;
        let matched = &mut scored.matched;
        tree.for_each_match(&scored.blocks, |worker, m| {
            if let Some(slot) = matched.get_mut(worker.index()) {
                *slot = m as u32;
            }
        });
        let chosen = choose(scored);
        if let Some(c) = candidates.get(chosen) {
            tree.insert(c.worker, &scored.blocks);
            if let Some(ttl) = self.ttl {
                if tree.clock() % 16 == 0 {
                    tree.expire(tree.clock().saturating_sub(ttl));
                }
            }
        }
        chosen
    }

    /// Forgets `worker`'s mirror, and applies the configured capacity to it afresh.
    pub(crate) fn reset_worker(&self, worker: WorkerId) {
        let mirror = &mut *self.lock();
        mirror.tree.remove_worker(worker);
        mirror.sync.forget(worker);
        if let Some(capacity) = self.capacity {
            mirror.tree.set_capacity(worker, capacity);
        }
    }
}

impl CacheSync for CacheIndex {
    fn apply_event(
        &self,
        worker: WorkerId,
        seq: u64,
        event: &CacheEvent,
    ) -> Result<SyncOutcome, Error> {
        let mirror = &mut *self.lock();
        mirror
            .sync
            .apply(&self.hasher, &mut mirror.tree, worker, seq, event)
    }

    fn replace_worker_cache(&self, worker: WorkerId, prefixes: &[&[TokenId]]) -> Result<(), Error> {
        let mirror = &mut *self.lock();
        mirror
            .sync
            .replace(&self.hasher, &mut mirror.tree, worker, prefixes)
    }

    fn report_cached(
        &self,
        worker: WorkerId,
        tokens: &[TokenId],
        cached_tokens: usize,
    ) -> Result<(), Error> {
        self.report_cached_salted(worker, &[], tokens, cached_tokens)
    }

    fn report_cached_salted(
        &self,
        worker: WorkerId,
        salt: &[u8],
        tokens: &[TokenId],
        cached_tokens: usize,
    ) -> Result<(), Error> {
        let mirror = &mut *self.lock();
        mirror.sync.report(
            &self.hasher,
            &mut mirror.tree,
            worker,
            salt,
            tokens,
            cached_tokens,
        )
    }
}

/// The shared part of the cache-aware policies: hash the request outside any lock, then
/// match, choose and insert under one lock.
pub(crate) struct Scored {
    pub(crate) blocks: Blocks,
    pub(crate) matched: Matched,
    pub(crate) block_size: usize,
    pub(crate) tokens: usize,
}

impl Scored {
    /// Hashes `request`, then matches it and applies `choose` under the index's lock.
    /// Returns the chosen candidate's index and the scoring state.
    pub(crate) fn route(
        index: &CacheIndex,
        request: &RouteRequest<'_>,
        candidates: &[Candidate],
        choose: impl FnOnce(&Scored) -> usize,
    ) -> (usize, Scored) {
        let mut scored = Scored {
            blocks: Blocks::new(),
            matched: Matched::new(),
            block_size: index.hasher.block_size(),
            tokens: request.tokens().len(),
        };
        index.hash_request(request, &mut scored.blocks);
        let chosen = index.match_choose_insert(&mut scored, candidates, choose);
        (chosen, scored)
    }

    /// Leading blocks `candidate` holds.
    #[inline]
    pub(crate) fn blocks_of(&self, candidate: &Candidate) -> usize {
        self.matched
            .get(candidate.worker.index())
            .map_or(0, |&m| m as usize)
    }

    /// Prompt tokens `candidate` holds.
    #[inline]
    pub(crate) fn cached_of(&self, candidate: &Candidate) -> usize {
        (self.blocks_of(candidate) * self.block_size).min(self.tokens)
    }

    /// The fraction of the prompt `candidate` holds, `0..=1`.
    #[inline]
    pub(crate) fn fraction_of(&self, candidate: &Candidate) -> f64 {
        if self.tokens == 0 {
            0.0
        } else {
            self.cached_of(candidate) as f64 / self.tokens as f64
        }
    }

    /// The selection for candidate `chosen`.
    pub(crate) fn selection(&self, candidates: &[Candidate], chosen: usize) -> Selection {
        let candidate = candidates[chosen];
        Selection {
            candidate,
            matched_blocks: self.blocks_of(&candidate),
            cached_tokens: self.cached_of(&candidate),
        }
    }
}
