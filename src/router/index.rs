//! The cache index: a `PrefixHasher` and a `RadixTree` behind one lock, the mirror every router keeps.

use std::sync::{Mutex, MutexGuard, PoisonError};

use smallvec::SmallVec;

use super::{Candidate, RouteRequest};
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

impl IndexConfig {
    crate::config::setters! {
        /// Sets [`block_size`](Self::block_size).
        with_block_size: block_size: usize;
        /// Sets [`algorithm`](Self::algorithm).
        with_algorithm: algorithm: HashAlgorithm;
        /// Sets [`seed`](Self::seed).
        with_seed: seed: u64;
        /// Sets [`tree`](Self::tree).
        with_tree: tree: TreeConfig;
        /// Sets [`worker_capacity_blocks`](Self::worker_capacity_blocks).
        with_worker_capacity_blocks: worker_capacity_blocks: Option<usize>;
        /// Sets [`ttl`](Self::ttl).
        with_ttl: ttl: Option<u64>;
    }

    /// Checks every field.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidBlockSize`] for a block size of 0 or above
    /// [`PrefixHasher::MAX_BLOCK_SIZE`]; [`Error::InvalidConfig`] for a tree bound of 0, a
    /// worker capacity of 0 blocks or a time-to-live of 0.
    pub fn validate(&self) -> Result<(), Error> {
        PrefixHasher::check_block_size(self.block_size)?;
        self.tree.validate()?;
        if let Some(capacity) = self.worker_capacity_blocks {
            crate::config::int("worker_capacity_blocks", capacity, 1.., "at least 1 block")?;
        }
        if let Some(ttl) = self.ttl {
            crate::config::int("ttl", ttl, 1.., "at least 1 routed prefix")?;
        }
        Ok(())
    }
}

/// Block hashes of one request, on the stack for prompts of up to 256 blocks.
pub(crate) type Blocks = SmallVec<[BlockHash; 256]>;

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
    /// As [`IndexConfig::validate`].
    pub fn new(config: IndexConfig) -> Result<Self, Error> {
        config.validate()?;
        let hasher = PrefixHasher::with_algorithm(config.block_size, config.algorithm)?
            .with_seed(config.seed);
        Ok(Self {
            hasher,
            mirror: Mutex::new(Mirror {
                tree: RadixTree::with_config(config.tree)?,
                sync: SyncState::default(),
            }),
            capacity: config.worker_capacity_blocks,
            ttl: config.ttl,
        })
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

    /// Under one lock: matches `blocks` (the request's, `tokens` long), writes each
    /// candidate's matched blocks and cached tokens, lets `choose` pick one, and records the
    /// prefix as held by the chosen worker (it will be cached there once the request runs).
    /// Returns the chosen index (out of range: nothing is recorded).
    pub(crate) fn match_choose_insert(
        &self,
        blocks: &[BlockHash],
        tokens: usize,
        candidates: &mut [Candidate],
        choose: impl FnOnce(&[Candidate]) -> usize,
    ) -> usize {
        let block_size = self.hasher.block_size();
        let mut mirror = self.lock();
        let tree = &mut mirror.tree;
        tree.for_each_match(blocks, |worker, m| {
            // Candidates are in id order, usually one per id from 0.
            let slot = match candidates.get(worker.index()) {
                Some(c) if c.worker == worker => Some(worker.index()),
                _ => candidates.binary_search_by_key(&worker, |c| c.worker).ok(),
            };
            if let Some(c) = slot.map(|i| &mut candidates[i]) {
                c.matched_blocks = u32::try_from(m).unwrap_or(u32::MAX);
                let cached = (m * block_size).min(tokens);
                c.cached_tokens = u32::try_from(cached).unwrap_or(u32::MAX);
            }
        });
        let chosen = choose(candidates);
        if let Some(c) = candidates.get(chosen) {
            tree.insert(c.worker, blocks);
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
