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

/// Why a request was refused ([`Error::Shed`](crate::Error::Shed)).
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Shed {
    /// The request's priority.
    pub priority: Priority,
    /// The time-to-first-token target it was held to: its own, or a share of it for a
    /// sheddable request (`Duration::MAX`'s stand-in, 10^9 s, without one).
    pub target: Duration,
    /// The time-per-output-token target it was held to, if it had one.
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
            " (worker {}, bound by {})",
            self.best_worker.index(),
            self.limit.name()
        )
    }
}
