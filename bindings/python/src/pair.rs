//! The Python `PairRouter`: the crate's prefill/decode pair router.

use std::sync::Arc;

use prefix_router::{
    AlwaysSplit, BalancedRouter, ByCost, Error, NeverSplit, PairDecision as CorePair, PdConfig,
    PdRouter, RankLayout, Role, RouteDecision, RouteRequest, Topology,
};
use pyo3::prelude::*;

use crate::ask::{Ask, AskArgs};
use crate::config::{BalancedConfig, invalid};
use crate::errors::OrRaise;
use crate::events::Seqs;
use crate::router::worker_id;
use crate::signals::{FleetSignals, SyncOutcome};

/// The pair router with one of the crate's deciders.
enum Pairs {
    Cost(PdRouter<ByCost>),
    Always(PdRouter<AlwaysSplit>),
    Never(PdRouter<NeverSplit>),
}

macro_rules! each_pair {
    ($pairs:expr, $r:ident => $body:expr) => {
        match $pairs {
            Pairs::Cost($r) => $body,
            Pairs::Always($r) => $body,
            Pairs::Never($r) => $body,
        }
    };
}

impl Pairs {
    fn route(&self, request: &RouteRequest<'_>) -> Result<CorePair, Error> {
        each_pair!(self, r => r.route_pair(request))
    }
    fn router(&self) -> &BalancedRouter {
        each_pair!(self, r => r.router())
    }
    fn role(&self, worker: prefix_router::WorkerId) -> Option<Role> {
        each_pair!(self, r => r.role(worker))
    }
    fn prefill_done(&self, p: &CorePair) {
        each_pair!(self, r => r.prefill_done(p))
    }
    fn first_token(&self, p: &CorePair, after: Option<std::time::Duration>) {
        match after {
            Some(t) => each_pair!(self, r => r.first_token_after(p, t)),
            None => each_pair!(self, r => r.first_token(p)),
        }
    }
    fn tokens_after(&self, p: &CorePair, tokens: u32, t: std::time::Duration) {
        each_pair!(self, r => r.tokens_after(p, tokens, t))
    }
    fn complete(&self, p: &CorePair) {
        each_pair!(self, r => r.complete(p))
    }
}

/// One side of a pair: where it runs and what was predicted of it.
#[pyclass(frozen, get_all, module = "prefix_router")]
pub(crate) struct Leg {
    worker: u32,
    rank: u32,
    prompt_tokens: usize,
    cached_tokens: usize,
    prefill_tokens: usize,
    predicted_ttft_s: f64,
    predicted_tpot_s: f64,
}

impl Leg {
    fn of(d: &RouteDecision) -> Self {
        Self {
            worker: d.worker().get(),
            rank: d.rank(),
            prompt_tokens: d.prompt_tokens(),
            cached_tokens: d.cached_tokens(),
            prefill_tokens: d.prefill_tokens(),
            predicted_ttft_s: d.predicted_ttft_s(),
            predicted_tpot_s: d.predicted_tpot_s(),
        }
    }
}

#[pymethods]
impl Leg {
    fn __repr__(&self) -> String {
        format!(
            "Leg(worker={}, cached_tokens={}, predicted_ttft_s={:.4})",
            self.worker, self.cached_tokens, self.predicted_ttft_s
        )
    }
}

/// A request routed to a pair (prefill apart) or aggregated on its decode worker.
#[pyclass(frozen, module = "prefix_router")]
pub(crate) struct PairDecision {
    inner: CorePair,
    owner: Arc<Pairs>,
}

impl PairDecision {
    fn of<'a>(&'a self, owner: &Arc<Pairs>) -> PyResult<&'a CorePair> {
        if Arc::ptr_eq(&self.owner, owner) {
            Ok(&self.inner)
        } else {
            Err(invalid(
                "pair",
                "routed by another pair router",
                "a pair this router routed",
            ))
        }
    }
}

#[pymethods]
impl PairDecision {
    /// The decode side (where the answer streams from).
    #[getter]
    fn decode(&self) -> Leg {
        Leg::of(self.inner.decode())
    }
    /// The prefill side, when the prompt is prefilled apart; `None` when aggregated.
    #[getter]
    fn prefill(&self) -> Option<Leg> {
        self.inner.prefill().map(Leg::of)
    }
    #[getter]
    fn is_split(&self) -> bool {
        self.inner.is_split()
    }
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }
    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, pyo3::types::PyTuple>) {
        self.owner.complete(&self.inner);
    }
    fn __repr__(&self) -> String {
        format!(
            "PairDecision(decode={}, prefill={:?}, is_split={})",
            self.inner.decode().worker().get(),
            self.inner.prefill().map(|p| p.worker().get()),
            self.inner.is_split()
        )
    }
}

/// Routes requests on a prefill/decode fleet to a pair of workers, or aggregated.
#[pyclass(frozen, module = "prefix_router")]
pub(crate) struct PairRouter {
    pairs: Arc<Pairs>,
    seqs: Seqs,
}

