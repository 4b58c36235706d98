//! What a worker was observed to deliver, beside what the load model predicts of it: the
//! closed loop under admission.
//!
//! Two factors, each the observed time over the predicted one, kept as a weighted mean of
//! its logarithm ([`Ratio`]: a long time weighs by its length, a short one cannot swing it,
//! and a slow spell is unlearned as fast as it was learned):
//!
//! - the **prefill factor**, from first tokens: the time the host measured from forwarding
//!   a request to its first token, over the time the model predicted for it at routing.
//!   Before a first token comes, waiting counts as evidence too: when the worker has had
//!   prefill outstanding for longer than the model predicts all of it takes, and no first
//!   token came in that time, the worker is at least that much slower
//!   ([`ObservedFactors::prefill_at`]).
//! - the **step factor**, from streamed progress: the time per output token between two of
//!   a request's progress reports, over the model's decode step on the worker when the later
//!   report came; its sums decay by time, over [`PREFILL_HORIZON_S`], not by samples.
//!
//! The work a worker has not yet started is what the model counts as its outstanding
//! prefill, which only first tokens (or completions) free: so the room a factor leaves
//! frees on observed events, never on a timer. A worker whose host has reported no timed
//! first token and no progress has no factors: its gates stay open.
//!
//! Invariant: a factor is positive and finite; 1 until measured.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};

use super::super::learned::timing::Timing;

/// How much of the decayed sums each new observation keeps: about the last ten weigh.
/// Where from: a judgement: ten first tokens are a second or two of a busy worker, short
/// enough to follow a slow spell as it starts and ends, long enough that one request stuck
/// behind a burst does not swing a factor.
const KEEP: f64 = 0.9;

/// The time constant of the prefill admitted to a worker, seconds: its decayed sum over
/// this is the rate at which prefill was admitted there. Shorter than the life of a request
/// it shares steps with (a hundred tokens at 0.1 s), so that a burst after a lighter load
/// shows in its first seconds rather than diluted by the load before it; long enough that
/// one long prompt does not read as a lasting rate (a time constant of 2 s refused 2.9 %
/// of the conversation trace at 4× by the decode bound, most of them needlessly).
pub(crate) const PREFILL_HORIZON_S: f64 = 5.0;

/// Observed over predicted: the mean of the samples' logarithms, each weighed by its
/// predicted seconds and decayed at each new sample (by [`KEEP`] for the prefill factor, by
/// the time since the last for the step factor's [`TimedRatio`]).
///
/// Weighed by the prediction, a long request counts by its length and a short one cannot
/// swing the factor; weighed by nothing the outcome decides, a slow sample counts no more
/// than a fast one. Kept as a logarithm, the same samples move the factor the same share of
/// the way up as down: what a slow spell taught is unlearned by as many samples of normal
/// speed as taught it. (A ratio of sums is the mean of the ratios themselves, which one
/// spell at 30× the prediction holds near 30 for tens of samples after the speed is back.)
#[derive(Clone, Copy, Debug, Default)]
struct Ratio {
    /// Σ weight × ln(observed / predicted), decayed.
    log_sum: f64,
    /// Σ weight, decayed.
    weight: f64,
}

impl Ratio {
    /// A sample: `observed` seconds where `predicted` were predicted (both positive and
    /// finite; anything else is ignored), the sums so far kept by [`KEEP`].
    fn add(&mut self, observed: f64, predicted: f64) {
        self.add_kept((KEEP, 1.0), observed, predicted);
    }

    /// A sample weighed `scale` times its predicted seconds, the sums so far kept by `keep`.
    fn add_kept(&mut self, (keep, scale): (f64, f64), observed: f64, predicted: f64) {
        if !(observed > 0.0 && predicted > 0.0 && observed.is_finite() && predicted.is_finite()) {
            return;
        }
        let weight = scale * predicted;
        self.log_sum = keep * self.log_sum + weight * (observed / predicted).ln();
        self.weight = keep * self.weight + weight;
    }

