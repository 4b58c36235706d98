//! The command line.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use clap::builder::PossibleValuesParser;

use super::engine_settings::{EngineArgs, EngineFlag};
use super::policy;

/// What the flags say.
#[derive(Debug)]
pub(crate) struct Flags {
    pub(crate) listen: String,
    pub(crate) policy: String,
    pub(crate) upstreams: Vec<String>,
    /// P/D mode: the prefill workers' base URLs (empty otherwise).
    pub(crate) prefill: Vec<String>,
    /// P/D mode: the decode workers' base URLs (empty otherwise).
    pub(crate) decode: Vec<String>,
    /// Data-parallel ranks per prefill worker (`ranks` unless given).
    pub(crate) prefill_ranks: u32,
    /// P/D mode: how the pair router decides to split (`pd_plan::decider` names them).
    pub(crate) pd_decider: String,
    pub(crate) options: policy::PolicyOptions,
    pub(crate) mock: Option<String>,
    /// A mock worker's role in a P/D fleet (`prefill` or `decode`), checking the protocol.
    pub(crate) mock_role: Option<String>,
    pub(crate) capacity_blocks: usize,
    pub(crate) ranks: u32,
    /// Each upstream's metrics path (for example `/metrics`), scraped when given.
    pub(crate) metrics_path: Option<String>,
    pub(crate) scrape_interval: Duration,
    pub(crate) health_interval: Duration,
    pub(crate) request_timeout: Duration,
    /// How long the gateway serves on after Ctrl-C, not ready.
    pub(crate) drain: Duration,
    pub(crate) tokenizer: Option<PathBuf>,
    pub(crate) tokenizer_config: Option<PathBuf>,
    pub(crate) tokenize_cache_bytes: usize,
    pub(crate) loras: Vec<String>,
    /// Per upstream: its engine's KV-event socket and, after a comma, its replay socket.
    pub(crate) kv_events: Vec<String>,
    /// The engines configured otherwise than the defaults (`options.host_chunk_blocks`,
    /// `options.full_reports`), by upstream.
    pub(crate) engine_settings: Vec<EngineFlag>,
    /// For a mock worker: publish KV events on this host.
    pub(crate) kv_events_host: Option<String>,
    /// Replica sync over NATS, when asked (`--nats`).
    pub(crate) nats: Option<NatsFlags>,
}

/// Replica sync's flags (`replica.rs`).
#[derive(Debug, Clone)]
pub(crate) struct NatsFlags {
    pub(crate) url: String,
    pub(crate) subject: String,
    pub(crate) replica_id: u64,
    pub(crate) lease: Duration,
    pub(crate) interval: Duration,
}

