//! `--matrix`: every policy in every cell of the results matrix, with the recommended
//! policy's bar checked in each, as Markdown on stdout.
//!
//! Cells: the two Mooncake traces and the open-loop agentic workload (`agentic_open`),
//! each at loads 1×, 4× and 8× (arrival rates multiplied) under each sync mode (engine
//! events, miss feedback, optimistic: no correction, the mirror told no capacity); the
//! closed-loop agentic workloads (`agentic`, `agentic_swarm`) and the agents with long answers
//! (`agentic_long`) at 1×, 4× and 8× with events;
//! then the conversation trace at 4× with events with 4 router replicas, with half the
//! fleet at half speed (the routers not told, then told), with a worker out for a quarter
//! of the trace, with a host tier four times each worker's KV (the pooled reference then
//! holds both tiers) and with load reports every 5 s, and the open-loop agentic workload at
//! 4× with 4 replicas; a fleet larger than its load (`larger_fleet_cells`); the admission
//! cells; the replica sync cells (`replica_sync_cells`); then the
//! disaggregated cells ([`matrix_pd`](super::matrix_pd)). A policy that reads
//! no cache routes alike under every sync mode: it runs once per workload and load, and its
//! report stands in the three sync cells. A cell where no
//! policy reaches goodput 0.5 is past the fleet's capacity: its bar is marked – (not
//! checked). Everything else is as the other flags say.

use super::Failure;
use super::args::Args;
use super::needless::needless_shed;
use super::policy::POLICIES;
use super::runner;
use prefix_router::sim::{PriorityMix, Request, SimReport, SyncMode, Workload, load_mooncake};

/// The recommended policy, whose bar each cell checks.
pub(super) const RECOMMENDED: &str = "balanced";

/// Policies run in the admission cells at 8×: the recommended one and the peers', each
/// with its own admission rule.
pub(super) const ADMISSION_POLICIES: [&str; 3] = [RECOMMENDED, "llmd", "dynamo"];

/// Priorities drawn in the admission cells: sheddable 0.3, standard 0.6, critical 0.1.
pub(super) const ADMISSION_PRIORITIES: PriorityMix = PriorityMix {
    shares: [0.3, 0.6, 0.1],
};

/// The most of all requests an admission cell may shed needlessly (requests its run
/// without admission served within both targets they were held to): checked at 1× and 4×
/// in the matrix, at 8× on the engine-profile axis.
const NEEDLESS_SHED_BAR: f64 = 0.005;

/// One cell: a workload under one setting.
pub(super) struct Cell {
    /// Index of the cell's workload in the matrix's workloads.
    pub(super) workload: usize,
    pub(super) label: String,
    pub(super) args: Args,
    /// The cell that differs from this one in its sync mode only: a policy reading no cache
    /// routes alike under every sync mode, so its run there stands for this cell's.
    pub(super) sync_sibling: Option<usize>,
    /// The policies the cell runs: every one of `POLICIES` when `None`.
    pub(super) only: Option<&'static [&'static str]>,
    /// Whether the cell is the workload's fleet at one load (no replicas, faults or other
    /// fleet): its goodput counts toward the fleet's peak.
    pub(super) plain: bool,
    /// For a cell with admission: the cell that differs from it in admission alone (and the
    /// priorities, which only admission reads), running at least the same policies, against
    /// which its sheds are joined ([`needless_shed`]).
    pub(super) twin: Option<usize>,
    /// Whether the recommended policy's hit ratio must also reach `cache_aware`'s (a
    /// fleet larger than its load, where nothing but placement loses a prefix).
    pub(super) hit_floor: bool,
}

impl Cell {
    /// Whether the cell runs `POLICIES[k]`.
    fn runs(&self, k: usize) -> bool {
        self.only.is_none_or(|only| only.contains(&POLICIES[k]))
    }
}

/// The goodput (share of requests within both targets) that some policy must reach in a
/// cell for the cell to be within the fleet's capacity.
pub(super) const CAPACITY_GOODPUT: f64 = 0.5;

/// The bar of the recommended policy in a cell.
pub(super) struct Bar {
    /// No policy reaches goodput [`CAPACITY_GOODPUT`]: the cell is past the fleet's
    /// capacity, and the bar does not apply (admission is what it needs).
    pub(super) past_capacity: bool,
    /// Replicas that share no records (sync off): their figures are reported, not held to
    /// the bar (the sync records are what replicas are for; the cell shows why).
    unsynced: bool,
    /// Hit ratio over the pooled reference's, at least 0.95.
    pooled: f64,
    /// TTFT p99: against the best policy's, or the target.
    ttft: Tail,
    /// TPOT p99: against round robin's, or the target.
    tpot: Tail,
    /// Goodput over the best policy's, at least 0.95.
    goodput: f64,
    /// Session completion time p50 and p99 over the best policy's; `None` where the
    /// workload has no sessions.
    session: Option<(f64, f64)>,
    /// Whether the workload's steps wait for their answers: its sessions are its bar
    /// (p50 and p99 at most 1.10× the best), its steps' TTFT p99 within the target.
    closed_loop: bool,
    /// The hit ratio over `cache_aware`'s, at least 1, where the cell asks
    /// ([`Cell::hit_floor`]).
    cache_aware: Option<f64>,
}

