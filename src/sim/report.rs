//! What a run measured, and the report made of it.

use super::references::References;

/// One policy's results on one workload.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct SimReport {
    /// The router's name.
    pub policy: String,
    /// Requests served.
    pub requests: usize,
    /// Prompt tokens of all requests.
    pub prompt_tokens: u64,
    /// Prompt tokens computed (prefilled).
    pub prefill_tokens: u64,
    /// Prompt tokens found cached.
    pub cached_tokens: u64,
    /// `cached_tokens / prompt_tokens`.
    pub hit_ratio: f64,
    /// The hit ratio of one infinite cache shared by all workers: the trace's limit.
    pub ideal_hit_ratio: f64,
    /// The hit ratio of one LRU cache of the whole fleet's capacity (workers × capacity).
    pub pooled_ideal_hit_ratio: f64,
    /// `hit_ratio / ideal_hit_ratio`.
    pub ratio_to_ideal: f64,
    /// Prompt tokens computed by each worker.
    pub worker_prefill_tokens: Vec<u64>,
    /// Max over mean of `worker_prefill_tokens` (1.0 is perfect balance).
    pub imbalance: f64,
    /// Time to first token, median, seconds (queueing plus prefill).
    pub ttft_p50_s: f64,
    /// Time to first token, 90th percentile.
    pub ttft_p90_s: f64,
    /// Time to first token, 99th percentile.
    pub ttft_p99_s: f64,
    /// Time per output token after the first (`(end to end − TTFT) / (output − 1)`, over
    /// requests of more than one output token), median, seconds.
    pub tpot_p50_s: f64,
    /// Time per output token, 90th percentile.
    pub tpot_p90_s: f64,
    /// Time per output token, 99th percentile.
    pub tpot_p99_s: f64,
    /// End-to-end latency (arrival to last token), median, seconds.
    pub e2e_p50_s: f64,
    /// End-to-end latency, 90th percentile.
    pub e2e_p90_s: f64,
    /// End-to-end latency, 99th percentile.
    pub e2e_p99_s: f64,
    /// The fraction of requests that finished meeting both the TTFT and the TPOT target
    /// ([`ClusterConfig::ttft_target_s`](super::ClusterConfig::ttft_target_s),
    /// [`tpot_target_s`](super::ClusterConfig::tpot_target_s)).
    pub goodput: f64,
    /// Preemptions (a running request's blocks taken back to make room); 0 with
    /// [`Engine::Simple`](super::Engine::Simple).
    pub preemptions: u64,
    /// Requests dropped because they can never fit a worker's KV cache.
    pub rejected: usize,
    /// Each worker's busy time over the makespan.
    pub worker_utilisation: Vec<f64>,
    /// Time from the first arrival to the last completion.
    pub makespan_s: f64,
    /// Requests per second over the makespan.
    pub throughput_rps: f64,
    /// Mean wall-clock time of one `route()` call, nanoseconds (0 when not measured).
    pub decision_ns: f64,
}

impl SimReport {
    /// The report as one JSON object.
    #[must_use]
    pub fn to_json(&self) -> String {
        format!(
            concat!(
                "{{\"policy\":\"{}\",\"requests\":{},\"prompt_tokens\":{},\"prefill_tokens\":{},",
                "\"cached_tokens\":{},\"hit_ratio\":{:.6},\"ideal_hit_ratio\":{:.6},",
                "\"pooled_ideal_hit_ratio\":{:.6},\"ratio_to_ideal\":{:.6},\"imbalance\":{:.6},",
                "\"ttft_p50_s\":{:.6},\"ttft_p90_s\":{:.6},\"ttft_p99_s\":{:.6},",
                "\"tpot_p50_s\":{:.6},\"tpot_p90_s\":{:.6},\"tpot_p99_s\":{:.6},",
                "\"e2e_p50_s\":{:.6},\"e2e_p90_s\":{:.6},\"e2e_p99_s\":{:.6},",
                "\"goodput\":{:.6},\"preemptions\":{},\"rejected\":{},",
                "\"makespan_s\":{:.6},\"throughput_rps\":{:.6},\"decision_ns\":{:.1},",
                "\"worker_prefill_tokens\":[{}]}}"
            ),
            self.policy.replace(['"', '\\'], ""),
            self.requests,
            self.prompt_tokens,
            self.prefill_tokens,
            self.cached_tokens,
            self.hit_ratio,
            self.ideal_hit_ratio,
            self.pooled_ideal_hit_ratio,
            self.ratio_to_ideal,
            self.imbalance,
            self.ttft_p50_s,
            self.ttft_p90_s,
            self.ttft_p99_s,
            self.tpot_p50_s,
            self.tpot_p90_s,
            self.tpot_p99_s,
            self.e2e_p50_s,
            self.e2e_p90_s,
            self.e2e_p99_s,
            self.goodput,
            self.preemptions,
            self.rejected,
            self.makespan_s,
            self.throughput_rps,
            self.decision_ns,
            self.worker_prefill_tokens
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(",")
        )
    }
}

