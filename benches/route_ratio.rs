//! The two route goals that are ratios, timed interleaved so that both sides of each ratio
//! see the same machine: `BalancedRouter::route` at 16 workers against hashing the prompt
//! alone, and at 1,024 targets against 16. Not a criterion bench: criterion times one size
//! after another, and on a noisy machine the noise moves between them.
//!
//! Each round times hashing, then `route()` + `complete()` on routers of 16, 256 and 1,024
//! workers (each warmed as in `benches/router.rs`: about 10^6 (block, worker) pairs, every
//! worker bounded to its share), each for 40 ms of batches of 8 freshly copied prompts, and
//! takes both ratios within the round. It prints every size's median time and each ratio's
//! median and range over `rounds` rounds (default 15; the first bare number).
//!
//! ```text
//! cargo bench --bench route_ratio -- 25
//! ```

#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use common::TokenWorkload;
use prefix_router::{BalancedConfig, BalancedRouter, PrefixHasher, RouteRequest, Router};

const PAIRS: usize = 1_000_000;
const SIZES: [u32; 3] = [16, 256, 1024];

/// A `BalancedRouter` over `workers` with its mirror warmed to about `PAIRS` pairs.
fn warmed(workers: u32, workload: &mut TokenWorkload) -> BalancedRouter {
    let mut config = BalancedConfig::default();
    config.index.worker_capacity_blocks = Some(PAIRS / workers as usize);
    let router = BalancedRouter::with_config(workers, config).unwrap();
    for _ in 0..PAIRS / 128 {
        let p = workload.prompt();
        let d = router.route(&RouteRequest::new(&p)).unwrap();
        router.complete(&d);
    }
    router
}

/// Nanoseconds per call of `op` over 40 ms of batches of 8 prompts copied just before.
fn time_per_call(next: &mut impl FnMut() -> Vec<u32>, mut op: impl FnMut(&[u32])) -> f64 {
    let (mut total, mut calls) = (Duration::ZERO, 0u32);
    while total < Duration::from_millis(40) {
        let batch: Vec<Vec<u32>> = (0..8).map(|_| next()).collect();
        let start = Instant::now();
        for p in &batch {
            op(black_box(p));
        }
        total += start.elapsed();
        calls += 8;
    }
    total.as_nanos() as f64 / f64::from(calls)
}

fn median_and_range(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let rounds: usize = std::env::args()
        .find_map(|a| a.parse().ok())
        .unwrap_or(15)
        .max(1);
    let mut workload = TokenWorkload::new(11);
    let pool: Vec<Vec<u32>> = (0..4096).map(|_| workload.prompt()).collect();
    let hasher = PrefixHasher::new(16).unwrap();
    let routers: Vec<BalancedRouter> = SIZES.iter().map(|&w| warmed(w, &mut workload)).collect();
    let mut i = 0;
    let mut next = || {
        i = (i + 1) % pool.len();
        pool[i].clone()
    };
    let mut out = Vec::new();
    // Per round: hashing, then each size.
    let mut times: Vec<[f64; 4]> = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let mut round = [0.0; 4];
        round[0] = time_per_call(&mut next, |p| hasher.hash_into(p, &mut out));
        for (t, router) in round[1..].iter_mut().zip(&routers) {
            *t = time_per_call(&mut next, |p| {
                let d = router.route(&RouteRequest::new(p)).unwrap();
                router.complete(&d);
            });
        }
        times.push(round);
    }
    for (k, name) in ["hash", "16 workers", "256 workers", "1,024 targets"]
        .iter()
        .enumerate()
    {
        let (median, low, high) = median_and_range(times.iter().map(|r| r[k]).collect());
        println!("{name}: median {median:.0} ns ({low:.0}-{high:.0})");
    }
    let ratio = |a: usize, b: usize| median_and_range(times.iter().map(|r| r[a] / r[b]).collect());
    let (m, lo, hi) = ratio(1, 0);
    println!("route at 16 workers / hashing: median {m:.2} ({lo:.2}-{hi:.2})");
    let (m, lo, hi) = ratio(3, 1);
    println!("route at 1,024 targets / at 16: median {m:.2} ({lo:.2}-{hi:.2})");
}
