//! The shared vocabulary of admission: a request's [`Priority`], what bound a prediction
//! ([`Limit`]), and a refusal ([`Shed`]). Below the fleet model, which predicts and names
//! limits, and below admission and the policies, which refuse; it imports neither.

use std::time::Duration;

use crate::tree::WorkerId;

/// How much a request matters under overload, as the Gateway API Inference Extension names
/// it: sheddable requests are refused first, then standard ones; critical ones never.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Refused first: held to [`AdmissionConfig::sheddable_share`](crate::AdmissionConfig::sheddable_share) of its target.
    Sheddable,
    /// Refused when no worker is predicted to meet its target. The default.
    #[default]
    Standard,
    /// Never refused: routed as without a target.
    Critical,
}

impl Priority {
    /// Every priority, from the first refused.
    pub const ALL: [Priority; 3] = [Priority::Sheddable, Priority::Standard, Priority::Critical];

    /// The priority's name: `sheddable`, `standard` or `critical`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Priority::Sheddable => "sheddable",
            Priority::Standard => "standard",
            Priority::Critical => "critical",
        }
    }
}

/// What bound the best worker's predicted time to first token, in a [`Shed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Limit {
    /// The prefill queued ahead of the request.
    Queue,
    /// The wait for KV to free up (the worker's KV is full).
    Kv,
    /// The running decodes: their share of every step, or the wait for a running slot.
    Decode,
    /// The request's own prefill: even an idle worker would miss the target, so waiting
    /// does not help.
    Prompt,
    /// The worker's load report is stale and counts as saturation.
    Stale,
}

impl Limit {
    /// The limit's name: `queue`, `kv`, `decode`, `prompt` or `stale`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Limit::Queue => "queue",
            Limit::Kv => "kv",
            Limit::Decode => "decode",
            Limit::Prompt => "prompt",
            Limit::Stale => "stale",
        }
    }
}

/// Every [`Limit`], in the order [`FleetSignals::shed_by_limit`](crate::FleetSignals::shed_by_limit) counts them.
pub const LIMITS: [Limit; 5] = [
    Limit::Queue,
    Limit::Kv,
    Limit::Decode,
    Limit::Prompt,
    Limit::Stale,
];

/// Which of admission's checks refused a request, in a [`Shed`]. The load model's check
/// runs first; the observed gates can only refuse more of what it admits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Gate {
    /// The load model's prediction missed a target.
    Model,
    /// The request's own prefill, or its decode steps alone, miss the target on an idle
    /// worker: no wait helps.
    Prompt,
    /// The worker's prefill window: the prediction scaled by how much slower than predicted
    /// the worker's first tokens came (or are coming) misses the time-to-first-token target.
    PrefillWindow,
    /// The worker's decode bound: the decode step scaled by how much slower than predicted
    /// its streamed progress was misses the time-per-output-token target.
    DecodeBound,
}

impl Gate {
    /// The gate's name: `model`, `prompt`, `prefill_window` or `decode_bound`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Gate::Model => "model",
            Gate::Prompt => "prompt",
            Gate::PrefillWindow => "prefill_window",
            Gate::DecodeBound => "decode_bound",
        }
    }
}

/// Every [`Gate`], in the order [`FleetSignals::shed_by_gate`](crate::FleetSignals::shed_by_gate) counts them.
pub const GATES: [Gate; 4] = [
    Gate::Model,
    Gate::Prompt,
    Gate::PrefillWindow,
    Gate::DecodeBound,
];

/// Why a request was refused ([`Error::Shed`](crate::Error::Shed)).
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Shed {
    /// The request's priority.
    pub priority: Priority,
    /// The time-to-first-token target it was held to: its own, or a share of it for a
    /// sheddable request (`Duration::MAX`'s stand-in, 10^9 s, without one).
    pub target: Duration,
    /// The time-per-output-token target it was held to, if it had one: its own, whatever
    /// the priority.
    pub tpot_target: Option<Duration>,
    /// The best worker's predicted time to first token: the best worker is the one nearest
    /// to meeting the targets (the least of the larger ratio of prediction to target).
    pub best_ttft: Duration,
    /// The best worker's predicted time per output token.
    pub best_tpot: Duration,
    /// The best worker.
    pub best_worker: WorkerId,
    /// What bound that prediction most.
    pub limit: Limit,
    /// The check that refused it.
    pub gate: Gate,
    /// What the gate measured on the best worker: a time to first token, or a time per
    /// output token for [`Gate::DecodeBound`] (and for the model's check when the decode
    /// bound it), scaled by what was observed for the observed gates.
    pub measured: Duration,
    /// The threshold `measured` passed: the target it was held to.
    pub threshold: Duration,
    /// How long until the best worker is predicted to meet the target, if nothing more
    /// arrives there: when a host queues the request instead of refusing it, the time to
    /// route it again. `None` when waiting cannot help ([`Limit::Prompt`]).
    pub retry_after: Option<Duration>,
}

impl std::fmt::Display for Shed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} request shed: best predicted time to first token {:.3} s",
            self.priority.name(),
            self.best_ttft.as_secs_f64(),
        )?;
        if self.target < Duration::from_secs(1_000_000_000) {
            write!(f, " against a target of {:.3} s", self.target.as_secs_f64())?;
        }
        if let Some(tpot) = self.tpot_target {
            write!(
                f,
                ", per output token {:.4} s against {:.4} s",
                self.best_tpot.as_secs_f64(),
                tpot.as_secs_f64()
            )?;
        }
        write!(
            f,
            " (worker {}, bound by {}; gate {}: {:.4} s against {:.4} s)",
            self.best_worker.index(),
            self.limit.name(),
            self.gate.name(),
            self.measured.as_secs_f64(),
            self.threshold.as_secs_f64(),
        )
    }
}
