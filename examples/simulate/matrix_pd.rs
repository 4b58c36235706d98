//! The matrix's disaggregated cells: every prefill/decode decider on a `2xP,6xD` and a
//! `4xP,4xD` fleet, with the crate's decider (`cost`) checked against the field's and the
//! fixed ones.
//!
//! Cells: the agentic and the long-context workloads at 1× and 4×, both Mooncake traces at
//! 1×, engine events. Left out: the Mooncake traces at 4× and every workload at 8×, where
//! the deciders that split every request queue for minutes of simulated time each (the
//! measured figures are in `benches/README.md`).
//!
//! The bar: the cost decider's TTFT p99 at most, and its goodput at least, the
//! best baseline's (every other decider); its TPOT p99 at most independent picks'; on the
//! long-context workload, its TTFT p99 at most 0.8 of the best threshold decider's (`llmd`,
//! `dynamo`).

use super::Failure;
use super::args::Args;
use super::policy::PD_DECIDERS;
use super::runner;
use prefix_router::sim::{Request, SimReport, SyncMode, Workload, load_mooncake};

/// The crate's decider, whose bar each cell checks.
const CHECKED: &str = "cost";

/// The fleets of the disaggregated cells.
const FLEETS: [&str; 2] = ["2xP,6xD", "4xP,4xD"];

/// The deciders that split by a fixed threshold.
const THRESHOLDS: [&str; 2] = ["llmd", "dynamo"];

/// One cell: a workload on a fleet at a load.
struct Cell {
    workload: usize,
    label: String,
    args: Args,
}

/// Runs the disaggregated cells and prints their summary and every decider's figures.
pub(crate) fn run(args: &Args) -> Result<(), Failure> {
    let workloads = workloads(args)?;
    let cells = cells(args, &workloads);
    let sims = runner::run_queue(cells.len(), &|c| {
        let cell = &cells[c];
        runner::simulation(workloads[cell.workload].1.clone(), &cell.args)
    })
    .into_iter()
    .collect::<Result<Vec<_>, _>>()
    .map_err(|e| (e.to_string(), 2))?;
    let jobs: Vec<(usize, usize)> = (0..cells.len())
        .flat_map(|c| (0..PD_DECIDERS.len()).map(move |k| (c, k)))
        .collect();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let reports = runner::run_queue(jobs.len(), &|j| {
        let (c, k) = jobs[j];
        let cell = &cells[c];
        let report = runner::run_with(&sims[c], PD_DECIDERS[k], &cell.args, &mut |_, _| {});
        let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let name = &workloads[cell.workload].0;
        eprintln!(
            "[{n}/{}] {name} {}: {}",
            jobs.len(),
            cell.label,
            PD_DECIDERS[k]
        );
        report
    });
    let mut results: Vec<Vec<SimReport>> = cells.iter().map(|_| Vec::new()).collect();
    for (&(c, _), report) in jobs.iter().zip(reports) {
        results[c].push(report.map_err(|e| (e.to_string(), 2))?);
    }
    print(&workloads, &cells, &results);
    Ok(())
}

/// The workloads: both Mooncake traces (from `data/`), the agentic and the long-context
/// ones.
fn workloads(args: &Args) -> Result<Vec<(String, Vec<Request>)>, Failure> {
    let mut out = Vec::new();
    for trace in ["conversation", "synthetic"] {
        let path = format!("data/mooncake_{trace}_trace.jsonl");
        let requests = load_mooncake(&path).map_err(|e| (format!("{path}: {e}"), 2))?;
        out.push((format!("mooncake {trace}"), requests));
    }
    for name in ["agentic", "long_context"] {
        let requests = Workload::builtin()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, w)| w.generate(args.seed))
            .ok_or_else(|| (format!("no built-in {name} workload"), 2))?;
        out.push((name.replace('_', "-"), requests));
    }
    Ok(out)
}

/// Every cell, in print order.
fn cells(args: &Args, workloads: &[(String, Vec<Request>)]) -> Vec<Cell> {
    let mut cells = Vec::new();
    for fleet in FLEETS {
        for workload in 0..workloads.len() {
            let loads: &[f64] = if workload < 2 { &[1.0] } else { &[1.0, 4.0] };
            for &load in loads {
                let mut a = args.clone();
                a.fleet = Some(fleet.to_owned());
                a.cluster.speedup = load;
                a.cluster.sync = SyncMode::Events;
                cells.push(Cell {
                    workload,
                    label: format!("{fleet}, {load}× events"),
                    args: a,
                });
            }
        }
    }
    cells
}

