//! One worker's load as this router estimates it ([`LoadState`]): the engine's last report,
//! this router's own counts since that report, the worker's profile and its learned speed.
//!
//! Reconciliation: a report replaces what the router counted before it, as vLLM's
//! data-parallel balancer does with its engines' snapshots; what this router routes,
//! prefills and completes after it is added on top. Where the router's own count of its
//! in-flight requests is larger (a report measured before the router's last requests
//! reached the engine), that count wins. Prefill tokens may be the exception while the
//! report is fresh ([`LoadConfig::prefill_from_report`]): the engine's pending prefill
//! counts the progress of prefills under way, which the router's own count (whole prompts
//! until their first token) cannot, so the report and the router's routes since it stand
//! alone. The counters are atomics updated without a common lock,
//! so an estimate may mix a report with counts from just before it: it is an estimate, as
//! the report itself is.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::super::clock::nanos;
use super::super::config::{LoadConfig, WorkerProfile};
use super::super::learned::forecast::ForecastTiming;
use super::super::learned::learn::{FleetLearned, Learned, WorkerLearner};
use super::super::learned::timing::{TERMS, TermCounts, Timing, attended};
use super::super::prediction::estimate::Estimate;
use super::super::replicas::peers::PeerCounts;
use super::super::report::{EngineLoad, Staleness};

/// `prefill` of an engine report that gave none.
const NO_PREFILL: u64 = u64::MAX;

/// One worker's load state: lock-free, updated by routes, timings and reports.
#[derive(Debug)]
pub(crate) struct LoadState {
    /// Requests routed here and not completed.
    pub(crate) in_flight: AtomicU64,
    /// Of those, requests whose first token has not come.
    awaiting_first: AtomicU64,
    /// Uncached prompt tokens of in-flight requests whose first token has not come.
    pub(crate) prefill_tokens: AtomicU64,
    /// The pairs of tokens those prefills attend to.
    prefill_pairs: AtomicU64,
    /// Uncached prompt tokens of requests whose first token came, in all.
    prefilled_total: AtomicU64,
    /// Prompt and output tokens of in-flight requests: the context they attend to.
    context_tokens: AtomicU64,
    /// Uncached prompt and output tokens of in-flight requests: the KV they add.
    kv_tokens: AtomicU64,
    report: Report,
    since: Since,
    /// The speed the host told ([`WorkerProfile::speed`], f64 bits).
    told_speed_bits: AtomicU64,
    /// The step terms estimates use (f64 bits, in [`Timing`]'s order): the configured ones
    /// at the told speed, corrected by what the worker's timings taught; kept current by
    /// [`LoadState::update_timing`].
    timing_bits: [AtomicU64; TERMS],
    /// `timing`'s speed relative to the configured terms (f64 bits), kept with it.
    speed_bits: AtomicU64,
    kv_capacity_tokens: AtomicU64,
    /// Peer replicas' requests here, counted as this router's own are (`peers.rs`).
    pub(crate) peers: PeerCounts,
    /// What the worker's timings taught (see `learn.rs`); taken only to learn and to
    /// publish the terms, never on the route path.
    learner: Mutex<WorkerLearner>,
    /// The terms the predictions admission checks are made with (`forecast.rs`).
    pub(crate) forecast: ForecastTiming,
}

/// The engine's last report.
#[derive(Debug, Default)]
struct Report {
    present: AtomicBool,
    waiting: AtomicU64,
    running: AtomicU64,
    kv_usage_bits: AtomicU64,
    kv_blocks_total: AtomicU64,
    prefill: AtomicU64,
    measured_ns: AtomicU64,
}

/// This router's counts since the last report.
#[derive(Debug, Default)]
struct Since {
    routed: AtomicU64,
    first_tokens: AtomicU64,
    completed: AtomicU64,
    prefill: AtomicU64,
    prefilled: AtomicU64,
}

