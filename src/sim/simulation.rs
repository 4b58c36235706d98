//! The replay of a workload through a router against the modelled fleet.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use super::config::{ClusterConfig, SyncMode};
use super::references::{References, unbounded};
use super::report::{SimReport, Tally};
use super::workload::Request;
use crate::{
    BlockHash, CacheSync, Error, PrefixHasher, RadixTree, RouteDecision, RouteRequest, Router,
    TokenId, WorkerId,
};

/// A workload ready to replay through routers, with its reference hit ratios computed once.
///
/// ```
/// use prefix_router::sim::{ClusterConfig, Simulation, Workload};
/// use prefix_router::{CacheAwareRouter, RoundRobinRouter};
///
/// let requests = Workload::builtin()[0].1.generate(7);
/// let config = ClusterConfig::default()
///     .with_workers(4)
///     .with_measure_decision_time(false);
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
    references: References,
}

const W0: WorkerId = WorkerId::new(0);

impl Simulation {
    /// Prepares `requests` for replay on the modelled fleet.
    ///
    /// # Errors
    ///
    /// As [`ClusterConfig::validate`].
    pub fn new(requests: Vec<Request>, config: ClusterConfig) -> Result<Self, Error> {
        config.validate()?;
        let hasher = PrefixHasher::new(config.block_size)?;
        let pooled_blocks = config.capacity_tokens * config.workers as usize / config.block_size;
        let references = References::compute(&requests, &hasher, pooled_blocks)?;
        Ok(Self {
            requests,
            config,
            hasher,
            references,
        })
    }

    /// For traces of content blocks (Mooncake's hash ids): the infinite-cache hit ratio
    /// counted in content blocks, each id one block including a request's trailing partial
    /// one (how trace hit ratios are usually quoted); `None` for token workloads.
    #[must_use]
    pub fn ideal_block_hit_ratio(&self) -> Option<f64> {
        self.references.ideal_blocks
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
        self.references.ideal
    }

    /// The hit ratio of one LRU cache of the whole fleet's capacity.
    #[must_use]
    pub fn pooled_ideal_hit_ratio(&self) -> f64 {
        self.references.pooled
    }

    /// Replays the workload through `router` (which must route over workers
    /// `0..config.workers`), feeding its [`cache_sync`](Router::cache_sync) as
    /// [`ClusterConfig::sync`] says.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when the router's mirror hashes another block size than
    /// the fleet's; [`Error::UnknownWorker`] when the router picks a worker outside the
    /// fleet; any routing error.
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
        if let Some(block_size) = router.block_size() {
            if block_size != self.config.block_size {
                return Err(crate::config::invalid(
                    "block_size",
                    block_size,
                    "the router's block size must equal the simulated fleet's",
                ));
            }
        }
        let mut run = Run::new(self, router)?;
        while let Some((now, event)) = run.next() {
            match event {
                Event::Arrival(i) => {
                    progress(i + 1, self.requests.len());
                    run.arrive(i, now)?;
                }
                Event::PrefillDone(i) => run.prefill_done(i, now)?,
                Event::Complete(i) => run.complete(i, now),
            }
        }
        Ok(run.report())
    }

    /// Arrival time of request `i` at the configured speedup.
    fn arrival(&self, i: usize) -> f64 {
        self.requests[i].arrival_s / self.config.speedup
    }
}

/// What happens next in a run.
#[derive(Clone, Copy, Debug)]
enum Event {
    /// Request `i` arrives and is routed.
    Arrival(usize),
    /// Request `i`'s prefill ends: its first token.
    PrefillDone(usize),
    /// Request `i` finishes decoding.
    Complete(usize),
}

impl Event {
    /// Order of timed events at equal times: prefill ends before completions (both before
    /// arrivals, which are not queued).
    fn rank(self) -> (u8, usize) {
        match self {
            Event::PrefillDone(i) => (0, i),
            Event::Complete(i) => (1, i),
            Event::Arrival(i) => (2, i),
        }
    }

    fn from_rank(kind: u8, i: usize) -> Self {
        match kind {
            0 => Event::PrefillDone(i),
            1 => Event::Complete(i),
            _ => Event::Arrival(i),
        }
    }
}

/// One modelled worker.
struct WorkerSim {
    /// The worker's true KV cache: an LRU over blocks with prefix matching.
    cache: RadixTree,
    queue: VecDeque<usize>,
    busy: bool,
    prefill_tokens: u64,
}

/// A routed request until it completes.
struct InFlight {
    decision: RouteDecision,
    tokens: Vec<TokenId>,
    blocks: Vec<BlockHash>,
    cached: usize,
}

/// The state of one replay.
struct Run<'s> {
    sim: &'s Simulation,
    router: &'s dyn Router,
    sync: Option<&'s dyn CacheSync>,
    fleet: Vec<WorkerSim>,
    flights: Vec<Option<InFlight>>,
    /// Timed events: (time bits, event rank). Times are non-negative, so their bits order
    /// as the times do.
    timed: BinaryHeap<Reverse<(u64, (u8, usize))>>,
    next_arrival: usize,
    tally: Tally,
}

