//! The crate's settings as Python classes: built with keyword arguments, immutable, and
//! checked by the crate's own `validate` when a router is made from them.

use std::time::Duration;

use prefix_router as core;
use pyo3::prelude::*;

use crate::errors::OrRaise;

/// The engine's step model the predictions use (vLLM's scheduler terms).
#[pyclass(frozen, from_py_object, module = "prefix_router")]
#[derive(Clone, Copy)]
pub(crate) struct StepModel(pub(crate) core::StepModel);

#[pymethods]
impl StepModel {
    #[new]
    #[pyo3(signature = (
        *,
        max_num_batched_tokens = core::StepModel::default().max_num_batched_tokens,
        max_num_seqs = core::StepModel::default().max_num_seqs,
        step_base_s = core::StepModel::default().step_base_s,
        step_s_per_decode = core::StepModel::default().step_s_per_decode,
        step_s_per_context_token = core::StepModel::default().step_s_per_context_token,
    ))]
    fn new(
        max_num_batched_tokens: usize,
        max_num_seqs: usize,
        step_base_s: f64,
        step_s_per_decode: f64,
        step_s_per_context_token: f64,
    ) -> Self {
        Self(
            core::StepModel::default()
                .with_max_num_batched_tokens(max_num_batched_tokens)
                .with_max_num_seqs(max_num_seqs)
                .with_step_base_s(step_base_s)
                .with_step_s_per_decode(step_s_per_decode)
                .with_step_s_per_context_token(step_s_per_context_token),
        )
    }
    #[getter]
    fn max_num_batched_tokens(&self) -> usize {
        self.0.max_num_batched_tokens
    }
    #[getter]
    fn max_num_seqs(&self) -> usize {
        self.0.max_num_seqs
    }
    #[getter]
    fn step_base_s(&self) -> f64 {
        self.0.step_base_s
    }
    #[getter]
    fn step_s_per_decode(&self) -> f64 {
        self.0.step_s_per_decode
    }
    #[getter]
    fn step_s_per_context_token(&self) -> f64 {
        self.0.step_s_per_context_token
    }
    fn __repr__(&self) -> String {
        format!("{:?}", self.0)
    }
}

/// How admission treats priorities.
#[pyclass(frozen, from_py_object, module = "prefix_router")]
#[derive(Clone, Copy)]
pub(crate) struct AdmissionConfig(pub(crate) core::AdmissionConfig);

#[pymethods]
impl AdmissionConfig {
    #[new]
    #[pyo3(signature = (
        *,
        sheddable_share = core::AdmissionConfig::default().sheddable_share,
        oversized_wait_share = core::AdmissionConfig::default().oversized_wait_share,
        initial_decode_window = core::AdmissionConfig::default().initial_decode_window,
    ))]
    fn new(
        sheddable_share: f64,
        oversized_wait_share: f64,
        initial_decode_window: u32,
    ) -> PyResult<Self> {
        let c = core::AdmissionConfig::default()
            .with_sheddable_share(sheddable_share)
            .with_oversized_wait_share(oversized_wait_share)
            .with_initial_decode_window(initial_decode_window);
        c.validate().or_raise()?;
        Ok(Self(c))
    }
    #[getter]
    fn sheddable_share(&self) -> f64 {
        self.0.sheddable_share
    }
    #[getter]
    fn oversized_wait_share(&self) -> f64 {
        self.0.oversized_wait_share
    }
    #[getter]
    fn initial_decode_window(&self) -> u32 {
        self.0.initial_decode_window
    }
    fn __repr__(&self) -> String {
        format!("{:?}", self.0)
    }
}

/// How a router reads and predicts load.
#[pyclass(frozen, from_py_object, module = "prefix_router")]
#[derive(Clone, Copy)]
pub(crate) struct LoadConfig(pub(crate) core::LoadConfig);