/// How far past the best policy (or round robin, for TPOT) a relative bar lets a figure be.
const TAIL_SLACK: f64 = 1.10;

/// The share of its target a latency reference must reach for a relative tail bar to
/// bind: below it (a TTFT p99 of the best policy under 0.2 s against 2 s, a TPOT p99 of
/// round robin under 10 ms against 0.1 s) every policy is far within the target, ratios
/// between small figures say little a user would feel, and the target binds instead.
const REFERENCE_SHARE: f64 = 0.1;

/// A latency p99 and the rule that judges it.
#[derive(Clone, Copy, Debug)]
enum Tail {
    /// Over its reference (at least [`REFERENCE_SHARE`] of the target): at most
    /// [`TAIL_SLACK`].
    Relative(f64),
    /// Within the target, `why` the relative rule does not apply.
    Target {
        p99: f64,
        target: f64,
        why: &'static str,
    },
}

impl Tail {
    /// The rule for `p99` against `reference` and `target`.
    fn of(p99: f64, reference: f64, target: f64) -> Tail {
        if reference >= REFERENCE_SHARE * target {
            Tail::Relative(if reference > 0.0 {
                p99 / reference
            } else {
                1.0
            })
        } else {
            Tail::Target {
                p99,
                target,
                why: "reference < ⅒ target",
            }
        }
    }

    fn ok(&self) -> bool {
        match *self {
            Tail::Relative(r) => r <= TAIL_SLACK,
            Tail::Target { p99, target, .. } => p99 <= target,
        }
    }

    /// The figure as the summary prints it, before its mark.
    fn text(&self) -> String {
        match *self {
            Tail::Relative(r) => format!("{r:.2}×"),
            Tail::Target { p99, target, why } => {
                format!("{p99:.3} s ≤ {target} s ({why})")
            }
        }
    }
}

impl Bar {
    /// The recommended policy's bar among `reports` (one cell's, round robin's among them)
    /// with the cell's `targets` (TTFT, TPOT) on a workload that is `closed_loop` or not;
    /// `None` when either policy is missing.
    pub(super) fn of(reports: &[SimReport], targets: (f64, f64), closed_loop: bool) -> Option<Bar> {
        let rec = reports.iter().find(|r| r.policy == RECOMMENDED)?;
        let rr = reports.iter().find(|r| r.policy == "round_robin")?;
        let least = |f: fn(&SimReport) -> f64| {
            reports
                .iter()
                .map(f)
                .filter(|&v| v > 0.0)
                .fold(f64::MAX, f64::min)
        };
        let best_goodput = reports.iter().map(|r| r.goodput).fold(0.0, f64::max);
        let over = |a: f64, b: f64| if b > 0.0 && b < f64::MAX { a / b } else { 1.0 };
        let ttft = if closed_loop {
            Tail::Target {
                p99: rec.ttft_p99_s,
                target: targets.0,
                why: "closed loop: per step",
            }
        } else {
            Tail::of(rec.ttft_p99_s, least(|r| r.ttft_p99_s), targets.0)
        };
        let session = (rec.session_p99_s > 0.0).then(|| {
            (
                over(rec.session_p50_s, least(|r| r.session_p50_s)),
                over(rec.session_p99_s, least(|r| r.session_p99_s)),
            )
        });
        Some(Bar {
            past_capacity: reports.iter().all(|r| r.goodput < CAPACITY_GOODPUT),
            unsynced: false,
            pooled: rec.ratio_to_pooled(),
            ttft,
            tpot: Tail::of(rec.tpot_p99_s, rr.tpot_p99_s, targets.1),
            goodput: over(rec.goodput, best_goodput),
            session,
            closed_loop,
            cache_aware: None,
        })
    }

    /// The same bar asking the recommended policy's hit ratio to reach `cache_aware`'s
    /// among `reports` too.
    pub(super) fn with_hit_floor(mut self, reports: &[SimReport]) -> Bar {
        let rec = reports.iter().find(|r| r.policy == RECOMMENDED);
        let ca = reports.iter().find(|r| r.policy == "cache_aware");
        if let (Some(rec), Some(ca)) = (rec, ca) {
            self.cache_aware = Some(if ca.hit_ratio > 0.0 {
                rec.hit_ratio / ca.hit_ratio
            } else {
                1.0
            });
        }
        self
    }

    /// The same bar for replicas that share no records: reported, not held to it.
    pub(super) fn unsynced(mut self) -> Bar {
        self.unsynced = true;
        self
    }

