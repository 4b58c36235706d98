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

mod feed;
#[cfg(feature = "zmq")]
mod zmq;

use std::process::ExitCode;

use feed::Feed;

const USAGE: &str = "usage: vllm_events [WORKER=]PAYLOAD_FILE ...
       vllm_events --zmq [WORKER=]ENDPOINT ... [--replay [WORKER=]ENDPOINT ...] [--topic TOPIC] [--batches N]   (feature zmq)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = if args.first().is_some_and(|a| a.starts_with("--")) {
        live(&args)
    } else {
        files(&args)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// `WORKER=VALUE` (or `VALUE` for worker 0).
fn worker_and(arg: &str) -> Result<(u32, String), String> {
    match arg.split_once('=') {
        Some((w, v)) if !w.contains(':') => w
            .parse::<u32>()
            .map(|w| (w, v.to_owned()))
            .map_err(|_| format!("{arg:?}: the worker before '=' must be a number")),
        _ => Ok((0, arg.to_owned())),
    }
}

fn workers_of<T>(streams: &[(u32, T)]) -> u32 {
    streams.iter().map(|(w, _)| w + 1).max().unwrap_or(1)
}

fn print_mirror(feed: &Feed) {
    for (w, blocks) in feed.blocks() {
        println!("worker {w}: {blocks} cached blocks in the mirror");
    }
}

fn files(args: &[String]) -> Result<(), String> {
    if args.is_empty() {
        return Err(USAGE.to_owned());
    }
    let streams = args
        .iter()
        .map(|a| worker_and(a))
        .collect::<Result<Vec<_>, _>>()?;
    let feed = Feed::new(workers_of(&streams)).map_err(|e| e.to_string())?;
    let mut seq = vec![0u64; workers_of(&streams) as usize];
    for (worker, path) in &streams {
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
fn live(_: &[String]) -> Result<(), String> {
    Err(format!(
        "reading ZMQ sockets needs the `zmq` feature (cargo run --example vllm_events --features zmq)\n{USAGE}"
    ))
}

#[cfg(feature = "zmq")]
fn live(args: &[String]) -> Result<(), String> {
    let mut endpoints = Vec::new();
    let mut replays = std::collections::HashMap::new();
    let (mut topic, mut batches) = (String::new(), None);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--zmq" => endpoints.push(worker_and(value)?),
            "--replay" => {
                let (worker, endpoint) = worker_and(value)?;
                replays.insert(worker, endpoint);
            }
            "--topic" => topic.clone_from(value),
            "--batches" => {
                batches = Some(
                    value
                        .parse::<usize>()
                        .map_err(|_| format!("--batches {value:?}: not a number"))?,
                );
            }
            _ => return Err(format!("unknown option {flag}\n{USAGE}")),
        }
    }
    if endpoints.is_empty() {
        return Err(USAGE.to_owned());
    }
    let feed = Feed::new(workers_of(&endpoints)).map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
        // One task per engine, so that an engine that is down (its socket keeps retrying)
        // does not hold up the others.
        for (worker, endpoint) in endpoints {
            let replay = replays.get(&worker).cloned();
            tokio::spawn(follow(worker, endpoint, replay, topic.clone(), tx.clone()));
        }
        drop(tx);
        let mut done = 0;
        while batches.is_none_or(|n| done < n) {
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
