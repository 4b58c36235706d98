//! A modelled worker's KV block pool, kept as vLLM's v1 `BlockPool` keeps it.
//!
//! Glossary:
//! - a **block** holds the KV of `block_size` tokens; the pool has a fixed number of them;
//! - a block's **references** are the running requests using it; a block with none is
//!   **free** and sits in the **free queue**, least recently freed first;
//! - a **cached** block is a full block with the hash of its prefix, findable by that hash
//!   by a later request (a prefix hit), whether it is in use or free.
//!
//! Facts of vLLM followed here: allocation takes blocks from the head of the free queue,
//! and a cached block taken there is evicted (its hash forgotten, a removal reported); a
//! prefix hit takes the cached blocks of the prompt's longest cached prefix, pulling free
//! ones out of the queue; a finished or preempted request frees its blocks last block
//! first, so that a prompt's tail is evicted before its head; a block is cached when it is
//! full, without checking whether another block holds the same hash (both stay cached, the
//! first one cached is the one a hit takes, and each one's eviction is reported).
//!
//! Invariants (checked by `BlockPool::validate`): a block is in the free queue exactly
//! when it has no references; the hash index names every block with a hash, and only those.

use crate::fold::FoldMap;
use crate::hash::{BlockHash, TokenId};
use crate::list::{self, List, Slot};
use hashbrown::hash_map::Entry;

/// A block of the pool: a typed index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct BlockId(u32);

impl Slot for BlockId {
    const NONE: BlockId = BlockId(u32::MAX);
    #[inline]
    fn index(self) -> usize {
        self.0 as usize
    }
}

#[derive(Clone, Debug)]
struct Block {
    hash: Option<BlockHash>,
    refs: u32,
    prev: BlockId,
    next: BlockId,
    /// The next block cached under the same hash, in the order they were cached.
    dup: BlockId,
}

list::linked!(Block, BlockId, prev, next);

/// What the pool reports as it changes, in order, for event sync: blocks cached and
/// blocks evicted, by hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PoolChange {
    /// A full block was cached under `hash`, after `parent` (the hash before it in its
    /// request, `None` at the start); its tokens are `tokens` of the [`PoolLog`]'s.
    Cached {
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: std::ops::Range<usize>,
    },
    /// A cached block of this hash was evicted (another copy may still be cached).
    Evicted(BlockHash),
}

/// The pool's changes since the last drain, in order, and the tokens of the blocks cached
/// among them, one block after another in the order cached (so a run of blocks cached one
/// after another has its tokens in one piece).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PoolLog {
    pub(crate) changes: Vec<PoolChange>,
    pub(crate) tokens: Vec<TokenId>,
}

/// A fixed pool of KV blocks: see the module docs.
#[derive(Clone, Debug)]
pub(crate) struct BlockPool {
    blocks: Vec<Block>,
    free: List<BlockId>,
    free_len: usize,
    /// Hash → the first block cached under it (the others follow through `dup`).
    cached: FoldMap<BlockHash, BlockId>,
    /// Changes since the last [`BlockPool::drain_changes`], when recorded.
    changes: Option<PoolLog>,
}

impl BlockPool {
    /// A pool of `blocks` free blocks (at most `u32::MAX - 1`), recording its changes when
    /// `record` is true.
    pub(crate) fn new(blocks: usize, record: bool) -> Self {
        let n = blocks.min(u32::MAX as usize - 1);
        let mut pool = Self {
            blocks: (0..n)
                .map(|_| Block {
                    hash: None,
                    refs: 0,
                    prev: BlockId::NONE,
                    next: BlockId::NONE,
                    dup: BlockId::NONE,
                })
                .collect(),
            free: List::EMPTY,
            free_len: 0,
            cached: FoldMap::default(),
            changes: record.then(PoolLog::default),
        };
        for i in 0..n {
            pool.push_free(BlockId(i as u32));
        }
        pool
    }

    /// Whether the pool records its changes (and wants the tokens of blocks it caches).
    pub(crate) fn records(&self) -> bool {
        self.changes.is_some()
    }

    /// Blocks in the pool.
    pub(crate) fn capacity(&self) -> usize {
        self.blocks.len()
    }

