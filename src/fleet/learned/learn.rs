//! What the router learns of each worker's absolute times from the timings its host
//! reports: the [`Timing`] terms (per prefill token, a step's fixed time, per decode and
//! per context token in a step, per pair a prefill attends to): the fleet's, with two
//! factors per worker.
//!
//! A prediction is a dot product of [`TermCounts`] with a worker's [`Timing`]. A measured time
//! (a time to first token, or output tokens over time) is an observation `y ≈ Σ r_i z_i`,
//! `z_i` being the time term `i` contributes at its reference (the configured term at the
//! speed the host told; for attention, which the configured step model lacks, a prefill
//! token's cost over [`ATTENTION_REFERENCE`] tokens) and `r_i` how many times that is the
//! truth (1 as configured; 0 for attention).
//!
//! Each worker fits its own ratios by recursive least squares on relative errors (each
//! observation's noise taken as a share of the time predicted, since a time to first token is
//! as noisy as it is long), residuals far beyond their recent size weighing less (a request
//! that waited behind a burst the router could not see teaches little) and a small drift per
//! observation (the fleet changes), the variance of each ratio held at or below its prior's.
//! A worker predicts with the fleet's ratios (each the median of the workers': a fleet
//! uniformly slower than configured, or slower at attention than the step model says) times
//! two factors of its own, one on the prefill terms and one on the step terms: how many times
//! longer its own ratios predict its typical time to first token, and its typical other
//! timing, than the fleet's ratios of the moment do (one worker slower than the others, or
//! slower at decoding only). A factor counts only beyond a dead
//! zone ([`DEAD_ZONE`]): a worker's timings include the queueing its own traffic causes, which
//! no term counts, so identical workers fit ratios some ten percent apart, and a worker that
//! looked faster would draw the cold prompts that make it slower. Deterministic: the same
//! timings in the same order give the same terms.

use super::residuals::{FleetBias, Kind, Residuals};
use super::timing::{TERMS, TermCounts, Timing};

/// A worker's ratios' prior variance: a fleet may run several times slower or faster than
/// configured. Where from: a judgement, not a fit: a standard deviation of 2 on a ratio of
/// 1 puts engines a few times slower or faster than configured (the built-in engine
/// profiles, from Vidur's and BLIS's measurements, span that) within one deviation.
const PRIOR_VARIANCE: f64 = 4.0;
/// A worker's own factors (the log of its own ratios' typical times over the fleet's) count
/// only for what lies beyond this: a worker up to about 16 % slower or faster than the fleet
/// predicts as the fleet does. On a fleet of identical workers the factors the workers' own traffic
/// teaches spread about this far; a worker at half speed (a log of 0.69) is still learned
/// about 1.7 times slower.
const DEAD_ZONE: f64 = 0.15;
/// Weight of a new timing in a worker's typical terms once it has learned from 50 (before,
/// each of its timings weighs alike): they follow about the last 50 timings. Where from: a
/// judgement: 50 timings are seconds of a busy worker's first tokens, enough to average
/// the queueing its own traffic adds to each.
const FACTOR_RATE: f64 = 0.02;
/// Timings a worker needs before its ratios count in the fleet's. Where from: a judgement:
/// the fleet's median must not follow a worker's first few timings, whose fit is still the
/// prior's.
const MIN_FLEET: u64 = 8;
/// A measured time's noise, as a share of the time predicted. Where from: the router's own
/// prediction error on its engines, whose median is some 10–20 % and 90th percentile
/// some 35–80 % within capacity (the README's "How wrong the router is").
const NOISE_SHARE: f64 = 0.25;
/// Residuals beyond this many noise deviations weigh less (Huber's loss): the fit follows
/// the typical timing, as a median does, not the few that waited behind work no
/// prediction at routing could see (a burst routed right after them that shared their
/// steps). Where from: Huber's usual bound is 1.345 deviations; one deviation weighs the
/// tail a little less, as the bursts behind it are more than noise.
const CLIP: f64 = 1.0;
/// The same bound over a worker's first [`WARMUP`] timings, when the ratios may be far from
/// the truth everywhere (an engine several times slower than configured) and every residual
/// is large. Where from: a judgement: an engine up to about three times off its
/// configured terms (the built-in profiles' range) errs by under eight deviations.
const WARMUP_CLIP: f64 = 8.0;
/// Timings a worker learns from with [`WARMUP_CLIP`]. Where from: a judgement: twice
/// [`MIN_FLEET`], by when a worker's fit has left its prior.
const WARMUP: u64 = 16;
/// Variance each ratio drifts by per observation. Where from: a judgement: after 10,000
/// observations a ratio's variance has grown back by 1 (half a deviation of the prior), so
/// a fleet that changes is followed within minutes of a busy fleet's timings.
const DRIFT: f64 = 1e-4;
/// Learned ratios of the configured terms stay within `1 / RATIO_LIMIT ..= RATIO_LIMIT`,
/// attention's within `0 ..= RATIO_LIMIT`. Where from: a bound, not an estimate: far beyond
/// any engine the crate was run against (a few times off), close enough to keep a
/// misreported timing from making a worker look idle or dead.
const RATIO_LIMIT: f64 = 64.0;

