//! prefix-router's policies judged by NVIDIA's replay engine (`aisimulate-core`), beside
//! Dynamo's own KV router (`dynamo-mocker`) and the replay's round robin.
//!
//! ```text
//! cargo run --release --manifest-path benches/aisimulate/Cargo.toml -- \
//!     --trace data/mooncake_conversation_trace.jsonl --workers 8 --speedup 4 \
//!     --engine vllm --router all --format table
//! ```
//!
//! Every router of a run replays the same arrivals on the same engines; the figures are the
//! replay's own report. See `benches/aisimulate.md` for the knobs and the results.

mod placement;
mod replay;
mod routers;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use aisimulate_core::replay::SlaThresholds;
use aisimulate_core::replay::loadgen::{
    ArrivalSpec, DelaySpec, LengthSpec, SyntheticTraceSpec, Trace,
};
use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use serde_json::{Map, Value};

use crate::replay::{Arrivals, Engines, Outcome};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Engine {
    /// vLLM's scheduler (block allocation, chunked prefill).
    Vllm,
    /// SGLang's scheduler (radix cache).
    Sglang,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    Table,
    Json,
}

/// Replays a trace or a synthetic workload through NVIDIA's replay engine with the crate's
/// routers, Dynamo's KV router and the replay's round robin, and prints the replay's report.
#[derive(Parser, Debug)]
#[command(name = "aisimulate", version)]
struct Args {
    /// A trace in the Mooncake format (`timestamp`, `input_length`, `output_length`,
    /// `hash_ids`).
    #[arg(long, conflicts_with = "synthetic")]
    trace: Option<PathBuf>,
    /// Tokens per hash id of `--trace` (Mooncake's traces: 512).
    #[arg(long, default_value_t = 512)]
    trace_block_size: usize,
    /// The trace's rows are multi-turn deltas (`MooncakeDelta`: each row of a session
    /// carries only its new input; the prompt is the conversation so far).
    #[arg(long)]
    trace_deltas: bool,
    /// Replays only the trace's first N rows.
    #[arg(long)]
    max_requests: Option<usize>,

    /// The replay's own synthetic generator (`Trace::synthetic`) in place of a trace.
    #[arg(long)]
    synthetic: bool,
    /// Synthetic: mean new input tokens per turn.
    #[arg(long, default_value_t = 2_048)]
    input_tokens: usize,
    /// Synthetic: output tokens per turn.
    #[arg(long, default_value_t = 256)]
    output_tokens: usize,
    /// Synthetic: the replay's `request_count`, the number of sessions (each of
    /// `--turns-per-session` turns).
    #[arg(long, default_value_t = 200)]
    requests: usize,
    /// Synthetic: first turns arrive as a Poisson process of this rate (per second).
    #[arg(long, default_value_t = 2.0)]
    request_rate: f64,
    /// Synthetic: share of each turn's input blocks taken from its session's prefix group.
    #[arg(long, default_value_t = 0.5)]
    shared_prefix_ratio: f64,
    /// Synthetic: number of shared prefix groups.
    #[arg(long, default_value_t = 8)]
    prefix_groups: usize,
    /// Synthetic: turns per session; above 1 a turn's prompt is the conversation so far
    /// (earlier inputs and outputs) followed by its new input.
    #[arg(long, default_value_t = 1)]
    turns_per_session: usize,
    /// Synthetic: delay from one turn's end to the next one's arrival, milliseconds.
    #[arg(long, default_value_t = 0.0)]
    inter_turn_delay_ms: f64,
    /// Synthetic: the generator's seeds (content, arrivals).
    #[arg(long, default_value_t = 42)]
    seed: u64,

    /// Workers (engines), all alike.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Arrival times divided by this.
    #[arg(long, default_value_t = 1.0)]
    speedup: f64,
    /// The engines' scheduler.
    #[arg(long, value_enum, default_value_t = Engine::Vllm)]
    engine: Engine,
    /// KV blocks per worker.
    #[arg(long, default_value_t = 65_536)]
    num_gpu_blocks: usize,
    /// Tokens per KV block (the crate's routers hash with the same).
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Requests a worker runs at once.
    #[arg(long, default_value_t = 256)]
    max_num_seqs: usize,
    /// Tokens a worker's step schedules at most.
    #[arg(long, default_value_t = 8_192)]
    max_num_batched_tokens: usize,
    /// Goodput SLA: time to first token, milliseconds.
    #[arg(long, default_value_t = 2_000.0)]
    sla_ttft_ms: f64,
    /// Goodput SLA: inter-token latency, milliseconds.
    #[arg(long, default_value_t = 100.0)]
    sla_itl_ms: f64,

