//! The crate's [`Error`] as a Python exception: one class per kind, defined in
//! `prefix_router/_errors.py` (so that each can also derive from the built-in exception a
//! caller catches, which a class made in Rust cannot), with the error's figures as
//! attributes. Looked up only when an error is raised.

use prefix_router::{Error, Shed};
use pyo3::IntoPyObjectExt;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// The time the crate holds a request without a target to, in a [`Shed`]: shown as `None`.
const NO_TARGET_S: f64 = 1e9;

/// A crate result as a Python one.
pub(crate) trait OrRaise<T> {
    /// The value, or the error as its exception.
    fn or_raise(self) -> PyResult<T>;
}

impl<T> OrRaise<T> for Result<T, Error> {
    fn or_raise(self) -> PyResult<T> {
        self.map_err(|e| Python::attach(|py| exception(py, &e)))
    }
}

/// An attribute's name and value.
type Attr<'py> = (&'static str, Bound<'py, PyAny>);

/// `error` as an instance of its class in `prefix_router._errors`.
pub(crate) fn exception(py: Python<'_>, error: &Error) -> PyErr {
    build(py, error).unwrap_or_else(|failed| {
        PyRuntimeError::new_err(format!("{error} (raising it failed: {failed})"))
    })
}

fn build(py: Python<'_>, error: &Error) -> PyResult<PyErr> {
    let (class, attrs) = class_of(py, error)?;
    raise(py, class, &error.to_string(), attrs)
}

/// An instance of `class` (of `prefix_router._errors`) with `message` and `attrs`.
fn raise(py: Python<'_>, class: &str, message: &str, attrs: Vec<Attr<'_>>) -> PyResult<PyErr> {
    let module = py.import("prefix_router._errors")?;
    let instance = module.getattr(class)?.call1((message,))?;
    for (name, value) in attrs {
        instance.setattr(name, value)?;
    }
    Ok(PyErr::from_value(instance))
}

/// The package's `InvalidTokens`: token IDs that are not `u32`s, or not one-dimensional.
pub(crate) fn invalid_tokens(message: String) -> PyErr {
    Python::attach(|py| {
        raise(py, "InvalidTokens", &message, Vec::new())
            .unwrap_or_else(|failed| PyRuntimeError::new_err(format!("{message} ({failed})")))
    })
}

/// The class's name and the attributes of `error`.
fn class_of<'py>(py: Python<'py>, error: &Error) -> PyResult<(&'static str, Vec<Attr<'py>>)> {
    let attr = |name: &'static str, v: Bound<'py, PyAny>| (name, v);
    Ok(match error {
        Error::InvalidBlockSize { block_size, max } => (
            "InvalidBlockSize",
            vec![
                attr("block_size", block_size.into_bound_py_any(py)?),
                attr("max", max.into_bound_py_any(py)?),
            ],
        ),
        Error::InvalidConfig {
            field,
            value,
            allowed,
        } => (
            "InvalidConfig",
            vec![
                attr("field", field.into_bound_py_any(py)?),
                attr("value", value.into_bound_py_any(py)?),
                attr("allowed", allowed.into_bound_py_any(py)?),
            ],
        ),
        Error::WorkerOutOfRange { worker, limit } => (
            "WorkerOutOfRange",
            vec![
                attr("worker", worker.into_bound_py_any(py)?),
                attr("limit", limit.into_bound_py_any(py)?),
            ],
        ),
        Error::UnknownWorker(w) => (
            "UnknownWorker",
            vec![attr("worker", w.get().into_bound_py_any(py)?)],
        ),
        Error::WorkerExists(w) => (
            "WorkerExists",
            vec![attr("worker", w.get().into_bound_py_any(py)?)],
        ),
        Error::BlockSizeMismatch { engine, router } => (
            "BlockSizeMismatch",
            vec![
                attr("engine", engine.into_bound_py_any(py)?),
                attr("router", router.into_bound_py_any(py)?),
            ],
        ),
        Error::InvalidEvent(_) => ("InvalidEvent", Vec::new()),
        Error::Decode(_) => ("DecodeError", Vec::new()),
        Error::InvalidRank { rank, ranks } => (
            "InvalidRank",
            vec![
                attr("rank", rank.into_bound_py_any(py)?),
                attr("ranks", ranks.into_bound_py_any(py)?),
            ],
        ),
        Error::WrongRole {
            worker,
            role,
            wanted,
        } => (
            "WrongRole",
            vec![
                attr("worker", worker.get().into_bound_py_any(py)?),
                attr("role", role.into_bound_py_any(py)?),
                attr("wanted", wanted.into_bound_py_any(py)?),
            ],
        ),
        Error::ReplicaVersion { .. } | Error::ReplicaLimit { .. } => {
            ("ReplicaSyncError", Vec::new())
        }
        Error::NoWorkers => ("NoWorkers", Vec::new()),
        Error::Shed(shed) => ("Shed", shed_attrs(py, shed)?),
        _ => ("PrefixRouterError", Vec::new()),
    })
}

/// A refusal's figures, in seconds; a target the crate holds as "none" is `None`.
fn shed_attrs<'py>(py: Python<'py>, shed: &Shed) -> PyResult<Vec<Attr<'py>>> {
    let target = shed.target.as_secs_f64();
    let target = (target < NO_TARGET_S).then_some(target);
    Ok(vec![
        ("priority", shed.priority.name().into_bound_py_any(py)?),
        ("limit", shed.limit.name().into_bound_py_any(py)?),
        ("target_s", target.into_bound_py_any(py)?),
        (
            "tpot_target_s",
            shed.tpot_target
                .map(|t| t.as_secs_f64())
                .into_bound_py_any(py)?,
        ),
        (
            "best_ttft_s",
            shed.best_ttft.as_secs_f64().into_bound_py_any(py)?,
        ),
        (
            "best_tpot_s",
            shed.best_tpot.as_secs_f64().into_bound_py_any(py)?,
        ),
        ("best_worker", shed.best_worker.get().into_bound_py_any(py)?),
        ("gate", shed.gate.name().into_bound_py_any(py)?),
        (
            "measured_s",
            shed.measured.as_secs_f64().into_bound_py_any(py)?,
        ),
        (
            "threshold_s",
            shed.threshold.as_secs_f64().into_bound_py_any(py)?,
        ),
        (
            "retry_after_s",
            shed.retry_after
                .map(|t| t.as_secs_f64())
                .into_bound_py_any(py)?,
        ),
        // The name before `retry_after_s`, kept for hosts that read it.
        (
            "retry_after",
            shed.retry_after
                .map(|t| t.as_secs_f64())
                .into_bound_py_any(py)?,
        ),
    ])
}
