//! A worker's engine blocks: records in an arena of `u32` slots, found by engine hash
//! through an index that holds only the slot numbers.
//!
//! A hash map of engine hash → record keeps its 24-byte records in its own slots, half of
//! which are empty after it grows, and a store touches a random one of them per block. Here
//! the index holds 4-byte slot numbers (a table a fifth the size, which stays in cache far
//! longer), and records live in a dense, chunked arena ([`Chunks`]: little spare room, and
//! growing it moves no record twice) whose freed slots are reused last freed first: an
//! engine that evicts a finished request and stores the next one writes records where the
//! evicted ones were, still in cache.

use hashbrown::HashTable;

use crate::BlockHash;
use crate::chunks::Chunks;
use crate::fold::fold64 as hash;

/// One engine block a worker reported stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct EngineBlock {
    /// The engine's hash of the block (the key).
    pub(super) engine: u64,
    /// The router's chained hash of the same block.
    pub(super) router: BlockHash,
    /// The engine hash of its parent; the block's own engine hash when it is at the root
    /// (a block cannot be stored under itself: its parent must be known first).
    pub(super) parent: u64,
}

impl EngineBlock {
    pub(super) fn parent(&self) -> Option<u64> {
        (self.parent != self.engine).then_some(self.parent)
    }
}

/// Engine hash → [`EngineBlock`], for one worker.
#[derive(Debug, Default)]
pub(super) struct EngineBlocks {
    /// Records by slot; the slots in `free` hold stale records.
    slots: Chunks<EngineBlock>,
    /// Freed slots, the last freed reused first.
    free: Vec<u32>,
    /// Slot numbers of the live records, found by engine hash.
    index: HashTable<u32>,
}

/// Index capacity above which [`EngineBlocks::touch`] pays: 2^15 slots take 160 KiB, about
/// what a core's L2 cache keeps beside the rest of a store's working set.
const TOUCH_FROM: usize = 1 << 15;

impl EngineBlocks {
    /// The most records one worker can hold (slot numbers are `u32`); callers check it
    /// before inserting.
    pub(super) const MAX_LEN: usize = u32::MAX as usize;

    /// Live records.
    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    /// The record of `engine`.
    pub(super) fn get(&self, engine: u64) -> Option<&EngineBlock> {
        let slots = &self.slots;
        self.index
            .find(hash(engine), |&s| slots[s as usize].engine == engine)
            .map(|&s| &slots[s as usize])
    }

    /// Whether [`Self::touch`] pays: its index is too large to stay in cache (a small one
    /// costs no misses to overlap, only the probes).
    pub(super) fn touch_pays(&self) -> bool {
        self.index.capacity() > TOUCH_FROM
    }

    /// Reads the index where `engine` would go, so that a following insert finds it in
    /// cache: touching every block of an event first lets the CPU overlap their cache
    /// misses, which the inserts, one after another, do not.
    pub(super) fn touch(&self, engine: u64) {
        core::hint::black_box(self.index.find(hash(engine), |_| false));
    }

    /// Adds `block` unless a record of its engine hash exists; whether it was added.
    #[inline]
    pub(super) fn insert(&mut self, block: EngineBlock) -> bool {
        let slots = &self.slots;
        let entry = self.index.entry(
            hash(block.engine),
            |&s| slots[s as usize].engine == block.engine,
            |&s| hash(slots[s as usize].engine),
        );
        let hashbrown::hash_table::Entry::Vacant(vacant) = entry else {
            return false;
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = block;
                slot
            }
            None => {
                self.slots.push(block);
                // New slots are made only when none is free, so this slot number is the
                // count of live records before the insert, below `MAX_LEN`.
                u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
            }
        };
        vacant.insert(slot);
        true
    }

    /// Removes and returns the record of `engine`.
    pub(super) fn remove(&mut self, engine: u64) -> Option<EngineBlock> {
        let slots = &self.slots;
        let entry = self
            .index
            .find_entry(hash(engine), |&s| slots[s as usize].engine == engine)
            .ok()?;
        let (slot, _) = entry.remove();
        self.free.push(slot);
        Some(self.slots[slot as usize])
    }

    /// Keeps only the records for which `keep` is true.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&EngineBlock) -> bool) {
        let slots = &self.slots;
        let mut freed = Vec::new();
        self.index.retain(|&mut s| {
            let kept = keep(&slots[s as usize]);
            if !kept {
                freed.push(s);
            }
            kept
        });
        self.free.extend(freed);
    }

    /// Removes every record, keeping the allocations.
    pub(super) fn clear(&mut self) {
        self.slots.clear();
        self.free.clear();
        self.index.clear();
    }

    /// Bytes allocated.
    pub(super) fn allocation_size(&self) -> usize {
        self.slots.allocation_size()
            + self.free.capacity() * core::mem::size_of::<u32>()
            + self.index.allocation_size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64, u64),
        Remove(u64),
        Get(u64),
        Clear,
    }

    fn op() -> impl Strategy<Value = Op> {
        // A small key space, so that inserts meet existing keys and removes find them.
        prop_oneof![
            6 => (0u64..48, any::<u64>()).prop_map(|(k, r)| Op::Insert(k, r)),
            4 => (0u64..48).prop_map(Op::Remove),
            3 => (0u64..48).prop_map(Op::Get),
            1 => Just(Op::Clear),
        ]
    }

    fn block(engine: u64, router: u64) -> EngineBlock {
        EngineBlock {
            engine,
            router: BlockHash::new(router),
            parent: engine ^ 1,
        }
    }

    proptest! {
        /// Every operation answers as a `HashMap` of engine hash → block does.
        #[test]
        fn matches_a_hash_map(ops in proptest::collection::vec(op(), 0..300)) {
            let mut blocks = EngineBlocks::default();
            let mut model: HashMap<u64, EngineBlock> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, r) => {
                        let added = !model.contains_key(&k);
                        if added {
                            model.insert(k, block(k, r));
                        }
                        prop_assert_eq!(blocks.insert(block(k, r)), added);
                    }
                    Op::Remove(k) => prop_assert_eq!(blocks.remove(k), model.remove(&k)),
                    Op::Get(k) => prop_assert_eq!(blocks.get(k), model.get(&k)),
                    Op::Clear => {
                        blocks.clear();
                        model.clear();
                    }
                }
                prop_assert_eq!(blocks.len(), model.len());
                // Freed slots are reused: the arena never holds more than the most live.
                prop_assert!(blocks.slots.len() - blocks.free.len() == model.len());
            }
            for (k, b) in &model {
                prop_assert_eq!(blocks.get(*k), Some(b));
            }
        }
    }

    #[test]
    fn a_block_at_the_root_has_no_parent() {
        let root = EngineBlock {
            engine: 7,
            router: BlockHash::new(1),
            parent: 7,
        };
        assert_eq!(root.parent(), None);
        assert_eq!(block(7, 1).parent(), Some(6));
    }
}
