//! Admission's observed gates, after the load model's check: a worker the model predicts
//! meets the targets is kept only if it still does by what the worker was observed to
//! deliver (the fleet's `observed.rs`).
//!
//! - The **prefill window**: the predicted time to first token times the prefill factor
//!   (with the wait for a first token as evidence) must meet the target, by the rule the
//!   model's prediction meets it. Its room is the outstanding prefill the model counts,
//!   which only first tokens and completions free.
//! - The **decode bound**: the time per output token the worker's requests would see with
//!   the request added must meet the time-per-output-token target the request asked for
//!   (whatever its priority: a request admitted within it costs those running beside it
//!   nothing they were promised). Chunked prefill shares the decode steps: the decodes get
//!   the time the prefill leaves, so the bound is the model's decode step with the request
//!   in the batch over one minus the share of the worker's time the prefill admitted there
//!   takes, this request's included, at the observed prefill rate (decayed over
//!   [`PREFILL_HORIZON_S`]), times the step factor where streamed progress showed the
//!   steps slower than that. Before the host reported progress from the worker, the
//!   initial window holds it too
//!   ([`AdmissionConfig::initial_decode_window`](crate::AdmissionConfig::initial_decode_window)),
//!   in the same measure: the target times the requests there, this one included, over
//!   the window.
//!
//! Both only refuse more than the model; while the host reports nothing timed for any
//! worker there are no factors and both pass, which is the router's behaviour without
//! them. A refusal names the gate of the best worker (nearest to passing), the value it
//! measured and the threshold; `retry_after` is the observed excess: the time the prefill
//! ahead takes to drain at the observed rate, or the time the admitted prefill takes to
//! decay to what the target leaves it (at most one [`PREFILL_HORIZON_S`]).

use super::admission::Admission;
use crate::error::Error;
use crate::fleet::{
    Candidate, Candidates, Fleet, ObservedFactors, PREFILL_HORIZON_S, Prediction, meets_target,
    stretched,
};
use crate::request::{Gate, Limit, Shed};

/// A candidate's predictions scaled by its factors: the times the gates hold to the
/// targets.
#[derive(Clone, Copy, Debug)]
struct GatedTimes {
    ttft_s: f64,
    own_s: f64,
    idle_s: f64,
    step_s: f64,
    /// The decode step with the request in the batch at the observed step, before the
    /// prefill shares it.
    unshared_s: f64,
    /// The share of the worker's time the admitted prefill takes, the request's included.
    prefill_share: f64,
}

impl GatedTimes {
    /// Prediction `p` scaled by factors `f` of a worker holding `requests` requests, the
    /// request's decode bound `bound_s` (its time-per-output-token target) and the initial
    /// decode window `window`.
    fn of(
        p: &Prediction,
        f: &ObservedFactors,
        requests: u64,
        (bound_s, window): (f64, u32),
    ) -> Self {
        let k = f.prefill_at(p.ttft.drained_s + p.ttft.queue_s + p.ttft.steps_s);
        // The share of the worker's time the prefill admitted there takes, this request's
        // included: the decode steps get the rest.
        let prefill_share = f.prefill_share(p.ttft.own_s);
        let shared_s = stretched(p.tpot_s, prefill_share);
        let held_s = if f.progressed || window == 0 {
            0.0
        } else {
            bound_s * (requests as f64 + 1.0) / f64::from(window)
        };
        // The step factor corrects the model where streamed progress shows it slower, never
        // where it shows it faster: the model's decode terms learn that themselves.
        let step = f.step.max(1.0);
        let step_s = (step * shared_s).max(held_s);
        GatedTimes {
            ttft_s: k * p.ttft.total_s(),
            own_s: k * p.ttft.own_s,
            idle_s: k * p.ttft.idle_s,
            step_s,
            unshared_s: step * p.tpot_s,
            prefill_share,
        }
    }
}

/// Whether candidate `c` has nothing in flight: the observed gates pass it, so that a
/// request the model admits there probes the worker. What the gates observed is how the
/// worker served the requests it had; with none left, nothing it observed is still under
/// way, and only a new first token can tell whether the worker is still slow. Without the
/// probe, a fleet that was slow once refuses every request for good: nothing admitted,
/// nothing observed, nothing unlearned.
#[inline]
fn probe(c: &Candidate) -> bool {
    c.requests() == 0
}

