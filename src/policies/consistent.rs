//! Consistent hashing with virtual nodes and bounded loads.

use std::sync::{PoisonError, RwLock};

use super::baseline::least_loaded;
use crate::config::{float, int};
use crate::error::Error;
use crate::fleet::Candidate;
use crate::fold::mix64;
use crate::hash::PrefixHasher;
use crate::index::Blocks;
use crate::index::IndexConfig;
use crate::request::RouteRequest;
use crate::router::{Policy, PolicyRouter};
use crate::tree::WorkerId;

/// Configuration of [`ConsistentHashRouter`].
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct ConsistentHashConfig {
    /// Points per worker on the ring, 1 to 10,000. Default 160: with fewer the share of keys
    /// per worker varies more (the standard deviation of a share falls as 1/√points).
    pub virtual_nodes: u32,
    /// Without a session, a request's key is the hash of its first `key_blocks` full blocks
    /// (so requests sharing that much prefix land together). Default 4 (64 tokens).
    pub key_blocks: usize,
    /// Bounded loads: no worker takes a request that would put it above
    /// `load_factor × (mean requests in flight + 1)`; the request spills clockwise.
    /// At least 1.0. Default 1.25 (Mirrokni, Thorup and Zadimoghaddam's `1 + ε`, ε = 0.25).
    pub load_factor: f64,
    /// Tokens per block. Default 16.
    pub block_size: usize,
    /// Seed of the ring's point positions and of the key hashes. Default 0.
    pub seed: u64,
}

impl Default for ConsistentHashConfig {
    fn default() -> Self {
        Self {
            virtual_nodes: 160,
            key_blocks: 4,
            load_factor: 1.25,
            block_size: crate::index::DEFAULT_BLOCK_SIZE,
            seed: 0,
        }
    }
}

impl ConsistentHashConfig {
    crate::config::setters! {
        /// Sets [`virtual_nodes`](Self::virtual_nodes).
        with_virtual_nodes: virtual_nodes: u32;
        /// Sets [`key_blocks`](Self::key_blocks).
        with_key_blocks: key_blocks: usize;
        /// Sets [`load_factor`](Self::load_factor).
        with_load_factor: load_factor: f64;
        /// Sets [`block_size`](Self::block_size).
        with_block_size: block_size: usize;
        /// Sets [`seed`](Self::seed).
        with_seed: seed: u64;
    }

    /// Checks every field.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the first field out of its range;
    /// [`Error::InvalidBlockSize`] for a bad block size.
    pub fn validate(&self) -> Result<(), Error> {
        int(
            "virtual_nodes",
            self.virtual_nodes,
            1..=10_000,
            "between 1 and 10000",
        )?;
        int(
            "key_blocks",
            self.key_blocks,
            1..=1 << 20,
            "between 1 and 2^20 blocks",
        )?;
        float("load_factor", self.load_factor, 1.0..=1e9, "at least 1.0")?;
        PrefixHasher::check_block_size(self.block_size)
    }
}

/// The hash ring, shared with [`AffinityRouter`](crate::AffinityRouter)'s fallback.
#[derive(Debug)]
pub(crate) struct Ring {
    points: RwLock<Vec<(u64, WorkerId)>>,
    config: ConsistentHashConfig,
    hasher: PrefixHasher,
}

impl Ring {
    /// An empty ring: workers join it with [`Ring::add`].
    pub(crate) fn new(config: ConsistentHashConfig) -> Result<Self, Error> {
        config.validate()?;
        let hasher = PrefixHasher::new(config.block_size)?.with_seed(config.seed);
        Ok(Self {
            points: RwLock::new(Vec::new()),
            config,
            hasher,
        })
    }

    fn point(&self, worker: WorkerId, replica: u32) -> u64 {
        mix64(self.config.seed ^ mix64((u64::from(worker.get()) << 32) | u64::from(replica)))
    }

    pub(crate) fn add(&self, worker: WorkerId) {
        let mut points = self.points.write().unwrap_or_else(PoisonError::into_inner);
        points.retain(|&(_, w)| w != worker);
        for r in 0..self.config.virtual_nodes {
            points.push((self.point(worker, r), worker));
        }
        points.sort_unstable();
    }

