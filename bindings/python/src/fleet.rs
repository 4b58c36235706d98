//! The crate's built routers, one type over every policy: what the Python `Router` holds.

use prefix_router::{
    Affinity, AffinityConfig, AffinityRouter, BalancedConfig, BalancedRouter, CacheAware,
    CacheAwareConfig, CacheAwareRouter, CacheIndex, CacheSync, ConsistentHash,
    ConsistentHashConfig, ConsistentHashRouter, Error, IndexConfig, LeastLoaded, LeastLoadedRouter,
    LoadConfig, PolicyRouter, PowerOfTwo, PowerOfTwoConfig, PowerOfTwoRouter, RankLayout,
    RoundRobin, RoundRobinRouter, Router,
};

/// A router of one of the crate's policies.
pub(crate) enum Routers {
    Balanced(BalancedRouter),
    CacheAware(CacheAwareRouter),
    RoundRobin(RoundRobinRouter),
    LeastLoaded(LeastLoadedRouter),
    PowerOfTwo(PowerOfTwoRouter),
    ConsistentHash(ConsistentHashRouter),
    Affinity(AffinityRouter),
}

/// Runs `$body` with `$r` bound to the router, whatever its policy.
macro_rules! each {
    ($routers:expr, $r:ident => $body:expr) => {
        match $routers {
            Routers::Balanced($r) => $body,
            Routers::CacheAware($r) => $body,
            Routers::RoundRobin($r) => $body,
            Routers::LeastLoaded($r) => $body,
            Routers::PowerOfTwo($r) => $body,
            Routers::ConsistentHash($r) => $body,
            Routers::Affinity($r) => $body,
        }
    };
}

/// What building a router takes beside its policy's own settings.
pub(crate) struct Build {
    pub(crate) targets: u32,
    pub(crate) layout: RankLayout,
    pub(crate) index: IndexConfig,
    pub(crate) load: LoadConfig,
    pub(crate) balanced: Option<BalancedConfig>,
    pub(crate) cache_aware: Option<CacheAwareConfig>,
}

/// The policies' names, as `Router(policy=...)` takes them.
pub(crate) const POLICIES: &str =
    "balanced, cache_aware, round_robin, least_loaded, power_of_two, consistent_hash or affinity";

impl Routers {
    /// A router of the policy `name`.
    ///
    /// # Errors
    ///
    /// `InvalidConfig` for an unknown policy or a policy's settings given to another one;
    /// any error of the crate's constructors.
    pub(crate) fn build(name: &str, b: Build) -> Result<Routers, Error> {
        let misplaced = match name {
            "balanced" => b.cache_aware.map(|_| "cache_aware"),
            "cache_aware" => b.balanced.map(|_| "balanced"),
            _ => b
                .balanced
                .map(|_| "balanced")
                .or(b.cache_aware.map(|_| "cache_aware")),
        };
        if let Some(field) = misplaced {
            return Err(Error::InvalidConfig {
                field,
                value: format!("given to the {name} policy"),
                allowed: "settings of the policy the router is built with",
            });
        }
        let (n, index, load) = (b.targets, b.index, b.load);
        let routers = match name {
            "balanced" => {
                let config = b
                    .balanced
                    .unwrap_or_default()
                    .with_load(load)
                    .with_index(index);
                Routers::Balanced(BalancedRouter::with_config(n, config)?)
            }
            "cache_aware" => {
                let mut config = b.cache_aware.unwrap_or_default();
                config.index = index;
                let policy = CacheAware::new(config)?;
                Routers::CacheAware(PolicyRouter::with_policy_and_load(n, policy, index, load)?)
            }
            "round_robin" => Routers::RoundRobin(PolicyRouter::with_policy_and_load(
                n,
                RoundRobin::default(),
                index,
                load,
            )?),
            "least_loaded" => Routers::LeastLoaded(PolicyRouter::with_policy_and_load(
                n,
                LeastLoaded,
                index,
                load,
            )?),
            "power_of_two" => {
                let mut config = PowerOfTwoConfig::default();
                config.seed = index.seed;
                let policy = PowerOfTwo::new(config)?;
                Routers::PowerOfTwo(PolicyRouter::with_policy_and_load(n, policy, index, load)?)
            }
            "consistent_hash" => {
                let policy = ConsistentHash::new(ring(&index))?;
                Routers::ConsistentHash(PolicyRouter::with_policy_and_load(n, policy, index, load)?)
            }
            "affinity" => {
                let mut config = AffinityConfig::default();
                config.ring = ring(&index);
                let policy = Affinity::new(config)?;
                Routers::Affinity(PolicyRouter::with_policy_and_load(n, policy, index, load)?)
            }
            other => {
                return Err(Error::InvalidConfig {
                    field: "policy",
                    value: other.to_owned(),
                    allowed: POLICIES,
                });
            }
        };
        Ok(routers.with_layout(b.layout))
    }

    fn with_layout(self, layout: RankLayout) -> Self {
        match self {
            Routers::Balanced(r) => Routers::Balanced(r.with_rank_layout(layout)),
            Routers::CacheAware(r) => Routers::CacheAware(r.with_rank_layout(layout)),
            Routers::RoundRobin(r) => Routers::RoundRobin(r.with_rank_layout(layout)),
            Routers::LeastLoaded(r) => Routers::LeastLoaded(r.with_rank_layout(layout)),
            Routers::PowerOfTwo(r) => Routers::PowerOfTwo(r.with_rank_layout(layout)),
            Routers::ConsistentHash(r) => Routers::ConsistentHash(r.with_rank_layout(layout)),
            Routers::Affinity(r) => Routers::Affinity(r.with_rank_layout(layout)),
        }
    }

    /// The router, as the trait a host holds.
    pub(crate) fn router(&self) -> &dyn Router {
        each!(self, r => r)
    }

    /// The router's mirror.
    pub(crate) fn index(&self) -> &CacheIndex {
        each!(self, r => r.index())
    }

    /// How its targets map to endpoints and ranks.
    pub(crate) fn layout(&self) -> RankLayout {
        each!(self, r => r.rank_layout())
    }

    /// Its mirror's sync, for policies that read the cache.
    ///
    /// # Errors
    ///
    /// `InvalidConfig` (`policy`) for a policy that keeps no mirror.
    pub(crate) fn sync(&self) -> Result<&(dyn CacheSync + Sync), Error> {
        if self.router().cache_sync().is_some() {
            return Ok(each!(self, r => r));
        }
        Err(Error::InvalidConfig {
            field: "policy",
            value: self.router().name().to_owned(),
            allowed: "a policy that mirrors the workers' caches (balanced, cache_aware) to feed it events or feedback",
        })
    }
}

/// The hash ring's settings for a router hashing as `index` does.
fn ring(index: &IndexConfig) -> ConsistentHashConfig {
    let mut ring = ConsistentHashConfig::default();
    ring.block_size = index.block_size;
    ring.seed = index.seed;
    ring
}
