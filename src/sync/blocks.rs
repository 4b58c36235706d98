//! A worker's engine blocks: records in arenas of `u32` slots, found by engine hash through
//! an index that holds only record ids.
//!
//! A hash map of engine hash → record keeps its records in its own slots, half of which are
//! empty after it grows, and a store touches a random one of them per block. Here the index
//! holds 4-byte ids (a table a fifth the size, which stays in cache far longer), and records
//! live in dense, chunked arenas ([`Chunks`]: little spare room, and growing one moves no
//! record twice) whose freed slots are reused last freed first: an engine that evicts a
//! finished request (last block first) and stores the next one writes records where the
//! evicted ones were, still in cache and in order.
//!
//! Glossary:
//! - a record's **parent link** is its parent's engine hash, as the store that reported the
//!   block named it (the previous block of the store, or the store's parent), or none for a
//!   block at the root;
//! - a **plain** record (16 bytes: engine and router hash) lives in the plain arena. It
//!   **follows** its parent when it was written in a slot next to the parent's, just after
//!   it or just before it (freed slots are reused in the reverse order of their freeing, so
//!   an engine's evictions in either order leave runs of slots): its link is that slot's
//!   engine hash and costs a bit. Any other plain record keeps its link in a side table;
//! - a **linked** record (24 bytes) lives in the linked arena and carries its link. A block
//!   that cannot follow its parent and ends its store is recorded so (a block stored alone,
//!   as engines store a running request's blocks while it decodes); one that cannot follow
//!   but has blocks after it in its store is a plain record with a side-table entry, which
//!   the rest of the store follows.
//!
//! Invariant: a live plain record follows its parent in the slot before, or in the slot
//! after, or it has an entry in the side table, one of the three; a free plain slot has
//! none. Before a plain slot is freed, a record that follows it gets the slot's engine hash
//! as an entry, so a link never names a slot's later occupant.

use hashbrown::HashTable;

use crate::bits::{bit, set_bit};
use crate::chunks::Chunks;
use crate::fold::{FoldMap, fold64 as hash};
use crate::hash::BlockHash;

use super::SyncOutcome;

/// One engine block a worker reported stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Record {
    /// The engine's hash of the block (the key).
    engine: u64,
    /// The router's chained hash of the same block.
    router: BlockHash,
}

/// A record that carries its parent link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LinkedRecord {
    record: Record,
    /// The parent's engine hash; the record's own for a block at the root (a block cannot
    /// be stored under itself: its parent must be known first).
    parent: u64,
}

/// The top bit of an [`Id`] of a linked record.
const LINKED: u32 = 1 << 31;

/// Where a live record is: a slot of the plain arena, or of the linked one (top bit set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Id(u32);

/// Which neighbouring plain slot a record's parent is in, when it follows it.
#[derive(Clone, Copy)]
enum Side {
    Before,
    After,
}

/// An [`Id`] taken apart.
enum Place {
    Plain(usize),
    Linked(usize),
}

impl Id {
    /// Slots are below `LINKED`: each arena holds at most [`EngineBlocks::MAX_LEN`].
    fn plain(slot: usize) -> Id {
        Id(u32::try_from(slot).map_or(LINKED - 1, |s| s & (LINKED - 1)))
    }

    fn linked(slot: usize) -> Id {
        Id(Id::plain(slot).0 | LINKED)
    }

    fn place(self) -> Place {
        let slot = (self.0 & (LINKED - 1)) as usize;
        if self.0 & LINKED == 0 {
            Place::Plain(slot)
        } else {
            Place::Linked(slot)
        }
    }
}

/// The two arenas, read apart from the index that names their slots.
#[derive(Debug, Default)]
struct Arenas {
    /// Plain records by slot; the slots in `plain_free` hold stale records.
    plain: Chunks<Record>,
    plain_free: Vec<u32>,
    /// Linked records by slot; the slots in `linked_free` hold stale records.
    linked: Chunks<LinkedRecord>,
    linked_free: Vec<u32>,
}