    /// The ratio; 1 before any observation.
    fn get(&self) -> f64 {
        if self.weight > 0.0 {
            (self.log_sum / self.weight).exp()
        } else {
            1.0
        }
    }
}

/// A [`Ratio`] decayed by the router's clock rather than by samples: at the time constant
/// [`PREFILL_HORIZON_S`], the span over which the prefill share it is read beside is
/// measured. A busy worker streams hundreds of progress reports a second, which a decay by
/// samples forgets within a fraction of a second, so that one stalled step swings the
/// factor; a worker with few reports would hold one for minutes.
#[derive(Clone, Copy, Debug, Default)]
struct TimedRatio {
    ratio: Ratio,
    /// The time (ns) the sums were decayed to.
    at_ns: u64,
}

impl TimedRatio {
    /// A sample at `now_ns` (one behind the latest is decayed to it, as when routes race).
    fn add(&mut self, now_ns: u64, observed: f64, predicted: f64) {
        let (keep, scale) = if now_ns >= self.at_ns {
            (decayed(1.0, now_ns - self.at_ns), 1.0)
        } else {
            (1.0, decayed(1.0, self.at_ns - now_ns))
        };
        self.ratio.add_kept((keep, scale), observed, predicted);
        self.at_ns = self.at_ns.max(now_ns);
    }
}

/// Observed over predicted as a ratio of sums decayed by the router's clock over
/// [`PREFILL_HORIZON_S`]: the time-weighted arithmetic mean of the samples' ratios over the
/// span the admitted prefill is read over, where a long wait counts by its length.
#[derive(Clone, Copy, Debug, Default)]
struct TimedSums {
    /// Σ observed, Σ predicted seconds, decayed to `at_ns`.
    sums: (f64, f64),
    at_ns: u64,
}

impl TimedSums {
    /// A sample at `now_ns` (one behind the latest is decayed to it).
    fn add(&mut self, now_ns: u64, observed: f64, predicted: f64) {
        if !(observed > 0.0 && predicted > 0.0 && observed.is_finite() && predicted.is_finite()) {
            return;
        }
        let (keep, scale) = if now_ns >= self.at_ns {
            (decayed(1.0, now_ns - self.at_ns), 1.0)
        } else {
            (1.0, decayed(1.0, self.at_ns - now_ns))
        };
        let (o, p) = self.sums;
        self.sums = (keep * o + scale * observed, keep * p + scale * predicted);
        self.at_ns = self.at_ns.max(now_ns);
    }

    /// The ratio; 1 before any observation.
    fn get(&self) -> f64 {
        let (o, p) = self.sums;
        if p > 0.0 { o / p } else { 1.0 }
    }
}

/// The sums, changed only under the lock; the factors are published from them.
#[derive(Debug, Default)]
struct Sums {
    ttft: Ratio,
    /// The first tokens' times again, for the prefill share.
    ttft_span: TimedSums,
    step: TimedRatio,
    /// Observed seconds per output token, decayed: (seconds, tokens).
    per_token: (f64, f64),
}

/// One worker's observations ([`crate::fleet`]'s `Slot` holds one).
#[derive(Debug)]
pub(crate) struct Observed {
    /// Whether the host reported a timed first token or progress for this worker.
    reporting: AtomicBool,
    /// The prefill factor (f64 bits).
    prefill_bits: AtomicU64,
    /// The prefill rate factor (f64 bits).
    rate_bits: AtomicU64,
    /// The step factor (f64 bits).
    step_bits: AtomicU64,
    /// Observed seconds per output token (f64 bits; 0 until observed).
    per_token_bits: AtomicU64,
    /// The router-clock time (ns) since which no first token came while prefill was
    /// outstanding: the last first token, or the route that found none outstanding.
    since_ns: AtomicU64,
    sums: Mutex<Sums>,
    /// The prefill of the requests admission admitted here.
    admitted: Mutex<Admitted>,
}

