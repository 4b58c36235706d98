//! What engines report of their load, how old it may be, and what a worker is told or
//! learns of its speed: the load model every policy reads through [`Candidate`](super::Candidate).

use std::time::Duration;

use crate::Error;
use crate::config::float;

/// A worker's load as its engine reports it: what vLLM (`vllm:num_requests_waiting`,
/// `vllm:num_requests_running`, `vllm:kv_cache_usage_perc`), SGLang and TensorRT-LLM publish,
/// the metrics the inference extension's model-server protocol lists.
///
/// `measured_at` is when the engine measured it, on the host's clock (any epoch, the same for
/// every report and for [`RouteRequest::with_time`](crate::RouteRequest::with_time)): the
/// crate reads no clock. A report older than [`LoadConfig::max_report_age`] is stale and
/// counts as [`LoadConfig::staleness`] says.
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

/// What a report older than [`LoadConfig::max_report_age`] counts as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Staleness {
    /// As if fresh: the last word from the engine, plus this router's counts since.
    Hold,
    /// The worker counts as saturated (its exporter or the engine may be stuck): it is
    /// chosen only when every worker is (llm-d's saturation detector does the same).
    Saturated,
    /// Dropped: the router goes by its own counts alone, as if the engine never reported.
    /// The default.
    #[default]
    Ignore,
}

/// The cost of one engine step, as vLLM's scheduler builds it: a step computes up to
/// `max_num_batched_tokens` tokens, one for each decoding request and the rest prefill
/// chunks, and takes
/// `step_base_s + prefill / prefill_tokens_per_s + decodes × step_s_per_decode +
/// context × step_s_per_context_token` seconds, `context` being the tokens the decodes attend
/// to. The simulator's engine steps by it; [`BalancedRouter`](crate::BalancedRouter)
/// predicts time to first token and decode time by it.
///
/// The defaults model Llama-3.1-70B in FP8 on 8 H100 SXM GPUs (tensor-parallel), estimated
/// from public peak figures: a step reads the weights once (8.8 GB per GPU at 3.35 TB/s)
/// plus kernel launches and 160 all-reduces, so `step_base_s` 0.008; a decode's sampling and
/// bookkeeping about 50 µs; a context token's KV (80 layers × 8 heads × 128 dimensions × K
/// and V, FP8: 160 KiB) read across the 8 GPUs' 26.8 TB/s: 6 ns.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct StepModel {
    /// Tokens computed per step at most (vLLM's `max_num_batched_tokens`). Default 8,192.
    pub max_num_batched_tokens: usize,
    /// Running requests at most (vLLM's `max_num_seqs`): past them, requests wait for one
    /// to finish. Default 256.
    pub max_num_seqs: usize,
    /// Fixed time of a step, seconds. Default 0.008.
    pub step_base_s: f64,
    /// Time per decoding request in a step. Default 0.000 05.
    pub step_s_per_decode: f64,
    /// Time per token of context the step's decodes attend to. Default 0.000 000 006.
    pub step_s_per_context_token: f64,
}

impl Default for StepModel {
    fn default() -> Self {
        Self {
            max_num_batched_tokens: 8_192,
            max_num_seqs: 256,
            step_base_s: 0.008,
            step_s_per_decode: 0.000_05,
            step_s_per_context_token: 0.000_000_006,
        }
    }
}

impl StepModel {
    crate::config::setters! {
        /// Sets [`max_num_batched_tokens`](Self::max_num_batched_tokens).
        with_max_num_batched_tokens: max_num_batched_tokens: usize;
        /// Sets [`max_num_seqs`](Self::max_num_seqs).
        with_max_num_seqs: max_num_seqs: usize;
        /// Sets [`step_base_s`](Self::step_base_s).
        with_step_base_s: step_base_s: f64;
        /// Sets [`step_s_per_decode`](Self::step_s_per_decode).
        with_step_s_per_decode: step_s_per_decode: f64;
        /// Sets [`step_s_per_context_token`](Self::step_s_per_context_token).
        with_step_s_per_context_token: step_s_per_context_token: f64;
    }

    /// Seconds of a step computing `prefill` prompt tokens at `prefill_tokens_per_s` and
    /// one token for each of `decodes` requests attending to `context` tokens.
    #[inline]
    #[must_use]
    pub fn seconds(
        &self,
        prefill: f64,
        decodes: f64,
        context: f64,
        prefill_tokens_per_s: f64,
    ) -> f64 {
        self.step_base_s
            + prefill / prefill_tokens_per_s
            + decodes * self.step_s_per_decode
            + context * self.step_s_per_context_token
    }

    /// Checks every field.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a budget or sequence cap of 0, or a negative or NaN
    /// time.
    pub fn validate(&self) -> Result<(), Error> {
        crate::config::int(
            "max_num_batched_tokens",
            self.max_num_batched_tokens,
            1..,
            "at least 1",
        )?;
        crate::config::int("max_num_seqs", self.max_num_seqs, 1.., "at least 1")?;
        for (field, value) in [
            ("step_base_s", self.step_base_s),
            ("step_s_per_decode", self.step_s_per_decode),
            ("step_s_per_context_token", self.step_s_per_context_token),
        ] {
            float(field, value, 0.0..=f64::MAX, "zero or more seconds")?;
        }
        Ok(())
    }
}