/// The configured ratios: the step model's terms as configured, no attention term.
pub(crate) const CONFIGURED: [f64; TERMS] = [1.0, 1.0, 1.0, 1.0, 0.0];

/// Attention's reference: a prefill token's cost per this many tokens it attends to (at a
/// ratio of 1, a token attending to 8,192 others costs twice a token alone: about what
/// Vidur's tables show for Llama-3-8B on an A100).
pub(crate) const ATTENTION_REFERENCE: f64 = 8_192.0;

/// What each ratio scales for a worker whose configured terms are `configured`.
fn reference(configured: &Timing) -> [f64; TERMS] {
    let mut r = configured.to_array();
    r[4] = configured.prefill_s_per_token / ATTENTION_REFERENCE;
    r
}

/// Ratio `i` within its limits.
fn limit(i: usize, ratio: f64) -> f64 {
    let low = if CONFIGURED[i] > 0.0 {
        1.0 / RATIO_LIMIT
    } else {
        0.0
    };
    ratio.clamp(low, RATIO_LIMIT)
}
/// Weight of a new timing in the reported measured-over-predicted ratio: about the last ten
/// weigh, as in admission's observed factors (`observed/worker.rs`).
const REPORT_RATE: f64 = 0.1;
/// Timings a worker's reported ratio needs before it is shown: below five, one timing
/// weighs a fifth or more of it.
const MIN_REPORTED: u64 = 5;

/// Recursive least squares over the ratios.
#[derive(Clone, Debug)]
struct Rls {
    ratios: [f64; TERMS],
    covariance: [[f64; TERMS]; TERMS],
    /// The prior variance, the most any ratio's variance grows back to.
    prior: f64,
}

impl Rls {
    fn new(ratios: [f64; TERMS], prior: f64) -> Rls {
        let mut covariance = [[0.0; TERMS]; TERMS];
        for (i, row) in covariance.iter_mut().enumerate() {
            row[i] = prior;
        }
        Rls {
            ratios,
            covariance,
            prior,
        }
    }

    /// `target ≈ ratios · z`, with noise of deviation `sigma`. A residual beyond the bound
    /// weighs less, as Huber's loss weighs it (the observation is scaled by the square root
    /// of its weight), so that an outlier neither moves the ratios far nor counts as much
    /// evidence.
    fn observe(&mut self, z: [f64; TERMS], target: f64, sigma: f64, bound: f64) {
        let z = z.map(|v| v / sigma);
        let target = target / sigma;
        let predicted: f64 = (0..TERMS).map(|i| self.ratios[i] * z[i]).sum();
        let residual = target - predicted;
        let weight = if residual.abs() > bound {
            (bound / residual.abs()).sqrt()
        } else {
            1.0
        };
        let (z, residual) = (z.map(|v| v * weight), residual * weight);
        let p = &mut self.covariance;
        let pz: [f64; TERMS] = core::array::from_fn(|i| (0..TERMS).map(|j| p[i][j] * z[j]).sum());
        let denominator = 1.0 + (0..TERMS).map(|i| z[i] * pz[i]).sum::<f64>();
        for (ratio, gain) in self.ratios.iter_mut().zip(pz) {
            *ratio += gain / denominator * residual;
        }
        for (i, row) in p.iter_mut().enumerate() {
            for (cell, pz_j) in row.iter_mut().zip(pz) {
                *cell -= pz[i] * pz_j / denominator;
            }
            row[i] = (row[i] + DRIFT).min(self.prior);
        }
    }
}

