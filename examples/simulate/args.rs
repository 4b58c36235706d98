//! The command line.

use std::ffi::OsString;

use clap::builder::PossibleValuesParser;
use clap::{CommandFactory, Parser, ValueEnum};

use super::policy::{PD_DECIDERS, POLICIES};
use prefix_router::StepModel;
use prefix_router::sim::{
    Arrivals, ClusterConfig, ENGINE_PROFILES, Engine, EngineProfile, Front, PriorityMix,
    PriorityScope, SlowSpell, SyncMode, WorkerSpec, Workload,
};

/// Everything the flags set.
#[derive(Clone, Debug)]
pub(crate) struct Args {
    pub(crate) trace: Option<String>,
    /// The one built-in workload to run (`--workload`); `None`: all of them.
    pub(crate) workload: Option<String>,
    pub(crate) cluster: ClusterConfig,
    pub(crate) policy: String,
    /// On a fleet with roles: the prefill/decode decider to run, or `all`.
    pub(crate) pd_decider: String,
    /// The pair router's stall weight.
    pub(crate) pd_stall_weight: f64,
    /// The pair router's decode step limit, seconds.
    pub(crate) pd_decode_step_limit: Option<f64>,
    pub(crate) alpha: Option<f64>,
    pub(crate) miss_weight: Option<f64>,
    pub(crate) stall_weight: Option<f64>,
    pub(crate) decode_horizon: Option<u32>,
    pub(crate) seed: u64,
    pub(crate) format: String,
    pub(crate) plot: Option<String>,
    /// The loads to run each policy at (`--load-sweep`), replacing `--speedup`.
    pub(crate) load_sweep: Option<Vec<f64>>,
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
    /// Whether the routers are told the engine profile's step terms (`--router-terms known`);
    /// by default they start from the configured ones and learn the profile's.
    pub(crate) router_terms_told: bool,
    pub(crate) matrix: bool,
    /// Only the matrix's disaggregated cells.
    pub(crate) matrix_pd: bool,
    /// The results matrix's engine-profile cells instead (`--matrix-profiles`).
    pub(crate) matrix_profiles: bool,
    /// The engines' profile's name (`--engine-profile`).
    pub(crate) engine_profile: String,
}

/// The flags as clap reads them, in their `--help` groups; [`parse_from`] makes them
/// [`Args`]. Each flag's doc comment is its line of `--help`.
#[derive(Parser)]
#[command(
    name = "simulate",
    about = "Compares routing policies on the built-in workloads or a Mooncake trace.",
    long_about = None,
    after_help = "Bad flags and unreadable traces give a one-line error and exit code 2."
)]
struct Cli {
    #[command(flatten)]
    run: RunFlags,
    #[command(flatten)]
    cluster: ClusterFlags,
    #[command(flatten)]
    routers: RouterFlags,
    #[command(flatten)]
    output: OutputFlags,
}