impl<'s> Run<'s> {
    fn new(sim: &'s Simulation, router: &'s dyn Router) -> Result<Self, Error> {
        let cfg = &sim.config;
        let fleet = (0..cfg.workers)
            .map(|_| {
                let mut cache = unbounded()?;
                cache.set_capacity(W0, cfg.capacity_tokens / cfg.block_size);
                Ok(WorkerSim {
                    cache,
                    queue: VecDeque::new(),
                    busy: false,
                    prefill_tokens: 0,
                })
            })
            .collect::<Result<_, Error>>()?;
        let n = sim.requests.len();
        Ok(Self {
            sim,
            router,
            sync: match cfg.sync {
                SyncMode::None => None,
                SyncMode::Feedback => router.cache_sync(),
            },
            fleet,
            flights: (0..n).map(|_| None).collect(),
            timed: BinaryHeap::new(),
            next_arrival: 0,
            tally: Tally {
                ttft: Vec::with_capacity(n),
                ..Tally::default()
            },
        })
    }

    /// The next event and its time: timed events before an arrival at the same time.
    fn next(&mut self) -> Option<(f64, Event)> {
        let timed = self.timed.peek().map(|Reverse((t, _))| f64::from_bits(*t));
        let i = self.next_arrival;
        if i < self.sim.requests.len() && timed.is_none_or(|t| self.sim.arrival(i) < t) {
            self.next_arrival += 1;
            return Some((self.sim.arrival(i), Event::Arrival(i)));
        }
        let Reverse((t, (kind, i))) = self.timed.pop()?;
        Some((f64::from_bits(t), Event::from_rank(kind, i)))
    }

    fn schedule(&mut self, at: f64, event: Event) {
        self.timed.push(Reverse((at.to_bits(), event.rank())));
    }

    /// Routes request `i` and queues it on its worker.
    fn arrive(&mut self, i: usize, now: f64) -> Result<(), Error> {
        let r = &self.sim.requests[i];
        let mut tokens = Vec::new();
        r.prompt.tokens_into(&mut tokens);
        let mut request = RouteRequest::new(&tokens);
        if let Some(s) = &r.session {
            request = request.with_session(s);
        }
        let started = self
            .sim
            .config
            .measure_decision_time
            .then(std::time::Instant::now);
        let decision = self.router.route(&request)?;
        if let Some(started) = started {
            self.tally.decision_ns += started.elapsed().as_nanos();
        }
        let w = decision.worker().index();
        if w >= self.fleet.len() {
            self.router.complete(&decision);
            return Err(Error::UnknownWorker(decision.worker()));
        }
        let blocks = self.sim.hasher.hash(&tokens);
        self.flights[i] = Some(InFlight {
            decision,
            tokens,
            blocks,
            cached: 0,
        });
        self.fleet[w].queue.push_back(i);
        if !self.fleet[w].busy {
            self.start(w, now)?;
        }
        Ok(())
    }

    /// Request `i`'s first token: its blocks are cached, decoding starts, the worker takes
    /// the next prefill.
    fn prefill_done(&mut self, i: usize, now: f64) -> Result<(), Error> {
        let Some(flight) = self.flights[i].as_ref() else {
            return Ok(());
        };
        let w = flight.decision.worker().index();
        self.tally.ttft.push(now - self.sim.arrival(i));
        self.router.first_token(&flight.decision);
        self.tally.cached_tokens += flight.cached as u64;
        self.tally.prompt_tokens += flight.tokens.len() as u64;
        self.fleet[w].cache.insert(W0, &flight.blocks);
        let output = f64::from(self.sim.requests[i].output_tokens);
        self.schedule(
            now + output * self.sim.config.decode_s_per_token,
            Event::Complete(i),
        );
        self.fleet[w].busy = false;
        if !self.fleet[w].queue.is_empty() {
            self.start(w, now)?;
        }
        Ok(())
    }

    fn complete(&mut self, i: usize, now: f64) {
        if let Some(flight) = self.flights[i].take() {
            self.router.complete(&flight.decision);
            self.tally.last_completion = self.tally.last_completion.max(now);
        }
    }

    /// Starts the prefill of worker `w`'s next queued request at `now`.
    fn start(&mut self, w: usize, now: f64) -> Result<(), Error> {
        let worker = &mut self.fleet[w];
        let Some(i) = worker.queue.pop_front() else {
            return Ok(());
        };
        let Some(flight) = self.flights[i].as_mut() else {
            return Ok(());
        };
        let bs = self.sim.config.block_size;
        let cached = (worker.cache.held_prefix(W0, &flight.blocks) * bs).min(flight.tokens.len());
        flight.cached = cached;
        let uncached = flight.tokens.len() - cached;
        worker.prefill_tokens += uncached as u64;
        worker.busy = true;
        if let Some(sync) = self.sync {
            sync.report_cached(WorkerId::new(w as u32), &flight.tokens, cached)?;
        }
        let done = now + uncached as f64 / self.sim.config.prefill_tokens_per_s;
        self.schedule(done, Event::PrefillDone(i));
        Ok(())
    }

    fn report(self) -> SimReport {
        let first = self
            .sim
            .requests
            .first()
            .map_or(0.0, |_| self.sim.arrival(0));
        let worker_prefill_tokens = self.fleet.iter().map(|w| w.prefill_tokens).collect();
        self.tally.report(
            self.router.name(),
            self.sim.requests.len(),
            first,
            worker_prefill_tokens,
            &self.sim.references,
        )
    }
}