impl Default for LoadState {
    fn default() -> Self {
        Self {
            in_flight: AtomicU64::new(0),
            awaiting_first: AtomicU64::new(0),
            prefill_tokens: AtomicU64::new(0),
            prefill_pairs: AtomicU64::new(0),
            prefilled_total: AtomicU64::new(0),
            context_tokens: AtomicU64::new(0),
            kv_tokens: AtomicU64::new(0),
            report: Report::default(),
            since: Since::default(),
            told_speed_bits: AtomicU64::new(1.0f64.to_bits()),
            speed_bits: AtomicU64::new(1.0f64.to_bits()),
            timing_bits: Timing::default()
                .to_array()
                .map(|t| AtomicU64::new(t.to_bits())),
            kv_capacity_tokens: AtomicU64::new(0),
            peers: PeerCounts::default(),
            learner: Mutex::new(WorkerLearner::default()),
            forecast: ForecastTiming::default(),
        }
    }
}

/// What reading a worker's report needs beyond the report: the fleet's figures at the
/// moment (see [`LoadState::estimate`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReportContext {
    /// The uncached tokens of an average request routed to the worker: what a reported
    /// waiting request without its tokens counts as.
    pub(crate) mean_prefill: u64,
    /// Tokens per block, to turn reported KV blocks into tokens.
    pub(crate) block_size: u64,
    /// The replicas routing for the fleet over those heard (numerator, denominator): what
    /// multiplies the counts since the report.
    pub(crate) replicas_over_heard: (u64, u64),
}

/// The counts since a report that reconciling adds to it: the router's own scaled by
/// [`ReportContext::replicas_over_heard`], its peers' as their frames said, and whether a
/// fresh report's pending prefill replaces the router's count.
#[derive(Clone, Copy, Debug)]
struct Reconciled {
    replicas_over_heard: (u64, u64),
    peers: [u64; 5],
    report_prefill: bool,
}

impl LoadState {
    /// A request of `prompt` tokens, `prefill` of them uncached, expected to generate
    /// `output`, was routed here; whether no other awaited its first token.
    pub(crate) fn routed(&self, prompt: u64, prefill: u64, output: u32) -> bool {
        let output = u64::from(output);
        self.in_flight.fetch_add(1, Relaxed);
        let first = self.awaiting_first.fetch_add(1, Relaxed) == 0;
        self.prefill_tokens.fetch_add(prefill, Relaxed);
        self.prefill_pairs
            .fetch_add(attended(prompt, prefill), Relaxed);
        self.context_tokens.fetch_add(prompt + output, Relaxed);
        self.kv_tokens.fetch_add(prefill + output, Relaxed);
        self.since.routed.fetch_add(1, Relaxed);
        self.since.prefill.fetch_add(prefill, Relaxed);
        first
    }

    /// A request's first token came: its `prefill` tokens of a `prompt`-token prompt are
    /// done.
    /// Returns the uncached prompt tokens of requests whose first token came, in all, these
    /// included.
    pub(crate) fn first_token(&self, prompt: u64, prefill: u64) -> u64 {
        let total = self.prefilled_total.fetch_add(prefill, Relaxed) + prefill;
        sub(&self.awaiting_first, 1);
        sub(&self.prefill_tokens, prefill);
        sub(&self.prefill_pairs, attended(prompt, prefill));
        self.since.first_tokens.fetch_add(1, Relaxed);
        self.since.prefilled.fetch_add(prefill, Relaxed);
        total
    }

    /// Uncached prompt tokens of requests whose first token came here, in all.
    pub(crate) fn prefilled_total(&self) -> u64 {
        self.prefilled_total.load(Relaxed)
    }

    /// A request routed with `prompt`, `prefill` and `output` left (its first token
    /// counted already).
    pub(crate) fn completed(&self, prompt: u64, prefill: u64, output: u32) {
        let output = u64::from(output);
        sub(&self.in_flight, 1);
        sub(&self.context_tokens, prompt + output);
        sub(&self.kv_tokens, prefill + output);
        self.since.completed.fetch_add(1, Relaxed);
    }

    /// The engine reported `load` (validated).
    pub(crate) fn report(&self, load: &EngineLoad) {
        let r = &self.report;
        r.waiting.store(load.waiting, Relaxed);
        r.running.store(load.running, Relaxed);
        r.kv_usage_bits.store(load.kv_usage.to_bits(), Relaxed);
        r.kv_blocks_total.store(load.kv_blocks_total, Relaxed);
        r.prefill
            .store(load.prefill_tokens.unwrap_or(NO_PREFILL), Relaxed);
        r.measured_ns.store(nanos(load.measured_at), Relaxed);
        r.present.store(true, Relaxed);
        self.peers.reported();
        for counter in [
            &self.since.routed,
            &self.since.first_tokens,
            &self.since.completed,
            &self.since.prefill,
            &self.since.prefilled,
        ] {
            counter.store(0, Relaxed);
        }
    }

