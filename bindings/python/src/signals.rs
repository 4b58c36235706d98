//! What the router reads from engines and reports back: [`EngineLoad`] in,
//! [`FleetSignals`] and [`SyncOutcome`] out.

use prefix_router as core;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::config::{invalid, seconds};
use crate::errors::OrRaise;

/// What a worker's engine reported (its metrics endpoint).
#[pyclass(frozen, from_py_object, module = "prefix_router")]
#[derive(Clone, Copy)]
pub(crate) struct EngineLoad(pub(crate) core::EngineLoad);

#[pymethods]
impl EngineLoad {
    #[new]
    #[pyo3(signature = (*, waiting, running, measured_at_s, kv_usage=None, prefill_tokens=None))]
    fn new(
        waiting: u64,
        running: u64,
        measured_at_s: f64,
        kv_usage: Option<f64>,
        prefill_tokens: Option<u64>,
    ) -> PyResult<Self> {
        let mut l =
            core::EngineLoad::new(waiting, running, seconds("measured_at_s", measured_at_s)?);
        if let Some(k) = kv_usage {
            l = l.with_kv_usage(k);
        }
        if let Some(p) = prefill_tokens {
            l = l.with_prefill_tokens(p);
        }
        l.validate().or_raise()?;
        Ok(Self(l))
    }
    #[getter]
    fn waiting(&self) -> u64 {
        self.0.waiting
    }
    #[getter]
    fn running(&self) -> u64 {
        self.0.running
    }
    #[getter]
    fn kv_usage(&self) -> f64 {
        self.0.kv_usage
    }
    #[getter]
    fn measured_at_s(&self) -> f64 {
        self.0.measured_at.as_secs_f64()
    }
    #[getter]
    fn prefill_tokens(&self) -> Option<u64> {
        self.0.prefill_tokens
    }
    fn __repr__(&self) -> String {
        format!("{:?}", self.0)
    }
}

/// One worker's signals.
#[pyclass(frozen, get_all, module = "prefix_router")]
#[derive(Clone)]
pub(crate) struct WorkerSignals {
    worker: u32,
    available: bool,
    wait_s: f64,
    kv_usage: f64,
    requests: u64,
    routed: u64,
    prompt_tokens: u64,
    captured_tokens: u64,
    available_tokens: u64,
}

#[pymethods]
impl WorkerSignals {
    fn __repr__(&self) -> String {
        format!(
            "WorkerSignals(worker={}, available={}, requests={}, routed={}, wait_s={:.4}, kv_usage={:.3})",
            self.worker, self.available, self.requests, self.routed, self.wait_s, self.kv_usage
        )
    }
}

/// What an autoscaler needs of the fleet, in one snapshot.
#[pyclass(frozen, module = "prefix_router")]
pub(crate) struct FleetSignals {
    #[pyo3(get)]
    at_s: f64,
    #[pyo3(get)]
    workers: Vec<WorkerSignals>,
    #[pyo3(get)]
    routed: u64,
    #[pyo3(get)]
    prompt_tokens: u64,
    #[pyo3(get)]
    captured_tokens: u64,
    #[pyo3(get)]
    uncached_tokens: u64,
    #[pyo3(get)]
    predicted_hit_ratio: f64,
    #[pyo3(get)]
    shed: u64,
    by_limit: [u64; 5],
    by_priority: [u64; 3],
    by_gate: [u64; 4],
}

impl FleetSignals {
    pub(crate) fn of(s: &core::FleetSignals) -> Self {
        Self {
            at_s: s.at.as_secs_f64(),
            workers: s
                .workers
                .iter()
                .map(|w| WorkerSignals {
                    worker: w.worker.get(),
                    available: w.available,
                    wait_s: w.wait_s,
                    kv_usage: w.kv_usage,
                    requests: w.requests,
                    routed: w.routed,
                    prompt_tokens: w.prompt_tokens,
                    captured_tokens: w.captured_tokens,
                    available_tokens: w.available_tokens,
                })
                .collect(),
            routed: s.routed(),
            prompt_tokens: s.prompt_tokens(),
            captured_tokens: s.captured_tokens(),
            uncached_tokens: s.uncached_tokens(),
            predicted_hit_ratio: s.predicted_hit_ratio(),
            shed: s.shed(),
            by_limit: s.shed_by_limit,
            by_priority: s.shed_by_priority,
            by_gate: s.shed_by_gate,
        }
    }
}

