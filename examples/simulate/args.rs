//! The command line.

use super::policy::POLICIES;
use prefix_router::sim::{ClusterConfig, Engine, Front, SyncMode, WorkerSpec};

pub(crate) const USAGE: &str = "usage: simulate [--trace PATH] [--workers N] \
    [--capacity-tokens N] [--router-capacity-tokens N|unknown] [--speedup X] \
    [--policy NAME|all] [--alpha X] [--miss-weight X] [--block-size N] [--seed N] \
    [--format table|json|csv] [--engine batched|simple] [--max-num-batched-tokens N] \
    [--max-num-seqs N] [--host-capacity-tokens N] [--host-chunk-blocks N] \
    [--sync optimistic|feedback|events] [--replicas N] [--front rr|random] \
    [--scrape-interval S] [--event-delay S] [--event-loss P] [--event-replay on|off] \
    [--fleet SPEC] [--faults SPEC] [--ttft-target S] [--tpot-target S] \
    [--requests-out FILE] [--plot FILE.svg] [--router-speeds known|unknown] [--matrix]";

/// Everything the flags set.
#[derive(Clone)]
pub(crate) struct Args {
    pub(crate) trace: Option<String>,
    pub(crate) cluster: ClusterConfig,
    pub(crate) policy: String,
    pub(crate) alpha: Option<f64>,
    pub(crate) miss_weight: Option<f64>,
    pub(crate) seed: u64,
    pub(crate) format: String,
    pub(crate) plot: Option<String>,
    pub(crate) requests_out: Option<String>,
    pub(crate) fleet: Option<String>,
    pub(crate) faults: Option<String>,
    /// Router replicas behind the front.
    pub(crate) replicas: u32,
    /// The KV capacity per worker the routers' mirrors are told; `None`: unknown
    /// (unbounded mirrors).
    pub(crate) router_capacity_tokens: Option<usize>,
    /// Whether the routers are told each worker's speed (`--router-speeds known`); by
    /// default they are not and learn it from the timings the simulation reports.
    pub(crate) router_speeds_known: bool,
    pub(crate) matrix: bool,
}

impl Default for Args {
    fn default() -> Self {
        Self {
            trace: None,
            cluster: ClusterConfig::default().with_engine(Engine::Batched),
            policy: "all".into(),
            alpha: None,
            miss_weight: None,
            seed: 42,
            format: "table".into(),
            plot: None,
            requests_out: None,
            fleet: None,
            faults: None,
            replicas: 1,
            router_capacity_tokens: None,
            router_speeds_known: false,
            matrix: false,
        }
    }
}

/// `v` parsed as a number for `flag`.
fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("{flag}: {v:?} is not a valid number"))
}

/// `v` as one of `choices` (name, value) for `flag`.
fn choice<T: Copy>(flag: &str, v: &str, choices: &[(&str, T)]) -> Result<T, String> {
    choices
        .iter()
        .find(|(name, _)| *name == v)
        .map(|&(_, value)| value)
        .ok_or_else(|| {
            let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
            format!("{flag}: unknown {v:?} ({})", names.join(", "))
        })
}

/// Parses the process's arguments; the error is a one-line message (or the usage).
pub(crate) fn parse() -> Result<Args, String> {
    let mut args = Args::default();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if matches!(flag.as_str(), "-h" | "--help") {
            return Err(USAGE.into());
        }
        if flag == "--matrix" {
            args.matrix = true;
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        if !cluster_flag(&mut args.cluster, &flag, &value)? {
            run_flag(&mut args, &flag, &value)?;
        }
    }
    check(&mut args)?;
    Ok(args)
}

/// Applies a flag of the modelled fleet; false when `flag` is not one.
fn cluster_flag(c: &mut ClusterConfig, flag: &str, v: &str) -> Result<bool, String> {
    match flag {
        "--workers" => c.workers = num(flag, v)?,
        "--capacity-tokens" => c.capacity_tokens = num(flag, v)?,
        "--speedup" => c.speedup = num(flag, v)?,
        "--block-size" => c.block_size = num(flag, v)?,
        "--ttft-target" => c.ttft_target_s = num(flag, v)?,
        "--tpot-target" => c.tpot_target_s = num(flag, v)?,
        "--max-num-batched-tokens" => c.batch.max_num_batched_tokens = num(flag, v)?,
        "--max-num-seqs" => c.batch.max_num_seqs = num(flag, v)?,
        "--host-capacity-tokens" => c.batch.host_capacity_tokens = num(flag, v)?,
        "--host-chunk-blocks" => c.batch.host_chunk_blocks = num(flag, v)?,
        "--scrape-interval" => c.scrape_interval_s = num(flag, v)?,
        "--event-delay" => c.event_delay_s = num(flag, v)?,
        "--event-loss" => c.event_loss = num(flag, v)?,
        "--event-replay" => c.event_replay = choice(flag, v, &[("on", true), ("off", false)])?,
        "--front" => {
            c.front = choice(
                flag,
                v,
                &[("rr", Front::RoundRobin), ("random", Front::Random)],
            )?;
        }
        "--sync" => {
            let modes = [
                ("optimistic", SyncMode::None),
                ("none", SyncMode::None),
                ("feedback", SyncMode::Feedback),
                ("events", SyncMode::Events),
            ];
            c.sync = choice(flag, v, &modes)?;
        }
        "--engine" => {
            let engines = [("batched", Engine::Batched), ("simple", Engine::Simple)];
            c.engine = choice(flag, v, &engines)?;
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// Applies a flag of what to run and how to show it.
fn run_flag(args: &mut Args, flag: &str, v: &str) -> Result<(), String> {
    match flag {
        "--trace" => args.trace = Some(v.into()),
        "--policy" => args.policy = v.into(),
        "--alpha" => args.alpha = Some(num(flag, v)?),
        "--miss-weight" => args.miss_weight = Some(num(flag, v)?),
        "--seed" => {
            args.seed = num(flag, v)?;
            args.cluster.seed = args.seed;
        }
        "--format" => args.format = v.into(),
        "--plot" => args.plot = Some(v.into()),
        "--requests-out" => args.requests_out = Some(v.into()),
        "--fleet" => args.fleet = Some(v.into()),
        "--faults" => args.faults = Some(v.into()),
        "--replicas" => args.replicas = num(flag, v)?,
        "--router-speeds" => {
            args.router_speeds_known =
                choice(flag, v, &[("known", true), ("unknown", false)])?;
        }
        "--router-capacity-tokens" => {
            args.router_capacity_tokens = if v == "unknown" {
                None
            } else {
                Some(num(flag, v)?)
            };
        }
        other => return Err(format!("unknown flag {other:?} (see --help)")),
    }
    Ok(())
}

/// Checks what one flag alone cannot.
fn check(args: &mut Args) -> Result<(), String> {
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
    if args.replicas == 0 {
        return Err("--replicas: at least 1".into());
    }
    if let Some(spec) = &args.fleet {
        let fleet = WorkerSpec::parse_fleet(spec, args.cluster.capacity_tokens)
            .map_err(|e| format!("--fleet: {e}"))?;
        args.cluster.workers = u32::try_from(fleet.len()).unwrap_or(u32::MAX);
    }
    Ok(())
}
