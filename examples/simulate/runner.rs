//! Building the simulation and the routers of each policy, and running them.

use std::sync::Arc;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::args::Args;
use super::policy::{self, PolicyOptions};
use prefix_router::sim::{Fault, Request, SimReport, Simulation, WorkerSpec};
use prefix_router::{
    Decide, Error, PdConfig, PdRouter, Role, Router, Topology, WorkerId, WorkerProfile,
};

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

/// Runs every policy on `sim`, on as many threads as the machine has cores (the
/// simulation is deterministic, so the reports do not depend on it), in the order of
/// `policies`, with [`Progress`] labelled by `label(k)`. The slowest policies (those reading
/// the cache) come last in `POLICIES`, so they are started first.
pub(crate) fn run_all(
    sim: &Simulation,
    policies: &[&str],
    args: &Args,
    label: &(dyn Fn(usize) -> String + Sync),
) -> Vec<Result<SimReport, Error>> {
    let progress = Progress::new();
    let last = policies.len().saturating_sub(1);
    let mut reports = run_queue(policies.len(), &|j| {
        let k = last - j;
        progress.run(sim, policies[k], args, &label(k))
    });
    reports.reverse();
    reports
}

/// Whether `args`' fleet has workers with roles (`--fleet 2xP,6xD`): its runs are a pair
/// router's, one per prefill/decode decider.
pub(crate) fn has_roles(args: &Args) -> bool {
    args.fleet.as_deref().is_some_and(|spec| {
        WorkerSpec::parse_fleet(spec, args.cluster.capacity_tokens)
            .is_ok_and(|fleet| fleet.iter().any(|w| w.role != Role::Both))
    })
}

/// The pair router deciding with `decider` over `sim`'s fleet, its costs on the fleet's
/// settings: the balanced policy's, the KV bytes per token and the transfer bandwidth.
fn pair_router(
    decider: &str,
    sim: &Simulation,
    args: &Args,
) -> Result<PdRouter<Box<dyn Decide>>, Error> {
    let c = &args.cluster;
    let Some(decide) = policy::pd_decider(decider, c.block_size) else {
        unreachable!("decider names are checked when parsing");
    };
    let roles: Vec<Role> = sim.fleet().iter().map(|w| w.role).collect();
    let mut balanced = policy::balanced_config(&options(args, 0));
    // As `PdConfig::default()` reads reports.
    balanced.load.prefill_from_report = PdConfig::default().balanced.load.prefill_from_report;
    let config = PdConfig::default()
        .with_balanced(balanced)
        .with_kv_bytes_per_token(c.kv_bytes_per_token)
        .with_topology(Topology::new(c.kv_transfer_bytes_per_s))
        .with_stall_weight(args.pd_stall_weight)
        .with_decode_step_limit_s(Some(args.pd_decode_step_limit.unwrap_or(c.tpot_target_s)));
    PdRouter::with_decider(&roles, config, decide)
}

/// The routers' settings from `args`, for replica `k` (its id in replica sync).
fn options(args: &Args, k: u32) -> PolicyOptions {
    let c = &args.cluster;
    let (prefill_tokens_per_s, step) = args.router_terms();
    PolicyOptions {
        block_size: c.block_size,
        capacity_tokens: args.router_capacity_tokens,
        prefill_tokens_per_s,
        step,
        replicas: args.replicas,
        alpha: args.alpha,
        miss_weight: args.miss_weight,
        stall_weight: args.stall_weight,
        decode_horizon: args.decode_horizon,
        host_chunk_blocks: c.batch.host_chunk_blocks,
        replica: c
            .replica_sync
            .map(|_| prefix_router::ReplicaConfig::new(u64::from(k), 1)),
        ..PolicyOptions::default()
    }
}

/// Router replica `k` of `policy` for `args`' fleet.
fn router(policy: &str, args: &Args, k: u32) -> Result<Arc<dyn Router>, Error> {
    let Some(router) = policy::build(policy, args.cluster.workers, &options(args, k)) else {
        unreachable!("policy names are checked when parsing");
    };
    router
}

