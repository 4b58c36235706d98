//! RadixTree: match, insert and remove_worker on trees loaded with Zipf-shared prompts.
//!
//! Trees hold 10^4, 10^5 and 10^6 (block, worker) pairs across 16 and 256 workers; prompts
//! are 128 blocks (2,048 tokens at block size 16): one of 200 system prompts of 32 blocks
//! chosen by Zipf(1.0), then a unique tail. Also prints bytes per (block, worker) from
//! `memory_bytes()`, and bytes per additional holder of an already cached block.
//!
//! Run: `cargo bench --bench tree`.

#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{PROMPT_BLOCKS, loaded_tree, pairs};
use criterion::{BatchSize, BenchmarkId, Criterion, black_box, criterion_group, criterion_main};
use prefix_router::{PrefixMatch, WorkerId};

const SIZES: [usize; 3] = [10_000, 100_000, 1_000_000];
const WORKERS: [u32; 2] = [16, 256];

fn memory_report() {
    for workers in WORKERS {
        for size in SIZES {
            let (mut tree, inserted, _) = loaded_tree(workers, size, 7);
            let (bytes, held) = (tree.memory_bytes(), pairs(&tree, workers));
            // Every prompt also cached by one more worker: the cost of extra holders.
            for (w, p) in &inserted {
                tree.insert(WorkerId::new((w.get() + 1) % workers), p);
            }
            let (bytes2, held2) = (tree.memory_bytes(), pairs(&tree, workers));
            println!(
                "memory workers={workers} pairs={held}: {:.1} B per (block, worker); \
                 additional holders: {:.2} B per pair ({} nodes, {} blocks)",
                bytes as f64 / held as f64,
                (bytes2 as f64 - bytes as f64) / (held2 - held) as f64,
                tree.node_count(),
                tree.block_count(),
            );
        }
    }
}

fn tree_ops(c: &mut Criterion) {
    memory_report();
    let mut group = c.benchmark_group("tree");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for workers in WORKERS {
        for size in SIZES {
            let (tree, inserted, mut wl) = loaded_tree(workers, size, 7);
            let label = format!("w{workers}/pairs{size}");
            let mut out = PrefixMatch::new();
            // Full hit: prompts recently inserted.
            let hits: Vec<_> = inserted
                .iter()
                .rev()
                .take(64)
                .map(|(_, p)| p.clone())
                .collect();
            let partial: Vec<_> = (0..64).map(|_| wl.partial()).collect();
            let misses: Vec<_> = (0..64).map(|_| wl.miss()).collect();
            for (name, queries) in [("hit", &hits), ("partial", &partial), ("miss", &misses)] {
                let mut i = 0;
                group.bench_function(BenchmarkId::new(format!("match_{name}"), &label), |b| {
                    b.iter(|| {
                        i = (i + 1) % queries.len();
                        tree.match_prefix_into(black_box(&queries[i]), &mut out);
                        out.len()
                    });
                });
            }
            // Insert of a routed prompt, in steady state: every worker is at a capacity of
            // its current share, so each insert also evicts about one prompt.
            let mut steady = tree.clone();
            for w in 0..workers {
                let held = steady.worker_block_count(WorkerId::new(w));
                steady.set_capacity(WorkerId::new(w), held.max(PROMPT_BLOCKS));
            }
            let prompts: Vec<_> = (0..4096)
                .map(|_| (wl.worker(workers), wl.prompt()))
                .collect();
            let mut i = 0;
            group.bench_function(BenchmarkId::new("insert", &label), |b| {
                b.iter(|| {
                    i = (i + 1) % prompts.len();
                    let (w, p) = &prompts[i];
                    steady.insert(*w, black_box(p));
                });
            });
            if size <= 100_000 {
                group.bench_function(BenchmarkId::new("remove_worker", &label), |b| {
                    b.iter_batched(
                        || tree.clone(),
                        |mut t| {
                            t.remove_worker(WorkerId::new(3));
                            t
                        },
                        BatchSize::LargeInput,
                    );
                });
            }
        }
    }
    group.finish();
}

criterion_group!(benches, tree_ops);
criterion_main!(benches);