/// What to run.
#[derive(clap::Args)]
#[command(next_help_heading = "What to run")]
struct RunFlags {
    /// Replay this Mooncake trace (JSON lines) instead of the built-in workloads.
    #[arg(long, value_name = "PATH")]
    trace: Option<String>,
    /// Run only the built-in workload NAME.
    #[arg(
        long,
        value_name = "NAME",
        value_parser = workload_names(),
        conflicts_with = "trace"
    )]
    workload: Option<String>,
    /// Run only this policy, or all of them.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "all",
        value_parser = policy_names()
    )]
    policy: String,
    /// On a fleet with roles (`--fleet 2xP,6xD`): run only this prefill/decode decider, or
    /// all of them (the crate's `cost`, `always`, `never`; the field's `independent`,
    /// `llmd`, `dynamo`).
    #[arg(
        long,
        value_name = "NAME",
        default_value = "all",
        value_parser = PossibleValuesParser::new(PD_DECIDERS.into_iter().chain(["all"]))
    )]
    pd_decider: String,
    /// The pair router's stall weight: what a second of delay added to each running decode
    /// where a request prefills weighs against the request's own (`PdConfig::stall_weight`).
    #[arg(long, value_name = "X", default_value_t = prefix_router::PdConfig::default().stall_weight)]
    pd_stall_weight: f64,
    /// The pair router's time-per-output-token target for requests without one, in
    /// seconds: an aggregated plan that would stretch a decode worker's running steps past
    /// it is priced out (`PdConfig::decode_step_limit_s`). Default: `--tpot-target`.
    #[arg(long, value_name = "S")]
    pd_decode_step_limit: Option<f64>,
    /// The weighted score's alpha (`balanced_weighted`).
    #[arg(long, value_name = "X")]
    alpha: Option<f64>,
    /// The weight of a cache miss in the balanced policies' cost.
    #[arg(long, value_name = "X")]
    miss_weight: Option<f64>,
    /// What a second of delay a request's prefill adds to each decode on its worker weighs
    /// in the balanced policy's cost (`BalancedConfig::stall_weight`; default 0.2).
    #[arg(long, value_name = "X")]
    stall_weight: Option<f64>,
    /// Output tokens of a request's answer over which a worker's present decodes count in
    /// the balanced policy's decode time (`LoadConfig::decode_horizon_tokens`; default 256).
    #[arg(long, value_name = "N")]
    decode_horizon: Option<u32>,
    /// Seed of the built-in workloads (default 42) and of the simulator's randomness
    /// (default 0).
    #[arg(long, value_name = "N")]
    seed: Option<u64>,
    /// Run the results matrix (every policy in every cell, as Markdown) instead.
    #[arg(long)]
    matrix: bool,
    /// Run only the results matrix's disaggregated cells (every prefill/decode decider).
    #[arg(long, conflicts_with = "matrix")]
    matrix_pd: bool,
    /// Run the results matrix's engine-profile cells instead (each built-in engine profile
    /// but default, which the routers are not told, on the conversation trace and the
    /// agentic workload; as Markdown).
    #[arg(long, conflicts_with_all = ["matrix", "engine_profile"])]
    matrix_profiles: bool,
}

/// The modelled fleet.
#[derive(clap::Args)]
#[command(next_help_heading = "The fleet")]
struct ClusterFlags {
    /// Workers in the fleet.
    #[arg(long, value_name = "N", default_value_t = cluster().workers)]
    workers: u32,
    /// KV cache of each worker, in tokens.
    #[arg(long, value_name = "N", default_value_t = cluster().capacity_tokens)]
    capacity_tokens: usize,
    /// Tokens per KV block.
    #[arg(long, value_name = "N", default_value_t = cluster().block_size)]
    block_size: usize,
    /// Arrival rates multiplied by X.
    #[arg(long, value_name = "X", default_value_t = cluster().speedup)]
    speedup: f64,
    /// When requests arrive: as recorded, or each recorded instant's requests spread
    /// uniformly over the gap to the next (seeded).
    #[arg(long, value_enum, default_value_t = ArrivalsArg::Recorded)]
    arrivals: ArrivalsArg,
    /// The engines' step time: a built-in profile (default, llama3-8b-a100,
    /// llama2-70b-h100-tp4, dynamo-mocker) or a JSON file (`name`, `source` and the six
    /// numbers of `prefix_router::sim::StepProfile`). The routers are not told it.
    #[arg(long, value_name = "NAME|FILE.json", default_value = "default")]
    engine_profile: String,
    /// Each step's time times a seeded lognormal factor of mean 1 with this log-scale
    /// deviation (0: none).
    #[arg(long, value_name = "SIGMA", default_value_t = 0.0)]
    step_jitter: f64,
    /// Run every chosen policy at each of these loads (arrival rates multiplied by each X),
    /// instead of at `--speedup`; with `--plot`, draw TTFT p99 against load.
    #[arg(
        long,
        value_name = "X,X,...",
        value_delimiter = ',',
        conflicts_with_all = ["speedup", "matrix", "matrix_profiles"]
    )]
    load_sweep: Option<Vec<f64>>,
    /// How workers run requests: vLLM-like batches, or the FIFO model.
    #[arg(long, value_enum, default_value_t = EngineArg::Batched)]
    engine: EngineArg,
    /// Tokens computed per step at most (batched engine).
    #[arg(long, value_name = "N", default_value_t = cluster().batch.step.max_num_batched_tokens)]
    max_num_batched_tokens: usize,
    /// Running requests at most (batched engine).
    #[arg(long, value_name = "N", default_value_t = cluster().batch.step.max_num_seqs)]
    max_num_seqs: usize,
    /// Each worker's host tier (CPU offloading), in tokens; 0: none.
    #[arg(long, value_name = "N", default_value_t = cluster().batch.host_capacity_tokens)]
    host_capacity_tokens: usize,
    /// Blocks per chunk of the host tier.
    #[arg(long, value_name = "N", default_value_t = cluster().batch.host_chunk_blocks)]
    host_chunk_blocks: usize,
    /// Workers by speed and KV, replacing --workers: 4x1.0,4x0.5@2000000 is 4 at full
    /// speed and 4 at half of it with 2,000,000 tokens each; 2xP,6xD is 2 prefill-only and
    /// 6 decode-only workers (a disaggregated fleet: see --pd-decider).
    #[arg(long, value_name = "SPEC")]
    fleet: Option<String>,
    /// Bytes of KV per prompt token moved from a prefill to a decode worker.
    #[arg(long, value_name = "N", default_value_t = cluster().kv_bytes_per_token)]
    kv_bytes_per_token: u64,
    /// Bandwidth of a KV transfer between a prefill and a decode worker, bytes per second.
    #[arg(long, value_name = "X", default_value_t = cluster().kv_transfer_bytes_per_s)]
    kv_transfer_bytes_per_s: f64,
    /// Workers leaving and returning empty: 3@60-120 is worker 3 out from 60 s to 120 s
    /// (inf: never back).
    #[arg(long, value_name = "SPEC")]
    faults: Option<String>,
    /// Every engine slower for a spell: 30-60@10 is each step that starts from 30 s to
    /// 60 s taking ten times its time (batched engine).
    #[arg(long, value_name = "FROM-TO@FACTOR", value_parser = slow_spell)]
    slow_spell: Option<SlowSpell>,
}

