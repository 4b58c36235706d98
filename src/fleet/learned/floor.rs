//! [`Floor`]: the fleet's least step terms and greatest speed, a bound under every worker's,
//! for the idle worker the shortlist prices a class of holders at (see
//! [`Fleet::floor`](super::super::tracker::Fleet::floor)).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use super::timing::{TERMS, Timing};

/// The least of each step term and the greatest speed any worker has had since the bound
/// was last taken afresh.
///
/// Invariant: each term is at most that term of every registered worker's timing, and the
/// speed at least every worker's (as an [`Estimate`](super::super::prediction::estimate::Estimate) reads it,
/// an `f32`). Terms and speeds are never negative, so their bits order as the values do.
#[derive(Debug)]
pub(crate) struct Floor {
    terms: [AtomicU64; TERMS],
    speed: AtomicU32,
    /// The least fixed time of a step in whole nanoseconds (`u64::MAX` before any
    /// worker's), for the fleet's load, which reads it on every route.
    step_base_ns: AtomicU64,
}

impl Default for Floor {
    fn default() -> Self {
        Floor {
            terms: core::array::from_fn(|_| AtomicU64::new(f64::INFINITY.to_bits())),
            speed: AtomicU32::new(0.0f32.to_bits()),
            step_base_ns: AtomicU64::new(u64::MAX),
        }
    }
}

impl Floor {
    /// A worker's terms became `timing` at `speed`: the bound is lowered to them where they
    /// are below it.
    pub(crate) fn lower(&self, timing: &Timing, speed: f32) {
        for (bound, term) in self.terms.iter().zip(timing.to_array()) {
            bound.fetch_min(term.max(0.0).to_bits(), Relaxed);
        }
        self.speed.fetch_max(speed.max(0.0).to_bits(), Relaxed);
        let base_ns = (timing.step_base_s.max(0.0) * 1e9) as u64;
        self.step_base_ns.fetch_min(base_ns, Relaxed);
    }

    /// Takes the bound afresh from every worker's terms and speed (`workers`).
    pub(crate) fn reset(&self, workers: impl Iterator<Item = (Timing, f32)>) {
        let fresh = Floor::default();
        for (timing, speed) in workers {
            fresh.lower(&timing, speed);
        }
        for (bound, term) in self.terms.iter().zip(&fresh.terms) {
            bound.store(term.load(Relaxed), Relaxed);
        }
        self.speed.store(fresh.speed.load(Relaxed), Relaxed);
        self.step_base_ns
            .store(fresh.step_base_ns.load(Relaxed), Relaxed);
    }

    /// The least fixed time of a step in whole nanoseconds (0 before any worker's): an idle
    /// worker's load.
    #[inline]
    pub(crate) fn step_base_ns(&self) -> u64 {
        match self.step_base_ns.load(Relaxed) {
            u64::MAX => 0,
            ns => ns,
        }
    }

    /// The least terms (each 0 before any worker's) and the greatest speed.
    #[inline]
    pub(crate) fn get(&self) -> (Timing, f32) {
        let terms = self
            .terms
            .each_ref()
            .map(|b| match f64::from_bits(b.load(Relaxed)) {
                t if t.is_finite() => t,
                _ => 0.0,
            });
        let speed = f32::from_bits(self.speed.load(Relaxed));
        (Timing::from_array(terms), speed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_the_least_term_and_the_greatest_speed() {
        let floor = Floor::default();
        let a = Timing::from_array([1.0, 5.0, 2.0, 0.5, 3.0]);
        let b = Timing::from_array([2.0, 4.0, 2.5, 0.25, 3.0]);
        floor.lower(&a, 1.5);
        floor.lower(&b, 0.5);
        let (t, speed) = floor.get();
        assert_eq!(t.to_array(), [1.0, 4.0, 2.0, 0.25, 3.0]);
        assert_eq!(speed, 1.5);
        floor.reset([(b, 0.5)].into_iter());
        assert_eq!(floor.get(), (b, 0.5));
    }
}
