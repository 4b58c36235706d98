//! The fleet model: what the router believes about each worker's time, below the policies
//! and admission, which read it and which it never reads.
//!
//! - What engines report ([`EngineLoad`], `report.rs`) and how old a report may be
//!   ([`Staleness`]); what a host tells of a worker ([`WorkerProfile`]) and how the fleet
//!   reads load ([`LoadConfig`], `config.rs`).
//! - Each worker's state (`state.rs`): the last report, the router's own counts since it and
//!   in flight, reconciled into an `Estimate` (`estimate.rs`); its step terms (`Timing`,
//!   `timing.rs`): the configured step model ([`StepModel`], `step.rs`) corrected by what
//!   its timings taught, with a fleet-wide prior (`learn.rs`); beside them, the terms the
//!   predictions admission checks are made with, learned against what the engine does
//!   (`forecast.rs`).
//! - The predictions over an estimate (`predict.rs`): time to first token part by part,
//!   decode time, time per output token, each a dot product of `TermCounts` with the `Timing`;
//!   the reload time of a hit below the device tier ([`ReloadConfig`], `reload.rs`).
//! - The registry of workers and their load keys (`registry.rs`), the router's clock
//!   (`clock.rs`), the least-loaded pass and the tie-break every policy shares (`least.rs`),
//!   the bound under every worker's step terms (`floor.rs`),
//!   the [`Fleet`] that composes them (`tracker.rs`) and what a route
//!   charges and a completion releases (`charge.rs`).
//! - Peer replicas' requests (`peers.rs`): each worker's counts of them beside its own,
//!   and the table of every peer's bookings that their sync frames change (`booking.rs`).
//! - What a policy is offered of a worker ([`Candidate`], `candidate.rs`) and what a host
//!   or an autoscaler reads ([`WorkerLoad`], [`FleetSignals`], `signals.rs`).
//!
//! Rule: nothing here imports the router, a policy, admission or the pair router. What a
//! prediction is bound by and a refusal's shape come from [`crate::request`], below.

mod candidate;
mod charge;
mod clock;
mod config;
mod reload;
mod report;
mod signals;
mod step;
mod tracker;

mod learned;
mod observed;
mod prediction;
mod registry;
mod replicas;

pub use self::candidate::Candidate;
pub use self::config::{LoadConfig, WorkerProfile};
pub use self::reload::ReloadConfig;
pub use self::report::{EngineLoad, Staleness};
pub use self::signals::{FleetRates, FleetSignals, ObservedLoad, WorkerLoad, WorkerSignals};
pub use self::step::StepModel;

pub(crate) use self::candidate::Candidates;
pub(crate) use self::learned::timing::attended;
pub(crate) use self::observed::worker::{ObservedFactors, PREFILL_HORIZON_S, stretched};
pub(crate) use self::prediction::estimate::Estimate;
pub(crate) use self::prediction::estimate::RequestShape;
pub(crate) use self::prediction::predict::{Prediction, TtftParts, meets_target};
pub(crate) use self::registry::least::{NO_CLASS, Tie, Widened, pick_min, spread};
pub(crate) use self::tracker::Fleet;