    /// Fixes the balanced policies' miss weight (what a recomputed prompt token weighs
    /// against a queued one; the crate's default prices it by the fleet's load, 1 to 30), as
    /// the simulator's `--miss-weight`.
    #[arg(long)]
    miss_weight: Option<f64>,
    /// Sets the balanced policies' learning rate from the host's timings
    /// (`LoadConfig::learning_rate`; 0: they do not learn).
    #[arg(long)]
    learning_rate: Option<f64>,

    /// Routers, comma-separated, or `all`: the crate's policies by the simulator's names
    /// (`balanced`, `balanced_weighted`, `cache_aware`, `least_loaded`, `power_of_two`,
    /// `consistent_hash`, `affinity`, and the simulator's rebuilt peers `llmd`,
    /// `dynamo_rebuilt`, `aibrix`), `dynamo` (Dynamo's KvRouter, its defaults) and
    /// `round_robin` (the replay's own).
    #[arg(long, default_value = "all")]
    router: String,
    /// Output.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Replays this many routers at once.
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// Writes each router's per-request records (the replay's `PerRequestRecord`s) to
    /// `DIR/<router>.jsonl`.
    #[arg(long)]
    per_request: Option<PathBuf>,
    /// Fails unless every router completed every request and the JSON report parses.
    #[arg(long)]
    check: bool,
}

/// A trace file written for the run (a synthetic workload, a cut trace), removed at the end.
struct Scratch(Option<PathBuf>);

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(path) = &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn scratch_path(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!("aisimulate-{}-{what}.jsonl", std::process::id()))
}

/// The arrivals' trace file: `--trace` (cut to `--max-requests`), or the synthetic workload
/// written in the Mooncake format; its rows; whether they are deltas; its block size.
fn arrivals_file(args: &Args) -> Result<(PathBuf, Scratch, usize, bool, usize)> {
    if args.synthetic {
        let trace = Trace::synthetic(SyntheticTraceSpec {
            block_size: args.block_size,
            num_sessions: args.requests,
            turns_per_session: args.turns_per_session,
            input_tokens: LengthSpec {
                mean: args.input_tokens,
                stddev: 0.0,
            },
            output_tokens: LengthSpec {
                mean: args.output_tokens,
                stddev: 0.0,
            },
            cached_prefix_tokens: 0,
            shared_prefix_ratio: args.shared_prefix_ratio,
            num_prefix_groups: args.prefix_groups,
            first_turn_arrivals: ArrivalSpec::PoissonQps {
                qps: args.request_rate,
            },
            inter_turn_delays: if args.inter_turn_delay_ms > 0.0 {
                DelaySpec::ConstantMs(args.inter_turn_delay_ms)
            } else {
                DelaySpec::None
            },
            seed: args.seed,
            arrival_seed: args.seed,
        })?;
        let path = scratch_path("synthetic");
        let mut out = std::io::BufWriter::new(std::fs::File::create(&path)?);
        let mut rows = 0;
        for session in &trace.sessions {
            for (k, turn) in session.turns.iter().enumerate() {
                let mut row = Map::new();
                row.insert("session_id".into(), session.session_id.clone().into());
                if k == 0 {
                    row.insert(
                        "timestamp".into(),
                        session.first_arrival_timestamp_ms.unwrap_or(0.0).into(),
                    );
                } else {
                    row.insert("delay".into(), turn.delay_after_previous_ms.into());
                }
                row.insert("input_length".into(), turn.input_length.into());
                row.insert("output_length".into(), turn.max_output_tokens.into());
                row.insert("hash_ids".into(), turn.hash_ids.clone().into());
                serde_json::to_writer(&mut out, &row)?;
                out.write_all(b"\n")?;
                rows += 1;
            }
        }
        out.flush()?;
        let deltas = args.turns_per_session > 1;
        return Ok((
            path.clone(),
            Scratch(Some(path)),
            rows,
            deltas,
            args.block_size,
        ));
    }
    let Some(trace) = &args.trace else {
        bail!("give --trace FILE or --synthetic");
    };
    let text =
        std::fs::read_to_string(trace).with_context(|| format!("reading {}", trace.display()))?;
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let keep = args.max_requests.unwrap_or(lines.len()).min(lines.len());
    if keep == lines.len() {
        return Ok((
            trace.clone(),
            Scratch(None),
            keep,
            args.trace_deltas,
            args.trace_block_size,
        ));
    }
    let path = scratch_path("trace");
    std::fs::write(&path, lines[..keep].join("\n") + "\n")?;
    Ok((
        path.clone(),
        Scratch(Some(path)),
        keep,
        args.trace_deltas,
        args.trace_block_size,
    ))
}

