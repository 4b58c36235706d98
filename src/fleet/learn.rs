//! What the router learns of each worker's time from the timings its host reports: a
//! worker's measured over predicted time to first token ([`Timings`]), and the fleet's
//! reference ([`Reference`]) that tells a worker's own slowness from what every worker's
//! timings share.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Timings a worker's learned speed needs before it counts: one first token says little
/// (its request may have waited behind others' work the router did not see).
const MIN_SAMPLES: u64 = 5;

/// First-token timings between two recalibrations of the fleet's reference.
const RECALIBRATE_EVERY: u64 = 16;

/// One worker's learned timing error: decayed sums of observed and predicted times to first
/// token (f64 bits, lock-free). Concurrent timings may lose one another's update.
#[derive(Debug, Default)]
pub(crate) struct Timings {
    observed_bits: AtomicU64,
    predicted_bits: AtomicU64,
    /// Timings learned from.
    samples: AtomicU64,
}

impl Timings {
    /// A first token came `observed` seconds after forwarding, where the load model (at the
    /// configured speed) predicted `predicted`: the sums move towards them by `rate`.
    pub(crate) fn learn(&self, observed: f64, predicted: f64, rate: f64) {
        if !(observed.is_finite() && predicted.is_finite() && observed >= 0.0 && predicted > 0.0) {
            return;
        }
        let decay = 1.0 - rate;
        let o = f64::from_bits(self.observed_bits.load(Relaxed)) * decay + rate * observed;
        let p = f64::from_bits(self.predicted_bits.load(Relaxed)) * decay + rate * predicted;
        self.observed_bits.store(o.to_bits(), Relaxed);
        self.predicted_bits.store(p.to_bits(), Relaxed);
        self.samples.fetch_add(1, Relaxed);
    }

    /// First-token timings learned from.
    pub(crate) fn count(&self) -> u64 {
        self.samples.load(Relaxed)
    }

    /// The measured over the predicted time to first token (each weighted towards the
    /// recent ones), and the timings learned from; `None` before [`MIN_SAMPLES`] timings.
    pub(crate) fn error(&self) -> Option<(f64, u64)> {
        let p = f64::from_bits(self.predicted_bits.load(Relaxed));
        let samples = self.samples.load(Relaxed);
        if p <= 0.0 || samples < MIN_SAMPLES {
            return None;
        }
        let o = f64::from_bits(self.observed_bits.load(Relaxed));
        Some((o / p, samples))
    }

    /// How many times slower than predicted the worker's first tokens have come, as a
    /// base-2 logarithm within ±4; `None` before [`MIN_SAMPLES`] timings.
    pub(crate) fn log_ratio(&self) -> Option<f64> {
        self.error()
            .map(|(ratio, _)| ratio.clamp(1.0 / 16.0, 16.0).log2())
    }

    /// How many times slower than its profile the worker is: its [`log_ratio`](Self::log_ratio)
    /// against the fleet's `reference` (what every worker's timings share, such as queueing
    /// the model does not see, is not the worker's speed), in octaves (…, 0.5, 1, 2, …):
    /// the load model's own error moves identical workers' ratios by tens of per cent, and a
    /// speed that differs by less than that would only add noise to every choice. 1 before
    /// [`MIN_SAMPLES`] timings.
    pub(crate) fn slowness(&self, reference: f64) -> f64 {
        self.log_ratio()
            .map_or(1.0, |r| (r - reference).round().exp2())
    }
}

/// The fleet's reference log ratio of observed to predicted first-token times: the lower
/// quartile of the workers' [`Timings::log_ratio`]s. What most workers' timings share
/// (queueing the load model does not see, a prefill rate configured too high) is not any one
/// worker's speed, and the lower quartile keeps a slow half of the fleet slow.
#[derive(Debug)]
pub(crate) struct Reference {
    /// The reference (f64 bits).
    bits: AtomicU64,
    /// Timings learned from, fleet-wide.
    timings: AtomicU64,
}

impl Default for Reference {
    fn default() -> Self {
        Self {
            bits: AtomicU64::new(0.0f64.to_bits()),
            timings: AtomicU64::new(0),
        }
    }
}

impl Reference {
    /// The reference log ratio.
    pub(crate) fn get(&self) -> f64 {
        f64::from_bits(self.bits.load(Relaxed))
    }

    /// Counts a timing; true when the reference is due to be recalibrated.
    pub(crate) fn timed(&self) -> bool {
        self.timings.fetch_add(1, Relaxed) % RECALIBRATE_EVERY == 0
    }

    /// Sets the reference to the lower quartile of `ratios` (the workers' log ratios, in any
    /// order); the new reference when it changed.
    #[cold]
    pub(crate) fn recalibrate(&self, ratios: &mut [f64]) -> Option<f64> {
        if ratios.is_empty() {
            return None;
        }
        ratios.sort_unstable_by(f64::total_cmp);
        let reference = ratios[(ratios.len() - 1) / 4];
        let before = self.bits.swap(reference.to_bits(), Relaxed);
        (before != reference.to_bits()).then_some(reference)
    }
}
