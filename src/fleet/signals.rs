//! Fleet signals: what an autoscaler reads of a fleet in one call
//! ([`Router::fleet_signals`](crate::Router::fleet_signals)): the predicted hit ratio, the
//! uncached prefill demand, each worker's saturation, the requests shed by reason, and the
//! reuse counters (available at the best holder, captured by the chosen worker, delivered as
//! the engine reported).
//!
//! Every count is cumulative since the router started (or the worker was added), as a
//! Prometheus counter is; [`FleetSignals::rates_since`] turns two snapshots into rates over
//! the router's own clock (the times requests and reports carried), never the wall clock.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use super::observed::worker::ObservedFactors;
use super::prediction::estimate::Estimate;
use super::registry::slots::Registered;
use crate::fleet::EngineLoad;
use crate::request::{GATES, LIMITS, Limit, Priority, Shed};
use crate::tree::WorkerId;

/// The index of `limit` in [`LIMITS`].
fn limit_index(limit: Limit) -> usize {
    LIMITS.iter().position(|l| *l == limit).unwrap_or(0)
}

/// The index of `priority` in [`Priority::ALL`].
fn priority_index(priority: Priority) -> usize {
    Priority::ALL
        .iter()
        .position(|p| *p == priority)
        .unwrap_or(0)
}

/// Requests refused by admission, by limit, by priority and by gate (lock-free).
#[derive(Debug, Default)]
pub(crate) struct ShedCounts {
    by_limit: [AtomicU64; 5],
    by_priority: [AtomicU64; 3],
    by_gate: [AtomicU64; 4],
}

impl ShedCounts {
    /// Counts one refusal.
    pub(crate) fn count(&self, shed: &Shed) {
        self.by_limit[limit_index(shed.limit)].fetch_add(1, Relaxed);
        self.by_priority[priority_index(shed.priority)].fetch_add(1, Relaxed);
        let gate = GATES.iter().position(|g| *g == shed.gate).unwrap_or(0);
        self.by_gate[gate].fetch_add(1, Relaxed);
    }

    /// The counts by [`GATES`].
    pub(crate) fn by_gate(&self) -> [u64; 4] {
        self.by_gate.each_ref().map(|c| c.load(Relaxed))
    }

    /// The counts: by [`LIMITS`], then by [`Priority::ALL`].
    pub(crate) fn get(&self) -> ([u64; 5], [u64; 3]) {
        (
            self.by_limit.each_ref().map(|c| c.load(Relaxed)),
            self.by_priority.each_ref().map(|c| c.load(Relaxed)),
        )
    }
}

/// A snapshot of one worker's load as the router sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct WorkerLoad {
    /// Whether the worker takes new requests.
    pub available: bool,
    /// Requests routed to it by this router and not yet completed.
    pub in_flight: u64,
    /// Uncached prompt tokens of those requests whose prefill is not known to be done
    /// (prefill work queued or running on it; see [`Router::first_token`](crate::Router::first_token)).
    pub prefill_tokens: u64,
    /// Peer replicas' requests booked on it and not completed (replica sync, see
    /// [`Router::apply_replica_sync`](crate::Router::apply_replica_sync)).
    pub peer_in_flight: u64,
    /// Uncached prompt tokens of those whose prefill is not known to be done.
    pub peer_prefill_tokens: u64,
    /// Requests on the worker as the router estimates them: this router's and its peers'
    /// in flight, or the engine's last report reconciled with their counts since (see
    /// [`EngineLoad`]), whichever is more.
    pub estimated_requests: u64,
    /// Of those, requests decoding (past their first token).
    pub estimated_decoding: u64,
    /// Uncached prompt tokens to prefill before a new request's, as estimated.
    pub estimated_prefill_tokens: u64,
    /// The worker's speed relative to the configured one: its profile's, corrected by the
    /// timings the host reported ([`Router::first_token_after`](crate::Router::first_token_after)).
    pub speed: f64,
    /// Requests routed to it since it was added.
    pub routed: u64,
    /// Prompt tokens predicted cached, summed over those requests.
    pub predicted_cached_tokens: u64,
    /// Prompt tokens predicted cached, summed over every request routed to it (those
    /// completed too).
    pub captured_tokens: u64,
    /// Prompt tokens predicted uncached (to prefill), summed over every request routed to
    /// it.
    pub uncached_tokens: u64,
    /// Prompt tokens the best holder of each of those prompts held: what sending each to its
    /// best holder would have found cached.
    pub available_cached_tokens: u64,
    /// The load model's predicted wait before a new request's own prefill starts, in
    /// seconds (what the least-loaded rule compares; see
    /// [`WorkerSignals::wait_s`](crate::WorkerSignals::wait_s)).
    pub wait_s: f64,
    /// The last [`EngineLoad`] reported for it.
    pub reported: Option<EngineLoad>,
    /// The load model's error on this worker: measured over predicted time to first token
    /// (weighted towards the last ten or so), the prediction being the one the policies
    /// price with (the queued prompts whole until their first token, at the worker's learned
    /// terms with the fleet's as prior), not the one a decision records (for that, see
    /// [`ObservedLoad::prefill_factor`]); from the timings
    /// the host reported ([`Router::first_token_after`](crate::Router::first_token_after));
    /// `None` before five. 1.0 is a model that predicts the worker exactly; 2.0, first
    /// tokens twice as late as predicted (which admission and the cost then expect).
    pub ttft_measured_over_predicted: Option<f64>,
    /// First-token timings the router learned from for this worker.
    pub ttft_timings: u64,
    /// Cached-token reports received for it
    /// ([`CacheSync::report_cached`](crate::CacheSync::report_cached)).
    pub reports: u64,
    /// Prompt tokens those reports said were cached (in the mirror's whole blocks).
    pub reported_cached_tokens: u64,
    /// Prompt tokens the mirror predicted cached for the same prompts when each report came:
    /// beside `reported_cached_tokens`, how far the mirror is from the truth (a block size,
    /// LoRA, group or hash mismatch shows as a large gap instead of staying silent).
    pub predicted_for_reports_tokens: u64,
    /// Reports that disagreed with the mirror's prediction.
    pub mispredicted_reports: u64,
    /// What admission's observed gates read of the worker; `None` until the host reports a
    /// timed first token or streamed progress for it.
    pub observed: Option<ObservedLoad>,
}