    /// When the last report was measured (nanoseconds), if there is one.
    pub(crate) fn report_ns(&self) -> Option<u64> {
        let r = &self.report;
        r.present.load(Relaxed).then(|| r.measured_ns.load(Relaxed))
    }

    /// When the report whose pending prefill an estimate at `now_ns` reads in place of the
    /// router's own count was measured ([`LoadConfig::prefill_from_report`]): that figure
    /// already counts the progress of prefills under way until then.
    pub(crate) fn prefill_report_ns(&self, config: &LoadConfig, now_ns: u64) -> Option<u64> {
        let r = &self.report;
        if !(config.prefill_from_report && r.present.load(Relaxed)) {
            return None;
        }
        let measured = r.measured_ns.load(Relaxed);
        let fresh = now_ns.saturating_sub(measured) <= nanos(config.max_report_age);
        (fresh && r.prefill.load(Relaxed) != NO_PREFILL).then_some(measured)
    }

    /// The last report, if any.
    pub(crate) fn last_report(&self) -> Option<EngineLoad> {
        let r = &self.report;
        if !r.present.load(Relaxed) {
            return None;
        }
        let prefill = r.prefill.load(Relaxed);
        Some(EngineLoad {
            waiting: r.waiting.load(Relaxed),
            running: r.running.load(Relaxed),
            kv_usage: f64::from_bits(r.kv_usage_bits.load(Relaxed)),
            kv_blocks_total: r.kv_blocks_total.load(Relaxed),
            prefill_tokens: (prefill != NO_PREFILL).then_some(prefill),
            measured_at: Duration::from_nanos(r.measured_ns.load(Relaxed)),
        })
    }

    /// The host told the worker's profile (validated); the caller updates its timing.
    pub(crate) fn set_profile(&self, profile: &WorkerProfile) {
        self.told_speed_bits.store(profile.speed.to_bits(), Relaxed);
        self.kv_capacity_tokens
            .store(profile.kv_capacity_tokens, Relaxed);
    }

    /// The relative speed the host told.
    pub(crate) fn told_speed(&self) -> f64 {
        f64::from_bits(self.told_speed_bits.load(Relaxed))
    }

    /// The worker's configured terms: `config`'s at the speed the host told.
    pub(crate) fn configured(&self, config: &LoadConfig) -> Timing {
        Timing::configured(config, self.told_speed())
    }

    /// The step terms estimates use.
    #[inline]
    pub(crate) fn timing(&self) -> Timing {
        Timing::from_array(
            self.timing_bits
                .each_ref()
                .map(|b| f64::from_bits(b.load(Relaxed))),
        )
    }

    /// The prefill speed of [`timing`](Self::timing) relative to the configured rate, as
    /// an [`Estimate`] reads it.
    #[inline]
    pub(crate) fn speed(&self) -> f32 {
        f64::from_bits(self.speed_bits.load(Relaxed)) as f32
    }

    fn learner(&self) -> MutexGuard<'_, WorkerLearner> {
        // Nothing panics while holding the lock; a poisoned lock still holds a valid state.
        self.learner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the terms estimates use from the configured ones, what the `fleet` learned and
    /// what the worker's timings taught.
    pub(crate) fn update_timing(&self, config: &LoadConfig, fleet: &FleetLearned) {
        let timing = self.learner().timing(&self.configured(config), fleet);
        for (bits, t) in self.timing_bits.iter().zip(timing.to_array()) {
            bits.store(t.to_bits(), Relaxed);
        }
        let speed = timing.relative_speed(config);
        self.speed_bits.store(speed.to_bits(), Relaxed);
    }

    /// A time `measured` of what `terms` count came (a time to first token when
    /// `first_token`): the worker's ratios learn from it, the fleet's ratios being `fleet`
    /// (see `learn.rs`); the caller updates the timings.
    pub(crate) fn learn(
        &self,
        config: &LoadConfig,
        fleet: &FleetLearned,
        (terms, measured): (&TermCounts, f64),
        first_token: bool,
    ) {
        let configured = self.configured(config);
        self.learner()
            .learn(fleet, &configured, (terms, measured), first_token);
    }