/// The routers and what reaches them.
#[derive(clap::Args)]
#[command(next_help_heading = "The routers")]
struct RouterFlags {
    /// Router replicas behind the front.
    #[arg(long, value_name = "N", default_value_t = 1)]
    replicas: u32,
    /// How requests are spread over the replicas.
    #[arg(long, value_enum, default_value_t = FrontArg::Rr)]
    front: FrontArg,
    /// The KV capacity per worker the routers' mirrors are told.
    #[arg(long, value_name = "N|unknown", default_value = "unknown", value_parser = known_tokens)]
    // Fully qualified so that clap takes the value as it is, not the flag as optional.
    router_capacity_tokens: ::std::option::Option<usize>,
    /// Whether the routers are told each worker's speed, or learn it from the timings.
    #[arg(long, value_enum, default_value_t = Known::Unknown)]
    router_speeds: Known,
    /// Whether the routers are told the engine profile's step terms (per prefill token, a
    /// step's fixed time, per decode and per context token) or start from their own and
    /// learn them from the timings.
    #[arg(long, value_enum, default_value_t = Known::Unknown)]
    router_terms: Known,
    /// Mirror correction: engine events, miss feedback, or none (optimistic).
    #[arg(long, value_enum, default_value_t = SyncArg::Optimistic)]
    sync: SyncArg,
    /// Seconds between each worker's load reports to the routers; 0: never.
    #[arg(long, value_name = "S", default_value_t = cluster().scrape_interval_s)]
    scrape_interval: f64,
    /// Seconds from a batch of engine events leaving a worker to reaching the routers.
    #[arg(long, value_name = "S", default_value_t = cluster().event_delay_s)]
    event_delay: f64,
    /// Probability that a replica never receives a batch of engine events (or, with
    /// --replica-sync, a frame of another replica's records).
    #[arg(long, value_name = "P", default_value_t = cluster().event_loss)]
    event_loss: f64,
    /// Replica sync: seconds from a replica's route, first token or completion to its
    /// record reaching the other replicas; off: none (the batched engine).
    #[arg(long, value_name = "off|S", default_value = "off", value_parser = replica_sync)]
    // Fully qualified so that clap takes the value as it is, not the flag as optional.
    replica_sync: ::std::option::Option<f64>,
    /// Whether a lost batch is replayed from the engine, or left for the mirror to carry.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    event_replay: OnOff,
    /// Whether requests ask for admission: each carries the TTFT and TPOT targets, and one no worker is predicted to meet is shed.
    #[arg(long, value_enum, default_value_t = OnOff::Off)]
    admission: OnOff,
    /// Shares of priorities under admission: critical:0.1,standard:0.6,sheddable:0.3.
    #[arg(long, value_name = "SPEC", default_value = "standard:1", value_parser = priorities)]
    priorities: PriorityMix,
    /// What a priority is drawn for: each session (its requests share it; a request without
    /// one draws its own) or each request.
    #[arg(long, value_enum, default_value_t = ScopeArg::Session)]
    priority_scope: ScopeArg,
    /// Every how many output tokens the host reports a running request's progress to the
    /// router that routed it, as a gateway reading the stream would; 0: only at its end.
    #[arg(long, value_name = "N", default_value_t = cluster().progress_every)]
    progress_every: u32,
    /// Seconds of the same workload at 1x (prompts of their own) before the measured load;
    /// the router keeps what it learned, the figures count only the measured part.
    #[arg(long, value_name = "S", default_value_t = cluster().warmup_s)]
    warmup: f64,
}

