//! `--matrix-profiles`: the results matrix's engine-profile axis, as Markdown on stdout.
//!
//! The engines run by each built-in engine profile but `default` ([`ENGINE_PROFILES`]; the
//! matrix's other cells run `default`), which the routers are not told: they learn the
//! timings online. For each profile, on the Mooncake conversation trace (its arrivals
//! spread, [`CONVERSATION_ARRIVALS`]) and on the built-in agentic workloads, open-loop
//! (`agentic_open`) and closed-loop (`agentic`), with engine events:
//! - at 1× and 4×, every policy (the peers' included): the recommended policy's bar, as the
//!   matrix's plain cells check it, and its TTFT prediction error;
//! - at 2×, 3×, 5× and 6×, the recommended policy alone without admission: with 1× and 4×,
//!   the loads over which the fleet's peak goodput per second is taken (1× for a fleet
//!   already past its capacity at 2×);
//! - at 8×, the admission cells' policies with admission (the matrix's priorities) and
//!   without (their twins, for the needless sheds): goodput per second against the peak.
//!
//! A cell where no policy reaches goodput 0.5 is past the fleet's capacity: its bar is
//! marked – (not checked). Everything else is as the other flags say.

use super::Failure;
use super::args::{self, Args};
use super::matrix::{
    self, ADMISSION_POLICIES, ADMISSION_PRIORITIES, Bar, Cell, RECOMMENDED, bar_header, closed_loop,
};
use prefix_router::sim::{Arrivals, ENGINE_PROFILES, EngineProfile, Request, SimReport, SyncMode};

/// The axis' workloads, by their names in the matrix.
const WORKLOADS: [&str; 3] = ["mooncake conversation", "agentic_open", "agentic"];

/// When the conversation trace's requests arrive in these cells. The trace's times are
/// binned (12,031 requests at 1,180 instants, up to 28 at once); spread over the gap to the
/// next instant, a burst is no artefact of the recording that makes every prediction of
/// its requests' time to first token wrong. The agentic workloads' arrivals are their own.
pub(super) const CONVERSATION_ARRIVALS: Arrivals = Arrivals::Spread;

/// The loads where every policy runs and the bar is checked.
const PLAIN_LOADS: [f64; 2] = [1.0, 4.0];

/// The loads over which a fleet's peak goodput per second is taken: the best any policy
/// run there without admission reaches (every policy at [`PLAIN_LOADS`], the recommended
/// one alone at the others).
const PEAK_LOADS: [f64; 6] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];

/// The load of the admission cells.
const ADMISSION_LOAD: f64 = 8.0;

/// The most the recommended policy's TTFT prediction error may be: median, 90th
/// percentile.
const ERROR_BARS: [f64; 2] = [0.20, 0.50];

/// What a cell of the axis is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Every policy, the bar checked; at 4× a load of the peak too.
    Plain,
    /// The recommended policy alone, without admission: a load of the peak.
    Peak,
    /// The admission policies without admission at the admission cells' load: an admission
    /// cell's twin.
    Twin,
    /// The admission policies with admission, cold.
    Admission,
    /// The same after a warm-up of [`matrix::WARMUP_S`] at 1×.
    WarmAdmission,
}

/// The profiles the axis runs, in print order: every built-in one but `default`.
fn profiles() -> impl Iterator<Item = &'static str> {
    ENGINE_PROFILES
        .into_iter()
        .filter(|name| *name != "default")
}

/// A cell's place on the axis: its profile (index into [`profiles`]) and its kind.
#[derive(Clone, Copy, Debug)]
struct Place {
    profile: usize,
    kind: Kind,
}

/// Runs the axis and prints it.
pub(crate) fn run(args: &Args) -> Result<(), Failure> {
    let workloads = WORKLOADS
        .into_iter()
        .map(|name| matrix::workload(name, args))
        .collect::<Result<Vec<_>, _>>()?;
    let (cells, places) = cells(args);
    let results = matrix::run_cells(args, &workloads, &cells)?;
    let needless = matrix::needless_sheds(&cells, &results)?;
    let axis = Axis {
        workloads: &workloads,
        cells: &cells,
        places: &places,
        results: &results,
    };
    axis.print_summary();
    axis.print_peaks();
    axis.print_admission(&needless);
    for (cell, reports) in cells.iter().zip(&results) {
        println!("\n**{}, {}**\n", workloads[cell.workload].0, cell.label);
        matrix::print_policies(reports, true);
    }
    Ok(())
}