    /// What the worker learned, for the fleet's.
    pub(crate) fn learned(&self) -> Learned {
        self.learner().learned()
    }

    /// Measured over predicted time to first token (recent timings weighing more) and the
    /// timings learned from; `None` before a few.
    pub(crate) fn timing_error(&self) -> Option<(f64, u64)> {
        self.learner().error()
    }

    /// Timings learned from.
    pub(crate) fn timings(&self) -> u64 {
        self.learner().timings()
    }

    /// The worker's load at `now_ns` (the router's clock), as `config` reads reports.
    /// Peers' requests count as this router's. Reading a report needs `context`: the
    /// uncached tokens of an average request routed here (for a report that counts waiting
    /// requests but not their tokens), the block size (to turn reported KV blocks into
    /// tokens) and the fraction that multiplies the counts since the report (see
    /// [`reconcile`](Self::reconcile)); it is not called for a worker without one.
    pub(crate) fn estimate(
        &self,
        config: &LoadConfig,
        now_ns: u64,
        context: impl FnOnce() -> ReportContext,
    ) -> Estimate {
        let in_flight = self.in_flight.load(Relaxed);
        let awaiting = self.awaiting_first.load(Relaxed);
        let mut e = Estimate {
            requests: in_flight,
            decoding: in_flight - awaiting.min(in_flight),
            prefill_tokens: self.prefill_tokens.load(Relaxed),
            prefill_pairs: self.prefill_pairs.load(Relaxed),
            context_tokens: self.context_tokens.load(Relaxed),
            kv_tokens: self.kv_tokens.load(Relaxed),
            kv_usage: 0.0,
            kv_capacity_tokens: self.kv_capacity_tokens.load(Relaxed),
            timing: self.timing(),
            speed: self.speed(),
            saturated: false,
            forecast: None,
        };
        let since = match self.peers.load() {
            Some(peers) => {
                peers.add_to(&mut e, awaiting);
                peers.since
            }
            None => [0; 5],
        };
        let r = &self.report;
        if !r.present.load(Relaxed) {
            return e;
        }
        let age = now_ns.saturating_sub(r.measured_ns.load(Relaxed));
        if age > nanos(config.max_report_age) {
            match config.staleness {
                Staleness::Ignore => return e,
                Staleness::Saturated => e.saturated = true,
                Staleness::Hold => {}
            }
        }
        let report_prefill = config.prefill_from_report && age <= nanos(config.max_report_age);
        let context = context();
        let counts = Reconciled {
            replicas_over_heard: context.replicas_over_heard,
            peers: since,
            report_prefill,
        };
        self.reconcile(&mut e, &context, counts);
        e
    }

    /// Adds the report and the counts since it (this router's and its peers', times
    /// `scale.0 / scale.1`: the replicas routing for the fleet over those heard) to `e`
    /// (the router's and its peers' own counts); with `report_prefill` (a fresh report,
    /// read as [`LoadConfig::prefill_from_report`] asks), its pending prefill replaces the
    /// router's.
    fn reconcile(&self, e: &mut Estimate, context: &ReportContext, since: Reconciled) {
        let ReportContext {
            mean_prefill,
            block_size,
            ..
        } = *context;
        let Reconciled {
            replicas_over_heard: (times, over),
            peers,
            report_prefill,
        } = since;
        let (r, s) = (&self.report, &self.since);
        let scaled = |c: &AtomicU64, peer: u64| {
            let all = c.load(Relaxed).saturating_add(peer);
            all.saturating_mul(times) / over.max(1)
        };
        let routed = scaled(&s.routed, peers[0]);
        let first = scaled(&s.first_tokens, peers[1]);
        let done = scaled(&s.completed, peers[2]);
        let waiting = (r.waiting.load(Relaxed) + routed).saturating_sub(first);
        let running = (r.running.load(Relaxed) + first).saturating_sub(done);
        e.requests = e.requests.max(waiting + running);
        e.decoding = e.decoding.max(running.min(e.requests));
        let own = e.prefill_tokens;
        e.prefill_tokens = match r.prefill.load(Relaxed) {
            NO_PREFILL => e.prefill_tokens.max(waiting.saturating_mul(mean_prefill)),
            p => {
                let reported = (p + scaled(&s.prefill, peers[3]))
                    .saturating_sub(scaled(&s.prefilled, peers[4]));
                if report_prefill {
                    reported
                } else {
                    e.prefill_tokens.max(reported)
                }
            }
        };
        // The report counts tokens, not the pairs they attend to: the prefill beyond this
        // router's own attends as its own does, token for token.
        if own > 0 && e.prefill_tokens != own {
            let scaled = e.prefill_pairs as f64 * e.prefill_tokens as f64 / own as f64;
            e.prefill_pairs = scaled as u64;
        }
        let usage = f64::from_bits(r.kv_usage_bits.load(Relaxed));
        e.kv_usage = usage as f32;
        if e.kv_capacity_tokens == 0 {
            e.kv_capacity_tokens = r.kv_blocks_total.load(Relaxed).saturating_mul(block_size);
        }
        if e.kv_capacity_tokens > 0 {
            let held = (usage * e.kv_capacity_tokens as f64) as u64;
            let demand = held + (e.requests - e.decoding).saturating_mul(mean_prefill);
            e.kv_tokens = e.kv_tokens.max(demand);
            e.context_tokens = e.context_tokens.max(held);
        }
    }
}

