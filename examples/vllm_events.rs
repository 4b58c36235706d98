//! Feeds vLLM KV-event payloads to a router's mirror and prints what each worker caches.
//!
//! Run (the test vectors of `../shared/vectors/vllm` as worker 0's stream):
//!
//! ```sh
//! cargo run --example vllm_events --features vllm -- \
//!     0=../shared/vectors/vllm/map_u64/batch_00.msgpack 0=../shared/vectors/vllm/map_u64/batch_01.msgpack
//! ```
//!
//! Each argument is `WORKER=PATH` (or just `PATH` for worker 0): one payload frame as a vLLM
//! engine publishes it on its ZMQ PUB socket. The batch sequence number is the order of the
//! files per worker. A host would read the same frames from the socket.

use std::process::ExitCode;

use prefix_router::sync::vllm::decode_batch;
use prefix_router::{BalancedRouter, CacheSync, Router, WorkerId};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        eprintln!("usage: vllm_events [WORKER=]PAYLOAD_FILE ...");
        return ExitCode::from(2);
    }
    let mut streams: Vec<(u32, String)> = Vec::new();
    for arg in &args {
        let (worker, path) = match arg.split_once('=') {
            Some((w, p)) => match w.parse::<u32>() {
                Ok(w) => (w, p.to_owned()),
                Err(_) => {
                    eprintln!("error: {arg:?}: the worker before '=' must be a number");
                    return ExitCode::from(2);
                }
            },
            None => (0, arg.clone()),
        };
        streams.push((worker, path));
    }
    let workers = streams.iter().map(|(w, _)| w + 1).max().unwrap_or(1);
    let router = match BalancedRouter::new(workers) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let mut seq = vec![0u64; workers as usize];
    for (worker, path) in &streams {
        let payload = match std::fs::read(path) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("error: cannot read {path}: {e}");
                return ExitCode::from(1);
            }
        };
        let batch = match decode_batch(&payload) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("error: {path}: {e}");
                return ExitCode::from(1);
            }
        };
        let s = seq[*worker as usize];
        seq[*worker as usize] += 1;
        for event in &batch.events {
            match router.apply_event(WorkerId::new(*worker), s, &event.to_cache_event()) {
                Ok(o) => println!(
                    "worker {worker} seq {s}: {}: stored {}, removed {}, duplicates {}, unknown parent {}",
                    variant(event),
                    o.stored_blocks,
                    o.removed_blocks,
                    o.duplicate_blocks,
                    o.unknown_parent_blocks
                ),
                Err(e) => eprintln!("worker {worker} seq {s}: rejected: {e}"),
            }
        }
    }
    for w in router.workers() {
        let blocks = router.index().with_tree(|t| t.worker_block_count(w));
        println!("worker {}: {blocks} cached blocks in the mirror", w.get());
    }
    ExitCode::SUCCESS
}

fn variant(event: &prefix_router::sync::vllm::EngineEvent) -> &'static str {
    use prefix_router::sync::vllm::EngineEvent;
    match event {
        EngineEvent::BlockStored { .. } => "BlockStored",
        EngineEvent::BlockRemoved { .. } => "BlockRemoved",
        _ => "AllBlocksCleared",
    }
}
