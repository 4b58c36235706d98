//! The modelled cluster and the replay of a workload through a router.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use super::workload::Request;
use crate::router::check_range;
use crate::{
    BlockHash, CacheSync, Error, PrefixHasher, RadixTree, RouteDecision, RouteRequest, Router,
    TokenId, TreeConfig, WorkerId,
};

/// How the router's mirror is corrected during a simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SyncMode {
    /// Nothing: the router keeps its optimistic mirror, bounded by its own configuration
    /// (for example [`IndexConfig::worker_capacity_blocks`](crate::IndexConfig)). The
    /// default.
    #[default]
    None,
    /// Miss feedback: when a request's prefill starts, the worker reports how many prompt
    /// tokens it found cached ([`CacheSync::report_cached`]), which trims the mirror to
    /// that, including the optimistic insert of the request itself (the worker only caches
    /// the rest once it has computed it). On multi-turn traffic that costs the cache-aware
    /// policies hits: compare the two modes with `--sync`.
    Feedback,
}

/// The modelled fleet.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct ClusterConfig {
    /// Workers. Default 8.
    pub workers: u32,
    /// KV cache of each worker, in tokens (LRU over blocks). Default 1,000,000 (about what
    /// one GPU holds for a 70B model).
    pub capacity_tokens: usize,
    /// Tokens per KV block. Default 16.
    pub block_size: usize,
    /// Prefill throughput of one worker. Default 33,000 tokens/s (about 60 ms for 2,000
    /// tokens of a 70B model on one H100).
    pub prefill_tokens_per_s: f64,
    /// Decode time per output token (continuous batching: decodes do not hold up the prefill
    /// queue). Default 0.02 s.
    pub decode_s_per_token: f64,
    /// Arrival rates are multiplied by this (arrival times divided). Default 1.0.
    pub speedup: f64,
    /// Mirror correction. Default [`SyncMode::None`].
    pub sync: SyncMode,
    /// Whether to time the router's decisions with the wall clock (the only
    /// non-deterministic figure of a report). Default true.
    pub measure_decision_time: bool,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            workers: 8,
            capacity_tokens: 1_000_000,
            block_size: 16,
            prefill_tokens_per_s: 33_000.0,
            decode_s_per_token: 0.02,
            speedup: 1.0,
            sync: SyncMode::None,
            measure_decision_time: true,
        }
    }
}

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

/// A workload ready to replay through routers, with its reference hit ratios computed once.
///
/// ```
/// use prefix_router::sim::{ClusterConfig, Simulation, Workload};
/// use prefix_router::{CacheAwareRouter, RoundRobinRouter};
///
/// let requests = Workload::builtin()[0].1.generate(7);
/// let mut config = ClusterConfig::default();
/// config.workers = 4;
/// config.measure_decision_time = false;
/// let sim = Simulation::new(requests, config)?;
/// let rr = sim.run(&RoundRobinRouter::new(4)?)?;
/// let ca = sim.run(&CacheAwareRouter::new(4)?)?;
/// assert!(ca.hit_ratio > rr.hit_ratio);
/// # Ok::<(), prefix_router::Error>(())
/// ```
#[derive(Debug)]
pub struct Simulation {
    requests: Vec<Request>,
    config: ClusterConfig,
    hasher: PrefixHasher,
    ideal: f64,
    pooled: f64,
    ideal_blocks: Option<f64>,
}

const W0: WorkerId = WorkerId::new(0);

/// An unbounded tree (for the references).
fn unbounded() -> TreeConfig {
    TreeConfig {
        max_blocks: usize::MAX,
        max_nodes: usize::MAX,
        chained: true,
    }
}