    /// The mark of a figure of the bar that is `ok` or not: met or missed (or past
    /// capacity: –; replicas without sync: reported).
    pub(super) fn mark(&self, ok: bool) -> &'static str {
        match (self.past_capacity, self.unsynced, ok) {
            (true, _, _) => "–",
            (false, true, _) => "(sync off: reported)",
            (false, false, true) => "✓",
            (false, false, false) => "✗",
        }
    }

    /// Whether each figure meets its bar, in the order of [`cells`](Self::cells).
    pub(super) fn checks(&self) -> [bool; 4] {
        [
            self.pooled >= 0.95 && self.cache_aware.is_none_or(|r| r >= 1.0),
            self.ttft.ok(),
            self.tpot.ok(),
            self.goodput >= 0.95,
        ]
    }

    /// Each figure with a mark: met or missed (or past capacity: –).
    pub(super) fn cells(&self) -> [String; 4] {
        let [p, t, d, g] = self.checks().map(|ok| self.mark(ok));
        let floor = self
            .cache_aware
            .map_or(String::new(), |r| format!(" ({r:.3}× cache_aware)"));
        [
            format!("{:.1} %{floor} {p}", self.pooled * 100.0),
            format!("{} {t}", self.ttft.text()),
            format!("{} {d}", self.tpot.text()),
            format!("{:.2}× {g}", self.goodput),
        ]
    }

    /// The session completion times' figures, p50 and p99 over the best policy's: marked
    /// (at most 1.10× each) on a closed-loop workload, where they are the bar; printed
    /// alone elsewhere; or "no sessions".
    pub(super) fn session_cell(&self) -> String {
        match self.session {
            Some((p50, p99)) if self.closed_loop => format!(
                "{p50:.2}× / {p99:.2}× {}",
                self.mark(p50 <= TAIL_SLACK && p99 <= TAIL_SLACK)
            ),
            Some((p50, p99)) => format!("{p50:.2}× / {p99:.2}× (open loop: reported)"),
            None => "no sessions".to_owned(),
        }
    }
}

/// The header of the bar's summary table, its first columns `first` (such as
/// `| workload | cell `).
pub(super) fn bar_header(first: &str) -> String {
    format!(
        "{first}| hit / pooled (≥ 95 %) | TTFT p99 / best (≤ 1.10; closed loop, or best < 0.2 s: ≤ target) | TPOT p99, answers ≥ 16 tokens / round robin (≤ 1.10; round robin < 10 ms: ≤ target) | goodput / best (≥ 0.95) | session p50 / p99 over best (closed loop: ≤ 1.10 each) |"
    )
}

/// Whether workload `name` is closed-loop (its steps wait for their answers).
pub(super) fn closed_loop(name: &str) -> bool {
    CLOSED_LOOP.contains(&name)
}

/// Runs the matrix and prints it, then the disaggregated cells.
pub(crate) fn run(args: &Args) -> Result<(), Failure> {
    let workloads = workloads(args)?;
    let cells = cells(args, &workloads);
    let results = run_cells(args, &workloads, &cells)?;
    let needless = needless_sheds(&cells, &results)?;
    print(&workloads, &cells, &results, &needless);
    super::matrix_pd::run(args)
}

/// Runs every policy of every cell: every (cell, policy) run is one job of one queue over
/// the machine's cores (the simulations first, each built once and shared by the cell's
/// policies), so that no core waits for a cell's last policy. Each cell's reports in the
/// order of `POLICIES`, those it does not run left out.
pub(super) fn run_cells(
    args: &Args,
    workloads: &[(String, Vec<Request>)],
    cells: &[Cell],
) -> Result<Vec<Vec<SimReport>>, Failure> {
    let sims = runner::run_queue(cells.len(), &|c| {
        let cell = &cells[c];
        runner::simulation(workloads[cell.workload].1.clone(), &cell.args)
    })
    .into_iter()
    .collect::<Result<Vec<_>, _>>()
    .map_err(|e| (e.to_string(), 2))?;
    let reads_cache = runner::reads_cache(&POLICIES, args).map_err(|e| (e.to_string(), 2))?;
    let jobs = jobs(workloads, cells, &reads_cache);
    let done = std::sync::atomic::AtomicUsize::new(0);
    let reports = runner::run_queue(jobs.len(), &|j| {
        let (c, k) = jobs[j];
        let report = runner::run_with(&sims[c], POLICIES[k], &cells[c].args, &mut |_, _| {});
        let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let cell = &cells[c];
        let name = &workloads[cell.workload].0;
        eprintln!(
            "[{n}/{}] {name} {}: {}",
            jobs.len(),
            cell.label,
            POLICIES[k]
        );
        report
    });
    let mut results: Vec<Vec<Option<SimReport>>> = cells
        .iter()
        .map(|_| POLICIES.iter().map(|_| None).collect())
        .collect();
    for (&(c, k), report) in jobs.iter().zip(reports) {
        results[c][k] = Some(report.map_err(|e| (e.to_string(), 2))?);
    }
    for (c, cell) in cells.iter().enumerate() {
        if let Some(sibling) = cell.sync_sibling {
            for k in (0..POLICIES.len()).filter(|&k| !reads_cache[k]) {
                results[c][k] = results[sibling][k].clone();
            }
        }
    }
    Ok(results
        .into_iter()
        .map(|cell| cell.into_iter().flatten().collect())
        .collect())
}

