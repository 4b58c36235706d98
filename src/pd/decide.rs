//! Deciders: how a request's plan is chosen on a disaggregated fleet ([`Decide`]); the
//! crate's [`ByCost`] and the [`AlwaysSplit`] and [`NeverSplit`] baselines.

use super::plan::{PairView, Plan};
use crate::request::RouteRequest;

/// Chooses a request's plan on a disaggregated fleet ([`PdRouter`](crate::PdRouter)).
pub trait Decide: Send + Sync {
    /// The decider's name, for reports.
    fn name(&self) -> &'static str;

    /// The plan for `request` among what `view` offers. A plan whose decode worker cannot
    /// decode, whose prefill worker cannot prefill for others, or which pairs a worker with
    /// itself is refused ([`Error::WrongRole`](crate::Error::WrongRole)).
    fn decide(&self, request: &RouteRequest<'_>, view: &PairView<'_>) -> Plan;
}

/// The crate's decider: the plan of least predicted cost ([`PlanCost::total_s`](crate::PlanCost::total_s)) over every
/// decode worker, aggregated or split with every prefill worker. No threshold: a request
/// splits when moving its KV costs less than the stall its prefill would cause.
#[derive(Clone, Copy, Debug, Default)]
pub struct ByCost;

impl Decide for ByCost {
    fn name(&self) -> &'static str {
        "cost"
    }

    fn decide(&self, _: &RouteRequest<'_>, view: &PairView<'_>) -> Plan {
        view.cheapest(true, true)
            .map_or(Plan::Aggregated { decode: 0 }, |(plan, _)| plan)
    }
}

/// Always splits (the cheapest split plan), unless no prefill worker can: then aggregated.
#[derive(Clone, Copy, Debug, Default)]
pub struct AlwaysSplit;

impl Decide for AlwaysSplit {
    fn name(&self) -> &'static str {
        "always"
    }

    fn decide(&self, _: &RouteRequest<'_>, view: &PairView<'_>) -> Plan {
        view.cheapest(false, true)
            .or_else(|| view.cheapest(true, false))
            .map_or(Plan::Aggregated { decode: 0 }, |(plan, _)| plan)
    }
}

/// Never splits: the cheapest decode worker prefills its own requests.
#[derive(Clone, Copy, Debug, Default)]
pub struct NeverSplit;

impl Decide for NeverSplit {
    fn name(&self) -> &'static str {
        "never"
    }

    fn decide(&self, _: &RouteRequest<'_>, view: &PairView<'_>) -> Plan {
        view.cheapest(true, false)
            .map_or(Plan::Aggregated { decode: 0 }, |(plan, _)| plan)
    }
}

impl<D: Decide + ?Sized> Decide for Box<D> {
    fn name(&self) -> &'static str {
        (**self).name()
    }

    fn decide(&self, request: &RouteRequest<'_>, view: &PairView<'_>) -> Plan {
        (**self).decide(request, view)
    }
}