impl Default for Observed {
    fn default() -> Self {
        Self {
            reporting: AtomicBool::new(false),
            prefill_bits: AtomicU64::new(1.0f64.to_bits()),
            rate_bits: AtomicU64::new(1.0f64.to_bits()),
            step_bits: AtomicU64::new(1.0f64.to_bits()),
            per_token_bits: AtomicU64::new(0),
            since_ns: AtomicU64::new(0),
            sums: Mutex::new(Sums::default()),
            admitted: Mutex::new(Admitted::default()),
        }
    }
}

/// The shortest time the prefill admitted to a worker is read as spread over, seconds: the
/// first admissions of a worker with no history are not read as a rate over an instant.
/// Where from: read over the whole horizon, a cold burst was read at a third of its share
/// and its admitted requests ran at twice the TPOT target; the floor itself is a
/// judgement, most of [`PREFILL_HORIZON_S`].
const MIN_WINDOW_S: f64 = 4.0;

/// The prefill admitted to a worker, decayed over [`PREFILL_HORIZON_S`]: over the time it
/// spans, the rate at which prefill was admitted there. Kept as work (tokens and the pairs
/// they attend to), not seconds, so that it is priced at the worker's terms as they are
/// when read: a burst admitted before the terms learned the worker's speed counts at that
/// speed once they have.
#[derive(Clone, Copy, Debug, Default)]
struct Admitted {
    /// Prefill tokens and the pairs they attend to, decayed to `at_ns`.
    work: (f64, f64),
    /// The time (ns) `work` was decayed to.
    at_ns: u64,
    /// The time (ns) of the first admission; `None` before it.
    first_ns: Option<u64>,
}

impl Admitted {
    /// Adds prefill of `tokens` attending to `pairs` admitted at `now_ns`.
    fn add(&mut self, now_ns: u64, (tokens, pairs): (f64, f64)) {
        if now_ns >= self.at_ns {
            let keep = decayed(1.0, now_ns - self.at_ns);
            let (t, p) = self.work;
            self.work = (t * keep + tokens, p * keep + pairs);
            self.at_ns = now_ns;
        } else {
            // Behind the latest admission (routes racing): decayed to it instead.
            let keep = decayed(1.0, self.at_ns - now_ns);
            self.work.0 += tokens * keep;
            self.work.1 += pairs * keep;
        }
        self.first_ns = Some(self.first_ns.map_or(now_ns, |first| first.min(now_ns)));
    }

    /// The prefill seconds at `timing`'s terms, decayed to `now_ns`.
    fn at(&self, now_ns: u64, timing: &Timing) -> f64 {
        let (t, p) = self.work;
        decayed(timing.prefill_s(t, p), now_ns.saturating_sub(self.at_ns))
    }

    /// The prefill seconds at `timing`'s terms per second of the time they span, at
    /// `now_ns`: the share of the worker's time they take at those terms.
    fn rate(&self, now_ns: u64, timing: &Timing) -> f64 {
        self.at(now_ns, timing) / self.window_s(now_ns)
    }

    /// The seconds the sum at `now_ns` spans, each weighed as the sum decays it: the
    /// horizon once the first admission is long past, only the time since it before (at
    /// least [`MIN_WINDOW_S`]). Read over the whole horizon, a burst on a worker with no
    /// history would look spread over seconds it has not lasted, and its share of the
    /// worker's time that much smaller.
    fn window_s(&self, now_ns: u64) -> f64 {
        let elapsed_s = self
            .first_ns
            .map_or(0.0, |first| now_ns.saturating_sub(first) as f64 * 1e-9);
        if elapsed_s >= 20.0 * PREFILL_HORIZON_S {
            // What is left of the horizon is under 10⁻⁸ of it.
            return PREFILL_HORIZON_S;
        }
        let spanned = PREFILL_HORIZON_S * (1.0 - (-elapsed_s / PREFILL_HORIZON_S).exp());
        spanned.max(MIN_WINDOW_S)
    }
}

