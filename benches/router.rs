//! `route()` + `complete()` per policy, 2,048-token prompts, and two-thread throughput.
//!
//! The cache-aware routers' indexes are warmed to about 10^6 (block, worker) pairs first
//! (each worker bounded to its share, so the mirror stays that size while the bench runs).
//! Prompts cycle through a pool of 4,096 (Zipf-shared system prompt + unique tail), so
//! later rounds also exercise full hits. Each prompt is copied into a fresh buffer just
//! before it is routed (untimed), as a gateway that has just decoded the request holds its
//! tokens in cache; the hashing baseline is measured the same way.
//!
//! Run: `cargo bench --bench router`.

#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::TokenWorkload;
use criterion::{
    BatchSize, BenchmarkId, Criterion, Throughput, black_box, criterion_group, criterion_main,
};
use prefix_router::*;

const PAIRS: usize = 1_000_000;

fn index_config(workers: u32) -> IndexConfig {
    let mut c = IndexConfig::default();
    c.worker_capacity_blocks = Some(PAIRS / workers as usize);
    c
}

fn routers(workers: u32) -> Vec<Arc<dyn Router>> {
    let mut balanced = BalancedConfig::default();
    balanced.index = index_config(workers);
    let mut weighted = balanced;
    weighted.scoring = Scoring::Weighted;
    let mut cache_aware = CacheAwareConfig::default();
    cache_aware.index = index_config(workers);
    vec![
        Arc::new(RoundRobinRouter::new(workers).unwrap()),
        Arc::new(LeastLoadedRouter::new(workers).unwrap()),
        Arc::new(PowerOfTwoRouter::new(workers).unwrap()),
        Arc::new(ConsistentHashRouter::new(workers).unwrap()),
        Arc::new(AffinityRouter::new(workers).unwrap()),
        Arc::new(BalancedRouter::with_config(workers, balanced).unwrap()),
        Arc::new(BalancedRouter::with_config(workers, weighted).unwrap()),
        Arc::new(CacheAwareRouter::with_config(workers, cache_aware).unwrap()),
    ]
}

fn warm(router: &dyn Router, workload: &mut TokenWorkload) {
    // About PAIRS / 128 prompts of 128 blocks each fill the mirror.
    for _ in 0..PAIRS / 128 {
        let p = workload.prompt();
        let d = router.route(&RouteRequest::new(&p)).unwrap();
        router.complete(&d);
    }
}

fn route_complete(c: &mut Criterion) {
    let mut workload = TokenWorkload::new(11);
    let pool: Arc<Vec<Vec<u32>>> = Arc::new((0..4096).map(|_| workload.prompt()).collect());
    let hasher = PrefixHasher::new(16).unwrap();
    let mut group = c.benchmark_group("route_complete");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Elements(1));
    // Batches of 8 freshly copied prompts (64 KiB): hot, as in a gateway.
    let hot = BatchSize::NumIterations(8);
    let mut out = Vec::new();
    let mut i = 0;
    let mut next = || {
        i = (i + 1) % pool.len();
        pool[i].clone()
    };
    group.bench_function("hash_only_2048_tokens_bs16", |b| {
        b.iter_batched_ref(
            &mut next,
            |p| {
                hasher.hash_into(black_box(p), &mut out);
                out.len()
            },
            hot,
        );
    });
    for workers in [16, 256] {
        for router in routers(workers) {
            warm(router.as_ref(), &mut workload);
            let id = BenchmarkId::new(router.name(), format!("w{workers}"));
            group.bench_function(id, |b| {
                b.iter_batched_ref(
                    &mut next,
                    |p| {
                        let d = router.route(&RouteRequest::new(black_box(p))).unwrap();
                        router.complete(&d);
                        d.cached_tokens()
                    },
                    hot,
                );
            });
        }
    }
    group.finish();
    route_targets(c, &mut workload, &pool);

    // Throughput with one and two threads routing concurrently on one router.
    let mut group = c.benchmark_group("route_threads");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(1));
    let mut balanced = BalancedConfig::default();
    balanced.index = index_config(16);
    let router: Arc<dyn Router> = Arc::new(BalancedRouter::with_config(16, balanced).unwrap());
    warm(router.as_ref(), &mut workload);
    for threads in [1u64, 2] {
        group.bench_function(
            BenchmarkId::new("balanced_w16", format!("{threads}_threads")),
            |b| {
                b.iter_custom(|iters| {
                    let per_thread = iters / threads + 1;
                    let start = Instant::now();
                    let handles: Vec<_> = (0..threads)
                        .map(|t| {
                            let (router, pool) = (Arc::clone(&router), Arc::clone(&pool));
                            std::thread::spawn(move || {
                                for k in 0..per_thread {
                                    let p = &pool[((k * threads + t) % pool.len() as u64) as usize];
                                    let d = router.route(&RouteRequest::new(p)).unwrap();
                                    router.complete(&d);
                                }
                            })
                        })
                        .collect();
                    for h in handles {
                        h.join().unwrap();
                    }
                    start.elapsed()
                });
            },
        );
    }
    group.finish();
}

/// `BalancedRouter` (the default policy) over 16, 256 and 1,024 targets (a 32-node fleet of
/// 32 data-parallel ranks each is 1,024), each warmed as above.
fn route_targets(c: &mut Criterion, workload: &mut TokenWorkload, pool: &Arc<Vec<Vec<u32>>>) {
    let mut group = c.benchmark_group("route_targets");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Elements(1));
    let hot = BatchSize::NumIterations(8);
    let mut i = 0;
    let mut next = || {
        i = (i + 1) % pool.len();
        pool[i].clone()
    };
    for workers in [16, 256, 1024] {
        let mut config = BalancedConfig::default();
        config.index = index_config(workers);
        let router = BalancedRouter::with_config(workers, config).unwrap();
        warm(&router, workload);
        group.bench_function(BenchmarkId::new("balanced", format!("w{workers}")), |b| {
            b.iter_batched_ref(
                &mut next,
                |p| {
                    let d = router.route(&RouteRequest::new(black_box(p))).unwrap();
                    router.complete(&d);
                    d.cached_tokens()
                },
                hot,
            );
        });
    }
    group.finish();
}

criterion_group!(benches, route_complete);
criterion_main!(benches);
