//! What a run measured: the report of one policy, and the record of each request.

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
    /// `cached_tokens / prompt_tokens`: hits at every tier.
    pub hit_ratio: f64,
    /// Prompt tokens loaded back from the host tier over prompt tokens (a part of
    /// `hit_ratio`; 0 without a host tier,
    /// [`BatchConfig::host_capacity_tokens`](super::BatchConfig::host_capacity_tokens)).
    pub host_hit_ratio: f64,
    /// The hit ratio of one infinite cache shared by all workers: the trace's limit.
    pub ideal_hit_ratio: f64,
    /// The hit ratio of one LRU cache of the whole fleet's capacity (every worker's KV and
    /// host tier).
    pub pooled_ideal_hit_ratio: f64,
    /// `hit_ratio / ideal_hit_ratio`.
    pub ratio_to_ideal: f64,
    /// Prompt tokens computed by each worker.
    pub worker_prefill_tokens: Vec<u64>,
    /// Max over mean of `worker_prefill_tokens` (1.0 is perfect balance).
    pub imbalance: f64,
    /// Time to first token, median, seconds (queueing plus prefill), of the standard and
    /// sheddable requests (critical ones: [`critical_ttft_p99_s`](Self::critical_ttft_p99_s)).
    pub ttft_p50_s: f64,
    /// Time to first token, 90th percentile.
    pub ttft_p90_s: f64,
    /// Time to first token, 99th percentile.
    pub ttft_p99_s: f64,
    /// Time per output token after the first (`(end to end − TTFT) / (output − 1)`), median,
    /// seconds, over the answers of at least
    /// [`LONG_ANSWER_TOKENS`](super::LONG_ANSWER_TOKENS) tokens (shorter ones:
    /// [`short_tpot_p99_s`](Self::short_tpot_p99_s)). Like every latency percentile here but
    /// the `critical_` ones, it counts standard and sheddable requests: critical ones, which
    /// admission never sheds, are reported apart.
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
    /// Time per output token, 99th percentile, of the answers of two to
    /// [`LONG_ANSWER_TOKENS`](super::LONG_ANSWER_TOKENS)` − 1` tokens (0 when none): a
    /// gap or two between tokens, which may each hold a long prompt's prefill chunk.
    pub short_tpot_p99_s: f64,
    /// End-to-end latency, 99th percentile, of those answers and the one-token ones.
    pub short_e2e_p99_s: f64,
    /// Critical requests served (finished; [`Priority::Critical`](crate::Priority)).
    pub critical_requests: usize,
    /// Their time to first token, 99th percentile (0 when none).
    pub critical_ttft_p99_s: f64,
    /// Their time per output token, 99th percentile, over answers of at least
    /// [`LONG_ANSWER_TOKENS`](super::LONG_ANSWER_TOKENS) tokens (0 when none).
    pub critical_tpot_p99_s: f64,
    /// The fraction of requests that finished meeting both the TTFT and the TPOT target
    /// ([`ClusterConfig::ttft_target_s`](super::ClusterConfig::ttft_target_s),
    /// [`tpot_target_s`](super::ClusterConfig::tpot_target_s)).
    pub goodput: f64,
    /// Requests per second that met both targets, over the makespan.
    pub goodput_rps: f64,
    /// Requests refused by admission
    /// ([`ClusterConfig::admission`](super::ClusterConfig::admission)).
    pub shed: usize,
    /// Of those, by priority, in the order of [`Priority::ALL`](crate::Priority::ALL)
    /// (sheddable, standard, critical).
    pub shed_by_priority: [usize; 3],
    /// Of them, those refused by each gate, in [`GATES`](crate::GATES)' order (model,
    /// prompt, prefill window, decode bound).
    pub shed_by_gate: [usize; 4],
    /// Preemptions (a running request's blocks taken back to make room); 0 with
    /// [`Engine::Simple`](super::Engine::Simple).
    pub preemptions: u64,
    /// Requests dropped because they can never fit a worker's KV cache.
    pub rejected: usize,
    /// Requests routed again because their worker left
    /// ([`Simulation::with_faults`](super::Simulation::with_faults)).
    pub retried: usize,
    /// Batches of engine events lost, counted once per router replica that missed one
    /// ([`ClusterConfig::event_loss`](super::ClusterConfig::event_loss)).
    pub lost_event_batches: u64,
    /// Replica sync frames the replicas sent ([`ClusterConfig::replica_sync`](super::ClusterConfig::replica_sync)),
    /// each once to the bus.
    pub replica_sync_frames: u64,
    /// Their bytes: over [`requests`](Self::requests), sync's cost on the wire per request.
    pub replica_sync_bytes: u64,
    /// Frames lost on the way to a replica, counted once per replica that missed one.
    pub lost_sync_frames: u64,
    /// Each worker's busy time over the makespan.
    pub worker_utilisation: Vec<f64>,
    /// What happened to each request, in trace order.
    pub request_records: Vec<RequestRecord>,
    /// Time from the first arrival to the last completion.
    pub makespan_s: f64,
    /// Requests per second over the makespan.
    pub throughput_rps: f64,
    /// Mean wall-clock time of one `route()` call, nanoseconds (0 when not measured).
    pub decision_ns: f64,
    /// Requests prefilled on one worker and decoded on another, their KV moved between
    /// them ([`Simulation::run_pd`](super::Simulation::run_pd); 0 otherwise).
    pub transfers: usize,
    /// Bytes of KV those transfers moved.
    pub transfer_bytes: u64,
    /// The name of the decider of a disaggregated run
    /// ([`Decide::name`](crate::Decide::name)); `None` for a run through a plain router.
    pub pd_decider: Option<String>,
    /// How wrong the router's predictions of time to first token were: the median of
    /// `|predicted − measured| / measured` over the requests that had a first token and a
    /// prediction, after the first [`PREDICTION_WARMUP`](super::PREDICTION_WARMUP) (while the
    /// router learns the fleet). 0 when none.
    pub ttft_error_p50: f64,
    /// The same error's 90th percentile.
    pub ttft_error_p90: f64,
    /// Sessions whose every request finished (a sub-agent's requests count with the
    /// session that started it, [`Request::follows`](super::Request::follows)).
    pub sessions: usize,
    /// Session completion time, from its first arrival to its last token, median over
    /// those sessions, seconds (0 when none): what an agent's user waits for.
    pub session_p50_s: f64,
    /// Session completion time, 99th percentile.
    pub session_p99_s: f64,
    /// How steady goodput was: over the 10-second windows of the arrivals' span, the lowest
    /// window's goodput per second (requests arriving in it that met both targets) over the
    /// mean of the windows'. 1 for steady goodput, 0 for a window where none was met; 1 when
    /// the arrivals span less than two windows.
    pub goodput_min_10s_ratio: f64,
}