/// The fleet's ratios: for each term, the median of the ratios of the workers that learned
/// from at least [`MIN_FLEET`] timings, once they are most of the fleet (as configured
/// before): what most workers share, so that one slow worker, or the only one that has
/// served so far, does not make the others look slow.
fn fleet_ratios(workers: &[Learned]) -> [f64; TERMS] {
    let fleet = workers.len();
    let learned: Vec<[f64; TERMS]> = workers
        .iter()
        .filter(|w| w.timings >= MIN_FLEET)
        .map(|w| w.ratios)
        .collect();
    if learned.len() * 2 <= fleet {
        return CONFIGURED;
    }
    core::array::from_fn(|i| {
        let mut column: Vec<f64> = learned.iter().map(|r| r[i]).collect();
        column.sort_by(f64::total_cmp);
        let mid = column.len() / 2;
        if column.len() % 2 == 1 {
            column[mid]
        } else {
            (column[mid - 1] + column[mid]) / 2.0
        }
    })
}

/// What one worker's learning gives the fleet's: its ratios, the timings they were learned
/// from, and its residuals by shape.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Learned {
    pub(crate) ratios: [f64; TERMS],
    pub(crate) timings: u64,
    residuals: Residuals,
}

/// What the fleet learned, which every worker predicts with: the ratios (see
/// [`fleet_ratios`]) and the median residual at each shape (`residuals.rs`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct FleetLearned {
    pub(crate) ratios: [f64; TERMS],
    bias: FleetBias,
}

impl FleetLearned {
    /// A fleet that has learned nothing: the configured ratios.
    pub(crate) fn configured() -> FleetLearned {
        FleetLearned::with_ratios(CONFIGURED)
    }

    /// A fleet with the `ratios` and no residuals.
    pub(crate) fn with_ratios(ratios: [f64; TERMS]) -> FleetLearned {
        FleetLearned {
            ratios,
            bias: FleetBias::default(),
        }
    }

    /// The fleet's, from what each of its `workers` learned.
    pub(crate) fn of(workers: &[Learned]) -> FleetLearned {
        FleetLearned {
            ratios: fleet_ratios(workers),
            bias: FleetBias::of(workers.iter().map(|w| &w.residuals)),
        }
    }
}

/// What one worker's timings taught: its ratios, its residuals by shape, and how its times to
/// first token compared with the predictions.
#[derive(Clone, Debug)]
pub(crate) struct WorkerLearner {
    rls: Rls,
    residuals: Residuals,
    /// Decayed sums of measured and predicted times to first token.
    observed: f64,
    predicted: f64,
    /// Timings learned from.
    timings: u64,
    /// The typical terms of its times to first token and of its other timings, which the
    /// fleet's ratios are read at where no other worker has timed a shape.
    typical: Typical,
}

/// The typical terms of a worker's timings of each kind: of its times to first token, and of
/// its other timings (output tokens over time), each a decayed mean of the terms' times at
/// their reference as shares of their sum. A worker's factor on a kind is how many times
/// longer its own ratios predict such a timing than the fleet's do, taken whenever it
/// predicts: when the fleet's ratios change, its factors follow at once, and a worker that
/// learned before the fleet did is not counted slower twice once the fleet has.
#[derive(Clone, Copy, Debug, Default)]
struct Typical {
    prefill: MeanTerms,
    step: MeanTerms,
}

/// A decayed mean of term shares: a plain mean over the first timings, then each new one
/// weighing [`FACTOR_RATE`].
#[derive(Clone, Copy, Debug, Default)]
struct MeanTerms {
    shares: [f64; TERMS],
    timings: u64,
}

impl MeanTerms {
    /// Adds the terms' times `z` (nothing, when they are not positive and finite).
    fn add(&mut self, z: &[f64; TERMS]) {
        let total: f64 = z.iter().sum();
        if !(total.is_finite() && total > 0.0) {
            return;
        }
        self.timings += 1;
        let rate = (1.0 / self.timings as f64).max(FACTOR_RATE);
        for (share, v) in self.shares.iter_mut().zip(z) {
            *share += rate * (v / total - *share);
        }
    }

