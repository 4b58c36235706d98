//! Prefill/decode disaggregation: workers with roles ([`Role`]) and a topology
//! ([`Topology`]), and [`PdRouter`], which routes each request to a decode worker, prefilled
//! there or on a prefill worker whose KV then moves, by the plans' predicted costs
//! ([`PlanCost`]) or by another [`Decide`]r.

mod decide;
mod plan;
mod receipt;
mod role;
mod router;
mod search;
mod sides;
mod targets;
mod topology;

pub use decide::{AlwaysSplit, ByCost, Decide, NeverSplit};
pub use plan::{PairView, Plan, PlanCost};
pub use receipt::{PairReceipt, PlanLine};
pub use role::Role;
pub use router::{PairDecision, PdConfig, PdRouter};
pub use topology::Topology;
