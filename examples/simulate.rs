//! The crate's main job: compare routing policies on workloads and traces.
//!
//! ```sh
//! cargo run --release --example simulate                      # every policy, built-in workloads
//! cargo run --release --example simulate -- --trace data/mooncake_conversation_trace.jsonl \
//!     --workers 8 --capacity-tokens 1000000 --speedup 8 --format json
//! ```
//!
//! Flags: `--trace PATH`, `--workers N`, `--capacity-tokens N` (per worker), `--speedup X`,
//! `--policy NAME|all`, `--alpha X`, `--block-size N`, `--seed N`,
//! `--format table|json|csv`, `--sync none|feedback|events`, `--miss-weight X`,
//! `--engine batched|simple`, `--max-num-batched-tokens N`, `--max-num-seqs N`,
//! `--fleet SPEC` (a mixed fleet: `4x1.0,4x0.5@2000000` is four workers at the configured
//! speed and four at half of it with 2,000,000 tokens of KV each; it replaces `--workers`),
//! `--ttft-target S`, `--tpot-target S` (goodput's targets), `--requests-out FILE` (one
//! JSON line per request of every run: workload, policy and the request's record),
//! `--plot FILE.svg` (each policy as a point of hit ratio against TTFT p99, plus a sweep of
//! `BalancedRouter`'s weighted score over alpha). A progress bar goes to stderr; bad flags
//! and unreadable traces give a one-line error and exit code 2.

use std::process::ExitCode;

#[path = "common/policy.rs"]
mod policy;

use policy::{POLICIES, PolicyOptions};
use prefix_router::Error;
use prefix_router::sim::{
    ClusterConfig, Engine, SimReport, Simulation, SyncMode, WorkerSpec, Workload, load_mooncake,
};

