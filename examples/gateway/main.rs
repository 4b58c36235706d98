//! An OpenAI-compatible gateway that routes `POST /v1/completions` and
//! `POST /v1/chat/completions` with `prefix_router`.
//!
//! ```sh
//! # three mock workers with their own prefix caches, then the gateway in front of them
//! cargo run --release --example gateway -- --mock-worker 127.0.0.1:8001 &
//! cargo run --release --example gateway -- --mock-worker 127.0.0.1:8002 &
//! cargo run --release --example gateway -- --mock-worker 127.0.0.1:8003 &
//! cargo run --release --example gateway -- --listen 127.0.0.1:8000 --policy balanced \
//!     --upstream http://127.0.0.1:8001 --upstream http://127.0.0.1:8002 --upstream http://127.0.0.1:8003
//! curl -s localhost:8000/v1/completions -d '{"model":"m","prompt":[1,2,3]}'
//! curl -sN localhost:8000/v1/completions -d '{"model":"m","prompt":[1,2,3],"stream":true}'
//! curl -s localhost:8000/stats
//! curl -s localhost:8000/metrics
//! ```
//!
//! `GET /metrics` is the gateway's own metrics in Prometheus text (`telemetry.rs`): requests
//! by worker and outcome, refusals by limit and priority, measured times to first token and
//! end-to-end latencies, cached tokens predicted against those the engines reported.
//!
//! Point `--upstream` at vLLM or SGLang servers (started with prefix caching, reporting
//! `usage.prompt_tokens_details.cached_tokens`) to route real traffic. With `--dp-ranks N`
//! each upstream is an endpoint of N data-parallel ranks (vLLM's `--data-parallel-size`):
//! every (endpoint, rank) is a routing target, and the gateway names the rank it chose in
//! the `X-data-parallel-rank` header (mock workers take the same flag). With
//! `--metrics-path /metrics` each upstream's Prometheus metrics are read every
//! `--scrape-interval-ms` (default 1000) into the router's load reports.
//!
//! Built with `--features zmq`, `--kv-events PUB[,REPLAY]` (once per `--upstream`, in
//! order) follows each engine's KV events (vLLM: `--kv-events-config '{"enable_kv_cache_events":
//! true, "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'`)
//! into the mirror; rank `r` of an endpoint publishes on the ports plus `r`. A mock worker
//! given `--kv-events-host 127.0.0.1` publishes its cache's changes the same way and prints
//! where. Requests naming a `--lora NAME` adapter are routed in that adapter's namespace,
//! as its events are.
//!
//! The mirror follows the events exactly only when it knows how each engine is configured
//! beyond what they say (`engines.rs`): `--host-chunk-blocks B` (CPU offloading's
//! `blocks_per_chunk`) and `--full-reports` (requests sent with `kv_cache_report_mode=full`)
//! for every engine, and `--engine-settings N:SETTING,...` for upstream `N`'s (from 0, in
//! `--upstream` order; its ranks share them), for example
//! `--engine-settings 1:host-chunk-blocks=4,window=1:512`. The gateway prints what it assumes
//! of each engine at start; an event that contradicts it is followed, logged once per worker
//! and counted in `/stats` (`events.settings_conflicts`).
//!
//! Text prompts and `POST /v1/chat/completions` need the model's tokenizer: `--tokenizer
//! tokenizer.json` (and `--tokenizer-config tokenizer_config.json` for the chat template,
//! by default the one beside the tokenizer). The gateway tokenizes as vLLM does, off the
//! runtime's worker threads, and keeps the token IDs of recurring prompt segments (system
//! prompts, earlier turns; with a byte-level tokenizer, also 2-KB pieces of long texts, so
//! that a repeated prefix is not tokenized again) in a cache of `--tokenize-cache-mb`
//! (default 64) of text; the body goes upstream unchanged. Policies that route on load
//! alone (`round_robin`, `least_loaded`, `power_of_two`) tokenize only requests that ask
//! for admission.
//!
//! ```sh
//! cargo run --release --example gateway -- --listen 127.0.0.1:8000 \
//!     --tokenizer tests/data/tokenizer/bytelevel/tokenizer.json --upstream http://127.0.0.1:8001
//! curl -s localhost:8000/v1/chat/completions \
//!     -d '{"model":"m","messages":[{"role":"user","content":"Hello"}]}'
//! ```
//!
//! Every `--health-interval-ms` (default 2000) each upstream's `/health` is probed: a
//! worker that fails is taken out of routing until it answers again. `GET /ready` answers
//! 200 while some worker is available. An upstream must answer within
//! `--request-timeout-s` (default 300; a stream must start within it), or the client gets a
//! 504. On Ctrl-C `/ready` answers 503 at once; the gateway goes on serving for
//! `--drain-ms` (default 0, so that a load balancer polling `/ready` can move traffic away
//! first), then stops accepting requests and lets those in flight, streams included,
//! finish.
//!
//! P/D mode (prefill/decode disaggregation, `pd.rs`): `--prefill URL` and `--decode URL`,
//! each once per worker, instead of `--upstream`. Every request is prefilled on a prefill
//! worker and decoded on a decode worker with vLLM's disaggregated protocol (`pd_wire.rs`),
//! `--dp-ranks` ranks per decode worker and `--prefill-dp-ranks` (default the same) per
//! prefill worker. The crate's `PdRouter` picks each pair, and whether to split, by
//! `--pd-decider` (`cost`, the default: the plan of least predicted cost; `always`;
//! `never`). `GET /metrics` (`pd_telemetry.rs`) and `GET /v1/models` (from the decode
//! workers) serve as in the aggregated mode, and so does admission (`x-ttft-target-ms`,
//! `x-priority`: `429` before either leg when no plan is predicted to meet the target).
//! Mock workers take `--mock-role prefill|decode`
//! and check the protocol:
//!
//! ```sh
//! cargo run --release --example gateway -- --mock-worker 127.0.0.1:8101 --mock-role prefill &
//! cargo run --release --example gateway -- --mock-worker 127.0.0.1:8201 --mock-role decode &
//! cargo run --release --example gateway -- --listen 127.0.0.1:8000 \
//!     --prefill http://127.0.0.1:8101 --decode http://127.0.0.1:8201 --pd-decider always
//! ```
//!
//! Several gateways in front of the same workers run as replicas of one router with `--nats
//! URL --replica-id N` (`replica.rs`): each publishes what it routed on `--nats-subject`
//! and applies what its peers routed, so that each predicts the prefixes the others just
//! sent and counts their requests in the workers' load. Without NATS each routes alone.
//!
//! `--help` lists every flag with its default and exits 0; bad flags give a one-line error
//! and exit code 2.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use flags::Flags;
use prefix_router::RankLayout;

