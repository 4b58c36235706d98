//! A fixed routing workload for counting instructions, which are repeatable on a noisy
//! machine where times are not. Not a criterion bench: a `BalancedRouter` over `workers`
//! workers (default 16; `--workers N`) with its mirror warmed to 10^6 (block, worker) pairs
//! (each worker bounded to its share, so every route also evicts), then `rounds` (default
//! 20,000; the first bare number) `route()` + `complete()` of 2,048-token prompts in
//! `route_count::routes`, and as many hashes of the same prompts in `route_count::hashes`.
//! With `--admission`, each request asks for admission at 2 s to its first token and 0.1 s
//! per output token, and the host reports each one's first token and streamed progress
//! before completing it (in `route_count::report`), so that the observed gates run.
//!
//! ```text
//! cargo bench --bench route_count --no-run     # prints the binary's path
//! valgrind --tool=callgrind --toggle-collect='route_count::routes' <binary> 20000 --workers 256
//! valgrind --tool=callgrind --toggle-collect='route_count::hashes' <binary> 20000
//! # the routes and completions alone, the host's reports not counted:
//! valgrind --tool=callgrind --toggle-collect='route_count::routes' \
//!     --toggle-collect='route_count::report' <binary> 20000 --admission
//! ```
//!
//! Instructions per route (or hash): the total callgrind reports over `rounds`.

#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use common::TokenWorkload;
use std::time::Duration;

use prefix_router::{
    BalancedConfig, BalancedRouter, IndexConfig, PrefixHasher, RouteDecision, RouteRequest, Router,
};

const PAIRS: usize = 1_000_000;

#[inline(never)]
fn routes(router: &dyn Router, prompts: &[Vec<u32>], rounds: usize, admission: bool) -> usize {
    let mut shed = 0;
    for r in 0..rounds {
        let p = &prompts[r % prompts.len()];
        let mut request = RouteRequest::new(std::hint::black_box(p));
        if admission {
            // A request every 20 ms: about what one router of a 16-worker fleet takes.
            request = request
                .with_time(Duration::from_millis(20 * r as u64))
                .with_ttft_target(Duration::from_secs(2))
                .with_tpot_target(Duration::from_millis(100));
        }
        match router.route(&request) {
            Ok(d) => {
                if admission {
                    report(router, &d);
                }
                router.complete(&d);
            }
            Err(prefix_router::Error::Shed(_)) => shed += 1,
            Err(e) => panic!("{e}"),
        }
    }
    shed
}

/// The host's reports of a request's first token and streamed progress.
#[inline(never)]
fn report(router: &dyn Router, d: &RouteDecision) {
    router.first_token_after(d, Duration::from_millis(60));
    router.tokens_after(d, 16, Duration::from_millis(160));
}

#[inline(never)]
fn hashes(hasher: &PrefixHasher, prompts: &[Vec<u32>], rounds: usize) -> usize {
    let mut out = Vec::new();
    let mut total = 0;
    for r in 0..rounds {
        hasher.hash_into(std::hint::black_box(&prompts[r % prompts.len()]), &mut out);
        total += out.len();
    }
    total
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(20_000);
    let workers: u32 = args
        .iter()
        .position(|a| a == "--workers")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(16);
    let mut index = IndexConfig::default();
    index.worker_capacity_blocks = Some(PAIRS / workers as usize);
    let mut config = BalancedConfig::default();
    config.index = index;
    let router = BalancedRouter::with_config(workers, config).unwrap();
    let mut workload = TokenWorkload::new(11);
    for _ in 0..PAIRS / 128 {
        let d = router
            .route(&RouteRequest::new(&workload.prompt()))
            .unwrap();
        router.complete(&d);
    }
    let prompts: Vec<_> = (0..4096).map(|_| workload.prompt()).collect();
    let admission = args.iter().any(|a| a == "--admission");
    let shed = routes(&router, &prompts, rounds, admission);
    let hashed = hashes(&PrefixHasher::new(16).unwrap(), &prompts, rounds);
    println!("{workers} workers: {rounds} routes ({shed} shed), {rounds} hashes ({hashed} blocks)");
}
