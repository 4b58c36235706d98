//! One replay: the engines, the arrivals and the router of one cell, and the report.
//!
//! Dynamo's router and the replay's round robin run through `dynamo-mocker`'s own entry
//! point for trace files (`simulate_trace_file_with_router_mode_and_format`, Dynamo's
//! `KvRouterConfig` defaults). The crate's routers run through the same
//! `Replayer` with the same engine arguments, the same trace loading, speed-up and
//! lowering: `run_crate` repeats the steps of that entry point (Mooncake loading, session
//! normalisation, speed-up, single-turn requests or the workload driver) with the crate's
//! composition in place of Dynamo's.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};

use aisimulate_core::replay::loadgen::{Trace, TraceFileFormat, WorkloadDriver};
use aisimulate_core::replay::{
    CURRENT_REPLAY_SPEC_VERSION, DirectRequest, ProviderSpec, ReplayAdapters, ReplayCaptureOptions,
    ReplayEngineConfig, ReplayEngineFactory, ReplayReport, ReplayRuntimeInput, ReplaySpec,
    ReplayTopology, Replayer, SlaThresholds, WorkerPoolSpec,
};
use anyhow::{Context, Result, bail};
use dynamo_mocker::config::MockerConfig;
use dynamo_mocker::replay::{ReplayRouterMode, simulate_trace_file_with_router_mode_and_format};

use crate::placement::{CrateComposition, SyncCounts};
use crate::routers;

/// The engines of a cell: the replay's arguments as Dynamo's mocker takes them.
#[derive(Clone, Debug)]
pub struct Engines {
    /// `vllm` or `sglang`.
    pub backend: String,
    pub workers: usize,
    pub num_gpu_blocks: usize,
    pub block_size: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    /// The balanced policies' miss weight, fixed (`None`: the crate's default).
    pub miss_weight: Option<f64>,
    /// The balanced policies' learning rate from timings (`None`: the crate's default).
    pub learning_rate: Option<f64>,
}

impl Engines {
    /// The engine arguments as JSON (the form `run_mocker_trace_replay` takes).
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "engine": {
                "backend": self.backend,
                "num_gpu_blocks": self.num_gpu_blocks,
                "block_size": self.block_size,
                "max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "enable_prefix_caching": true,
                "enable_chunked_prefill": true,
            },
            "num_gpu_blocks_is_explicit": true,
        })
    }

    fn mocker(&self) -> Result<MockerConfig> {
        MockerConfig::from_value(self.json()).context("engine arguments")
    }
}

/// The arrivals of a cell: a trace file in the Mooncake format.
#[derive(Clone, Debug)]
pub struct Arrivals<'a> {
    pub path: &'a Path,
    pub trace_block_size: usize,
    pub speedup: f64,
    /// Multi-turn sessions whose rows carry only each turn's new input (the prompt is the
    /// conversation so far: earlier inputs and outputs, then the row's).
    pub deltas: bool,
}

impl Arrivals<'_> {
    fn format(&self) -> TraceFileFormat {
        if self.deltas {
            TraceFileFormat::MooncakeDelta
        } else {
            TraceFileFormat::Mooncake
        }
    }
}

/// What one router's replay gave.
pub struct Outcome {
    pub report: ReplayReport,
    /// The mirror's event counts (crate routers that read the cache only).
    pub sync: Option<SyncCounts>,
}

/// Replays `arrivals` on `engines` with the router `name`.
pub fn run(
    name: &str,
    engines: &Engines,
    arrivals: &Arrivals<'_>,
    sla: SlaThresholds,
    per_request: bool,
) -> Result<Outcome> {
    let mode = match name {
        routers::DYNAMO => Some(ReplayRouterMode::KvRouter),
        routers::ROUND_ROBIN => Some(ReplayRouterMode::RoundRobin),
        _ => None,
    };
    if let Some(mode) = mode {
        let report = simulate_trace_file_with_router_mode_and_format(
            engines.mocker()?,
            None,
            None,
            arrivals.path,
            arrivals.trace_block_size,
            engines.workers,
            arrivals.speedup,
            mode,
            arrivals.format(),
            0.0,
            0,
            per_request,
            None,
            sla,
        )?;
        return Ok(Outcome { report, sync: None });
    }
    run_crate(name, engines, arrivals, sla, per_request)
}

