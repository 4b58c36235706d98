//! The integration tests, one crate: each module is one file of `tests/`, testing the crate
//! through its public API (and the examples' parsers and programs, where a module says so).
//! Compiled and linked once rather than once a file; a module that needs a feature says so
//! with its own `#![cfg(feature = ...)]`. Run one with a filter:
//! `cargo test --test integration policy::`.
//!
//! Two tests stay crates of their own, as they need features the rest do not:
//! `vllm_zmq` (`zmq`) and `vllm_conformance` (`vllm`). The gateway's tests are the crate
//! `tests/gateway/`.

// `cli` loads the examples' policy table, which loads their peers' policies, and `peers`
// loads those peers to test them alone: two copies of one module, as when each was a crate.
#![allow(clippy::duplicate_mod)]

mod common;

mod admission;
mod admission_recovery;
mod bad_input;
mod cli;
mod contract;
mod engine_settings;
mod hash_golden;
mod hash_props;
mod load;
mod matrix_needless;
mod observed_admission;
mod one_price;
mod pd;
mod peers;
mod policy;
mod replica;
mod routers;
mod signals;
mod sim;
mod sim_admission;
mod sim_agents;
mod sim_fleet;
mod sim_observed;
mod sim_pd;
mod stress;
mod sync;
mod tiers;
mod tree_model;
mod wire;
