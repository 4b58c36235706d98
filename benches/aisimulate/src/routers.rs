//! The routers the harness compares, by the crate simulator's names.

use std::sync::Arc;

use prefix_router::{
    AffinityConfig, AffinityRouter, BalancedConfig, BalancedRouter, CacheAwareConfig,
    CacheAwareRouter, ConsistentHashConfig, ConsistentHashRouter, Error, IndexConfig,
    LeastLoadedRouter, MissWeight, Policy, PolicyRouter, PowerOfTwoRouter, Router, Scoring,
};

// The peer projects' policies as the crate's simulator rebuilds them (`--policy llmd`,
// `dynamo`, `aibrix`): baselines from the examples, not the crate's API.
#[allow(dead_code, unused_imports)]
#[path = "../../../examples/common/peers/mod.rs"]
mod peers;

/// Dynamo's own `KvRouter` (defaults), composed into the replay by `dynamo-mocker`.
pub const DYNAMO: &str = "dynamo";
/// The replay's own round robin.
pub const ROUND_ROBIN: &str = "round_robin";

/// The crate's policies the harness places with, by the simulator's names; the
/// recommended `balanced` first. `dynamo_rebuilt` is the simulator's `dynamo` (the crate's
/// rebuild of Dynamo's selector on its own mirror), renamed here since `dynamo` is the real
/// one.
pub const CRATE_POLICIES: [&str; 10] = [
    "balanced",
    "balanced_weighted",
    "cache_aware",
    "least_loaded",
    "power_of_two",
    "consistent_hash",
    "affinity",
    "llmd",
    "dynamo_rebuilt",
    "aibrix",
];

/// Every router `--router all` runs: the default, Dynamo's router, the replay's round
/// robin, then the crate's other policies.
pub fn all() -> Vec<&'static str> {
    let mut names = vec![CRATE_POLICIES[0], DYNAMO, ROUND_ROBIN];
    names.extend_from_slice(&CRATE_POLICIES[1..]);
    names
}

/// Whether `name` is a router the harness knows.
pub fn known(name: &str) -> bool {
    name == DYNAMO || name == ROUND_ROBIN || CRATE_POLICIES.contains(&name)
}

fn boxed<P: Policy + 'static>(r: Result<PolicyRouter<P>, Error>) -> Result<Arc<dyn Router>, Error> {
    Ok(Arc::new(r?))
}

/// The crate's router called `name` over `workers` workers hashing blocks of `block_size`
/// tokens (the engines'), every other setting its default but the balanced policies' miss
/// weight when `miss_weight` fixes it (the simulator's `--miss-weight`) and their learning
/// rate from timings when `learning_rate` sets it; `None` for a name that is not one of
/// [`CRATE_POLICIES`].
pub fn build(
    name: &str,
    workers: u32,
    block_size: usize,
    miss_weight: Option<f64>,
    learning_rate: Option<f64>,
) -> Option<Result<Arc<dyn Router>, Error>> {
    let mut index = IndexConfig::default();
    index.block_size = block_size;
    let mut balanced = BalancedConfig::default();
    balanced.index = index;
    if let Some(w) = miss_weight {
        balanced.miss_weight = MissWeight::Fixed(w);
    }
    if let Some(rate) = learning_rate {
        balanced.load.learning_rate = rate;
    }
    let mut cache_aware = CacheAwareConfig::default();
    cache_aware.index = index;
    let mut ring = ConsistentHashConfig::default();
    ring.block_size = block_size;
    let mut affinity = AffinityConfig::default();
    affinity.ring = ring;
    Some(match name {
        "balanced" => boxed(BalancedRouter::with_config(workers, balanced)),
        "balanced_weighted" => {
            balanced.scoring = Scoring::Weighted;
            boxed(BalancedRouter::with_config(workers, balanced))
        }
        "cache_aware" => boxed(CacheAwareRouter::with_config(workers, cache_aware)),
        "least_loaded" => boxed(LeastLoadedRouter::new(workers)),
        "power_of_two" => boxed(PowerOfTwoRouter::new(workers)),
        "consistent_hash" => boxed(ConsistentHashRouter::with_config(workers, ring)),
        "affinity" => boxed(AffinityRouter::with_config(workers, affinity)),
        "llmd" => boxed(PolicyRouter::with_policy(
            workers,
            peers::Llmd::new(block_size),
            index,
        )),
        "dynamo_rebuilt" => boxed(PolicyRouter::with_policy(
            workers,
            peers::Dynamo::new(block_size),
            index,
        )),
        "aibrix" => boxed(PolicyRouter::with_policy(
            workers,
            peers::Aibrix::new(block_size),
            index,
        )),
        _ => return None,
    })
}