/// A worker's factors as a route reads them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ObservedFactors {
    /// The prefill factor from first tokens (what the worker delivers now).
    pub(crate) prefill: f64,
    /// The prefill rate factor, which the prefill share reads: from the same first
    /// tokens, the geometric mean of the prefill factor and of what the worker delivered
    /// over the admitted prefill's span ([`TimedSums`]).
    ///
    /// A share of the worker's time is measured by the time its first tokens took over the
    /// span: the mean of logarithms reads a worker whose first tokens vary widely as faster
    /// than it is. But the time average holds a slow spell for as long as it spans, long
    /// after first tokens are back to normal. Where from, measured (balanced, priorities,
    /// cold, 8×): on the agentic workload on the `llama3-8b-a100` profile the log mean
    /// alone served 8.7 requests a second within the targets (admitted requests ran at
    /// 1.1× the TPOT target at the median), the time average alone 19.0 but reached the
    /// full rate 6 s after a 4 s spell of 3 s first tokens ended, their geometric mean 14.8
    /// and the full rate within 2 s; on the conversation and synthetic traces all three
    /// within 5 % of each other.
    pub(crate) prefill_rate: f64,
    /// The step factor from progress.
    pub(crate) step: f64,
    /// Seconds since a first token last came while prefill was outstanding.
    pub(crate) stalled_s: f64,
    /// Observed seconds per output token (0 until observed).
    pub(crate) per_token_s: f64,
    /// Whether the host reported progress here (the step factor and `per_token_s` are
    /// observed).
    pub(crate) progressed: bool,
    /// The model's prefill seconds admitted here, decayed over [`PREFILL_HORIZON_S`] to
    /// now: over `window_s`, the share of the worker's time its admitted prefill takes.
    pub(crate) admitted_s: f64,
    /// The seconds `admitted_s` spans: [`PREFILL_HORIZON_S`] once the first admission here
    /// is long past, less before (never under [`MIN_WINDOW_S`]).
    pub(crate) window_s: f64,
}

impl ObservedFactors {
    /// The share of the worker's time its admitted prefill takes at the observed prefill
    /// rate, with `extra_s` more of the model's prefill seconds admitted.
    pub(crate) fn prefill_share(&self, extra_s: f64) -> f64 {
        self.prefill_rate * (self.admitted_s + extra_s) / self.window_s
    }

    /// The prefill factor with the wait as evidence, for a worker the model predicts takes
    /// `outstanding_s` for the prefill outstanding there: at least the time it has waited
    /// for a first token over that.
    pub(crate) fn prefill_at(&self, outstanding_s: f64) -> f64 {
        if outstanding_s > 0.0 && self.stalled_s > outstanding_s {
            self.prefill.max(self.stalled_s / outstanding_s)
        } else {
            self.prefill
        }
    }
}

impl Observed {
    /// Whether the host reported a timed first token or progress for this worker.
    #[inline]
    pub(crate) fn reporting(&self) -> bool {
        self.reporting.load(Relaxed)
    }

    /// The factors at router-clock time `now_ns`, prefill outstanding or not, the
    /// admitted prefill priced at `timing` (the worker's terms now); `None` when the host
    /// has reported nothing timed for any worker of the fleet (`fleet_reporting` false and
    /// nothing for this one).
    #[inline]
    pub(crate) fn factors(
        &self,
        now_ns: u64,
        (outstanding, fleet_reporting): (bool, bool),
        timing: &Timing,
    ) -> Option<ObservedFactors> {
        if !fleet_reporting && !self.reporting() {
            return None;
        }
        let since = self.since_ns.load(Relaxed);
        let stalled_s = if outstanding {
            now_ns.saturating_sub(since) as f64 * 1e-9
        } else {
            0.0
        };
        let admitted = *self.admitted.lock().unwrap_or_else(PoisonError::into_inner);
        Some(ObservedFactors {
            prefill: f64::from_bits(self.prefill_bits.load(Relaxed)),
            prefill_rate: f64::from_bits(self.rate_bits.load(Relaxed)),
            step: f64::from_bits(self.step_bits.load(Relaxed)),
            stalled_s,
            per_token_s: f64::from_bits(self.per_token_bits.load(Relaxed)),
            progressed: self.per_token_bits.load(Relaxed) != 0,
            admitted_s: admitted.at(now_ns, timing),
            window_s: admitted.window_s(now_ns),
        })
    }

