//! Baselines without a cache index: round robin, least loaded, power of two choices.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::{Candidate, Fleet, Policy, RouteRequest, Selection, mix64, pick_min};
use crate::Error;

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
#[derive(Debug)]
pub struct RoundRobinRouter {
    fleet: Fleet,
    next: AtomicU64,
}

impl RoundRobinRouter {
    /// A router over workers `0..num_workers`.
    ///
    /// # Errors
    ///
    /// [`Error::WorkerOutOfRange`] when `num_workers` exceeds
    /// [`RadixTree::MAX_WORKERS`](crate::RadixTree::MAX_WORKERS).
    pub fn new(num_workers: u32) -> Result<Self, Error> {
        Ok(Self {
            fleet: Fleet::new(num_workers)?,
            next: AtomicU64::new(0),
        })
    }
}

impl Policy for RoundRobinRouter {
    fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    fn select(&self, _: &RouteRequest<'_>, candidates: &[Candidate]) -> Result<Selection, Error> {
        let i = self.next.fetch_add(1, Relaxed) % candidates.len() as u64;
        Ok(Selection::plain(candidates[i as usize]))
    }

    fn name(&self) -> &'static str {
        "round_robin"
    }
}

/// Sends each request to the worker with the fewest requests in flight (then the fewest
/// outstanding prefill tokens, then the fewest routed so far).
#[derive(Debug)]
pub struct LeastLoadedRouter {
    fleet: Fleet,
}

impl LeastLoadedRouter {
    /// A router over workers `0..num_workers`.
    ///
    /// # Errors
    ///
    /// [`Error::WorkerOutOfRange`] when `num_workers` exceeds
    /// [`RadixTree::MAX_WORKERS`](crate::RadixTree::MAX_WORKERS).
    pub fn new(num_workers: u32) -> Result<Self, Error> {
        Ok(Self {
            fleet: Fleet::new(num_workers)?,
        })
    }
}

/// The least loaded candidate: fewest requests, then fewest outstanding prefill tokens.
pub(crate) fn least_loaded(candidates: &[Candidate], salt: u64) -> usize {
    pick_min(candidates, salt, |_, c| (c.requests(), c.prefill_tokens)).unwrap_or(0)
}

impl Policy for LeastLoadedRouter {
    fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    fn select(
        &self,
        request: &RouteRequest<'_>,
        candidates: &[Candidate],
    ) -> Result<Selection, Error> {
        Ok(Selection::plain(
            candidates[least_loaded(candidates, request.key())],
        ))
    }

    fn name(&self) -> &'static str {
        "least_loaded"
    }
}

/// Configuration of [`PowerOfTwoRouter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PowerOfTwoConfig {
    /// Seed of the (deterministic) choice of the two workers compared. Default 0.
    pub seed: u64,
}

/// Power of two choices: compares two workers drawn from a seeded sequence and sends the
/// request to the less loaded one.
#[derive(Debug)]
pub struct PowerOfTwoRouter {
    fleet: Fleet,
    seed: u64,
    draws: AtomicU64,
}

impl PowerOfTwoRouter {
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
        Ok(Self {
            fleet: Fleet::new(num_workers)?,
            seed: config.seed,
            draws: AtomicU64::new(0),
        })
    }
}

impl Policy for PowerOfTwoRouter {
    fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    fn select(&self, _: &RouteRequest<'_>, candidates: &[Candidate]) -> Result<Selection, Error> {
        let n = candidates.len() as u64;
        let r = mix64(
            self.seed
                ^ self
                    .draws
                    .fetch_add(1, Relaxed)
                    .wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        let a = (r % n) as usize;
        let b = if n > 1 {
            ((a as u64 + 1 + (r >> 32) % (n - 1)) % n) as usize
        } else {
            a
        };
        let pair = [candidates[a], candidates[b]];
        let i = pick_min(&pair, r, |_, c| (c.requests(), c.prefill_tokens)).unwrap_or(0);
        Ok(Selection::plain(pair[i]))
    }

    fn name(&self) -> &'static str {
        "power_of_two"
    }
}
