//! The crate's main job: compare routing policies on workloads and traces.
//!
//! ```sh
//! cargo run --release --example simulate                      # every policy, built-in workloads
//! cargo run --release --example simulate -- --workload agentic --policy balanced
//! cargo run --release --example simulate -- --trace data/mooncake_conversation_trace.jsonl \
//!     --workers 8 --capacity-tokens 1000000 --speedup 8 --format json
//! cargo run --release --example simulate -- --matrix > matrix.md   # the README's results
//! cargo run --release --example simulate -- --help              # every flag, with its default
//! ```
//!
//! Workers run the batched engine (`--engine simple` for the old FIFO model). Flags:
//! - what to run: `--trace PATH` (a Mooncake trace; default the built-in workloads),
//!   `--workload NAME` (only that built-in workload: `shared_prompts`, `conversations`,
//!   `few_shot`, `document_qa`, `mix` or `agentic`; not with `--trace`),
//!   `--policy NAME|all` (`llmd`, `dynamo`, `aibrix`: peer projects' policies, see
//!   `common/peers/`), `--alpha X`, `--miss-weight X`, `--seed N`, `--matrix` (every
//!   policy in every cell of the results matrix, as Markdown), `--matrix-pd` (its
//!   disaggregated cells alone), `--matrix-profiles` (its engine-profile cells);
//! - the fleet: `--workers N`, `--capacity-tokens N` (per worker), `--block-size N`,
//!   `--speedup X` (or `--load-sweep X,X,...`: each policy at each load), `--engine batched|simple`, `--max-num-batched-tokens N`,
//!   `--max-num-seqs N`, `--host-capacity-tokens N` and `--host-chunk-blocks N` (a host
//!   tier of CPU offloading per worker), `--fleet SPEC` (`4x1.0,4x0.5@2000000` is four
//!   workers at the configured speed and four at half of it with 2,000,000 tokens of KV
//!   each; it replaces `--workers`), `--faults SPEC` (`3@60-120`: worker 3 leaves at 60 s
//!   and returns empty at 120 s; `inf` never);
//! - the routers: `--replicas N` behind `--front rr|random`, `--router-capacity-tokens
//!   N|unknown` (what the mirrors are told; default unknown), `--router-speeds
//!   known|unknown` (whether the routers are told each worker's speed; default unknown),
//!   `--router-terms known|unknown` (whether they are told the engine profile's step terms;
//!   default unknown: they learn them),
//!   `--sync optimistic|feedback|events` (`none` is `optimistic`: no correction),
//!   `--scrape-interval S` (load reports), `--event-delay S`, `--event-loss P`,
//!   `--event-replay on|off`, `--admission on|off` with `--priorities SPEC` and
//!   `--priority-scope session|request` (what a priority is drawn for),
//!   `--progress-every N` (the host's progress reports), `--warmup S` (S seconds of the
//!   workload at 1x before the measured load);
//! - output: `--format table|json|csv`, `--ttft-target S`, `--tpot-target S` (goodput's
//!   targets), `--requests-out FILE` (one JSON line per request of every run: workload,
//!   policy and the request's record), `--plot FILE.svg` (with `--load-sweep 1,2,4,8`,
//!   each policy's TTFT p99 against load; otherwise each policy as a point of hit ratio
//!   against TTFT p99, plus a sweep of `BalancedRouter`'s weighted score over alpha).
//!
//! `--help` prints every flag and exits 0. Progress goes to stderr: a bar per running
//! policy while stderr is a terminal, otherwise a plain line per finished policy. Bad
//! flags and unreadable traces give a one-line error and exit code 2.

use std::process::ExitCode;

mod args;
#[path = "../common/cli.rs"]
mod cli;
mod matrix;
mod matrix_pd;
mod matrix_profiles;
mod needless;
mod output;
#[path = "../common/policy.rs"]
mod policy;
mod runner;

use args::Args;
use policy::{PD_DECIDERS, POLICIES};
use prefix_router::sim::{Request, SimReport, Workload, load_mooncake};

/// A failure: the message and the exit code.
type Failure = (String, u8);

fn main() -> ExitCode {
    let args = match args::parse_from(std::env::args_os()) {
        Ok(args) => args,
        Err(e) => return cli::exit(&e),
    };
    let result = if args.matrix {
        matrix::run(&args)
    } else if args.matrix_pd {
        matrix_pd::run(&args)
    } else if args.matrix_profiles {
        matrix_profiles::run(&args)
    } else {
        compare(&args)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err((message, code)) => {
            eprintln!("error: {message}");
            ExitCode::from(code)
        }
    }
}

