//! Admission: a request carrying a time-to-first-token target is routed only to a worker
//! the load model predicts meets it, and is refused with [`Error::Shed`] before any prefill
//! is spent when none does. Critical requests are never refused; sheddable ones are held
//! to a share of their time-to-first-token target, so that under a rising load they go
//! first (a time-per-output-token target is held whole: the steps are shared).

use std::time::Duration;

use smallvec::SmallVec;

use super::policy::{Admit, Policy};
use crate::error::Error;
use crate::fleet::{
    Candidate, Candidates, Fleet, LoadConfig, Prediction, RequestShape, meets_target,
};
use crate::request::{Gate, Limit, Priority, RouteRequest, Shed};
use crate::tree::WorkerId;

/// One request's admission: its target and priority, and the request's shape for the load
/// model's prediction.
pub(crate) struct Admission {
    pub(crate) priority: Priority,
    /// The time-to-first-token target it is held to, in seconds (infinite without one): a
    /// share of the target asked for a sheddable request.
    pub(crate) target_s: f64,
    /// The time-per-output-token target it is held to, in seconds (infinite without one):
    /// the target asked, whatever the priority. The priorities' shares hold the queue, not
    /// the steps: a decode step is shared by every request running on the worker, and a
    /// request admitted within the target costs those beside it nothing they were
    /// promised.
    pub(crate) tpot_target_s: f64,
    /// [`AdmissionConfig::oversized_wait_share`](crate::AdmissionConfig::oversized_wait_share).
    pub(crate) oversized_share: f64,
    /// [`AdmissionConfig::initial_decode_window`](crate::AdmissionConfig::initial_decode_window).
    pub(crate) initial_window: u32,
    pub(crate) prompt: u64,
    pub(crate) output: u32,
}

impl Admission {
    /// The admission of `request`, which asks for it, under `config`.
    #[cold]
    pub(crate) fn of(request: &RouteRequest<'_>, config: &LoadConfig) -> Admission {
        let priority = request.priority();
        let seconds = |target: Option<Duration>| target.map_or(f64::INFINITY, |t| t.as_secs_f64());
        Admission {
            priority,
            target_s: seconds(
                request
                    .ttft_target()
                    .map(|t| config.admission.target_of(priority, t)),
            ),
            tpot_target_s: seconds(request.tpot_target()),
            oversized_share: config.admission.oversized_wait_share,
            initial_window: config.admission.initial_decode_window,
            prompt: request.tokens().len() as u64,
            output: request
                .expected_output()
                .unwrap_or(config.default_output_tokens),
        }
    }
}