fn routers_of(spec: &str) -> Result<Vec<String>> {
    if spec == "all" {
        return Ok(routers::all().into_iter().map(str::to_owned).collect());
    }
    let names: Vec<String> = spec.split(',').map(|s| s.trim().to_owned()).collect();
    for name in &names {
        if !routers::known(name) {
            bail!(
                "unknown router {name:?}: one of {}, or all",
                routers::all().join(", ")
            );
        }
    }
    Ok(names)
}

/// One router's row: `router`, then the replay report's summary under its own keys.
fn row(name: &str, outcome: &Outcome) -> Result<Value> {
    let mut map = Map::new();
    map.insert("router".into(), name.into());
    let Value::Object(summary) = serde_json::to_value(&outcome.report)? else {
        bail!("the replay's summary is not an object");
    };
    map.extend(summary);
    if let Some(sync) = &outcome.sync {
        map.insert(
            "mirror".into(),
            serde_json::json!({
                "events": sync.events,
                "stored_blocks": sync.stored_blocks,
                "removed_blocks": sync.removed_blocks,
                "unknown_parent_blocks": sync.unknown_parent_blocks,
                "refused_events": sync.refused,
                "routed_per_worker": sync.workers.iter().map(|w| w.0).collect::<Vec<_>>(),
                "learned_speed_per_worker": sync.workers.iter().map(|w| w.1).collect::<Vec<_>>(),
            }),
        );
    }
    Ok(Value::Object(map))
}

