//! What a run counts as it goes: a [`RequestRecord`] per request and a few totals, turned
//! into a [`SimReport`] at the end.

use super::references::References;
use super::report::{RequestRecord, SimReport};
use crate::request::{GATES, Gate};

/// A run's records and totals.
#[derive(Debug)]
pub(super) struct Tally {
    records: Vec<RequestRecord>,
    /// Goodput's targets: time to first token, time per output token.
    targets: (f64, f64),
    /// Whether each request was routed once already.
    routed: Vec<bool>,
    /// Batches of engine events lost on their way to a replica.
    pub(super) lost_event_batches: u64,
    /// Replica sync: frames sent, their bytes, frames lost on the way to a replica.
    pub(super) replica_sync: (u64, u64, u64),
    /// Wall-clock time spent in `route()` for the measured requests.
    decision_ns: u128,
    /// The last completion's time.
    last_completion: f64,
    /// The decider of a disaggregated run.
    pub(super) pd_decider: Option<String>,
    /// Each request's session group (sub-agents count with the session that started them).
    groups: Vec<Option<u32>>,
    /// Requests before this index are a warm-up's: left out of the report.
    measured_from: usize,
}

/// The window of [`SimReport::goodput_min_10s_ratio`], seconds.
const GOODPUT_WINDOW_S: f64 = 10.0;

/// The `p` quantile (nearest rank) of sorted `values`; 0 for none.
fn quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// `part / whole`, 0 when `whole` is 0.
fn ratio(part: f64, whole: f64) -> f64 {
    if whole > 0.0 { part / whole } else { 0.0 }
}

/// The median, 90th and 99th percentiles of `values`.
fn percentiles(mut values: Vec<f64>) -> [f64; 3] {
    values.sort_by(f64::total_cmp);
    [0.50, 0.90, 0.99].map(|p| quantile(&values, p))
}

/// The fewest output tokens of an answer whose time per output token the TPOT percentiles
/// count. A shorter answer has a few gaps between tokens, one or two engine steps, one of
/// which may carry a long prompt's prefill chunk routed after it: no policy foresees it, so
/// its TPOT measures the engine's chunking rather than the routing. Short answers' TPOT and
/// end-to-end p99 are reported beside ([`SimReport::short_tpot_p99_s`]).
pub const LONG_ANSWER_TOKENS: u32 = 16;

/// A run's latency percentiles, by which requests each counts.
struct Tails {
    /// TTFT p50, p90, p99 of the standard and sheddable requests.
    ttft: [f64; 3],
    /// TPOT p50, p90, p99 of their answers of [`LONG_ANSWER_TOKENS`] or more.
    tpot: [f64; 3],
    /// End-to-end p50, p90, p99 of the standard and sheddable requests.
    e2e: [f64; 3],
    /// TPOT p99 and end-to-end p99 of their shorter answers (of two tokens or more).
    short: (f64, f64),
    /// The critical requests served, their TTFT p99 and TPOT p99 (answers of
    /// [`LONG_ANSWER_TOKENS`] or more).
    critical: (usize, f64, f64),
}

impl Tails {
    fn of(records: &[RequestRecord]) -> Self {
        let critical = |r: &&RequestRecord| r.priority == crate::request::Priority::Critical;
        let long = |r: &&RequestRecord| r.output_tokens >= LONG_ANSWER_TOKENS;
        let (apart, bars): (Vec<&RequestRecord>, Vec<&RequestRecord>) =
            records.iter().partition(critical);
        let p = |rs: &[&RequestRecord], f: fn(&RequestRecord) -> Option<f64>| {
            percentiles(rs.iter().filter_map(|r| f(r)).collect())
        };
        let long_bars: Vec<&RequestRecord> = bars.iter().copied().filter(long).collect();
        let short_bars: Vec<&RequestRecord> = bars.iter().copied().filter(|r| !long(r)).collect();
        let long_apart: Vec<&RequestRecord> = apart.iter().copied().filter(long).collect();
        Tails {
            ttft: p(&bars, |r| r.ttft_s),
            tpot: p(&long_bars, |r| r.tpot_s),
            e2e: p(&bars, |r| r.e2e_s),
            short: (
                p(&short_bars, |r| r.tpot_s)[2],
                p(&short_bars, |r| r.e2e_s)[2],
            ),
            critical: (
                apart.iter().filter(|r| r.e2e_s.is_some()).count(),
                p(&apart, |r| r.ttft_s)[2],
                p(&long_apart, |r| r.tpot_s)[2],
            ),
        }
    }
}

