//! The mirror every router keeps: [`CacheIndex`], a `PrefixHasher`, a `RadixTree` and the
//! event-sync state behind one lock. Above the tree and sync, below the fleet model's users:
//! the router matches, chooses and inserts under its lock in one call.

use std::sync::{Mutex, MutexGuard, PoisonError};

use smallvec::SmallVec;

use crate::error::Error;
use crate::hash::{BlockHash, HashAlgorithm, PrefixHasher, TokenId};
use crate::request::RouteRequest;
use crate::sync::{CacheEvent, CacheSync, EngineSettings, SyncConfig, SyncOutcome, SyncState};
use crate::tree::Held;
use crate::tree::{RadixTree, TreeConfig, WorkerId};

/// Block size the routers hash with unless configured otherwise: vLLM's default.
pub const DEFAULT_BLOCK_SIZE: usize = 16;

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
    /// KV-cache groups mirrored (hybrid models report each group apart); events of groups
    /// at or beyond it are skipped and counted. 1 to 64; default 8.
    pub max_groups: u32,
    /// Blocks per chunk of a lower tier's copies: vLLM's CPU offloading copies and drops
    /// chunks of this many blocks, each named by its last block (its offloaded block size
    /// over the GPU's). At least 1; default 1.
    pub host_chunk_blocks: usize,
    /// Whether engines report each request's prefix hit again as a store (vLLM's
    /// `kv_cache_report_mode=full`, set per request): such a store, from the root, of
    /// blocks the worker would reuse whole, only refreshes them. Otherwise every store of
    /// blocks already held is a second copy, whose eviction the engine reports apart (vLLM
    /// caches a block again when it recomputes it). Default `false`.
    pub full_reports: bool,
}

impl Default for IndexConfig {
    fn default() -> Self {
        Self {
            block_size: DEFAULT_BLOCK_SIZE,
            algorithm: HashAlgorithm::Xxh3,
            seed: PrefixHasher::DEFAULT_SEED,
            tree: TreeConfig {
                chained: true,
                ..TreeConfig::default()
            },
            worker_capacity_blocks: None,
            ttl: None,
            max_groups: 8,
            host_chunk_blocks: 1,
            full_reports: false,
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
        /// Sets [`max_groups`](Self::max_groups).
        with_max_groups: max_groups: u32;
        /// Sets [`host_chunk_blocks`](Self::host_chunk_blocks).
        with_host_chunk_blocks: host_chunk_blocks: usize;
        /// Sets [`full_reports`](Self::full_reports).
        with_full_reports: full_reports: bool;
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
        crate::config::int("max_groups", self.max_groups, 1..=64, "between 1 and 64")?;
        crate::config::int(
            "host_chunk_blocks",
            self.host_chunk_blocks,
            1..=1 << 16,
            "between 1 and 65536 blocks",
        )
    }
}

/// The workers holding a prompt's first block, with what they hold; on the stack for 16.
pub(crate) type Holders = SmallVec<[(WorkerId, Held); 16]>;

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

/// What a route's choice reads of the mirror beside the prompt's holders, under its lock.
#[derive(Clone, Copy)]
pub(crate) struct MirrorView<'a> {
    tree: &'a RadixTree,
}