mod app;
mod chat;
#[path = "../common/cli.rs"]
mod cli;
#[path = "../common/engine_settings.rs"]
mod engine_settings;
mod engines;
#[cfg(feature = "zmq")]
mod events;
mod flags;
mod metrics;
mod mock;
mod mock_cache;
#[cfg(feature = "zmq")]
mod mock_events;
mod models;
mod pd;
mod pd_mock;
mod pd_plan;
mod pd_proxy;
mod pd_telemetry;
mod pd_wire;
#[path = "../common/policy.rs"]
mod policy;
mod probe;
mod prompt;
mod replica;
mod signals;
mod stream;
mod telemetry;
mod tokenize;
#[cfg(feature = "zmq")]
#[path = "../vllm_events/zmq.rs"]
mod zmq;

/// The tokenizer and chat template the flags name, if any. Without `--tokenizer-config`,
/// the `tokenizer_config.json` beside the tokenizer is read when it is there.
fn prompts(f: &Flags) -> Result<Option<Arc<prompt::Prompts>>, String> {
    let Some(tokenizer) = &f.tokenizer else {
        return Ok(None);
    };
    let beside = tokenizer
        .parent()
        .unwrap_or(Path::new("."))
        .join("tokenizer_config.json");
    let config = f
        .tokenizer_config
        .clone()
        .or_else(|| beside.exists().then_some(beside));
    let prompts = prompt::Prompts::load(tokenizer, config.as_deref(), f.tokenize_cache_bytes)?;
    Ok(Some(Arc::new(prompts)))
}