/// Requests a run's prediction errors leave out, from its first arrival: the router learns
/// the fleet from the timings of the first ones.
pub const PREDICTION_WARMUP: usize = 200;

/// The median and 90th percentile of `|predicted − measured| / measured` time to first token
/// over the records, in trace order, after the first [`PREDICTION_WARMUP`] (0 when none).
fn prediction_errors(records: &[RequestRecord]) -> [f64; 2] {
    let mut errors: Vec<f64> = records
        .iter()
        .skip(PREDICTION_WARMUP)
        .filter_map(|r| match (r.predicted_ttft_s, r.ttft_s) {
            (Some(p), Some(m)) if m > 0.0 => Some((p - m).abs() / m),
            _ => None,
        })
        .collect();
    errors.sort_by(f64::total_cmp);
    [0.50, 0.90].map(|p| quantile(&errors, p))
}

/// The median and 99th percentile of session completion times, first arrival to last
/// token, over the sessions whose every request finished, and how many those are.
fn session_times(records: &[RequestRecord], groups: &[Option<u32>]) -> (usize, [f64; 2]) {
    let count = groups.iter().flatten().max().map_or(0, |&g| g as usize + 1);
    let mut spans = vec![(f64::MAX, 0.0_f64, true); count];
    for (r, g) in records.iter().zip(groups) {
        let Some(g) = *g else { continue };
        let span = &mut spans[g as usize];
        span.0 = span.0.min(r.arrival_s);
        match r.e2e_s {
            Some(e2e) => span.1 = span.1.max(r.arrival_s + e2e),
            None => span.2 = false,
        }
    }
    let mut times: Vec<f64> = spans
        .iter()
        .filter(|s| s.0 < f64::MAX && s.2)
        .map(|s| s.1 - s.0)
        .collect();
    times.sort_by(f64::total_cmp);
    (times.len(), [0.50, 0.99].map(|p| quantile(&times, p)))
}

/// What a run measured beside the records: per worker, tokens computed and busy time.
pub(super) struct Workers {
    pub(super) prefill_tokens: Vec<u64>,
    pub(super) busy_s: Vec<f64>,
}

impl Tally {
    /// A tally of requests in session `groups` (one per request) against goodput's
    /// `targets` (TTFT, TPOT).
    pub(super) fn new(groups: Vec<Option<u32>>, targets: (f64, f64)) -> Self {
        let requests = groups.len();
        Self {
            records: (0..requests)
                .map(|index| RequestRecord {
                    index,
                    ..RequestRecord::default()
                })
                .collect(),
            targets,
            routed: vec![false; requests],
            lost_event_batches: 0,
            replica_sync: (0, 0, 0),
            decision_ns: 0,
            last_completion: 0.0,
            pd_decider: None,
            groups,
            measured_from: 0,
        }
    }

    /// The same tally with the requests before `index` a warm-up's, left out of the
    /// report.
    pub(super) fn measured_from(mut self, index: usize) -> Self {
        self.measured_from = index.min(self.records.len());
        self
    }

