//! Hashing a 2,048-token prompt, against one XXH3 pass over the same 8 KiB.
//!
//! Run: `cargo bench --bench hash`.

#![allow(missing_docs, clippy::unwrap_used)]

use criterion::{BenchmarkId, Criterion, Throughput, black_box, criterion_group, criterion_main};
use prefix_router::{HashAlgorithm, PrefixHasher};

const TOKENS: usize = 2048;

fn prompt() -> Vec<u32> {
    (0..TOKENS as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) % 151_936)
        .collect()
}

fn hash_prompt(c: &mut Criterion) {
    let tokens = prompt();
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let mut group = c.benchmark_group("hash_2048_tokens");
    group.throughput(Throughput::Elements(TOKENS as u64));
    group.bench_function("baseline_xxh3_one_pass_8KiB", |b| {
        b.iter(|| xxhash_rust::xxh3::xxh3_64(black_box(&bytes)));
    });
    for algorithm in [HashAlgorithm::Xxh3, HashAlgorithm::Sha256] {
        for block_size in [16, 64] {
            let hasher = PrefixHasher::with_algorithm(block_size, algorithm).unwrap();
            let mut out = Vec::with_capacity(TOKENS / block_size);
            let id = BenchmarkId::new(format!("{algorithm:?}"), format!("bs{block_size}"));
            group.bench_with_input(id, &tokens, |b, tokens| {
                b.iter(|| {
                    hasher.hash_into(black_box(tokens), &mut out);
                    out.len()
                });
            });
        }
    }
    group.finish();
}

criterion_group!(benches, hash_prompt);
criterion_main!(benches);