/// The checked decider's figures in a cell against the others'.
struct Bar {
    /// TTFT p99 over the best baseline's (at most 1).
    ttft: f64,
    /// Goodput over the best baseline's (at least 1).
    goodput: f64,
    /// TPOT p99 over independent picks' (at most 1).
    tpot: f64,
    /// TTFT p99 over the best threshold decider's (at most 0.8, long-context only).
    threshold: Option<f64>,
}

impl Bar {
    fn of(reports: &[SimReport], long_context: bool) -> Option<Bar> {
        let checked = reports.iter().find(|r| r.policy == CHECKED)?;
        let independent = reports.iter().find(|r| r.policy == "independent")?;
        let others = || reports.iter().filter(|r| r.policy != CHECKED);
        let best_ttft = others().map(|r| r.ttft_p99_s).fold(f64::MAX, f64::min);
        let best_goodput = others().map(|r| r.goodput).fold(0.0, f64::max);
        let threshold = reports
            .iter()
            .filter(|r| THRESHOLDS.contains(&r.policy.as_str()))
            .map(|r| r.ttft_p99_s)
            .fold(f64::MAX, f64::min);
        let over = |a: f64, b: f64| if b > 0.0 { a / b } else { 1.0 };
        Some(Bar {
            ttft: over(checked.ttft_p99_s, best_ttft),
            goodput: over(checked.goodput, best_goodput),
            tpot: over(checked.tpot_p99_s, independent.tpot_p99_s),
            threshold: long_context.then(|| over(checked.ttft_p99_s, threshold)),
        })
    }

    /// Each figure with a mark: met or missed.
    fn cells(&self) -> [String; 4] {
        let mark = |ok: bool| if ok { "✓" } else { "✗" };
        [
            format!("{:.3}× {}", self.ttft, mark(self.ttft <= 1.0)),
            format!("{:.3}× {}", self.goodput, mark(self.goodput >= 1.0)),
            format!("{:.2}× {}", self.tpot, mark(self.tpot <= 1.0)),
            self.threshold
                .map_or_else(|| "".to_owned(), |t| format!("{t:.2}× {}", mark(t <= 0.8))),
        ]
    }
}

/// The summary (the cost decider's bar per cell), then every cell's deciders.
fn print(workloads: &[(String, Vec<Request>)], cells: &[Cell], results: &[Vec<SimReport>]) {
    println!(
        "\nDisaggregated cells (the `cost` decider against the other deciders; KV 131,072 bytes a token at 50 GB/s)\n"
    );
    println!(
        "| workload | cell | TTFT p99 / best baseline (≤ 1) | goodput / best baseline (≥ 1) | TPOT p99 / independent (≤ 1) | TTFT p99 / best threshold (≤ 0.8, long-context) |"
    );
    println!("|---|---|---|---|---|---|");
    for (cell, reports) in cells.iter().zip(results) {
        let name = &workloads[cell.workload].0;
        if let Some(bar) = Bar::of(reports, name == "long-context") {
            let [t, g, d, th] = bar.cells();
            println!("| {name} | {} | {t} | {g} | {d} | {th} |", cell.label);
        }
    }
    for (cell, reports) in cells.iter().zip(results) {
        println!("\n**{}, {}**\n", workloads[cell.workload].0, cell.label);
        println!(
            "| decider | hit | TTFT p50 | TTFT p99 | TPOT p99 | e2e p99 | goodput | transfers | GB moved |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        for r in reports {
            let name = if r.policy == CHECKED {
                format!("**{}** ◀", r.policy)
            } else {
                r.policy.clone()
            };
            println!(
                "| {name} | {:.3} | {:.3} s | {:.3} s | {:.4} s | {:.2} s | {:.3} | {} | {:.1} |",
                r.hit_ratio,
                r.ttft_p50_s,
                r.ttft_p99_s,
                r.tpot_p99_s,
                r.e2e_p99_s,
                r.goodput,
                r.transfers,
                r.transfer_bytes as f64 / 1e9
            );
        }
    }
}
