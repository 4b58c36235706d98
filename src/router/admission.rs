//! Admission: a request carrying a time-to-first-token target is routed only to a worker
//! the load model predicts meets it, and is refused with [`Error::Shed`] before any prefill
//! is spent when none does. Critical requests are never refused; sheddable ones are held
//! to a share of their target, so that under a rising load they go first.

use std::time::Duration;

use smallvec::SmallVec;

use super::RouteRequest;
use super::fleet::Candidates;
use super::load::LoadConfig;
use super::policy::{Candidate, Policy};
use super::predict::{TtftParts, meets_target};
use crate::{Error, WorkerId};

/// How much a request matters under overload, as the Gateway API Inference Extension names
/// it: sheddable requests are refused first, then standard ones; critical ones never.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Refused first: held to [`AdmissionConfig::sheddable_share`] of its target.
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

    /// The priority named `name` (as [`name`](Self::name) gives it).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for any other name.
    pub fn parse(name: &str) -> Result<Self, Error> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| {
                crate::config::invalid("priority", name, "critical, standard or sheddable")
            })
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

/// Why a request was refused ([`Error::Shed`]).
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

/// A [`Policy`]'s own admission rule's verdict on a request asking for admission
/// ([`Policy::admit`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Admit {
    /// The crate's rule: the request goes to a worker predicted to meet its target, and is
    /// refused when none is (unless it is [`Priority::Critical`]). The default.
    #[default]
    Predicted,
    /// The request is admitted, and the policy chooses among every candidate.
    All,
    /// The request is refused ([`Error::Shed`]), bound by this limit. The refusal reports
    /// the load model's best prediction all the same, so that hosts see one shape of
    /// refusal whichever rule made it.
    Refuse(Limit),
}

/// How admission treats priorities.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct AdmissionConfig {
    /// The share of its target a [`Priority::Sheddable`] request is held to, in `(0, 1]`:
    /// at 0.5 sheddable requests are refused once the best worker's predicted time to
    /// first token passes half their target, leaving the rest to standard ones. Default 0.5.
    pub sheddable_share: f64,
    /// For a request whose own prefill alone is predicted to miss its target (an idle
    /// worker could not meet it either, [`Limit::Prompt`]): the share of its target the rest
    /// of its predicted time (the wait ahead of it, the steps it shares) may take. Such a
    /// request is served where it delays little and refused where the fleet is busy, when it
    /// would stall others for nothing it could meet. In `[0, 1]`; 0 refuses every such
    /// request. Default 0.1.
    pub oversized_wait_share: f64,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            sheddable_share: 0.5,
            oversized_wait_share: 0.1,
        }
    }
}

impl AdmissionConfig {
    crate::config::setters! {
        /// Sets [`sheddable_share`](Self::sheddable_share).
        with_sheddable_share: sheddable_share: f64;
        /// Sets [`oversized_wait_share`](Self::oversized_wait_share).
        with_oversized_wait_share: oversized_wait_share: f64;
    }

    /// Checks every field.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the first field out of its range.
    pub fn validate(&self) -> Result<(), Error> {
        crate::config::float(
            "sheddable_share",
            self.sheddable_share,
            f64::MIN_POSITIVE..=1.0,
            "a share above 0 and at most 1",
        )?;
        crate::config::float(
            "oversized_wait_share",
            self.oversized_wait_share,
            0.0..=1.0,
            "a share from 0 to 1",
        )
    }

    /// The target a request of `priority` asking for `target` is held to.
    #[must_use]
    pub fn target_of(&self, priority: Priority, target: Duration) -> Duration {
        match priority {
            Priority::Sheddable => target.mul_f64(self.sheddable_share),
            Priority::Standard | Priority::Critical => target,
        }
    }
}

/// One request's admission: its target and priority, and the request's shape for the load
/// model's prediction.
pub(crate) struct Admission {
    pub(crate) priority: Priority,
    /// The time-to-first-token target it is held to, in seconds (infinite without one).
    pub(crate) target_s: f64,
    /// The time-per-output-token target it is held to, in seconds (infinite without one).
    pub(crate) tpot_target_s: f64,
    /// [`AdmissionConfig::oversized_wait_share`].
    pub(crate) oversized_share: f64,
    pub(crate) prompt: u64,
    pub(crate) output: u32,
}

/// What a route passes its candidates through before the policy chooses: [`Open`] for a
/// request without a target, its [`Admission`] otherwise.
pub(crate) trait Gate {
    /// Whether the candidates may be a shortlist; admission needs every worker.
    const SHORTLIST: bool;

    /// Keeps the candidates that may take `request`, as `policy`'s rule says.
    ///
    /// # Errors
    ///
    /// [`Error::Shed`] when none may.
    fn filter(
        &self,
        config: &LoadConfig,
        asking: (&dyn Policy, &RouteRequest<'_>),
        candidates: &mut Candidates,
    ) -> Result<(), Error>;
}

/// Every candidate may take the request.
pub(crate) struct Open;

impl Gate for Open {
    const SHORTLIST: bool = true;

    #[inline(always)]
    fn filter(
        &self,
        _: &LoadConfig,
        _: (&dyn Policy, &RouteRequest<'_>),
        _: &mut Candidates,
    ) -> Result<(), Error> {
        Ok(())
    }
}

impl Gate for Admission {
    const SHORTLIST: bool = false;