/// What a route passes its candidates through before the policy chooses: [`Open`] for a
/// request without a target, its [`Admission`] otherwise.
pub(crate) trait Filter {
    /// Whether the policy's choice `candidates[chosen]` may take `request` as it stands,
    /// the route reading no other worker: only when `exact` (the choice is the one the
    /// policy makes among every worker, by a cost of each worker alone) for a gate that
    /// keeps workers, since the policy's choice among the workers it keeps is then that
    /// one. `candidates` are the workers the route scored; `false` sends the route to
    /// every worker and [`filter`](Self::filter).
    fn passes(
        &self,
        fleet: &Fleet,
        asking: (&dyn Policy, &RouteRequest<'_>),
        chosen: (&Candidates, usize),
        exact: bool,
    ) -> bool;

    /// Keeps the candidates (every available worker) that may take `request`, as
    /// `policy`'s rule says.
    ///
    /// # Errors
    ///
    /// [`Error::Shed`] when none may.
    fn filter(
        &self,
        fleet: &Fleet,
        asking: (&dyn Policy, &RouteRequest<'_>),
        candidates: &mut Candidates,
    ) -> Result<(), Error>;
}

/// Every candidate may take the request.
pub(crate) struct Open;

impl Filter for Open {
    #[inline(always)]
    fn passes(
        &self,
        _: &Fleet,
        _: (&dyn Policy, &RouteRequest<'_>),
        _: (&Candidates, usize),
        _: bool,
    ) -> bool {
        true
    }

    #[inline(always)]
    fn filter(
        &self,
        _: &Fleet,
        _: (&dyn Policy, &RouteRequest<'_>),
        _: &mut Candidates,
    ) -> Result<(), Error> {
        Ok(())
    }
}

impl Filter for Admission {
    /// The policy's rule over the workers scored; under the crate's rule, the choice
    /// predicted to meet the targets and passing the observed gates (any choice for a
    /// critical request). A refusal is never made here: it must hold for every worker.
    fn passes(
        &self,
        fleet: &Fleet,
        (policy, request): (&dyn Policy, &RouteRequest<'_>),
        (candidates, chosen): (&Candidates, usize),
        exact: bool,
    ) -> bool {
        if !exact {
            return false;
        }
        match policy.admit(request, candidates) {
            Admit::All => true,
            Admit::Refuse(_) => false,
            Admit::Predicted if self.priority == Priority::Critical => true,
            Admit::Predicted => candidates.get(chosen).is_some_and(|c| {
                let p = self.prediction(fleet.config(), c);
                self.meets(&p) && self.passes_observed(fleet, &p, c)
            }),
        }
    }

    /// Asks `policy` first; under the crate's rule keeps the candidates predicted to meet
    /// the target (all of them for a critical request, or when every one does), and refuses
    /// the request when none does and it is not critical.
    fn filter(
        &self,
        fleet: &Fleet,
        (policy, request): (&dyn Policy, &RouteRequest<'_>),
        candidates: &mut Candidates,
    ) -> Result<(), Error> {
        let config = fleet.config();
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
            Admit::Predicted => self.keep_meeting(fleet, candidates),
        }
    }
}

impl Admission {
    /// Each candidate's prediction: time to first token part by part, and time per output
    /// token.
    fn predict(&self, config: &LoadConfig, candidates: &Candidates) -> SmallVec<[Prediction; 64]> {
        candidates
            .iter()
            .map(|c| self.prediction(config, c))
            .collect()
    }

    /// Candidate `c`'s prediction ([`Estimate::prediction`](crate::fleet::Estimate)): what
    /// the gates check, and what the decision records when `c` is chosen.
    #[inline]
    pub(crate) fn prediction(&self, config: &LoadConfig, c: &Candidate) -> Prediction {
        let miss = self.prompt.saturating_sub(c.cached_tokens() as u64);
        let shape = RequestShape::new(self.prompt, miss, self.output);
        c.estimate.prediction(config, shape)
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
    /// prefill, which is also what it would take on idle workers) and `tpot_s` meets both
    /// targets, by the rule a worker's prediction meets them.
    pub(crate) fn meets_times(&self, ttft_s: f64, own_s: f64, tpot_s: f64) -> bool {
        meets_target(ttft_s, (own_s, own_s), self.target_s, self.oversized_share)
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

    /// Keeps the candidates predicted to meet the target and, of those, the ones the
    /// observed gates pass (see `observed.rs`); refuses the request when none is kept,
    /// naming the check that refused it.
    fn keep_meeting(&self, fleet: &Fleet, candidates: &mut Candidates) -> Result<(), Error> {
        let predictions = self.predict(fleet.config(), candidates);
        let meets = |p: &Prediction| self.meets(p);
        if predictions.iter().any(meets) {
            let mut kept: SmallVec<[bool; 64]> = predictions.iter().map(meets).collect();
            self.keep_observed(fleet, (&predictions, &mut kept), candidates)?;
            if kept.iter().all(|&k| k) {
                return Ok(());
            }
            let mut kept = kept.into_iter();
            candidates.retain(|_| kept.next().unwrap_or(false));
            return Ok(());
        }
        let (best, worker) = self
            .best_of(&predictions, candidates)
            .ok_or(Error::NoWorkers)?;
        let limit = if best.idle_tpot_s > self.tpot_target_s {
            // Even alone on a worker its decode steps take longer: no wait helps.
            Limit::Prompt
        } else if best.tpot_s / self.tpot_target_s > best.ttft.total_s() / self.target_s {
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
    /// and per output token: by the model's check, or the prompt's when no wait helps.
    pub(super) fn shed(&self, (total, tpot_s): (f64, f64), worker: WorkerId, limit: Limit) -> Shed {
        let gate = if limit == Limit::Prompt {
            Gate::Prompt
        } else {
            Gate::Model
        };
        let (measured, threshold) =
            if limit == Limit::Decode || (limit == Limit::Prompt && tpot_s > self.tpot_target_s) {
                (tpot_s, self.tpot_target_s)
            } else {
                (total, self.target_s)
            };
        let wait = (total - self.target_s).max(0.0);
        let mut shed = self.shed_at((total, tpot_s), worker, limit, wait);
        shed.gate = gate;
        shed.measured = seconds(measured);
        shed.threshold = seconds(threshold);
        shed
    }

    /// The refusal of the best worker's predicted times, bound by `limit`, with
    /// `retry_after` from `wait_s` (none for [`Limit::Prompt`]); the gate is the model's
    /// until the caller names another.
    pub(super) fn shed_at(
        &self,
        (total, tpot_s): (f64, f64),
        worker: WorkerId,
        limit: Limit,
        wait: f64,
    ) -> Shed {
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
            gate: Gate::Model,
            measured: seconds(total),
            threshold: seconds(self.target_s),
            retry_after: (limit != Limit::Prompt).then(|| seconds(wait)),
        }
    }
}

/// `s` seconds as a duration, clamped to `0..=10^9` s.
pub(super) fn seconds(s: f64) -> Duration {
    Duration::from_secs_f64(if s.is_nan() { 0.0 } else { s.clamp(0.0, 1e9) })
}