/// What the host tells the router of one worker ([`Router::set_profile`](crate::Router::set_profile)):
/// optional, since the router learns a worker's effective speed from the timings the host
/// reports ([`Router::first_token_after`](crate::Router::first_token_after)).
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct WorkerProfile {
    /// The worker's speed relative to [`LoadConfig::prefill_tokens_per_s`] and the step
    /// model (2.0: twice as fast, each step taking half as long). Positive; default 1.0.
    pub speed: f64,
    /// Tokens of KV the worker holds, when known (0: unknown): with the KV usage engines
    /// report, how many tokens its running requests hold and how many a new one can get.
    pub kv_capacity_tokens: u64,
}

impl Default for WorkerProfile {
    fn default() -> Self {
        Self {
            speed: 1.0,
            kv_capacity_tokens: 0,
        }
    }
}

impl WorkerProfile {
    crate::config::setters! {
        /// Sets [`speed`](Self::speed).
        with_speed: speed: f64;
        /// Sets [`kv_capacity_tokens`](Self::kv_capacity_tokens).
        with_kv_capacity_tokens: kv_capacity_tokens: u64;
    }

    /// Checks every field.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when `speed` is not a positive finite number.
    pub fn validate(&self) -> Result<(), Error> {
        float(
            "speed",
            self.speed,
            f64::MIN_POSITIVE..=1e6,
            "a positive relative speed",
        )
    }
}

/// How a router reads load: reports' ages, the fleet's nominal speed and step model, and
/// learning each worker's effective speed.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct LoadConfig {
    /// A report older than this, against the request's time (or the newest report's, when
    /// requests carry none), is stale. Default 5 s (five scrapes of vLLM's default
    /// Prometheus interval).
    pub max_report_age: Duration,
    /// What a stale report counts as. Default [`Staleness::Ignore`].
    pub staleness: Staleness,
    /// Prefill throughput of a worker of speed 1.0, tokens per second. Positive. Default
    /// 33,000 (about 60 ms for 2,000 tokens of a 70B model on 8 H100s).
    pub prefill_tokens_per_s: f64,
    /// The step model predictions use.
    pub step: StepModel,
    /// Output tokens a request is assumed to generate when it gives no
    /// [`expected_output`](crate::RouteRequest::with_expected_output). Default 256.
    pub default_output_tokens: u32,
    /// Weight of a new timing in a worker's learned speed, `0.0..=1.0` (0: never learn).
    /// Default 0.1: the learned speed follows about the last 10 first tokens.
    pub learning_rate: f64,
    /// Router replicas routing for the same fleet, this one included (at least 1; default
    /// 1). Between two reports, each replica sees only its own requests; the others send
    /// about as many, so what this router routed, prefilled and completed since a report
    /// counts this many times over. Without it replicas herd: every one of them sends the
    /// next second's requests to the worker the last report showed least loaded.
    pub replicas: u32,
    /// Whether a fresh report's pending prefill replaces this router's own count of its
    /// requests' prefill, which counts each prompt whole until its first token and so
    /// cannot see a prefill's progress. Default `false`: the larger of the two, the
    /// conservative figure admission holds requests to. [`PdConfig`](crate::PdConfig)
    /// turns it on: its plans compare workers part-way through long prefills.
    pub prefill_from_report: bool,
    /// How admission treats priorities.
    pub admission: crate::AdmissionConfig,
}

impl Default for LoadConfig {
    fn default() -> Self {
        Self {
            max_report_age: Duration::from_secs(5),
            staleness: Staleness::Ignore,
            prefill_tokens_per_s: 33_000.0,
            step: StepModel::default(),
            default_output_tokens: 256,
            learning_rate: 0.1,
            replicas: 1,
            prefill_from_report: false,
            admission: crate::AdmissionConfig::default(),
        }
    }
}

impl LoadConfig {
    crate::config::setters! {
        /// Sets [`max_report_age`](Self::max_report_age).
        with_max_report_age: max_report_age: Duration;
        /// Sets [`staleness`](Self::staleness).
        with_staleness: staleness: Staleness;
        /// Sets [`prefill_tokens_per_s`](Self::prefill_tokens_per_s).
        with_prefill_tokens_per_s: prefill_tokens_per_s: f64;
        /// Sets [`step`](Self::step).
        with_step: step: StepModel;
        /// Sets [`default_output_tokens`](Self::default_output_tokens).
        with_default_output_tokens: default_output_tokens: u32;
        /// Sets [`learning_rate`](Self::learning_rate).
        with_learning_rate: learning_rate: f64;
        /// Sets [`replicas`](Self::replicas).
        with_replicas: replicas: u32;
        /// Sets [`prefill_from_report`](Self::prefill_from_report).
        with_prefill_from_report: prefill_from_report: bool;
        /// Sets [`admission`](Self::admission).
        with_admission: admission: crate::AdmissionConfig;
    }

    /// Checks every field.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the first field out of its range.
    pub fn validate(&self) -> Result<(), Error> {
        float(
            "prefill_tokens_per_s",
            self.prefill_tokens_per_s,
            f64::MIN_POSITIVE..=f64::MAX,
            "a positive number of tokens per second",
        )?;
        float(
            "learning_rate",
            self.learning_rate,
            0.0..=1.0,
            "between 0.0 and 1.0",
        )?;
        crate::config::int("replicas", self.replicas, 1.., "at least 1")?;
        self.admission.validate()?;
        self.step.validate()
    }
}