impl Arenas {
    #[inline]
    fn record(&self, id: Id) -> Record {
        match id.place() {
            Place::Plain(s) => self.plain[s],
            Place::Linked(s) => self.linked[s].record,
        }
    }

    /// The plain slot the next plain record takes.
    #[inline]
    fn next_plain(&self) -> usize {
        self.plain_free
            .last()
            .map_or(self.plain.len(), |&s| s as usize)
    }

    /// Writes `record` at [`Self::next_plain`]; whether the slot is new.
    #[inline]
    fn put_plain(&mut self, record: Record) -> (usize, bool) {
        match self.plain_free.pop() {
            Some(s) => {
                self.plain[s as usize] = record;
                (s as usize, false)
            }
            None => {
                self.plain.push(record);
                (self.plain.len() - 1, true)
            }
        }
    }

    fn put_linked(&mut self, record: LinkedRecord) -> usize {
        match self.linked_free.pop() {
            Some(s) => {
                self.linked[s as usize] = record;
                s as usize
            }
            None => {
                self.linked.push(record);
                self.linked.len() - 1
            }
        }
    }
}

/// Engine hash → router hash and parent link, for one worker: see the module docs.
#[derive(Debug, Default)]
pub(super) struct EngineBlocks {
    arenas: Arenas,
    /// Ids of the live records, found by engine hash.
    index: HashTable<u32>,
    /// A bit per plain slot: the live record there follows its parent in the slot before.
    parent_before: Vec<u64>,
    /// A bit per plain slot: the live record there follows its parent in the slot after.
    parent_after: Vec<u64>,
    /// The parent links of live plain records that do not follow: slot → the parent's
    /// engine hash, or the record's own engine hash for a block at the root.
    links: FoldMap<u32, u64>,
}

/// Index capacity above which touching the index before inserts pays: 2^15 slots take
/// 160 KiB, about what a core's L2 cache keeps beside the rest of a store's working set.
const TOUCH_FROM: usize = 1 << 15;

impl EngineBlocks {
    /// The most records one worker can hold (ids keep a bit for the arena); callers check
    /// it before inserting.
    pub(super) const MAX_LEN: usize = (LINKED - 1) as usize;

    /// Live records.
    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    /// The id of the live record of `engine`.
    fn find(&self, engine: u64) -> Option<Id> {
        let arenas = &self.arenas;
        self.index
            .find(hash(engine), |&i| arenas.record(Id(i)).engine == engine)
            .map(|&i| Id(i))
    }

    /// The router hash of the block `engine`.
    pub(super) fn router(&self, engine: u64) -> Option<BlockHash> {
        self.find(engine).map(|id| self.arenas.record(id).router)
    }

    /// The router hash of block `engine` and the engine hash of its parent (through its
    /// record's parent link; `None` at the root), when it has a record.
    pub(super) fn link(&self, engine: u64) -> Option<(BlockHash, Option<u64>)> {
        let id = self.find(engine)?;
        let parent = match id.place() {
            Place::Plain(s) => match self.neighbour_parent(s) {
                Some(p) => self.arenas.plain[p].engine,
                None => *self.links.get(&(s as u32))?,
            },
            Place::Linked(s) => self.arenas.linked[s].parent,
        };
        let router = self.arenas.record(id).router;
        Some((router, (parent != engine).then_some(parent)))
    }

    /// The router path from the root to `engine` (inclusive), through the parent links.
    /// `false` when an ancestor has no record (or the links loop: a hostile stream).
    pub(super) fn path_to(&self, engine: u64, out: &mut Vec<BlockHash>) -> bool {
        out.clear();
        let Some(mut id) = self.find(engine) else {
            return false;
        };
        loop {
            let record = self.arenas.record(id);
            out.push(record.router);
            if out.len() > self.len() {
                return false;
            }
            let parent = match id.place() {
                Place::Plain(s) => {
                    if let Some(p) = self.neighbour_parent(s) {
                        id = Id::plain(p);
                        continue;
                    }
                    match self.links.get(&(s as u32)) {
                        Some(&p) => p,
                        // Not reached: a live plain record that does not follow has a link.
                        None => return false,
                    }
                }
                Place::Linked(s) => self.arenas.linked[s].parent,
            };
            if parent == record.engine {
                break;
            }
            match self.find(parent) {
                Some(next) => id = next,
                None => return false,
            }
        }
        out.reverse();
        true
    }

