//! The fleet model: what the router believes about each worker's time, below the policies
//! and admission, which read it and which it never reads.
//!
//! - The settings and figures at the top: what engines report ([`EngineLoad`],
//!   `report.rs`) and how old a report may be ([`Staleness`]); what a host tells of a
//!   worker ([`WorkerProfile`]) and how the fleet reads load ([`LoadConfig`], `config.rs`);
//!   the step model ([`StepModel`], `step.rs`); the reload time of a hit below the device
//!   tier ([`ReloadConfig`], `reload.rs`); the router's clock (`clock.rs`).
//! - `registry/`: the workers by id and their load keys (`slots.rs`), each worker's load
//!   state, its last report and the router's counts since (`state.rs`), and the
//!   least-loaded pass with the tie-break every policy shares (`least.rs`).
//! - `learned/`: each worker's step terms (`Timing`, `timing.rs`), what a prediction counts
//!   of each (`TermCounts`), how timings teach them with the fleet's as prior (`learn.rs`),
//!   the fleet's least terms (`floor.rs`), and the forecast terms admission's predictions
//!   are made with, learned against what the engine does (`forecast.rs`).
//! - `prediction/`: a worker's load figures at one instant (`Estimate`, `estimate.rs`) and
//!   what is forecast over them for a request of a given shape (`RequestShape`): the one
//!   `Prediction` admission checks and a decision records, the costs the policies rank by,
//!   the load key (`predict.rs`).
//! - `observed/`: what each worker was observed to deliver against its predictions, the
//!   factors admission's observed gates read (`worker.rs`), joined with a route's
//!   candidates (`factors.rs`).
//! - `replicas/`: peer replicas' bookings on each worker (`peers.rs`) and their frames
//!   applied (`booking.rs`).
//! - On top: the [`Fleet`] that composes them (`tracker.rs`), what a route charges and a
//!   first token or completion releases (`charge.rs`), what a policy is offered of a worker
//!   ([`Candidate`], `candidate.rs`) and what a host or an autoscaler reads ([`WorkerLoad`],
//!   [`FleetSignals`], `signals.rs`).
//!
//! Rule: nothing here imports the router, a policy, admission or the pair router. What a
//! prediction is bound by and a refusal's shape come from [`crate::request`], below. One
//! fact of admission is kept here, read from the request alone: the prefill of requests
//! that asked for admission ([`RouteRequest::asks_admission`](crate::RouteRequest::asks_admission)),
//! recorded at the charge for the decode bound to read as a rate.

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