/// What is printed and written.
#[derive(clap::Args)]
#[command(next_help_heading = "Output")]
struct OutputFlags {
    /// How the results are printed on stdout.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Goodput's time-to-first-token target, in seconds.
    #[arg(long, value_name = "S", default_value_t = cluster().ttft_target_s)]
    ttft_target: f64,
    /// Goodput's time-per-output-token target, in seconds.
    #[arg(long, value_name = "S", default_value_t = cluster().tpot_target_s)]
    tpot_target: f64,
    /// Write one JSON line per request of every run (workload, policy, record) to FILE.
    #[arg(long, value_name = "FILE")]
    requests_out: Option<String>,
    /// Draw the results as SVG: TTFT p99 against load per policy with `--load-sweep`;
    /// otherwise hit ratio against TTFT p99 per policy, and the weighted score over alpha.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<String>,
}

// The values of the flags that take a name. A doc comment on a variant would become its
// help in `--help`, which would then list each value on a line of its own.

/// `--arrivals`.
#[derive(Clone, Copy, ValueEnum)]
enum ArrivalsArg {
    Recorded,
    Spread,
}

/// `--priority-scope`.
#[derive(Clone, Copy, ValueEnum)]
enum ScopeArg {
    Session,
    Request,
}

/// `--engine`.
#[derive(Clone, Copy, ValueEnum)]
enum EngineArg {
    Batched,
    Simple,
}

/// `--front`.
#[derive(Clone, Copy, ValueEnum)]
enum FrontArg {
    // Round robin.
    Rr,
    Random,
}

/// `--sync`.
#[derive(Clone, Copy, ValueEnum)]
enum SyncArg {
    // No correction.
    #[value(alias = "none")]
    Optimistic,
    Feedback,
    Events,
}

/// `--event-replay`, `--admission`.
#[derive(Clone, Copy, ValueEnum)]
enum OnOff {
    On,
    Off,
}

/// `--router-speeds` and `--router-terms`.
#[derive(Clone, Copy, ValueEnum)]
enum Known {
    Known,
    Unknown,
}

/// `--format`.
#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Table,
    Json,
    Csv,
}

/// The modelled fleet's defaults, which the flags' defaults are.
fn cluster() -> ClusterConfig {
    ClusterConfig::default()
}

/// `--workload`'s values: the built-in workloads' names (`long-context` for `long_context`
/// too).
fn workload_names() -> PossibleValuesParser {
    PossibleValuesParser::new(Workload::builtin().into_iter().map(|(name, _)| {
        let value = clap::builder::PossibleValue::new(name);
        match name {
            "long_context" => value.alias("long-context"),
            _ => value,
        }
    }))
}

/// `--policy`'s values: every policy's name and `all`.
fn policy_names() -> PossibleValuesParser {
    PossibleValuesParser::new(POLICIES.into_iter().chain(["all"]))
}