    /// Records the blocks of one store (engine hashes with their router hashes, each the
    /// parent of the next, the first one's parent `parent`): new ones, and blocks already
    /// recorded (a prefix hit reported again, a copy at another tier, a second copy)
    /// counted as duplicates, their links unchanged, and their indices in the run appended
    /// to `again`.
    pub(super) fn insert_run(
        &mut self,
        parent: Option<u64>,
        blocks: &[u64],
        routers: &[BlockHash],
        outcome: &mut SyncOutcome,
        again: &mut Vec<u32>,
    ) {
        if self.index.capacity() > TOUCH_FROM {
            // Reading the index where each block goes lets the CPU overlap their cache
            // misses, which the inserts, one after another, do not.
            for &engine in blocks {
                core::hint::black_box(self.index.find(hash(engine), |_| false));
            }
        }
        // The parent's id, so that a store continuing next to it follows it.
        let mut prev = parent.map(|engine| (engine, self.find(engine)));
        let last = blocks.len().min(routers.len()).saturating_sub(1);
        // Whether the previous block of the store was recorded already.
        let mut after_duplicate = false;
        for (k, (&engine, &router)) in blocks.iter().zip(routers).enumerate() {
            // A block after a duplicate (a prefix hit reported again) is usually recorded
            // next to it: found there, the index is not read.
            let found = match prev {
                Some((_, Some(parent))) if after_duplicate => self.follower(parent, engine),
                _ => None,
            };
            let (id, added) = match found {
                Some(id) => (id, false),
                None => self.insert(Record { engine, router }, prev, k == last),
            };
            after_duplicate = !added;
            if added {
                outcome.stored_blocks += 1;
            } else {
                outcome.duplicate_blocks += 1;
                again.push(k as u32);
            }
            prev = Some((engine, Some(id)));
        }
    }

    /// Adds `record` unless a record of its engine hash exists, linked to `prev` (the
    /// parent's engine hash, with its id when known); `ends_run` when no block of the
    /// store comes after it. Returns the record's id and whether it was added.
    #[inline(always)]
    fn insert(
        &mut self,
        record: Record,
        prev: Option<(u64, Option<Id>)>,
        ends_run: bool,
    ) -> (Id, bool) {
        let arenas = &self.arenas;
        let entry = self.index.entry(
            hash(record.engine),
            |&i| arenas.record(Id(i)).engine == record.engine,
            |&i| hash(arenas.record(Id(i)).engine),
        );
        let vacant = match entry {
            hashbrown::hash_table::Entry::Occupied(o) => return (Id(*o.get()), false),
            hashbrown::hash_table::Entry::Vacant(vacant) => vacant,
        };
        // Whether the record can follow its parent from the next plain slot.
        let next = arenas.next_plain();
        let neighbour = match prev {
            Some((_, Some(parent))) => match parent.place() {
                Place::Plain(p) if p + 1 == next => Some(Side::Before),
                Place::Plain(p) if p == next + 1 => Some(Side::After),
                _ => None,
            },
            _ => None,
        };
        let parent = prev.map_or(record.engine, |(p, _)| p);
        let id = match neighbour {
            None if ends_run => {
                let slot = self.arenas.put_linked(LinkedRecord { record, parent });
                Id::linked(slot)
            }
            neighbour => {
                let (slot, made) = self.arenas.put_plain(record);
                // The bit sets have a word for every 64 plain slots made.
                if made && slot % 64 == 0 {
                    self.parent_before.push(0);
                    self.parent_after.push(0);
                }
                match neighbour {
                    Some(Side::Before) => set_bit(&mut self.parent_before, slot, true),
                    Some(Side::After) => set_bit(&mut self.parent_after, slot, true),
                    // A block named as its own parent is at the root, as the link's
                    // convention has it.
                    None => {
                        self.links.insert(Id::plain(slot).0, parent);
                    }
                }
                Id::plain(slot)
            }
        };
        vacant.insert(id.0);
        (id, true)
    }

