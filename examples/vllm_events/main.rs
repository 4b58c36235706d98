//! Feeds vLLM KV-event batches to a router's mirror and prints what each worker caches:
//! from payload files, or live from the engines' ZMQ PUB sockets.
//!
//! From files (the test vectors of `tests/data/vllm` as worker 0's stream):
//!
//! ```sh
//! cargo run --example vllm_events --features vllm -- \
//!     0=tests/data/vllm/map_u64/batch_00.msgpack 0=tests/data/vllm/map_u64/batch_01.msgpack
//! ```
//!
//! Each argument is `WORKER=PATH` (or just `PATH` for worker 0): one payload frame as a vLLM
//! engine publishes it. The batch sequence number is the order of the files per worker.
//!
//! Live, from each engine's event socket (vLLM: `--kv-events-config
//! '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557"}'`):
//!
//! ```sh
//! cargo run --example vllm_events --features zmq -- \
//!     --zmq 0=tcp://10.0.0.5:5557 --zmq 1=tcp://10.0.0.6:5557 \
//!     [--replay 0=tcp://10.0.0.5:5558 ...] [--topic TOPIC] [--batches N]
//! ```
//!
//! One SUB socket per engine; batches are applied in arrival order, each with the seq its
//! engine sent. A gap in the seqs is filled from the engine's replay socket when
//! `--replay` names it (vLLM's `replay_endpoint`), and otherwise reported with the seq to
//! replay from.
//!
//! The mirror is exact only when it knows how each engine is configured beyond what its
//! events say. `--block-size`, `--host-chunk-blocks` and `--full-reports` are the defaults
//! for every engine (the block size is every engine's); `--engine-settings
//! WORKER:SETTING,...` gives one engine's where they differ (`common/engine_settings.rs`):
//!
//! ```sh
//! cargo run --example vllm_events --features zmq -- \
//!     --zmq 0=tcp://10.0.0.5:5557 --zmq 1=tcp://10.0.0.6:5557 \
//!     --engine-settings 1:host-chunk-blocks=4,full-reports,window=1:512
//! ```
//!
//! At start it prints the settings it assumes of each worker's engine. An event that
//! contradicts them (a sliding window or a CPU chunk size its engine states otherwise) is
//! followed, and reported on a `settings conflict` line with the settings now assumed; the
//! last lines count each worker's conflicts.
//!
//! `--help` lists every flag; bad flags give a one-line error and exit code 2.

#[path = "../common/cli.rs"]
mod cli;
#[path = "../common/engine_settings.rs"]
mod engine_settings;
mod feed;
#[cfg(feature = "zmq")]
mod zmq;

use std::process::ExitCode;

use clap::Parser;
use engine_settings::{EngineArgs, per_engine};
use feed::Feed;
use prefix_router::IndexConfig;

/// The command line; each flag's doc comment is its line of `--help`.
#[derive(Parser, Debug)]
#[command(
    name = "vllm_events",
    about = "Feeds vLLM KV-event batches (payload files, or live from ZMQ) to a router's \
             mirror and prints what each worker caches.",
    long_about = None,
    after_help = "Bad flags give a one-line error and exit code 2."
)]
struct Cli {
    /// A payload file, one batch as an engine publishes it: WORKER=PATH, or PATH for worker
    /// 0; a worker's batches are numbered in the order of its files.
    #[arg(
        value_name = "[WORKER=]PAYLOAD_FILE",
        value_parser = stream,
        required_unless_present = "zmq",
        conflicts_with_all = ["zmq", "replay", "topic", "batches"]
    )]
    files: Vec<Stream>,
    /// Live: an engine's KV-event socket (vLLM's endpoint), WORKER=ENDPOINT or ENDPOINT for
    /// worker 0, once per engine (feature zmq).
    #[arg(long, value_name = "[WORKER=]ENDPOINT", value_parser = stream)]
    zmq: Vec<Stream>,
    /// Live: an engine's replay socket (vLLM's replay_endpoint), to fill gaps from.
    #[arg(long, value_name = "[WORKER=]ENDPOINT", value_parser = stream, requires = "zmq")]
    replay: Vec<Stream>,
    /// Live: only the messages whose topic starts with TOPIC (default: all).
    #[arg(long, value_name = "TOPIC", requires = "zmq")]
    topic: Option<String>,
    /// Live: stop after N batches (default: when every socket has closed).
    #[arg(long, value_name = "N", requires = "zmq")]
    batches: Option<usize>,
    /// Tokens per KV block, as every engine hashes them.
    #[arg(long, value_name = "N", default_value_t = IndexConfig::default().block_size)]
    block_size: usize,
    #[command(flatten)]
    engines: EngineArgs,
}

/// A worker's stream: a payload file, or a socket.
#[derive(Clone, Debug)]
struct Stream {
    worker: u32,
    value: String,
}

