//! The cache index: a `PrefixHasher` and a `RadixTree` shared by the cache-aware policies.

use std::sync::{Mutex, MutexGuard, PoisonError};

use smallvec::SmallVec;

use super::{Candidate, RouteRequest, Selection};
use crate::{BlockHash, Error, HashAlgorithm, PrefixHasher, RadixTree, TreeConfig, WorkerId};

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
    tree: Mutex<RadixTree>,
    capacity: Option<usize>,
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
            tree: Mutex::new(RadixTree::with_config(config.tree)),
            capacity: config.worker_capacity_blocks,
        })
    }

    /// The hasher the index uses.
    #[must_use]
    pub fn hasher(&self) -> &PrefixHasher {
        &self.hasher
    }

    fn lock(&self) -> MutexGuard<'_, RadixTree> {
        // Nothing panics while holding the lock; a poisoned lock still holds a valid tree.
        self.tree.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the tree under the lock (inspection, validation, tests).
    pub fn with_tree<T>(&self, f: impl FnOnce(&RadixTree) -> T) -> T {
        f(&self.lock())
    }

    /// Bytes allocated by the mirror.
    #[must_use]
    pub fn memory_bytes(&self) -> usize {
        self.lock().memory_bytes() + core::mem::size_of::<Self>()
    }

    /// How many leading tokens of `tokens` (salted with `salt`) `worker` is believed to hold.
    #[must_use]
    pub fn cached_tokens(&self, worker: WorkerId, salt: &[u8], tokens: &[crate::TokenId]) -> usize {
        let mut blocks = Blocks::new();
        self.hasher.hash_salted_small(salt, tokens, &mut blocks);
        self.lock().held_prefix(worker, &blocks) * self.hasher.block_size()
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
        let mut tree = self.lock();
        let matched = &mut scored.matched;
        tree.for_each_match(&scored.blocks, |worker, m| {
            if let Some(slot) = matched.get_mut(worker.index()) {
                *slot = m as u32;
            }
        });
        let chosen = choose(scored);
        if let Some(c) = candidates.get(chosen) {
            tree.insert(c.worker, &scored.blocks);
        }
        chosen
    }

    /// Forgets `worker`'s mirror, and applies the configured capacity to it afresh.
    pub(crate) fn reset_worker(&self, worker: WorkerId) {
        let mut tree = self.lock();
        tree.remove_worker(worker);
        if let Some(capacity) = self.capacity {
            tree.set_capacity(worker, capacity);
        }
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
