//! What engines report of their load ([`EngineLoad`]) and what a report past its age counts
//! as ([`Staleness`]).

use std::time::Duration;

use crate::config::float;
use crate::error::Error;

/// A worker's load as its engine reports it: what vLLM (`vllm:num_requests_waiting`,
/// `vllm:num_requests_running`, `vllm:kv_cache_usage_perc`), SGLang and TensorRT-LLM publish,
/// the metrics the inference extension's model-server protocol lists.
///
/// `measured_at` is when the engine measured it, on the host's clock (any epoch, the same for
/// every report and for [`RouteRequest::with_time`](crate::RouteRequest::with_time)): the
/// crate reads no clock. A report older than [`LoadConfig::max_report_age`](crate::LoadConfig::max_report_age) is stale and
/// counts as [`LoadConfig::staleness`](crate::LoadConfig::staleness) says.
///
/// ```
/// use std::time::Duration;
/// use prefix_router::{EngineLoad, Router, BalancedRouter, WorkerId};
///
/// let router = BalancedRouter::new(2)?;
/// let load = EngineLoad::new(3, 40, Duration::from_millis(1_500))
///     .with_kv_blocks(9_000, 10_000)
///     .with_prefill_tokens(12_000);
/// router.report_load(WorkerId::new(0), load)?;
/// assert_eq!(router.load(WorkerId::new(0)).unwrap().reported, Some(load));
/// # Ok::<(), prefix_router::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct EngineLoad {
    /// Requests waiting for admission (not yet running, or preempted).
    pub waiting: u64,
    /// Requests running: admitted, prefilling or decoding.
    pub running: u64,
    /// Fraction of the KV cache's blocks in use by running requests, `0.0..=1.0` (vLLM's
    /// `kv_cache_usage_perc`: cached free blocks count as free).
    pub kv_usage: f64,
    /// KV blocks in all, when the engine says (0: unknown).
    pub kv_blocks_total: u64,
    /// Uncached prompt tokens still to prefill (waiting requests' and partially prefilled
    /// running ones'), where the engine knows them.
    pub prefill_tokens: Option<u64>,
    /// When the engine measured this, on the host's clock.
    pub measured_at: Duration,
}

impl EngineLoad {
    /// `waiting` and `running` requests measured at `measured_at`; KV usage 0, prefill
    /// unknown.
    #[must_use]
    pub fn new(waiting: u64, running: u64, measured_at: Duration) -> Self {
        Self {
            waiting,
            running,
            kv_usage: 0.0,
            kv_blocks_total: 0,
            prefill_tokens: None,
            measured_at,
        }
    }

    /// The fraction of KV blocks in use, as vLLM's `kv_cache_usage_perc` gives it.
    #[must_use]
    pub fn with_kv_usage(self, kv_usage: f64) -> Self {
        Self { kv_usage, ..self }
    }

    /// `used` of `total` KV blocks in use.
    #[must_use]
    pub fn with_kv_blocks(self, used: u64, total: u64) -> Self {
        let kv_usage = if total == 0 {
            0.0
        } else {
            used as f64 / total as f64
        };
        Self {
            kv_usage,
            kv_blocks_total: total,
            ..self
        }
    }

    /// Uncached prompt tokens still to prefill.
    #[must_use]
    pub fn with_prefill_tokens(self, tokens: u64) -> Self {
        Self {
            prefill_tokens: Some(tokens),
            ..self
        }
    }

    /// Requests on the worker: waiting and running.
    #[must_use]
    pub fn requests(&self) -> u64 {
        self.waiting.saturating_add(self.running)
    }

    /// Checks the fields a host could get wrong.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when `kv_usage` is not a fraction in `0.0..=1.0`.
    pub fn validate(&self) -> Result<(), Error> {
        float(
            "kv_usage",
            self.kv_usage,
            0.0..=1.0,
            "a fraction between 0.0 and 1.0",
        )
    }
}

/// Seconds a worker counted as saturated ([`Staleness::Saturated`]) adds to every time to
/// first token predicted there: an hour, longer than any first token a served request
/// waits for, so that such a worker is chosen only when every worker is, and ranked among
/// saturated workers by its load still. A penalty, not a prediction: a first token timed
/// on such a worker teaches nothing (its decision records that it was saturated).
pub(crate) const SATURATED_PENALTY_S: f64 = 3_600.0;

/// What a report older than [`LoadConfig::max_report_age`](crate::LoadConfig::max_report_age) counts as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Staleness {
    /// As if fresh: the last word from the engine, plus this router's counts since.
    Hold,
    /// The worker counts as saturated (its exporter or the engine may be stuck): it is
    /// chosen only when every worker is (llm-d's saturation detector does the same). Its
    /// predicted time to first token carries an hour more.
    Saturated,
    /// Dropped: the router goes by its own counts alone, as if the engine never reported.
    /// The default.
    #[default]
    Ignore,
}
