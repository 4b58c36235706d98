//! A worker's engine blocks: records in an arena of `u32` slots, found by engine hash
//! through an index that holds only the slot numbers.
//!
//! A hash map of engine hash → record keeps its records in its own slots, half of which are
//! empty after it grows, and a store touches a random one of them per block. Here the index
//! holds 4-byte slot numbers (a table a fifth the size, which stays in cache far longer),
//! and 16-byte records live in a dense, chunked arena ([`Chunks`]: little spare room, and
//! growing it moves no record twice) whose freed slots are reused last freed first: an
//! engine that evicts a finished request (last block first) and stores the next one writes
//! records where the evicted ones were, still in cache and in order.
//!
//! Glossary: a record's **parent link** is its parent's engine hash, as the store that
//! reported the block named it (the previous block of the store, or the store's parent),
//! or none for a block at the root. A record **follows** its parent when it was written in
//! a slot next to the parent's, just after it or just before it (freed slots are reused in
//! the reverse order of their freeing, so an engine's evictions in either order leave runs
//! of slots): its link is that slot's engine hash and costs a bit. Every other link is
//! kept in a side table, one entry per store that did not continue its parent's slots.
//!
//! Invariant: a live record follows its parent or it has an entry in the side table, one
//! of the three; a free slot has none. Before a slot is freed, a record that follows it
//! gets the slot's engine hash as an entry, so a link never names a slot's later
//! occupant.

use hashbrown::HashTable;

use crate::BlockHash;
use crate::bits::{bit, set_bit};
use crate::chunks::Chunks;
use crate::fold::{FoldMap, fold64 as hash};

use super::SyncOutcome;

/// One engine block a worker reported stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Record {
    /// The engine's hash of the block (the key).
    engine: u64,
    /// The router's chained hash of the same block.
    router: BlockHash,
}

/// Engine hash → router hash and parent link, for one worker: see the module docs.
#[derive(Debug, Default)]
pub(super) struct EngineBlocks {
    /// Records by slot; the slots in `free` hold stale records.
    slots: Chunks<Record>,
    /// Freed slots, the last freed reused first.
    free: Vec<u32>,
    /// Slot numbers of the live records, found by engine hash.
    index: HashTable<u32>,
    /// A bit per slot: the live record there follows its parent in the slot before.
    parent_before: Vec<u64>,
    /// A bit per slot: the live record there follows its parent in the slot after.
    parent_after: Vec<u64>,
    /// The parent links of live records that do not follow: slot → the parent's engine
    /// hash, or the record's own engine hash for a block at the root (a block cannot be
    /// stored under itself: its parent must be known first).
    links: FoldMap<u32, u64>,
}

/// Index capacity above which touching the index before inserts pays: 2^15 slots take
/// 160 KiB, about what a core's L2 cache keeps beside the rest of a store's working set.
const TOUCH_FROM: usize = 1 << 15;

impl EngineBlocks {
    /// The most records one worker can hold (slot numbers are `u32`); callers check it
    /// before inserting.
    pub(super) const MAX_LEN: usize = u32::MAX as usize;

    /// Live records.
    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    /// The slot of the live record of `engine`.
    fn slot(&self, engine: u64) -> Option<usize> {
        let slots = &self.slots;
        self.index
            .find(hash(engine), |&s| slots[s as usize].engine == engine)
            .map(|&s| s as usize)
    }

    /// The router hash of the block `engine`.
    pub(super) fn router(&self, engine: u64) -> Option<BlockHash> {
        self.slot(engine).map(|s| self.slots[s].router)
    }

    /// The router path from the root to `engine` (inclusive), through the parent links.
    /// `false` when an ancestor has no record (or the links loop: a hostile stream).
    pub(super) fn path_to(&self, engine: u64, out: &mut Vec<BlockHash>) -> bool {
        out.clear();
        let Some(mut s) = self.slot(engine) else {
            return false;
        };
        loop {
            let record = self.slots[s];
            out.push(record.router);
            if out.len() > self.len() {
                return false;
            }
            if let Some(parent) = self.neighbour_parent(s) {
                s = parent;
                continue;
            }
            let parent = self.links.get(&(s as u32)).copied();
            match parent {
                Some(p) if p == record.engine => break,
                Some(p) => match self.slot(p) {
                    Some(next) => s = next,
                    None => return false,
                },
                // Not reached: a live record that does not follow has a link.
                None => return false,
            }
        }
        out.reverse();
        true
    }

