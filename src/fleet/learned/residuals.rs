//! [`Residuals`]: how many times longer than configured a worker's timings took, by the shape
//! of what they counted, and [`FleetBias`]: the fleet's median of it at each shape.
//!
//! A worker's own factors (`learn.rs`) are its residuals over the fleet's at the shapes it
//! served. The terms model an engine only roughly (an engine may spend a fixed time on each
//! prefill pass beside a decode step's, or price a prefill chunk by its square), so a worker's
//! fit to its own mix of requests reads the model's error at that mix as the worker's speed:
//! a worker sent only short prompts, whose first tokens take a pass's fixed time the terms do
//! not count, would look slower than one sent long cached prompts, draw fewer of the long
//! ones and never learn otherwise. Compared at like shapes, identical workers serving
//! different mixes learn alike, and a worker slower than the others is slower at every shape.
//!
//! Shapes are buckets of the log of one count: a time to first token's prefill tokens, a
//! decode timing's context tokens per step. Deterministic: the same residuals in the same
//! order give the same bits.

use super::timing::TermCounts;

/// Buckets of a timing's shape, each twice the one below.
pub(crate) const BUCKETS: usize = 12;

/// Weight of a new timing in a worker's residuals: about the last 50 of a kind weigh (the
/// factors' rate, `learn.rs`).
const RATE: f64 = 0.02;

/// Weight a worker's bucket needs (about two recent timings) before it counts in the fleet's
/// median there. Where from: a judgement: one timing is one request's queueing.
const MIN_WEIGHT: f64 = 2.0;

/// The kind of a timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A time to first token: its shape is its prefill tokens.
    FirstToken,
    /// Output tokens over time: its shape is the context tokens its steps' decodes attend to,
    /// per step.
    Step,
}

impl Kind {
    fn index(self) -> usize {
        match self {
            Kind::FirstToken => 0,
            Kind::Step => 1,
        }
    }

    /// The bucket of a timing of this kind counting `terms`: bucket 0 up to twice the
    /// smallest shape told apart (64 prefill tokens; 1,024 context tokens a step), the last
    /// from 2^11 times it on.
    fn bucket(self, terms: &TermCounts) -> usize {
        let [prefill, steps, _, context, _] = terms.0.map(f64::from);
        let (shape, smallest) = match self {
            Kind::FirstToken => (prefill, 64.0),
            Kind::Step => (context / steps.max(1.0), 1_024.0),
        };
        let octaves = (shape.max(1.0) / smallest).log2();
        if octaves.is_finite() && octaves > 0.0 {
            (octaves as usize).min(BUCKETS - 1)
        } else {
            0
        }
    }
}

/// Decayed sums of one worker's log residuals (measured over configured time) and their
/// weights, per kind and bucket. Invariant: every weight is non-negative and finite, and a
/// sum is 0 where its weight is.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Residuals {
    sums: [[f64; BUCKETS]; 2],
    weights: [[f64; BUCKETS]; 2],
}

impl Residuals {
    /// A timing of `kind` counting `terms` took `log_residual` (the log of measured over
    /// configured time; nothing is added when it is not finite). Every earlier residual of
    /// the kind weighs `1 − RATE` less.
    pub(crate) fn add(&mut self, kind: Kind, terms: &TermCounts, log_residual: f64) {
        if !log_residual.is_finite() {
            return;
        }
        let k = kind.index();
        for (sum, weight) in self.sums[k].iter_mut().zip(&mut self.weights[k]) {
            *sum *= 1.0 - RATE;
            *weight *= 1.0 - RATE;
        }
        let b = kind.bucket(terms);
        self.sums[k][b] += log_residual;
        self.weights[k][b] += 1.0;
    }

    /// The worker's mean log residual at bucket `b` of `kind`, where it weighs enough to
    /// count in the fleet's median.
    fn mean(&self, kind: Kind, b: usize) -> Option<f64> {
        let k = kind.index();
        let weight = self.weights[k][b];
        (weight >= MIN_WEIGHT).then(|| self.sums[k][b] / weight)
    }

    /// The log of how many times longer the worker's timings of `kind` took than the fleet's
    /// at the same shapes, its recent shapes weighing as often as it served them: the
    /// fleet's median residual at a bucket, or `fallback` where fewer than two workers have
    /// timed that shape (the fleet's ratios over the configured ones, as the caller reads
    /// them at the worker's typical terms). 0 before any timing of the kind.
    pub(crate) fn log_factor(&self, kind: Kind, fleet: &FleetBias, fallback: f64) -> f64 {
        let k = kind.index();
        let (mut over, mut weights) = (0.0, 0.0);
        for b in 0..BUCKETS {
            let weight = self.weights[k][b];
            if weight > 0.0 {
                let bias = fleet.at(kind, b).unwrap_or(fallback);
                over += self.sums[k][b] - weight * bias;
                weights += weight;
            }
        }
        if weights > 0.0 { over / weights } else { 0.0 }
    }
}