/// The gateway for `f` with its background tasks (health probes, metrics scraper, replica
/// sync) started.
async fn gateway(f: Flags, layout: RankLayout) -> Result<Arc<app::Gateway>, String> {
    if f.upstreams.is_empty() {
        return Err("give at least one --upstream".to_owned());
    }
    let targets = layout.targets(f.upstreams.len() as u32);
    let mut f = f;
    if let Some(nats) = &f.nats {
        // Every start a new incarnation, so that peers drop what the last one booked.
        let incarnation = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let config =
            prefix_router::ReplicaConfig::new(nats.replica_id, incarnation).with_lease(nats.lease);
        f.options.replica = Some(config);
    }
    let router = match policy::build(&f.policy, targets, &f.options) {
        Some(r) => r.map_err(|e| e.to_string())?,
        None => return Err(format!("unknown policy {:?}", f.policy)),
    };
    let options = app::Options {
        prompts: prompts(&f)?,
        request_timeout: f.request_timeout,
        loras: f.loras.clone(),
    };
    let endpoints = f.upstreams.len() as u32;
    if !f.kv_events.is_empty() {
        if cfg!(not(feature = "zmq")) {
            return Err(NO_ZMQ.to_owned());
        }
        let settings = engines::apply(
            router.as_ref(),
            &layout,
            &f.upstreams,
            &f.engine_settings,
            &f.options,
        )?;
        for line in settings {
            eprintln!("{line}");
        }
    }
    let gw = app::Gateway::new(router, f.upstreams, layout, options);
    follow_events(&gw, &f.kv_events, &layout, endpoints)?;
    if let Some(nats) = f.nats {
        let options = replica::SyncOptions {
            url: nats.url,
            subject: nats.subject,
            interval: nats.interval,
            heartbeat: nats.lease / 3,
        };
        replica::start(Arc::clone(&gw), options).await?;
    }
    tokio::spawn(probe::probe_forever(Arc::clone(&gw), f.health_interval));
    if let Some(path) = f.metrics_path {
        tokio::spawn(metrics::scrape_forever(
            Arc::clone(&gw),
            path,
            f.scrape_interval,
        ));
    }
    Ok(gw)
}

/// Starts following the engines' KV events the `--kv-events` values name.
#[cfg(feature = "zmq")]
fn follow_events(
    gw: &Arc<app::Gateway>,
    values: &[String],
    layout: &RankLayout,
    endpoints: u32,
) -> Result<(), String> {
    if values.is_empty() {
        return Ok(());
    }
    for source in events::sources(values, layout, endpoints)? {
        tokio::spawn(events::follow_forever(Arc::clone(gw), source));
    }
    Ok(())
}

#[cfg(not(feature = "zmq"))]
fn follow_events(
    _: &Arc<app::Gateway>,
    values: &[String],
    _: &RankLayout,
    _: u32,
) -> Result<(), String> {
    if values.is_empty() {
        Ok(())
    } else {
        Err(NO_ZMQ.to_owned())
    }
}

const NO_ZMQ: &str =
    "KV events need the zmq feature: cargo run --release --example gateway --features zmq";

/// A mock worker as the flags describe it, publishing KV events when asked.
async fn mock_worker(flags: &Flags) -> Result<mock::MockWorker, String> {
    let worker = mock::MockWorker::new(flags.capacity_blocks, flags.ranks, prompts(flags)?);
    let Some(host) = &flags.kv_events_host else {
        return Ok(worker);
    };
    #[cfg(feature = "zmq")]
    {
        let publishers = mock_events::Publishers::bind(host, flags.ranks).await?;
        for (rank, (events, replay)) in publishers.endpoints.iter().enumerate() {
            eprintln!("rank {rank}: KV events on {events}, replay on {replay}");
        }
        Ok(worker.with_events(publishers))
    }
    #[cfg(not(feature = "zmq"))]
    {
        let _ = host;
        Err(NO_ZMQ.to_owned())
    }
}