/// A number of tokens, or `unknown`.
fn known_tokens(v: &str) -> Result<Option<usize>, String> {
    if v == "unknown" {
        return Ok(None);
    }
    v.parse()
        .map(Some)
        .map_err(|_| format!("{v:?} is neither a number nor unknown"))
}

/// Parses `--replica-sync`: `off` or a delay in seconds.
fn replica_sync(v: &str) -> Result<Option<f64>, String> {
    if v == "off" {
        return Ok(None);
    }
    match v.parse::<f64>() {
        Ok(s) if s.is_finite() && s >= 0.0 => Ok(Some(s)),
        _ => Err(format!(
            "{v:?} is neither off nor a delay of zero or more seconds"
        )),
    }
}

/// Parses `--slow-spell`.
fn slow_spell(v: &str) -> Result<SlowSpell, String> {
    SlowSpell::parse(v).map_err(|e| e.to_string())
}

/// Parses `--priorities`.
fn priorities(v: &str) -> Result<PriorityMix, String> {
    PriorityMix::parse(v).map_err(|e| e.to_string())
}

impl From<Cli> for Args {
    fn from(cli: Cli) -> Self {
        let Cli {
            run,
            cluster: c,
            routers: r,
            output: o,
        } = cli;
        let mut cluster = ClusterConfig::default();
        cluster.workers = c.workers;
        cluster.capacity_tokens = c.capacity_tokens;
        cluster.block_size = c.block_size;
        cluster.speedup = c.speedup;
        cluster.engine = match c.engine {
            EngineArg::Batched => Engine::Batched,
            EngineArg::Simple => Engine::Simple,
        };
        cluster.batch.step.max_num_batched_tokens = c.max_num_batched_tokens;
        cluster.batch.step.max_num_seqs = c.max_num_seqs;
        cluster.batch.host_capacity_tokens = c.host_capacity_tokens;
        cluster.batch.host_chunk_blocks = c.host_chunk_blocks;
        cluster.batch.step_jitter = c.step_jitter;
        cluster.batch.slow_spell = c.slow_spell;
        cluster.arrivals = match c.arrivals {
            ArrivalsArg::Recorded => Arrivals::Recorded,
            ArrivalsArg::Spread => Arrivals::Spread,
        };
        cluster.kv_bytes_per_token = c.kv_bytes_per_token;
        cluster.kv_transfer_bytes_per_s = c.kv_transfer_bytes_per_s;
        cluster.front = match r.front {
            FrontArg::Rr => Front::RoundRobin,
            FrontArg::Random => Front::Random,
        };
        cluster.sync = match r.sync {
            SyncArg::Optimistic => SyncMode::None,
            SyncArg::Feedback => SyncMode::Feedback,
            SyncArg::Events => SyncMode::Events,
        };
        cluster.scrape_interval_s = r.scrape_interval;
        cluster.event_delay_s = r.event_delay;
        cluster.event_loss = r.event_loss;
        cluster.replica_sync = r.replica_sync;
        cluster.event_replay = matches!(r.event_replay, OnOff::On);
        cluster.admission = matches!(r.admission, OnOff::On);
        cluster.priorities = r.priorities;
        cluster.priority_scope = match r.priority_scope {
            ScopeArg::Session => PriorityScope::Session,
            ScopeArg::Request => PriorityScope::Request,
        };
        cluster.progress_every = r.progress_every;
        cluster.warmup_s = r.warmup;
        cluster.ttft_target_s = o.ttft_target;
        cluster.tpot_target_s = o.tpot_target;
        if let Some(seed) = run.seed {
            cluster.seed = seed;
        }
        let format = match o.format {
            Format::Table => "table",
            Format::Json => "json",
            Format::Csv => "csv",
        };
        Self {
            trace: run.trace,
            workload: run.workload.map(|w| w.replace('-', "_")),
            cluster,
            policy: run.policy,
            pd_decider: run.pd_decider,
            pd_stall_weight: run.pd_stall_weight,
            pd_decode_step_limit: run.pd_decode_step_limit,
            alpha: run.alpha,
            miss_weight: run.miss_weight,
            stall_weight: run.stall_weight,
            decode_horizon: run.decode_horizon,
            seed: run.seed.unwrap_or(42),
            format: format.to_owned(),
            plot: o.plot,
            load_sweep: c.load_sweep,
            requests_out: o.requests_out,
            fleet: c.fleet,
            faults: c.faults,
            replicas: r.replicas,
            router_capacity_tokens: r.router_capacity_tokens,
            router_speeds_known: matches!(r.router_speeds, Known::Known),
            router_terms_told: matches!(r.router_terms, Known::Known),
            matrix: run.matrix,
            matrix_pd: run.matrix_pd,
            matrix_profiles: run.matrix_profiles,
            engine_profile: c.engine_profile,
        }
    }
}