/// What a worker was observed to deliver against what the load model predicts: the
/// state of admission's prefill window and decode bound on it.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct ObservedLoad {
    /// Measured over predicted time to first token, the prediction being the one a decision
    /// records and admission checks ([`RouteDecision::predicted_ttft_s`](crate::RouteDecision::predicted_ttft_s)),
    /// weighted towards the last ten samples or so, with the wait for a first token as
    /// evidence: what the prefill window multiplies the prediction by (1.0 until measured).
    pub prefill_factor: f64,
    /// Measured time per output token between streamed progress reports over the model's
    /// decode step then (1.0 until measured).
    pub step_factor: f64,
    /// The observed prefill rate, in uncached prompt tokens per second: the window is the
    /// prefill a worker may hold outstanding, this rate times a request's target.
    pub prefill_tokens_per_s: f64,
    /// The window's occupancy: uncached prompt tokens outstanding (not yet at their first
    /// token), as estimated.
    pub outstanding_prefill_tokens: u64,
    /// The observed time per output token, from streamed progress (0 until reported).
    pub step_s: f64,
    /// The decode bound's occupancy: the share of the worker's time the prefill admission
    /// admitted there takes, at the prefill factor from first tokens (without the wait's
    /// evidence, as the bound reads it), over the last five seconds or so
    /// (decayed; over the time since the first admission there while that is shorter, at
    /// least 4 s). Chunked prefill shares the decode steps: the decodes get the rest, and the
    /// bound keeps the step factor times the decode step over that rest within a request's
    /// time-per-output-token target.
    pub prefill_share: f64,
    /// Seconds since a first token last came while prefill was outstanding.
    pub stalled_s: f64,
}

impl ObservedLoad {
    /// The observed load of a worker estimated at `e`, with factors `f`.
    pub(crate) fn of(e: &Estimate, f: &ObservedFactors) -> Self {
        // The model's prefill rate: over the prefill outstanding, or a 4,096-token prompt.
        let tokens = if e.prefill_tokens > 0 {
            e.prefill_tokens as f64
        } else {
            4_096.0
        };
        let pairs = if e.prefill_tokens > 0 {
            e.prefill_pairs as f64
        } else {
            super::learned::timing::attended(4_096, 4_096) as f64
        };
        let model_s = e.timing.prefill_s(tokens, pairs);
        let outstanding_s = e
            .timing
            .prefill_s(e.prefill_tokens as f64, e.prefill_pairs as f64);
        let factor = f.prefill_at(outstanding_s);
        ObservedLoad {
            prefill_factor: factor,
            step_factor: f.step,
            prefill_tokens_per_s: if model_s > 0.0 {
                tokens / model_s / factor
            } else {
                0.0
            },
            outstanding_prefill_tokens: e.prefill_tokens,
            step_s: f.per_token_s,
            // The share as the decode bound reads it: at the prefill factor from first
            // tokens, without the wait's evidence (which bounds the window alone).
            prefill_share: f.prefill_share(0.0),
            stalled_s: f.stalled_s,
        }
    }
}

