//! Router replicas and the front load balancer that spreads requests over them.
//!
//! A **replica** is one [`Router`] of several that route for the same fleet, each with its
//! own mirror and load counters, as when a gateway runs several instances. The **front**
//! picks the replica of each request ([`Front`]). What workers report (load, engine events)
//! goes to every replica; what is about one request (its first token, its completion, miss
//! feedback) goes to the replica that routed it.

use super::config::{ClusterConfig, Front};
use super::rng::Rng;
use crate::error::Error;
use crate::fleet::EngineLoad;
use crate::router::Router;
use crate::tree::WorkerId;

/// The index of a replica in the slice given to
/// [`Simulation::run_replicas`](super::Simulation::run_replicas).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Replica(usize);

impl Replica {
    /// The replica's index, for records.
    pub(super) fn index(self) -> usize {
        self.0
    }
}

/// The replicas of one run and the front's state.
pub(super) struct Replicas<'s> {
    routers: &'s [&'s dyn Router],
    front: Front,
    next: usize,
    rng: Rng,
}

impl<'s> Replicas<'s> {
    /// The replicas `routers` behind the front `config.front`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when `routers` is empty.
    pub(super) fn new(
        routers: &'s [&'s dyn Router],
        config: &ClusterConfig,
    ) -> Result<Self, Error> {
        if routers.is_empty() {
            return Err(crate::config::invalid(
                "replicas",
                0,
                "at least one router replica",
            ));
        }
        Ok(Self {
            routers,
            front: config.front,
            next: 0,
            rng: Rng::new(config.seed ^ 0x0066_726f_6e74),
        })
    }

    /// The replica the front gives the next request.
    pub(super) fn pick(&mut self) -> Replica {
        let n = self.routers.len();
        Replica(match self.front {
            Front::RoundRobin => {
                let r = self.next;
                self.next = (r + 1) % n;
                r
            }
            Front::Random => self.rng.below(n as u64) as usize,
        })
    }

    /// How many replicas there are.
    pub(super) fn len(&self) -> usize {
        self.routers.len()
    }

    /// Replica `i` (below [`len`](Self::len)).
    pub(super) fn nth(&self, i: usize) -> Replica {
        Replica(i)
    }

    /// Replica `r`'s router.
    pub(super) fn router(&self, r: Replica) -> &'s dyn Router {
        self.routers[r.0]
    }

    /// Every replica with its router.
    pub(super) fn iter(&self) -> impl Iterator<Item = (Replica, &'s dyn Router)> + use<'s> {
        self.routers
            .iter()
            .enumerate()
            .map(|(i, &r)| (Replica(i), r))
    }

    /// Tells every replica `worker`'s load.
    pub(super) fn report_load(&self, worker: WorkerId, load: EngineLoad) -> Result<(), Error> {
        self.routers
            .iter()
            .try_for_each(|r| r.report_load(worker, load))
    }

    /// Every replica removes `worker` (it left the fleet).
    pub(super) fn remove_worker(&self, worker: WorkerId) -> Result<(), Error> {
        self.routers
            .iter()
            .try_for_each(|r| r.remove_worker(worker))
    }

    /// Every replica adds `worker` (it joined the fleet, empty).
    pub(super) fn add_worker(&self, worker: WorkerId) -> Result<(), Error> {
        self.routers.iter().try_for_each(|r| r.add_worker(worker))
    }

    /// The name of the policy (the first replica's).
    pub(super) fn name(&self) -> &'static str {
        self.routers[0].name()
    }
}
