//! The modelled fleet's configuration.

use crate::config::{float, int};
use crate::{Error, PrefixHasher, RadixTree};

/// How the router's mirror is corrected during a simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SyncMode {
    /// Nothing: the router keeps its optimistic mirror, bounded by its own configuration
    /// (for example [`IndexConfig::worker_capacity_blocks`](crate::IndexConfig)). The
    /// default.
    #[default]
    None,
    /// Miss feedback: when a request's prefill starts, the worker reports how many prompt
    /// tokens it found cached ([`CacheSync::report_cached`](crate::CacheSync::report_cached)), which trims the mirror to
    /// that, including the optimistic insert of the request itself (the worker only caches
    /// the rest once it has computed it). On multi-turn traffic that costs the cache-aware
    /// policies hits: compare the two modes with `--sync`.
    Feedback,
}

/// The modelled fleet.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct ClusterConfig {
    /// Workers. Default 8.
    pub workers: u32,
    /// KV cache of each worker, in tokens (LRU over blocks). Default 1,000,000 (about what
    /// one GPU holds for a 70B model).
    pub capacity_tokens: usize,
    /// Tokens per KV block. Default 16.
    pub block_size: usize,
    /// Prefill throughput of one worker. Default 33,000 tokens/s (about 60 ms for 2,000
    /// tokens of a 70B model on one H100).
    pub prefill_tokens_per_s: f64,
    /// Decode time per output token (continuous batching: decodes do not hold up the prefill
    /// queue). Default 0.02 s.
    pub decode_s_per_token: f64,
    /// Arrival rates are multiplied by this (arrival times divided). Default 1.0.
    pub speedup: f64,
    /// Mirror correction. Default [`SyncMode::None`].
    pub sync: SyncMode,
    /// Whether to time the router's decisions with the wall clock (the only
    /// non-deterministic figure of a report). Default true.
    pub measure_decision_time: bool,
}

impl ClusterConfig {
    crate::config::setters! {
        /// Sets [`workers`](Self::workers).
        with_workers: workers: u32;
        /// Sets [`capacity_tokens`](Self::capacity_tokens).
        with_capacity_tokens: capacity_tokens: usize;
        /// Sets [`block_size`](Self::block_size).
        with_block_size: block_size: usize;
        /// Sets [`prefill_tokens_per_s`](Self::prefill_tokens_per_s).
        with_prefill_tokens_per_s: prefill_tokens_per_s: f64;
        /// Sets [`decode_s_per_token`](Self::decode_s_per_token).
        with_decode_s_per_token: decode_s_per_token: f64;
        /// Sets [`speedup`](Self::speedup).
        with_speedup: speedup: f64;
        /// Sets [`sync`](Self::sync).
        with_sync: sync: SyncMode;
        /// Sets [`measure_decision_time`](Self::measure_decision_time).
        with_measure_decision_time: measure_decision_time: bool;
    }

    /// Checks every field.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a fleet of 0 or more than 4,096 workers, a capacity of
    /// less than one block, or a non-positive or NaN rate or speedup;
    /// [`Error::InvalidBlockSize`] for a bad block size.
    pub fn validate(&self) -> Result<(), Error> {
        int(
            "workers",
            self.workers,
            1..=RadixTree::MAX_WORKERS,
            "between 1 and 4096",
        )?;
        PrefixHasher::check_block_size(self.block_size)?;
        int(
            "capacity_tokens",
            self.capacity_tokens,
            self.block_size..,
            "at least one block",
        )?;
        float(
            "prefill_tokens_per_s",
            self.prefill_tokens_per_s,
            f64::MIN_POSITIVE..=f64::MAX,
            "a positive number",
        )?;
        float(
            "decode_s_per_token",
            self.decode_s_per_token,
            0.0..=f64::MAX,
            "zero or more seconds",
        )?;
        float(
            "speedup",
            self.speedup,
            f64::MIN_POSITIVE..=f64::MAX,
            "a positive factor",
        )
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            workers: 8,
            capacity_tokens: 1_000_000,
            block_size: 16,
            prefill_tokens_per_s: 33_000.0,
            decode_s_per_token: 0.02,
            speedup: 1.0,
            sync: SyncMode::None,
            measure_decision_time: true,
        }
    }
}
