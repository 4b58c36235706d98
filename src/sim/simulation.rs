//! The replay of a workload through a router against the modelled fleet.

use super::config::{ClusterConfig, Engine, WorkerSpec};
use super::references::References;
use super::report::SimReport;
use super::tally::{Tally, Workers};
use super::workload::Request;
use crate::{BlockHash, Error, PrefixHasher, RouteDecision, RouteRequest, Router, TokenId};

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
    /// Worker `w` is `fleet[w]`.
    fleet: Vec<WorkerSpec>,
    hasher: PrefixHasher,
    references: References,
}

impl Simulation {
    /// Prepares `requests` for replay on the modelled fleet.
    ///
    /// # Errors
    ///
    /// As [`ClusterConfig::validate`].
    pub fn new(requests: Vec<Request>, config: ClusterConfig) -> Result<Self, Error> {
        let fleet = vec![WorkerSpec::new(1.0, config.capacity_tokens); config.workers as usize];
        Self::with_fleet(requests, config, fleet)
    }

    /// Prepares `requests` for replay on a mixed fleet: worker `w` is `fleet[w]`, and
    /// `config.workers` and `config.capacity_tokens` are ignored (the pooled reference holds
    /// the fleet's capacities together).
    ///
    /// ```
    /// use prefix_router::sim::{ClusterConfig, Simulation, Workload, WorkerSpec};
    ///
    /// let fleet = WorkerSpec::parse_fleet("2x1.0,2x0.5@500000", 1_000_000)?;
    /// let requests = Workload::builtin()[0].1.generate(7);
    /// let sim = Simulation::with_fleet(requests, ClusterConfig::default(), fleet)?;
    /// assert_eq!(sim.config().workers, 4);
    /// # Ok::<(), prefix_router::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`ClusterConfig::validate`], for the configuration and for each worker (its
    /// capacity as `capacity_tokens`); [`Error::InvalidConfig`] for an empty fleet or a
    /// speed that is not positive and finite.
    pub fn with_fleet(
        requests: Vec<Request>,
        mut config: ClusterConfig,
        fleet: Vec<WorkerSpec>,
    ) -> Result<Self, Error> {
        config.workers = u32::try_from(fleet.len()).unwrap_or(u32::MAX);
        config.validate()?;
        for w in &fleet {
            config.with_capacity_tokens(w.capacity_tokens).validate()?;
            crate::config::float(
                "speed",
                w.speed,
                f64::MIN_POSITIVE..=f64::MAX,
                "a positive factor",
            )?;
        }
        let hasher = PrefixHasher::new(config.block_size)?;
        let pooled_blocks = fleet
            .iter()
            .map(|w| w.capacity_tokens / config.block_size)
            .sum();
        let references = References::compute(&requests, &hasher, pooled_blocks)?;
        Ok(Self {
            requests,
            config,
            fleet,
            hasher,
            references,
        })
    }

    /// The workers: worker `w` is `fleet()[w]`.
    #[must_use]
    pub fn fleet(&self) -> &[WorkerSpec] {
        &self.fleet
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
        match self.config.engine {
            Engine::Simple => super::simple::run(self, router, progress),
            Engine::Batched => super::batched::run(self, router, progress),
        }
    }

    /// Arrival time of request `i` at the configured speedup.
    pub(super) fn arrival(&self, i: usize) -> f64 {
        self.requests[i].arrival_s / self.config.speedup
    }

    /// The hasher of the fleet's blocks.
    pub(super) fn hasher(&self) -> &PrefixHasher {
        &self.hasher
    }

    /// A tally for a run of this workload.
    pub(super) fn tally(&self) -> Tally {
        Tally::new(
            self.requests.len(),
            (self.config.ttft_target_s, self.config.tpot_target_s),
        )
    }

    /// Routes request `i` arriving at `now`, recording it and timing the decision into
    /// `tally` (when configured).
    ///
    /// # Errors
    ///
    /// A routing error; [`Error::UnknownWorker`] when the router picks a worker outside
    /// the fleet (the decision is completed first).
    pub(super) fn route(
        &self,
        router: &dyn Router,
        i: usize,
        now: f64,
        tally: &mut Tally,
    ) -> Result<Routed, Error> {
        let r = &self.requests[i];
        let mut tokens = Vec::new();
        r.prompt.tokens_into(&mut tokens);
        let mut request = RouteRequest::new(&tokens);
        if let Some(s) = &r.session {
            request = request.with_session(s);
        }
        let started = self
            .config
            .measure_decision_time
            .then(std::time::Instant::now);
        let decision = router.route(&request)?;
        if let Some(started) = started {
            tally.decision_ns += started.elapsed().as_nanos();
        }
        let worker = decision.worker().index();
        if worker >= self.config.workers as usize {
            router.complete(&decision);
            return Err(Error::UnknownWorker(decision.worker()));
        }
        let blocks = self.hasher.hash(&tokens);
        tally.arrived(i, now, tokens.len(), decision.worker().get());
        Ok(Routed {
            decision,
            worker,
            tokens,
            blocks,
        })
    }

    /// The report of a finished run.
    pub(super) fn report(&self, router: &dyn Router, tally: Tally, workers: Workers) -> SimReport {
        let first = self.requests.first().map_or(0.0, |_| self.arrival(0));
        tally.report(router.name(), first, workers, &self.references)
    }
}

/// A routed request.
pub(super) struct Routed {
    pub(super) decision: RouteDecision,
    /// The chosen worker's index in the fleet.
    pub(super) worker: usize,
    pub(super) tokens: Vec<TokenId>,
    /// The prompt's full blocks, hashed by the fleet's hasher.
    pub(super) blocks: Vec<BlockHash>,
}
