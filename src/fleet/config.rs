//! How a router reads its fleet: [`LoadConfig`] (report ages, the nominal prefill rate and
//! step model, learning, replicas, admission's settings) and what a host tells of one worker
//! ([`WorkerProfile`]).

use std::time::Duration;

use super::report::Staleness;
use super::step::StepModel;
use crate::config::float;
use crate::error::Error;

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
    /// Output tokens over which the load model counts the worker's present decodes in a
    /// request's decode time ([`Candidate::predicted_decode_s`](crate::Candidate::predicted_decode_s)):
    /// a request's answer beyond them is predicted at the same cost on every worker. The
    /// batch a request joins lasts as long as its decodes do; past that, it holds what the
    /// router sends meanwhile, which it balances. Counted over a whole long answer, the
    /// batch of the moment outweighs a session's whole recomputation: sessions answering
    /// in thousands of tokens leave the worker holding their context for whichever worker
    /// decodes least now. Default 256, [`default_output_tokens`](Self::default_output_tokens)'s
    /// typical answer (the simulator's `agentic_long` workload, answers of 2,000 tokens,
    /// at 1× and 4×: 90.8 % and 93.2 % of the pooled hit ratio over the whole answer, 99.2 %
    /// and 98.6 % over 256 tokens; `benches/README.md`). `u32::MAX` counts the whole answer.
    pub decode_horizon_tokens: u32,
    /// Whether the router learns the step terms from the timings its host reports,
    /// `0.0..=1.0`: 0 never learns (every worker keeps the configured terms at its
    /// profile's speed); any other value learns. Default 0.1. What is learned and how fast
    /// is set by the learning itself: the fleet's terms from every worker's timings, and
    /// each worker's factors over them (its own terms against the fleet's at its typical
    /// timing of the last 50 or so), counted beyond about 16 %. A router that never learns
    /// also predicts for admission by the load as counted, not by its forecast
    /// (`docs/admission.md`).
    pub learning_rate: f64,
    /// Router replicas routing for the same fleet, this one included (at least 1; default
    /// 1). Between two reports, each replica sees only its own requests; the others send
    /// about as many, so what this router routed, prefilled and completed since a report
    /// counts this many times over. Without it replicas herd: every one of them sends the
    /// next second's requests to the worker the last report showed least loaded. With
    /// replica sync ([`PolicyRouter::with_replica_sync`](crate::PolicyRouter::with_replica_sync))
    /// the peers' requests count themselves, and the counts since a report are multiplied
    /// by `max(replicas, 1 + peers heard) / (1 + peers heard)` instead: 1 once every
    /// replica is heard, so sync needs no multiplier.
    pub replicas: u32,
    /// Whether a fresh report's pending prefill replaces this router's own count of its
    /// requests' prefill, which counts each prompt whole until its first token and so
    /// cannot see a prefill's progress. Default `false`: the larger of the two, the
    /// conservative figure admission holds requests to. [`PdConfig`](crate::PdConfig)
    /// turns it on: its plans compare workers part-way through long prefills.
    pub prefill_from_report: bool,
    /// How admission treats priorities.
    pub admission: crate::request::AdmissionConfig,
    /// The load at which a worker counts as fully busy in the fleet's load
    /// ([`Candidate::fleet_load`](crate::Candidate::fleet_load)): its time to a first token
    /// of a request with nothing of its own, beyond an idle worker's. Above zero. Default
    /// 0.5 s (the simulator's results matrix chose it, with
    /// [`MissWeight`](crate::MissWeight)'s default: `benches/README.md`).
    pub busy_horizon: Duration,
}

impl Default for LoadConfig {
    fn default() -> Self {
        Self {
            max_report_age: Duration::from_secs(5),
            staleness: Staleness::Ignore,
            prefill_tokens_per_s: 33_000.0,
            step: StepModel::default(),
            default_output_tokens: 256,
            decode_horizon_tokens: 256,
            learning_rate: 0.1,
            replicas: 1,
            prefill_from_report: false,
            admission: crate::request::AdmissionConfig::default(),
            busy_horizon: Duration::from_millis(500),
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
        /// Sets [`decode_horizon_tokens`](Self::decode_horizon_tokens).
        with_decode_horizon_tokens: decode_horizon_tokens: u32;
        /// Sets [`learning_rate`](Self::learning_rate).
        with_learning_rate: learning_rate: f64;
        /// Sets [`replicas`](Self::replicas).
        with_replicas: replicas: u32;
        /// Sets [`prefill_from_report`](Self::prefill_from_report).
        with_prefill_from_report: prefill_from_report: bool;
        /// Sets [`admission`](Self::admission).
        with_admission: admission: crate::request::AdmissionConfig;
        /// Sets [`busy_horizon`](Self::busy_horizon).
        with_busy_horizon: busy_horizon: Duration;
    }

    /// Checks every field.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the first field out of its range.
    pub fn validate(&self) -> Result<(), Error> {
        if self.busy_horizon.is_zero() {
            return Err(crate::config::invalid(
                "busy_horizon",
                "0 s",
                "a duration above zero",
            ));
        }
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