/// Every (cell, policy) pair to run, the longest first as far as can be told before
/// running: cells by their workload's prompt tokens times their router replicas (each
/// replica keeps its own mirror), then policies from the last of `POLICIES` (those reading
/// the cache, the slowest). Among equals, print order. A policy reading no cache
/// (`reads_cache[k]` false) runs only in a cell without a sync sibling.
fn jobs(
    workloads: &[(String, Vec<Request>)],
    cells: &[Cell],
    reads_cache: &[bool],
) -> Vec<(usize, usize)> {
    let weight = |cell: &Cell| {
        let tokens: usize = workloads[cell.workload]
            .1
            .iter()
            .map(|r| r.prompt.len())
            .sum();
        tokens.saturating_mul(cell.args.replicas as usize)
    };
    let mut order: Vec<usize> = (0..cells.len()).collect();
    order.sort_by_key(|&c| std::cmp::Reverse(weight(&cells[c])));
    order
        .into_iter()
        .flat_map(|c| (0..POLICIES.len()).rev().map(move |k| (c, k)))
        .filter(|&(c, k)| cells[c].runs(k))
        .filter(|&(c, k)| reads_cache[k] || cells[c].sync_sibling.is_none())
        .collect()
}

/// The matrix's workloads: both Mooncake traces and the open-loop agentic one (each on
/// every sync mode, then in the admission cells), then the closed-loop agentic ones and
/// the agents with long answers.
fn workloads(args: &Args) -> Result<Vec<(String, Vec<Request>)>, Failure> {
    SYNC_WORKLOADS
        .into_iter()
        .chain(CLOSED_LOOP)
        .chain(LONG_ANSWERS)
        .map(|name| workload(name, args))
        .collect()
}

/// The workloads run under every sync mode and with admission.
const SYNC_WORKLOADS: [&str; 3] = [
    "mooncake conversation",
    "mooncake synthetic",
    "agentic_open",
];

/// The closed-loop workloads, run with engine events.
const CLOSED_LOOP: [&str; 2] = ["agentic", "agentic_swarm"];

/// Open-loop agents whose answers run to thousands of tokens, so that decoding fills the
/// batches while prefill queues stay short; run with engine events.
const LONG_ANSWERS: [&str; 1] = ["agentic_long"];

/// The matrix's workload called `name` with its requests: `mooncake conversation` and
/// `mooncake synthetic` are the Mooncake traces in `data/`, `agentic` the built-in
/// workload at the workloads' seed.
pub(super) fn workload(name: &str, args: &Args) -> Result<(String, Vec<Request>), Failure> {
    if let Some(trace) = name.strip_prefix("mooncake ") {
        let path = format!("data/mooncake_{trace}_trace.jsonl");
        let requests = load_mooncake(&path).map_err(|e| (format!("{path}: {e}"), 2))?;
        return Ok((name.to_owned(), requests));
    }
    Workload::builtin()
        .into_iter()
        .find(|(builtin, _)| *builtin == name)
        .map(|(_, w)| (name.to_owned(), w.generate(args.seed)))
        .ok_or_else(|| (format!("no built-in {name} workload"), 2))
}