/// The fleet's median log residual per kind and bucket, over the workers whose residuals
/// there weigh enough; `NaN` where fewer than two do.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct FleetBias([[f64; BUCKETS]; 2]);

impl Default for FleetBias {
    fn default() -> Self {
        FleetBias([[f64::NAN; BUCKETS]; 2])
    }
}

impl FleetBias {
    /// The fleet's median over `workers`.
    pub(crate) fn of<'a>(workers: impl Iterator<Item = &'a Residuals> + Clone) -> FleetBias {
        let mut bias = FleetBias::default();
        let mut column = Vec::new();
        for kind in [Kind::FirstToken, Kind::Step] {
            for b in 0..BUCKETS {
                column.clear();
                column.extend(workers.clone().filter_map(|w| w.mean(kind, b)));
                column.sort_by(f64::total_cmp);
                let n = column.len();
                if n >= 2 {
                    let median = if n % 2 == 1 {
                        column[n / 2]
                    } else {
                        (column[n / 2 - 1] + column[n / 2]) / 2.0
                    };
                    bias.0[kind.index()][b] = median;
                }
            }
        }
        bias
    }

    /// The fleet's median at bucket `b` of `kind`, where two workers or more have one.
    fn at(&self, kind: Kind, b: usize) -> Option<f64> {
        let v = self.0[kind.index()][b];
        (!v.is_nan()).then_some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first(prefill: f64) -> TermCounts {
        TermCounts::new((prefill, 0.0), 1.0, 0.0, 0.0)
    }

    #[test]
    fn shapes_fall_in_octaves() {
        assert_eq!(Kind::FirstToken.bucket(&first(0.0)), 0);
        assert_eq!(Kind::FirstToken.bucket(&first(100.0)), 0);
        assert_eq!(Kind::FirstToken.bucket(&first(128.0)), 1);
        assert_eq!(Kind::FirstToken.bucket(&first(10_000.0)), 7);
        assert_eq!(Kind::FirstToken.bucket(&first(1e9)), BUCKETS - 1);
        let steps = TermCounts::new((0.0, 0.0), 4.0, 8.0, 4_096.0);
        assert_eq!(Kind::Step.bucket(&steps), 2);
    }

    /// Two workers at like shapes compare there: one serving short prompts only and one
    /// serving long ones, each 1.5 times the fleet's at its shapes, both factor ln 1.5;
    /// a shape only one worker served compares with the fallback.
    #[test]
    fn workers_compare_at_like_shapes() {
        let (short, long) = (first(100.0), first(20_000.0));
        let fleet_short = 0.7_f64; // the model's error at short prompts
        let mut workers = vec![Residuals::default(); 5];
        for _ in 0..40 {
            for w in &mut workers[..3] {
                w.add(Kind::FirstToken, &short, fleet_short);
                w.add(Kind::FirstToken, &long, 0.0);
            }
        }
        let slow = 1.5_f64.ln();
        for _ in 0..40 {
            workers[3].add(Kind::FirstToken, &short, fleet_short + slow);
            workers[4].add(Kind::FirstToken, &long, slow);
        }
        let fleet = FleetBias::of(workers.iter());
        for w in &workers[..3] {
            assert!(w.log_factor(Kind::FirstToken, &fleet, 0.0).abs() < 1e-9);
        }
        for w in &workers[3..] {
            let f = w.log_factor(Kind::FirstToken, &fleet, 0.0);
            assert!((f - slow).abs() < 0.05, "{f}");
        }
        assert_eq!(workers[0].log_factor(Kind::Step, &fleet, 0.3), 0.0);
        let mut alone = Residuals::default();
        alone.add(Kind::FirstToken, &first(1e8), 1.0);
        let f = alone.log_factor(Kind::FirstToken, &fleet, 0.25);
        assert!((f - 0.75).abs() < 1e-12, "{f}");
    }

    /// A residual that is not finite is not added.
    #[test]
    fn bad_residuals_are_not_added() {
        let mut r = Residuals::default();
        r.add(Kind::FirstToken, &first(100.0), f64::NAN);
        r.add(Kind::FirstToken, &first(100.0), f64::INFINITY);
        assert_eq!(r, Residuals::default());
    }
}