impl SimReport {
    /// `hit_ratio / pooled_ideal_hit_ratio`: how much of what one cache of the whole fleet's
    /// capacity would hit the policy hits (0 when the reference is 0).
    #[must_use]
    pub fn ratio_to_pooled(&self) -> f64 {
        if self.pooled_ideal_hit_ratio > 0.0 {
            self.hit_ratio / self.pooled_ideal_hit_ratio
        } else {
            0.0
        }
    }

    /// The requests shed as JSON fields: in all, by priority and by gate.
    fn sheds_json(&self) -> String {
        let by_priority = crate::request::Priority::ALL
            .iter()
            .zip(self.shed_by_priority)
            .map(|(p, n)| format!("\"shed_{}\":{n}", p.name()));
        let by_gate = crate::request::GATES
            .iter()
            .zip(self.shed_by_gate)
            .map(|(g, n)| format!("\"shed_{}\":{n}", g.name()));
        std::iter::once(format!("\"shed\":{}", self.shed))
            .chain(by_priority)
            .chain(by_gate)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The report as one JSON object.
    #[must_use]
    pub fn to_json(&self) -> String {
        format!(
            concat!(
                "{{\"policy\":\"{}\",\"requests\":{},\"prompt_tokens\":{},\"prefill_tokens\":{},",
                "\"cached_tokens\":{},\"hit_ratio\":{:.6},\"host_hit_ratio\":{:.6},",
                "\"ideal_hit_ratio\":{:.6},",
                "\"pooled_ideal_hit_ratio\":{:.6},\"ratio_to_ideal\":{:.6},\"imbalance\":{:.6},",
                "\"ttft_p50_s\":{:.6},\"ttft_p90_s\":{:.6},\"ttft_p99_s\":{:.6},",
                "\"tpot_p50_s\":{:.6},\"tpot_p90_s\":{:.6},\"tpot_p99_s\":{:.6},",
                "\"e2e_p50_s\":{:.6},\"e2e_p90_s\":{:.6},\"e2e_p99_s\":{:.6},",
                "\"short_tpot_p99_s\":{:.6},\"short_e2e_p99_s\":{:.6},",
                "\"critical_requests\":{},\"critical_ttft_p99_s\":{:.6},\"critical_tpot_p99_s\":{:.6},",
                "\"goodput\":{:.6},\"goodput_rps\":{:.6},{},",
                "\"preemptions\":{},\"rejected\":{},\"retried\":{},",
                "\"lost_event_batches\":{},",
                "\"replica_sync_frames\":{},\"replica_sync_bytes\":{},\"lost_sync_frames\":{},",
                "\"makespan_s\":{:.6},\"throughput_rps\":{:.6},\"decision_ns\":{:.1},",
                "\"transfers\":{},\"transfer_bytes\":{},\"pd_decider\":{},",
                "\"ttft_error_p50\":{:.6},\"ttft_error_p90\":{:.6},",
                "\"sessions\":{},\"session_p50_s\":{:.6},\"session_p99_s\":{:.6},",
                "\"goodput_min_10s_ratio\":{:.6},",
                "\"worker_prefill_tokens\":[{}]}}"
            ),
            self.policy.replace(['"', '\\'], ""),
            self.requests,
            self.prompt_tokens,
            self.prefill_tokens,
            self.cached_tokens,
            self.hit_ratio,
            self.host_hit_ratio,
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
            self.short_tpot_p99_s,
            self.short_e2e_p99_s,
            self.critical_requests,
            self.critical_ttft_p99_s,
            self.critical_tpot_p99_s,
            self.goodput,
            self.goodput_rps,
            self.sheds_json(),
            self.preemptions,
            self.rejected,
            self.retried,
            self.lost_event_batches,
            self.replica_sync_frames,
            self.replica_sync_bytes,
            self.lost_sync_frames,
            self.makespan_s,
            self.throughput_rps,
            self.decision_ns,
            self.transfers,
            self.transfer_bytes,
            self.pd_decider.as_ref().map_or_else(
                || "null".to_owned(),
                |d| format!("\"{}\"", d.replace(['"', '\\'], ""))
            ),
            self.ttft_error_p50,
            self.ttft_error_p90,
            self.sessions,
            self.session_p50_s,
            self.session_p99_s,
            self.goodput_min_10s_ratio,
            self.worker_prefill_tokens
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(",")
        )
    }
}

/// What happened to one request of a run (all times in seconds from the start of the
/// trace, after [`ClusterConfig::speedup`](super::ClusterConfig::speedup)).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct RequestRecord {
    /// The request's index in the trace.
    pub index: usize,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// The worker it was routed to.
    pub worker: u32,
    /// The router replica that routed it (0 with one router).
    pub replica: u32,
    /// When it arrived.
    pub arrival_s: f64,
    /// When its worker first gave it KV blocks (the simple engine: when its prefill
    /// started); `None` if it never was.
    pub admitted_s: Option<f64>,
    /// Prompt tokens found cached at that first admission, at every tier (for a request
    /// prefilled on another worker than the one that decodes it: those its prefill worker
    /// found).
    pub cached_tokens: usize,
    /// Of those, the tokens loaded back from the host tier.
    pub host_cached_tokens: usize,
    /// Time to first token, from arrival.
    pub ttft_s: Option<f64>,
    /// Time per output token after the first, for more than one output token.
    pub tpot_s: Option<f64>,
    /// Output tokens it generated (0 until it finished).
    pub output_tokens: u32,
    /// Arrival to last token.
    pub e2e_s: Option<f64>,
    /// Times preempted.
    pub preemptions: u32,
    /// Times routed again because its worker left.
    pub retries: u32,
    /// Dropped: it can never fit its worker's KV cache.
    pub rejected: bool,
    /// Its priority under admission.
    pub priority: crate::request::Priority,
    /// Refused by admission: never run.
    pub shed: bool,
    /// The gate that refused it, when it was shed.
    pub shed_gate: Option<crate::request::Gate>,
    /// The worker that prefilled it, when that is not [`worker`](Self::worker), which
    /// decoded it ([`Simulation::run_pd`](super::Simulation::run_pd)).
    pub prefill_worker: Option<u32>,
    /// Bytes of KV moved from its prefill worker to its decode worker (0 when not split).
    pub transfer_bytes: u64,
    /// The time to first token the router predicted when it routed the request (the
    /// chosen worker's, or the chosen plan's), seconds; `None` for a request shed, or a
    /// router without a load model.
    pub predicted_ttft_s: Option<f64>,
    /// The time per output token it predicted likewise.
    pub predicted_tpot_s: Option<f64>,
}