    /// Removes the record of `engine`; its router hash.
    pub(super) fn remove(&mut self, engine: u64) -> Option<BlockHash> {
        let arenas = &self.arenas;
        let entry = self
            .index
            .find_entry(hash(engine), |&i| arenas.record(Id(i)).engine == engine)
            .ok()?;
        let (id, _) = entry.remove();
        let router = self.arenas.record(Id(id)).router;
        self.free(Id(id));
        Some(router)
    }

    /// The live record of `engine` when it follows `parent` from a neighbouring slot (a
    /// live record's engine hash is unique, and a slot whose record follows is live).
    #[inline]
    fn follower(&self, parent: Id, engine: u64) -> Option<Id> {
        let Place::Plain(p) = parent.place() else {
            return None;
        };
        let after = p + 1;
        if after < self.arenas.plain.len()
            && self.arenas.plain[after].engine == engine
            && bit(&self.parent_before, after)
        {
            return Some(Id::plain(after));
        }
        let before = p.checked_sub(1)?;
        (self.arenas.plain[before].engine == engine && bit(&self.parent_after, before))
            .then(|| Id::plain(before))
    }

    /// The plain slot of the parent of live plain record `s` when `s` follows it.
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

    /// Frees the slot of `id`, whose record has left the index. A plain record's link goes,
    /// and a record that follows it gets the slot's engine hash as an entry.
    fn free(&mut self, id: Id) {
        let s = match id.place() {
            Place::Linked(_) => {
                self.arenas.linked_free.push(id.0 & (LINKED - 1));
                return;
            }
            Place::Plain(s) => s,
        };
        let slot = id.0;
        let (word, mask) = (s / 64, 1u64 << (s % 64));
        let (before, after) = (&mut self.parent_before[word], &mut self.parent_after[word]);
        if (*before | *after) & mask != 0 {
            *before &= !mask;
            *after &= !mask;
        } else {
            self.links.remove(&slot);
        }
        let engine = self.arenas.plain[s].engine;
        if s + 1 < self.arenas.plain.len() && bit(&self.parent_before, s + 1) {
            set_bit(&mut self.parent_before, s + 1, false);
            self.links.insert(slot + 1, engine);
        }
        if s > 0 && bit(&self.parent_after, s - 1) {
            set_bit(&mut self.parent_after, s - 1, false);
            self.links.insert(slot - 1, engine);
        }
        self.arenas.plain_free.push(slot);
    }