fn num(row: &Value, key: &str) -> f64 {
    row.get(key).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

fn table(rows: &[Value]) -> String {
    let mut out = String::new();
    out.push_str(
        "| router | completed | prefix reuse | TTFT p50 ms | TTFT p99 ms | TPOT p99 ms \
         | ITL p99 ms | E2E p99 ms | goodput | goodput req/s | replay s |\n",
    );
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|\n");
    for row in rows {
        let total = num(row, "num_requests");
        out.push_str(&format!(
            "| {} | {}/{} | {:.3} | {:.0} | {:.0} | {:.1} | {:.1} | {:.0} | {:.3} | {:.3} | {:.1} |\n",
            row["router"].as_str().unwrap_or("?"),
            num(row, "completed_requests"),
            total,
            num(row, "prefix_cache_reused_ratio"),
            num(row, "median_ttft_ms"),
            num(row, "p99_ttft_ms"),
            num(row, "p99_tpot_ms"),
            num(row, "p99_itl_ms"),
            num(row, "p99_e2e_latency_ms"),
            num(row, "goodput_completed_requests") / total,
            num(row, "goodput_request_throughput_rps"),
            num(row, "wall_time_ms") / 1_000.0,
        ));
    }
    out
}

fn write_records(dir: &Path, name: &str, outcome: &Outcome) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("{name}.jsonl"));
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path)?);
    for record in &outcome.report.per_request {
        serde_json::to_writer(&mut out, record)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let names = routers_of(&args.router)?;
    let (path, _scratch, rows, deltas, trace_block_size) = arrivals_file(&args)?;
    let engines = Engines {
        backend: match args.engine {
            Engine::Vllm => "vllm".into(),
            Engine::Sglang => "sglang".into(),
        },
        workers: args.workers,
        num_gpu_blocks: args.num_gpu_blocks,
        block_size: args.block_size,
        max_num_seqs: args.max_num_seqs,
        max_num_batched_tokens: args.max_num_batched_tokens,
        miss_weight: args.miss_weight,
        learning_rate: args.learning_rate,
    };
    let arrivals = Arrivals {
        path: &path,
        trace_block_size,
        speedup: args.speedup,
        deltas,
    };
    let sla = SlaThresholds {
        ttft_ms: Some(args.sla_ttft_ms),
        itl_ms: Some(args.sla_itl_ms),
        e2e_ms: None,
    };
    let per_request = args.per_request.is_some();

    let started = Instant::now();
    let jobs = args.jobs.max(1);
    let mut outcomes: Vec<Option<Result<Outcome>>> = (0..names.len()).map(|_| None).collect();
    for (chunk_names, chunk_out) in names.chunks(jobs).zip(outcomes.chunks_mut(jobs)) {
        std::thread::scope(|scope| {
            let handles: Vec<_> = chunk_names
                .iter()
                .map(|name| {
                    let (engines, arrivals) = (&engines, &arrivals);
                    scope.spawn(move || replay::run(name, engines, arrivals, sla, per_request))
                })
                .collect();
            for (slot, handle) in chunk_out.iter_mut().zip(handles) {
                *slot = Some(
                    handle
                        .join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("the replay panicked"))),
                );
            }
        });
    }

    let mut report_rows = Vec::new();
    let mut failures = Vec::new();
    for (name, outcome) in names.iter().zip(outcomes) {
        let outcome = outcome
            .context("a router was not run")?
            .with_context(|| format!("router {name}"))?;
        if let Some(dir) = &args.per_request {
            write_records(dir, name, &outcome)?;
        }
        let counts = &outcome.report.request_counts;
        if counts.completed_requests != counts.num_requests {
            failures.push(format!(
                "{name}: {} of {} requests completed",
                counts.completed_requests, counts.num_requests
            ));
        }
        if !deltas && counts.num_requests != rows {
            failures.push(format!(
                "{name}: the replay saw {} requests, the trace has {rows}",
                counts.num_requests
            ));
        }
        report_rows.push(row(name, &outcome)?);
    }

    let json = serde_json::to_string_pretty(&Value::Array(report_rows.clone()))?;
    match args.format {
        Format::Json => println!("{json}"),
        Format::Table => {
            let source = if args.synthetic {
                format!(
                    "synthetic: {} sessions x {} turns, {} input / {} output tokens, \
                     {}/s, shared prefix {} in {} groups, inter-turn delay {} ms, seed {}",
                    args.requests,
                    args.turns_per_session,
                    args.input_tokens,
                    args.output_tokens,
                    args.request_rate,
                    args.shared_prefix_ratio,
                    args.prefix_groups,
                    args.inter_turn_delay_ms,
                    args.seed
                )
            } else {
                format!("trace {} ({rows} rows)", path.display())
            };
            println!(
                "{source}; speedup {}x; {} workers; engine {}; SLA TTFT {} ms, ITL {} ms",
                args.speedup,
                args.workers,
                engines.json(),
                args.sla_ttft_ms,
                args.sla_itl_ms
            );
            if let Some(w) = args.miss_weight {
                println!("balanced policies' miss weight fixed at {w}");
            }
            if let Some(rate) = args.learning_rate {
                println!("balanced policies' learning rate {rate}");
            }
            println!();
            print!("{}", table(&report_rows));
            println!();
            println!(
                "goodput: share of requests within the SLA; replay s: the replay's wall time; \
                 all in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
    }
    if args.check {
        let parsed: Value = serde_json::from_str(&json).context("the JSON report parses")?;
        let ok = parsed.as_array().is_some_and(|rows| {
            rows.len() == names.len()
                && rows.iter().all(|r| {
                    r.get("router").is_some_and(Value::is_string)
                        && r.get("p99_ttft_ms").is_some_and(Value::is_number)
                        && r.get("prefix_cache_reused_ratio")
                            .is_some_and(Value::is_number)
                        && r.get("goodput_completed_requests")
                            .is_some_and(Value::is_number)
                })
        });
        if !ok {
            failures.push("the JSON report lacks a router's summary".into());
        }
        if !failures.is_empty() {
            bail!("check failed:\n{}", failures.join("\n"));
        }
        eprintln!(
            "check passed: {} routers, every request completed",
            names.len()
        );
    } else if !failures.is_empty() {
        eprintln!("warning:\n{}", failures.join("\n"));
    }
    Ok(())
}