/// Every cell with its place, in print order: by profile, then workload, then load.
fn cells(args: &Args) -> (Vec<Cell>, Vec<Place>) {
    let mut cells = Vec::new();
    let mut places = Vec::new();
    // Every built-in name is a built-in profile.
    let engines = profiles().filter_map(EngineProfile::builtin);
    for (profile, engine) in engines.enumerate() {
        for (workload, name) in WORKLOADS.into_iter().enumerate() {
            let mut base = args.clone();
            args::set_engine_profile(&mut base, engine.clone());
            base.cluster.sync = SyncMode::Events;
            let mut suffix = "";
            if name == WORKLOADS[0] {
                base.cluster.arrivals = CONVERSATION_ARRIVALS;
                if CONVERSATION_ARRIVALS == Arrivals::Spread {
                    suffix = ", spread arrivals";
                }
            }
            for (load, kind) in runs() {
                let mut a = base.clone();
                a.cluster.speedup = load;
                let mut admission = "";
                // An admission cell follows its twin.
                let mut twin = None;
                if matches!(kind, Kind::Admission | Kind::WarmAdmission) {
                    a.cluster.admission = true;
                    a.cluster.priorities = ADMISSION_PRIORITIES;
                    admission = ", admission";
                    twin = cells.len().checked_sub(1);
                }
                if kind == Kind::WarmAdmission {
                    a.cluster.warmup_s = matrix::WARMUP_S;
                    admission = ", admission, warm";
                    twin = cells.len().checked_sub(2);
                }
                cells.push(Cell {
                    workload,
                    label: format!("{}, {load}× events{admission}{suffix}", engine.name),
                    args: a,
                    sync_sibling: None,
                    only: match kind {
                        Kind::Plain => None,
                        Kind::Peak => Some(&ADMISSION_POLICIES[..1]),
                        Kind::Twin | Kind::Admission | Kind::WarmAdmission => {
                            Some(&ADMISSION_POLICIES)
                        }
                    },
                    plain: true,
                    twin,
                    hit_floor: false,
                });
                places.push(Place { profile, kind });
            }
        }
    }
    (cells, places)
}

/// The runs on one profile and workload, in print order: each load with what it is for,
/// the plain and peak loads rising, then the admission cell's twin and the admission cell.
fn runs() -> Vec<(f64, Kind)> {
    let mut loads: Vec<f64> = PLAIN_LOADS.into_iter().chain(PEAK_LOADS).collect();
    loads.sort_by(f64::total_cmp);
    loads.dedup();
    loads
        .into_iter()
        .map(|load| match PLAIN_LOADS.contains(&load) {
            true => (load, Kind::Plain),
            false => (load, Kind::Peak),
        })
        .chain([
            (ADMISSION_LOAD, Kind::Twin),
            (ADMISSION_LOAD, Kind::Admission),
            (ADMISSION_LOAD, Kind::WarmAdmission),
        ])
        .collect()
}

/// The axis' cells with their places and reports, for printing.
struct Axis<'a> {
    workloads: &'a [(String, Vec<Request>)],
    cells: &'a [Cell],
    places: &'a [Place],
    results: &'a [Vec<SimReport>],
}

