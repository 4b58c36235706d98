//! The Python `Router`: one of the crate's policies with its load tracking and mirror.
//! Routing and event application run with the GIL released; the router itself is the
//! crate's, `Send + Sync`, so many Python threads may call it at once.

use std::sync::Arc;

use prefix_router::{
    EngineSettings, GroupKind, HashAlgorithm, IndexConfig, LoadConfig, PrefixHasher, RankLayout,
    WorkerId, WorkerProfile,
};
use pyo3::prelude::*;

use crate::ask::{Ask, AskArgs, salt};
use crate::config::{BalancedConfig, CacheAwareConfig, invalid, renamed};
use crate::decision::{Decision, Explanation};
use crate::errors::OrRaise;
use crate::events::Seqs;
use crate::fleet::{Build, Routers};
use crate::shared::Shared;
use crate::signals::{EngineLoad, FleetSignals, SyncOutcome};

/// A KV-cache group as a host gives it: its index, vLLM's `kv_cache_spec_kind`, its window.
type Group = (u32, Option<String>, Option<u32>);

/// A routing policy with load tracking and a mirror of every worker's prefix cache.
#[pyclass(frozen, module = "prefix_router")]
pub(crate) struct Router {
    shared: Arc<Shared>,
}

/// A worker id from Python.
pub(crate) fn worker_id(w: i64) -> PyResult<WorkerId> {
    u32::try_from(w)
        .map(WorkerId::new)
        .map_err(|_| invalid("worker", &w.to_string(), "a worker id, 0 to 2^32 - 1"))
}

/// The hash algorithm by name.
pub(crate) fn algorithm(name: &str) -> PyResult<HashAlgorithm> {
    match name {
        "xxh3" => Ok(HashAlgorithm::Xxh3),
        "sha256" => Ok(HashAlgorithm::Sha256),
        other => Err(invalid("hash", other, "xxh3 or sha256")),
    }
}

/// The index settings `Router(...)` takes.
struct IndexArgs<'a> {
    block_size: usize,
    hash: &'a str,
    seed: Option<u64>,
    worker_capacity_blocks: Option<usize>,
    max_blocks: Option<usize>,
    ttl: Option<u64>,
    host_chunk_blocks: usize,
    full_reports: bool,
}

impl IndexArgs<'_> {
    fn config(&self) -> PyResult<IndexConfig> {
        let mut tree = IndexConfig::default().tree;
        if let Some(m) = self.max_blocks {
            tree.max_blocks = m;
        }
        let c = IndexConfig::default()
            .with_block_size(self.block_size)
            .with_algorithm(algorithm(self.hash)?)
            .with_seed(self.seed.unwrap_or(PrefixHasher::DEFAULT_SEED))
            .with_tree(tree)
            .with_worker_capacity_blocks(self.worker_capacity_blocks)
            .with_ttl(self.ttl)
            .with_host_chunk_blocks(self.host_chunk_blocks)
            .with_full_reports(self.full_reports);
        c.validate().or_raise()?;
        Ok(c)
    }
}

