//! `PdRouter::route_pair()` + `complete()` on disaggregated fleets of 8, 64 and 256
//! workers (a quarter of them prefill-only, the rest decode-only), 2,048-token prompts
//! drawn from the shared workload (Zipf-shared system prompt + unique tail), every worker
//! reporting a load so that plans differ. The cost decider weighs every plan: each decode
//! worker aggregated and split with each prefill worker.
//!
//! Run: `cargo bench --bench pair`.

#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::TokenWorkload;
use criterion::{BatchSize, BenchmarkId, Criterion, black_box, criterion_group, criterion_main};
use prefix_router::*;

fn router(workers: u32) -> PdRouter {
    let prefill = workers / 4;
    let roles: Vec<Role> = (0..workers)
        .map(|w| {
            if w < prefill {
                Role::Prefill
            } else {
                Role::Decode
            }
        })
        .collect();
    let router = PdRouter::new(&roles, PdConfig::default()).unwrap();
    for w in 0..workers {
        let load = EngineLoad::new(u64::from(w % 3), u64::from(w % 17), Duration::ZERO)
            .with_prefill_tokens(u64::from(w % 5) * 1_000);
        router.router().report_load(WorkerId::new(w), load).unwrap();
    }
    router
}

fn bench_pairs(c: &mut Criterion) {
    let mut group = c.benchmark_group("route_pair");
    for workers in [8u32, 64, 256] {
        let router = router(workers);
        let mut workload = TokenWorkload::new(42);
        for _ in 0..2_000 {
            let p = workload.prompt();
            let pair = router.route_pair(&RouteRequest::new(&p)).unwrap();
            router.prefill_done(&pair);
            router.complete(&pair);
        }
        group.bench_function(BenchmarkId::new("cost", workers), |b| {
            b.iter_batched(
                || workload.prompt(),
                |p| {
                    let pair = router
                        .route_pair(&RouteRequest::new(black_box(&p)))
                        .unwrap();
                    router.prefill_done(&pair);
                    router.complete(&pair);
                },
                BatchSize::SmallInput,
            );
        });
    }
    group.finish();
}

criterion_group!(benches, bench_pairs);
criterion_main!(benches);