/// Whether each of `policies` reads the cache (its router offers a [`CacheSync`]): only
/// then can the sync mode change its routes.
///
/// [`CacheSync`]: prefix_router::CacheSync
pub(crate) fn reads_cache(policies: &[&str], args: &Args) -> Result<Vec<bool>, Error> {
    policies
        .iter()
        .map(|p| Ok(router(p, args, 0)?.cache_sync().is_some()))
        .collect()
}

/// Tells `router` each worker's speed (`--router-speeds known`).
fn tell_speeds(router: &dyn Router, sim: &Simulation) -> Result<(), Error> {
    for (w, spec) in sim.fleet().iter().enumerate() {
        let profile = WorkerProfile::default().with_speed(spec.speed);
        router.set_profile(WorkerId::new(w as u32), profile)?;
    }
    Ok(())
}

/// Runs `job(k)` for every `k` in `0..count` from one queue on as many threads as the
/// machine has cores, each thread taking the next `k` when it is free (so jobs of unequal
/// length keep every core busy: give the longest first); the results in the order of `k`.
pub(crate) fn run_queue<T: Send>(count: usize, job: &(dyn Fn(usize) -> T + Sync)) -> Vec<T> {
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .min(count);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new((0..count).map(|_| None).collect::<Vec<_>>());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if k >= count {
                        break;
                    }
                    let result = job(k);
                    results
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)[k] = Some(result);
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .into_iter()
        .map(|r| r.unwrap_or_else(|| unreachable!("every job ran")))
        .collect()
}

/// Runs `policy` on `sim` with `args.replicas` replicas, calling `progress`; on a fleet
/// with roles, `policy` names the pair router's decider.
pub(crate) fn run_with(
    sim: &Simulation,
    policy: &str,
    args: &Args,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<SimReport, Error> {
    if sim.fleet().iter().any(|w| w.role != Role::Both) {
        let router = pair_router(policy, sim, args)?;
        if args.router_speeds_known {
            tell_speeds(router.router(), sim)?;
        }
        let mut report = sim.run_pd_with_progress(&router, progress)?;
        // The decider is what differs between a fleet's runs: its name is the row's.
        report.policy = policy.to_owned();
        return Ok(report);
    }
    let replicas = (0..args.replicas)
        .map(|k| router(policy, args, k))
        .collect::<Result<Vec<_>, Error>>()?;
    if args.router_speeds_known {
        for r in &replicas {
            tell_speeds(r.as_ref(), sim)?;
        }
    }
    let refs: Vec<&dyn Router> = replicas.iter().map(AsRef::as_ref).collect();
    sim.run_replicas_with_progress(&refs, progress)
}

/// Runs one policy with [`Progress`] labelled `label`.
pub(crate) fn run(
    sim: &Simulation,
    policy: &str,
    args: &Args,
    label: &str,
) -> Result<SimReport, Error> {
    Progress::new().run(sim, policy, args, label)
}

/// Progress on stderr, for runs on any number of threads. While stderr is a terminal each
/// running policy has a bar (indicatif's), and a finished one leaves its label as a line;
/// otherwise nothing is drawn and each finished policy prints its label as a plain line.
struct Progress {
    bars: MultiProgress,
}

impl Progress {
    fn new() -> Self {
        // `stderr()` draws nothing when stderr is not a terminal.
        Self {
            bars: MultiProgress::with_draw_target(ProgressDrawTarget::stderr()),
        }
    }

    /// Runs `policy` on `sim` with a bar labelled `label` while it runs.
    fn run(
        &self,
        sim: &Simulation,
        policy: &str,
        args: &Args,
        label: &str,
    ) -> Result<SimReport, Error> {
        let style = ProgressStyle::with_template("{msg:44} [{bar:30}] {percent:>3}%")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("## ");
        let bar = self.bars.add(
            ProgressBar::new(0)
                .with_style(style)
                .with_message(label.to_owned()),
        );
        let mut length = None;
        let report = run_with(sim, policy, args, &mut |done, total| {
            if length != Some(total) {
                length = Some(total);
                bar.set_length(total as u64);
            }
            bar.set_position(done as u64);
        });
        bar.finish_and_clear();
        self.bars.remove(&bar);
        if self.bars.is_hidden() {
            eprintln!("{label}");
        } else {
            // Printed above the bars still running; a closed stderr leaves nothing to tell.
            let _ = self.bars.println(label);
        }
        report
    }
}