#[pymethods]
impl LoadConfig {
    #[new]
    #[pyo3(signature = (
        *,
        prefill_tokens_per_s = core::LoadConfig::default().prefill_tokens_per_s,
        default_output_tokens = core::LoadConfig::default().default_output_tokens,
        learning_rate = core::LoadConfig::default().learning_rate,
        max_report_age_s = core::LoadConfig::default().max_report_age.as_secs_f64(),
        replicas = core::LoadConfig::default().replicas,
        step = None,
        admission = None,
        busy_horizon_s = core::LoadConfig::default().busy_horizon.as_secs_f64(),
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        prefill_tokens_per_s: f64,
        default_output_tokens: u32,
        learning_rate: f64,
        max_report_age_s: f64,
        replicas: u32,
        step: Option<StepModel>,
        admission: Option<AdmissionConfig>,
        busy_horizon_s: f64,
    ) -> PyResult<Self> {
        let age = seconds("max_report_age_s", max_report_age_s)?;
        let busy = seconds("busy_horizon_s", busy_horizon_s)?;
        let mut c = core::LoadConfig::default()
            .with_prefill_tokens_per_s(prefill_tokens_per_s)
            .with_default_output_tokens(default_output_tokens)
            .with_learning_rate(learning_rate)
            .with_max_report_age(age)
            .with_replicas(replicas)
            .with_busy_horizon(busy);
        if let Some(s) = step {
            c = c.with_step(s.0);
        }
        if let Some(a) = admission {
            c = c.with_admission(a.0);
        }
        c.validate().or_raise()?;
        Ok(Self(c))
    }
    #[getter]
    fn prefill_tokens_per_s(&self) -> f64 {
        self.0.prefill_tokens_per_s
    }
    #[getter]
    fn default_output_tokens(&self) -> u32 {
        self.0.default_output_tokens
    }
    #[getter]
    fn learning_rate(&self) -> f64 {
        self.0.learning_rate
    }
    #[getter]
    fn max_report_age_s(&self) -> f64 {
        self.0.max_report_age.as_secs_f64()
    }
    #[getter]
    fn replicas(&self) -> u32 {
        self.0.replicas
    }
    #[getter]
    fn busy_horizon_s(&self) -> f64 {
        self.0.busy_horizon.as_secs_f64()
    }
    #[getter]
    fn step(&self) -> StepModel {
        StepModel(self.0.step)
    }
    #[getter]
    fn admission(&self) -> AdmissionConfig {
        AdmissionConfig(self.0.admission)
    }
    fn __repr__(&self) -> String {
        format!("{:?}", self.0)
    }
}

/// How `BalancedRouter` weighs cache against load.
#[pyclass(frozen, from_py_object, module = "prefix_router")]
#[derive(Clone, Copy)]
pub(crate) struct BalancedConfig(pub(crate) core::BalancedConfig);

/// The weight a miss reaches on a busy fleet by default.
fn default_miss_weight_max() -> f64 {
    match core::MissWeight::default() {
        core::MissWeight::Fleet { max } => max,
        core::MissWeight::Fixed(w) => w,
        _ => 1.0,
    }
}

#[pymethods]
impl BalancedConfig {
    /// `miss_weight` fixes the weight of a recomputed token; without it the weight follows
    /// the fleet's load, from 1 on an idle fleet to `miss_weight_max` once every worker is
    /// busy (`LoadConfig.busy_horizon_s`).
    #[new]
    #[pyo3(signature = (
        *,
        alpha = core::BalancedConfig::default().alpha,
        scoring = "predicted_ttft",
        miss_weight = None,
        miss_weight_max = default_miss_weight_max(),
    ))]
    fn new(
        alpha: f64,
        scoring: &str,
        miss_weight: Option<f64>,
        miss_weight_max: f64,
    ) -> PyResult<Self> {
        let scoring = match scoring {
            "predicted_ttft" => core::Scoring::PredictedTtft,
            "weighted" => core::Scoring::Weighted,
            other => return Err(invalid("scoring", other, "predicted_ttft or weighted")),
        };
        let weight = match miss_weight {
            Some(w) => core::MissWeight::Fixed(w),
            None => core::MissWeight::Fleet {
                max: miss_weight_max,
            },
        };
        let c = core::BalancedConfig::default()
            .with_alpha(alpha)
            .with_scoring(scoring)
            .with_miss_weight(weight);
        c.validate().or_raise()?;
        Ok(Self(c))
    }
    #[getter]
    fn alpha(&self) -> f64 {
        self.0.alpha
    }
    #[getter]
    fn scoring(&self) -> &'static str {
        match self.0.scoring {
            core::Scoring::Weighted => "weighted",
            _ => "predicted_ttft",
        }
    }
    /// The fixed weight of a miss; `None` when it follows the fleet's load.
    #[getter]
    fn miss_weight(&self) -> Option<f64> {
        match self.0.miss_weight {
            core::MissWeight::Fixed(w) => Some(w),
            _ => None,
        }
    }
    /// The weight a miss reaches once the fleet is busy; the fixed weight when fixed.
    #[getter]
    fn miss_weight_max(&self) -> f64 {
        match self.0.miss_weight {
            core::MissWeight::Fleet { max } => max,
            core::MissWeight::Fixed(w) => w,
            _ => f64::NAN,
        }
    }
    fn __repr__(&self) -> String {
        format!(
            "BalancedConfig(alpha={}, scoring={:?}, miss_weight={:?})",
            self.0.alpha,
            self.scoring(),
            self.0.miss_weight
        )
    }
}