impl Simulation {
    /// Prepares `requests` for replay on the modelled fleet.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a fleet of 0 workers, a capacity of less than one block,
    /// or a non-positive or NaN rate or speedup; [`Error::InvalidBlockSize`] for a bad block
    /// size.
    pub fn new(requests: Vec<Request>, config: ClusterConfig) -> Result<Self, Error> {
        check_range(
            "workers",
            f64::from(config.workers),
            1.0..=f64::from(RadixTree::MAX_WORKERS),
            "between 1 and 4096",
        )?;
        check_range(
            "prefill_tokens_per_s",
            config.prefill_tokens_per_s,
            f64::MIN_POSITIVE..=f64::MAX,
            "a positive number",
        )?;
        check_range(
            "decode_s_per_token",
            config.decode_s_per_token,
            0.0..=f64::MAX,
            "zero or more seconds",
        )?;
        check_range(
            "speedup",
            config.speedup,
            f64::MIN_POSITIVE..=f64::MAX,
            "a positive factor",
        )?;
        let hasher = PrefixHasher::new(config.block_size)?;
        if config.capacity_tokens < config.block_size {
            return Err(Error::InvalidConfig {
                field: "capacity_tokens",
                value: config.capacity_tokens.to_string(),
                allowed: "at least one block",
            });
        }
        let mut sim = Self {
            requests,
            config,
            hasher,
            ideal: 0.0,
            pooled: 0.0,
            ideal_blocks: None,
        };
        sim.references();
        Ok(sim)
    }

    /// Computes the infinite and the pooled reference hit ratios.
    fn references(&mut self) {
        let bs = self.config.block_size;
        let mut ideal = RadixTree::with_config(unbounded());
        let mut pooled = RadixTree::with_config(unbounded());
        pooled.set_capacity(
            W0,
            self.config.capacity_tokens * self.config.workers as usize / bs,
        );
        let (mut total, mut hit_ideal, mut hit_pooled) = (0u64, 0u64, 0u64);
        let mut tokens = Vec::new();
        let mut blocks = Vec::new();
        for r in &self.requests {
            r.prompt.tokens_into(&mut tokens);
            self.hasher.hash_into(&tokens, &mut blocks);
            total += tokens.len() as u64;
            hit_ideal += (ideal.held_prefix(W0, &blocks) * bs) as u64;
            hit_pooled += (pooled.held_prefix(W0, &blocks) * bs) as u64;
            ideal.insert(W0, &blocks);
            pooled.insert(W0, &blocks);
        }
        let ratio = |hit: u64| {
            if total == 0 {
                0.0
            } else {
                hit as f64 / total as f64
            }
        };
        self.ideal = ratio(hit_ideal);
        self.pooled = ratio(hit_pooled);
        self.ideal_blocks = self.content_block_ideal();
    }

    /// For traces of content blocks (Mooncake's hash ids): the infinite-cache hit ratio
    /// counted in content blocks, each id one block including a request's trailing partial
    /// one. This is how trace hit ratios are usually quoted; the token-based
    /// [`ideal_hit_ratio`](Self::ideal_hit_ratio) does not count partial blocks.
    fn content_block_ideal(&self) -> Option<f64> {
        let mut ideal = RadixTree::with_config(unbounded());
        let hasher = PrefixHasher::new(1).ok()?;
        let (mut hit, mut total) = (0u64, 0u64);
        let mut chain = Vec::new();
        for r in &self.requests {
            let super::workload::Prompt::Blocks { ids, .. } = &r.prompt else {
                return None;
            };
            // Chain the ids (as pairs of u32 "tokens" hashed at block size 1, keeping every
            // second hash) so that equal ids after different prefixes differ.
            let ids32: Vec<TokenId> = ids
                .iter()
                .flat_map(|&id| [id as u32, (id >> 32) as u32])
                .collect();
            let mut pairs = Vec::new();
            hasher.hash_into(&ids32, &mut pairs);
            chain.clear();
            chain.extend(pairs.iter().skip(1).step_by(2).copied());
            hit += ideal.held_prefix(W0, &chain) as u64;
            total += chain.len() as u64;
            ideal.insert(W0, &chain);
        }
        (total > 0).then(|| hit as f64 / total as f64)
    }

    /// For traces of content blocks: the infinite-cache hit ratio in content blocks (see
    /// `Simulation` docs); `None` for token workloads.
    #[must_use]
    pub fn ideal_block_hit_ratio(&self) -> Option<f64> {
        self.ideal_blocks
    }

    /// The requests.
    #[must_use]
    pub fn requests(&self) -> &[Request] {
        &self.requests
    }