impl WorkerLoad {
    /// The snapshot of registered worker `r`, whose load is estimated at `e`; `block_size`
    /// turns the blocks its best holders held into tokens.
    pub(crate) fn of(
        r: Registered<'_>,
        e: &Estimate,
        block_size: u64,
        factors: Option<ObservedFactors>,
    ) -> Self {
        let Registered { slot: s, key } = r;
        WorkerLoad {
            available: s.available.load(Relaxed),
            in_flight: s.load.in_flight.load(Relaxed),
            prefill_tokens: s.load.prefill_tokens.load(Relaxed),
            peer_in_flight: s.load.peers.in_flight(),
            peer_prefill_tokens: s.load.peers.prefill_tokens(),
            estimated_requests: e.requests,
            estimated_decoding: e.decoding,
            estimated_prefill_tokens: e.prefill_tokens,
            speed: f64::from(e.speed),
            routed: key.routed.load(Relaxed),
            predicted_cached_tokens: s.predicted_cached.load(Relaxed),
            captured_tokens: s.captured.load(Relaxed),
            uncached_tokens: key.assigned_prefill.load(Relaxed),
            available_cached_tokens: s.available_blocks.load(Relaxed) * block_size,
            wait_s: key.load_s(),
            reported: s.load.last_report(),
            ttft_measured_over_predicted: s.load.timing_error().map(|(ratio, _)| ratio),
            ttft_timings: s.load.timings(),
            reports: s.reports.load(Relaxed),
            reported_cached_tokens: s.reported_cached.load(Relaxed),
            predicted_for_reports_tokens: s.predicted_for_reports.load(Relaxed),
            mispredicted_reports: s.mispredicted.load(Relaxed),
            observed: factors.map(|f| ObservedLoad::of(e, &f)),
        }
    }
}

/// One worker in [`FleetSignals`].
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct WorkerSignals {
    /// The worker.
    pub worker: WorkerId,
    /// Whether it takes new requests.
    pub available: bool,
    /// Its saturation: the load model's predicted wait before a new request's own prefill
    /// starts, in seconds (the prefill queued ahead, the steps it shares, the wait for a
    /// running slot or KV; an hour more when its report is stale and counts as saturation).
    /// A worker whose wait passes the fleet's time-to-first-token target is saturated.
    pub wait_s: f64,
    /// The fraction of KV in use it last reported (0 without a fresh report).
    pub kv_usage: f64,
    /// Requests on it, waiting or running, as estimated.
    pub requests: u64,
    /// Requests routed to it.
    pub routed: u64,
    /// Prompt tokens routed to it.
    pub prompt_tokens: u64,
    /// Of those, tokens the mirror predicted it held (captured reuse).
    pub captured_tokens: u64,
    /// Tokens the best holder of each of those prompts held (available reuse).
    pub available_tokens: u64,
    /// Prompt tokens of the requests the host reported cached tokens for.
    pub reported_cached_tokens: u64,
    /// What the mirror predicted cached for those same prompts.
    pub predicted_for_reports_tokens: u64,
    /// Admission's observed gates on it ([`WorkerLoad::observed`]).
    pub observed: Option<ObservedLoad>,
}

impl WorkerSignals {
    /// The signals of `worker` from its load snapshot.
    #[must_use]
    pub fn of(worker: WorkerId, load: &WorkerLoad) -> Self {
        let kv_usage = load.reported.map_or(0.0, |r| r.kv_usage);
        Self {
            worker,
            available: load.available,
            wait_s: load.wait_s,
            kv_usage,
            requests: load.estimated_requests,
            routed: load.routed,
            prompt_tokens: load.captured_tokens + load.uncached_tokens,
            captured_tokens: load.captured_tokens,
            available_tokens: load.available_cached_tokens,
            reported_cached_tokens: load.reported_cached_tokens,
            predicted_for_reports_tokens: load.predicted_for_reports_tokens,
            observed: load.observed,
        }
    }
}

/// What an autoscaler needs of a fleet, in one snapshot
/// ([`Router::fleet_signals`](crate::Router::fleet_signals)).
///
/// ```
/// use std::time::Duration;
/// use prefix_router::{BalancedRouter, Router, RouteRequest};
///
/// let router = BalancedRouter::new(2)?;
/// let prompt: Vec<u32> = (0..64).collect();
/// let at = |s| RouteRequest::new(&prompt).with_time(Duration::from_secs(s));
/// let before = router.fleet_signals();
/// router.route(&at(1))?;
/// router.route(&at(3))?;
/// let after = router.fleet_signals();
/// // The second request found the first's prompt cached on the worker it was sent to.
/// assert!(after.predicted_hit_ratio() > 0.0);
/// let rates = after.rates_since(&before).expect("the clock moved");
/// assert_eq!(rates.requests_per_s, 2.0 / 3.0);
/// # Ok::<(), prefix_router::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct FleetSignals {
    /// The router's clock: the latest time a request or a report carried.
    pub at: Duration,
    /// Every registered worker, in id order.
    pub workers: Vec<WorkerSignals>,
    /// Requests refused by admission, by [`LIMITS`].
    pub shed_by_limit: [u64; 5],
    /// Requests refused by admission, by [`Priority::ALL`].
    pub shed_by_priority: [u64; 3],
    /// Requests refused by admission, by the gate that refused them ([`GATES`]).
    pub shed_by_gate: [u64; 4],
}