/// SGLang's cache-aware policy's thresholds.
#[pyclass(frozen, from_py_object, module = "prefix_router")]
#[derive(Clone, Copy)]
pub(crate) struct CacheAwareConfig(pub(crate) core::CacheAwareConfig);

#[pymethods]
impl CacheAwareConfig {
    #[new]
    #[pyo3(signature = (
        *,
        cache_threshold = core::CacheAwareConfig::default().cache_threshold,
        balance_abs_threshold = core::CacheAwareConfig::default().balance_abs_threshold,
        balance_rel_threshold = core::CacheAwareConfig::default().balance_rel_threshold,
    ))]
    fn new(
        cache_threshold: f64,
        balance_abs_threshold: u64,
        balance_rel_threshold: f64,
    ) -> PyResult<Self> {
        let mut c = core::CacheAwareConfig::default();
        c.cache_threshold = cache_threshold;
        c.balance_abs_threshold = balance_abs_threshold;
        c.balance_rel_threshold = balance_rel_threshold;
        c.validate().or_raise()?;
        Ok(Self(c))
    }
    #[getter]
    fn cache_threshold(&self) -> f64 {
        self.0.cache_threshold
    }
    #[getter]
    fn balance_abs_threshold(&self) -> u64 {
        self.0.balance_abs_threshold
    }
    #[getter]
    fn balance_rel_threshold(&self) -> f64 {
        self.0.balance_rel_threshold
    }
    fn __repr__(&self) -> String {
        format!("{:?}", self.0)
    }
}

/// The crate's `InvalidConfig` error for `field`.
pub(crate) fn invalid(field: &'static str, value: &str, allowed: &'static str) -> PyErr {
    Python::attach(|py| {
        crate::errors::exception(
            py,
            &core::Error::InvalidConfig {
                field,
                value: value.to_owned(),
                allowed,
            },
        )
    })
}

/// Seconds as a [`Duration`], or `InvalidConfig` naming `field`.
pub(crate) fn seconds(field: &'static str, s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s).map_err(|_| invalid(field, &s.to_string(), "seconds, 0 or more"))
}

/// A keyword argument renamed to say its unit: the value under the new name, or under the
/// old one with a `DeprecationWarning`. Both given is an `InvalidConfig` error.
pub(crate) fn renamed<T>(
    py: Python<'_>,
    (name, value): (&'static str, Option<T>),
    (old_name, old): (&'static str, Option<T>),
) -> PyResult<Option<T>> {
    match (value, old) {
        (Some(_), Some(_)) => Err(invalid(name, old_name, "one name, not both")),
        (None, Some(old)) => {
            let message =
                std::ffi::CString::new(format!("{old_name}= is deprecated: use {name}= (seconds)"))
                    .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
            let category = py.get_type::<pyo3::exceptions::PyDeprecationWarning>();
            PyErr::warn(py, &category, &message, 1)?;
            Ok(Some(old))
        }
        (value, None) => Ok(value),
    }
}
