//! What a route charges its worker and what its first token and completion release: the
//! load counters, the load key, the capture counters, and the timing the worker's learned
//! speed is taught by.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::candidate::Candidate;
use super::clock::nanos;
use super::learned::timing::{TermCounts, attended};
use super::prediction::estimate::{Estimate, RequestShape};
use super::prediction::predict::Prediction;
use super::registry::slots::Registered;
use super::tracker::Fleet;
use crate::request::{RouteDecision, RouteRequest};

impl Fleet {
    /// Charges the chosen worker with the request (and the candidate's predicted cached
    /// tokens), unless it was removed (or removed and added again) since it was chosen: then
    /// `None`, and the caller chooses again. `checked` is the prediction admission checked
    /// of the candidate, which the decision records as it is; without one, the decision
    /// records the same prediction from the terms it counts (equal up to rounding: the
    /// learned terms' dot product, which the plain route's instruction budget affords).
    pub(crate) fn commit(
        &self,
        candidate: &Candidate,
        request: &RouteRequest<'_>,
        (available_blocks, checked): (u32, Option<&Prediction>),
    ) -> Option<RouteDecision> {
        let slots = self.registry.read();
        let r = slots.get(candidate.worker.index())?;
        let Registered { slot, key } = r;
        if slot.epoch != candidate.epoch {
            return None;
        }
        let prompt_tokens = request.tokens().len();
        let cached_tokens = candidate.cached_tokens().min(prompt_tokens);
        let prefill = (prompt_tokens - cached_tokens) as u64;
        let output = request
            .expected_output()
            .unwrap_or(self.config.default_output_tokens);
        // The terms of the load as the policies count it, which the worker's terms learn
        // from, and of the forecast admission checks (`forecast.rs`), which its forecast
        // terms learn from; the predictions recorded are the forecast's.
        let e = &candidate.estimate;
        let shape = RequestShape::new(prompt_tokens as u64, prefill, output);
        let (ttft_counts, tpot_counts) = (e.ttft_counts(&self.config, shape), e.tpot_counts(shape));
        let forecast_counts = e.forecast_counts(&self.config, shape, ttft_counts);
        let predicted = match checked {
            Some(p) => (p.ttft.total_s(), p.tpot_s),
            None => e.recorded_prediction(shape, &forecast_counts),
        };
        let now_ns = self.clock.now_ns();
        if slot.load.routed(prompt_tokens as u64, prefill, output) {
            slot.observed.started(now_ns);
        }
        // The decode bound reads the admitted prefill as a rate over the router's clock: a
        // clock never told a time has no span to read it over, and counts none.
        if request.asks_admission() && self.clock.told() {
            let pairs = attended(prompt_tokens as u64, prefill);
            slot.observed.admit(now_ns, (prefill, pairs));
        }
        slot.predicted_cached
            .fetch_add(cached_tokens as u64, Relaxed);
        slot.available_blocks
            .fetch_add(u64::from(available_blocks), Relaxed);
        slot.captured.fetch_add(cached_tokens as u64, Relaxed);
        key.routed.fetch_add(1, Relaxed);
        key.assigned_prefill.fetch_add(prefill, Relaxed);
        // The candidate's load with this request added, as a refresh would count it (the
        // load key reads no forecast).
        let after = Estimate {
            requests: e.requests + 1,
            prefill_tokens: e.prefill_tokens + prefill,
            prefill_pairs: e.prefill_pairs + attended(prompt_tokens as u64, prefill),
            context_tokens: e.context_tokens + prompt_tokens as u64 + u64::from(output),
            kv_tokens: e.kv_tokens + prefill + u64::from(output),
            forecast: None,
            ..*e
        };
        self.set_load(r, &after);
        Some(
            RouteDecision::new(
                candidate.worker,
                candidate.epoch,
                prompt_tokens,
                candidate.matched_blocks(),
                cached_tokens,
                candidate.cached_by_tier,
            )
            .with_prediction(predicted, (ttft_counts.0, tpot_counts.0), output)
            .with_forecast_counts(forecast_counts.0)
            .saturated(e.saturated)
            .routed_at(now_ns),
        )
    }

    /// Takes the decision's prefill tokens off its worker's outstanding prefill, once;
    /// with the time the first token took, the worker's terms learn from it.
    pub(crate) fn prefilled(&self, decision: &RouteDecision, elapsed: Option<std::time::Duration>) {
        if !decision.mark_prefilled() {
            return;
        }
        self.registry.with_current(decision, |r| {
            let (prompt, prefill) = (decision.prompt_tokens(), decision.prefill_tokens());
            let total = r.slot.load.first_token(prompt as u64, prefill as u64);
            decision.set_prefilled_mark(total);
            // A saturated worker's prediction carries a penalty for the stale report, not
            // a time: nothing to learn from it.
            let timed = elapsed.filter(|_| !decision.was_saturated());
            if let Some(elapsed) = timed {
                let at = decision.routed_ns().saturating_add(nanos(elapsed));
                let observed = (elapsed.as_secs_f64(), decision.predicted_ttft_s());
                r.slot.observed.first_token(at, observed.0, observed.1);
                self.note_reporting(r);
            }
            match timed {
                Some(elapsed) if self.learns() => {
                    let measured = elapsed.as_secs_f64();
                    let forecast = TermCounts(decision.forecast_counts());
                    self.learn_forecast(r, (&forecast, measured), true);
                    let terms = TermCounts(decision.ttft_counts());
                    self.learn(r, (&terms, measured), true);
                }
                _ => self.refresh(r),
            }
        });
    }