/// The flags as clap reads them; [`parse_from`] makes them [`Flags`]. Each flag's doc
/// comment is its line of `--help`.
#[derive(Parser)]
#[command(
    name = "gateway",
    about = "An OpenAI-compatible gateway routing with prefix_router, or a mock worker \
             (--mock-worker).",
    long_about = None,
    after_help = "Bad flags give a one-line error and exit code 2.",
    mut_arg("host_chunk_blocks", |a| a.requires("kv_events")),
    mut_arg("full_reports", |a| a.requires("kv_events")),
    mut_arg("engines", |a| {
        a.requires("kv_events").help(
            "An upstream's engine settings where they differ from the defaults (N: the \
             upstream, from 0, in the order of --upstream; its ranks share them): \
             N:SETTING,... with host-chunk-blocks=B, full-reports[=true|false], \
             window=G:TOKENS (KV-cache group G keeps a sliding window), mamba=G, \
             full-attention=G. Once per upstream",
        )
    })
)]
struct Cli {
    /// Address the gateway listens on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8000")]
    listen: String,
    /// The routing policy (not in P/D mode: see --pd-decider).
    #[arg(
        long,
        value_name = "NAME",
        default_value = "balanced",
        value_parser = policy_names(),
        conflicts_with = "prefill"
    )]
    policy: String,
    /// An upstream server's base URL, once per upstream.
    #[arg(
        long = "upstream",
        value_name = "URL",
        required_unless_present_any = ["mock_worker", "prefill", "decode"],
        conflicts_with_all = ["prefill", "decode"]
    )]
    upstreams: Vec<String>,
    /// P/D mode: a prefill worker's base URL, once per worker (vLLM's disaggregated protocol).
    #[arg(long, value_name = "URL", requires = "decode")]
    prefill: Vec<String>,
    /// P/D mode: a decode worker's base URL, once per worker.
    #[arg(long, value_name = "URL", requires = "prefill")]
    decode: Vec<String>,
    /// P/D mode: data-parallel ranks per prefill worker (default --dp-ranks).
    #[arg(long, value_name = "N", requires = "prefill")]
    prefill_dp_ranks: Option<u32>,
    /// P/D mode: when to split (cost: the plan of least predicted cost; always; never; the
    /// field's deciders as baselines: independent, llmd, dynamo).
    #[arg(
        long,
        value_name = "NAME",
        default_value = "cost",
        requires = "prefill",
        value_parser = policy::PD_DECIDERS
    )]
    pd_decider: String,
    /// Tokens per KV block, as the upstreams' engines hash them.
    #[arg(long, value_name = "N", default_value_t = policy::PolicyOptions::default().block_size)]
    block_size: usize,
    /// Data-parallel ranks per upstream (or of this mock worker); each is a routing target.
    #[arg(long, value_name = "N", default_value_t = 1)]
    dp_ranks: u32,
    /// Read each upstream's Prometheus metrics at this path (for example /metrics).
    #[arg(long, value_name = "PATH", conflicts_with = "prefill")]
    metrics_path: Option<String>,
    /// Milliseconds between metrics scrapes.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    scrape_interval_ms: u64,
    /// Milliseconds between health probes of each upstream.
    #[arg(long, value_name = "N", default_value_t = 2000)]
    health_interval_ms: u64,
    /// Seconds an upstream has to answer a request (or start a stream) before a 504.
    #[arg(long, value_name = "N", default_value_t = 300)]
    request_timeout_s: u64,
    /// Milliseconds the gateway serves on, not ready, after Ctrl-C.
    #[arg(long, value_name = "N", default_value_t = 0)]
    drain_ms: u64,
    /// The model's tokenizer.json, for text and chat prompts.
    #[arg(long, value_name = "FILE")]
    tokenizer: Option<PathBuf>,
    /// The model's tokenizer_config.json (chat template); default the one beside the tokenizer.
    #[arg(long, value_name = "FILE")]
    tokenizer_config: Option<PathBuf>,
    /// Megabytes of text in the cache of recurring prompt segments' token IDs.
    #[arg(long, value_name = "N", default_value_t = 64)]
    tokenize_cache_mb: usize,
    /// A model name that is a LoRA adapter, routed in its own cache namespace (repeatable).
    #[arg(long = "lora", value_name = "NAME")]
    loras: Vec<String>,
    /// An upstream's KV-event socket and replay socket, once per --upstream in order (zmq).
    #[arg(long, value_name = "PUB[,REPLAY]", conflicts_with = "prefill")]
    kv_events: Vec<String>,
    /// Serve as a mock worker with its own prefix cache on ADDR, instead of the gateway.
    #[arg(long, value_name = "ADDR")]
    mock_worker: Option<String>,
    /// A mock worker's role in a P/D fleet, checking vLLM's disaggregated protocol.
    #[arg(
        long,
        value_name = "ROLE",
        requires = "mock_worker",
        value_parser = ["prefill", "decode"]
    )]
    mock_role: Option<String>,
    /// A mock worker's KV cache, in blocks.
    #[arg(long, value_name = "N", default_value_t = 65_536)]
    capacity_blocks: usize,
    /// A mock worker publishes its cache's changes as KV events on this host (zmq).
    #[arg(long, value_name = "HOST")]
    kv_events_host: Option<String>,
    /// Run as one of several replicas, syncing what each routed over this NATS server.
    #[arg(
        long,
        value_name = "URL",
        requires = "replica_id",
        conflicts_with = "prefill"
    )]
    nats: Option<String>,
    /// The NATS subject every replica of the fleet publishes its sync frames on.
    #[arg(
        long,
        value_name = "SUBJECT",
        default_value = "prefix-router.replicas",
        requires = "nats"
    )]
    nats_subject: String,
    /// This replica's id, unique among the fleet's replicas (with --nats).
    #[arg(long, value_name = "N", requires = "nats")]
    replica_id: Option<u64>,
    /// Milliseconds a silent peer's requests stay booked.
    #[arg(long, value_name = "N", default_value_t = 10_000, requires = "nats")]
    replica_lease_ms: u64,
    /// Milliseconds between two publications of this replica's records.
    #[arg(long, value_name = "N", default_value_t = 5, requires = "nats")]
    sync_interval_ms: u64,
    /// Last: its help heading holds for the flags after it.
    #[command(flatten)]
    engines: EngineArgs,
}

/// `--policy`'s values: every policy's name.
fn policy_names() -> PossibleValuesParser {
    PossibleValuesParser::new(policy::POLICIES)
}

impl From<Cli> for Flags {
    fn from(c: Cli) -> Self {
        // Intervals of 0 would spin: the shortest is 1 ms (1 s for the timeout).
        let millis = |n: u64| Duration::from_millis(n.max(1));
        let urls = |urls: Vec<String>| -> Vec<String> {
            urls.into_iter()
                .map(|u| u.trim_end_matches('/').to_owned())
                .collect()
        };
        Self {
            listen: c.listen,
            policy: c.policy,
            upstreams: urls(c.upstreams),
            prefill: urls(c.prefill),
            decode: urls(c.decode),
            prefill_ranks: c.prefill_dp_ranks.unwrap_or(c.dp_ranks),
            pd_decider: c.pd_decider,
            options: policy::PolicyOptions {
                block_size: c.block_size,
                host_chunk_blocks: c.engines.host_chunk_blocks,
                full_reports: c.engines.full_reports,
                ..policy::PolicyOptions::default()
            },
            mock: c.mock_worker,
            mock_role: c.mock_role,
            capacity_blocks: c.capacity_blocks,
            ranks: c.dp_ranks,
            metrics_path: c.metrics_path,
            scrape_interval: millis(c.scrape_interval_ms),
            health_interval: millis(c.health_interval_ms),
            request_timeout: Duration::from_secs(c.request_timeout_s.max(1)),
            drain: Duration::from_millis(c.drain_ms),
            tokenizer: c.tokenizer,
            tokenizer_config: c.tokenizer_config,
            tokenize_cache_bytes: c.tokenize_cache_mb.saturating_mul(1 << 20),
            loras: c.loras,
            kv_events: c.kv_events,
            engine_settings: c.engines.engines,
            kv_events_host: c.kv_events_host,
            nats: c.nats.map(|url| NatsFlags {
                url,
                subject: c.nats_subject,
                replica_id: c.replica_id.unwrap_or(0),
                lease: Duration::from_millis(c.replica_lease_ms.max(3)),
                interval: millis(c.sync_interval_ms),
            }),
        }
    }
}

/// Parses `argv` (the program's name first); the error is clap's: help asked for (exit
/// code 0) or a bad command line (exit code 2).
pub(crate) fn parse_from<I, T>(argv: I) -> Result<Flags, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    Cli::try_parse_from(argv).map(Flags::from)
}