/// `WORKER=VALUE` (or `VALUE` for worker 0: a value whose `=` comes after a `:`, as in an
/// endpoint, is worker 0's whole).
fn stream(arg: &str) -> Result<Stream, String> {
    match arg.split_once('=') {
        Some((w, v)) if !w.contains(':') => w
            .parse::<u32>()
            .map(|worker| Stream {
                worker,
                value: v.to_owned(),
            })
            .map_err(|_| format!("{w:?}: the worker before '=' must be a number")),
        _ => Ok(Stream {
            worker: 0,
            value: arg.to_owned(),
        }),
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return cli::exit(&e),
    };
    let result = if cli.zmq.is_empty() {
        files(&cli)
    } else {
        live(&cli)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// The mirror for `streams`' workers, configured as the flags say, with the settings it
/// assumes of each engine printed.
fn feed(cli: &Cli, streams: &[Stream]) -> Result<Feed, String> {
    let workers = workers_of(streams);
    let given = per_engine(&cli.engines.engines, workers, "worker")?;
    let index = IndexConfig::default()
        .with_block_size(cli.block_size)
        .with_host_chunk_blocks(cli.engines.host_chunk_blocks)
        .with_full_reports(cli.engines.full_reports);
    let feed = Feed::new(workers, index, given)?;
    println!("block size {} tokens, every engine", cli.block_size);
    for line in feed.assumed() {
        println!("{line}");
    }
    Ok(feed)
}

/// The workers `streams` name: 0 to the highest.
fn workers_of(streams: &[Stream]) -> u32 {
    streams.iter().map(|s| s.worker + 1).max().unwrap_or(1)
}

/// What each worker's mirror holds, and the settings conflicts its events showed.
fn print_mirror(feed: &Feed) {
    for (w, blocks) in feed.blocks() {
        println!("worker {w}: {blocks} cached blocks in the mirror");
    }
    for line in feed.conflicts() {
        println!("{line}");
    }
}

fn files(cli: &Cli) -> Result<(), String> {
    let feed = feed(cli, &cli.files)?;
    let mut seq = vec![0u64; workers_of(&cli.files) as usize];
    for Stream {
        worker,
        value: path,
    } in &cli.files
    {
        let payload = std::fs::read(path).map_err(|e| format!("cannot read {path}: {e}"))?;
        let s = seq[*worker as usize];
        seq[*worker as usize] += 1;
        for line in feed
            .apply(*worker, s, &payload)
            .map_err(|e| format!("{path}: {e}"))?
        {
            println!("{line}");
        }
    }
    print_mirror(&feed);
    Ok(())
}

#[cfg(not(feature = "zmq"))]
fn live(_: &Cli) -> Result<(), String> {
    Err(
        "reading ZMQ sockets needs the `zmq` feature: cargo run --example vllm_events --features zmq"
            .to_owned(),
    )
}

#[cfg(feature = "zmq")]
fn live(cli: &Cli) -> Result<(), String> {
    let mut replays = std::collections::HashMap::new();
    for Stream { worker, value } in &cli.replay {
        if !cli.zmq.iter().any(|s| s.worker == *worker) {
            return Err(format!(
                "--replay {worker}={value}: no --zmq for worker {worker}"
            ));
        }
        replays.insert(*worker, value.clone());
    }
    let feed = feed(cli, &cli.zmq)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
        // One task per engine, so that an engine that is down (its socket keeps retrying)
        // does not hold up the others.
        for Stream { worker, value } in &cli.zmq {
            let replay = replays.get(worker).cloned();
            tokio::spawn(follow(
                *worker,
                value.clone(),
                replay,
                cli.topic.clone().unwrap_or_default(),
                tx.clone(),
            ));
        }
        drop(tx);
        let mut done = 0;
        while cli.batches.is_none_or(|n| done < n) {
            let Some((worker, frame)) = rx.recv().await else {
                break;
            };
            match frame.and_then(|f| feed.apply(worker, f.seq, &f.payload)) {
                Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
                Err(e) => {
                    eprintln!("worker {worker}: {e}");
                    continue;
                }
            }
            done += 1;
        }
        print_mirror(&feed);
        Ok(())
    })
}

/// What one engine's task sends on: its worker, and a frame or why there is none.
#[cfg(feature = "zmq")]
type Received = (u32, Result<zmq::Frame, String>);

/// Follows one engine's socket, sending its frames on `tx` in seq order until the socket
/// fails or nobody listens.
#[cfg(feature = "zmq")]
async fn follow(
    worker: u32,
    endpoint: String,
    replay: Option<String>,
    topic: String,
    tx: tokio::sync::mpsc::Sender<Received>,
) {
    eprintln!("worker {worker}: connecting to {endpoint}");
    let mut socket = match zmq::Follower::connect(&endpoint, replay, &topic).await {
        Ok(socket) => socket,
        Err(e) => {
            let _ = tx.send((worker, Err(e))).await;
            return;
        }
    };
    eprintln!("worker {worker}: subscribed to {endpoint}");
    loop {
        let (frames, over) = match socket.next().await {
            Ok(frames) => (frames, false),
            Err(e) => (vec![Err(format!("socket closed: {e}"))], true),
        };
        for frame in frames {
            if tx.send((worker, frame)).await.is_err() {
                return;
            }
        }
        if over {
            return;
        }
    }
}