impl RequestRecord {
    /// The record as one JSON object (`null` for what did not happen).
    #[must_use]
    pub fn to_json(&self) -> String {
        let opt = |v: Option<f64>| v.map_or_else(|| "null".to_owned(), |v| format!("{v:.6}"));
        format!(
            concat!(
                "{{\"index\":{},\"prompt_tokens\":{},\"worker\":{},\"replica\":{},",
                "\"arrival_s\":{:.6},\"admitted_s\":{},\"cached_tokens\":{},\"host_cached_tokens\":{},",
                "\"ttft_s\":{},",
                "\"tpot_s\":{},\"output_tokens\":{},\"e2e_s\":{},\"preemptions\":{},\"retries\":{},\"rejected\":{},",
                "\"priority\":\"{}\",\"shed\":{},\"shed_gate\":{},\"prefill_worker\":{},\"transfer_bytes\":{},",
                "\"predicted_ttft_s\":{},\"predicted_tpot_s\":{}}}"
            ),
            self.index,
            self.prompt_tokens,
            self.worker,
            self.replica,
            self.arrival_s,
            opt(self.admitted_s),
            self.cached_tokens,
            self.host_cached_tokens,
            opt(self.ttft_s),
            opt(self.tpot_s),
            self.output_tokens,
            opt(self.e2e_s),
            self.preemptions,
            self.retries,
            self.rejected,
            self.priority.name(),
            self.shed,
            self.shed_gate
                .map_or_else(|| "null".to_owned(), |g| format!("\"{}\"", g.name())),
            self.prefill_worker
                .map_or_else(|| "null".to_owned(), |w| w.to_string()),
            self.transfer_bytes,
            opt(self.predicted_ttft_s),
            opt(self.predicted_tpot_s)
        )
    }
}
