//! The gateway's tokenization of a long chat: the whole rendered text through the
//! tokenizer, against the segment cache with every earlier turn cached (the next turn of a
//! conversation the gateway has seen). The tokenizer is the committed byte-level test
//! tokenizer (1,000 tokens, so about one token per 2.5 characters of English); the text is
//! the repository's README, cut into a system prompt and turns.
//!
//! `cargo bench --bench tokenize`

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, missing_docs)]

#[path = "../examples/gateway/chat.rs"]
mod chat;
#[path = "../examples/gateway/prompt.rs"]
mod prompt;
#[path = "../examples/gateway/tokenize.rs"]
mod tokenize;

use std::path::Path;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Map, Value, json};

fn prompts() -> prompt::Prompts {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tokenizer/bytelevel");
    prompt::Prompts::load(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
        64 << 20,
    )
    .unwrap()
}

/// A chat of `turns` user and assistant turns after a long system prompt, all cut from the
/// README, ending with a new user message.
fn chat(turns: usize) -> Map<String, Value> {
    let readme = include_str!("../README.md");
    let words: Vec<&str> = readme.split_whitespace().collect();
    let piece = |from: usize, n: usize| -> String {
        (0..n)
            .map(|i| words[(from + i) % words.len()])
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut messages = vec![json!({"role": "system", "content": piece(0, 2_000)})];
    for t in 0..turns {
        let role = if t % 2 == 0 { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": piece(2_000 + t * 400, 400)}));
    }
    messages.push(json!({"role": "user", "content": piece(77, 120)}));
    json!({"messages": messages}).as_object().unwrap().clone()
}

fn bench(c: &mut Criterion) {
    let p = prompts();
    let mut group = c.benchmark_group("tokenize_chat");
    for turns in [8, 40] {
        let text = p.render_chat(&chat(turns)).unwrap();
        let tokens = p.tokens().encode(&text, false).unwrap().len();
        group.throughput(Throughput::Elements(tokens as u64));
        let label = format!("{turns}_turns_{tokens}_tokens");
        group.bench_with_input(BenchmarkId::new("whole", &label), &text, |b, text| {
            b.iter(|| p.tokens().encode(text, false).unwrap());
        });
        p.tokens().tokenize(&text, false).unwrap();
        group.bench_with_input(
            BenchmarkId::new("segment_cache", &label),
            &text,
            |b, text| {
                b.iter(|| p.tokens().tokenize(text, false).unwrap());
            },
        );
        // A new last message every time: everything before it comes from the cache.
        let mut n = 0u64;
        group.bench_with_input(BenchmarkId::new("next_turn", &label), &text, |b, text| {
            b.iter(|| {
                n += 1;
                let next = format!("{text}<|im_start|>user\nquestion {n} about caches<|im_end|>\n");
                p.tokens().tokenize(&next, false).unwrap()
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
