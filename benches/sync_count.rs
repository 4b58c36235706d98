//! A fixed event-store workload for counting instructions, which are repeatable on a noisy
//! machine where times are not. Not a criterion bench: it runs `rounds` rounds (default
//! 2,000; the first argument that parses as a number) of the `apply_stored_8_blocks` workload
//! of `benches/sync.rs` (16 store events of a 128-block prompt into one worker's mirror of
//! 10^6 blocks, then the prompt's removal), with the stores alone in `sync_count::stores`.
//!
//! ```text
//! cargo bench --bench sync_count --no-run     # prints the binary's path
//! valgrind --tool=callgrind --toggle-collect='sync_count::stores' <binary> 2000
//! ```
//!
//! Instructions per store event: the total callgrind reports over `rounds × 16`.

#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use common::{Rng, event_fed_index, prompt_events};
use prefix_router::{CacheEvent, CacheIndex, CacheSync, WorkerId};

#[inline(never)]
fn stores(index: &CacheIndex, events: &[CacheEvent]) {
    for e in events {
        std::hint::black_box(index.apply_event(WorkerId::new(0), 0, e).unwrap());
    }
}

fn main() {
    let rounds: usize = std::env::args()
        .find_map(|a| a.parse().ok())
        .unwrap_or(2_000);
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
