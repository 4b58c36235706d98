//! SGLang's cache-aware rule.

use super::baseline::least_loaded;
use super::index::Scored;
use super::{
    CacheIndex, Candidate, Fleet, IndexConfig, Indexed, Policy, RouteRequest, Selection,
    check_range, pick_min,
};
use crate::{Error, WorkerId};

/// Configuration of [`CacheAwareRouter`]. The defaults are SGLang router's.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct CacheAwareConfig {
    /// Route to the longest match only when it covers more than this fraction of the
    /// prompt, `0.0..=1.0`. Default 0.5.
    pub cache_threshold: f64,
    /// Loads are imbalanced when `max − min` exceeds this many requests (and the relative
    /// threshold holds too). Default 32.
    pub balance_abs_threshold: u64,
    /// Loads are imbalanced when `max` exceeds this multiple of `min` (and the absolute
    /// threshold holds too). At least 1.0. Default 1.0001.
    pub balance_rel_threshold: f64,
    /// Hashing and mirror bounds.
    pub index: IndexConfig,
}

impl Default for CacheAwareConfig {
    fn default() -> Self {
        Self {
            cache_threshold: 0.5,
            balance_abs_threshold: 32,
            balance_rel_threshold: 1.0001,
            index: IndexConfig::default(),
        }
    }
}

/// The rule of SGLang's cache-aware router.
///
/// 1. If loads are imbalanced (`max − min > balance_abs_threshold` and
///    `max > balance_rel_threshold × min`, in requests), the least loaded worker.
/// 2. Else, if the longest match covers more than `cache_threshold` of the prompt, the
///    worker with the longest match (ties: the least loaded).
/// 3. Else the least loaded worker.
///
/// Ties go to the worker routed the fewest requests so far, then to a per-request rotation.
/// The routed prefix is inserted into the mirror for the chosen worker.
#[derive(Debug)]
pub struct CacheAwareRouter {
    fleet: Fleet,
    index: CacheIndex,
    config: CacheAwareConfig,
}

impl CacheAwareRouter {
    /// A router over workers `0..num_workers` with the default configuration.
    ///
    /// # Errors
    ///
    /// [`Error::WorkerOutOfRange`] when `num_workers` exceeds
    /// [`RadixTree::MAX_WORKERS`](crate::RadixTree::MAX_WORKERS).
    pub fn new(num_workers: u32) -> Result<Self, Error> {
        Self::with_config(num_workers, CacheAwareConfig::default())
    }

    /// A router with `config`.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new); [`Error::InvalidConfig`] for NaN or out-of-range values;
    /// [`Error::InvalidBlockSize`] for a bad block size.
    pub fn with_config(num_workers: u32, config: CacheAwareConfig) -> Result<Self, Error> {
        check_range(
            "cache_threshold",
            config.cache_threshold,
            0.0..=1.0,
            "between 0.0 and 1.0",
        )?;
        check_range(
            "balance_rel_threshold",
            config.balance_rel_threshold,
            1.0..=f64::MAX,
            "at least 1.0",
        )?;
        let (fleet, index) = CacheIndex::with_fleet(num_workers, config.index)?;
        Ok(Self {
            fleet,
            index,
            config,
        })
    }

    /// The cache index (the mirror of every worker's cache).
    #[must_use]
    pub fn index(&self) -> &CacheIndex {
        &self.index
    }
}

impl Policy for CacheAwareRouter {
    fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    fn select(
        &self,
        request: &RouteRequest<'_>,
        candidates: &[Candidate],
    ) -> Result<Selection, Error> {
        let salt = request.key();
        let (min, max) = candidates
            .iter()
            .map(Candidate::requests)
            .fold((u64::MAX, 0), |(lo, hi), r| (lo.min(r), hi.max(r)));
        let imbalanced = max - min > self.config.balance_abs_threshold
            && max as f64 > self.config.balance_rel_threshold * min as f64;
        let (chosen, scored) = Scored::route(&self.index, request, candidates, |scored| {
            let best = candidates.iter().map(|c| scored.blocks_of(c)).max();
            let best = best.unwrap_or(0);
            let ratio = candidates
                .iter()
                .find(|c| scored.blocks_of(c) == best)
                .map_or(0.0, |c| scored.fraction_of(c));
            if !imbalanced && best > 0 && ratio > self.config.cache_threshold {
                pick_min(candidates, salt, |_, c| {
                    (scored.blocks_of(c) != best, c.requests())
                })
                .unwrap_or(0)
            } else {
                least_loaded(candidates, salt)
            }
        });
        Ok(scored.selection(candidates, chosen))
    }

    fn worker_added(&self, worker: WorkerId) {
        self.index.reset_worker(worker);
    }

    fn worker_removed(&self, worker: WorkerId) {
        self.index.reset_worker(worker);
    }

    fn sync(&self) -> Option<&dyn crate::CacheSync> {
        Some(self)
    }

    fn name(&self) -> &'static str {
        "cache_aware"
    }
}

impl Indexed for CacheAwareRouter {
    fn index(&self) -> &CacheIndex {
        &self.index
    }
}