impl Admission {
    /// Whether candidate `c`, predicted `p` and kept by the model, passes the observed
    /// gates (it does while the fleet reports nothing timed).
    pub(super) fn passes_observed(&self, fleet: &Fleet, p: &Prediction, c: &Candidate) -> bool {
        probe(c)
            || fleet.factors_of(c).is_none_or(|f| {
                let o = GatedTimes::of(
                    p,
                    &f,
                    c.requests(),
                    (self.tpot_target_s, self.initial_window),
                );
                self.passes_gates(&o)
            })
    }

    /// Clears in `kept` (the candidates the model keeps, one per prediction) those the
    /// observed gates refuse; refuses the request when none is left.
    pub(super) fn keep_observed(
        &self,
        fleet: &Fleet,
        (predictions, kept): (&[Prediction], &mut [bool]),
        candidates: &Candidates,
    ) -> Result<(), Error> {
        let factors = fleet.factors(candidates);
        if factors.iter().all(Option::is_none) {
            return Ok(());
        }
        let mut best: Option<(f64, usize, GatedTimes)> = None;
        let mut any = false;
        for (i, (p, f)) in predictions.iter().zip(&factors).enumerate() {
            let (Some(f), true) = (f, kept[i]) else {
                continue;
            };
            if probe(&candidates[i]) {
                any = true;
                continue;
            }
            let requests = candidates[i].requests();
            let o = GatedTimes::of(p, f, requests, (self.tpot_target_s, self.initial_window));
            if self.passes_gates(&o) {
                any = true;
                continue;
            }
            kept[i] = false;
            let distance = self.distance_of(o.ttft_s, o.step_s);
            if best.is_none_or(|b| distance < b.0) {
                best = Some((distance, i, o));
            }
        }
        match best {
            Some((_, i, o)) if !any => {
                let shed = self.observed_refusal(&predictions[i], o, candidates[i].worker);
                Err(Error::Shed(shed))
            }
            _ => Ok(()),
        }
    }

    /// Whether observed times `o` pass both gates.
    fn passes_gates(&self, o: &GatedTimes) -> bool {
        self.window_passes(o) && o.step_s <= self.tpot_target_s
    }

    /// Whether observed times `o` pass the prefill window.
    fn window_passes(&self, o: &GatedTimes) -> bool {
        meets_target(
            o.ttft_s,
            (o.own_s, o.idle_s),
            self.target_s,
            self.oversized_share,
        )
    }

    /// The refusal of the best worker, `worker`, predicted `p` and observed `o`: by the
    /// prefill window when it does not pass, else by the decode bound.
    fn observed_refusal(
        &self,
        p: &Prediction,
        o: GatedTimes,
        worker: crate::tree::WorkerId,
    ) -> Shed {
        let times = (p.ttft.total_s(), p.tpot_s);
        if !self.window_passes(&o) {
            // Waiting helps by the time the work ahead takes at the observed rate, at most.
            let wait = (o.ttft_s - self.target_s).min(o.ttft_s - o.own_s).max(0.0);
            let mut shed = self.shed_at(times, worker, Limit::Queue, wait);
            shed.gate = Gate::PrefillWindow;
            shed.measured = super::admission::seconds(o.ttft_s);
            shed.threshold = super::admission::seconds(self.target_s);
            return shed;
        }
        // The admitted prefill decays at the horizon's rate: the step is within the target
        // once its share has decayed to what the target leaves the prefill. Where the
        // steps miss the target without any prefill (or the initial window holds), what
        // helps is the running requests finishing, which no figure here times: one horizon.
        // Never more than one: by then the share is read from what was admitted since, and
        // the factors from the first tokens since.
        let room = 1.0 - o.unshared_s / self.tpot_target_s;
        let wait = if room > 0.0 && o.prefill_share > room && o.step_s > o.unshared_s {
            (PREFILL_HORIZON_S * (o.prefill_share / room).ln()).min(PREFILL_HORIZON_S)
        } else {
            PREFILL_HORIZON_S
        };
        let mut shed = self.shed_at(times, worker, Limit::Decode, wait);
        shed.gate = Gate::DecodeBound;
        shed.measured = super::admission::seconds(o.step_s);
        shed.threshold = super::admission::seconds(self.tpot_target_s);
        shed
    }
}
