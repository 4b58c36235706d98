//! The mock worker's prefix cache, one per data-parallel rank, kept as vLLM's block pool
//! keeps it and reporting its changes as vLLM's KV events do.
//!
//! Glossary: a **block** is 16 prompt tokens, named by its chained engine hash (so holding a
//! block means holding its whole prefix); a **change** is one stored run of blocks or one
//! removal, as a `BlockStored` or `BlockRemoved` event reports it.
//!
//! Invariants: at most `capacity` blocks are held, and the held blocks are prefix-closed (a
//! block's parent is held whenever the block is). Serving a prompt marks its blocks used
//! now; eviction takes the least recently used block, the deepest first among blocks used
//! at the same time (vLLM frees a request's blocks tail first, so its free queue evicts
//! them in that order), which keeps the held blocks prefix-closed.

use std::collections::{BTreeSet, HashMap};

/// A change to a rank's cache, in the order it happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// Blocks `hashes` were stored below `parent` (`None`: at the root), holding `tokens`.
    Stored {
        parent: Option<u64>,
        hashes: Vec<u64>,
        tokens: Vec<u32>,
    },
    /// Blocks were evicted.
    Removed(Vec<u64>),
}

/// When a block was last used, and how deep it is: eviction order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Age {
    used: u64,
    /// Deeper blocks sort first among blocks used at the same time.
    height: std::cmp::Reverse<usize>,
}

/// One rank's cache.
pub(crate) struct RankCache {
    /// Held blocks, with their age.
    blocks: HashMap<u64, Age>,
    /// Held blocks by age, the next to evict first.
    order: BTreeSet<(Age, u64)>,
    capacity: usize,
    clock: u64,
}

impl RankCache {
    /// An empty cache of at most `capacity` blocks.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            blocks: HashMap::new(),
            order: BTreeSet::new(),
            capacity,
            clock: 0,
        }
    }

    /// How many blocks are held.
    pub(crate) fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Serves a prompt of `hashes` (its blocks) and `tokens`: how many of its blocks were held
    /// before, and the changes serving it made (what it stored, then what that evicted). The
    /// blocks that do not fit are not stored.
    pub(crate) fn serve(&mut self, hashes: &[u64], tokens: &[u32]) -> (usize, Vec<Change>) {
        self.clock += 1;
        let held = hashes
            .iter()
            .take_while(|h| self.blocks.contains_key(h))
            .count();
        let stored = hashes.len().min(self.capacity);
        for (depth, &hash) in hashes[..stored].iter().enumerate() {
            self.mark(hash, depth);
        }
        let mut changes = Vec::new();
        if stored > held {
            changes.push(Change::Stored {
                parent: held.checked_sub(1).map(|i| hashes[i]),
                hashes: hashes[held..stored].to_vec(),
                tokens: tokens[held * 16..stored * 16].to_vec(),
            });
        }
        let evicted = self.evict();
        if !evicted.is_empty() {
            changes.push(Change::Removed(evicted));
        }
        (held, changes)
    }

    /// Marks `hash`, at `depth`, used now.
    fn mark(&mut self, hash: u64, depth: usize) {
        let age = Age {
            used: self.clock,
            height: std::cmp::Reverse(depth),
        };
        if let Some(old) = self.blocks.insert(hash, age) {
            self.order.remove(&(old, hash));
        }
        self.order.insert((age, hash));
    }

    /// Evicts until the capacity holds; the evicted blocks.
    fn evict(&mut self) -> Vec<u64> {
        let mut evicted = Vec::new();
        while self.blocks.len() > self.capacity {
            let Some((_, hash)) = self.order.pop_first() else {
                break;
            };
            self.blocks.remove(&hash);
            evicted.push(hash);
        }
        evicted
    }
}