/// What a run counts as it goes; [`Tally::report`] turns it into a [`SimReport`].
#[derive(Debug, Default)]
pub(super) struct Tally {
    /// Time to first token of every request.
    pub(super) ttft: Vec<f64>,
    /// Time per output token of every finished request of more than one output token.
    pub(super) tpot: Vec<f64>,
    /// End-to-end latency of every finished request.
    pub(super) e2e: Vec<f64>,
    /// Finished requests that met both goodput targets.
    pub(super) good: usize,
    pub(super) preemptions: u64,
    pub(super) rejected: usize,
    pub(super) cached_tokens: u64,
    pub(super) prompt_tokens: u64,
    /// Wall-clock time spent in `route()`.
    pub(super) decision_ns: u128,
    /// The last completion's time.
    pub(super) last_completion: f64,
}

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

impl Tally {
    /// Counts a finished request of `output` tokens: `ttft` and `e2e` seconds after its
    /// arrival, against `targets` (TTFT, TPOT).
    pub(super) fn finished(&mut self, ttft: f64, e2e: f64, output: u32, targets: (f64, f64)) {
        self.e2e.push(e2e);
        let tpot = (output > 1).then(|| (e2e - ttft) / f64::from(output - 1));
        if let Some(tpot) = tpot {
            self.tpot.push(tpot);
        }
        if ttft <= targets.0 && tpot.is_none_or(|t| t <= targets.1) {
            self.good += 1;
        }
    }

    /// The report of a run of `requests` requests by `policy`, the first arriving at `first`,
    /// each worker having computed `worker_prefill_tokens`.
    pub(super) fn report(
        mut self,
        policy: &str,
        requests: usize,
        first: f64,
        worker_prefill_tokens: Vec<u64>,
        worker_busy_s: &[f64],
        references: &References,
    ) -> SimReport {
        let makespan = (self.last_completion - first).max(0.0);
        for v in [&mut self.ttft, &mut self.tpot, &mut self.e2e] {
            v.sort_by(f64::total_cmp);
        }
        let computed: u64 = worker_prefill_tokens.iter().sum();
        let mean = computed as f64 / worker_prefill_tokens.len().max(1) as f64;
        let max = worker_prefill_tokens.iter().copied().max().unwrap_or(0) as f64;
        let hit_ratio = ratio(self.cached_tokens as f64, self.prompt_tokens as f64);
        SimReport {
            policy: policy.to_owned(),
            requests,
            prompt_tokens: self.prompt_tokens,
            prefill_tokens: computed,
            cached_tokens: self.cached_tokens,
            hit_ratio,
            ideal_hit_ratio: references.ideal,
            pooled_ideal_hit_ratio: references.pooled,
            ratio_to_ideal: ratio(hit_ratio, references.ideal),
            worker_prefill_tokens,
            imbalance: if mean > 0.0 { max / mean } else { 1.0 },
            ttft_p50_s: quantile(&self.ttft, 0.50),
            ttft_p90_s: quantile(&self.ttft, 0.90),
            ttft_p99_s: quantile(&self.ttft, 0.99),
            tpot_p50_s: quantile(&self.tpot, 0.50),
            tpot_p90_s: quantile(&self.tpot, 0.90),
            tpot_p99_s: quantile(&self.tpot, 0.99),
            e2e_p50_s: quantile(&self.e2e, 0.50),
            e2e_p90_s: quantile(&self.e2e, 0.90),
            e2e_p99_s: quantile(&self.e2e, 0.99),
            goodput: ratio(self.good as f64, requests as f64),
            preemptions: self.preemptions,
            rejected: self.rejected,
            worker_utilisation: worker_busy_s.iter().map(|&b| ratio(b, makespan)).collect(),
            makespan_s: makespan,
            throughput_rps: ratio(requests as f64, makespan),
            decision_ns: ratio(self.decision_ns as f64, requests as f64),
        }
    }
}