#[pymethods]
impl Router {
    #[new]
    #[pyo3(signature = (workers, policy="balanced", *, block_size=16, hash="xxh3", seed=None, ranks=1, balanced=None, cache_aware=None, load=None, worker_capacity_blocks=None, max_blocks=None, ttl_routes=None, host_chunk_blocks=1, full_reports=false, ttl=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        workers: u32,
        policy: &str,
        block_size: usize,
        hash: &str,
        seed: Option<u64>,
        ranks: u32,
        balanced: Option<BalancedConfig>,
        cache_aware: Option<CacheAwareConfig>,
        load: Option<crate::config::LoadConfig>,
        worker_capacity_blocks: Option<usize>,
        max_blocks: Option<usize>,
        ttl_routes: Option<u64>,
        host_chunk_blocks: usize,
        full_reports: bool,
        ttl: Option<u64>,
    ) -> PyResult<Self> {
        // What the expiry counts is routes, not seconds: the name says so.
        let ttl = renamed(py, ("ttl_routes", ttl_routes), ("ttl", ttl))?;
        let index = IndexArgs {
            block_size,
            hash,
            seed,
            worker_capacity_blocks,
            max_blocks,
            ttl,
            host_chunk_blocks,
            full_reports,
        }
        .config()?;
        let layout = RankLayout::new(ranks).or_raise()?;
        let build = Build {
            targets: layout.targets(workers),
            layout,
            index,
            load: load.map_or_else(LoadConfig::default, |l| l.0),
            balanced: balanced.map(|b| b.0),
            cache_aware: cache_aware.map(|c| c.0),
        };
        let routers = Routers::build(policy, build).or_raise()?;
        Ok(Self {
            shared: Arc::new(Shared {
                routers,
                seqs: Seqs::default(),
            }),
        })
    }

    /// The policy's name.
    #[getter]
    fn policy(&self) -> &'static str {
        self.shared.routers.router().name()
    }

    /// Tokens per block the mirror hashes.
    #[getter]
    fn block_size(&self) -> usize {
        self.shared.routers.index().hasher().block_size()
    }

    /// Data-parallel ranks per endpoint.
    #[getter]
    fn ranks(&self) -> u32 {
        self.shared.routers.layout().ranks()
    }

    /// The routing target of an endpoint's rank.
    #[pyo3(signature = (endpoint, rank=0))]
    fn target(&self, endpoint: u32, rank: u32) -> PyResult<u32> {
        Ok(self
            .shared
            .routers
            .layout()
            .target(endpoint, rank)
            .or_raise()?
            .get())
    }

    /// Chooses a worker for the request and charges it with the request's load.
    #[pyo3(signature = (tokens, *, salt=None, lora=None, cache_salt=None, session=None, ttft_target_s=None, tpot_target_s=None, priority=None, expected_output=None, now_s=None, ttft_target=None, tpot_target=None, now=None, explain=false))]
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
        explain: bool,
    ) -> PyResult<Decision> {
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
        let router = self.shared.routers.router();
        let (inner, receipt) = py
            .detach(|| {
                if explain {
                    router
                        .route_with_receipt(&ask.request())
                        .map(|(d, r)| (d, Some(r)))
                } else {
                    router.route(&ask.request()).map(|d| (d, None))
                }
            })
            .or_raise()?;
        let explanation = receipt
            .map(|r| Py::new(py, Explanation::of(&r)))
            .transpose()?;
        Ok(Decision {
            endpoint: self.shared.routers.layout().endpoint(inner.worker()),
            inner,
            owner: Arc::clone(&self.shared),
            explanation,
        })
    }

    /// The request's first token arrived, `elapsed_s` seconds after it was forwarded (the
    /// router learns the worker's prefill terms from it).
    #[pyo3(signature = (decision, elapsed_s=None, *, elapsed=None))]
    fn first_token(
        &self,
        py: Python<'_>,
        decision: &Bound<'_, Decision>,
        elapsed_s: Option<f64>,
        elapsed: Option<f64>,
    ) -> PyResult<()> {
        let elapsed = crate::signals::elapsed_arg(py, elapsed_s, elapsed)?;
        let d = decision.get().of(&self.shared)?;
        let router = self.shared.routers.router();
        match elapsed {
            Some(t) => router.first_token_after(d, t),
            None => router.first_token(d),
        }
        Ok(())
    }

    /// The request has generated `tokens` output tokens `elapsed_s` seconds after its first,
    /// both cumulative: report as the stream goes (every 16 tokens, say) and at its end. The
    /// router learns the worker's decode terms and admission's observed step from it;
    /// repeated, reordered or late reports change nothing.
    #[pyo3(signature = (decision, tokens, elapsed_s=None, *, elapsed=None))]
    fn tokens_after(
        &self,
        py: Python<'_>,
        decision: &Bound<'_, Decision>,
        tokens: u32,
        elapsed_s: Option<f64>,
        elapsed: Option<f64>,
    ) -> PyResult<()> {
        let elapsed = crate::signals::required_elapsed_arg(py, elapsed_s, elapsed)?;
        let d = decision.get().of(&self.shared)?;
        self.shared
            .routers
            .router()
            .tokens_after(d, tokens, elapsed);
        Ok(())
    }

    /// Releases the load the decision charged (a no-op the second time).
    fn complete(&self, decision: &Bound<'_, Decision>) -> PyResult<()> {
        let d = decision.get().of(&self.shared)?;
        self.shared.routers.router().complete(d);
        Ok(())
    }

    /// Pushes the load a worker's engine reported.
    fn report_load(&self, worker: i64, load: &EngineLoad) -> PyResult<()> {
        self.shared
            .routers
            .router()
            .report_load(worker_id(worker)?, load.0)
            .or_raise()
    }

    /// Registers a worker (available, idle, with an empty mirror).
    fn add_worker(&self, worker: i64) -> PyResult<()> {
        self.shared
            .routers
            .router()
            .add_worker(worker_id(worker)?)
            .or_raise()
    }

    /// Unregisters a worker and forgets its mirror.
    fn remove_worker(&self, worker: i64) -> PyResult<()> {
        self.shared
            .routers
            .router()
            .remove_worker(worker_id(worker)?)
            .or_raise()
    }

    /// Marks a worker available or not (an unavailable one gets no new requests).
    fn set_available(&self, worker: i64, available: bool) -> PyResult<()> {
        self.shared
            .routers
            .router()
            .set_available(worker_id(worker)?, available)
            .or_raise()
    }

    /// Drains a worker: no new requests; its running ones complete as usual.
    fn drain(&self, worker: i64) -> PyResult<()> {
        self.set_available(worker, false)
    }

    /// Registered workers, in id order.
    fn workers(&self) -> Vec<u32> {
        self.shared
            .routers
            .router()
            .workers()
            .iter()
            .map(|w| w.get())
            .collect()
    }

    /// What the host knows of a worker: its relative speed and KV capacity.
    #[pyo3(signature = (worker, *, speed=1.0, kv_capacity_tokens=None))]
    fn set_profile(
        &self,
        worker: i64,
        speed: f64,
        kv_capacity_tokens: Option<u64>,
    ) -> PyResult<()> {
        let mut profile = WorkerProfile::default();
        profile.speed = speed;
        if let Some(k) = kv_capacity_tokens {
            profile.kv_capacity_tokens = k;
        }
        profile.validate().or_raise()?;
        self.shared
            .routers
            .router()
            .set_profile(worker_id(worker)?, profile)
            .or_raise()
    }

    /// A worker's engine settings its events cannot show (report mode, CPU chunk size,
    /// KV-cache groups as `(index, kind, window)` with vLLM's `kv_cache_spec_kind`).
    #[pyo3(signature = (worker, *, full_reports=None, host_chunk_blocks=None, groups=None))]
    fn set_engine_settings(
        &self,
        worker: i64,
        full_reports: Option<bool>,
        host_chunk_blocks: Option<usize>,
        groups: Option<Vec<Group>>,
    ) -> PyResult<()> {
        let mut s = EngineSettings::default();
        if let Some(f) = full_reports {
            s = s.with_full_reports(f);
        }
        if let Some(c) = host_chunk_blocks {
            s = s.with_host_chunk_blocks(c);
        }
        for (g, kind, window) in groups.unwrap_or_default() {
            s = s.with_group(g, GroupKind::from_spec(kind.as_deref(), window));
        }
        s.validate().or_raise()?;
        let sync = self.shared.routers.sync().or_raise()?;
        sync.set_engine_settings(worker_id(worker)?, &s).or_raise()
    }

    /// What an autoscaler needs of the fleet, in one snapshot.
    fn fleet_signals(&self) -> FleetSignals {
        FleetSignals::of(&self.shared.routers.router().fleet_signals())
    }

    /// Applies one batch of vLLM's KV events (the msgpack payload of its ZMQ message) from
    /// the engine at `endpoint`; the batch names its data-parallel rank. `seq` is the
    /// message's sequence number; without it, the endpoint's previous one plus one.
    #[pyo3(signature = (endpoint, payload, seq=None))]
    fn apply_vllm_events(
        &self,
        py: Python<'_>,
        endpoint: u32,
        payload: &[u8],
        seq: Option<u64>,
    ) -> PyResult<SyncOutcome> {
        let r = &self.shared.routers;
        let sync = r.sync().or_raise()?;
        crate::events::apply(
            py,
            sync,
            r.layout(),
            &self.shared.seqs,
            endpoint,
            payload,
            seq,
        )
    }

    /// Replaces a worker's whole mirror with these prompts' full blocks (a snapshot).
    fn replace_worker_cache(
        &self,
        py: Python<'_>,
        worker: i64,
        prefixes: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let owned = prefixes
            .iter()
            .map(crate::tokens::extract)
            .collect::<PyResult<Vec<_>>>()?;
        let worker = worker_id(worker)?;
        let sync = self.shared.routers.sync().or_raise()?;
        py.detach(|| {
            let slices: Vec<&[u32]> = owned.iter().map(Vec::as_slice).collect();
            sync.replace_worker_cache(worker, &slices)
        })
        .or_raise()
    }

    /// The worker found `cached_tokens` of `tokens` cached: the mirror is trimmed to it.
    #[pyo3(signature = (worker, tokens, cached_tokens, *, salt=None, lora=None, cache_salt=None))]
    #[allow(clippy::too_many_arguments)]
    fn report_cached(
        &self,
        worker: i64,
        tokens: &Bound<'_, PyAny>,
        cached_tokens: usize,
        salt: Option<Vec<u8>>,
        lora: Option<&str>,
        cache_salt: Option<&str>,
    ) -> PyResult<()> {
        let tokens = crate::tokens::extract(tokens)?;
        let salt = self::salt(salt, lora, cache_salt)?;
        let sync = self.shared.routers.sync().or_raise()?;
        sync.report_cached_salted(worker_id(worker)?, &salt, &tokens, cached_tokens)
            .or_raise()
    }

    /// Tokens of `tokens` the mirror predicts `worker` would reuse (vLLM's prefix hit).
    #[pyo3(signature = (worker, tokens, *, salt=None, lora=None, cache_salt=None))]
    fn reusable_tokens(
        &self,
        py: Python<'_>,
        worker: i64,
        tokens: &Bound<'_, PyAny>,
        salt: Option<Vec<u8>>,
        lora: Option<&str>,
        cache_salt: Option<&str>,
    ) -> PyResult<usize> {
        let tokens = crate::tokens::extract(tokens)?;
        let salt = self::salt(salt, lora, cache_salt)?;
        let worker = worker_id(worker)?;
        let index = self.shared.routers.index();
        Ok(py.detach(|| index.reusable_tokens(worker, &salt, &tokens)))
    }

    /// Bytes the mirror holds.
    fn memory_bytes(&self) -> usize {
        self.shared.routers.index().memory_bytes()
    }

    fn __repr__(&self) -> String {
        format!(
            "Router(policy={:?}, workers={}, block_size={}, ranks={})",
            self.policy(),
            self.shared.routers.router().workers().len(),
            self.block_size(),
            self.ranks()
        )
    }
}