    /// Request `i` of `prompt_tokens` tokens was routed at `at` to `worker` by `replica`:
    /// its arrival, or a retry after its worker left.
    /// `predicted` is the router's (time to first token, time per output token) for it,
    /// zero when it predicts none.
    pub(super) fn routed(
        &mut self,
        i: usize,
        (at, prompt_tokens): (f64, usize),
        (worker, replica): (u32, usize),
        predicted: (f64, f64),
    ) {
        let r = &mut self.records[i];
        (r.worker, r.replica) = (worker, u32::try_from(replica).unwrap_or(u32::MAX));
        if std::mem::replace(&mut self.routed[i], true) {
            r.retries += 1;
        } else {
            (r.arrival_s, r.prompt_tokens) = (at, prompt_tokens);
            let some = |p: f64| (p > 0.0).then_some(p);
            (r.predicted_ttft_s, r.predicted_tpot_s) = (some(predicted.0), some(predicted.1));
        }
    }

    /// When request `i`'s first token came, if it has.
    pub(super) fn first_token_at(&self, i: usize) -> Option<f64> {
        let r = &self.records[i];
        r.ttft_s.map(|ttft| r.arrival_s + ttft)
    }

    /// Request `i` asks to be routed with `priority` (standard without admission).
    pub(super) fn asked(&mut self, i: usize, priority: crate::request::Priority) {
        self.records[i].priority = priority;
    }

    /// Request `i` was refused by admission at `at`.
    pub(super) fn shed(&mut self, i: usize, at: f64, prompt_tokens: usize, gate: Gate) {
        let r = &mut self.records[i];
        (r.arrival_s, r.prompt_tokens, r.shed) = (at, prompt_tokens, true);
        r.shed_gate = Some(gate);
    }

    /// Request `i` got KV blocks at `at`, finding `cached` prompt tokens cached, `host` of
    /// them on the host tier (its first admission only counts).
    pub(super) fn admitted(&mut self, i: usize, at: f64, cached: usize, host: usize) {
        let r = &mut self.records[i];
        if r.admitted_s.is_none() {
            (r.admitted_s, r.cached_tokens, r.host_cached_tokens) = (Some(at), cached, host);
        }
    }

    /// Request `i`'s first token came at `at` (a request routed again after a fault keeps
    /// the first it had).
    pub(super) fn first_token(&mut self, i: usize, at: f64) {
        let r = &mut self.records[i];
        r.ttft_s.get_or_insert(at - r.arrival_s);
    }

    /// Request `i` finished its `output` tokens at `at`.
    pub(super) fn finished(&mut self, i: usize, at: f64, output: u32) {
        let r = &mut self.records[i];
        let e2e = at - r.arrival_s;
        r.e2e_s = Some(e2e);
        let ttft = *r.ttft_s.get_or_insert(e2e);
        r.tpot_s = (output > 1).then(|| (e2e - ttft) / f64::from(output - 1));
        r.output_tokens = output;
        if i >= self.measured_from {
            self.last_completion = self.last_completion.max(at);
        }
    }

    /// Request `i`'s prefill finished on `prefill_worker`, and `bytes` of its KV began to
    /// move to the worker that decodes it.
    pub(super) fn transferred(&mut self, i: usize, prefill_worker: u32, bytes: u64) {
        let r = &mut self.records[i];
        (r.prefill_worker, r.transfer_bytes) = (Some(prefill_worker), bytes);
    }

    /// Request `i` was preempted.
    pub(super) fn preempted(&mut self, i: usize) {
        self.records[i].preemptions += 1;
    }

    /// Request `i` was dropped.
    pub(super) fn rejected(&mut self, i: usize) {
        self.records[i].rejected = true;
    }

    /// Leaves the warm-up's requests out: the records left are numbered from 0.
    fn drop_warmup(&mut self) {
        let k = self.measured_from;
        self.records.drain(..k);
        self.groups.drain(..k.min(self.groups.len()));
        for r in &mut self.records {
            r.index -= k;
        }
        self.measured_from = 0;
    }