/// A dict of `names` to `values`, in order.
fn counts<'py, const N: usize>(
    py: Python<'py>,
    names: impl Iterator<Item = &'static str>,
    values: [u64; N],
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (name, n) in names.zip(values) {
        d.set_item(name, n)?;
    }
    Ok(d)
}

#[pymethods]
impl FleetSignals {
    /// Refusals by what bound them (`queue`, `kv`, `decode`, `prompt`, `stale`).
    #[getter]
    fn shed_by_limit<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        counts(py, core::LIMITS.iter().map(|l| l.name()), self.by_limit)
    }
    /// Refusals by priority (`sheddable`, `standard`, `critical`).
    #[getter]
    fn shed_by_priority<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        counts(
            py,
            core::Priority::ALL.iter().map(|p| p.name()),
            self.by_priority,
        )
    }
    /// Refusals by the gate that refused them (`model`, `prompt`, `prefill_window`,
    /// `decode_bound`).
    #[getter]
    fn shed_by_gate<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        counts(py, core::GATES.iter().map(|g| g.name()), self.by_gate)
    }
    fn __repr__(&self) -> String {
        format!(
            "FleetSignals(at_s={}, workers={}, routed={}, predicted_hit_ratio={:.3}, shed={})",
            self.at_s,
            self.workers.len(),
            self.routed,
            self.predicted_hit_ratio,
            self.shed
        )
    }
}

/// What applying events did, summed over a batch's events.
#[pyclass(frozen, get_all, module = "prefix_router")]
pub(crate) struct SyncOutcome {
    sequence: &'static str,
    expected_seq: Option<u64>,
    stored_blocks: usize,
    removed_blocks: usize,
    duplicate_blocks: usize,
    unknown_parent_blocks: usize,
    unknown_removed_blocks: usize,
    unknown_blocks: usize,
    settings_conflicts: usize,
    skipped_blocks: usize,
}

impl SyncOutcome {
    pub(crate) fn of(o: &core::SyncOutcome) -> Self {
        let (sequence, expected_seq) = match o.sequence {
            core::Sequence::Gap { expected, .. } => ("gap", Some(expected)),
            core::Sequence::Restart { .. } => ("restart", None),
            _ => ("in_order", None),
        };
        Self {
            sequence,
            expected_seq,
            stored_blocks: o.stored_blocks,
            removed_blocks: o.removed_blocks,
            duplicate_blocks: o.duplicate_blocks,
            unknown_parent_blocks: o.unknown_parent_blocks,
            unknown_removed_blocks: o.unknown_removed_blocks,
            unknown_blocks: o.unknown_blocks,
            settings_conflicts: o.settings_conflicts,
            skipped_blocks: o.skipped_blocks,
        }
    }
}

#[pymethods]
impl SyncOutcome {
    fn __repr__(&self) -> String {
        format!(
            "SyncOutcome(sequence={:?}, stored_blocks={}, removed_blocks={}, duplicate_blocks={})",
            self.sequence, self.stored_blocks, self.removed_blocks, self.duplicate_blocks
        )
    }
}

/// A count of seconds from Python, checked.
pub(crate) fn elapsed(s: f64) -> PyResult<std::time::Duration> {
    if s.is_finite() && s >= 0.0 {
        seconds("elapsed_s", s)
    } else {
        Err(invalid("elapsed_s", &s.to_string(), "seconds, 0 or more"))
    }
}

/// A report's `elapsed_s` (or, with a `DeprecationWarning`, its former name `elapsed`) as a
/// duration; `None` when neither is given.
pub(crate) fn elapsed_arg(
    py: Python<'_>,
    elapsed_s: Option<f64>,
    elapsed: Option<f64>,
) -> PyResult<Option<std::time::Duration>> {
    crate::config::renamed(py, ("elapsed_s", elapsed_s), ("elapsed", elapsed))?
        .map(self::elapsed)
        .transpose()
}

/// [`elapsed_arg`], which a progress report must give.
pub(crate) fn required_elapsed_arg(
    py: Python<'_>,
    elapsed_s: Option<f64>,
    elapsed: Option<f64>,
) -> PyResult<std::time::Duration> {
    elapsed_arg(py, elapsed_s, elapsed)?.ok_or_else(|| {
        crate::config::invalid("elapsed_s", "missing", "seconds since the first token")
    })
}