    /// Free blocks (cached or not): what an allocation can take.
    pub(crate) fn free_blocks(&self) -> usize {
        self.free_len
    }

    /// How many leading `hashes` are cached: the prefix a request would hit.
    pub(crate) fn cached_prefix(&self, hashes: &[BlockHash]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.cached.contains_key(*h))
            .count()
    }

    /// The blocks a request of `hashes` would hit, written into `out` (cleared first): for
    /// each hash of the longest cached prefix, the first block cached under it (one index
    /// lookup per block, for [`free_among`](Self::free_among) and [`take`](Self::take)).
    pub(crate) fn hit_blocks(&self, hashes: &[BlockHash], out: &mut Vec<BlockId>) {
        out.clear();
        out.extend(hashes.iter().map_while(|h| self.cached.get(h).copied()));
    }

    /// How many of the cached blocks `ids` are free: those a hit takes out of the queue.
    pub(crate) fn free_among(&self, ids: &[BlockId]) -> usize {
        ids.iter()
            .filter(|id| self.blocks[id.index()].refs == 0)
            .count()
    }

    /// Whether a block is cached under `hash`.
    #[cfg(test)]
    pub(crate) fn is_cached(&self, hash: BlockHash) -> bool {
        self.cached.contains_key(&hash)
    }

    /// Takes the cached blocks `ids` (from [`hit_blocks`](Self::hit_blocks), the pool
    /// unchanged since) for a request, appending them to `out`: each gains a reference, and
    /// a free one leaves the queue.
    pub(crate) fn take(&mut self, ids: &[BlockId], out: &mut Vec<BlockId>) {
        for &id in ids {
            if self.blocks[id.index()].refs == 0 {
                list::unlink(&mut self.blocks, &mut self.free, id);
                self.free_len -= 1;
            }
            self.blocks[id.index()].refs += 1;
            out.push(id);
        }
    }

    /// Takes `n` blocks from the head of the free queue for a request, appending them to
    /// `out` (each with one reference, cached ones evicted first); `false`, taking nothing,
    /// when fewer than `n` are free.
    pub(crate) fn allocate(&mut self, n: usize, out: &mut Vec<BlockId>) -> bool {
        if n > self.free_len {
            return false;
        }
        for _ in 0..n {
            let id = self.free.head;
            list::unlink(&mut self.blocks, &mut self.free, id);
            self.free_len -= 1;
            self.evict(id);
            self.blocks[id.index()].refs = 1;
            out.push(id);
        }
        true
    }

    /// Caches the full block `id` of `tokens` under `hash`, after the block hashed `parent`.
    pub(crate) fn cache(
        &mut self,
        id: BlockId,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: &[TokenId],
    ) {
        let block = &mut self.blocks[id.index()];
        if block.hash.is_some() {
            return;
        }
        block.hash = Some(hash);
        let first = match self.cached.entry(hash) {
            Entry::Vacant(vacant) => {
                vacant.insert(id);
                None
            }
            Entry::Occupied(occupied) => Some(*occupied.get()),
        };
        if let Some(first) = first {
            let mut last = first;
            while self.blocks[last.index()].dup != BlockId::NONE {
                last = self.blocks[last.index()].dup;
            }
            self.blocks[last.index()].dup = id;
        }
        if let Some(log) = &mut self.changes {
            let start = log.tokens.len();
            log.tokens.extend_from_slice(tokens);
            log.changes.push(PoolChange::Cached {
                hash,
                parent,
                tokens: start..log.tokens.len(),
            });
        }
    }

    /// Releases a request's blocks, given in the order they should be evicted (the first
    /// freed is evicted first): each loses a reference, and one left with none joins the
    /// free queue's tail.
    pub(crate) fn free(&mut self, ids: impl IntoIterator<Item = BlockId>) {
        for id in ids {
            let block = &mut self.blocks[id.index()];
            block.refs = block.refs.saturating_sub(1);
            if block.refs == 0 {
                self.push_free(id);
            }
        }
    }

    /// The changes recorded since the last call, in order.
    pub(crate) fn drain_changes(&mut self) -> PoolLog {
        self.changes
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    fn push_free(&mut self, id: BlockId) {
        list::link_before(&mut self.blocks, &mut self.free, id, BlockId::NONE);
        self.free_len += 1;
    }

    /// Forgets the hash of `id`, if cached.
    fn evict(&mut self, id: BlockId) {
        let Some(hash) = self.blocks[id.index()].hash.take() else {
            return;
        };
        let next = std::mem::replace(&mut self.blocks[id.index()].dup, BlockId::NONE);
        let Entry::Occupied(mut entry) = self.cached.entry(hash) else {
            return;
        };
        let first = *entry.get();
        if first != id {
            // A later copy: unlink it from the chain.
            let mut at = first;
            while self.blocks[at.index()].dup != id && self.blocks[at.index()].dup != BlockId::NONE
            {
                at = self.blocks[at.index()].dup;
            }
            if self.blocks[at.index()].dup == id {
                self.blocks[at.index()].dup = next;
            }
        } else if next != BlockId::NONE {
            entry.insert(next);
        } else {
            entry.remove();
        }
        // vLLM reports every cached block it evicts, a copy of a hash still cached too.
        if let Some(log) = &mut self.changes {
            log.changes.push(PoolChange::Evicted(hash));
        }
    }

    /// Checks the invariants of the module docs.
    ///
    /// # Errors
    ///
    /// A description of the first violation.
    #[cfg(test)]
    pub(crate) fn validate(&self) -> Result<(), String> {
        let queued = list::check(
            &self.blocks,
            &self.free,
            |id| id.index() < self.blocks.len() && self.blocks[id.index()].refs == 0,
            |_| 0,
        )?;
        let unreferenced = self.blocks.iter().filter(|b| b.refs == 0).count();
        if queued != unreferenced || queued != self.free_len {
            return Err(format!(
                "{queued} queued, {unreferenced} without references, {} counted free",
                self.free_len
            ));
        }
        let hashed = self.blocks.iter().filter(|b| b.hash.is_some()).count();
        let mut indexed = 0;
        for (hash, &first) in &self.cached {
            let mut at = first;
            while at != BlockId::NONE {
                if self.blocks[at.index()].hash != Some(*hash) || indexed > hashed {
                    return Err(format!(
                        "index entry {hash:?} names a block not of that hash"
                    ));
                }
                indexed += 1;
                at = self.blocks[at.index()].dup;
            }
        }
        if hashed != indexed {
            return Err(format!("{hashed} blocks hashed, {indexed} indexed"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    /// The naive pool: a queue of free block numbers and a list of (hash, block) in the
    /// order they were cached.
    #[derive(Default)]
    struct Model {
        refs: Vec<u32>,
        hash: Vec<Option<u64>>,
        free: VecDeque<u32>,
        cached: Vec<(u64, u32)>,
    }

    impl Model {
        fn new(n: u32) -> Self {
            Self {
                refs: vec![0; n as usize],
                hash: vec![None; n as usize],
                free: (0..n).collect(),
                cached: Vec::new(),
            }
        }
        fn first_cached(&self, h: u64) -> Option<u32> {
            self.cached.iter().find(|(x, _)| *x == h).map(|(_, b)| *b)
        }
        fn prefix(&self, hashes: &[u64]) -> usize {
            hashes
                .iter()
                .take_while(|h| self.first_cached(**h).is_some())
                .count()
        }
        fn take(&mut self, hashes: &[u64], out: &mut Vec<u32>) {
            for &h in hashes {
                let b = self.first_cached(h).unwrap();
                if self.refs[b as usize] == 0 {
                    self.free.retain(|&f| f != b);
                }
                self.refs[b as usize] += 1;
                out.push(b);
            }
        }
        fn allocate(&mut self, n: usize, out: &mut Vec<u32>) -> bool {
            if n > self.free.len() {
                return false;
            }
            for _ in 0..n {
                let b = self.free.pop_front().unwrap();
                if self.hash[b as usize].take().is_some() {
                    self.cached.retain(|&(_, x)| x != b);
                }
                self.refs[b as usize] = 1;
                out.push(b);
            }
            true
        }
        fn cache(&mut self, b: u32, h: u64) {
            if self.hash[b as usize].is_none() {
                self.hash[b as usize] = Some(h);
                self.cached.push((h, b));
            }
        }
        fn free(&mut self, ids: &[u32]) {
            for &b in ids {
                self.refs[b as usize] -= 1;
                if self.refs[b as usize] == 0 {
                    self.free.push_back(b);
                }
            }
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// A request of these prompt hashes: a prefix hit, then new blocks for the rest.
        Admit(Vec<u64>),
        /// Request `i` (of those running) finishes or is preempted.
        Finish(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => proptest::collection::vec(0u64..6, 1..5).prop_map(Op::Admit),
            2 => any::<usize>().prop_map(Op::Finish),
        ]
    }

    proptest! {
        /// Admissions and releases answer as the naive model does: the same prefix hits,
        /// the same blocks taken, allocation failing at the same point.
        #[test]
        fn matches_a_naive_model(ops in proptest::collection::vec(op(), 0..60), n in 1u32..10) {
            let mut pool = BlockPool::new(n as usize, false);
            let mut model = Model::new(n);
            let mut running: Vec<Vec<u32>> = Vec::new();
            for op in ops {
                match op {
                    Op::Admit(prompt) => {
                        let hashes: Vec<BlockHash> = prompt.iter().map(|&x| h(x)).collect();
                        let hit = pool.cached_prefix(&hashes);
                        prop_assert_eq!(hit, model.prefix(&prompt));
                        let (mut ids, mut got, mut want) = (Vec::new(), Vec::new(), Vec::new());
                        pool.hit_blocks(&hashes, &mut ids);
                        prop_assert_eq!(ids.len(), hit);
                        pool.take(&ids, &mut got);
                        model.take(&prompt[..hit], &mut want);
                        let rest = prompt.len() - hit;
                        let ok = pool.allocate(rest, &mut got);
                        prop_assert_eq!(ok, model.allocate(rest, &mut want));
                        let got: Vec<u32> = got.iter().map(|b| b.0).collect();
                        prop_assert_eq!(&got, &want);
                        if !ok {
                            // Not admitted: the hit blocks are released again.
                            pool.free(got.iter().rev().map(|&b| BlockId(b)));
                            model.free(&want.iter().rev().copied().collect::<Vec<_>>());
                            continue;
                        }
                        for (i, &b) in got.iter().enumerate().skip(hit) {
                            let parent = i.checked_sub(1).map(|p| hashes[p]);
                            pool.cache(BlockId(b), hashes[i], parent, &[]);
                            model.cache(b, prompt[i]);
                        }
                        running.push(got);
                    }
                    Op::Finish(i) if !running.is_empty() => {
                        let blocks = running.remove(i % running.len());
                        let order: Vec<u32> = blocks.iter().rev().copied().collect();
                        pool.free(order.iter().map(|&b| BlockId(b)));
                        model.free(&order);
                    }
                    Op::Finish(_) => {}
                }
                prop_assert_eq!(pool.free_blocks(), model.free.len());
                pool.validate().map_err(TestCaseError::fail)?;
            }
        }
    }

    fn h(n: u64) -> BlockHash {
        BlockHash::new(n)
    }

    /// A hand-checked sequence of vLLM-like allocations, frees, prefix hits, evictions
    /// and a preemption, on a pool of 6 blocks.
    #[test]
    fn a_hand_checked_sequence() {
        let mut pool = BlockPool::new(6, true);
        // Request A: 3 full prompt blocks (hashes 1, 2, 3) plus a partial one.
        let mut a = Vec::new();
        assert_eq!(pool.cached_prefix(&[h(1), h(2), h(3)]), 0);
        assert!(pool.allocate(4, &mut a));
        assert_eq!(a, [BlockId(0), BlockId(1), BlockId(2), BlockId(3)]);
        pool.cache(a[0], h(1), None, &[]);
        pool.cache(a[1], h(2), Some(h(1)), &[]);
        pool.cache(a[2], h(3), Some(h(2)), &[]);
        assert_eq!(pool.free_blocks(), 2);
        // Request B shares blocks 1 and 2 while A runs: a hit on blocks in use.
        assert_eq!(pool.cached_prefix(&[h(1), h(2), h(9)]), 2);
        let (mut ids, mut b) = (Vec::new(), Vec::new());
        pool.hit_blocks(&[h(1), h(2), h(9)], &mut ids);
        assert_eq!(pool.free_among(&ids), 0, "both in use by A");
        pool.take(&ids, &mut b);
        assert!(pool.allocate(2, &mut b));
        assert_eq!(b, [BlockId(0), BlockId(1), BlockId(4), BlockId(5)]);
        assert_eq!(pool.free_blocks(), 0);
        // A third request cannot get a block: the scheduler would preempt. Preempting B
        // frees its blocks last first: 5 and 4 join the queue; 1 and 0 are still A's.
        let mut c = Vec::new();
        assert!(!pool.allocate(1, &mut c));
        assert!(c.is_empty());
        pool.free(b.iter().rev().copied());
        assert_eq!(pool.free_blocks(), 2);
        // A finishes: its blocks join the queue tail, last first (3, 2, 1, 0).
        pool.free(a.iter().rev().copied());
        assert_eq!(pool.free_blocks(), 6);
        // Allocating 4 takes 5, 4 (uncached), 3 (the partial block), then 2, which evicts
        // hash 3; hashes 1 and 2 survive.
        assert!(pool.allocate(4, &mut c));
        assert_eq!(c, [BlockId(5), BlockId(4), BlockId(3), BlockId(2)]);
        assert_eq!(pool.cached_prefix(&[h(1), h(2), h(3)]), 2);
        assert_eq!(
            pool.drain_changes().changes,
            [
                PoolChange::Cached {
                    hash: h(1),
                    parent: None,
                    tokens: 0..0
                },
                PoolChange::Cached {
                    hash: h(2),
                    parent: Some(h(1)),
                    tokens: 0..0
                },
                PoolChange::Cached {
                    hash: h(3),
                    parent: Some(h(2)),
                    tokens: 0..0
                },
                PoolChange::Evicted(h(3)),
            ]
        );
        pool.validate().unwrap();
    }

    #[test]
    fn a_hit_on_free_blocks_takes_them_out_of_the_queue() {
        let mut pool = BlockPool::new(3, false);
        let mut a = Vec::new();
        assert!(pool.allocate(2, &mut a));
        pool.cache(a[0], h(1), None, &[]);
        pool.cache(a[1], h(2), Some(h(1)), &[]);
        pool.free(a.iter().rev().copied());
        let (mut ids, mut b) = (Vec::new(), Vec::new());
        pool.hit_blocks(&[h(1), h(2)], &mut ids);
        assert_eq!(pool.free_among(&ids), 2);
        pool.take(&ids, &mut b);
        assert_eq!(b, a);
        assert_eq!(pool.free_blocks(), 1);
        // The remaining free block is the never-used one; taking it evicts nothing.
        let mut c = Vec::new();
        assert!(pool.allocate(1, &mut c));
        assert_eq!(pool.cached_prefix(&[h(1), h(2)]), 2);
        pool.validate().unwrap();
    }

    #[test]
    fn duplicate_hashes_stay_cached_until_the_last_copy_goes() {
        let mut pool = BlockPool::new(2, true);
        let mut ids = Vec::new();
        assert!(pool.allocate(2, &mut ids));
        pool.cache(ids[0], h(7), None, &[]);
        pool.cache(ids[1], h(7), None, &[]);
        pool.free([ids[0], ids[1]]);
        let mut again = Vec::new();
        assert!(pool.allocate(1, &mut again));
        assert!(pool.is_cached(h(7)));
        assert!(pool.allocate(1, &mut again));
        assert!(!pool.is_cached(h(7)));
        let evictions = pool
            .drain_changes()
            .changes
            .into_iter()
            .filter(|c| matches!(c, PoolChange::Evicted(_)))
            .count();
        assert_eq!(
            evictions, 2,
            "each copy's eviction is reported, as vLLM does"
        );
        pool.validate().unwrap();
    }
}
