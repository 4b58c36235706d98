//! Baselines without a cache: round robin, least loaded, power of two choices.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::error::Error;
use crate::fleet::{Candidate, pick_min};
use crate::fold::mix64;
use crate::index::IndexConfig;
use crate::request::RouteRequest;
use crate::router::{Policy, PolicyRouter, choose_min};

/// Sends requests to the available workers in turn.
///
/// ```
/// use prefix_router::{RoundRobinRouter, RouteRequest, Router};
///
/// let router = RoundRobinRouter::new(3)?;
/// let workers: Vec<u32> = (0..6)
///     .map(|_| router.route(&RouteRequest::new(&[1, 2, 3])).map(|d| d.worker().get()))
///     .collect::<Result<_, _>>()?;
/// assert_eq!(workers, [0, 1, 2, 0, 1, 2]);
/// # Ok::<(), prefix_router::Error>(())
/// ```
pub type RoundRobinRouter = PolicyRouter<RoundRobin>;

/// The policy of [`RoundRobinRouter`].
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicU64,
}

impl PolicyRouter<RoundRobin> {
    /// A router over workers `0..num_workers`.
    ///
    /// # Errors
    ///
    /// [`Error::WorkerOutOfRange`] when `num_workers` exceeds
    /// [`RadixTree::MAX_WORKERS`](crate::RadixTree::MAX_WORKERS).
    pub fn new(num_workers: u32) -> Result<Self, Error> {
        Self::with_policy(num_workers, RoundRobin::default(), IndexConfig::default())
    }
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round_robin"
    }

    fn select(&self, _: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
        (self.next.fetch_add(1, Relaxed) % candidates.len() as u64) as usize
    }
}

/// Sends each request to the worker with the fewest requests (then the fewest outstanding
/// prefill tokens, then the fewest routed so far).
pub type LeastLoadedRouter = PolicyRouter<LeastLoaded>;

/// The policy of [`LeastLoadedRouter`].
#[derive(Clone, Copy, Debug, Default)]
pub struct LeastLoaded;

impl PolicyRouter<LeastLoaded> {
    /// A router over workers `0..num_workers`.
    ///
    /// # Errors
    ///
    /// [`Error::WorkerOutOfRange`] when `num_workers` exceeds
    /// [`RadixTree::MAX_WORKERS`](crate::RadixTree::MAX_WORKERS).
    pub fn new(num_workers: u32) -> Result<Self, Error> {
        Self::with_policy(num_workers, LeastLoaded, IndexConfig::default())
    }
}

/// The least loaded candidate: fewest requests, then fewest outstanding prefill tokens.
pub(crate) fn least_loaded(request: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
    choose_min(request, candidates, |c| (c.requests(), c.prefill_tokens()))
}

impl Policy for LeastLoaded {
    fn name(&self) -> &'static str {
        "least_loaded"
    }

    fn select(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
        least_loaded(request, candidates)
    }
}

/// Configuration of [`PowerOfTwoRouter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PowerOfTwoConfig {
    /// Seed of the (deterministic) choice of the two workers compared. Default 0.
    pub seed: u64,
}

impl PowerOfTwoConfig {
    crate::config::setters! {
        /// Sets [`seed`](Self::seed).
        with_seed: seed: u64;
    }

    /// Checks every field: any seed is valid.
    ///
    /// # Errors
    ///
    /// None today; the signature matches every other configuration's.
    pub fn validate(&self) -> Result<(), Error> {
        Ok(())
    }
}

/// Power of two choices: compares two workers drawn from a seeded sequence and sends the
/// request to the less loaded one.
pub type PowerOfTwoRouter = PolicyRouter<PowerOfTwo>;

/// The policy of [`PowerOfTwoRouter`].
#[derive(Debug)]
pub struct PowerOfTwo {
    seed: u64,
    draws: AtomicU64,
}

impl PowerOfTwo {
    /// The policy with `config`.
    ///
    /// # Errors
    ///
    /// As [`PowerOfTwoConfig::validate`].
    pub fn new(config: PowerOfTwoConfig) -> Result<Self, Error> {
        config.validate()?;
        Ok(Self {
            seed: config.seed,
            draws: AtomicU64::new(0),
        })
    }
}

impl PolicyRouter<PowerOfTwo> {
    /// A router over workers `0..num_workers` with the default seed.
    ///
    /// # Errors
    ///
    /// [`Error::WorkerOutOfRange`] when `num_workers` exceeds
    /// [`RadixTree::MAX_WORKERS`](crate::RadixTree::MAX_WORKERS).
    pub fn new(num_workers: u32) -> Result<Self, Error> {
        Self::with_config(num_workers, PowerOfTwoConfig::default())
    }

    /// A router with `config`.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn with_config(num_workers: u32, config: PowerOfTwoConfig) -> Result<Self, Error> {
        Self::with_policy(
            num_workers,
            PowerOfTwo::new(config)?,
            IndexConfig::default(),
        )
    }
}

impl Policy for PowerOfTwo {
    fn name(&self) -> &'static str {
        "power_of_two"
    }

    fn select(&self, _: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
        let n = candidates.len() as u64;
        let draw = self.draws.fetch_add(1, Relaxed);
        let r = mix64(self.seed ^ draw.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let a = (r % n) as usize;
        let b = if n > 1 {
            ((a as u64 + 1 + (r >> 32) % (n - 1)) % n) as usize
        } else {
            a
        };
        let pair = [candidates[a], candidates[b]];
        let i = pick_min(&pair, r, |_, c| (c.requests(), c.prefill_tokens())).unwrap_or(0);
        [a, b][i]
    }
}
