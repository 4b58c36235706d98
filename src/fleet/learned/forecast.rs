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

use super::learn::{FleetLearned, Learned, WorkerLearner};
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

    /// Sets the terms from the worker's `configured` ones, what the fleet's forecast terms
    /// learned (`fleet`) and what the worker's timings taught.
    pub(crate) fn update(&self, configured: &Timing, fleet: &FleetLearned) {
        let timing = self.learner().timing(configured, fleet);
        for (bits, t) in self.bits.iter().zip(timing.to_array()) {
            bits.store(t.to_bits(), Relaxed);
        }
    }

    /// A time `measured` of what `terms` count came (a time to first token when
    /// `first_token`), the fleet's forecast ratios being `fleet`: the worker's learn from
    /// it; the caller updates the terms.
    pub(crate) fn learn(
        &self,
        (configured, fleet): (&Timing, &FleetLearned),
        (terms, measured): (&TermCounts, f64),
        first_token: bool,
    ) {
        self.learner()
            .learn(fleet, configured, (terms, measured), first_token);
    }

    /// What the worker learned, for the fleet's.
    pub(crate) fn learned(&self) -> Learned {
        self.learner().learned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::config::LoadConfig;

    /// The forecast terms start as configured, learn that a worker is slower at prefill from
    /// its times to first token (twice as slow), and publish them only on `update`.
    #[test]
    fn the_forecast_learns_what_the_engine_did() {
        let configured = Timing::configured(&LoadConfig::default(), 1.0);
        let forecast = ForecastTiming::default();
        forecast.update(&configured, &FleetLearned::configured());
        assert_eq!(forecast.timing(), configured);
        let slow = Timing {
            prefill_s_per_token: 2.0 * configured.prefill_s_per_token,
            ..configured
        };
        for n in 0..200u32 {
            let tokens = f64::from(1_000 + 97 * (n % 40));
            let counts = TermCounts::new((tokens, 0.0), 1.0, 0.0, 0.0);
            forecast.learn(
                (&configured, &FleetLearned::configured()),
                (&counts, slow.of(&counts)),
                true,
            );
        }
        assert_eq!(forecast.timing(), configured, "published only on update");
        let timings = forecast.learned().timings;
        assert_eq!(timings, 200);
        forecast.update(&configured, &FleetLearned::configured());
        let counts = TermCounts::new((4_096.0, 0.0), 1.0, 0.0, 0.0);
        // Alone against a fleet held at the configured ratios, its own factor counts beyond
        // the dead zone (`learn.rs`): slower than configured, short of the truth.
        let ratio = forecast.timing().of(&counts) / slow.of(&counts);
        assert!(
            (0.75..1.0).contains(&ratio),
            "{ratio}: {:?}",
            forecast.timing()
        );
        let learned = forecast.timing().prefill_s_per_token / configured.prefill_s_per_token;
        assert!(learned > 1.5, "{learned}");
    }

    /// A time that is not positive and finite teaches nothing.
    #[test]
    fn bad_times_teach_nothing() {
        let configured = Timing::configured(&LoadConfig::default(), 1.0);
        let forecast = ForecastTiming::default();
        let counts = TermCounts::new((1_000.0, 0.0), 1.0, 0.0, 0.0);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            forecast.learn(
                (&configured, &FleetLearned::configured()),
                (&counts, bad),
                true,
            );
        }
        forecast.update(&configured, &FleetLearned::configured());
        assert_eq!(forecast.timing(), configured);
    }
}