    /// Admission admitted a request here at `now_ns` whose own prefill is `tokens` tokens
    /// attending to `pairs` pairs.
    pub(crate) fn admit(&self, now_ns: u64, (tokens, pairs): (u64, u64)) {
        if tokens == 0 {
            return;
        }
        let work = (tokens as f64, pairs as f64);
        self.admitted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add(now_ns, work);
    }

    /// The router-clock time (ns) since which no first token came while prefill was
    /// outstanding here.
    #[inline]
    pub(crate) fn since_ns(&self) -> u64 {
        self.since_ns.load(Relaxed)
    }

    /// A route at `now_ns` found no prefill outstanding here: the wait starts now.
    pub(crate) fn started(&self, now_ns: u64) {
        self.since_ns.fetch_max(now_ns, Relaxed);
    }

    /// A first token came at `at_ns`, `observed_s` after forwarding against `predicted_s`.
    pub(crate) fn first_token(&self, at_ns: u64, observed_s: f64, predicted_s: f64) {
        self.since_ns.fetch_max(at_ns, Relaxed);
        if !(observed_s.is_finite() && predicted_s.is_finite() && predicted_s > 0.0) {
            return;
        }
        let mut sums = self.sums.lock().unwrap_or_else(PoisonError::into_inner);
        sums.ttft.add(observed_s, predicted_s);
        sums.ttft_span.add(at_ns, observed_s, predicted_s);
        let prefill = sums.ttft.get();
        // Halfway, in log space, between what the worker delivers now and what it
        // delivered over the share's span (`ObservedFactors::prefill_rate`).
        let rate = (prefill * sums.ttft_span.get()).sqrt();
        self.prefill_bits.store(prefill.to_bits(), Relaxed);
        self.rate_bits.store(rate.to_bits(), Relaxed);
        self.reporting.store(true, Relaxed);
    }

    /// `tokens` output tokens took `seconds` by `now_ns`, while the model's decode step
    /// here was `decode_s` and its terms `timing`: the step factor learns the time per
    /// output token against the decode step stretched by the prefill admitted here
    /// ([`stretched`]).
    pub(crate) fn progress(
        &self,
        now_ns: u64,
        (tokens, seconds): (u32, f64),
        (decode_s, timing): (f64, &Timing),
    ) {
        if tokens == 0 || !(seconds.is_finite() && seconds >= 0.0) {
            return;
        }
        let tokens = f64::from(tokens);
        let admitted = *self.admitted.lock().unwrap_or_else(PoisonError::into_inner);
        let share = self.prefill_rate() * admitted.rate(now_ns, timing);
        let predicted = stretched(decode_s, share.min(MAX_SHARE));
        let mut sums = self.sums.lock().unwrap_or_else(PoisonError::into_inner);
        if predicted.is_finite() && predicted > 0.0 {
            sums.step.add(now_ns, seconds, predicted * tokens);
            self.step_bits
                .store(sums.step.ratio.get().to_bits(), Relaxed);
        }
        let (s, t) = sums.per_token;
        sums.per_token = (KEEP * s + seconds, KEEP * t + tokens);
        let per_token = (sums.per_token.0 / sums.per_token.1).max(f64::MIN_POSITIVE);
        self.per_token_bits.store(per_token.to_bits(), Relaxed);
        self.reporting.store(true, Relaxed);
    }

    /// The prefill rate factor.
    fn prefill_rate(&self) -> f64 {
        f64::from_bits(self.rate_bits.load(Relaxed))
    }
}

/// The time per output token of a decode step of `decode_s` on a worker whose time its
/// prefill takes a `share` of: chunked prefill shares the steps, so the decodes get the
/// rest of the time (infinite when prefill takes it all).
pub(crate) fn stretched(decode_s: f64, share: f64) -> f64 {
    if share < 1.0 {
        decode_s / (1.0 - share.max(0.0))
    } else {
        f64::INFINITY
    }
}

