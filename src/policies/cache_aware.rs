//! SGLang's cache-aware rule.

use super::baseline::least_loaded;
use crate::config::float;
use crate::error::Error;
use crate::fleet::Candidate;
use crate::index::IndexConfig;
use crate::request::RouteRequest;
use crate::router::{Policy, PolicyRouter, choose_min};

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

impl CacheAwareConfig {
    crate::config::setters! {
        /// Sets [`cache_threshold`](Self::cache_threshold).
        with_cache_threshold: cache_threshold: f64;
        /// Sets [`balance_abs_threshold`](Self::balance_abs_threshold).
        with_balance_abs_threshold: balance_abs_threshold: u64;
        /// Sets [`balance_rel_threshold`](Self::balance_rel_threshold).
        with_balance_rel_threshold: balance_rel_threshold: f64;
        /// Sets [`index`](Self::index).
        with_index: index: IndexConfig;
    }

    /// Checks every field.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the first field out of its range (the index's
    /// included); [`Error::InvalidBlockSize`] for a bad block size.
    pub fn validate(&self) -> Result<(), Error> {
        float(
            "cache_threshold",
            self.cache_threshold,
            0.0..=1.0,
            "between 0.0 and 1.0",
        )?;
        float(
            "balance_rel_threshold",
            self.balance_rel_threshold,
            1.0..=f64::MAX,
            "at least 1.0",
        )?;
        self.index.validate()
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
pub type CacheAwareRouter = PolicyRouter<CacheAware>;

/// The policy of [`CacheAwareRouter`].
#[derive(Clone, Copy, Debug)]
pub struct CacheAware {
    config: CacheAwareConfig,
}

impl CacheAware {
    /// The policy with `config` (its `index` is the router's business).
    ///
    /// # Errors
    ///
    /// As [`CacheAwareConfig::validate`].
    pub fn new(config: CacheAwareConfig) -> Result<Self, Error> {
        config.validate()?;
        Ok(Self { config })
    }

    /// Whether loads are imbalanced by both thresholds.
    fn imbalanced(&self, candidates: &[Candidate]) -> bool {
        let (min, max) = candidates
            .iter()
            .map(Candidate::requests)
            .fold((u64::MAX, 0), |(lo, hi), r| (lo.min(r), hi.max(r)));
        max - min > self.config.balance_abs_threshold
            && max as f64 > self.config.balance_rel_threshold * min as f64
    }
}

impl PolicyRouter<CacheAware> {
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
    /// As [`new`](Self::new); as [`CacheAwareConfig::validate`].
    pub fn with_config(num_workers: u32, config: CacheAwareConfig) -> Result<Self, Error> {
        Self::with_policy(num_workers, CacheAware::new(config)?, config.index)
    }
}

impl Policy for CacheAware {
    fn name(&self) -> &'static str {
        "cache_aware"
    }

    fn reads_cache(&self) -> bool {
        true
    }

    fn select(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
        let best = candidates.iter().map(Candidate::matched_blocks).max();
        let best = best.unwrap_or(0);
        let tokens = request.tokens().len();
        let ratio = candidates
            .iter()
            .find(|c| c.matched_blocks() == best)
            .map_or(0.0, |c| {
                if tokens == 0 {
                    0.0
                } else {
                    c.cached_tokens() as f64 / tokens as f64
                }
            });
        if !self.imbalanced(candidates) && best > 0 && ratio > self.config.cache_threshold {
            choose_min(request, candidates, |c| {
                (c.matched_blocks() != best, c.requests())
            })
        } else {
            least_loaded(request, candidates)
        }
    }
}
