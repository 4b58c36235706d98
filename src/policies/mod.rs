//! The built-in policies, each a [`Policy`](crate::Policy) that [`PolicyRouter`](crate::PolicyRouter)
//! makes a router: [`Balanced`] (the recommended one: predicted time to
//! first token and decode), [`CacheAware`], [`ConsistentHash`],
//! [`Affinity`], and the baselines (round robin, least loaded, power of two).
//!
//! Rule: a policy reads its candidates and the fleet model's predictions through them; it
//! never reaches into the fleet's registry or the mirror. The pair router builds on
//! `Balanced`, above.

mod affinity;
mod balanced;
mod baseline;
mod cache_aware;
mod consistent;
mod miss;

pub use self::affinity::{Affinity, AffinityConfig, AffinityRouter, Fallback};
pub use self::balanced::{Balanced, BalancedConfig, BalancedRouter, Scoring};
pub use self::baseline::{
    LeastLoaded, LeastLoadedRouter, PowerOfTwo, PowerOfTwoConfig, PowerOfTwoRouter, RoundRobin,
    RoundRobinRouter,
};
pub use self::cache_aware::{CacheAware, CacheAwareConfig, CacheAwareRouter};
pub use self::consistent::{ConsistentHash, ConsistentHashConfig, ConsistentHashRouter};
pub use self::miss::MissWeight;
