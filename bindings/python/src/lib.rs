//! Python binding of `prefix-router`: the package `prefix_router`.
//!
//! One module per concern: token IDs from Python (`tokens`), a request's arguments
//! (`ask`), errors as exceptions (`errors`), settings (`config`), the routers of every
//! policy (`fleet`, `router`), decisions (`decision`), signals and event outcomes
//! (`signals`), vLLM events (`events`), the pair router (`pair`) and hashing (`hasher`).
//! Data flows one way: the Python classes read the crate; nothing in the crate knows them.

use pyo3::prelude::*;

mod ask;
mod config;
mod decision;
mod errors;
mod events;
mod fleet;
mod hasher;
mod pair;
mod router;
mod shared;
mod signals;
mod tokens;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<router::Router>()?;
    m.add_class::<decision::Decision>()?;
    m.add_class::<decision::Explanation>()?;
    m.add_class::<decision::Candidate>()?;
    m.add_class::<config::StepModel>()?;
    m.add_class::<config::AdmissionConfig>()?;
    m.add_class::<config::LoadConfig>()?;
    m.add_class::<config::BalancedConfig>()?;
    m.add_class::<config::CacheAwareConfig>()?;
    m.add_class::<signals::EngineLoad>()?;
    m.add_class::<signals::FleetSignals>()?;
    m.add_class::<signals::WorkerSignals>()?;
    m.add_class::<signals::SyncOutcome>()?;
    m.add_class::<pair::PairRouter>()?;
    m.add_class::<pair::PairDecision>()?;
    m.add_class::<pair::Leg>()?;
    m.add_class::<hasher::PrefixHasher>()?;
    m.add_function(wrap_pyfunction!(hasher::namespace_salt, m)?)?;
    Ok(())
}
