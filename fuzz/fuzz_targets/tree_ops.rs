//! Arbitrary sequences of tree operations over a small block alphabet: no panic, and every
//! invariant (`validate`) holds after every step.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prefix_router::{BlockHash, RadixTree, WorkerId};

fuzz_target!(|data: &[u8]| {
    let mut tree = RadixTree::new();
    for op in data.chunks(4) {
        let [kind, worker, a, b] = [
            op[0],
            *op.get(1).unwrap_or(&0),
            *op.get(2).unwrap_or(&0),
            *op.get(3).unwrap_or(&0),
        ];
        // Worker ids up to 80 exercise the second bitset word.
        let w = WorkerId::new(u32::from(worker % 80));
        let blocks: Vec<BlockHash> = (0..a % 9)
            .map(|i| BlockHash::new(u64::from((b >> (i % 8)) & 3)))
            .collect();
        match kind % 7 {
            0 | 1 => tree.insert(w, &blocks),
            2 => tree.remove(w, &blocks),
            3 => tree.remove_worker(w),
            4 => tree.set_capacity(w, usize::from(b % 16)),
            5 => tree.truncate(w, &blocks, usize::from(b % 9)),
            _ => {
                let m = tree.match_prefix(&blocks);
                assert!(m.iter().all(|(_, n)| n <= blocks.len()));
            }
        }
        if let Err(e) = tree.validate() {
            panic!("invariant broken: {e}");
        }
    }
});