    /// [`SimReport::goodput_min_10s_ratio`] of the records.
    fn goodput_floor(&self) -> f64 {
        let arrivals = self.records.iter().map(|r| r.arrival_s);
        let start = arrivals.clone().fold(f64::INFINITY, f64::min);
        let end = arrivals.fold(f64::NEG_INFINITY, f64::max);
        let windows = ((end - start) / GOODPUT_WINDOW_S).floor();
        if windows.is_nan() || windows < 2.0 {
            return 1.0;
        }
        let mut good = vec![0u32; windows as usize];
        for r in self.records.iter().filter(|r| self.good(r)) {
            let w = ((r.arrival_s - start) / GOODPUT_WINDOW_S) as usize;
            if let Some(g) = good.get_mut(w) {
                *g += 1;
            }
        }
        let mean = good.iter().map(|&g| f64::from(g)).sum::<f64>() / windows;
        let least = good.iter().copied().min().map_or(0.0, f64::from);
        if mean > 0.0 { least / mean } else { 1.0 }
    }

    /// The requests shed: all, by priority (in [`Priority::ALL`](crate::request::Priority::ALL)'s
    /// order) and by gate (in [`GATES`]' order).
    fn sheds(&self) -> (usize, [usize; 3], [usize; 4]) {
        let shed = self.records.iter().filter(|r| r.shed);
        (
            shed.clone().count(),
            crate::request::Priority::ALL.map(|p| shed.clone().filter(|r| r.priority == p).count()),
            GATES.map(|g| shed.clone().filter(|r| r.shed_gate == Some(g)).count()),
        )
    }

    /// Routing request `i` took `ns` of wall-clock time (a warm-up's is not counted).
    pub(super) fn timed(&mut self, i: usize, ns: u128) {
        if i >= self.measured_from {
            self.decision_ns += ns;
        }
    }

    /// Whether request `i` met both goodput targets.
    fn good(&self, r: &RequestRecord) -> bool {
        r.e2e_s.is_some()
            && r.ttft_s.is_some_and(|t| t <= self.targets.0)
            && r.tpot_s.is_none_or(|t| t <= self.targets.1)
    }

    /// The prompt tokens of the requests served (neither rejected nor shed), of them those
    /// cached on the device, and those cached on the host tier.
    fn served_tokens(&self) -> (u64, u64, u64) {
        let served = || self.records.iter().filter(|r| !r.rejected && !r.shed);
        (
            served().map(|r| r.prompt_tokens as u64).sum(),
            served().map(|r| r.cached_tokens as u64).sum(),
            served().map(|r| r.host_cached_tokens as u64).sum(),
        )
    }

    /// How many records `is` holds for.
    fn count(&self, is: impl Fn(&RequestRecord) -> bool) -> usize {
        self.records.iter().filter(|r| is(r)).count()
    }

