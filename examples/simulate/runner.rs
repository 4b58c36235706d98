//! Building the simulation and the routers of each policy, and running them.

use std::sync::Arc;

use super::args::Args;
use super::policy::{self, PolicyOptions};
use prefix_router::sim::{Fault, Request, SimReport, Simulation, WorkerSpec};
use prefix_router::{Error, Router, WorkerId, WorkerProfile};

/// The simulation of `requests` on the fleet `args` describe (workers or `--fleet`, and
/// `--faults`).
pub(crate) fn simulation(requests: Vec<Request>, args: &Args) -> Result<Simulation, Error> {
    let c = &args.cluster;
    let fleet = match &args.fleet {
        Some(spec) => WorkerSpec::parse_fleet(spec, c.capacity_tokens)?,
        None => vec![WorkerSpec::new(1.0, c.capacity_tokens); c.workers as usize],
    };
    let sim = Simulation::with_fleet(requests, *c, fleet)?;
    match &args.faults {
        Some(spec) => sim.with_faults(Fault::parse_schedule(spec)?),
        None => Ok(sim),
    }
}

/// Runs every policy on `sim`, on as many threads as the machine has cores (each policy
/// on one thread; the simulation is deterministic, so the reports do not depend on it),
/// in the order of `policies`. With one thread a progress bar goes to stderr, otherwise a
/// line per finished policy labelled by `label(k)`.
pub(crate) fn run_all(
    sim: &Simulation,
    policies: &[&str],
    args: &Args,
    label: &(dyn Fn(usize) -> String + Sync),
) -> Vec<Result<SimReport, Error>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .min(policies.len());
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
                    let j = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if j >= policies.len() {
                        break;
                    }
                    // The slowest policies (those reading the cache) come last in
                    // `POLICIES`: taken first, they leave the short ones to fill the gaps.
                    let k = policies.len() - 1 - j;
                    let report = run_with(sim, policies[k], args, &mut |_, _| {});
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

/// One router replica of `policy` for `args`' fleet.
fn router(policy: &str, args: &Args) -> Result<Arc<dyn Router>, Error> {
    let c = &args.cluster;
    let options = PolicyOptions {
        block_size: c.block_size,
        capacity_tokens: args.router_capacity_tokens,
        prefill_tokens_per_s: c.prefill_tokens_per_s,
        alpha: args.alpha,
        miss_weight: args.miss_weight,
        host_chunk_blocks: c.batch.host_chunk_blocks,
    };
    let Some(router) = policy::build(policy, c.workers, &options) else {
        unreachable!("policy names are checked when parsing");
    };
    router
}

/// Tells `router` each worker's speed (`--router-speeds known`).
fn tell_speeds(router: &dyn Router, sim: &Simulation) -> Result<(), Error> {
    for (w, spec) in sim.fleet().iter().enumerate() {
        let profile = WorkerProfile::default().with_speed(spec.speed);
        router.set_profile(WorkerId::new(w as u32), profile)?;
    }
    Ok(())
}

/// Runs `policy` on `sim` with `args.replicas` replicas, calling `progress`.
fn run_with(
    sim: &Simulation,
    policy: &str,
    args: &Args,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<SimReport, Error> {
    let replicas = (0..args.replicas)
        .map(|_| router(policy, args))
        .collect::<Result<Vec<_>, Error>>()?;
    if args.router_speeds_known {
        for r in &replicas {
            tell_speeds(r.as_ref(), sim)?;
        }
    }
    let refs: Vec<&dyn Router> = replicas.iter().map(AsRef::as_ref).collect();
    sim.run_replicas_with_progress(&refs, progress)
}

/// Runs one policy with a progress bar on stderr.
pub(crate) fn run(
    sim: &Simulation,
    policy: &str,
    args: &Args,
    label: &str,
) -> Result<SimReport, Error> {
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
    let report = run_with(sim, policy, args, &mut bar);
    eprintln!();
    report
}