/// A mock worker's app: a plain one, or one in a P/D role (`--mock-role`).
async fn mock_app(addr: &str, flags: &Flags) -> Result<axum::Router, String> {
    let worker = mock_worker(flags).await?;
    let role = match flags.mock_role.as_deref() {
        None => return Ok(mock::mock_app(Arc::new(worker))),
        Some("prefill") => pd_plan::Role::Prefill,
        Some(_) => pd_plan::Role::Decode,
    };
    let engine = format!("mock-{}@{addr}", role.name());
    let mock = pd_mock::PdMock::new(worker, role, engine);
    Ok(pd_mock::pd_mock_app(Arc::new(mock)))
}

/// The P/D gateway the flags ask for (`--prefill`, `--decode`), its health probes started.
fn pd_gateway(f: &Flags, decode_layout: RankLayout) -> Result<Arc<pd::PdGateway>, String> {
    if f.decode.is_empty() {
        return Err("a P/D fleet needs at least one --decode worker".to_owned());
    }
    if f.prefill.is_empty() {
        return Err("a P/D fleet needs at least one --prefill worker".to_owned());
    }
    let prefill_layout =
        RankLayout::new(f.prefill_ranks).map_err(|e| format!("--prefill-dp-ranks: {e}"))?;
    let prefill = pd::Side::new(f.prefill.clone(), prefill_layout);
    let decode = pd::Side::new(f.decode.clone(), decode_layout);
    let Some(decider) = policy::pd_decider(&f.pd_decider, f.options.block_size) else {
        return Err(format!("unknown --pd-decider {:?}", f.pd_decider));
    };
    let (p, d) = (prefill.targets(), decode.targets());
    let planner =
        pd_plan::PdPlanner::new(p, d, f.options.block_size, decider).map_err(|e| e.to_string())?;
    let options = app::Options {
        prompts: prompts(f)?,
        request_timeout: f.request_timeout,
        loras: f.loras.clone(),
    };
    let gw = pd::PdGateway::new(Arc::new(planner), prefill, decode, options);
    tokio::spawn(pd::probe_forever(Arc::clone(&gw), f.health_interval));
    Ok(gw)
}

/// Turns the gateway's `/ready` to 503 on shutdown.
type Drain = Box<dyn FnOnce() + Send>;

/// The app the flags ask for (a gateway, a P/D gateway, or a mock worker), and how to
/// drain it if it is a gateway.
async fn build(flags: Flags) -> Result<(String, axum::Router, Option<Drain>), String> {
    let layout = RankLayout::new(flags.ranks).map_err(|e| format!("--dp-ranks: {e}"))?;
    if let Some(addr) = &flags.mock {
        return Ok((addr.clone(), mock_app(addr, &flags).await?, None));
    }
    let listen = flags.listen.clone();
    if !flags.prefill.is_empty() || !flags.decode.is_empty() {
        let gw = pd_gateway(&flags, layout)?;
        let app = pd::app(Arc::clone(&gw));
        return Ok((listen, app, Some(Box::new(move || gw.drain()))));
    }
    let gw = gateway(flags, layout).await?;
    let app = app::app(Arc::clone(&gw));
    Ok((listen, app, Some(Box::new(move || gw.drain()))))
}

#[tokio::main]
async fn main() -> ExitCode {
    let flags = match flags::parse_from(std::env::args_os()) {
        Ok(flags) => flags,
        Err(e) => return cli::exit(&e),
    };
    let drain = flags.drain;
    let (addr, app, drain_now) = match build(flags).await {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(&addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: cannot listen on {addr}: {e}");
            return ExitCode::from(1);
        }
    };
    eprintln!("listening on {addr}");
    // On Ctrl-C, stop being ready, serve on for the drain time, then stop accepting and
    // let the requests in flight, streams included, finish.
    let shutdown = async move {
        let _ = tokio::signal::ctrl_c().await;
        if let Some(drain_now) = drain_now {
            drain_now();
            tokio::time::sleep(drain).await;
        }
    };
    if let Err(e) = axum::serve(app::no_delay(listener), app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        eprintln!("error: {e}");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