#[pymethods]
impl PairRouter {
    #[new]
    #[pyo3(signature = (roles, *, block_size=16, kv_bytes_per_token=131_072, bandwidth_bytes_per_s=None, decider="cost", balanced=None, load=None))]
    fn new(
        roles: Vec<String>,
        block_size: usize,
        kv_bytes_per_token: u64,
        bandwidth_bytes_per_s: Option<f64>,
        decider: &str,
        balanced: Option<BalancedConfig>,
        load: Option<crate::config::LoadConfig>,
    ) -> PyResult<Self> {
        let roles = roles
            .iter()
            .map(|r| Role::parse(r).or_raise())
            .collect::<PyResult<Vec<_>>>()?;
        let mut config = PdConfig::default();
        let mut b = balanced.map_or(config.balanced, |b| b.0);
        if let Some(l) = load {
            // The pair router compares workers part-way through long prefills.
            b.load = l.0.with_prefill_from_report(true);
        }
        b.index.block_size = block_size;
        config = config
            .with_balanced(b)
            .with_kv_bytes_per_token(kv_bytes_per_token);
        if let Some(bw) = bandwidth_bytes_per_s {
            config = config.with_topology(Topology::new(bw));
        }
        let pairs = match decider {
            "cost" => Pairs::Cost(PdRouter::new(&roles, config).or_raise()?),
            "always" => {
                Pairs::Always(PdRouter::with_decider(&roles, config, AlwaysSplit).or_raise()?)
            }
            "never" => Pairs::Never(PdRouter::with_decider(&roles, config, NeverSplit).or_raise()?),
            other => return Err(invalid("decider", other, "cost, always or never")),
        };
        Ok(Self {
            pairs: Arc::new(pairs),
            seqs: Seqs::default(),
        })
    }

    /// Routes a request to a decode worker, prefilled there or on a prefill worker.
    #[pyo3(signature = (tokens, *, salt=None, lora=None, cache_salt=None, session=None, ttft_target_s=None, tpot_target_s=None, priority=None, expected_output=None, now_s=None, ttft_target=None, tpot_target=None, now=None))]
    #[allow(clippy::too_many_arguments)]
    fn route(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        salt: Option<Vec<u8>>,
        lora: Option<&str>,
        cache_salt: Option<&str>,
        session: Option<String>,
        ttft_target_s: Option<f64>,
        tpot_target_s: Option<f64>,
        priority: Option<&str>,
        expected_output: Option<u32>,
        now_s: Option<f64>,
        ttft_target: Option<f64>,
        tpot_target: Option<f64>,
        now: Option<f64>,
    ) -> PyResult<PairDecision> {
        let ask = Ask::new(
            tokens,
            AskArgs {
                salt,
                lora,
                cache_salt,
                session,
                ttft_target: (ttft_target_s, ttft_target),
                tpot_target: (tpot_target_s, tpot_target),
                priority,
                expected_output,
                now: (now_s, now),
            },
        )?;
        let pairs = &self.pairs;
        let inner = py.detach(|| pairs.route(&ask.request())).or_raise()?;
        Ok(PairDecision {
            inner,
            owner: Arc::clone(&self.pairs),
        })
    }

    /// The prompt's KV has reached the decode worker: the prefill worker is released.
    fn prefill_done(&self, pair: &Bound<'_, PairDecision>) -> PyResult<()> {
        self.pairs.prefill_done(pair.get().of(&self.pairs)?);
        Ok(())
    }

    /// The first token arrived, `elapsed_s` seconds after the request was forwarded.
    #[pyo3(signature = (pair, elapsed_s=None, *, elapsed=None))]
    fn first_token(
        &self,
        py: Python<'_>,
        pair: &Bound<'_, PairDecision>,
        elapsed_s: Option<f64>,
        elapsed: Option<f64>,
    ) -> PyResult<()> {
        let after = crate::signals::elapsed_arg(py, elapsed_s, elapsed)?;
        self.pairs.first_token(pair.get().of(&self.pairs)?, after);
        Ok(())
    }

    /// `tokens` output tokens came `elapsed_s` seconds after the first.
    #[pyo3(signature = (pair, tokens, elapsed_s=None, *, elapsed=None))]
    fn tokens_after(
        &self,
        py: Python<'_>,
        pair: &Bound<'_, PairDecision>,
        tokens: u32,
        elapsed_s: Option<f64>,
        elapsed: Option<f64>,
    ) -> PyResult<()> {
        let t = crate::signals::required_elapsed_arg(py, elapsed_s, elapsed)?;
        self.pairs
            .tokens_after(pair.get().of(&self.pairs)?, tokens, t);
        Ok(())
    }

    /// Releases both sides' load (a no-op the second time).
    fn complete(&self, pair: &Bound<'_, PairDecision>) -> PyResult<()> {
        self.pairs.complete(pair.get().of(&self.pairs)?);
        Ok(())
    }

    /// A worker's role: `prefill`, `decode` or `both`.
    fn role(&self, worker: i64) -> PyResult<&'static str> {
        let w = worker_id(worker)?;
        self.pairs.role(w).map(Role::name).ok_or_else(|| {
            Python::attach(|py| crate::errors::exception(py, &Error::UnknownWorker(w)))
        })
    }

    /// What an autoscaler needs of the fleet, in one snapshot.
    fn fleet_signals(&self) -> FleetSignals {
        use prefix_router::Router as _;
        FleetSignals::of(&self.pairs.router().fleet_signals())
    }

    /// Applies one batch of vLLM's KV events from the engine at `worker` (`seq`: the
    /// message's sequence number; without it, the worker's previous one plus one).
    #[pyo3(signature = (worker, payload, seq=None))]
    fn apply_vllm_events(
        &self,
        py: Python<'_>,
        worker: u32,
        payload: &[u8],
        seq: Option<u64>,
    ) -> PyResult<SyncOutcome> {
        let router = self.pairs.router();
        crate::events::apply(
            py,
            router,
            RankLayout::default(),
            &self.seqs,
            worker,
            payload,
            seq,
        )
    }
}