#[derive(Clone)]
struct Args {
    trace: Option<String>,
    cluster: ClusterConfig,
    policy: String,
    alpha: Option<f64>,
    miss_weight: Option<f64>,
    seed: u64,
    format: String,
    plot: Option<String>,
    requests_out: Option<String>,
    fleet: Option<String>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        trace: None,
        cluster: ClusterConfig::default(),
        policy: "all".into(),
        alpha: None,
        miss_weight: None,
        seed: 42,
        format: "table".into(),
        plot: None,
        requests_out: None,
        fleet: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        fn num<T: std::str::FromStr>(flag: &str, v: String) -> Result<T, String> {
            v.parse()
                .map_err(|_| format!("{flag}: {v:?} is not a valid number"))
        }
        match flag.as_str() {
            "--trace" => args.trace = Some(value()?),
            "--workers" => args.cluster.workers = num(&flag, value()?)?,
            "--capacity-tokens" => args.cluster.capacity_tokens = num(&flag, value()?)?,
            "--speedup" => args.cluster.speedup = num(&flag, value()?)?,
            "--policy" => args.policy = value()?,
            "--alpha" => args.alpha = Some(num(&flag, value()?)?),
            "--miss-weight" => args.miss_weight = Some(num(&flag, value()?)?),
            "--block-size" => args.cluster.block_size = num(&flag, value()?)?,
            "--seed" => args.seed = num(&flag, value()?)?,
            "--format" => args.format = value()?,
            "--plot" => args.plot = Some(value()?),
            "--requests-out" => args.requests_out = Some(value()?),
            "--fleet" => args.fleet = Some(value()?),
            "--ttft-target" => args.cluster.ttft_target_s = num(&flag, value()?)?,
            "--tpot-target" => args.cluster.tpot_target_s = num(&flag, value()?)?,
            "--max-num-batched-tokens" => {
                args.cluster.batch.max_num_batched_tokens = num(&flag, value()?)?;
            }
            "--max-num-seqs" => args.cluster.batch.max_num_seqs = num(&flag, value()?)?,
            "--sync" => {
                args.cluster.sync = match value()?.as_str() {
                    "none" => SyncMode::None,
                    "feedback" => SyncMode::Feedback,
                    "events" => SyncMode::Events,
                    other => {
                        return Err(format!(
                            "--sync: unknown mode {other:?} (none, feedback, events)"
                        ));
                    }
                }
            }
            "--engine" => {
                args.cluster.engine = match value()?.as_str() {
                    "batched" => Engine::Batched,
                    "simple" => Engine::Simple,
                    other => {
                        return Err(format!("--engine: unknown {other:?} (batched, simple)"));
                    }
                }
            }
            "-h" | "--help" => {
                return Err(
                    "usage: simulate [--trace PATH] [--workers N] [--capacity-tokens N] \
                     [--speedup X] [--policy NAME|all] [--alpha X] [--block-size N] [--seed N] \
                     [--format table|json|csv] [--sync none|feedback|events] [--miss-weight X] \
                     [--engine batched|simple] [--max-num-batched-tokens N] [--max-num-seqs N] \
                     [--ttft-target S] [--tpot-target S] [--requests-out FILE] [--fleet SPEC] [--plot FILE.svg]"
                        .into(),
                );
            }
            other => return Err(format!("unknown flag {other:?} (see --help)")),
        }
    }
    if !["table", "json", "csv"].contains(&args.format.as_str()) {
        return Err(format!(
            "--format: {:?} is not table, json or csv",
            args.format
        ));
    }
    if args.policy != "all" && !POLICIES.contains(&args.policy.as_str()) {
        return Err(format!(
            "--policy: unknown {:?} (one of {})",
            args.policy,
            POLICIES.join(", ")
        ));
    }
    if let Some(spec) = &args.fleet {
        let fleet = WorkerSpec::parse_fleet(spec, args.cluster.capacity_tokens)
            .map_err(|e| format!("--fleet: {e}"))?;
        args.cluster.workers = u32::try_from(fleet.len()).unwrap_or(u32::MAX);
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let workloads: Vec<(String, Vec<prefix_router::sim::Request>)> = match &args.trace {
        Some(path) => match load_mooncake(path) {
            Ok(r) => vec![(path.rsplit('/').next().unwrap_or(path).to_owned(), r)],
            Err(e) => {
                eprintln!("error: {path}: {e}");
                return ExitCode::from(2);
            }
        },
        None => Workload::builtin()
            .into_iter()
            .map(|(name, w)| (name.to_owned(), w.generate(args.seed)))
            .collect(),
    };
    let policies: Vec<&str> = if args.policy == "all" {
        POLICIES.to_vec()
    } else {
        vec![args.policy.as_str()]
    };
    let mut rows: Vec<(String, SimReport)> = Vec::new();
    let mut sweeps: Vec<(String, Vec<(f64, SimReport)>)> = Vec::new();
    let total = workloads.len() * policies.len();
    for (name, requests) in workloads {
        let fleet = args.fleet.as_deref().map_or_else(
            || {
                Ok(vec![
                    WorkerSpec::new(1.0, args.cluster.capacity_tokens);
                    args.cluster.workers as usize
                ])
            },
            |spec| WorkerSpec::parse_fleet(spec, args.cluster.capacity_tokens),
        );
        let sim = match fleet.and_then(|f| Simulation::with_fleet(requests, args.cluster, f)) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        };
        let done = rows.len();
        for (policy, report) in policies
            .iter()
            .zip(run_all(&sim, &policies, &args, &name, done, total))
        {
            match report {
                Ok(report) => rows.push((name.clone(), report)),
                Err(e) => {
                    eprintln!("error: {policy}: {e}");
                    return ExitCode::from(2);
                }
            }
        }
        if args.plot.is_some() {
            let mut sweep = Vec::new();
            for step in 0..=10u32 {
                let alpha = f64::from(step) / 10.0;
                let mut a = args.clone();
                a.alpha = Some(alpha);
                let label = format!("alpha sweep {name}: {alpha:.1}");
                match run(&sim, "balanced_weighted", &a, &label) {
                    Ok(report) => sweep.push((alpha, report)),
                    Err(e) => {
                        eprintln!("error: alpha sweep: {e}");
                        return ExitCode::from(2);
                    }
                }
            }
            sweeps.push((name.clone(), sweep));
        }
    }
    print(&rows, &args.format);
    if let Some(path) = &args.requests_out {
        if let Err(e) = write_requests(path, &rows) {
            eprintln!("error: cannot write {path}: {e}");
            return ExitCode::from(1);
        }
        eprintln!("wrote {path}");
    }
    if let Some(path) = &args.plot {
        if let Err(e) = plot(path, &rows, &sweeps) {
            eprintln!("error: cannot draw {path}: {e}");
            return ExitCode::from(1);
        }
        eprintln!("wrote {path}");
    }
    ExitCode::SUCCESS
}

