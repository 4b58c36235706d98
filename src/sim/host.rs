//! A worker's host tier: the CPU copies vLLM 0.33's offloading connector keeps (facts taken
//! from the crate's design and from vLLM's source, no code taken).
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

use super::chain_lru::{ChainLru, Path};
use crate::hash::BlockHash;

/// A change of the host tier, named by the chunk's last block. A refresh records the chunks
/// it copies root first (as vLLM's offloading connector names a store's blocks), then the
/// chunks it drops in the order dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HostChange {
    /// A chunk was copied.
    Stored(BlockHash),
    /// A chunk was dropped.
    Dropped(BlockHash),
}

/// One worker's host tier.
#[derive(Clone, Debug)]
pub(crate) struct HostTier {
    /// Blocks per chunk (at least 1).
    chunk: usize,
    /// Chunks it holds at most (at least 1).
    capacity: usize,
    /// The chunks held, in use order (a refresh costs the chunks it adds, see its docs).
    lru: ChainLru,
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
            lru: ChainLru::default(),
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
        while next <= max && self.lru.contains(hashes[next - 1]) {
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
        let path = Path {
            hashes,
            chunk: self.chunk,
        };
        let changes = &mut self.changes;
        self.lru
            .refresh(path, last / self.chunk, store, &mut |key| {
                if let Some(changes) = changes {
                    changes.push(HostChange::Stored(key));
                }
            });
        while self.lru.len() > self.capacity {
            let Some(victim) = self.lru.pop() else {
                break;
            };
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn h(i: u64) -> BlockHash {
        BlockHash::new(i)
    }

    /// The naive model of the tier: the LRU as a list (the first the least recently used),
    /// a refresh walking the whole path deepest first.
    struct Naive {
        chunk: usize,
        capacity: usize,
        order: Vec<BlockHash>,
        changes: Vec<HostChange>,
    }

    impl Naive {
        fn refresh(&mut self, hashes: &[BlockHash], last: usize, store: bool) {
            let mut end = last;
            let mut stored = Vec::new();
            while end >= self.chunk {
                let key = hashes[end - 1];
                if let Some(i) = self.order.iter().position(|&c| c == key) {
                    self.order.remove(i);
                    self.order.push(key);
                } else if store {
                    self.order.push(key);
                    stored.push(HostChange::Stored(key));
                }
                end -= self.chunk;
            }
            // Copies are reported root first.
            self.changes.extend(stored.into_iter().rev());
            while self.order.len() > self.capacity {
                let victim = self.order.remove(0);
                self.changes.push(HostChange::Dropped(victim));
            }
        }

        fn copy(&mut self, hashes: &[BlockHash], from: usize, to: usize) {
            let last = to.min(hashes.len()) / self.chunk * self.chunk;
            if last > from {
                self.refresh(hashes, last, true);
            }
        }

        fn continues(&self, hashes: &[BlockHash], from: usize, max: usize) -> usize {
            let max = max.min(hashes.len());
            let mut end = from;
            let mut next = (from / self.chunk + 1) * self.chunk;
            while next <= max && self.order.contains(&hashes[next - 1]) {
                end = next;
                next += self.chunk;
            }
            if end >= from + self.chunk { end } else { from }
        }
    }

    /// Chained hashes of a sequence of block contents (so that sequences sharing leading
    /// contents share leading hashes, as the fleet's hasher gives).
    fn chain(contents: &[u8]) -> Vec<BlockHash> {
        let mut prev = 0x5EED_u64;
        contents
            .iter()
            .map(|&c| {
                prev = crate::fold::fold64(prev ^ (u64::from(c) + 1) << 40);
                h(prev)
            })
            .collect()
    }

    /// The tier's chunks from the least recently used on.
    fn use_order(host: &HostTier) -> Vec<BlockHash> {
        let mut lru = host.lru.clone();
        std::iter::from_fn(|| lru.pop()).collect()
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

    #[test]
    fn a_refresh_makes_the_shallowest_chunk_the_most_recent() {
        let a = chain(&[0, 1, 2]);
        let b = chain(&[0, 3]);
        let mut host = HostTier::new(4, 1, true);
        host.copy(&a, 0, 3);
        host.copy(&b, 1, 2);
        assert_eq!(use_order(&host), [a[2], a[1], b[1], a[0]]);
        host.copy(&a, 0, 3);
        assert_eq!(use_order(&host), [b[1], a[2], a[1], a[0]]);
        host.copy(&chain(&[4]), 0, 1);
        assert_eq!(
            host.drain_changes().last(),
            Some(&HostChange::Dropped(b[1]))
        );
    }

    /// An operation on the tier: a copy of blocks `from..to` of a sequence, or a request
    /// loading what the tier continues of a hit of `hit` blocks, up to `max`.
    #[derive(Clone, Debug)]
    enum Op {
        Copy(Vec<u8>, usize, usize),
        Load(Vec<u8>, usize, usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        let seq = proptest::collection::vec(0u8..3, 1..10);
        prop_oneof![
            3 => (seq.clone(), 0usize..10, 0usize..12).prop_map(|(s, a, b)| Op::Copy(s, a, b)),
            2 => (seq, 0usize..10, 0usize..12).prop_map(|(s, a, b)| Op::Load(s, a, b)),
        ]
    }

    proptest! {
        /// Copies and loads of sequences sharing prefixes give the naive model's changes,
        /// in order, and its answers; the tier ends in the same use order.
        #[test]
        fn matches_the_naive_model(
            ops in proptest::collection::vec(op(), 1..80),
            capacity in 1usize..12,
            chunk in 1usize..4,
        ) {
            let mut host = HostTier::new(capacity, chunk, true);
            let mut naive = Naive { chunk, capacity, order: Vec::new(), changes: Vec::new() };
            for op in ops {
                match op {
                    Op::Copy(contents, from, to) => {
                        let hashes = chain(&contents);
                        host.copy(&hashes, from.min(to), to);
                        naive.copy(&hashes, from.min(to), to);
                    }
                    Op::Load(contents, hit, max) => {
                        let hashes = chain(&contents);
                        let hit = hit.min(max).min(hashes.len());
                        let found = host.continues(&hashes, hit, max);
                        prop_assert_eq!(found, naive.continues(&hashes, hit, max));
                        host.load(&hashes, found);
                        let last = found.min(hashes.len()) / chunk * chunk;
                        naive.refresh(&hashes, last, false);
                    }
                }
                prop_assert_eq!(host.drain_changes(), std::mem::take(&mut naive.changes));
                host.lru.validate().map_err(TestCaseError::fail)?;
            }
            prop_assert_eq!(use_order(&host), naive.order);
        }
    }
}