    /// Records the blocks of one store (engine hashes with their router hashes, each the
    /// parent of the next, the first one's parent `parent`): new ones, and blocks already
    /// recorded (a prefix hit reported again, a copy at another tier) counted as
    /// duplicates, their links unchanged.
    pub(super) fn insert_run(
        &mut self,
        parent: Option<u64>,
        blocks: &[u64],
        routers: &[BlockHash],
        outcome: &mut SyncOutcome,
    ) {
        if self.index.capacity() > TOUCH_FROM {
            // Reading the index where each block goes lets the CPU overlap their cache
            // misses, which the inserts, one after another, do not.
            for &engine in blocks {
                core::hint::black_box(self.index.find(hash(engine), |_| false));
            }
        }
        // The parent's slot, so that a store continuing next to it follows it.
        let mut prev = parent.map(|engine| (engine, self.slot(engine)));
        for (&engine, &router) in blocks.iter().zip(routers) {
            let (slot, added) = self.insert(Record { engine, router }, prev);
            if added {
                outcome.stored_blocks += 1;
            } else {
                outcome.duplicate_blocks += 1;
            }
            prev = Some((engine, Some(slot)));
        }
    }

    /// Adds `record` unless a record of its engine hash exists, linked to `prev` (the
    /// parent's engine hash, with its slot when known). Returns the record's slot and
    /// whether it was added.
    #[inline]
    fn insert(&mut self, record: Record, prev: Option<(u64, Option<usize>)>) -> (usize, bool) {
        let slots = &self.slots;
        let entry = self.index.entry(
            hash(record.engine),
            |&s| slots[s as usize].engine == record.engine,
            |&s| hash(slots[s as usize].engine),
        );
        let vacant = match entry {
            hashbrown::hash_table::Entry::Occupied(o) => return (*o.get() as usize, false),
            hashbrown::hash_table::Entry::Vacant(vacant) => vacant,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = record;
                slot
            }
            None => {
                let s = self.slots.len();
                self.slots.push(record);
                // The bit sets have a word for every 64 slots made.
                if s % 64 == 0 {
                    self.parent_before.push(0);
                    self.parent_after.push(0);
                }
                // New slots are made only when none is free, so this slot number is the
                // count of live records before the insert, below `MAX_LEN`.
                u32::try_from(s).unwrap_or(u32::MAX)
            }
        };
        vacant.insert(slot);
        let s = slot as usize;
        match prev {
            Some((_, Some(p))) if p + 1 == s => set_bit(&mut self.parent_before, s, true),
            Some((_, Some(p))) if p == s + 1 => set_bit(&mut self.parent_after, s, true),
            // A block named as its own parent is at the root, as the link's convention has it.
            Some((parent, _)) => {
                self.links.insert(slot, parent);
            }
            None => {
                self.links.insert(slot, record.engine);
            }
        }
        (s, true)
    }

    /// Removes the record of `engine`; its router hash.
    pub(super) fn remove(&mut self, engine: u64) -> Option<BlockHash> {
        let slots = &self.slots;
        let entry = self
            .index
            .find_entry(hash(engine), |&s| slots[s as usize].engine == engine)
            .ok()?;
        let (slot, _) = entry.remove();
        self.free_slot(slot);
        Some(self.slots[slot as usize].router)
    }

    /// The slot of the parent of live record `s` when `s` follows it.
    #[inline]
    fn neighbour_parent(&self, s: usize) -> Option<usize> {
        if bit(&self.parent_before, s) {
            Some(s - 1)
        } else if bit(&self.parent_after, s) {
            Some(s + 1)
        } else {
            None
        }
    }

    /// Frees `slot`, whose record has left the index: its link goes, and a record that
    /// follows it gets the slot's engine hash as an entry.
    fn free_slot(&mut self, slot: u32) {
        let s = slot as usize;
        let (word, mask) = (s / 64, 1u64 << (s % 64));
        let (before, after) = (&mut self.parent_before[word], &mut self.parent_after[word]);
        if (*before | *after) & mask != 0 {
            *before &= !mask;
            *after &= !mask;
        } else {
            self.links.remove(&slot);
        }
        if s + 1 < self.slots.len() && bit(&self.parent_before, s + 1) {
            set_bit(&mut self.parent_before, s + 1, false);
            self.links.insert(slot + 1, self.slots[s].engine);
        }
        if s > 0 && bit(&self.parent_after, s - 1) {
            set_bit(&mut self.parent_after, s - 1, false);
            self.links.insert(slot - 1, self.slots[s].engine);
        }
        self.free.push(slot);
    }

    /// Keeps only the records whose router hash `keep` accepts.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(BlockHash) -> bool) {
        let slots = &self.slots;
        let mut freed = Vec::new();
        self.index.retain(|&mut s| {
            let kept = keep(slots[s as usize].router);
            if !kept {
                freed.push(s);
            }
            kept
        });
        for slot in freed {
            self.free_slot(slot);
        }
    }

    /// Removes every record, keeping the allocations.
    pub(super) fn clear(&mut self) {
        self.slots.clear();
        self.free.clear();
        self.index.clear();
        self.parent_before.clear();
        self.parent_after.clear();
        self.links.clear();
    }

    /// Bytes allocated.
    pub(super) fn allocation_size(&self) -> usize {
        self.slots.allocation_size()
            + self.free.capacity() * core::mem::size_of::<u32>()
            + self.index.allocation_size()
            + (self.parent_before.capacity() + self.parent_after.capacity())
                * core::mem::size_of::<u64>()
            + self.links.allocation_size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Clone, Debug)]
    enum Op {
        /// A store: its parent and its blocks' engine hashes.
        Store(Option<u64>, Vec<u64>),
        Remove(u64),
        /// Keeps the records whose router hash is odd.
        RetainOdd,
        Clear,
    }

    fn op() -> impl Strategy<Value = Op> {
        // A small key space, so that stores meet existing keys and removes find them.
        let key = 0u64..48;
        prop_oneof![
            6 => (proptest::option::of(key.clone()), proptest::collection::vec(key.clone(), 1..8))
                .prop_map(|(p, b)| Op::Store(p, b)),
            6 => key.prop_map(Op::Remove),
            1 => Just(Op::RetainOdd),
            1 => Just(Op::Clear),
        ]
    }

    /// The router hash the tests give engine block `engine`.
    fn router(engine: u64) -> BlockHash {
        BlockHash::new(engine.wrapping_mul(0x9E37_79B9_7F4A_7C15) | u64::from(engine % 3 == 0))
    }

    /// The model: engine hash → (router hash, parent link).
    type Model = HashMap<u64, (BlockHash, Option<u64>)>;

    fn model_store(model: &mut Model, parent: Option<u64>, blocks: &[u64]) -> usize {
        let mut prev = parent;
        let mut added = 0;
        for &engine in blocks {
            if let std::collections::hash_map::Entry::Vacant(v) = model.entry(engine) {
                // A block named as its own parent is at the root.
                v.insert((router(engine), prev.filter(|&p| p != engine)));
                added += 1;
            }
            prev = Some(engine);
        }
        added
    }

    fn model_path(model: &Model, engine: u64) -> Option<Vec<BlockHash>> {
        let mut out = Vec::new();
        let mut next = Some(engine);
        while let Some(e) = next {
            let &(router, parent) = model.get(&e)?;
            out.push(router);
            if out.len() > model.len() {
                return None;
            }
            next = parent;
        }
        out.reverse();
        Some(out)
    }

    impl EngineBlocks {
        /// Checks the module's invariant: a live record follows its parent in the slot
        /// before, or in the slot after, or it has an entry, one of the three; a free
        /// slot has none.
        fn validate(&self) {
            let mut live = vec![true; self.slots.len()];
            for &s in &self.free {
                live[s as usize] = false;
            }
            assert_eq!(live.iter().filter(|&&l| l).count(), self.len());
            for (s, &l) in live.iter().enumerate() {
                let before = bit(&self.parent_before, s);
                let after = bit(&self.parent_after, s);
                let linked = self.links.contains_key(&(s as u32));
                let ways = usize::from(before) + usize::from(after) + usize::from(linked);
                assert_eq!(
                    ways,
                    usize::from(l),
                    "slot {s} (live {l}): {before} {after} {linked}"
                );
                assert!(!before || live[s - 1], "slot {s} follows a free slot");
                assert!(!after || live[s + 1], "slot {s} follows a free slot");
            }
        }
    }

    proptest! {
        /// Every operation answers as a `HashMap` of engine hash → (router hash, parent)
        /// does, and so does every path through the parent links.
        #[test]
        fn matches_a_hash_map(ops in proptest::collection::vec(op(), 0..300)) {
            let mut blocks = EngineBlocks::default();
            let mut model = Model::new();
            let mut path = Vec::new();
            for op in ops {
                match op {
                    Op::Store(parent, engines) => {
                        let routers: Vec<BlockHash> = engines.iter().map(|&e| router(e)).collect();
                        let mut outcome = SyncOutcome::default();
                        blocks.insert_run(parent, &engines, &routers, &mut outcome);
                        let added = model_store(&mut model, parent, &engines);
                        prop_assert_eq!(outcome.stored_blocks, added);
                        prop_assert_eq!(outcome.duplicate_blocks, engines.len() - added);
                    }
                    Op::Remove(k) => {
                        let expected = model.remove(&k).map(|(r, _)| r);
                        prop_assert_eq!(blocks.remove(k), expected);
                    }
                    Op::RetainOdd => {
                        blocks.retain(|r| r.get() % 2 == 1);
                        model.retain(|_, (r, _)| r.get() % 2 == 1);
                    }
                    Op::Clear => {
                        blocks.clear();
                        model.clear();
                    }
                }
                blocks.validate();
                prop_assert_eq!(blocks.len(), model.len());
                // Freed slots are reused: the arena never holds more than the most live.
                prop_assert!(blocks.slots.len() - blocks.free.len() == model.len());
                for k in 0..48 {
                    prop_assert_eq!(blocks.router(k), model.get(&k).map(|&(r, _)| r));
                    let found = blocks.path_to(k, &mut path);
                    let expected = model_path(&model, k);
                    prop_assert_eq!(found, expected.is_some(), "path to {}", k);
                    if let Some(expected) = expected {
                        prop_assert_eq!(&path, &expected);
                    }
                }
            }
        }
    }

    #[test]
    fn a_run_after_its_parent_costs_one_bit_a_block() {
        let mut blocks = EngineBlocks::default();
        let engines: Vec<u64> = (1..=100).collect();
        let routers: Vec<BlockHash> = engines.iter().map(|&e| router(e)).collect();
        let mut outcome = SyncOutcome::default();
        blocks.insert_run(None, &engines[..50], &routers[..50], &mut outcome);
        blocks.insert_run(Some(50), &engines[50..], &routers[50..], &mut outcome);
        // The block at the root keeps an entry; the rest follow, across stores.
        assert_eq!(blocks.links.len(), 1);
        let mut path = Vec::new();
        assert!(blocks.path_to(100, &mut path));
        assert_eq!(path, routers);
        // Evicting from the middle gives the next block an entry.
        assert_eq!(blocks.remove(30), Some(router(30)));
        assert_eq!(blocks.links.len(), 2);
        assert!(!blocks.path_to(100, &mut path));
        blocks.validate();
    }

    #[test]
    fn evictions_in_either_order_leave_slots_a_new_run_follows() {
        let engines: Vec<u64> = (1..=20).collect();
        let routers: Vec<BlockHash> = engines.iter().map(|&e| router(e)).collect();
        let next: Vec<u64> = (101..=120).collect();
        let next_routers: Vec<BlockHash> = next.iter().map(|&e| router(e)).collect();
        for last_first in [false, true] {
            let mut blocks = EngineBlocks::default();
            let mut outcome = SyncOutcome::default();
            blocks.insert_run(None, &engines, &routers, &mut outcome);
            let mut order = engines.clone();
            if last_first {
                order.reverse();
            }
            for e in order {
                blocks.remove(e);
            }
            blocks.insert_run(None, &next, &next_routers, &mut outcome);
            assert_eq!(blocks.links.len(), 1, "evicted last first: {last_first}");
            assert_eq!(blocks.slots.len(), 20);
            let mut path = Vec::new();
            assert!(blocks.path_to(120, &mut path));
            assert_eq!(path, next_routers);
            blocks.validate();
        }
    }

    #[test]
    fn a_block_named_as_its_own_parent_is_at_the_root() {
        let mut blocks = EngineBlocks::default();
        let mut outcome = SyncOutcome::default();
        blocks.insert_run(Some(7), &[7], &[router(7)], &mut outcome);
        let mut path = Vec::new();
        assert!(blocks.path_to(7, &mut path));
        assert_eq!(path, [router(7)]);
    }

    #[test]
    fn links_that_loop_end_the_path() {
        let mut blocks = EngineBlocks::default();
        let mut outcome = SyncOutcome::default();
        // 2's parent is 1 and 1's parent is 2: a hostile stream.
        blocks.insert_run(Some(1), &[2], &[router(2)], &mut outcome);
        blocks.insert_run(Some(2), &[1], &[router(1)], &mut outcome);
        assert!(!blocks.path_to(1, &mut Vec::new()));
    }
}