impl FleetSignals {
    /// Signals from each worker's snapshot and the refusal counts.
    #[must_use]
    pub fn new(at: Duration, workers: Vec<WorkerSignals>, shed: ([u64; 5], [u64; 3])) -> Self {
        Self {
            at,
            workers,
            shed_by_limit: shed.0,
            shed_by_priority: shed.1,
            shed_by_gate: [0; 4],
        }
    }

    /// The same signals with the refusals counted by gate ([`GATES`]).
    #[must_use]
    pub fn with_shed_by_gate(mut self, by_gate: [u64; 4]) -> Self {
        self.shed_by_gate = by_gate;
        self
    }

    fn sum(&self, field: impl Fn(&WorkerSignals) -> u64) -> u64 {
        self.workers.iter().map(field).sum()
    }

    /// Requests routed.
    #[must_use]
    pub fn routed(&self) -> u64 {
        self.sum(|w| w.routed)
    }

    /// Prompt tokens routed.
    #[must_use]
    pub fn prompt_tokens(&self) -> u64 {
        self.sum(|w| w.prompt_tokens)
    }

    /// Prompt tokens the chosen workers were predicted to hold (captured reuse).
    #[must_use]
    pub fn captured_tokens(&self) -> u64 {
        self.sum(|w| w.captured_tokens)
    }

    /// Prompt tokens the best holders held (available reuse: what a router sending every
    /// request to its best holder would have captured).
    #[must_use]
    pub fn available_tokens(&self) -> u64 {
        self.sum(|w| w.available_tokens)
    }

    /// Prompt tokens to prefill: routed less captured (the uncached prefill demand).
    #[must_use]
    pub fn uncached_tokens(&self) -> u64 {
        self.prompt_tokens().saturating_sub(self.captured_tokens())
    }

    /// Captured over routed prompt tokens (0 before any).
    #[must_use]
    pub fn predicted_hit_ratio(&self) -> f64 {
        ratio(self.captured_tokens(), self.prompt_tokens())
    }

    /// Cached tokens the engines reported over what the mirror predicted for the same
    /// prompts (1 when the mirror is exact; `None` before any report).
    #[must_use]
    pub fn delivered_over_predicted(&self) -> Option<f64> {
        let predicted = self.sum(|w| w.predicted_for_reports_tokens);
        (predicted > 0).then(|| ratio(self.sum(|w| w.reported_cached_tokens), predicted))
    }

    /// Requests refused by admission.
    #[must_use]
    pub fn shed(&self) -> u64 {
        self.shed_by_limit.iter().sum()
    }

    /// Rates over the router's clock from `earlier` to this snapshot; `None` when the clock
    /// did not move forward.
    #[must_use]
    pub fn rates_since(&self, earlier: &FleetSignals) -> Option<FleetRates> {
        let secs = self.at.checked_sub(earlier.at)?.as_secs_f64();
        if secs <= 0.0 {
            return None;
        }
        let per_s = |now: u64, then: u64| now.saturating_sub(then) as f64 / secs;
        let prompt = self.prompt_tokens().saturating_sub(earlier.prompt_tokens());
        let captured = self
            .captured_tokens()
            .saturating_sub(earlier.captured_tokens());
        Some(FleetRates {
            seconds: secs,
            requests_per_s: per_s(self.routed(), earlier.routed()),
            uncached_tokens_per_s: per_s(self.uncached_tokens(), earlier.uncached_tokens()),
            predicted_hit_ratio: ratio(captured, prompt),
            shed_per_s: std::array::from_fn(|i| {
                per_s(self.shed_by_limit[i], earlier.shed_by_limit[i])
            }),
        })
    }
}

/// Rates between two [`FleetSignals`] ([`FleetSignals::rates_since`]).
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct FleetRates {
    /// Seconds of the router's clock between the two snapshots.
    pub seconds: f64,
    /// Requests routed per second.
    pub requests_per_s: f64,
    /// Uncached prompt tokens routed per second: the prefill demand.
    pub uncached_tokens_per_s: f64,
    /// Captured over routed prompt tokens in the window.
    pub predicted_hit_ratio: f64,
    /// Requests refused per second, by [`LIMITS`].
    pub shed_per_s: [f64; 5],
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}