    pub(crate) fn remove(&self, worker: WorkerId) {
        let mut points = self.points.write().unwrap_or_else(PoisonError::into_inner);
        points.retain(|&(_, w)| w != worker);
    }

    /// The request's ring key: its session, else the hash of its first `key_blocks`
    /// blocks (or of its tokens when it has no full block).
    pub(crate) fn key(&self, request: &RouteRequest<'_>) -> u64 {
        if request.session().is_some() {
            return request.key() ^ self.config.seed;
        }
        let head_len = request.tokens().len().min(
            self.config
                .key_blocks
                .saturating_mul(self.config.block_size),
        );
        let mut blocks = Blocks::new();
        self.hasher
            .hash_salted_small(request.salt(), &request.tokens()[..head_len], &mut blocks);
        match blocks.last() {
            Some(last) => mix64(last.get()),
            None => request.key() ^ self.config.seed,
        }
    }

    /// The first available worker clockwise from the request's key that stays within the
    /// load bound.
    pub(crate) fn pick(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
        let key = self.key(request);
        let points = self.points.read().unwrap_or_else(PoisonError::into_inner);
        let total: u64 = candidates.iter().map(Candidate::requests).sum();
        let n = candidates.len() as f64;
        let bound = (self.config.load_factor * (total as f64 + 1.0) / n).ceil() as u64;
        let start = points.partition_point(|&(p, _)| p < key);
        for step in 0..points.len() {
            let (_, worker) = points[(start + step) % points.len()];
            if let Ok(i) = candidates.binary_search_by_key(&worker, |c| c.worker) {
                if candidates[i].requests() < bound {
                    return i;
                }
            }
        }
        least_loaded(request, candidates)
    }
}

/// Consistent hashing with bounded loads.
///
/// Requests are keyed by their session id when given, else by the hash of their first
/// `key_blocks` blocks; a ring of virtual nodes maps keys to workers, so adding one worker
/// to N moves about 1/(N+1) of the keys and removing one moves only its own. No worker takes
/// a request that would put it above `load_factor ×` the mean load: the request spills to
/// the next worker clockwise (Mirrokni et al., "Consistent Hashing with Bounded Loads").
pub type ConsistentHashRouter = PolicyRouter<ConsistentHash>;

/// The policy of [`ConsistentHashRouter`]: a ring of the registered workers.
#[derive(Debug)]
pub struct ConsistentHash {
    ring: Ring,
}

impl ConsistentHash {
    /// The policy with `config` (workers join the ring as they are registered).
    ///
    /// # Errors
    ///
    /// As [`ConsistentHashConfig::validate`].
    pub fn new(config: ConsistentHashConfig) -> Result<Self, Error> {
        Ok(Self {
            ring: Ring::new(config)?,
        })
    }
}

impl PolicyRouter<ConsistentHash> {
    /// A router over workers `0..num_workers` with the default configuration.
    ///
    /// # Errors
    ///
    /// [`Error::WorkerOutOfRange`] when `num_workers` exceeds
    /// [`RadixTree::MAX_WORKERS`](crate::RadixTree::MAX_WORKERS).
    pub fn new(num_workers: u32) -> Result<Self, Error> {
        Self::with_config(num_workers, ConsistentHashConfig::default())
    }

    /// A router with `config`.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new); as [`ConsistentHashConfig::validate`].
    pub fn with_config(num_workers: u32, config: ConsistentHashConfig) -> Result<Self, Error> {
        Self::with_policy(
            num_workers,
            ConsistentHash::new(config)?,
            IndexConfig::default(),
        )
    }
}

impl Policy for ConsistentHash {
    fn name(&self) -> &'static str {
        "consistent_hash"
    }

    fn select(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
        self.ring.pick(request, candidates)
    }

    fn worker_added(&self, worker: WorkerId) {
        self.ring.add(worker);
    }

    fn worker_removed(&self, worker: WorkerId) {
        self.ring.remove(worker);
    }
}