/// Takes back from one of this router's own counters what a route added to it. Each
/// route's charges are taken back once (its decision's state bits see to it), so a counter
/// never goes below zero.
fn sub(counter: &AtomicU64, by: u64) {
    counter.fetch_sub(by, Relaxed);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A context of 1,000 uncached tokens an average request, blocks of 16, one replica.
    fn context() -> ReportContext {
        ReportContext {
            mean_prefill: 1_000,
            block_size: 16,
            replicas_over_heard: (1, 1),
        }
    }

    /// A report's counts with this router's routes, first tokens and completions since:
    /// waiting gains the routes and loses the first tokens, running gains the first tokens
    /// and loses the completions, the reported prefill gains the routed and loses the
    /// prefilled; the router's own counts stand where the report has less.
    #[test]
    fn a_report_is_reconciled_with_the_counts_since() {
        let config = LoadConfig::default();
        let state = LoadState::default();
        let load = EngineLoad::new(3, 5, Duration::ZERO).with_prefill_tokens(10_000);
        state.report(&load);
        // Two routes of 2,000-token prompts, 1,500 uncached each; one reaches its first
        // token, and one of the reported running requests completes.
        state.routed(2_000, 1_500, 64);
        state.routed(2_000, 1_500, 64);
        state.first_token(2_000, 1_500);
        state.completed(500, 0, 64);
        let e = state.estimate(&config, 0, context);
        assert_eq!(e.requests, (3 + 2 - 1) + (5 + 1 - 1), "{e:?}");
        assert_eq!(e.decoding, 5 + 1 - 1, "{e:?}");
        assert_eq!(e.prefill_tokens, 10_000 + 3_000 - 1_500, "{e:?}");
        // Without a report, the router's own counts alone.
        let own = LoadState::default();
        own.routed(2_000, 1_500, 64);
        let e = own.estimate(&config, 0, context);
        assert_eq!((e.requests, e.decoding, e.prefill_tokens), (1, 0, 1_500));
    }

    /// A report of waiting requests without their tokens counts each at the average
    /// request's uncached tokens, unless the router's own count is more.
    #[test]
    fn waiting_requests_without_tokens_count_at_the_average() {
        let config = LoadConfig::default();
        let state = LoadState::default();
        state.report(&EngineLoad::new(4, 0, Duration::ZERO));
        let e = state.estimate(&config, 0, context);
        assert_eq!(e.prefill_tokens, 4 * 1_000, "{e:?}");
    }

    /// A report past its age counts as the staleness policy says: ignored (the router's
    /// counts alone), or as saturation.
    #[test]
    fn a_stale_report_counts_as_configured() {
        let state = LoadState::default();
        state.report(&EngineLoad::new(40, 40, Duration::ZERO));
        let old = nanos(LoadConfig::default().max_report_age) + 1;
        let ignore = LoadConfig::default().with_staleness(Staleness::Ignore);
        let e = state.estimate(&ignore, old, context);
        assert_eq!((e.requests, e.saturated), (0, false), "{e:?}");
        let saturated = LoadConfig::default().with_staleness(Staleness::Saturated);
        let e = state.estimate(&saturated, old, context);
        assert!(e.saturated && e.requests == 80, "{e:?}");
    }
}