/// Every cell, in print order.
fn cells(args: &Args, workloads: &[(String, Vec<Request>)]) -> Vec<Cell> {
    let syncs = [
        ("events", SyncMode::Events),
        ("feedback", SyncMode::Feedback),
        ("optimistic", SyncMode::None),
    ];
    let mut cells = Vec::new();
    for workload in 0..SYNC_WORKLOADS.len().min(workloads.len()) {
        for load in [1.0, 4.0, 8.0] {
            let first = cells.len();
            for (sync_name, sync) in syncs {
                let mut a = args.clone();
                a.cluster.speedup = load;
                a.cluster.sync = sync;
                let label = format!("{load}× {sync_name}");
                cells.push(Cell {
                    workload,
                    label,
                    args: a,
                    sync_sibling: (cells.len() > first).then_some(first),
                    only: None,
                    plain: true,
                    twin: None,
                    hit_floor: false,
                });
            }
        }
    }
    cells.extend(closed_loop_cells(args, workloads));
    let mut base = args.clone();
    base.cluster.speedup = 4.0;
    base.cluster.sync = SyncMode::Events;
    let workers = base.cluster.workers;
    let mut replicas = base.clone();
    replicas.replicas = 4;
    let mut mixed = base.clone();
    mixed.fleet = Some(format!("{}x1.0,{}x0.5", workers - workers / 2, workers / 2));
    let mut known = mixed.clone();
    known.router_speeds_known = true;
    let mut slow_reports = base.clone();
    slow_reports.cluster.scrape_interval_s = 5.0;
    let mut host = base.clone();
    host.cluster.batch.host_capacity_tokens = 4 * base.cluster.capacity_tokens;
    let mut fault = base.clone();
    let end = workloads[0].1.last().map_or(0.0, |r| r.arrival_s) / base.cluster.speedup;
    fault.faults = Some(format!(
        "{}@{:.0}-{:.0}",
        workers.saturating_sub(1),
        end * 0.25,
        end * 0.5
    ));
    for (label, a) in [
        ("4× events, 4 replicas".to_owned(), replicas),
        (
            format!(
                "4× events, fleet {}",
                mixed.fleet.clone().unwrap_or_default()
            ),
            mixed,
        ),
        (
            format!(
                "4× events, fault {}",
                fault.faults.clone().unwrap_or_default()
            ),
            fault,
        ),
        ("4× events, host tier 4× the GPU's".to_owned(), host),
        (
            format!(
                "4× events, fleet {}, speeds known",
                known.fleet.clone().unwrap_or_default()
            ),
            known,
        ),
        ("4× events, load reports every 5 s".to_owned(), slow_reports),
    ] {
        cells.push(Cell {
            workload: 0,
            label,
            args: a,
            sync_sibling: None,
            only: None,
            plain: false,
            twin: None,
            hit_floor: false,
        });
    }
    let mut agentic = base.clone();
    agentic.replicas = 4;
    cells.push(Cell {
        workload: 2,
        label: "4× events, 4 replicas".to_owned(),
        args: agentic,
        sync_sibling: None,
        only: None,
        plain: false,
        twin: None,
        hit_floor: false,
    });
    cells.extend(larger_fleet_cells(args));
    let admission = admission_cells(args, SYNC_WORKLOADS.len().min(workloads.len()), &cells);
    cells.extend(admission);
    cells.extend(replica_sync_cells(args, workloads));
    cells
}

/// The closed-loop workloads and the agents with long answers (after the matrix's others
/// in `workloads`) at 1×, 4× and 8× with engine events.
fn closed_loop_cells(args: &Args, workloads: &[(String, Vec<Request>)]) -> Vec<Cell> {
    let mut cells = Vec::new();
    for workload in SYNC_WORKLOADS.len()..workloads.len() {
        for load in [1.0, 4.0, 8.0] {
            let mut a = args.clone();
            a.cluster.speedup = load;
            a.cluster.sync = SyncMode::Events;
            cells.push(Cell {
                workload,
                label: format!("{load}× events"),
                args: a,
                sync_sibling: None,
                only: None,
                plain: true,
                twin: None,
                hit_floor: false,
            });
        }
    }
    cells
}

/// A fleet larger than its load, where placement alone can lose a prefix: the
/// conversation trace with engine events and spread arrivals at 0.25×, 0.5× and 1×, then at
/// 1× on a fleet twice and three times as fast as the routers believe. The recommended
/// policy's hit ratio must reach `cache_aware`'s there too.
fn larger_fleet_cells(args: &Args) -> Vec<Cell> {
    let mut base = args.clone();
    base.cluster.sync = SyncMode::Events;
    base.cluster.arrivals = prefix_router::sim::Arrivals::Spread;
    let workers = base.cluster.workers;
    let mut settings: Vec<(String, Args)> = [0.25, 0.5, 1.0]
        .into_iter()
        .map(|load| {
            let mut a = base.clone();
            a.cluster.speedup = load;
            (format!("{load}× events, spread"), a)
        })
        .collect();
    for speed in ["2.0", "3.0"] {
        let mut a = base.clone();
        a.cluster.speedup = 1.0;
        a.fleet = Some(format!("{workers}x{speed}"));
        settings.push((format!("1× events, spread, fleet {workers}x{speed}"), a));
    }
    settings
        .into_iter()
        .map(|(label, args)| Cell {
            workload: 0,
            label,
            args,
            sync_sibling: None,
            only: None,
            plain: false,
            twin: None,
            hit_floor: true,
        })
        .collect()
}