fn print(rows: &[(String, SimReport)], format: &str) {
    match format {
        "json" => {
            let objects: Vec<String> = rows
                .iter()
                .map(|(w, r)| {
                    let json = r.to_json();
                    format!("{{\"workload\":\"{w}\",{}", &json[1..])
                })
                .collect();
            println!("[{}]", objects.join(",\n"));
        }
        "csv" => {
            println!(
                "workload,policy,requests,prompt_tokens,prefill_tokens,hit_ratio,ideal_hit_ratio,\
                 pooled_ideal_hit_ratio,imbalance,ttft_p50_s,ttft_p90_s,ttft_p99_s,tpot_p50_s,\
                 tpot_p99_s,e2e_p99_s,goodput,preemptions,makespan_s,decision_ns"
            );
            for (w, r) in rows {
                println!(
                    "{w},{},{},{},{},{:.4},{:.4},{:.4},{:.3},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{},{:.1},{:.0}",
                    r.policy,
                    r.requests,
                    r.prompt_tokens,
                    r.prefill_tokens,
                    r.hit_ratio,
                    r.ideal_hit_ratio,
                    r.pooled_ideal_hit_ratio,
                    r.imbalance,
                    r.ttft_p50_s,
                    r.ttft_p90_s,
                    r.ttft_p99_s,
                    r.tpot_p50_s,
                    r.tpot_p99_s,
                    r.e2e_p99_s,
                    r.goodput,
                    r.preemptions,
                    r.makespan_s,
                    r.decision_ns
                );
            }
        }
        _ => {
            let mut last = "";
            for (w, r) in rows {
                if w != last {
                    println!(
                        "\n{w}: {} requests, {} prompt tokens; ideal hit ratio {:.3}, pooled {:.3}",
                        r.requests, r.prompt_tokens, r.ideal_hit_ratio, r.pooled_ideal_hit_ratio
                    );
                    println!(
                        "{:<18} {:>14} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>9}",
                        "policy",
                        "prefill tokens",
                        "hit",
                        "/pooled",
                        "imbalance",
                        "ttft p50",
                        "ttft p99",
                        "tpot p99",
                        "goodput",
                        "preempt",
                        "route µs"
                    );
                    last = w;
                }
                let pooled = if r.pooled_ideal_hit_ratio > 0.0 {
                    r.hit_ratio / r.pooled_ideal_hit_ratio
                } else {
                    0.0
                };
                println!(
                    "{:<18} {:>14} {:>7.3} {:>8.1}% {:>9.3} {:>8.3}s {:>8.3}s {:>8.3}s {:>8.3} {:>8} {:>9.2}",
                    r.policy,
                    r.prefill_tokens,
                    r.hit_ratio,
                    pooled * 100.0,
                    r.imbalance,
                    r.ttft_p50_s,
                    r.ttft_p99_s,
                    r.tpot_p99_s,
                    r.goodput,
                    r.preemptions,
                    r.decision_ns / 1000.0
                );
            }
        }
    }
}

/// Writes one JSON line per request of every run: its workload, policy and record.
fn write_requests(path: &str, rows: &[(String, SimReport)]) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for (workload, report) in rows {
        let policy = report.policy.replace(['"', '\\'], "");
        let workload = workload.replace(['"', '\\'], "");
        for record in &report.request_records {
            let json = record.to_json();
            writeln!(
                out,
                "{{\"workload\":\"{workload}\",\"policy\":\"{policy}\",{}",
                &json[1..]
            )?;
        }
    }
    out.flush()
}

