//! A fixed event-store workload for counting instructions, which are repeatable on a noisy
//! machine where times are not. Not a criterion bench: it runs `rounds` rounds (default
//! 2,000; the first argument that parses as a number) of the `apply_stored_8_blocks` workload
//! of `benches/sync.rs` (16 store events of a 128-block prompt into one worker's mirror of
//! 10^6 blocks, then the prompt's removal), with the stores alone in `sync_count::stores`.
//! With the argument `load`, it loads an empty index instead, as a router replica that joins
//! late replays the engines' events: `rounds` 128-block prompts (Zipf system prompts, unique
//! tails) of 16 workers, each one store event from the root, in `sync_count::loads`.
//!
//! ```text
//! cargo bench --bench sync_count --no-run     # prints the binary's path
//! valgrind --tool=callgrind --toggle-collect='sync_count::stores' <binary> 2000
//! valgrind --tool=callgrind --toggle-collect='sync_count::loads' <binary> load 2000
//! ```
//!
//! Instructions per store event: the total callgrind reports over `rounds × 16`; per loaded
//! block: the total over `rounds × 128`.

#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use common::{PROMPT_BLOCKS, Rng, TokenWorkload, event_fed_index, prompt_events};
use prefix_router::{
    BlockHash, CacheEvent, CacheIndex, CacheSync, IndexConfig, PrefixHasher, WorkerId,
};

#[inline(never)]
fn stores(index: &CacheIndex, events: &[CacheEvent]) {
    for e in events {
        std::hint::black_box(index.apply_event(WorkerId::new(0), 0, e).unwrap());
    }
}

#[inline(never)]
fn loads(index: &CacheIndex, events: &[(WorkerId, CacheEvent)]) {
    for (w, e) in events {
        std::hint::black_box(index.apply_event(*w, 0, e).unwrap());
    }
}

/// One 128-block store event from the root per prompt, each on one of 16 workers.
fn load(rounds: usize) {
    let mut workload = TokenWorkload::new(11);
    // The engine's hashes: chained over the tokens, as an engine's are (equal prefixes, equal
    // hashes), seeded apart from the router's.
    let engine = PrefixHasher::new(16).unwrap().with_seed(1);
    let events: Vec<(WorkerId, CacheEvent)> = (0..rounds)
        .map(|_| {
            let worker = workload.worker(16);
            let prompt = workload.prompt();
            let blocks = engine
                .hash(&prompt)
                .into_iter()
                .map(BlockHash::get)
                .collect();
            (worker, CacheEvent::stored(None, blocks, prompt))
        })
        .collect();
    let index = CacheIndex::new(IndexConfig::default()).unwrap();
    loads(&index, &events);
    println!("{rounds} store events of {PROMPT_BLOCKS} blocks");
}

fn main() {
    let rounds: usize = std::env::args()
        .find_map(|a| a.parse().ok())
        .unwrap_or(2_000);
    if std::env::args().any(|a| a == "load") {
        load(rounds);
        return;
    }
    let mut rng = Rng(5);
    let index = event_fed_index(&mut rng, 1_000_000);
    let pool: Vec<_> = (0..512).map(|_| prompt_events(&mut rng)).collect();
    for r in 0..rounds {
        let (events, removal) = &pool[r % pool.len()];
        stores(&index, events);
        index.apply_event(WorkerId::new(0), 0, removal).unwrap();
    }
    println!(
        "{rounds} rounds: {} store events of 8 blocks",
        rounds * pool[0].0.len()
    );
}
