//! The matrix's disaggregated cells: every prefill/decode decider on a `2xP,6xD` and a
//! `4xP,4xD` fleet, with the crate's decider (`cost`) checked against the field's and the
//! fixed ones.
//!
//! Cells: the open-loop agentic (`agentic_open`) and the long-context workloads at 1× and 4× (and at 8× on
//! `2xP,6xD`), both Mooncake traces at 1×, engine events. Left out: the Mooncake traces at
//! 4× and every workload at 8× on `4xP,4xD`, where the deciders that split every request
//! queue for minutes of simulated time each.
//!
//! The bar, for the cost decider:
//! - on the long-context workload at 4× and 8× on `2xP,6xD`, its TTFT p99 at most 0.8 of
//!   the best threshold decider's (`llmd`, `dynamo`);
//! - in every cell, its TTFT p99 within 5 % of, and its goodput (both targets met) at least
//!   0.95 of, the best other decider's;
//! - its TPOT p99 within the TPOT target wherever the prefill workers have room (the
//!   decider that splits every request, `always`, has its TTFT median within the target).
//!
//! A percentile bar is met when at most 1 % of requests, give or take one in 400 (a
//! cell's resolution), are past its bound; a goodput bar, give or take one request in 400.
use super::Failure;
use super::args::Args;
use super::policy::PD_DECIDERS;
use super::runner;
use prefix_router::sim::{Request, RequestRecord, SimReport, SyncMode, Workload, load_mooncake};

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
    /// Whether the cell asks for the lead over the threshold deciders.
    lead: bool,
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

/// The workloads: both Mooncake traces (from `data/`), the open-loop agentic and the
/// long-context ones.
fn workloads(args: &Args) -> Result<Vec<(String, Vec<Request>)>, Failure> {
    let mut out = Vec::new();
    for trace in ["conversation", "synthetic"] {
        let path = format!("data/mooncake_{trace}_trace.jsonl");
        let requests = load_mooncake(&path).map_err(|e| (format!("{path}: {e}"), 2))?;
        out.push((format!("mooncake {trace}"), requests));
    }
    for name in ["agentic_open", "long_context"] {
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
            let loads: &[f64] = match (workload < 2, fleet == LEAD_FLEET) {
                (true, _) => &[1.0],
                (false, true) => &[1.0, 4.0, 8.0],
                (false, false) => &[1.0, 4.0],
            };
            for &load in loads {
                let mut a = args.clone();
                a.fleet = Some(fleet.to_owned());
                a.cluster.speedup = load;
                a.cluster.sync = SyncMode::Events;
                cells.push(Cell {
                    workload,
                    label: format!("{fleet}, {load}× events"),
                    lead: fleet == LEAD_FLEET && load >= 4.0,
                    args: a,
                });
            }
        }
    }
    cells
}

/// The fleet on which the lead over the threshold deciders is asked, at 4× and 8×.
const LEAD_FLEET: &str = "2xP,6xD";

/// The lead asked over the best threshold decider: TTFT p99 at most this share of its.
const LEAD: f64 = 0.8;

/// How near the best other decider the checked one must be elsewhere.
const WITHIN: f64 = 0.05;

/// A cell's resolution: one request in this many.
const RESOLUTION: f64 = 400.0;

/// The share of `reports`' requests whose `value` is past `bound` (a request without one,
/// unserved, is past every bound).
fn share_past(
    report: &SimReport,
    value: impl Fn(&RequestRecord) -> Option<f64>,
    bound: f64,
) -> f64 {
    let records = &report.request_records;
    let past = records
        .iter()
        .filter(|r| value(r).is_none_or(|v| v > bound))
        .count();
    past as f64 / records.len().max(1) as f64
}

/// Whether a 99th percentile is within `bound`, give or take a cell's resolution.
fn p99_within(
    report: &SimReport,
    value: impl Fn(&RequestRecord) -> Option<f64>,
    bound: f64,
) -> bool {
    share_past(report, value, bound) <= 0.01 + 1.0 / RESOLUTION
}

/// The checked decider's figures in a cell against the others'.
struct Bar {
    /// TTFT p99 over the best other decider's, and whether within [`WITHIN`] of it.
    ttft: (f64, bool),
    /// Goodput over the best other decider's, and whether at least 1 − [`WITHIN`] of it.
    goodput: (f64, bool),
    /// TPOT p99 in seconds, and whether within the target; `None` when the prefill
    /// workers have no room (not checked).
    tpot: (f64, Option<bool>),
    /// TTFT p99 over the best threshold decider's, and whether at most [`LEAD`] of it, in
    /// the cells that ask for the lead.
    lead: Option<(f64, bool)>,
}

