//! What `route()` gives back: a [`Decision`] (one charge of load, completed once, usable as
//! a context manager) and, when asked, its [`Explanation`].

use std::sync::Arc;

use prefix_router::{Receipt, RouteDecision, Tier};
use pyo3::prelude::*;

use crate::config::invalid;
use crate::shared::Shared;

/// Where a request went, what was predicted of it; one charge of load on the router that
/// made it.
#[pyclass(frozen, module = "prefix_router")]
pub(crate) struct Decision {
    pub(crate) inner: RouteDecision,
    /// The router that charged it: only it may complete it.
    pub(crate) owner: Arc<Shared>,
    pub(crate) endpoint: u32,
    pub(crate) explanation: Option<Py<Explanation>>,
}

impl Decision {
    /// The decision, if `owner` made it.
    pub(crate) fn of<'a>(&'a self, owner: &Arc<Shared>) -> PyResult<&'a RouteDecision> {
        if Arc::ptr_eq(&self.owner, owner) {
            Ok(&self.inner)
        } else {
            Err(invalid(
                "decision",
                "routed by another router",
                "a decision of this router",
            ))
        }
    }
}

#[pymethods]
impl Decision {
    /// The routing target (endpoint and rank together).
    #[getter]
    fn worker(&self) -> u32 {
        self.inner.worker().get()
    }
    #[getter]
    fn rank(&self) -> u32 {
        self.inner.rank()
    }
    #[getter]
    fn endpoint(&self) -> u32 {
        self.endpoint
    }
    #[getter]
    fn prompt_tokens(&self) -> usize {
        self.inner.prompt_tokens()
    }
    #[getter]
    fn cached_tokens(&self) -> usize {
        self.inner.cached_tokens()
    }
    #[getter]
    fn prefill_tokens(&self) -> usize {
        self.inner.prefill_tokens()
    }
    #[getter]
    fn predicted_ttft_s(&self) -> f64 {
        self.inner.predicted_ttft_s()
    }
    #[getter]
    fn predicted_tpot_s(&self) -> f64 {
        self.inner.predicted_tpot_s()
    }
    #[getter]
    fn completed(&self) -> bool {
        self.inner.is_completed()
    }
    #[getter]
    fn explanation(&self, py: Python<'_>) -> Option<Py<Explanation>> {
        self.explanation.as_ref().map(|e| e.clone_ref(py))
    }
    /// Cached tokens on one storage tier (`device`, `host`, `disk` or `remote`).
    fn cached_tokens_at(&self, tier: &str) -> PyResult<usize> {
        Ok(self.inner.cached_tokens_at(tier_named(tier)?))
    }
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }
    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, pyo3::types::PyTuple>) {
        self.owner.routers.router().complete(&self.inner);
    }
    fn __repr__(&self) -> String {
        format!(
            "Decision(worker={}, rank={}, cached_tokens={}, prompt_tokens={}, predicted_ttft_s={:.4}, predicted_tpot_s={:.5}, completed={})",
            self.worker(),
            self.rank(),
            self.cached_tokens(),
            self.prompt_tokens(),
            self.predicted_ttft_s(),
            self.predicted_tpot_s(),
            self.completed()
        )
    }
}

/// A storage tier by name.
pub(crate) fn tier_named(name: &str) -> PyResult<Tier> {
    match name {
        "device" => Ok(Tier::Device),
        "host" => Ok(Tier::Host),
        "disk" => Ok(Tier::Disk),
        "remote" => Ok(Tier::Remote),
        other => Err(invalid("tier", other, "device, host, disk or remote")),
    }
}

/// One candidate the policy weighed.
#[pyclass(frozen, get_all, module = "prefix_router")]
#[derive(Clone)]
pub(crate) struct Candidate {
    worker: u32,
    requests: u64,
    prefill_tokens: u64,
    /// Cached tokens on every tier together.
    cached_tokens: usize,
    /// The policy's cost terms, in order (empty for a policy that does not cost).
    terms: Vec<(String, f64)>,
    total_cost: Option<f64>,
}

#[pymethods]
impl Candidate {
    /// The cost terms by name.
    #[getter]
    fn cost<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let d = pyo3::types::PyDict::new(py);
        for (name, value) in &self.terms {
            d.set_item(name, value)?;
        }
        Ok(d)
    }
    fn __repr__(&self) -> String {
        format!(
            "Candidate(worker={}, requests={}, prefill_tokens={}, cached_tokens={}, total_cost={:?})",
            self.worker, self.requests, self.prefill_tokens, self.cached_tokens, self.total_cost
        )
    }
}

/// Every candidate the policy saw for one request, and the one it chose.
#[pyclass(frozen, get_all, module = "prefix_router")]
pub(crate) struct Explanation {
    policy: String,
    chosen: u32,
    prompt_tokens: usize,
    candidates: Vec<Candidate>,
    /// The receipt as the crate prints it.
    text: String,
}

impl Explanation {
    pub(crate) fn of(receipt: &Receipt) -> Self {
        let candidates = receipt
            .candidates
            .iter()
            .map(|line| Candidate {
                worker: line.worker.get(),
                requests: line.requests,
                prefill_tokens: line.prefill_tokens,
                cached_tokens: line.cached_tokens.iter().sum(),
                terms: line.cost.as_ref().map_or_else(Vec::new, |c| {
                    c.terms
                        .iter()
                        .map(|t| (t.name.to_owned(), t.value))
                        .collect()
                }),
                total_cost: line.cost.as_ref().map(|c| c.total()),
            })
            .collect();
        Self {
            policy: receipt.policy.to_owned(),
            chosen: receipt.chosen.get(),
            prompt_tokens: receipt.prompt_tokens,
            candidates,
            text: receipt.to_string(),
        }
    }
}

#[pymethods]
impl Explanation {
    fn __str__(&self) -> String {
        self.text.clone()
    }
    fn __repr__(&self) -> String {
        format!(
            "Explanation(policy={:?}, chosen={}, candidates={})",
            self.policy,
            self.chosen,
            self.candidates.len()
        )
    }
}
