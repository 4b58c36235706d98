//! A worker's host tier: the CPU copies vLLM 0.33's offloading connector keeps (facts taken
//! from `../shared/DESIGN.md` and vLLM, code not).
//!
//! Glossary: a **chunk** is `chunk` consecutive blocks of a sequence, starting at a multiple
//! of `chunk`, copied and dropped together and named by its last block's hash (which, the
//! hashes being chained, names the whole prefix up to it).
//!
//! Blocks are copied as they are computed, not when the device evicts them: a chunk is
//! copied once its last block is computed. The tier is an LRU over chunks of a fixed
//! capacity. When a sequence copies a chunk or loads chunks back, its chunks from the first
//! one are refreshed deepest first, as vLLM's offloading manager touches a request's blocks
//! in reverse, so that a chunk is never more recently used than those above it and the LRU
//! drops the deepest first. A chunk above that the tier no longer holds is copied again (the
//! device holds it: the sequence is using it); this model's simplification keeps the tier a
//! prefix of every sequence, which is also what a router's mirror of tiers assumes. A request
//! can load back the chunks that continue its device hit, whole chunks only, from the chunk
//! holding the hit's end and only when they add at least a chunk (as vLLM's connector); loaded blocks
//! cost their reload time ([`ReloadConfig`](crate::ReloadConfig), host tier) in the step that
//! admits it.
//!
//! Left out: the copy's own bandwidth and latency (a chunk is on the host the moment it is
//! computed), the connector's asynchronous load (the admitting step waits for it), and disk
//! or remote tiers.

use std::collections::BTreeMap;

use crate::BlockHash;
use crate::fold::FoldMap;

/// A change of the host tier, named by the chunk's last block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HostChange {
    /// A chunk was copied.
    Stored(BlockHash),
    /// A chunk was dropped.
    Dropped(BlockHash),
}

/// One worker's host tier.
#[derive(Debug)]
pub(crate) struct HostTier {
    /// Blocks per chunk (at least 1).
    chunk: usize,
    /// Chunks it holds at most (at least 1).
    capacity: usize,
    /// Each chunk held, by its last block, with its last use.
    chunks: FoldMap<BlockHash, u64>,
    /// The chunks by last use: the first is the next to drop.
    by_use: BTreeMap<u64, BlockHash>,
    /// The clock of uses.
    uses: u64,
    /// Changes since the last drain, when recording.
    changes: Option<Vec<HostChange>>,
}

impl HostTier {
    /// A tier of `capacity` chunks of `chunk` blocks (each at least 1), recording its
    /// changes when `record`.
    pub(crate) fn new(capacity: usize, chunk: usize, record: bool) -> Self {
        Self {
            chunk: chunk.max(1),
            capacity: capacity.max(1),
            chunks: FoldMap::default(),
            by_use: BTreeMap::new(),
            uses: 0,
            changes: record.then(Vec::new),
        }
    }

    /// Blocks `from..to` of `hashes` were just computed: when a chunk ends among them, every
    /// chunk of `hashes` up to `to` is copied or refreshed, deepest first.
    pub(crate) fn copy(&mut self, hashes: &[BlockHash], from: usize, to: usize) {
        let to = to.min(hashes.len());
        let last = to / self.chunk * self.chunk;
        if last > from {
            self.refresh(hashes, last, true);
        }
    }

    /// How far the tier continues a hit of `from` leading blocks of `hashes`, in whole
    /// chunks, up to `max` blocks: the end of the last chunk of the run it holds from the
    /// chunk holding block `from`, when that is at least a chunk beyond `from` (vLLM's
    /// offloading connector loads less than a chunk never); else `from`.
    pub(crate) fn continues(&self, hashes: &[BlockHash], from: usize, max: usize) -> usize {
        let max = max.min(hashes.len());
        let mut end = from;
        let mut next = (from / self.chunk + 1) * self.chunk;
        while next <= max && self.chunks.contains_key(&hashes[next - 1]) {
            end = next;
            next += self.chunk;
        }
        if end >= from + self.chunk { end } else { from }
    }

    /// A request loads back blocks up to `to` of `hashes` (see
    /// [`continues`](Self::continues)): its chunks up to there are refreshed, deepest first.
    pub(crate) fn load(&mut self, hashes: &[BlockHash], to: usize) {
        let last = to.min(hashes.len()) / self.chunk * self.chunk;
        self.refresh(hashes, last, false);
    }