/// The replica sync cells, beside one router on the same arrivals: the conversation trace
/// at 4× with events and arrivals spread, one router, then 4 replicas with sync off and at
/// 1 ms, then 4 replicas at 1 ms on a fleet of half at half speed; the agentic workload at
/// 4× with 4 replicas at 1 ms (its one router is the plain 4× events cell). The
/// recommended policy, round robin and the peers' policies that read the cache.
fn replica_sync_cells(args: &Args, workloads: &[(String, Vec<Request>)]) -> Vec<Cell> {
    const ONLY: &[&str] = &["round_robin", "llmd", "dynamo", RECOMMENDED];
    let mut base = args.clone();
    base.cluster.speedup = 4.0;
    base.cluster.sync = SyncMode::Events;
    let mut spread = base.clone();
    spread.cluster.arrivals = prefix_router::sim::Arrivals::Spread;
    let replicas = |from: &Args, sync: Option<f64>| {
        let mut a = from.clone();
        a.replicas = 4;
        a.cluster.replica_sync = sync;
        a
    };
    let workers = base.cluster.workers;
    let mut mixed = spread.clone();
    mixed.fleet = Some(format!("{}x1.0,{}x0.5", workers - workers / 2, workers / 2));
    let agentic = workloads
        .iter()
        .position(|(name, _)| name == "agentic_open");
    let cell = |workload, label: &str, args| Cell {
        workload,
        label: label.to_owned(),
        args,
        sync_sibling: None,
        only: Some(ONLY),
        plain: false,
        twin: None,
        hit_floor: false,
    };
    let mut cells = vec![
        cell(0, "4× events, spread, 1 router", spread.clone()),
        cell(
            0,
            "4× events, spread, 4 replicas, sync off",
            replicas(&spread, None),
        ),
        cell(
            0,
            "4× events, spread, 4 replicas, sync 1 ms",
            replicas(&spread, Some(0.001)),
        ),
        cell(
            0,
            "4× events, spread, fleet half at half speed, 4 replicas, sync 1 ms",
            replicas(&mixed, Some(0.001)),
        ),
    ];
    if let Some(agentic) = agentic {
        cells.push(cell(
            agentic,
            "4× events, 4 replicas, sync 1 ms",
            replicas(&base, Some(0.001)),
        ));
    }
    cells
}

/// The admission cells: every workload at each load with engine events, admission on and
/// priorities drawn; the recommended policy alone at 1× and 4× (what it sheds that a
/// worker could serve), the peers' rules beside it at 8×. Each is joined to its twin among
/// `plain` (the cells so far): the same workload and load with engine events, without
/// admission.
fn admission_cells(args: &Args, workloads: usize, plain: &[Cell]) -> Vec<Cell> {
    let mut cells = Vec::new();
    for workload in 0..workloads {
        for (load, warmup) in [(1.0, 0.0), (4.0, 0.0), (8.0, 0.0), (8.0, WARMUP_S)] {
            let mut a = args.clone();
            a.cluster.speedup = load;
            a.cluster.sync = SyncMode::Events;
            let twin = twin_of(plain, workload, &a);
            a.cluster.admission = true;
            a.cluster.priorities = ADMISSION_PRIORITIES;
            a.cluster.warmup_s = warmup;
            let only: &'static [&'static str] = if load < 8.0 {
                &ADMISSION_POLICIES[..1]
            } else {
                &ADMISSION_POLICIES
            };
            let warm = if warmup > 0.0 { ", warm" } else { "" };
            cells.push(Cell {
                workload,
                label: format!("{load}× events, admission{warm}"),
                args: a,
                sync_sibling: None,
                only: Some(only),
                plain: true,
                twin,
                hit_floor: false,
            });
        }
    }
    cells
}

/// Seconds of the workload at 1× a warm admission cell runs before its measured load.
pub(super) const WARMUP_S: f64 = 60.0;

/// The plain cell of `cells` on `workload` whose settings are `args`' as far as the cell
/// knows them (load, sync mode, admission, engine profile, arrivals; a plain cell has no
/// replicas, faults or other fleet), running every policy; `None` when there is none.
pub(super) fn twin_of(cells: &[Cell], workload: usize, args: &Args) -> Option<usize> {
    cells.iter().position(|c| {
        let (a, b) = (&c.args.cluster, &args.cluster);
        c.plain
            && c.only.is_none()
            && c.workload == workload
            && a.speedup == b.speedup
            && a.sync == b.sync
            && a.admission == b.admission
            && a.arrivals == b.arrivals
            && a.batch.profile == b.batch.profile
    })
}

/// Each admission cell's needless sheds per policy (in the order of its reports), joined
/// with its twin's run of the same policy; `None` for a cell without admission or a policy
/// its twin does not run.
///
/// # Errors
///
/// A failure when a cell and its twin ran different requests (a bug of the matrix).
pub(super) fn needless_sheds(
    cells: &[Cell],
    results: &[Vec<SimReport>],
) -> Result<Vec<Vec<Option<f64>>>, Failure> {
    let admission = prefix_router::LoadConfig::default().admission;
    cells
        .iter()
        .zip(results)
        .map(|(cell, reports)| {
            reports
                .iter()
                .map(|r| {
                    let Some(twin) = cell.twin.filter(|_| cell.args.cluster.admission) else {
                        return Ok(None);
                    };
                    let Some(off) = results[twin].iter().find(|o| o.policy == r.policy) else {
                        return Ok(None);
                    };
                    let c = &cell.args.cluster;
                    let targets = (c.ttft_target_s, c.tpot_target_s);
                    needless_shed(
                        &r.request_records,
                        &off.request_records,
                        targets,
                        &admission,
                    )
                    .map(Some)
                    .map_err(|e| (format!("{}: {e}", cell.label), 2))
                })
                .collect()
        })
        .collect()
}

