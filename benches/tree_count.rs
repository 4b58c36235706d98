//! Fixed tree workloads for counting instructions, which are repeatable on a noisy machine
//! where times are not. Not a criterion bench: it loads the tree bench's 16-worker tree of
//! 10^6 (block, worker) pairs, then runs `rounds` (default 20,000; the first argument that
//! parses as a number) full-hit matches in `tree_count::matches`, then as many steady-state
//! inserts of routed prompts (each worker at a capacity of its share, so each insert evicts)
//! in `tree_count::inserts`.
//!
//! ```text
//! cargo bench --bench tree_count --no-run     # prints the binary's path
//! valgrind --tool=callgrind --toggle-collect='tree_count::matches' <binary> 20000
//! valgrind --tool=callgrind --toggle-collect='tree_count::inserts' <binary> 20000
//! ```
//!
//! Instructions per operation: the total callgrind reports over `rounds`.

#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use common::{PROMPT_BLOCKS, loaded_tree};
use prefix_router::{BlockHash, PrefixMatch, RadixTree, WorkerId};

#[inline(never)]
fn matches(tree: &RadixTree, queries: &[Vec<BlockHash>], rounds: usize) -> usize {
    let mut out = PrefixMatch::new();
    let mut total = 0;
    for r in 0..rounds {
        tree.match_prefix_into(std::hint::black_box(&queries[r % queries.len()]), &mut out);
        total += out.len();
    }
    total
}

#[inline(never)]
fn inserts(tree: &mut RadixTree, prompts: &[(WorkerId, Vec<BlockHash>)], rounds: usize) {
    for r in 0..rounds {
        let (w, p) = &prompts[r % prompts.len()];
        tree.insert(*w, std::hint::black_box(p));
    }
}

fn main() {
    let rounds: usize = std::env::args()
        .find_map(|a| a.parse().ok())
        .unwrap_or(20_000);
    let workers = 16;
    let (mut tree, inserted, mut wl) = loaded_tree(workers, 1_000_000, 7);
    let hits: Vec<_> = inserted
        .iter()
        .rev()
        .take(64)
        .map(|(_, p)| p.clone())
        .collect();
    let matched = matches(&tree, &hits, rounds);
    for w in 0..workers {
        let held = tree.worker_block_count(WorkerId::new(w));
        tree.set_capacity(WorkerId::new(w), held.max(PROMPT_BLOCKS));
    }
    let prompts: Vec<_> = (0..4096)
        .map(|_| (wl.worker(workers), wl.prompt()))
        .collect();
    inserts(&mut tree, &prompts, rounds);
    println!("{rounds} matches ({matched} worker results), {rounds} inserts");
}