    /// Refreshes the chunks of `hashes` ending at or before block `last` (a chunk's end),
    /// deepest first; with `store`, a chunk not held is copied, and the least recently used
    /// chunks are dropped afterwards down to the capacity (the deepest of the refreshed ones
    /// first, so the tier stays a prefix of every sequence).
    fn refresh(&mut self, hashes: &[BlockHash], last: usize, store: bool) {
        let mut end = last;
        while end >= self.chunk {
            let key = hashes[end - 1];
            if !self.touch(key) && store {
                self.insert(key);
            }
            end -= self.chunk;
        }
        while self.chunks.len() > self.capacity {
            let Some((_, victim)) = self.by_use.pop_first() else {
                break;
            };
            self.chunks.remove(&victim);
            if let Some(changes) = &mut self.changes {
                changes.push(HostChange::Dropped(victim));
            }
        }
    }

    /// The changes recorded since the last call, in order.
    pub(crate) fn drain_changes(&mut self) -> Vec<HostChange> {
        self.changes
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Holds the chunk ending at `last` (not held), as the most recently used.
    fn insert(&mut self, last: BlockHash) {
        self.uses += 1;
        self.chunks.insert(last, self.uses);
        self.by_use.insert(self.uses, last);
        if let Some(changes) = &mut self.changes {
            changes.push(HostChange::Stored(last));
        }
    }

    /// Makes the chunk ending at `last` the most recently used; whether it is held.
    fn touch(&mut self, last: BlockHash) -> bool {
        let Some(used) = self.chunks.get_mut(&last) else {
            return false;
        };
        self.by_use.remove(used);
        self.uses += 1;
        *used = self.uses;
        self.by_use.insert(self.uses, last);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn h(i: u64) -> BlockHash {
        BlockHash::new(i)
    }

    /// The naive model: chunks in use order (the first the least recently used).
    #[derive(Default)]
    struct Naive {
        order: Vec<u64>,
    }

    impl Naive {
        fn put(&mut self, last: u64, capacity: usize) {
            if let Some(i) = self.order.iter().position(|&c| c == last) {
                self.order.remove(i);
            } else if self.order.len() >= capacity {
                self.order.remove(0);
            }
            self.order.push(last);
        }
    }

    #[test]
    fn chunks_are_copied_whole_and_continue_a_hit_whole() {
        let hashes: Vec<BlockHash> = (1..=8).map(h).collect();
        let mut host = HostTier::new(10, 4, true);
        host.copy(&hashes, 0, 3);
        assert!(host.drain_changes().is_empty(), "no chunk complete yet");
        host.copy(&hashes, 3, 6);
        assert_eq!(host.drain_changes(), [HostChange::Stored(h(4))]);
        assert_eq!(host.continues(&hashes, 0, 8), 4);
        assert_eq!(
            host.continues(&hashes, 2, 8),
            2,
            "from inside the first chunk, less than a chunk is not loaded"
        );
        assert_eq!(
            host.continues(&hashes, 4, 8),
            4,
            "the second chunk is not there"
        );
        assert_eq!(
            host.continues(&hashes, 0, 3),
            0,
            "a chunk past max is not given"
        );
        host.copy(&hashes, 6, 8);
        assert_eq!(host.continues(&hashes, 0, 8), 8);
    }

    proptest! {
        /// The tier holds exactly the chunks a naive LRU over chunks holds, in the same use
        /// order, and its changes replayed give the same chunks.
        #[test]
        fn matches_a_naive_lru(
            ops in proptest::collection::vec((0u64..12, any::<bool>()), 1..80),
            capacity in 1usize..6,
        ) {
            let mut host = HostTier::new(capacity, 1, true);
            let mut naive = Naive::default();
            for (last, load) in ops {
                let hashes = [h(last)];
                if load {
                    let held = naive.order.contains(&last);
                    prop_assert_eq!(host.continues(&hashes, 0, 1), usize::from(held));
                    host.load(&hashes, usize::from(held));
                    if held {
                        naive.put(last, capacity);
                    }
                } else {
                    host.copy(&hashes, 0, 1);
                    naive.put(last, capacity);
                }
            }
            let mut held: Vec<u64> = host.chunks.keys().map(|k| k.get()).collect();
            held.sort_unstable();
            let mut replayed = std::collections::BTreeSet::new();
            for change in host.drain_changes() {
                match change {
                    HostChange::Stored(c) => prop_assert!(replayed.insert(c.get())),
                    HostChange::Dropped(c) => prop_assert!(replayed.remove(&c.get())),
                }
            }
            prop_assert_eq!(replayed.into_iter().collect::<Vec<_>>(), held.clone());
            let mut expected = naive.order.clone();
            expected.sort_unstable();
            prop_assert_eq!(held, expected);
            let order: Vec<u64> = host.by_use.values().map(|k| k.get()).collect();
            prop_assert_eq!(order, naive.order);
        }
    }
}