/// The largest prefill share a step sample is stretched by: the decay of what was
/// admitted is a rate's estimate, not its measure. Where from: a bound: at 0.9 a sample is
/// stretched tenfold at most, past which the estimate, not the worker, decides the factor.
const MAX_SHARE: f64 = 0.9;

/// `sum` decayed over `elapsed_ns` at the time constant [`PREFILL_HORIZON_S`].
fn decayed(sum: f64, elapsed_ns: u64) -> f64 {
    sum * (-(elapsed_ns as f64 * 1e-9) / PREFILL_HORIZON_S).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Terms of a millisecond per prefill token and nothing else.
    fn ms_per_token() -> Timing {
        Timing {
            prefill_s_per_token: 1e-3,
            step_base_s: 0.0,
            step_s_per_decode: 0.0,
            step_s_per_context_token: 0.0,
            prefill_s_per_attended: 0.0,
        }
    }

    #[test]
    fn nothing_reported_means_no_factors() {
        let o = Observed::default();
        o.started(5);
        assert_eq!(
            o.factors(1_000_000_000, (true, false), &ms_per_token()),
            None
        );
        assert!(
            o.factors(1_000_000_000, (true, true), &ms_per_token())
                .is_some(),
            "the fleet reports"
        );
    }

    #[test]
    fn a_slower_worker_is_seen_in_both_factors() {
        let o = Observed::default();
        for i in 0..20 {
            o.first_token(i * 1_000_000_000, 3.0, 1.0);
            o.progress(0, (16, 16.0 * 0.3), (0.1, &ms_per_token()));
        }
        let f = o
            .factors(20_000_000_000, (false, false), &ms_per_token())
            .expect("reported");
        assert!((f.prefill - 3.0).abs() < 1e-9, "{f:?}");
        assert!((f.step - 3.0).abs() < 1e-9, "{f:?}");
        assert!((f.per_token_s - 0.3).abs() < 1e-9, "{f:?}");
        assert!(f.progressed, "{f:?}");
    }

    #[test]
    fn the_step_factor_forgets_by_time_not_by_reports() {
        let ms = 1_000_000;
        let terms = ms_per_token();
        let o = Observed::default();
        // Five seconds of steps at twice the model's, a report a second...
        for i in 0..5 {
            o.progress(i * 1_000 * ms, (10, 2.0), (0.1, &terms));
        }
        // ...then twenty reports within 10 ms at the model's speed (requests side by side):
        // they weigh the two seconds they predict, not twenty samples' worth (a decay by
        // reports keeps an eighth of the five seconds before them).
        for i in 0..20 {
            o.progress(4_000 * ms + i * ms / 2, (1, 0.1), (0.1, &terms));
        }
        let step = |at_ns| {
            o.factors(at_ns, (false, false), &terms)
                .expect("reported")
                .step
        };
        assert!(step(4_010 * ms) > 1.5, "{}", step(4_010 * ms));
        // Ten seconds at the model's speed bring it back within a tenth.
        for i in 1..=10 {
            o.progress(4_000 * ms + i * 1_000 * ms, (10, 1.0), (0.1, &terms));
        }
        let after = step(14_000 * ms);
        assert!((1.0..1.1).contains(&after), "{after}");
    }

    #[test]
    fn the_prefill_share_weighs_long_waits_by_their_length() {
        let o = Observed::default();
        // First tokens a second apart, predicted at 1 s each, taking 0.5 s and 8 s in turn.
        for i in 0..40u64 {
            let observed = if i % 2 == 0 { 0.5 } else { 8.0 };
            o.first_token(i * 1_000_000_000, observed, 1.0);
        }
        let f = o
            .factors(40_000_000_000, (false, false), &ms_per_token())
            .expect("reported");
        // The log mean: about 2 (the last sample, at 8 s, weighs most).
        assert!((1.9..2.6).contains(&f.prefill), "{f:?}");
        // The time over the span: about 4.25; the share reads their geometric mean.
        assert!(f.prefill_rate > 1.2 * f.prefill, "{f:?}");
        assert!((2.8..3.4).contains(&f.prefill_rate), "{f:?}");
        o.admit(40_000_000_000, (1_000, 0));
        let f = o
            .factors(40_000_000_000, (false, false), &ms_per_token())
            .expect("reported");
        assert_eq!(f.prefill_share(0.0), f.prefill_rate * 1.0 / f.window_s);
    }

    #[test]
    fn waiting_without_a_first_token_is_evidence() {
        let o = Observed::default();
        o.first_token(1_000_000_000, 1.0, 1.0);
        let f = o
            .factors(5_000_000_000, (true, false), &ms_per_token())
            .expect("reported");
        assert_eq!(f.stalled_s, 4.0);
        assert_eq!(f.prefill_at(2.0), 2.0, "4 s waited for 2 s predicted");
        assert_eq!(f.prefill_at(8.0), 1.0, "within the prediction: no evidence");
        let idle = o
            .factors(5_000_000_000, (false, false), &ms_per_token())
            .expect("reported");
        assert_eq!(
            idle.prefill_at(2.0),
            1.0,
            "nothing outstanding, nothing waited"
        );
    }

    #[test]
    fn a_burst_is_read_over_the_time_it_has_lasted() {
        let second = 1_000_000_000;
        let o = Observed::default();
        o.first_token(0, 1.0, 1.0);
        // Half a second of prefill admitted every second (a millisecond a token): half of
        // the worker's time, however long the history.
        for i in 0..=6 {
            o.admit(i * second, (500, 0));
        }
        let f = o
            .factors(6 * second, (false, false), &ms_per_token())
            .expect("reported");
        let spanned = PREFILL_HORIZON_S * (1.0 - (-6.0 / PREFILL_HORIZON_S).exp());
        assert!(
            (f.window_s - spanned.max(MIN_WINDOW_S)).abs() < 1e-9,
            "{f:?}"
        );
        assert!((0.45..0.6).contains(&f.prefill_share(0.0)), "{f:?}");
        // The first admissions are read over 4 s at least.
        let fresh = Observed::default();
        fresh.first_token(0, 1.0, 1.0);
        fresh.admit(second, (1_000, 0));
        let f = fresh
            .factors(second, (false, false), &ms_per_token())
            .expect("reported");
        assert_eq!(f.window_s, MIN_WINDOW_S);
        assert_eq!(f.prefill_share(1.0), 0.5);
        // Long after, the whole horizon.
        let f = o
            .factors(1_000 * second, (false, false), &ms_per_token())
            .expect("reported");
        assert!((f.window_s - PREFILL_HORIZON_S).abs() < 1e-9, "{f:?}");
    }

    #[test]
    fn admitted_work_is_priced_at_the_terms_as_read() {
        let o = Observed::default();
        o.first_token(0, 1.0, 1.0);
        o.admit(0, (2_000, 1_000_000));
        let slow = Timing {
            prefill_s_per_token: 3e-3,
            prefill_s_per_attended: 1e-6,
            ..ms_per_token()
        };
        let f = o
            .factors(0, (false, false), &ms_per_token())
            .expect("reported");
        assert_eq!(f.admitted_s, 2.0);
        let f = o.factors(0, (false, false), &slow).expect("reported");
        assert_eq!(f.admitted_s, 7.0, "6 s of tokens and 1 s of attention");
    }

    #[test]
    fn bad_times_change_nothing() {
        let o = Observed::default();
        o.first_token(0, f64::NAN, 1.0);
        o.first_token(0, 1.0, 0.0);
        o.progress(0, (0, 1.0), (0.1, &ms_per_token()));
        o.progress(0, (4, f64::INFINITY), (0.1, &ms_per_token()));
        assert_eq!(o.factors(0, (false, false), &ms_per_token()), None);
    }
}