    /// The report of a run by `policy`, the first request arriving at `first`.
    pub(super) fn report(
        mut self,
        policy: &str,
        first: f64,
        workers: Workers,
        references: &References,
    ) -> SimReport {
        self.drop_warmup();
        let floor = self.goodput_floor();
        let (shed, shed_by_priority, shed_by_gate) = self.sheds();
        let requests = self.records.len();
        let makespan = (self.last_completion - first).max(0.0);
        let (prompt_tokens, cached_tokens, host_tokens) = self.served_tokens();
        let tails = Tails::of(&self.records);
        let errors = prediction_errors(&self.records);
        let (sessions, session) = session_times(&self.records, &self.groups);
        let good = self.records.iter().filter(|r| self.good(r)).count();
        let computed: u64 = workers.prefill_tokens.iter().sum();
        let hit_ratio = ratio(cached_tokens as f64, prompt_tokens as f64);
        SimReport {
            policy: policy.to_owned(),
            requests,
            prompt_tokens,
            prefill_tokens: computed,
            cached_tokens,
            hit_ratio,
            host_hit_ratio: ratio(host_tokens as f64, prompt_tokens as f64),
            ideal_hit_ratio: references.ideal,
            pooled_ideal_hit_ratio: references.pooled,
            ratio_to_ideal: ratio(hit_ratio, references.ideal),
            imbalance: imbalance(&workers.prefill_tokens),
            worker_prefill_tokens: workers.prefill_tokens,
            ttft_p50_s: tails.ttft[0],
            ttft_p90_s: tails.ttft[1],
            ttft_p99_s: tails.ttft[2],
            tpot_p50_s: tails.tpot[0],
            tpot_p90_s: tails.tpot[1],
            tpot_p99_s: tails.tpot[2],
            e2e_p50_s: tails.e2e[0],
            e2e_p90_s: tails.e2e[1],
            e2e_p99_s: tails.e2e[2],
            short_tpot_p99_s: tails.short.0,
            short_e2e_p99_s: tails.short.1,
            critical_requests: tails.critical.0,
            critical_ttft_p99_s: tails.critical.1,
            critical_tpot_p99_s: tails.critical.2,
            goodput: ratio(good as f64, requests as f64),
            goodput_rps: ratio(good as f64, makespan),
            shed,
            shed_by_priority,
            shed_by_gate,
            preemptions: self.records.iter().map(|r| u64::from(r.preemptions)).sum(),
            rejected: self.count(|r| r.rejected),
            retried: self.count(|r| r.retries > 0),
            lost_event_batches: self.lost_event_batches,
            replica_sync_frames: self.replica_sync.0,
            replica_sync_bytes: self.replica_sync.1,
            lost_sync_frames: self.replica_sync.2,
            worker_utilisation: workers.busy_s.iter().map(|&b| ratio(b, makespan)).collect(),
            makespan_s: makespan,
            throughput_rps: ratio(requests as f64, makespan),
            decision_ns: ratio(self.decision_ns as f64, requests as f64),
            transfers: self.count(|r| r.prefill_worker.is_some()),
            transfer_bytes: self.records.iter().map(|r| r.transfer_bytes).sum(),
            pd_decider: self.pd_decider,
            ttft_error_p50: errors[0],
            ttft_error_p90: errors[1],
            sessions,
            session_p50_s: session[0],
            session_p99_s: session[1],
            goodput_min_10s_ratio: floor,
            request_records: self.records,
        }
    }
}

/// The most prefill any worker computed over the mean (1 when none computed any).
fn imbalance(prefill_tokens: &[u64]) -> f64 {
    let computed: u64 = prefill_tokens.iter().sum();
    let mean = computed as f64 / prefill_tokens.len().max(1) as f64;
    let max = prefill_tokens.iter().copied().max().unwrap_or(0) as f64;
    if mean > 0.0 { max / mean } else { 1.0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Priority;

    fn record(
        priority: Priority,
        output_tokens: u32,
        (ttft, tpot, e2e): (f64, f64, f64),
    ) -> RequestRecord {
        RequestRecord {
            priority,
            output_tokens,
            ttft_s: Some(ttft),
            tpot_s: (output_tokens > 1).then_some(tpot),
            e2e_s: Some(e2e),
            ..RequestRecord::default()
        }
    }

    #[test]
    fn short_answers_and_critical_requests_are_reported_apart() {
        // A hundred standard answers of 32 tokens, TPOT 1 ms to 100 ms.
        let mut records: Vec<RequestRecord> = (1..=100)
            .map(|i| record(Priority::Standard, 32, (0.1, f64::from(i) * 1e-3, 1.0)))
            .collect();
        // A short answer whose one gap held a prefill chunk, and a one-token one.
        records.push(record(Priority::Sheddable, 4, (0.1, 1.0, 5.0)));
        records.push(record(Priority::Standard, 1, (0.1, 0.0, 0.2)));
        // A critical request, slow at both.
        records.push(record(Priority::Critical, 32, (9.0, 0.5, 30.0)));
        let t = Tails::of(&records);
        assert_eq!(t.tpot, [0.050, 0.090, 0.099]);
        assert_eq!(t.ttft[2], 0.1, "the critical request's 9 s is not in it");
        assert_eq!(t.short, (1.0, 5.0));
        assert_eq!(t.critical, (1, 9.0, 0.5));
        // Counted with the rest, the short answer and the critical request would be the tail.
        let all = percentiles(records.iter().filter_map(|r| r.tpot_s).collect());
        assert_eq!(all[2], 0.5);
    }
}
