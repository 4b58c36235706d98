//! Building any of the crate's routers by name, shared by the examples.

use std::sync::Arc;

use prefix_router::{
    AffinityConfig, AffinityRouter, AlwaysSplit, BalancedConfig, BalancedRouter, ByCost,
    CacheAwareConfig, CacheAwareRouter, ConsistentHashConfig, ConsistentHashRouter, Decide, Error,
    IndexConfig, LeastLoadedRouter, MissWeight, NeverSplit, Policy, PolicyRouter, PowerOfTwoRouter,
    ReplicaConfig, RoundRobinRouter, Router, Scoring, StepModel,
};

#[path = "peers/mod.rs"]
mod peers;

use peers::{Aibrix, Dynamo, DynamoPd, IndependentPd, Llmd, LlmdPd};

/// Every prefill/decode decider's name, the crate's own last (`cost`, recommended): the
/// field's baselines (`independent`: SGLang's two picks; `llmd`, `dynamo`: their deciders,
/// see `peers/pd.rs`), then `always` and `never` split.
pub(crate) const PD_DECIDERS: [&str; 6] =
    ["independent", "llmd", "dynamo", "always", "never", "cost"];

/// The prefill/decode decider called `name` over blocks of `block_size` tokens; `None` for
/// an unknown name.
pub(crate) fn pd_decider(name: &str, block_size: usize) -> Option<Box<dyn Decide>> {
    Some(match name {
        "independent" => Box::new(IndependentPd::new()),
        "llmd" => Box::new(LlmdPd { block_size }),
        "dynamo" => Box::new(DynamoPd { block_size }),
        "always" => Box::new(AlwaysSplit),
        "never" => Box::new(NeverSplit),
        "cost" => Box::new(ByCost),
        _ => return None,
    })
}

/// Every policy name, the recommended one last; before it, the peer projects' policies
/// (`llmd`, `dynamo`, `aibrix`: baselines, see `peers/`).
pub(crate) const POLICIES: [&str; 11] = [
    "round_robin",
    "least_loaded",
    "power_of_two",
    "consistent_hash",
    "affinity",
    "cache_aware",
    "balanced_weighted",
    "llmd",
    "dynamo",
    "aibrix",
    "balanced",
];

/// Settings the examples expose as flags.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PolicyOptions {
    pub(crate) block_size: usize,
    /// Each worker's KV capacity in tokens: bounds the routers' mirrors.
    pub(crate) capacity_tokens: Option<usize>,
    pub(crate) prefill_tokens_per_s: f64,
    /// The engines' scheduler budgets and step-time model, as their operator configured
    /// them.
    pub(crate) step: StepModel,
    /// Router replicas routing for the same fleet.
    pub(crate) replicas: u32,
    pub(crate) alpha: Option<f64>,
    pub(crate) miss_weight: Option<f64>,
    /// What a second of delay to each decode on the worker weighs (`None`: the default).
    pub(crate) stall_weight: Option<f64>,
    /// Output tokens over which a worker's present decodes count in a request's decode
    /// time (`None`: the default).
    pub(crate) decode_horizon: Option<u32>,
    /// Blocks per chunk of the workers' host tier (vLLM's CPU offloading).
    pub(crate) host_chunk_blocks: usize,
    /// Whether the workers' requests report their prefix hit again
    /// (`kv_cache_report_mode=full`).
    pub(crate) full_reports: bool,
    /// Replica sync: this replica's id, incarnation and lease (`None`: off).
    pub(crate) replica: Option<ReplicaConfig>,
}

impl Default for PolicyOptions {
    fn default() -> Self {
        Self {
            block_size: 16,
            capacity_tokens: None,
            prefill_tokens_per_s: 33_000.0,
            step: StepModel::default(),
            replicas: 1,
            alpha: None,
            miss_weight: None,
            stall_weight: None,
            decode_horizon: None,
            host_chunk_blocks: 1,
            full_reports: false,
            replica: None,
        }
    }
}

/// Boxes a freshly built router, syncing with its peers when `o` says so.
fn arc<P: Policy + 'static>(
    r: Result<PolicyRouter<P>, Error>,
    o: &PolicyOptions,
) -> Result<Arc<dyn Router>, Error> {
    let r = match o.replica {
        Some(config) => r?.with_replica_sync(config)?,
        None => r?,
    };
    Ok(Arc::new(r))
}

/// A peer project's policy (see `peers/`) over the mirror `index`.
fn peer<P: Policy + 'static>(
    workers: u32,
    policy: P,
    index: IndexConfig,
    o: &PolicyOptions,
) -> Result<Arc<dyn Router>, Error> {
    arc(PolicyRouter::with_policy(workers, policy, index), o)
}

/// The balanced policy's settings for `o` (also a pair router's).
pub(crate) fn balanced_config(o: &PolicyOptions) -> BalancedConfig {
    let mut index = IndexConfig::default();
    index.block_size = o.block_size;
    index.worker_capacity_blocks = o.capacity_tokens.map(|c| c / o.block_size.max(1));
    index.host_chunk_blocks = o.host_chunk_blocks;
    index.full_reports = o.full_reports;
    let mut balanced = BalancedConfig::default();
    balanced.index = index;
    balanced.load.prefill_tokens_per_s = o.prefill_tokens_per_s;
    balanced.load.step = o.step;
    balanced.load.replicas = o.replicas;
    if let Some(alpha) = o.alpha {
        balanced.alpha = alpha;
    }
    if let Some(w) = o.miss_weight {
        balanced.miss_weight = MissWeight::Fixed(w);
    }
    if let Some(w) = o.stall_weight {
        balanced.stall_weight = w;
    }
    if let Some(h) = o.decode_horizon {
        balanced.load.decode_horizon_tokens = h;
    }
    balanced
}

/// The router called `name` over workers `0..workers`; `None` for an unknown name.
pub(crate) fn build(
    name: &str,
    workers: u32,
    o: &PolicyOptions,
) -> Option<Result<Arc<dyn Router>, Error>> {
    let mut balanced = balanced_config(o);
    let index = balanced.index;
    let mut cache_aware = CacheAwareConfig::default();
    cache_aware.index = index;
    let mut ring = ConsistentHashConfig::default();
    ring.block_size = o.block_size;
    let mut affinity = AffinityConfig::default();
    affinity.ring = ring;
    Some(match name {
        "round_robin" => arc(RoundRobinRouter::new(workers), o),
        "least_loaded" => arc(LeastLoadedRouter::new(workers), o),
        "power_of_two" => arc(PowerOfTwoRouter::new(workers), o),
        "consistent_hash" => arc(ConsistentHashRouter::with_config(workers, ring), o),
        "affinity" => arc(AffinityRouter::with_config(workers, affinity), o),
        "cache_aware" => arc(CacheAwareRouter::with_config(workers, cache_aware), o),
        "balanced_weighted" => {
            balanced.scoring = Scoring::Weighted;
            arc(BalancedRouter::with_config(workers, balanced), o)
        }
        "llmd" => peer(workers, Llmd::new(o.block_size), index, o),
        "dynamo" => peer(workers, Dynamo::new(o.block_size), index, o),
        "aibrix" => peer(workers, Aibrix::new(o.block_size), index, o),
        "balanced" => arc(BalancedRouter::with_config(workers, balanced), o),
        _ => return None,
    })
}