/// The summary (the recommended policy's bar per cell), then every cell's policies.
fn print(
    workloads: &[(String, Vec<Request>)],
    cells: &[Cell],
    results: &[Vec<SimReport>],
    needless: &[Vec<Option<f64>>],
) {
    println!("{}", bar_header("| workload | cell "));
    println!("|---|---|---|---|---|---|---|");
    for (cell, reports) in cells.iter().zip(results) {
        let name = &workloads[cell.workload].0;
        let targets = (
            cell.args.cluster.ttft_target_s,
            cell.args.cluster.tpot_target_s,
        );
        if let Some(bar) = Bar::of(reports, targets, closed_loop(name)) {
            let bar = if cell.hit_floor {
                bar.with_hit_floor(reports)
            } else {
                bar
            };
            let bar = if cell.args.replicas > 1 && cell.args.cluster.replica_sync.is_none() {
                bar.unsynced()
            } else {
                bar
            };
            let [p, t, d, g] = bar.cells();
            println!(
                "| {} | {} | {p} | {t} | {d} | {g} | {} |",
                workloads[cell.workload].0,
                cell.label,
                bar.session_cell()
            );
        }
    }
    print_admission(workloads, cells, results, needless);
    for (cell, reports) in cells.iter().zip(results) {
        println!("\n**{}, {}**\n", workloads[cell.workload].0, cell.label);
        print_policies(reports, false);
    }
}