    /// A request's `tokens` output tokens after its first took `elapsed` (cumulative, as
    /// its stream goes): while the request runs, what this report adds to the furthest
    /// before it is a sample of the worker's step as it runs now, which its observed step
    /// learns from; the worker's decode terms learn the request's time per output token
    /// from its first report, against what was predicted for it at routing.
    pub(crate) fn decoded(
        &self,
        decision: &RouteDecision,
        tokens: u32,
        elapsed: std::time::Duration,
    ) {
        if tokens == 0 {
            return;
        }
        let Some(added) = decision.advance(tokens, elapsed) else {
            return;
        };
        let running = !decision.is_completed();
        let learns = self.learns() && decision.mark_decoded();
        self.registry.with_current(decision, |r| {
            if running {
                let e = self.estimate(r).forecasting();
                let model = (e.running_step_s(), &e.timing);
                r.slot.observed.progress(self.clock.now_ns(), added, model);
                self.note_reporting(r);
            }
            if learns {
                let seconds = elapsed.as_secs_f64();
                let per_token = seconds / f64::from(tokens);
                let forecast = self.decode_terms(r, decision, (tokens, seconds));
                self.learn_forecast(r, (&forecast, per_token), false);
                let terms = TermCounts(decision.tpot_counts());
                self.learn(r, (&terms, per_token), false);
            }
        });
    }

    /// The forecast terms of a request's time per output token, its first `tokens` after
    /// the first having taken `seconds`: the decode step counted at routing, with the
    /// prefill the worker did in that time (the prompts whose first token came after the
    /// request's, at most what the worker prefills in those seconds at its forecast terms)
    /// spread over those tokens, in place of the prefill queued ahead of it at routing,
    /// which ran before its first token (first come, first served). Without a recorded
    /// first token, the terms counted at routing.
    fn decode_terms(
        &self,
        r: Registered<'_>,
        decision: &RouteDecision,
        (tokens, seconds): (u32, f64),
    ) -> TermCounts {
        let mut terms = decision.tpot_counts();
        let Some(mark) = decision.prefilled_mark() else {
            return TermCounts(terms);
        };
        let timing = r.slot.load.forecast.timing();
        let done = r.slot.load.prefilled_total().saturating_sub(mark) as f64;
        let shared = done.min(seconds / timing.prefill_s_per_token);
        let pairs_per_token = if terms[0] > 0.0 {
            f64::from(terms[4]) / f64::from(terms[0])
        } else {
            let (prompt, prefill) = (decision.prompt_tokens(), decision.prefill_tokens());
            attended(prompt as u64, prefill as u64) as f64 / prefill.max(1) as f64
        };
        let tokens = f64::from(tokens.max(1));
        terms[0] = (shared / tokens) as f32;
        terms[4] = (shared * pairs_per_token / tokens) as f32;
        TermCounts(terms)
    }

    /// Whether the router learns from timings ([`LoadConfig::learning_rate`](crate::LoadConfig::learning_rate) above 0).
    pub(super) fn learns(&self) -> bool {
        self.config.learning_rate > 0.0
    }

    /// Releases what `commit` charged, once; a no-op when the decision was already released
    /// or its worker was removed since.
    pub(crate) fn release(&self, decision: &RouteDecision) {
        let Some(prefill_outstanding) = decision.mark_released() else {
            return;
        };
        let prefill = if prefill_outstanding {
            decision.prefill_tokens() as u64
        } else {
            0
        };
        self.registry.with_current(decision, |r| {
            if prefill_outstanding {
                r.slot
                    .load
                    .first_token(decision.prompt_tokens() as u64, prefill);
            }
            let prompt = decision.prompt_tokens() as u64;
            let uncached = decision.prefill_tokens() as u64;
            r.slot
                .load
                .completed(prompt, uncached, decision.output_tokens());
            sub(&r.slot.predicted_cached, decision.cached_tokens() as u64);
            self.refresh(r);
        });
    }
}

/// Takes back what `commit` added. Each decision is released once (its state bits and the
/// registration epoch see to it), so a counter never goes below zero.
fn sub(counter: &AtomicU64, by: u64) {
    counter.fetch_sub(by, Relaxed);
}

impl Fleet {
    /// Marks the fleet reporting once worker `r` is (a timed report made it so).
    #[inline]
    fn note_reporting(&self, r: Registered<'_>) {
        if r.slot.observed.reporting() && !self.reporting.load(Relaxed) {
            self.reporting.store(true, Relaxed);
        }
    }
}
