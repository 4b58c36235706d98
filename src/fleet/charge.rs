//! What a route charges its worker and what its first token and completion release: the
//! load counters, the load key, the capture counters, and the timing the worker's learned
//! speed is taught by.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::candidate::Candidate;
use super::registry::Registered;
use super::tracker::Fleet;
use crate::request::{RouteDecision, RouteRequest};

impl Fleet {
    /// Charges the chosen worker with the request (and the candidate's predicted cached
    /// tokens), unless it was removed (or removed and added again) since it was chosen: then
    /// `None`, and the caller chooses again.
    pub(crate) fn commit(
        &self,
        candidate: &Candidate,
        request: &RouteRequest<'_>,
        available_blocks: u32,
    ) -> Option<RouteDecision> {
        let (matched_blocks, cached_tokens) =
            (candidate.matched_blocks(), candidate.cached_tokens());
        let by_tier = candidate.cached_by_tier;
        let slots = self.registry.read();
        let r = slots.get(candidate.worker.index())?;
        let Registered { slot, key } = r;
        if slot.epoch != candidate.epoch {
            return None;
        }
        let prompt_tokens = request.tokens().len();
        let cached_tokens = cached_tokens.min(prompt_tokens);
        let prefill = (prompt_tokens - cached_tokens) as u64;
        // What the load model predicts at the worker's configured speed (its load key, at
        // its estimated speed, and this request's prefill): the timing the host reports
        // later is compared with it.
        let speed = f64::from(candidate.estimate.speed);
        let profile = slot.load.profile_speed();
        let before = key.load_s();
        let rate = self.config.prefill_tokens_per_s * profile;
        let predicted = before * speed / profile + prefill as f64 / rate;
        let output = request
            .expected_output()
            .unwrap_or(self.config.default_output_tokens);
        slot.load.routed(prompt_tokens as u64, prefill, output);
        slot.predicted_cached
            .fetch_add(cached_tokens as u64, Relaxed);
        slot.available_blocks
            .fetch_add(u64::from(available_blocks), Relaxed);
        slot.captured.fetch_add(cached_tokens as u64, Relaxed);
        key.routed.fetch_add(1, Relaxed);
        key.assigned_prefill.fetch_add(prefill, Relaxed);
        // The candidate's snapshot with this request added, as a refresh would read it.
        let mut after = candidate.estimate;
        after.requests += 1;
        after.prefill_tokens += prefill;
        after.context_tokens += prompt_tokens as u64 + u64::from(output);
        after.kv_tokens += prefill + u64::from(output);
        key.set_load_s(after.load_s(&self.config));
        Some(
            RouteDecision::new(
                candidate.worker,
                candidate.epoch,
                prompt_tokens,
                matched_blocks,
                cached_tokens,
                by_tier,
            )
            .with_prediction(predicted, output),
        )
    }

    /// Takes the decision's prefill tokens off its worker's outstanding prefill, once;
    /// with the time the first token took, learns the worker's speed from it.
    pub(crate) fn prefilled(&self, decision: &RouteDecision, elapsed: Option<std::time::Duration>) {
        if !decision.mark_prefilled() {
            return;
        }
        self.registry.with_current(decision, |r| {
            r.slot.load.first_token(decision.prefill_tokens() as u64);
            if let Some(elapsed) = elapsed {
                let rate = self.config.learning_rate;
                r.slot
                    .load
                    .timings
                    .learn(elapsed.as_secs_f64(), decision.predicted_ttft_s(), rate);
                r.slot.load.update_speed(self.reference.get());
            }
            self.refresh(r);
        });
        if elapsed.is_some() && self.reference.timed() {
            self.recalibrate();
        }
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
                r.slot.load.first_token(prefill);
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
