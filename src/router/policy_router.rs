//! [`PolicyRouter`]: a [`Policy`] with everything else a [`Router`] does, written once for
//! every policy: the fleet model, the mirror, rank layout. Its route path is in
//! `route.rs`, its trait implementations in `impls.rs`.

#[cfg(doc)]
use super::Router;
use super::policy::Policy;
use crate::error::Error;
use crate::fleet::{Fleet, LoadConfig};
use crate::index::{CacheIndex, IndexConfig};
use crate::ranks::RankLayout;
use crate::replica::{Outbox, ReplicaConfig};
#[cfg(doc)]
use crate::sync::CacheSync;

/// A [`Router`] made of a [`Policy`]: the crate's routers are all `PolicyRouter`s
/// ([`BalancedRouter`](crate::BalancedRouter) is `PolicyRouter<Balanced>`), and a
/// policy written outside the crate becomes a router the same way.
///
/// It keeps the workers' registry and load, and a [`CacheIndex`] mirror that it consults and
/// updates only when the policy [reads the cache](Policy::reads_cache). [`CacheSync`] feeds
/// that mirror (engine events, snapshots, miss feedback) whatever the policy;
/// [`Router::cache_sync`] offers it to hosts only when the policy reads it.
#[derive(Debug)]
pub struct PolicyRouter<P> {
    pub(super) fleet: Fleet,
    pub(super) index: CacheIndex,
    pub(super) policy: P,
    pub(super) layout: RankLayout,
    /// Replica sync's sending side, when on ([`with_replica_sync`](Self::with_replica_sync)).
    pub(super) replica: Option<Outbox>,
}

impl<P: Policy> PolicyRouter<P> {
    /// A router over workers `0..num_workers` choosing with `policy`, its mirror configured
    /// by `index` (used only when the policy reads the cache).
    ///
    /// # Errors
    ///
    /// [`Error::WorkerOutOfRange`] when `num_workers` exceeds
    /// [`RadixTree::MAX_WORKERS`](crate::RadixTree::MAX_WORKERS); [`Error::InvalidConfig`]
    /// or [`Error::InvalidBlockSize`] when `index` does not
    /// [validate](IndexConfig::validate).
    pub fn with_policy(num_workers: u32, policy: P, index: IndexConfig) -> Result<Self, Error> {
        Self::with_policy_and_load(num_workers, policy, index, LoadConfig::default())
    }

    /// Like [`with_policy`](Self::with_policy), reading load as `load` says.
    ///
    /// # Errors
    ///
    /// As [`with_policy`](Self::with_policy); [`Error::InvalidConfig`] when `load` does not
    /// [validate](LoadConfig::validate).
    pub fn with_policy_and_load(
        num_workers: u32,
        policy: P,
        index: IndexConfig,
        load: LoadConfig,
    ) -> Result<Self, Error> {
        let router = Self {
            fleet: Fleet::new(num_workers, load, index.block_size)?,
            index: CacheIndex::new(index)?,
            policy,
            layout: RankLayout::default(),
            replica: None,
        };
        for worker in router.fleet.workers() {
            router.index.reset_worker(worker);
            router.policy.worker_added(worker);
        }
        Ok(router)
    }

    /// The same router with its targets laid out as `layout` says (endpoint, data-parallel
    /// rank), so that its decisions name their rank ([`RouteDecision::rank`](crate::RouteDecision::rank)).
    #[must_use]
    pub fn with_rank_layout(mut self, layout: RankLayout) -> Self {
        self.layout = layout;
        self
    }

    /// The same router syncing with peer replicas as `config` says: it records what it
    /// routes for [`Router::drain_replica_sync`] and applies its peers' frames with
    /// [`Router::apply_replica_sync`] (see the [`replica`](crate::replica) module and
    /// `docs/replicas.md`). Every replica must hash as this one does (block size,
    /// algorithm, seed) and lay its targets out alike.
    ///
    /// # Errors
    ///
    /// As [`ReplicaConfig::validate`].
    pub fn with_replica_sync(mut self, config: ReplicaConfig) -> Result<Self, Error> {
        config.validate()?;
        self.fleet.set_replica_config(&config);
        self.replica = Some(Outbox::new(config));
        Ok(self)
    }

    /// How the router's targets map to endpoints and ranks.
    #[must_use]
    pub fn rank_layout(&self) -> RankLayout {
        self.layout
    }

    /// The policy.
    #[must_use]
    pub fn policy(&self) -> &P {
        &self.policy
    }

    /// The cache index (the mirror of every worker's cache).
    #[must_use]
    pub fn index(&self) -> &CacheIndex {
        &self.index
    }

    /// How the router reads load.
    #[must_use]
    pub fn load_config(&self) -> &LoadConfig {
        self.fleet.config()
    }
}
