//! [`ForecastTiming`]: one worker's step terms as the predictions admission checks see them,
//! learned beside the terms the policies price with (`state.rs`), from the same timings
//! read against what the predictions count.
//!
//! The two differ in what a timing is read against. The policies rank by the load as
//! counted (each queued prompt whole until its first token, the prefill queued at routing
//! spread over a request's output), and their terms are fit to that count: a worker's terms
//! learned so come out a little faster at prefill and slower at decoding than the engine
//! runs, which prices the prefill to come on a busy worker into its decode steps. The
//! forecast is read against what the engine does: the queue less what was prefilled while
//! it was under way, the half step under way, and, for a time per output token, the
//! prefill that shared the request's decode steps (the prompts whose first token came after
//! its own). Its terms are the engine's, which is what admission holds a request's targets
//! to and what the host compares the recorded predictions with.
//!
//! Invariant: the terms are positive and finite, as the learner keeps them
//! (`learn.rs`); the configured ones until a timing teaches them.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::learn::WorkerLearner;
use super::timing::{TERMS, TermCounts, Timing};

/// One worker's forecast terms and what they were learned from.
#[derive(Debug)]
pub(crate) struct ForecastTiming {
    /// The terms (f64 bits, in [`Timing`]'s order), kept current by
    /// [`update`](Self::update).
    bits: [AtomicU64; TERMS],
    learner: Mutex<WorkerLearner>,
}

impl Default for ForecastTiming {
    fn default() -> Self {
        Self {
            bits: Timing::default()
                .to_array()
                .map(|t| AtomicU64::new(t.to_bits())),
            learner: Mutex::new(WorkerLearner::default()),
        }
    }
}

impl ForecastTiming {
    fn learner(&self) -> MutexGuard<'_, WorkerLearner> {
        // Nothing panics while holding the lock; a poisoned lock still holds a valid state.
        self.learner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The terms.
    #[inline]
    pub(crate) fn timing(&self) -> Timing {
        Timing::from_array(
            self.bits
                .each_ref()
                .map(|b| f64::from_bits(b.load(Relaxed))),
        )
    }

    /// Sets the terms from the worker's `configured` ones, the fleet's forecast `ratios`
    /// and what the worker's timings taught.
    pub(crate) fn update(&self, configured: &Timing, ratios: [f64; TERMS]) {
        let timing = self.learner().timing(configured, ratios);
        for (bits, t) in self.bits.iter().zip(timing.to_array()) {
            bits.store(t.to_bits(), Relaxed);
        }
    }

    /// A time `measured` of what `terms` count came (a time to first token when
    /// `first_token`), the fleet's forecast ratios being `fleet`: the worker's learn from
    /// it; the caller updates the terms.
    pub(crate) fn learn(
        &self,
        (configured, fleet): (&Timing, &[f64; TERMS]),
        (terms, measured): (&TermCounts, f64),
        first_token: bool,
    ) {
        self.learner()
            .learn(fleet, configured, (terms, measured), first_token);
    }

    /// The worker's own ratios and the timings they were learned from.
    pub(crate) fn learned(&self) -> ([f64; TERMS], u64) {
        self.learner().learned()
    }
}