fn run_crate(
    name: &str,
    engines: &Engines,
    arrivals: &Arrivals<'_>,
    sla: SlaThresholds,
    per_request: bool,
) -> Result<Outcome> {
    let workers = u32::try_from(engines.workers)?;
    let Some(router) = routers::build(
        name,
        workers,
        engines.block_size,
        engines.miss_weight,
        engines.learning_rate,
    ) else {
        bail!("unknown router {name:?}");
    };
    let router = router?;
    let reads_cache = router.cache_sync().is_some();
    let args = engines.mocker()?;

    // As dynamo-mocker's `aggregated_replay_setup` for its default (polynomial) timing, with
    // the blocks' token IDs in the KV events: a gateway mirroring vLLM hashes them itself.
    let mut rank = args.engine.engine.clone();
    rank.emit_kv_token_ids = true;
    let engine = ReplayEngineConfig {
        dp_size: args.dp_size,
        tensor_parallel_size: u32::try_from(args.tensor_parallel_size)?,
        num_gpu_blocks_is_explicit: Some(true),
        rank,
        ..ReplayEngineConfig::default()
    };
    let spec = ReplaySpec {
        version: CURRENT_REPLAY_SPEC_VERSION,
        topology: ReplayTopology::Aggregated {
            workers: WorkerPoolSpec {
                initial_workers: engines.workers,
                startup_delay_ms: 0.0,
            },
        },
        engine: serde_json::to_value(engine)?,
        adapters: ReplayAdapters {
            placement: ProviderSpec {
                provider: format!("prefix_router_{name}"),
                config: serde_json::Value::Null,
            },
            scaling: ProviderSpec::no_scaling(),
        },
        max_sim_time_ms: None,
        max_in_flight: None,
        record_per_request: per_request,
        sla,
        requests: Vec::new(),
    };

    // As `simulate_trace_file_with_router_mode_and_format`: load, normalise, speed up; a
    // single-turn trace becomes timestamped requests, a multi-turn one the workload driver.
    let trace = Trace::from_mooncake(arrivals.path, arrivals.trace_block_size)?
        .normalize_session_starts()?
        .speed_up_timing(arrivals.speedup)?;
    let input = if trace.is_single_turn() {
        trace.validate_for_trace_mode()?;
        ReplayRuntimeInput::Requests(normalize(trace.to_single_turn_requests()?)?)
    } else {
        ReplayRuntimeInput::Workload(WorkloadDriver::new_trace_without_replay_hashes(
            trace,
            engines.block_size,
            arrivals.deltas,
        )?)
    };

    let counts = Arc::new(Mutex::new(SyncCounts::default()));
    let composition = CrateComposition::new(router, Arc::clone(&counts));
    let capture = ReplayCaptureOptions {
        capture_per_request: per_request,
        ..ReplayCaptureOptions::default()
    };
    let report = Replayer::with_composition(spec, ReplayEngineFactory::new(), composition)?
        .with_capture_options(capture)
        .with_runtime_input(input)
        .run()?;
    let sync = reads_cache.then(|| counts.lock().unwrap_or_else(|e| e.into_inner()).clone());
    Ok(Outcome { report, sync })
}

/// Arrival times from the first request (as `dynamo-mocker`'s `normalize_trace_requests`,
/// at speed-up 1: the trace was sped up already).
fn normalize(mut requests: Vec<DirectRequest>) -> Result<VecDeque<DirectRequest>> {
    if requests.iter().any(|r| r.arrival_timestamp_ms.is_none()) {
        bail!("trace replay requires every request to carry an arrival timestamp");
    }
    let at = |r: &DirectRequest| r.arrival_timestamp_ms.unwrap_or(0.0);
    requests.sort_by(|a, b| at(a).total_cmp(&at(b)));
    let first = requests
        .first()
        .map(at)
        .context("the trace has no request")?;
    for request in &mut requests {
        request.arrival_timestamp_ms = Some(at(request) - first);
    }
    Ok(requests.into())
}
