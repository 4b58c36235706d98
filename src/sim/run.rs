//! Running a [`Simulation`]: through one router or several replicas, or a disaggregated
//! fleet's pair router, on the engine [`ClusterConfig::engine`](super::ClusterConfig::engine)
//! names (`simple.rs`, `batched.rs`).

use super::config::Engine;
#[cfg(doc)]
use super::config::{ClusterConfig, WorkerSpec};
use super::replicas::Replicas;
use super::report::SimReport;
use super::simulation::Simulation;
use crate::error::Error;
use crate::pd::{Decide, PdRouter, Role};
use crate::router::Router;
use crate::tree::WorkerId;

impl Simulation {
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

    /// Replays the workload through several router replicas of one policy, the front
    /// ([`ClusterConfig::front`]) giving each request to one of them. Each replica keeps its
    /// own mirror and load: engine events and load reports reach every replica, a request's
    /// first token, completion and miss feedback only the replica that routed it. The
    /// report names the first replica's policy.
    ///
    /// ```
    /// use prefix_router::sim::{ClusterConfig, Engine, Simulation, Workload};
    /// use prefix_router::{BalancedRouter, Router};
    ///
    /// let requests = Workload::builtin()[0].1.generate(7);
    /// let config = ClusterConfig::default().with_workers(4).with_engine(Engine::Batched);
    /// let sim = Simulation::new(requests, config)?;
    /// let replicas = [BalancedRouter::new(4)?, BalancedRouter::new(4)?];
    /// let routers: Vec<&dyn Router> = replicas.iter().map(|r| r as &dyn Router).collect();
    /// let report = sim.run_replicas(&routers)?;
    /// assert!(report.request_records.iter().any(|r| r.replica == 1));
    /// # Ok::<(), prefix_router::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run); [`Error::InvalidConfig`] for no router.
    pub fn run_replicas(&self, routers: &[&dyn Router]) -> Result<SimReport, Error> {
        self.run_replicas_with_progress(routers, &mut |_, _| {})
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
        self.run_replicas_with_progress(&[router], progress)
    }

    /// Like [`run_replicas`](Self::run_replicas), calling `progress(routed, total)` after
    /// every routed request.
    ///
    /// # Errors
    ///
    /// As [`run_replicas`](Self::run_replicas).
    pub fn run_replicas_with_progress(
        &self,
        routers: &[&dyn Router],
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<SimReport, Error> {
        let replicas = Replicas::new(routers, self.config())?;
        for (_, router) in replicas.iter() {
            self.check_block_size(router)?;
        }
        if let Some(w) = self.fleet().iter().find(|w| w.role != Role::Both) {
            return Err(crate::config::invalid(
                "role",
                w.role.name(),
                "workers that prefill and decode (both) for a plain router; run_pd for roles",
            ));
        }
        match self.config().engine {
            Engine::Simple => super::simple::run(self, replicas, progress),
            Engine::Batched => super::batched::run(self, replicas, progress),
        }
    }

    /// Checks that `router`'s mirror, if it keeps one, hashes the fleet's block size.
    fn check_block_size(&self, router: &dyn Router) -> Result<(), Error> {
        match router.block_size() {
            Some(block_size) if block_size != self.config().block_size => {
                Err(crate::config::invalid(
                    "block_size",
                    block_size,
                    "the router's block size must equal the simulated fleet's",
                ))
            }
            _ => Ok(()),
        }
    }

    /// Replays the workload through a disaggregated fleet's router: each request goes to
    /// the decode worker `router` chooses, prefilled there or on the prefill worker it
    /// chooses, whose KV then moves (see the `pd` module docs of the batched engine for what
    /// is modelled). The fleet's roles ([`WorkerSpec::role`]) must be the router's. The
    /// router's inner [`BalancedRouter`](crate::BalancedRouter) hears every worker's load
    /// and, with [`SyncMode::Events`](super::config::SyncMode::Events), its engine events; with [`SyncMode::Feedback`](super::config::SyncMode::Feedback) the
    /// hits a request found where it was prefilled.
    ///
    /// ```
    /// use prefix_router::sim::{ClusterConfig, Engine, Simulation, Workload, WorkerSpec};
    /// use prefix_router::{AlwaysSplit, Decide, PdConfig, PdRouter};
    ///
    /// let fleet = WorkerSpec::parse_fleet("1xP,2xD", 1_000_000)?;
    /// let roles: Vec<_> = fleet.iter().map(|w| w.role).collect();
    /// let config = ClusterConfig::default()
    ///     .with_engine(Engine::Batched)
    ///     .with_measure_decision_time(false);
    /// let requests = Workload::builtin()[0].1.generate(7);
    /// let sim = Simulation::with_fleet(requests, config, fleet)?;
    /// let decider: Box<dyn Decide> = Box::new(AlwaysSplit);
    /// let router = PdRouter::with_decider(&roles, PdConfig::default(), decider)?;
    /// let report = sim.run_pd(&router)?;
    /// assert_eq!(report.transfers, report.requests);
    /// assert_eq!(report.pd_decider.as_deref(), Some("always"));
    /// # Ok::<(), prefix_router::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] with [`Engine::Simple`], faults, a router whose roles are
    /// not the fleet's, or whose mirror hashes another block size; any routing error but
    /// [`Error::Shed`] (with [`ClusterConfig::admission`], a refused request is recorded
    /// as shed).
    pub fn run_pd(&self, router: &PdRouter<Box<dyn Decide>>) -> Result<SimReport, Error> {
        self.run_pd_with_progress(router, &mut |_, _| {})
    }

    /// Like [`run_pd`](Self::run_pd), calling `progress(routed, total)` after every routed
    /// request.
    ///
    /// # Errors
    ///
    /// As [`run_pd`](Self::run_pd).
    pub fn run_pd_with_progress(
        &self,
        router: &PdRouter<Box<dyn Decide>>,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<SimReport, Error> {
        let refuse = |field: &'static str, value: &str, wanted: &'static str| {
            Err(crate::config::invalid(field, value.to_owned(), wanted))
        };
        if self.config().engine != Engine::Batched {
            return refuse(
                "engine",
                "simple",
                "the batched engine for a disaggregated run",
            );
        }
        if !self.faults().is_empty() {
            return refuse("faults", "some", "no faults in a disaggregated run");
        }
        let roles_agree = (0..=self.fleet().len()).all(|w| {
            router.role(WorkerId::new(w as u32)) == self.fleet().get(w).map(|spec| spec.role)
        });
        if !roles_agree {
            return refuse(
                "roles",
                "the router's",
                "the fleet's roles, worker for worker",
            );
        }
        let inner: &dyn Router = router.router();
        self.check_block_size(inner)?;
        let routers = [inner];
        let replicas = Replicas::new(&routers, self.config())?;
        super::batched::run_pd(self, replicas, router, progress)
    }
}