/// Parses `argv` (the program's name first); the error is clap's: help asked for (exit
/// code 0) or a bad command line (exit code 2).
pub(crate) fn parse_from<I, T>(argv: I) -> Result<Args, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut args = Args::from(Cli::try_parse_from(argv)?);
    check(&mut args)
        .map_err(|e| Cli::command().error(clap::error::ErrorKind::ValueValidation, e))?;
    Ok(args)
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
    if let Some(loads) = &args.load_sweep {
        if let Some(bad) = loads.iter().find(|x| !(x.is_finite() && **x > 0.0)) {
            return Err(format!("--load-sweep: {bad} is not a positive load"));
        }
    }
    set_engine_profile(args, engine_profile(&args.engine_profile)?);
    if !(args.cluster.batch.step_jitter.is_finite() && args.cluster.batch.step_jitter >= 0.0) {
        return Err(format!(
            "--step-jitter: {} is not a deviation of 0 or more",
            args.cluster.batch.step_jitter
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

impl Args {
    /// The prefill rate and step model the routers are configured with: the cluster's, or
    /// with `--router-terms known` the engine profile's terms. A step's fixed time is then
    /// the profile's base plus its decode step's fixed time, or its floor where that is
    /// longer (the router's step model has no floor); per context token, the profile's plus
    /// its decode usage term over the fleet's KV capacity (the usage curve's slope at 0);
    /// attention over a prompt, the prefill step's fixed time and the square terms, which
    /// the step model lacks, are left to learning, and a profile without a prefill term
    /// keeps the configured rate.
    pub(crate) fn router_terms(&self) -> (f64, StepModel) {
        let (rate, step) = (self.cluster.prefill_tokens_per_s, self.cluster.batch.step);
        let Some(p) = self
            .cluster
            .batch
            .profile
            .filter(|_| self.router_terms_told)
        else {
            return (rate, step);
        };
        let rate = if p.prefill_s_per_token > 0.0 {
            1.0 / p.prefill_s_per_token
        } else {
            rate
        };
        let capacity = self.cluster.capacity_tokens.max(1) as f64;
        let step = step
            .with_step_base_s((p.base_s + p.decode_step_s).max(p.floor_s))
            .with_step_s_per_decode(p.decode_s_per_seq)
            .with_step_s_per_context_token(
                p.decode_s_per_context_token + p.decode_s_per_usage / capacity,
            );
        (rate, step)
    }
}

/// Runs `args`' engines by `profile`: `default`, the router's own step model, as no
/// profile (the step model at the configured prefill rate, the same times).
pub(crate) fn set_engine_profile(args: &mut Args, profile: EngineProfile) {
    args.cluster.batch.profile = (profile.name != "default").then_some(profile.step);
    args.engine_profile = profile.name;
}

/// The engine profile `--engine-profile` names: a built-in one, else a JSON file.
fn engine_profile(value: &str) -> Result<EngineProfile, String> {
    if let Some(profile) = EngineProfile::builtin(value) {
        return Ok(profile);
    }
    if !value.ends_with(".json") {
        return Err(format!(
            "--engine-profile: {value:?} is neither a built-in profile ({}) nor a .json file",
            ENGINE_PROFILES.join(", ")
        ));
    }
    let text = std::fs::read_to_string(value)
        .map_err(|e| format!("--engine-profile: cannot read {value}: {e}"))?;
    EngineProfile::from_json(&text).map_err(|e| format!("--engine-profile: {value}: {e}"))
}