impl Bar {
    fn of(reports: &[SimReport], args: &Args, lead: bool) -> Option<Bar> {
        let checked = reports.iter().find(|r| r.policy == CHECKED)?;
        let always = reports.iter().find(|r| r.policy == "always")?;
        let others = || reports.iter().filter(|r| r.policy != CHECKED);
        let best_ttft = others().map(|r| r.ttft_p99_s).fold(f64::MAX, f64::min);
        let best_goodput = others().map(|r| r.goodput).fold(0.0, f64::max);
        let threshold = reports
            .iter()
            .filter(|r| THRESHOLDS.contains(&r.policy.as_str()))
            .map(|r| r.ttft_p99_s)
            .fold(f64::MAX, f64::min);
        let over = |a: f64, b: f64| if b > 0.0 { a / b } else { 1.0 };
        let ttft = |r: &RequestRecord| r.ttft_s;
        let tpot = |r: &RequestRecord| r.tpot_s.or(r.ttft_s.map(|_| 0.0));
        let (ttft_target, tpot_target) = (args.cluster.ttft_target_s, args.cluster.tpot_target_s);
        let room = always.ttft_p50_s <= ttft_target;
        Some(Bar {
            ttft: (
                over(checked.ttft_p99_s, best_ttft),
                p99_within(checked, ttft, best_ttft * (1.0 + WITHIN)),
            ),
            goodput: (
                over(checked.goodput, best_goodput),
                checked.goodput >= best_goodput * (1.0 - WITHIN) - 1.0 / RESOLUTION,
            ),
            tpot: (
                checked.tpot_p99_s,
                room.then(|| p99_within(checked, tpot, tpot_target)),
            ),
            lead: lead.then(|| {
                (
                    over(checked.ttft_p99_s, threshold),
                    p99_within(checked, ttft, threshold * LEAD),
                )
            }),
        })
    }

    /// Each figure with a mark: met, missed, or not checked.
    fn cells(&self) -> [String; 4] {
        let mark = |ok: bool| if ok { "✓" } else { "✗" };
        [
            format!("{:.3}× {}", self.ttft.0, mark(self.ttft.1)),
            format!("{:.3}× {}", self.goodput.0, mark(self.goodput.1)),
            match self.tpot.1 {
                Some(ok) => format!("{:.3} s {}", self.tpot.0, mark(ok)),
                None => format!("{:.3} s (prefill full)", self.tpot.0),
            },
            self.lead
                .map_or_else(String::new, |(t, ok)| format!("{t:.2}× {}", mark(ok))),
        ]
    }
}

/// The summary (the cost decider's bar per cell), then every cell's deciders.
fn print(workloads: &[(String, Vec<Request>)], cells: &[Cell], results: &[Vec<SimReport>]) {
    println!(
        "\nDisaggregated cells (the `cost` decider against the other deciders; KV 131,072 bytes a token at 50 GB/s; the pair router holds each request to the TPOT target)\n"
    );
    println!(
        "| workload | cell | TTFT p99 / best other (≤ 1.05) | goodput / best other (≥ 0.95) | TPOT p99 (≤ target where prefill has room) | TTFT p99 / best threshold (≤ 0.8: long-context, 4× and 8× on 2xP,6xD) |"
    );
    println!("|---|---|---|---|---|---|");
    for (cell, reports) in cells.iter().zip(results) {
        let name = &workloads[cell.workload].0;
        let lead = cell.lead && name == "long-context";
        if let Some(bar) = Bar::of(reports, &cell.args, lead) {
            let [t, g, d, th] = bar.cells();
            println!("| {name} | {} | {t} | {g} | {d} | {th} |", cell.label);
        }
    }
    for (cell, reports) in cells.iter().zip(results) {
        println!("\n**{}, {}**\n", workloads[cell.workload].0, cell.label);
        println!(
            "| decider | hit | TTFT p50 | TTFT p99 | TPOT p99 | e2e p99 | goodput | TTFT error p50 / p90 | transfers | GB moved |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
        for r in reports {
            let name = if r.policy == CHECKED {
                format!("**{}** ◀", r.policy)
            } else {
                r.policy.clone()
            };
            println!(
                "| {name} | {:.3} | {:.3} s | {:.3} s | {:.4} s | {:.2} s | {:.3} | {:.0} % / {:.0} % | {} | {:.1} |",
                r.hit_ratio,
                r.ttft_p50_s,
                r.ttft_p99_s,
                r.tpot_p99_s,
                r.e2e_p99_s,
                r.goodput,
                r.ttft_error_p50 * 100.0,
                r.ttft_error_p90 * 100.0,
                r.transfers,
                r.transfer_bytes as f64 / 1e9
            );
        }
    }
}