    /// The log of the time ratios `a` predict over the time ratios `b` predict at these
    /// terms; 0 before any timing.
    fn log_factor(&self, a: &[f64; TERMS], b: &[f64; TERMS]) -> f64 {
        let dot = |r: &[f64; TERMS]| (0..TERMS).map(|i| r[i] * self.shares[i]).sum::<f64>();
        let (a, b) = (dot(a), dot(b));
        if self.timings > 0 && a > 0.0 && b > 0.0 {
            (a / b).ln()
        } else {
            0.0
        }
    }
}

/// A worker's factors over the fleet's ratios, in the log: one for the prefill terms, one
/// for the step terms.
#[derive(Clone, Copy, Debug, Default)]
struct OwnFactors {
    prefill: f64,
    step: f64,
}

/// The terms the prefill factor scales: per prefill token and per attended pair.
const PREFILL_TERMS: [usize; 2] = [0, 4];

impl OwnFactors {
    /// The factor of term `i`, beyond the dead zone.
    fn of(&self, i: usize) -> f64 {
        let log = if PREFILL_TERMS.contains(&i) {
            self.prefill
        } else {
            self.step
        };
        (log.signum() * (log.abs() - DEAD_ZONE).max(0.0)).exp()
    }
}

impl Default for WorkerLearner {
    fn default() -> Self {
        WorkerLearner {
            rls: Rls::new(CONFIGURED, PRIOR_VARIANCE),
            residuals: Residuals::default(),
            observed: 0.0,
            predicted: 0.0,
            timings: 0,
            typical: Typical::default(),
        }
    }
}

impl WorkerLearner {
    /// The worker's ratios: the fleet's, times the worker's own factors (one on the prefill
    /// terms, from its times to first token; one on the step terms, from its other timings)
    /// beyond the dead zone (see [`DEAD_ZONE`]; 1 before [`MIN_FLEET`] timings), kept within
    /// limits. A factor is how many times longer the worker's timings took than the fleet's
    /// at the same shapes (`residuals.rs`); at a shape no other worker has timed, than the
    /// fleet's ratios predict at the worker's typical terms.
    fn ratios(&self, fleet: &FleetLearned) -> [f64; TERMS] {
        let ratios: [f64; TERMS] = core::array::from_fn(|i| limit(i, fleet.ratios[i]));
        let factors = if self.timings >= MIN_FLEET {
            let of = |kind: Kind, typical: &MeanTerms| {
                let fallback = typical.log_factor(&ratios, &CONFIGURED);
                self.residuals.log_factor(kind, &fleet.bias, fallback)
            };
            OwnFactors {
                prefill: of(Kind::FirstToken, &self.typical.prefill),
                step: of(Kind::Step, &self.typical.step),
            }
        } else {
            OwnFactors::default()
        };
        let fleet = ratios;
        core::array::from_fn(|i| limit(i, fleet[i] * factors.of(i)))
    }

    /// The worker's timing: its reference terms (the configured ones at the speed the host
    /// told) scaled by its ratios (see [`Self::ratios`]).
    pub(crate) fn timing(&self, configured: &Timing, fleet: &FleetLearned) -> Timing {
        let reference = reference(configured);
        let ratios = self.ratios(fleet);
        Timing::from_array(core::array::from_fn(|i| reference[i] * ratios[i]))
    }

    /// Timings learned from.
    pub(crate) fn timings(&self) -> u64 {
        self.timings
    }

    /// What the worker learned, for the fleet's.
    pub(crate) fn learned(&self) -> Learned {
        Learned {
            ratios: self.rls.ratios,
            timings: self.timings,
            residuals: self.residuals,
        }
    }

    /// Measured over predicted time to first token, weighted towards the recent timings,
    /// and the timings learned from; `None` before a few.
    pub(crate) fn error(&self) -> Option<(f64, u64)> {
        (self.timings >= MIN_REPORTED && self.predicted > 0.0)
            .then(|| (self.observed / self.predicted, self.timings))
    }

