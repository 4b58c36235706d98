//! The replay of a workload through a router against the modelled fleet.

use super::clock::Clock;
use super::config::{Arrivals, ClusterConfig, Engine, Fault, SyncMode, WorkerSpec};
use super::follow::{ArrivalQueue, Plan};
use super::references::References;
use super::replicas::{Replica, Replicas};
use super::report::SimReport;
use super::request::Request;
use super::tally::{Tally, Workers};
use super::warmup::with_warmup;
use crate::error::Error;
use crate::hash::{BlockHash, PrefixHasher, TokenId};
use crate::request::{RouteDecision, RouteRequest};

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
    /// Outages, in the order given.
    faults: Vec<Fault>,
    hasher: PrefixHasher,
    references: References,
    /// Who waits for whom (closed-loop workloads).
    plan: Plan,
    /// How many of `requests`, first, are warm-up copies (see `warmup.rs`).
    warmup: usize,
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
        let host_blocks = match config.engine {
            Engine::Batched => config.batch.host_capacity_tokens / config.block_size,
            Engine::Simple => 0,
        };
        let pooled_blocks = fleet
            .iter()
            .map(|w| w.capacity_tokens / config.block_size + host_blocks)
            .sum();
        // Checked before the warm-up copies them (a copy follows what its original follows);
        // the replay's plan is of the list with the copies.
        Plan::new(&requests)?;
        let references = References::compute(&requests, &hasher, pooled_blocks)?;
        let mut requests = requests;
        if config.arrivals == Arrivals::Spread {
            spread(&mut requests, config.seed);
        }
        let (requests, warmup) = with_warmup(requests, config.warmup_s, config.speedup);
        let plan = Plan::new(&requests)?;
        Ok(Self {
            requests,
            config,
            fleet,
            faults: Vec::new(),
            hasher,
            references,
            plan,
            warmup,
        })
    }

    /// The same simulation with worker outages (see [`Fault`]); only the batched engine
    /// models them.
    ///
    /// ```
    /// use prefix_router::sim::{ClusterConfig, Engine, Fault, Simulation, Workload};
    /// use prefix_router::BalancedRouter;
    ///
    /// let requests = Workload::builtin()[0].1.generate(7);
    /// let config = ClusterConfig::default().with_workers(4).with_engine(Engine::Batched);
    /// let sim = Simulation::new(requests, config)?.with_faults(vec![Fault::new(1, 5.0, 20.0)])?;
    /// let report = sim.run(&BalancedRouter::new(4)?)?;
    /// assert!(report.retried > 0);
    /// assert_eq!(report.request_records.iter().filter(|r| r.e2e_s.is_some()).count(), report.requests);
    /// # Ok::<(), prefix_router::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a worker outside the fleet, a time that is negative or
    /// not a number, a return not after the leave, or faults with [`Engine::Simple`].
    pub fn with_faults(mut self, faults: Vec<Fault>) -> Result<Self, Error> {
        if !faults.is_empty() && self.config.engine == Engine::Simple {
            return Err(crate::config::invalid(
                "faults",
                "simple engine",
                "faults need the batched engine",
            ));
        }
        for f in &faults {
            f.validate(self.fleet.len())?;
        }
        self.faults = faults;
        Ok(self)
    }

    /// The outages.
    #[must_use]
    pub fn faults(&self) -> &[Fault] {
        &self.faults
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

    /// The measured requests (after the warm-up's, when
    /// [`ClusterConfig::warmup_s`] asks for one), arrival times as stored.
    #[must_use]
    pub fn requests(&self) -> &[Request] {
        &self.requests[self.warmup..]
    }

    /// Every request replayed, the warm-up's first: the replay's indices.
    pub(super) fn replayed(&self) -> &[Request] {
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

    /// The hit ratio of one LRU cache of the whole fleet's capacity (each worker's KV and,
    /// with the batched engine, its host tier).
    #[must_use]
    pub fn pooled_ideal_hit_ratio(&self) -> f64 {
        self.references.pooled
    }

    /// Replica `r`'s mirror, when `config.sync` is `mode` and it keeps one.
    pub(super) fn sync_of<'r>(
        &self,
        replicas: &Replicas<'r>,
        r: Replica,
        mode: SyncMode,
    ) -> Option<&'r dyn crate::sync::CacheSync> {
        replicas
            .router(r)
            .cache_sync()
            .filter(|_| self.config.sync == mode)
    }

    /// Arrival time of request `i` at the configured speedup (a closed-loop request's as
    /// if every answer were instant).
    pub(super) fn arrival(&self, i: usize) -> f64 {
        self.requests[i].arrival_s / self.config.speedup
    }

    /// A clock for a run: the requests arrive at their times at the configured speedup, a
    /// closed-loop request a gap after those it follows end.
    pub(super) fn clock(&self) -> Clock<'_> {
        let arrivals = ArrivalQueue::new(&self.plan, &self.requests, self.config.speedup);
        Clock::new(match self.warmup {
            0 => arrivals,
            k => arrivals.with_warmup_end(k, self.arrival(k)),
        })
    }

    /// The hasher of the fleet's blocks.
    pub(super) fn hasher(&self) -> &PrefixHasher {
        &self.hasher
    }

    /// A tally for a run of this workload.
    pub(super) fn tally(&self) -> Tally {
        Tally::new(
            self.plan.groups().to_vec(),
            (self.config.ttft_target_s, self.config.tpot_target_s),
        )
        .measured_from(self.warmup)
    }

    /// The priority of request `i` under admission: drawn from the seed and its session
    /// under [`PriorityScope::Session`](super::PriorityScope::Session) (every request of a
    /// session shares it), else from the seed and its index.
    fn priority(&self, i: usize) -> crate::request::Priority {
        let session = match self.config.priority_scope {
            super::PriorityScope::Session => self.requests[i].session.as_deref(),
            _ => None,
        };
        let key = session.map_or((i as u64).rotate_left(17), |s| {
            xxhash_rust::xxh3::xxh3_64(s.as_bytes())
        });
        let draw = crate::fold::mix64(self.config.seed ^ 0x7072_696f ^ key);
        let uniform = (draw >> 11) as f64 / (1u64 << 53) as f64;
        self.config.priorities.pick(uniform)
    }

    /// Request `i` (its prompt `tokens`) arriving at `now`, asking for admission at both
    /// goodput targets (time to first token and per output token) with its drawn priority
    /// when [`ClusterConfig::admission`] is on; and its priority (standard when it is off).
    pub(super) fn admitted_request<'a>(
        &'a self,
        i: usize,
        tokens: &'a [TokenId],
        now: f64,
    ) -> (RouteRequest<'a>, crate::request::Priority) {
        let request = self.route_request(i, tokens, now);
        if !self.config.admission {
            return (request, crate::request::Priority::Standard);
        }
        let priority = self.priority(i);
        // Targets are finite (validated); one beyond what a `Duration` holds is no target.
        let seconds =
            |s: f64| std::time::Duration::try_from_secs_f64(s).unwrap_or(std::time::Duration::MAX);
        let request = request
            .with_ttft_target(seconds(self.config.ttft_target_s))
            .with_tpot_target(seconds(self.config.tpot_target_s))
            .with_priority(priority);
        (request, priority)
    }

    /// Routes request `i` arriving at `now`, recording it and timing the decision into
    /// `tally` (when configured); `None` when admission refused it (recorded as shed).
    ///
    /// # Errors
    ///
    /// A routing error; [`Error::UnknownWorker`] when the router picks a worker outside
    /// the fleet (the decision is completed first).
    pub(super) fn route(
        &self,
        replicas: &mut Replicas<'_>,
        i: usize,
        now: f64,
        tally: &mut Tally,
    ) -> Result<Option<Routed>, Error> {
        let replica = replicas.pick();
        let router = replicas.router(replica);
        let tokens = self.prompt(i);
        let (request, priority) = self.admitted_request(i, &tokens, now);
        tally.asked(i, priority);
        let started = self
            .config
            .measure_decision_time
            .then(std::time::Instant::now);
        let decision = match router.route(&request) {
            Ok(decision) => decision,
            Err(Error::Shed(shed)) => {
                tally.shed(i, now, tokens.len(), shed.gate);
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        if let Some(started) = started {
            tally.timed(i, started.elapsed().as_nanos());
        }
        let worker = decision.worker().index();
        if worker >= self.config.workers as usize {
            router.complete(&decision);
            return Err(Error::UnknownWorker(decision.worker()));
        }
        let blocks = self.hasher.hash(&tokens);
        tally.routed(
            i,
            (now, tokens.len()),
            (decision.worker().get(), replica.index()),
            (decision.predicted_ttft_s(), decision.predicted_tpot_s()),
        );
        Ok(Some(Routed {
            replica,
            decision,
            worker,
            tokens,
            blocks,
            at: now,
        }))
    }

    /// Request `i`'s prompt tokens.
    pub(super) fn prompt(&self, i: usize) -> Vec<TokenId> {
        let mut tokens = Vec::new();
        self.requests[i].prompt.tokens_into(&mut tokens);
        tokens
    }

    /// Request `i` of prompt `tokens` as a router sees it at `now`, before admission's
    /// settings.
    pub(super) fn route_request<'a>(
        &'a self,
        i: usize,
        tokens: &'a [TokenId],
        now: f64,
    ) -> RouteRequest<'a> {
        let r = &self.requests[i];
        let request = RouteRequest::new(tokens)
            .with_time(std::time::Duration::from_secs_f64(now.max(0.0)))
            .with_expected_output(r.output_tokens);
        match &r.session {
            Some(s) => request.with_session(s),
            None => request,
        }
    }

    /// The report of a finished run.
    pub(super) fn report(
        &self,
        replicas: &Replicas<'_>,
        tally: Tally,
        workers: Workers,
    ) -> SimReport {
        let first = if self.warmup < self.requests.len() {
            self.arrival(self.warmup)
        } else {
            0.0
        };
        tally.report(replicas.name(), first, workers, &self.references)
    }
}