/// One cell's policies as a table, a line each, the recommended one marked ◀; with
/// `errors`, each policy's TTFT prediction error too (median and 90th percentile).
pub(super) fn print_policies(reports: &[SimReport], errors: bool) {
    let (head, rule) = if errors {
        (" TTFT error p50 | TTFT error p90 |", "---|---|")
    } else {
        ("", "")
    };
    println!(
        "| policy | hit | / pooled | TTFT p50 | TTFT p99 | TPOT p99 (≥ 16 tokens) | short TPOT p99 | e2e p99 | session p50 | session p99 | goodput | preempted | shed |{head}"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|{rule}");
    for r in reports {
        let name = if r.policy == RECOMMENDED {
            format!("**{}** ◀", r.policy)
        } else {
            r.policy.clone()
        };
        let error = if errors {
            format!(
                " {:.1} % | {:.1} % |",
                r.ttft_error_p50 * 100.0,
                r.ttft_error_p90 * 100.0
            )
        } else {
            String::new()
        };
        println!(
            "| {name} | {:.3} | {:.1} % | {:.3} s | {:.3} s | {:.4} s | {:.4} s | {:.2} s | {:.1} s | {:.1} s | {:.3} | {} | {} |{error}",
            r.hit_ratio,
            r.ratio_to_pooled() * 100.0,
            r.ttft_p50_s,
            r.ttft_p99_s,
            r.tpot_p99_s,
            r.short_tpot_p99_s,
            r.e2e_p99_s,
            r.session_p50_s,
            r.session_p99_s,
            r.goodput,
            r.preemptions,
            r.shed
        );
    }
}

/// The admission summary: per admission cell and policy, the goodput per second against
/// the fleet's peak (the highest any policy reaches on the workload's fleet at any load),
/// the shares shed and shed needlessly, the critical requests shed and the admitted
/// requests' TTFT p99.
fn print_admission(
    workloads: &[(String, Vec<Request>)],
    cells: &[Cell],
    results: &[Vec<SimReport>],
    needless: &[Vec<Option<f64>>],
) {
    println!(
        "\nAdmission (priorities sheddable 0.3, standard 0.6, critical 0.1; peak: the highest goodput per second of any policy on the fleet at 1×–8×; {NEEDLESS_SHED_NOTE})\n"
    );
    println!("{}", admission_header("at 1×, 4×"));
    for (c, (cell, reports)) in cells.iter().zip(results).enumerate() {
        if !cell.args.cluster.admission {
            continue;
        }
        let peak = cells
            .iter()
            .zip(results)
            .filter(|(c, _)| c.plain && c.workload == cell.workload)
            .flat_map(|(_, reports)| reports.iter().map(|r| r.goodput_rps))
            .fold(0.0, f64::max);
        for (r, &needless) in reports.iter().zip(&needless[c]) {
            let row = (r, peak, needless);
            let at_8 = cell.args.cluster.speedup >= 8.0;
            let workload = &workloads[cell.workload].0;
            println!("{}", admission_row(workload, cell, row, !at_8));
        }
    }
}

/// The critical requests of `r`'s run per second of its arrivals' span (0 when the span is
/// empty).
fn critical_rate(r: &SimReport) -> f64 {
    let arrivals = r.request_records.iter().map(|q| q.arrival_s);
    let span =
        arrivals.clone().fold(f64::NEG_INFINITY, f64::max) - arrivals.fold(f64::INFINITY, f64::min);
    let critical = r
        .request_records
        .iter()
        .filter(|q| q.priority == prefix_router::Priority::Critical)
        .count();
    if span > 0.0 {
        critical as f64 / span
    } else {
        0.0
    }
}

/// What the admission tables' needless sheds are.
pub(super) const NEEDLESS_SHED_NOTE: &str = "needless shed: the requests shed, of all requests, that the same run without admission served within the targets they were held to (time to first token and per output token)";

/// The admission tables' header, the needless sheds' bar checked `needless_where` (such as
/// `at 1×, 4×`).
pub(super) fn admission_header(needless_where: &str) -> String {
    format!(
        "| workload | cell | policy | goodput | / peak (8×: ≥ 0.95 in the default world, else ≥ 0.90 warm, ≥ 0.75 cold; –: critical requests alone past the peak) | shed | needless shed (≤ 0.5 % {needless_where}) | critical shed (none) | admitted TTFT p99, standard and sheddable (≤ 1.1× target, 8× warm) | TPOT p99, answers ≥ 16 tokens (≤ 1.1× target, 8× warm) | short answers' TPOT p99 / e2e p99 | critical: TTFT p99 / TPOT p99 | lowest 10 s / mean |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
}

/// The share of its fleet's peak an admission cell at 8× must serve: 0.95 in the default
/// world (the fleet the router models), cold or warm; on an engine the router is not told,
/// 0.90 warm (after a minute at 1×) and 0.75 cold.
fn peak_bar(cell: &Cell) -> f64 {
    match (
        cell.args.engine_profile.as_str(),
        cell.args.cluster.warmup_s > 0.0,
    ) {
        ("default", _) => 0.95,
        (_, true) => 0.90,
        (_, false) => 0.75,
    }
}

/// How far over its target an admitted request's latency p99 may be at 8× warm.
const LATENCY_SLACK: f64 = 1.1;

/// One policy's line of an admission table: its report `r` in `cell` on `workload`, the
/// fleet's `peak` goodput per second and its needless sheds (`None`: not joined). The
/// recommended policy's figures are marked against their bars: at 8× its goodput against
/// the peak ([`peak_bar`]), at 8× warm its admitted TTFT and TPOT p99 against 1.1× their
/// targets, with `check_needless` its needless sheds, at every load its critical requests
/// shed (none).
pub(super) fn admission_row(
    workload: &str,
    cell: &Cell,
    (r, peak, needless): (&SimReport, f64, Option<f64>),
    check_needless: bool,
) -> String {
    let at_8 = cell.args.cluster.speedup >= 8.0;
    let ratio = if peak > 0.0 {
        r.goodput_rps / peak
    } else {
        0.0
    };
    let share = r.shed as f64 / r.requests.max(1) as f64;
    // Admission never sheds a critical request: where they alone arrive faster than the
    // fleet's peak goodput, no admission can hold the others' bars.
    let past = critical_rate(r) > peak;
    let warm_8 = at_8 && cell.args.cluster.warmup_s > 0.0;
    let ttft_bar = LATENCY_SLACK * cell.args.cluster.ttft_target_s;
    let tpot_bar = LATENCY_SLACK * cell.args.cluster.tpot_target_s;
    let mark = |checked: bool, ok: bool| match (checked && r.policy == RECOMMENDED, past, ok) {
        (false, ..) => "",
        (true, true, _) => " –",
        (true, false, true) => " ✓",
        (true, false, false) => " ✗",
    };
    let needless = match needless {
        Some(n) => format!(
            "{:.2} %{}",
            n * 100.0,
            mark(check_needless, n <= NEEDLESS_SHED_BAR)
        ),
        None => "–".to_owned(),
    };
    let critical = r.shed_by_priority[2];
    format!(
        "| {workload} | {} | {} | {:.2}/s | {:.3}{} | {:.2} % | {needless} | {critical}{} | {:.3} s{} | {:.4} s{} | {:.4} s / {:.2} s | {:.3} s / {:.4} s | {:.2} |",
        cell.label,
        r.policy,
        r.goodput_rps,
        ratio,
        mark(at_8, ratio >= peak_bar(cell)),
        share * 100.0,
        mark(true, critical == 0),
        r.ttft_p99_s,
        mark(warm_8, r.ttft_p99_s <= ttft_bar),
        r.tpot_p99_s,
        mark(warm_8, r.tpot_p99_s <= tpot_bar),
        r.short_tpot_p99_s,
        r.short_e2e_p99_s,
        r.critical_ttft_p99_s,
        r.critical_tpot_p99_s,
        r.goodput_min_10s_ratio,
    )
}