impl Axis<'_> {
    /// Every cell with its place and reports, in print order.
    fn each(&self) -> impl Iterator<Item = (usize, &Cell, Place, &[SimReport])> {
        self.cells
            .iter()
            .zip(self.places)
            .zip(self.results)
            .enumerate()
            .map(|(c, ((cell, &place), reports))| (c, cell, place, reports.as_slice()))
    }

    /// The workload's name and the profile's of a cell.
    fn names<'c>(&'c self, cell: &'c Cell) -> (&'c str, &'c str) {
        (
            self.workloads[cell.workload].0.as_str(),
            cell.args.engine_profile.as_str(),
        )
    }

    /// The best goodput per second of any policy run without admission at each of
    /// [`PEAK_LOADS`] on `workload` with profile `profile`, in their order (0 where none
    /// ran).
    fn peak_loads(&self, profile: usize, workload: usize) -> Vec<f64> {
        PEAK_LOADS
            .iter()
            .map(|&load| {
                self.each()
                    .filter(|(_, cell, place, _)| {
                        place.profile == profile
                            && cell.workload == workload
                            && matches!(place.kind, Kind::Plain | Kind::Peak)
                            && cell.args.cluster.speedup == load
                    })
                    .flat_map(|(_, _, _, reports)| reports)
                    .map(|r| r.goodput_rps)
                    .fold(0.0, f64::max)
            })
            .collect()
    }

    /// The summary: the recommended policy's bar and TTFT prediction error in each cell
    /// where every policy ran.
    fn print_summary(&self) {
        let arrivals = match CONVERSATION_ARRIVALS {
            Arrivals::Spread => "spread over the gap to the next recorded instant (seeded)",
            _ => "as recorded",
        };
        println!(
            "Engine profiles: the engines' step times by each built-in profile, which the routers are not told (they learn the timings online); engine events; the conversation trace's arrivals {arrivals}; TTFT error: |predicted − measured| / measured of the recommended policy's time to first token\n"
        );
        println!(
            "{} TTFT error p50 (≤ 20 %) | TTFT error p90 (≤ 50 %) |",
            bar_header("| profile | workload | cell ")
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
        for (_, cell, _, reports) in self.each().filter(|e| e.2.kind == Kind::Plain) {
            let (workload, profile) = self.names(cell);
            let targets = (
                cell.args.cluster.ttft_target_s,
                cell.args.cluster.tpot_target_s,
            );
            let (Some(bar), Some(rec)) = (
                Bar::of(reports, targets, closed_loop(workload)),
                reports.iter().find(|r| r.policy == RECOMMENDED),
            ) else {
                continue;
            };
            let [p, t, d, g] = bar.cells();
            let errors = [rec.ttft_error_p50, rec.ttft_error_p90];
            let [e50, e90] = [0, 1].map(|k| {
                let mark = bar.mark(errors[k] <= ERROR_BARS[k]);
                format!("{:.1} % {mark}", errors[k] * 100.0)
            });
            println!(
                "| {profile} | {workload} | {} | {p} | {t} | {d} | {g} | {} | {e50} | {e90} |",
                cell.label,
                bar.session_cell()
            );
        }
    }

    /// The best goodput per second without admission at each load of the peak, and the
    /// peak, per profile and workload.
    fn print_peaks(&self) {
        let loads: Vec<String> = PEAK_LOADS.iter().map(|l| format!("{l}×")).collect();
        println!(
            "\nPeak: the best goodput per second without admission at {} (every policy at {}, the recommended one alone at the others)\n",
            loads.join(", "),
            PLAIN_LOADS.map(|l| format!("{l}×")).join(" and ")
        );
        println!("| profile | workload | {} | peak |", loads.join(" | "));
        println!("|---|---|{}---|", "---|".repeat(loads.len()));
        for (profile, name) in profiles().enumerate() {
            for (workload, (wname, _)) in self.workloads.iter().enumerate() {
                let rates = self.peak_loads(profile, workload);
                let peak = rates.iter().copied().fold(0.0, f64::max);
                let rates: Vec<String> = rates.iter().map(|r| format!("{r:.2}/s")).collect();
                println!("| {name} | {wname} | {} | {peak:.2}/s |", rates.join(" | "));
            }
        }
    }

    /// The admission cells: each policy's goodput per second against its fleet's peak, the
    /// shares shed and shed needlessly (`needless`, per cell and report), the critical
    /// requests shed.
    fn print_admission(&self, needless: &[Vec<Option<f64>>]) {
        println!(
            "\nAdmission at {ADMISSION_LOAD}× (priorities sheddable 0.3, standard 0.6, critical 0.1; peak: above, the profile's and workload's; {})\n",
            matrix::NEEDLESS_SHED_NOTE
        );
        println!("{}", matrix::admission_header("at 8×"));
        let admission = |kind| matches!(kind, Kind::Admission | Kind::WarmAdmission);
        for (c, cell, place, reports) in self.each().filter(|e| admission(e.2.kind)) {
            let rates = self.peak_loads(place.profile, cell.workload);
            let peak = rates.into_iter().fold(0.0, f64::max);
            let (workload, _) = self.names(cell);
            for (r, &n) in reports.iter().zip(&needless[c]) {
                println!(
                    "{}",
                    matrix::admission_row(workload, cell, (r, peak, n), true)
                );
            }
        }
    }
}