    /// A time `measured` (seconds) of what `terms` count, on a worker whose configured terms
    /// are `configured`, the fleet's ratios being `fleet`: the worker's ratios learn from
    /// it. `first_token` says whether it is a time to first token (reported as the model's
    /// error, against the prediction with the fleet as prior). Nothing is learned from a
    /// time that is not positive and finite.
    pub(crate) fn learn(
        &mut self,
        fleet: &FleetLearned,
        configured: &Timing,
        (terms, measured): (&TermCounts, f64),
        first_token: bool,
    ) {
        let c = reference(configured);
        let z: [f64; TERMS] = core::array::from_fn(|i| c[i] * f64::from(terms.0[i]));
        let dot = |r: &[f64; TERMS]| (0..TERMS).map(|i| r[i] * z[i]).sum::<f64>();
        let (own, predicted) = (dot(&self.rls.ratios), dot(&self.ratios(fleet)));
        if !(measured.is_finite() && measured > 0.0 && own.is_finite() && own > 0.0) {
            return;
        }
        let bound = if self.timings < WARMUP {
            WARMUP_CLIP
        } else {
            CLIP
        };
        self.rls.observe(z, measured, NOISE_SHARE * own, bound);
        self.timings += 1;
        let (kind, typical) = if first_token {
            (Kind::FirstToken, &mut self.typical.prefill)
        } else {
            (Kind::Step, &mut self.typical.step)
        };
        typical.add(&z);
        self.residuals
            .add(kind, terms, (measured / dot(&CONFIGURED)).ln());
        if first_token && predicted > 0.0 {
            let decay = 1.0 - REPORT_RATE;
            self.observed = self.observed * decay + REPORT_RATE * measured;
            self.predicted = self.predicted * decay + REPORT_RATE * predicted;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::config::LoadConfig;

    fn fleet_of(workers: &[WorkerLearner]) -> FleetLearned {
        let learned: Vec<Learned> = workers.iter().map(WorkerLearner::learned).collect();
        FleetLearned::of(&learned)
    }

    /// Timings of a mix of requests: times to first token (prefill and steps) and times per
    /// output token (decode steps), the `n`-th's terms.
    fn terms(n: u32) -> (TermCounts, bool) {
        if n % 2 == 0 {
            let prefill = f64::from(500 + (n * 7919) % 20_000);
            let steps = (prefill / 8_192.0).ceil();
            let pairs = prefill * prefill / 2.0;
            let terms = TermCounts::new(
                (prefill, pairs),
                steps,
                f64::from(n % 64),
                f64::from(n % 97) * 2_000.0,
            );
            (terms, true)
        } else {
            let decodes = f64::from(1 + n % 64);
            let context = decodes * f64::from(500 + (n * 104_729) % 8_000);
            (
                TermCounts::new((f64::from(n % 300), 0.0), 1.0, decodes, context),
                false,
            )
        }
    }

    /// A fleet uniformly three times slower than configured: after 200 timings of each of
    /// its workers every prediction is within 10 %, whatever mix of terms it counts.
    #[test]
    fn a_uniformly_slower_fleet_is_learned() {
        let configured = Timing::configured(&LoadConfig::default(), 1.0);
        let mut truth = Timing::from_array(configured.to_array().map(|t| 3.0 * t));
        // And attention as Vidur measured it for Llama-3-8B on an A100, per pair.
        truth.prefill_s_per_attended = 3e-9;
        let mut workers = vec![WorkerLearner::default(); 4];
        let mut fleet = FleetLearned::configured();
        for n in 0..800u32 {
            let (terms, first) = terms(n);
            // Each worker times first tokens and output tokens alike.
            let w = (n / 2 % 4) as usize;
            workers[w].learn(&fleet, &configured, (&terms, truth.of(&terms)), first);
            fleet = fleet_of(&workers);
        }
        for w in &workers {
            let learned = w.timing(&configured, &fleet);
            for n in 1_000..1_100 {
                let (terms, _) = terms(n);
                let (l, t) = (learned.of(&terms), truth.of(&terms));
                assert!((l / t - 1.0).abs() < 0.10, "{l} against {t}: {learned:?}");
            }
        }
        // A new worker, which has learned nothing, predicts with the fleet's ratios.
        let new = WorkerLearner::default().timing(&configured, &fleet);
        let (terms, _) = terms(1_001);
        assert!((new.of(&terms) / truth.of(&terms) - 1.0).abs() < 0.25);
    }

    /// Four identical workers whose engine spends a fixed time on each prefill pass beside
    /// the step's (as NVIDIA's replay engine does; the terms do not count it), two of them
    /// sent short prompts only and two long ones: every worker predicts a prompt alike.
    /// Read against its own mix instead of at like shapes, a worker sent short prompts
    /// predicts a long one some 1.26 times slower here, and would draw none of the long
    /// prompts that could teach it otherwise.
    #[test]
    fn identical_workers_serving_different_mixes_learn_alike() {
        let configured = Timing::configured(&LoadConfig::default(), 1.0);
        let truth = |terms: &TermCounts, first: bool| {
            let passes = (f64::from(terms.0[0]) / 8_192.0).ceil();
            let pass_s = if first { 0.0165 * passes } else { 0.0 };
            configured.of(terms) + pass_s
        };
        let mut workers = vec![WorkerLearner::default(); 4];
        let mut fleet = FleetLearned::configured();
        for n in 0..2_400u32 {
            let w = (n % 4) as usize;
            let (mut terms, first) = terms(n / 4 * 2 + (n / 8) % 2);
            if first {
                // Workers 0 and 1 get prompts of 20 to 520 tokens, 2 and 3 of 2k to 40k,
                // a few of each kind on the others (sessions that moved).
                let long = (w >= 2) != (n % 40 == 0);
                let prefill = if long {
                    2_000.0 + f64::from((n * 7_919) % 38_000)
                } else {
                    20.0 + f64::from((n * 7_919) % 500)
                };
                terms = TermCounts::new((prefill, 0.0), (prefill / 8_192.0).ceil(), 8.0, 8_000.0);
            }
            workers[w].learn(&fleet, &configured, (&terms, truth(&terms, first)), first);
            fleet = fleet_of(&workers);
        }
        for prefill in [100.0, 4_000.0, 30_000.0] {
            let terms = TermCounts::new((prefill, 0.0), (prefill / 8_192.0).ceil(), 8.0, 8_000.0);
            let predicted: Vec<f64> = workers
                .iter()
                .map(|w| w.timing(&configured, &fleet).of(&terms))
                .collect();
            let (least, most) = predicted
                .iter()
                .fold((f64::MAX, 0.0_f64), |(l, m), &p| (l.min(p), m.max(p)));
            assert!(most / least < 1.05, "{prefill} tokens: {predicted:?}");
        }
    }

    /// One worker of four twice as slow as configured, one 10 % slower: the first is learned
    /// slower than the fleet by its slowdown over the fleet's beyond the dead zone (about
    /// 2 / e^0.15), the second, within the dead zone, predicts as the fleet does, as the
    /// configured ones do.
    #[test]
    fn a_slow_worker_is_learned_and_a_small_difference_is_not() {
        let configured = Timing::configured(&LoadConfig::default(), 1.0);
        let truth = |slowdown: f64| Timing::from_array(configured.to_array().map(|t| slowdown * t));
        let slowdowns = [2.0, 1.1, 1.0, 1.0];
        let mut workers = vec![WorkerLearner::default(); 4];
        let mut fleet = FleetLearned::configured();
        for n in 0..1_600u32 {
            let (terms, first) = terms(n);
            let w = (n / 2 % 4) as usize;
            let measured = truth(slowdowns[w]).of(&terms);
            workers[w].learn(&fleet, &configured, (&terms, measured), first);
            fleet = fleet_of(&workers);
        }
        let (terms, _) = terms(1_000);
        let predicted = |w: usize| workers[w].timing(&configured, &fleet).of(&terms);
        // The fleet's ratios are the median of the workers' (here between 1 and 1.1); the
        // slow worker's factor is its slowdown over the fleet's, beyond the dead zone.
        let fleet_slowdown = predicted(3) / configured.of(&terms);
        assert!((1.0..1.1).contains(&fleet_slowdown), "{fleet_slowdown}");
        let expected = 2.0 / fleet_slowdown / DEAD_ZONE.exp();
        let slow = predicted(0) / predicted(3);
        assert!(
            (slow / expected - 1.0).abs() < 0.05,
            "{slow} against {expected}"
        );
        assert!((predicted(1) / predicted(3) - 1.0).abs() < 1e-9);
    }

    /// One worker of four decodes twice as slowly as configured (per decoding request and per
    /// context token), its prefill as configured: from its decode timings it is found slower at
    /// decoding, by less than the truth (its decode steps 1.25 times as long: the step's
    /// fixed time is as configured), since its factor counts beyond the dead zone.
    #[test]
    fn a_worker_with_a_slower_decode_is_found() {
        let configured = Timing::configured(&LoadConfig::default(), 1.0);
        let mut slow_decode = configured;
        slow_decode.step_s_per_decode *= 2.0;
        slow_decode.step_s_per_context_token *= 2.0;
        let mut workers = vec![WorkerLearner::default(); 4];
        let mut fleet = FleetLearned::configured();
        for n in 0..1_600u32 {
            let (mut terms, first) = terms(n);
            if !first {
                // A stretch of decode steps with no prefill chunk among them.
                terms.0[0] = 0.0;
            }
            let w = (n / 2 % 4) as usize;
            let truth = if w == 0 { slow_decode } else { configured };
            workers[w].learn(&fleet, &configured, (&terms, truth.of(&terms)), first);
            fleet = fleet_of(&workers);
        }
        let (mut decode, _) = terms(1_001);
        decode.0[0] = 0.0;
        let predicted = |w: usize| workers[w].timing(&configured, &fleet).of(&decode);
        let factor = predicted(0) / predicted(1);
        let truth = slow_decode.of(&decode) / configured.of(&decode);
        assert!(factor > 1.02 && factor < truth, "{factor} against {truth}");
        assert!((predicted(1) / configured.of(&decode) - 1.0).abs() < 0.05);
    }

    /// A worker that learned a 3× slower truth while the fleet's ratios were still the
    /// configured ones (too few workers had learned) predicts the truth once the fleet's
    /// ratios catch up: its factor is taken against the fleet's ratios of the moment, so the
    /// slowdown is not counted twice, in the fleet's ratios and in its own factor.
    #[test]
    fn a_worker_ahead_of_the_fleet_is_not_counted_slower_twice() {
        let configured = Timing::configured(&LoadConfig::default(), 1.0);
        let truth = Timing::from_array(configured.to_array().map(|t| 3.0 * t));
        let mut worker = WorkerLearner::default();
        for n in 0..400u32 {
            let (terms, first) = terms(n);
            worker.learn(
                &FleetLearned::configured(),
                &configured,
                (&terms, truth.of(&terms)),
                first,
            );
        }
        let check = |fleet: FleetLearned| {
            let learned = worker.timing(&configured, &fleet);
            for n in 1_000..1_100 {
                let (terms, _) = terms(n);
                let (l, t) = (learned.of(&terms), truth.of(&terms));
                assert!((l / t - 1.0).abs() < 0.20, "{l} against {t}: {fleet:?}");
            }
        };
        // Alone, against the configured fleet, and once the fleet has learned what it did.
        check(FleetLearned::configured());
        check(FleetLearned::of(&[worker.learned()]));
    }

    /// The same timings in the same order teach the same terms, to the bit, on every
    /// build: the learned terms of a fixed run are pinned (a change to what a timing
    /// teaches changes them, and this test says so).
    #[test]
    fn learning_is_deterministic() {
        let configured = Timing::default();
        let run = || {
            let mut w = WorkerLearner::default();
            for n in 0..50u32 {
                let terms = TermCounts::new((f64::from(n * 100), 0.0), 1.0, 4.0, 8_000.0);
                w.learn(
                    &FleetLearned::configured(),
                    &configured,
                    (&terms, 0.01 * f64::from(n + 1)),
                    true,
                );
            }
            w.timing(&configured, &FleetLearned::configured())
        };
        let learned = run();
        assert_ne!(learned, configured, "the run taught nothing");
        let pinned: [u64; TERMS] = [
            4_545_388_721_093_975_848,
            4_575_765_307_799_480_828,
            4_542_503_522_391_573_293,
            4_483_831_584_523_960_799,
            0,
        ];
        assert_eq!(learned.to_array().map(f64::to_bits), pinned, "{learned:?}");
    }
}