    /// The fleet's configuration.
    #[must_use]
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    /// The hit ratio of one infinite shared cache.
    #[must_use]
    pub fn ideal_hit_ratio(&self) -> f64 {
        self.ideal
    }

    /// The hit ratio of one LRU cache of the whole fleet's capacity.
    #[must_use]
    pub fn pooled_ideal_hit_ratio(&self) -> f64 {
        self.pooled
    }

    /// Replays the workload through `router` (which must route over workers
    /// `0..config.workers`), feeding its [`cache_sync`](Router::cache_sync) as
    /// [`ClusterConfig::sync`] says.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownWorker`] when the router picks a worker outside the fleet; any
    /// routing error.
    pub fn run(&self, router: &dyn Router) -> Result<SimReport, Error> {
        self.run_with_progress(router, &mut |_, _| {})
    }

    /// Like [`run`](Self::run), calling `progress(routed, total)` after every routed
    /// request (for a progress bar on long traces).
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run).
    pub fn run_with_progress(
        &self,
        router: &dyn Router,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<SimReport, Error> {
        let cfg = &self.config;
        let sync = match cfg.sync {
            SyncMode::None => None,
            SyncMode::Feedback => router.cache_sync(),
        };
        let bs = cfg.block_size;
        let workers = cfg.workers as usize;
        let mut fleet: Vec<WorkerSim> = (0..workers)
            .map(|_| {
                let mut cache = RadixTree::with_config(unbounded());
                cache.set_capacity(W0, cfg.capacity_tokens / bs);
                WorkerSim {
                    cache,
                    queue: VecDeque::new(),
                    busy: false,
                    prefill_tokens: 0,
                }
            })
            .collect();
        let n = self.requests.len();
        let mut state: Vec<Option<InFlight>> = (0..n).map(|_| None).collect();
        let mut ttft = Vec::with_capacity(n);
        let mut events: BinaryHeap<Reverse<(u64, u8, usize)>> = BinaryHeap::new();
        let (mut cached_total, mut prompt_total) = (0u64, 0u64);
        let (mut decision_ns, mut makespan) = (0u128, 0.0f64);
        let mut next_arrival = 0;
        let arrival = |i: usize| self.requests[i].arrival_s / cfg.speedup;
        loop {
            // The next event: completions and prefill ends before arrivals at equal times.
            let heap_next = events.peek().map(|Reverse((t, _, _))| f64::from_bits(*t));
            let take_arrival =
                next_arrival < n && heap_next.is_none_or(|t| arrival(next_arrival) < t);
            if take_arrival {
                let i = next_arrival;
                next_arrival += 1;
                progress(next_arrival, n);
                let now = arrival(i);
                let r = &self.requests[i];
                let mut tokens = Vec::new();
                r.prompt.tokens_into(&mut tokens);
                let mut request = RouteRequest::new(&tokens);
                if let Some(s) = &r.session {
                    request = request.with_session(s);
                }
                let started = cfg.measure_decision_time.then(std::time::Instant::now);
                let decision = router.route(&request)?;
                if let Some(started) = started {
                    decision_ns += started.elapsed().as_nanos();
                }
                let w = decision.worker().index();
                if w >= workers {
                    router.complete(&decision);
                    return Err(Error::UnknownWorker(decision.worker()));
                }
                let blocks = self.hasher.hash(&tokens);
                state[i] = Some(InFlight {
                    decision,
                    tokens,
                    blocks,
                    cached: 0,
                });
                fleet[w].queue.push_back(i);
                if !fleet[w].busy {
                    self.start(&mut fleet[w], w, now, &mut state, &mut events, sync)?;
                }
                continue;
            }
            let Some(Reverse((t, kind, i))) = events.pop() else {
                break;
            };
            let now = f64::from_bits(t);
            let Some(flight) = state[i].as_ref() else {
                continue;
            };
            let w = flight.decision.worker().index();
            if kind == PREFILL_DONE {
                let r = &self.requests[i];
                ttft.push(now - arrival(i));
                router.first_token(&flight.decision);
                cached_total += flight.cached as u64;
                prompt_total += flight.tokens.len() as u64;
                fleet[w].cache.insert(W0, &flight.blocks);
                let done = now + f64::from(r.output_tokens) * cfg.decode_s_per_token;
                events.push(Reverse((done.to_bits(), COMPLETE, i)));
                fleet[w].busy = false;
                if !fleet[w].queue.is_empty() {
                    self.start(&mut fleet[w], w, now, &mut state, &mut events, sync)?;
                }
            } else if let Some(flight) = state[i].take() {
                router.complete(&flight.decision);
                makespan = makespan.max(now);
            }
        }
        let first = self
            .requests
            .first()
            .map_or(0.0, |r| r.arrival_s / cfg.speedup);
        let makespan = (makespan - first).max(0.0);
        ttft.sort_by(f64::total_cmp);
        let pct = |p: f64| -> f64 {
            if ttft.is_empty() {
                return 0.0;
            }
            let rank = ((p * ttft.len() as f64).ceil() as usize).clamp(1, ttft.len());
            ttft[rank - 1]
        };
        let worker_prefill_tokens: Vec<u64> = fleet.iter().map(|w| w.prefill_tokens).collect();
        let computed: u64 = worker_prefill_tokens.iter().sum();
        let mean = computed as f64 / workers as f64;
        let max = worker_prefill_tokens.iter().copied().max().unwrap_or(0) as f64;
        let hit_ratio = if prompt_total == 0 {
            0.0
        } else {
            cached_total as f64 / prompt_total as f64
        };
        Ok(SimReport {
            policy: router.name().to_owned(),
            requests: n,
            prompt_tokens: prompt_total,
            prefill_tokens: computed,
            cached_tokens: cached_total,
            hit_ratio,
            ideal_hit_ratio: self.ideal,
            pooled_ideal_hit_ratio: self.pooled,
            ratio_to_ideal: if self.ideal > 0.0 {
                hit_ratio / self.ideal
            } else {
                0.0
            },
            worker_prefill_tokens,
            imbalance: if mean > 0.0 { max / mean } else { 1.0 },
            ttft_p50_s: pct(0.50),
            ttft_p90_s: pct(0.90),
            ttft_p99_s: pct(0.99),
            makespan_s: makespan,
            throughput_rps: if makespan > 0.0 {
                n as f64 / makespan
            } else {
                0.0
            },
            decision_ns: if n == 0 {
                0.0
            } else {
                decision_ns as f64 / n as f64
            },
        })
    }

    /// Starts the prefill of worker `w`'s next queued request at `now`.
    fn start(
        &self,
        worker: &mut WorkerSim,
        w: usize,
        now: f64,
        state: &mut [Option<InFlight>],
        events: &mut BinaryHeap<Reverse<(u64, u8, usize)>>,
        sync: Option<&dyn CacheSync>,
    ) -> Result<(), Error> {
        let Some(i) = worker.queue.pop_front() else {
            return Ok(());
        };
        let Some(flight) = state[i].as_mut() else {
            return Ok(());
        };
        let bs = self.config.block_size;
        let cached = (worker.cache.held_prefix(W0, &flight.blocks) * bs).min(flight.tokens.len());
        flight.cached = cached;
        let uncached = flight.tokens.len() - cached;
        worker.prefill_tokens += uncached as u64;
        worker.busy = true;
        if let Some(sync) = sync {
            sync.report_cached(WorkerId::new(w as u32), &flight.tokens, cached)?;
        }
        let done = now + uncached as f64 / self.config.prefill_tokens_per_s;
        events.push(Reverse((done.to_bits(), PREFILL_DONE, i)));
        Ok(())
    }
}

const PREFILL_DONE: u8 = 0;
const COMPLETE: u8 = 1;

struct WorkerSim {
    /// The worker's true KV cache: an LRU over blocks with prefix matching.
    cache: RadixTree,
    queue: VecDeque<usize>,
    busy: bool,
    prefill_tokens: u64,
}

struct InFlight {
    decision: RouteDecision,
    tokens: Vec<TokenId>,
    blocks: Vec<BlockHash>,
    cached: usize,
}