    /// Asks `policy` first; under the crate's rule keeps the candidates predicted to meet
    /// the target (all of them for a critical request, or when every one does), and refuses
    /// the request when none does and it is not critical.
    fn filter(
        &self,
        config: &LoadConfig,
        (policy, request): (&dyn Policy, &RouteRequest<'_>),
        candidates: &mut Candidates,
    ) -> Result<(), Error> {
        match policy.admit(request, candidates) {
            Admit::All => Ok(()),
            Admit::Refuse(limit) => {
                let predictions = self.predict(config, candidates);
                let (best, worker) = self
                    .best_of(&predictions, candidates)
                    .ok_or(Error::NoWorkers)?;
                Err(Error::Shed(self.shed(
                    (best.ttft.total_s(), best.tpot_s),
                    worker,
                    limit,
                )))
            }
            Admit::Predicted if self.priority == Priority::Critical => Ok(()),
            Admit::Predicted => self.keep_meeting(config, candidates),
        }
    }
}

/// A candidate's predicted times.
#[derive(Clone, Copy, Debug)]
struct Prediction {
    ttft: TtftParts,
    tpot_s: f64,
}

impl Admission {
    /// Each candidate's prediction: time to first token part by part, and time per output
    /// token.
    fn predict(&self, config: &LoadConfig, candidates: &Candidates) -> SmallVec<[Prediction; 64]> {
        candidates
            .iter()
            .map(|c| {
                let miss = self.prompt.saturating_sub(c.cached_tokens() as u64);
                let request = (self.prompt, miss, self.output);
                Prediction {
                    ttft: c.estimate.ttft_parts(config, request, c.speed()),
                    tpot_s: c.estimate.tpot_s(config, request, c.speed()),
                }
            })
            .collect()
    }

    /// Whether `p` meets both targets.
    fn meets(&self, p: &Prediction) -> bool {
        p.ttft.meets(self.target_s, self.oversized_share) && p.tpot_s <= self.tpot_target_s
    }

    /// How far `p` is from meeting the targets: the larger of its ratios to them.
    fn distance(&self, p: &Prediction) -> f64 {
        self.distance_of(p.ttft.total_s(), p.tpot_s)
    }

    /// How far predicted times of `ttft_s` and `tpot_s` are from meeting the targets: the
    /// larger of their ratios to them.
    pub(crate) fn distance_of(&self, ttft_s: f64, tpot_s: f64) -> f64 {
        (ttft_s / self.target_s).max(tpot_s / self.tpot_target_s)
    }

    /// Whether a plan predicted at `ttft_s` (of which `own_s` is the request's own
    /// prefill) and `tpot_s` meets both targets, by the rule a worker's prediction meets
    /// them.
    pub(crate) fn meets_times(&self, ttft_s: f64, own_s: f64, tpot_s: f64) -> bool {
        meets_target(ttft_s, own_s, self.target_s, self.oversized_share)
            && tpot_s <= self.tpot_target_s
    }

    /// The refusal of a request whose best plan, on `worker`, is predicted at `ttft_s` (of
    /// which `own_s` is its own prefill) and `tpot_s`: bound by the decodes when the
    /// time per output token is the further from its target, by the prompt when its own
    /// prefill alone misses the target, else by the queue.
    pub(crate) fn refusal(
        &self,
        (ttft_s, own_s, tpot_s): (f64, f64, f64),
        worker: WorkerId,
    ) -> Shed {
        let limit = if tpot_s / self.tpot_target_s > ttft_s / self.target_s {
            Limit::Decode
        } else if own_s > self.target_s {
            Limit::Prompt
        } else {
            Limit::Queue
        };
        self.shed((ttft_s, tpot_s), worker, limit)
    }

    /// Keeps the candidates predicted to meet the target, or refuses the request when none
    /// is.
    fn keep_meeting(&self, config: &LoadConfig, candidates: &mut Candidates) -> Result<(), Error> {
        let predictions = self.predict(config, candidates);
        let meets = |p: &Prediction| self.meets(p);
        if predictions.iter().all(meets) {
            return Ok(());
        }
        if predictions.iter().any(meets) {
            let mut kept = predictions.iter().map(meets);
            candidates.retain(|_| kept.next().unwrap_or(false));
            return Ok(());
        }
        let (best, worker) = self
            .best_of(&predictions, candidates)
            .ok_or(Error::NoWorkers)?;
        let limit = if best.tpot_s / self.tpot_target_s > best.ttft.total_s() / self.target_s {
            Limit::Decode
        } else {
            best.ttft.limit(self.target_s)
        };
        Err(Error::Shed(self.shed(
            (best.ttft.total_s(), best.tpot_s),
            worker,
            limit,
        )))
    }

    /// The prediction of `predictions` (one per candidate) nearest to meeting the targets,
    /// with its worker.
    fn best_of(
        &self,
        predictions: &[Prediction],
        candidates: &[Candidate],
    ) -> Option<(Prediction, WorkerId)> {
        predictions
            .iter()
            .zip(candidates)
            .min_by(|a, b| self.distance(a.0).total_cmp(&self.distance(b.0)))
            .map(|(p, c)| (*p, c.worker))
    }

    /// The refusal bound by `limit`, from the best worker's predicted times to first token
    /// and per output token.
    fn shed(&self, (total, tpot_s): (f64, f64), worker: WorkerId, limit: Limit) -> Shed {
        let wait = (total - self.target_s).max(0.0);
        let seconds = |s: f64| Duration::from_secs_f64(s.clamp(0.0, 1e9));
        Shed {
            priority: self.priority,
            target: seconds(self.target_s),
            tpot_target: self
                .tpot_target_s
                .is_finite()
                .then(|| seconds(self.tpot_target_s)),
            best_ttft: seconds(total),
            best_tpot: seconds(tpot_s),
            best_worker: worker,
            limit,
            retry_after: (limit != Limit::Prompt).then(|| seconds(wait)),
        }
    }
}