    /// Keeps only the records `keep` accepts, by engine and router hash.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(u64, BlockHash) -> bool) {
        let arenas = &self.arenas;
        let mut freed = Vec::new();
        self.index.retain(|&mut i| {
            let record = arenas.record(Id(i));
            let kept = keep(record.engine, record.router);
            if !kept {
                freed.push(Id(i));
            }
            kept
        });
        for id in freed {
            self.free(id);
        }
    }

    /// Removes every record, keeping the allocations.
    pub(super) fn clear(&mut self) {
        self.arenas.plain.clear();
        self.arenas.plain_free.clear();
        self.arenas.linked.clear();
        self.arenas.linked_free.clear();
        self.index.clear();
        self.parent_before.clear();
        self.parent_after.clear();
        self.links.clear();
    }

    /// Bytes allocated.
    pub(super) fn allocation_size(&self) -> usize {
        let a = &self.arenas;
        a.plain.allocation_size()
            + a.linked.allocation_size()
            + (a.plain_free.capacity() + a.linked_free.capacity()) * core::mem::size_of::<u32>()
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

    /// The router hashes the tests give `engines`.
    fn routers_of(engines: &[u64]) -> Vec<BlockHash> {
        engines.iter().map(|&e| router(e)).collect()
    }

    /// Asserts that the path through the links to `engine` is `expected`, and that the
    /// invariants hold.
    fn assert_path(blocks: &EngineBlocks, engine: u64, expected: &[BlockHash]) {
        let mut path = Vec::new();
        assert!(blocks.path_to(engine, &mut path), "no path to {engine}");
        assert_eq!(path, expected);
        blocks.validate();
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
        /// Checks the module's invariant: a live plain record follows its parent in the
        /// slot before, or in the slot after, or it has an entry, one of the three; a free
        /// plain slot has none. Every id in the index names a live slot.
        fn validate(&self) {
            let a = &self.arenas;
            let mut live = vec![true; a.plain.len()];
            for &s in &a.plain_free {
                live[s as usize] = false;
            }
            let mut linked_live = vec![true; a.linked.len()];
            for &s in &a.linked_free {
                linked_live[s as usize] = false;
            }
            let count = |v: &[bool]| v.iter().filter(|&&l| l).count();
            assert_eq!(count(&live) + count(&linked_live), self.len());
            for &i in &self.index {
                match Id(i).place() {
                    Place::Plain(s) => assert!(live[s], "index names free plain slot {s}"),
                    Place::Linked(s) => assert!(linked_live[s], "index names free slot {s}"),
                }
            }
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
                        let routers = routers_of(&engines);
                        let mut outcome = SyncOutcome::default();
                        blocks.insert_run(parent, &engines, &routers, &mut outcome, &mut Vec::new());
                        let added = model_store(&mut model, parent, &engines);
                        prop_assert_eq!(outcome.stored_blocks, added);
                        prop_assert_eq!(outcome.duplicate_blocks, engines.len() - added);
                    }
                    Op::Remove(k) => {
                        let expected = model.remove(&k).map(|(r, _)| r);
                        prop_assert_eq!(blocks.remove(k), expected);
                    }
                    Op::RetainOdd => {
                        blocks.retain(|_, r| r.get() % 2 == 1);
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
                let a = &blocks.arenas;
                let held = a.plain.len() - a.plain_free.len() + a.linked.len() - a.linked_free.len();
                prop_assert_eq!(held, model.len());
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
        let routers = routers_of(&engines);
        let mut outcome = SyncOutcome::default();
        blocks.insert_run(
            None,
            &engines[..50],
            &routers[..50],
            &mut outcome,
            &mut Vec::new(),
        );
        blocks.insert_run(
            Some(50),
            &engines[50..],
            &routers[50..],
            &mut outcome,
            &mut Vec::new(),
        );
        // The block at the root keeps an entry; the rest follow, across stores.
        assert_eq!(blocks.links.len(), 1);
        assert_path(&blocks, 100, &routers);
        // Evicting from the middle gives the next block an entry.
        assert_eq!(blocks.remove(30), Some(router(30)));
        assert_eq!(blocks.links.len(), 2);
        assert!(!blocks.path_to(100, &mut Vec::new()));
        blocks.validate();
    }

    #[test]
    fn a_run_reported_again_is_found_beside_its_records_never_in_a_free_slot() {
        let engines: Vec<u64> = (1..=10).collect();
        let routers = routers_of(&engines);
        let mut blocks = EngineBlocks::default();
        let mut outcome = SyncOutcome::default();
        blocks.insert_run(None, &engines, &routers, &mut outcome, &mut Vec::new());
        let mut again = SyncOutcome::default();
        blocks.insert_run(None, &engines, &routers, &mut again, &mut Vec::new());
        assert_eq!((again.stored_blocks, again.duplicate_blocks), (0, 10));
        assert_eq!(blocks.arenas.plain.len(), 10);
        // Block 5's slot is freed and keeps its stale record: the block is stored anew.
        assert_eq!(blocks.remove(5), Some(router(5)));
        let mut third = SyncOutcome::default();
        blocks.insert_run(None, &engines, &routers, &mut third, &mut Vec::new());
        assert_eq!((third.stored_blocks, third.duplicate_blocks), (1, 9));
        assert_eq!(blocks.len(), 10);
        assert_path(&blocks, 10, &routers);
    }

    #[test]
    fn evictions_in_either_order_leave_slots_a_new_run_follows() {
        let engines: Vec<u64> = (1..=20).collect();
        let routers = routers_of(&engines);
        let next: Vec<u64> = (101..=120).collect();
        let next_routers = routers_of(&next);
        for last_first in [false, true] {
            let mut blocks = EngineBlocks::default();
            let mut outcome = SyncOutcome::default();
            blocks.insert_run(None, &engines, &routers, &mut outcome, &mut Vec::new());
            let mut order = engines.clone();
            if last_first {
                order.reverse();
            }
            for e in order {
                blocks.remove(e);
            }
            blocks.insert_run(None, &next, &next_routers, &mut outcome, &mut Vec::new());
            assert_eq!(blocks.links.len(), 1, "evicted last first: {last_first}");
            assert_eq!(blocks.arenas.plain.len(), 20);
            assert_path(&blocks, 120, &next_routers);
        }
    }

    #[test]
    fn blocks_stored_alone_carry_their_links() {
        // Two requests prefill eight blocks each, then decode, storing a block at a time in
        // turns: each decoded block's parent is the other request's neighbour, never its own.
        let mut blocks = EngineBlocks::default();
        let mut outcome = SyncOutcome::default();
        let mut tips = [0u64; 2];
        for (r, tip) in tips.iter_mut().enumerate() {
            let engines: Vec<u64> = (0..8).map(|k| 100 * (r as u64 + 1) + k).collect();
            let routers = routers_of(&engines);
            blocks.insert_run(None, &engines, &routers, &mut outcome, &mut Vec::new());
            *tip = engines[7];
        }
        for step in 0..10u64 {
            for (r, tip) in tips.iter_mut().enumerate() {
                let engine = 1_000 * (r as u64 + 1) + step;
                blocks.insert_run(
                    Some(*tip),
                    &[engine],
                    &[router(engine)],
                    &mut outcome,
                    &mut Vec::new(),
                );
                *tip = engine;
            }
        }
        blocks.validate();
        // The prefills are plain runs with an entry each at the root. The first request's
        // decoded blocks are linked records; the second's take the plain slots after its
        // prefill, free since the first's went elsewhere, and follow. No entry was made for
        // either.
        assert_eq!(blocks.links.len(), 2);
        assert_eq!(blocks.arenas.linked.len(), 10);
        assert_eq!(blocks.arenas.plain.len(), 26);
        let expected: Vec<BlockHash> = (200..208)
            .chain((0..10).map(|s| 2_000 + s))
            .map(router)
            .collect();
        assert_path(&blocks, tips[1], &expected);
    }

    #[test]
    fn a_block_named_as_its_own_parent_is_at_the_root() {
        let mut blocks = EngineBlocks::default();
        let mut outcome = SyncOutcome::default();
        blocks.insert_run(Some(7), &[7], &[router(7)], &mut outcome, &mut Vec::new());
        assert_path(&blocks, 7, &[router(7)]);
    }

    #[test]
    fn links_that_loop_end_the_path() {
        let mut blocks = EngineBlocks::default();
        let mut outcome = SyncOutcome::default();
        // 2's parent is 1 and 1's parent is 2: a hostile stream.
        blocks.insert_run(Some(1), &[2], &[router(2)], &mut outcome, &mut Vec::new());
        blocks.insert_run(Some(2), &[1], &[router(1)], &mut outcome, &mut Vec::new());
        assert!(!blocks.path_to(1, &mut Vec::new()));
    }
}
