//! Admission's observed gates, after the load model's check: a worker the model predicts
//! meets the targets is kept only if it still does with its predictions scaled by what
//! the worker was observed to deliver (the fleet's `observed.rs`).
//!
//! - The **prefill window**: the predicted time to first token times the prefill factor
//!   (with the wait for a first token as evidence) must meet the target, by the rule the
//!   model's prediction meets it. Its room is the outstanding prefill the model counts,
//!   which only first tokens and completions free.
//! - The **decode bound**: the decode step the request would join, times the step factor
//!   from streamed progress, must meet the time-per-output-token target. The step counts
//!   every request routed there and not completed, those admitted since the last report
//!   included.
//!
//! Both only refuse more than the model; a worker the host reports nothing timed for has
//! no factors and passes both, which is the router's behaviour without them. A refusal
//! names the gate of the best worker (nearest to passing), the value it measured and the
//! threshold; `retry_after` is the observed excess: the time the prefill ahead takes to
//! drain at the observed rate, or the decode steps until the batch is small enough.

use super::admission::{Admission, Prediction};
use crate::error::Error;
use crate::fleet::{Candidates, Factors, Fleet, meets_target};
use crate::request::{Gate, Limit, Shed};

/// A candidate's predictions scaled by its factors.
#[derive(Clone, Copy, Debug)]
struct Observed {
    ttft_s: f64,
    own_s: f64,
    idle_s: f64,
    step_s: f64,
}

impl Observed {
    fn of(p: &Prediction, f: &Factors) -> Self {
        let k = f.prefill_at(p.ttft.queue_s + p.ttft.steps_s);
        Observed {
            ttft_s: k * p.ttft.total_s(),
            own_s: k * p.ttft.own_s,
            idle_s: k * p.ttft.idle_s,
            step_s: f.step * p.tpot_s,
        }
    }
}

impl Admission {
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
        let mut best: Option<(f64, usize, Observed)> = None;
        let mut any = false;
        for (i, (p, f)) in predictions.iter().zip(&factors).enumerate() {
            let (Some(f), true) = (f, kept[i]) else {
                continue;
            };
            let o = Observed::of(p, f);
            if self.passes(&o) {
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
    fn passes(&self, o: &Observed) -> bool {
        self.window_passes(o) && o.step_s <= self.tpot_target_s
    }

    /// Whether observed times `o` pass the prefill window.
    fn window_passes(&self, o: &Observed) -> bool {
        meets_target(
            o.ttft_s,
            (o.own_s, o.idle_s),
            self.target_s,
            self.oversized_share,
        )
    }

    /// The refusal of the best worker, `worker`, predicted `p` and observed `o`: by the
    /// prefill window when it does not pass, else by the decode bound.
    fn observed_refusal(&self, p: &Prediction, o: Observed, worker: crate::tree::WorkerId) -> Shed {
        let times = (p.ttft.total_s(), p.tpot_s);
        if !self.window_passes(&o) {
            let wait = (o.ttft_s - self.target_s).max(0.0);
            let mut shed = self.shed_at(times, worker, Limit::Queue, wait);
            shed.gate = Gate::PrefillWindow;
            shed.measured = super::admission::seconds(o.ttft_s);
            shed.threshold = super::admission::seconds(self.target_s);
            return shed;
        }
        // The batch is small enough once a share 1 - target / step of it has finished: at
        // the observed step, that share of the output the request was charged with.
        let share = 1.0 - self.tpot_target_s / o.step_s;
        let wait = o.step_s * f64::from(self.output.max(1)) * share;
        let mut shed = self.shed_at(times, worker, Limit::Decode, wait);
        shed.gate = Gate::DecodeBound;
        shed.measured = super::admission::seconds(o.step_s);
        shed.threshold = super::admission::seconds(self.tpot_target_s);
        shed
    }
}