/// Runs every policy on `sim`, on as many threads as the machine has cores (each policy
/// on one thread; the simulation is deterministic, so the reports do not depend on it),
/// in the order of `policies`. With one thread a progress bar goes to stderr, otherwise a
/// line per finished policy.
fn run_all(
    sim: &Simulation,
    policies: &[&str],
    args: &Args,
    name: &str,
    done: usize,
    total: usize,
) -> Vec<Result<SimReport, Error>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .min(policies.len());
    let label = |k: usize| format!("[{:>2}/{total}] {name}: {}", done + k + 1, policies[k]);
    if threads <= 1 {
        return (0..policies.len())
            .map(|k| run(sim, policies[k], args, &label(k)))
            .collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new((0..policies.len()).map(|_| None).collect::<Vec<_>>());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if k >= policies.len() {
                        break;
                    }
                    let report = run_quiet(sim, policies[k], args);
                    eprintln!("{}", label(k));
                    results
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)[k] = Some(report);
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .into_iter()
        .map(|r| r.unwrap_or_else(|| unreachable!("every policy ran")))
        .collect()
}

/// The router of `policy` for `args`' fleet.
fn router(policy: &str, args: &Args) -> Result<std::sync::Arc<dyn prefix_router::Router>, Error> {
    let c = &args.cluster;
    let options = PolicyOptions {
        block_size: c.block_size,
        capacity_tokens: Some(c.capacity_tokens),
        prefill_tokens_per_s: c.prefill_tokens_per_s,
        alpha: args.alpha,
        miss_weight: args.miss_weight,
    };
    let Some(router) = policy::build(policy, c.workers, &options) else {
        unreachable!("policy names are checked when parsing");
    };
    router
}

/// Runs one policy without a progress bar.
fn run_quiet(sim: &Simulation, policy: &str, args: &Args) -> Result<SimReport, Error> {
    sim.run(router(policy, args)?.as_ref())
}

/// Runs one policy with a progress bar on stderr.
fn run(sim: &Simulation, policy: &str, args: &Args, label: &str) -> Result<SimReport, Error> {
    let router = router(policy, args)?;
    let mut shown = usize::MAX;
    let mut bar = |done: usize, total: usize| {
        let pct = done * 100 / total.max(1);
        if pct != shown {
            shown = pct;
            let filled = pct * 30 / 100;
            eprint!(
                "\r{label:<44} [{}{}] {pct:>3}%",
                "#".repeat(filled),
                " ".repeat(30 - filled)
            );
        }
    };
    let report = sim.run_with_progress(router.as_ref(), &mut bar);
    eprintln!();
    report
}

/// Draws each workload's policies as points of hit ratio against TTFT p99, with the alpha
/// sweep of the weighted score as a line.
fn plot(
    path: &str,
    rows: &[(String, SimReport)],
    sweeps: &[(String, Vec<(f64, SimReport)>)],
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let height = 420 * sweeps.len().max(1) as u32;
    let root = SVGBackend::new(path, (760, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((sweeps.len().max(1), 1));
    for (area, (name, sweep)) in areas.iter().zip(sweeps) {
        let points: Vec<&SimReport> = rows
            .iter()
            .filter(|(w, _)| w == name)
            .map(|(_, r)| r)
            .collect();
        let max_p99 = points
            .iter()
            .copied()
            .chain(sweep.iter().map(|(_, r)| r))
            .map(|r| r.ttft_p99_s)
            .fold(0.0, f64::max)
            * 1.15
            + 1e-3;
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{name}: hit ratio vs TTFT p99"), ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..1f64, 0f64..max_p99)?;
        chart
            .configure_mesh()
            .x_desc("hit ratio")
            .y_desc("TTFT p99 (s)")
            .draw()?;
        chart
            .draw_series(LineSeries::new(
                sweep.iter().map(|(_, r)| (r.hit_ratio, r.ttft_p99_s)),
                &BLUE,
            ))?
            .label("balanced_weighted, alpha 0.0 to 1.0")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLUE));
        chart.draw_series(sweep.iter().map(|(alpha, r)| {
            EmptyElement::at((r.hit_ratio, r.ttft_p99_s))
                + Circle::new((0, 0), 2, BLUE.filled())
                + Text::new(format!("{alpha:.1}"), (4, 4), ("sans-serif", 9))
        }))?;
        chart.draw_series(points.iter().map(|r| {
            EmptyElement::at((r.hit_ratio, r.ttft_p99_s))
                + Circle::new((0, 0), 4, RED.filled())
                + Text::new(r.policy.clone(), (6, -12), ("sans-serif", 11))
        }))?;
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()?;
    }
    root.present()?;
    Ok(())
}