/// A routed request.
pub(super) struct Routed {
    /// The replica that routed it.
    pub(super) replica: Replica,
    pub(super) decision: RouteDecision,
    /// The chosen worker's index in the fleet.
    pub(super) worker: usize,
    pub(super) tokens: Vec<TokenId>,
    /// The prompt's full blocks, hashed by the fleet's hasher.
    pub(super) blocks: Vec<BlockHash>,
    /// When it was routed (and forwarded), seconds.
    pub(super) at: f64,
}

impl Routed {
    /// Tells the replica that routed it that its first token came at `now`, with the time
    /// the host measured.
    pub(super) fn first_token(&self, replicas: &Replicas<'_>, now: f64) {
        let elapsed = std::time::Duration::from_secs_f64((now - self.at).max(0.0));
        replicas
            .router(self.replica)
            .first_token_after(&self.decision, elapsed);
    }
}

/// Spreads each recorded instant's requests uniformly over the gap to the next instant (the
/// last instant over the gap before it), seeded, keeping their order ([`Arrivals::Spread`]).
/// Requests out of time order keep their times.
fn spread(requests: &mut [Request], seed: u64) {
    let mut rng = super::rng::Rng::new(crate::fold::mix64(seed ^ 0x7370_7265_6164));
    let mut start = 0;
    let mut last_gap = 0.0;
    while start < requests.len() {
        let at = requests[start].arrival_s;
        let end = start
            + requests[start..]
                .iter()
                .take_while(|r| r.arrival_s == at)
                .count();
        let gap = match requests.get(end) {
            Some(next) if next.arrival_s > at => next.arrival_s - at,
            Some(_) => 0.0,
            None => last_gap,
        };
        let mut offsets: Vec<f64> = (start..end).map(|_| rng.unit() * gap).collect();
        offsets.sort_by(f64::total_cmp);
        for (r, offset) in requests[start..end].iter_mut().zip(offsets) {
            r.arrival_s = at + offset;
        }
        last_gap = gap;
        start = end;
    }
}