impl MirrorView<'_> {
    /// The blocks the mirror believes `worker` holds, at any tier.
    #[inline]
    pub(crate) fn blocks_held(self, worker: WorkerId) -> usize {
        self.tree.blocks_held(worker)
    }
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
                sync: SyncState::new(SyncConfig {
                    max_groups: config.max_groups,
                    chunk_blocks: config.host_chunk_blocks,
                    full_reports: config.full_reports,
                }),
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

    /// How many leading tokens of `tokens` (salted with `salt`) `worker` is believed to hold
    /// (at any tier, as far as every KV-cache group allows, and below the device tier in
    /// whole chunks as the engine loads them back).
    #[must_use]
    pub fn cached_tokens(
        &self,
        worker: WorkerId,
        salt: &[u8],
        tokens: &[crate::hash::TokenId],
    ) -> usize {
        let mut blocks = Blocks::new();
        self.hasher.hash_salted_small(salt, tokens, &mut blocks);
        self.held(worker, &blocks, usize::MAX).blocks as usize * self.hasher.block_size()
    }

    /// How many leading tokens of `tokens` (salted with `salt`) `worker` would reuse if the
    /// request ran there now, as vLLM computes its prefix-cache hit: [`Self::cached_tokens`]
    /// with the prompt's last token always computed (vLLM needs it for the first output
    /// token), so a prompt of whole blocks cached to its end reuses one block less, and a
    /// hybrid model's sliding windows must end where that shorter hit ends. Loaded back
    /// from a lower tier, such a prompt is reused to its end, less its last token on a
    /// hybrid model.
    ///
    /// ```
    /// use prefix_router::{CacheEvent, CacheIndex, CacheSync, IndexConfig, WorkerId};
    ///
    /// let index = CacheIndex::new(IndexConfig::default())?;
    /// let tokens: Vec<u32> = (0..32).collect(); // two blocks of 16
    /// index.apply_event(WorkerId::new(0), 0, &CacheEvent::stored(None, vec![1, 2], tokens.clone()))?;
    /// assert_eq!(index.cached_tokens(WorkerId::new(0), &[], &tokens), 32);
    /// assert_eq!(index.reusable_tokens(WorkerId::new(0), &[], &tokens), 16);
    /// assert_eq!(index.reusable_tokens(WorkerId::new(0), &[], &[&tokens[..], &[7]].concat()), 32);
    /// # Ok::<(), prefix_router::Error>(())
    /// ```
    #[must_use]
    pub fn reusable_tokens(
        &self,
        worker: WorkerId,
        salt: &[u8],
        tokens: &[crate::hash::TokenId],
    ) -> usize {
        let mut blocks = Blocks::new();
        self.hasher.hash_salted_small(salt, tokens, &mut blocks);
        let max_device = tokens.len().saturating_sub(1) / self.hasher.block_size();
        let mirror = self.lock();
        let held = Self::held_in(&mirror, worker, &blocks, max_device);
        let hit = held.blocks as usize * self.hasher.block_size();
        // A hybrid model's engine loads its lower tiers' chunks to the end of a prompt of
        // whole chunks but leaves the last token to compute.
        if hit > 0 && hit == tokens.len() && mirror.sync.loads_lower_short(worker) {
            hit - 1
        } else {
            hit
        }
    }

    /// How many leading tokens of the request's prompt `worker` is believed to hold at each
    /// tier (by [`Tier::index`](crate::Tier::index)).
    #[must_use]
    pub fn cached_tokens_by_tier(
        &self,
        worker: WorkerId,
        request: &RouteRequest<'_>,
    ) -> [usize; 4] {
        let mut blocks = Blocks::new();
        self.hash_request(request, &mut blocks);
        let found = self.held(worker, &blocks, usize::MAX);
        found.by_tier.map(|b| b as usize * self.hasher.block_size())
    }

    /// What `worker` holds of `blocks` and the engine would reuse (see
    /// `SyncState::reusable`), with at most `max_device` blocks from the device tier.
    fn held(&self, worker: WorkerId, blocks: &[BlockHash], max_device: usize) -> Held {
        Self::held_in(&self.lock(), worker, blocks, max_device)
    }

    /// [`Self::held`] under a lock the caller holds.
    fn held_in(mirror: &Mirror, worker: WorkerId, blocks: &[BlockHash], max_device: usize) -> Held {
        let mut found = Held::default();
        mirror.tree.for_each_held(blocks, |w, held| {
            if w == worker {
                found = held;
            }
        });
        mirror.sync.reusable(worker, blocks, found, max_device)
    }

    /// The settings in effect for `worker`'s engine (see [`EngineSettings`]): those set with
    /// [`set_engine_settings`](CacheSync::set_engine_settings), what its events showed, and
    /// the index's defaults for the rest. Every field is filled.
    #[must_use]
    pub fn engine_settings(&self, worker: WorkerId) -> EngineSettings {
        self.lock().sync.settings(worker)
    }

    /// Hashes the request's full blocks into `out` (no lock held).
    pub(crate) fn hash_request(&self, request: &RouteRequest<'_>, out: &mut Blocks) {
        out.clear();
        if request.keys().is_empty() {
            self.hasher
                .hash_salted_small(request.salt(), request.tokens(), out);
        } else {
            let mut keyed = Vec::new();
            self.hasher.hash_keyed_into(
                request.salt(),
                request.tokens(),
                request.keys(),
                &mut keyed,
            );
            out.extend_from_slice(&keyed);
        }
    }

    /// Under one lock: matches `blocks`, lets `choose` pick a worker from the holders it
    /// found (each with what it holds, cut where a KV-cache group stops it; shallowest
    /// first), and records the prefix as held by the chosen worker (it will be cached there
    /// once the request runs). Returns what `choose` returned; nothing is recorded on error.
    pub(crate) fn match_choose_insert<T>(
        &self,
        blocks: &[BlockHash],
        choose: impl FnOnce(&[(WorkerId, Held)], MirrorView<'_>) -> Result<(T, WorkerId), Error>,
    ) -> Result<T, Error> {
        self.match_choose_insert_or(blocks, |holders, mirror| choose(holders, mirror).map(Some))
            // `choose` never declines here: no `None` comes back.
            .and_then(|chosen| chosen.ok_or(Error::NoWorkers))
    }

    /// [`match_choose_insert`](Self::match_choose_insert) whose `choose` may also decline:
    /// `Ok(None)` inserts nothing and answers `None`, the lock released, so that the
    /// caller can gather what it must not gather under the lock and ask again.
    pub(crate) fn match_choose_insert_or<T>(
        &self,
        blocks: &[BlockHash],
        choose: impl FnOnce(&[(WorkerId, Held)], MirrorView<'_>) -> Result<Option<(T, WorkerId)>, Error>,
    ) -> Result<Option<T>, Error> {
        let mut mirror = self.lock();
        let Mirror { tree, sync } = &mut *mirror;
        let mut holders: Holders = SmallVec::new();
        tree.for_each_held(blocks, |worker, held| {
            let held = if held.blocks == held.by_tier[0] && !sync.refines() {
                held
            } else {
                sync.reusable(worker, blocks, held, usize::MAX)
            };
            holders.push((worker, held));
        });
        let Some((chosen, worker)) = choose(&holders, MirrorView { tree })? else {
            return Ok(None);
        };
        tree.insert(worker, blocks);
        if sync.groups().any() {
            sync.groups_mut().routed(worker, blocks);
        }
        if let Some(ttl) = self.ttl {
            if tree.clock() % 16 == 0 {
                tree.expire(tree.clock().saturating_sub(ttl));
            }
        }
        Ok(Some(chosen))
    }

    /// [`CacheSync::report_cached_salted`], returning what the mirror predicted before and
    /// what the report said, in tokens of whole blocks.
    pub(crate) fn report(
        &self,
        worker: WorkerId,
        salt: &[u8],
        tokens: &[TokenId],
        cached_tokens: usize,
    ) -> Result<(usize, usize), Error> {
        let mirror = &mut *self.lock();
        let predicted = mirror.sync.report(
            &self.hasher,
            &mut mirror.tree,
            worker,
            salt,
            tokens,
            cached_tokens,
        )?;
        let block_size = self.hasher.block_size();
        let reported = (cached_tokens.min(tokens.len()) / block_size) * block_size;
        Ok((predicted, reported))
    }

    /// Records that `worker` now holds `blocks` (a prompt handed to it, as after a
    /// prefill/decode handoff).
    pub(crate) fn credit(&self, worker: WorkerId, blocks: &[BlockHash]) {
        let mut mirror = self.lock();
        let Mirror { tree, sync } = &mut *mirror;
        tree.insert(worker, blocks);
        if sync.groups().any() {
            sync.groups_mut().routed(worker, blocks);
        }
    }

    /// Forgets `worker`'s mirror, and applies the configured capacity to it afresh.
    pub(crate) fn reset_worker(&self, worker: WorkerId) {
        let mirror = &mut *self.lock();
        mirror.tree.remove_worker(worker);
        mirror.sync.reset(worker);
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
        self.report(worker, salt, tokens, cached_tokens).map(|_| ())
    }

    fn set_engine_settings(
        &self,
        worker: WorkerId,
        settings: &EngineSettings,
    ) -> Result<(), Error> {
        let mirror = &mut *self.lock();
        mirror.sync.set_settings(&self.hasher, worker, settings)
    }
}