/// Runs the chosen policies on the chosen workloads (at each load of `--load-sweep`) and
/// prints and writes what `args` ask.
fn compare(args: &Args) -> Result<(), Failure> {
    let policies: Vec<&str> = match (
        runner::has_roles(args),
        args.policy.as_str(),
        args.pd_decider.as_str(),
    ) {
        (false, "all", _) => POLICIES.to_vec(),
        (false, policy, _) => vec![policy],
        (true, _, "all") => PD_DECIDERS.to_vec(),
        (true, _, decider) => vec![decider],
    };
    let loads: Vec<Option<f64>> = match &args.load_sweep {
        Some(loads) => loads.iter().copied().map(Some).collect(),
        None => vec![None],
    };
    let mut rows: Vec<(String, SimReport)> = Vec::new();
    let mut points: Vec<output::LoadPoint> = Vec::new();
    let mut sweeps: Vec<(String, Vec<(f64, SimReport)>)> = Vec::new();
    let workloads = workloads(args)?;
    let total = workloads.len() * loads.len() * policies.len();
    for (name, requests) in workloads {
        for &load in &loads {
            let mut at = args.clone();
            let cell = match load {
                Some(x) => {
                    at.cluster.speedup = x;
                    format!("{name} {x}x")
                }
                None => name.clone(),
            };
            let sim = runner::simulation(requests.clone(), &at).map_err(|e| (e.to_string(), 2))?;
            let done = rows.len();
            let label = |k: usize| format!("[{:>2}/{total}] {cell}: {}", done + k + 1, policies[k]);
            let reports = runner::run_all(&sim, &policies, &at, &label);
            for (policy, report) in policies.iter().zip(reports) {
                let report = report.map_err(|e| (format!("{policy}: {e}"), 2))?;
                if let Some(x) = load {
                    points.push(output::LoadPoint {
                        workload: name.clone(),
                        load: x,
                        row: rows.len(),
                    });
                }
                rows.push((cell.clone(), report));
            }
            if args.plot.is_some() && load.is_none() {
                sweeps.push((name.clone(), sweep(&sim, args, &name)?));
            }
        }
    }
    output::print(&rows, &args.format);
    if let Some(path) = &args.requests_out {
        output::write_requests(path, &rows)
            .map_err(|e| (format!("cannot write {path}: {e}"), 1))?;
        eprintln!("wrote {path}");
    }
    if let Some(path) = &args.plot {
        let drawn = if points.is_empty() {
            output::plot(path, &rows, &sweeps)
        } else {
            output::plot_loads(path, &rows, &points)
        };
        drawn.map_err(|e| (format!("cannot draw {path}: {e}"), 1))?;
        eprintln!("wrote {path}");
    }
    Ok(())
}

/// The workloads `args` name: the trace, the one built-in workload, or all the built-in
/// ones.
fn workloads(args: &Args) -> Result<Vec<(String, Vec<Request>)>, Failure> {
    if let Some(path) = &args.trace {
        let requests = load_mooncake(path).map_err(|e| (format!("{path}: {e}"), 2))?;
        return Ok(vec![(
            path.rsplit('/').next().unwrap_or(path).to_owned(),
            requests,
        )]);
    }
    let chosen: Vec<(String, Vec<Request>)> = Workload::builtin()
        .into_iter()
        .filter(|(name, _)| args.workload.as_deref().is_none_or(|w| w == *name))
        .map(|(name, w)| (name.to_owned(), w.generate(args.seed)))
        .collect();
    match &args.workload {
        Some(w) if chosen.is_empty() => Err((format!("no built-in workload {w:?}"), 2)),
        _ => Ok(chosen),
    }
}

/// The weighted score's reports over alpha 0.0 to 1.0.
fn sweep(
    sim: &prefix_router::sim::Simulation,
    args: &Args,
    name: &str,
) -> Result<Vec<(f64, SimReport)>, Failure> {
    (0..=10u32)
        .map(|step| {
            let alpha = f64::from(step) / 10.0;
            let mut a = args.clone();
            a.alpha = Some(alpha);
            let label = format!("alpha sweep {name}: {alpha:.1}");
            runner::run(sim, "balanced_weighted", &a, &label)
                .map(|report| (alpha, report))
                .map_err(|e| (format!("alpha sweep: {e}"), 2))
        })
        .collect()
}
