//! An LRU over the chunks of chained sequences where refreshing a sequence's leading chunks
//! costs what it adds, not the sequence's length: the host tier's bookkeeping
//! ([`HostTier`](super::host::HostTier)).
//!
//! Glossary:
//! - a **path** is a sequence's chunks, named by their keys; position `j` (from 1) is the
//!   chunk's **depth**. Keys are chained hashes: a key names its whole prefix, so two paths
//!   that share a key share every key before it, and the keys of all paths form a tree
//!   (the parent of the key at depth `j` is the key at depth `j - 1`);
//! - a **refresh** of a path's first `len` chunks is one event: it makes those chunks the
//!   most recently used, deepest first (so the chunk at depth 1 is the most recent of all),
//!   inserting the ones not held when it stores;
//! - a **leaf** is a held chunk none of whose children is held.
//!
//! The order this keeps is exactly that of an LRU list where a refresh moves (or inserts)
//! its chunks to the recent end one by one, deepest first. A chunk's place in that list is
//! given by the key (the last refresh that passed through it, its depth): a later refresh
//! is more recent, and within one refresh the shallower chunk is.
//!
//! Invariants (checked by `ChainLru::validate` in tests):
//! - the held chunks are closed under parents: a refresh inserts the whole path up to its
//!   end, and only leaves are dropped (a held chunk's held descendants are all less recent
//!   than it, so the least recently used chunk is always a leaf); hence on any path the
//!   held chunks are a prefix;
//! - a chunk's stored `used` is at most its true last refresh, and equal for a leaf: a
//!   refresh writes its time to its deepest held chunk only, and a dropped leaf hands its
//!   time to its parent (every refresh that reached the leaf reached the parent);
//! - `leaves` holds exactly the leaves, each under its true key, so its first entry is the
//!   least recently used chunk.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use crate::fold::FoldMap;
use crate::hash::BlockHash;

/// A path: chunk `j` (from 1) is named by `hashes[j × chunk − 1]`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Path<'a> {
    /// The sequence's block hashes (chained).
    pub(super) hashes: &'a [BlockHash],
    /// Blocks per chunk (at least 1).
    pub(super) chunk: usize,
}

impl Path<'_> {
    /// The key of the chunk at depth `j` (from 1; at most the path's chunks).
    fn key(&self, j: usize) -> BlockHash {
        self.hashes[j * self.chunk - 1]
    }
}

/// A held chunk.
#[derive(Clone, Copy, Debug)]
struct Node {
    /// The chunk above it, if any (held: the held chunks are closed under parents).
    parent: Option<BlockHash>,
    /// Its depth (from 1).
    depth: u32,
    /// Its last refresh (exact for a leaf, a lower bound otherwise).
    used: u64,
    /// Its held children.
    children: u32,
}

impl Node {
    /// The key that orders it among the leaves: the least recently used first.
    fn order(&self) -> (u64, Reverse<u32>) {
        (self.used, Reverse(self.depth))
    }
}

/// The LRU over chains of chunks: see the module docs.
#[derive(Clone, Debug, Default)]
pub(super) struct ChainLru {
    nodes: FoldMap<BlockHash, Node>,
    /// The leaves by their order key: the first is the least recently used chunk.
    leaves: BTreeMap<(u64, Reverse<u32>), BlockHash>,
    /// The clock of refreshes.
    clock: u64,
}

impl ChainLru {
    /// Chunks held.
    pub(super) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the chunk named `key` is held.
    pub(super) fn contains(&self, key: BlockHash) -> bool {
        self.nodes.contains_key(&key)
    }

    /// How many of the first `len` chunks of `path` are held (they are its first ones),
    /// searched from the deep end so that a path missing a few chunks costs a few lookups.
    pub(super) fn held_prefix(&self, path: Path<'_>, len: usize) -> usize {
        // Held: depths up to lo (0: none known); not held: depths above hi. Probes len,
        // then len - 1, len - 2, len - 4, … until one is held.
        let (mut lo, mut hi) = (0, len);
        let mut tries = 0u32;
        while hi > lo {
            let back = if tries == 0 {
                0
            } else {
                1usize << (tries - 1).min(62)
            };
            let probe = len.saturating_sub(back).clamp(lo + 1, hi);
            if self.contains(path.key(probe)) {
                lo = probe;
                break;
            }
            hi = probe - 1;
            tries += 1;
        }
        while hi > lo {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.contains(path.key(mid)) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// Refreshes the first `len` chunks of `path` (one refresh, see the module docs); with
    /// `store`, those not held are inserted, and `stored` is called with each, root first
    /// (the order an engine names a store's blocks in).
    pub(super) fn refresh(
        &mut self,
        path: Path<'_>,
        len: usize,
        store: bool,
        stored: &mut dyn FnMut(BlockHash),
    ) {
        let held = self.held_prefix(path, len);
        self.clock += 1;
        let tip = if store && len > held {
            self.insert_below(path, held, len, stored);
            len
        } else {
            held
        };
        if tip == 0 {
            return;
        }
        let key = path.key(tip);
        let Some(node) = self.nodes.get_mut(&key) else {
            unreachable!("the tip is held");
        };
        let old = node.order();
        node.used = self.clock;
        if node.children == 0 {
            self.leaves.remove(&old);
            self.leaves.insert(node.order(), key);
        }
    }

    /// Inserts the chunks of `path` at depths `held + 1..=len` (none held, chunk `held`
    /// held or `held` 0) as refreshed now, telling `stored` root first.
    fn insert_below(
        &mut self,
        path: Path<'_>,
        held: usize,
        len: usize,
        stored: &mut dyn FnMut(BlockHash),
    ) {
        for j in held + 1..=len {
            stored(path.key(j));
        }
        if held > 0 {
            let key = path.key(held);
            if let Some(parent) = self.nodes.get_mut(&key) {
                parent.children += 1;
                if parent.children == 1 {
                    self.leaves.remove(&parent.order());
                }
            }
        }
        for j in held + 1..=len {
            let node = Node {
                parent: (j > 1).then(|| path.key(j - 1)),
                depth: u32::try_from(j).unwrap_or(u32::MAX),
                used: self.clock,
                children: u32::from(j < len),
            };
            let previous = self.nodes.insert(path.key(j), node);
            debug_assert!(previous.is_none(), "a chunk not held is inserted once");
        }
        let Some(leaf) = self.nodes.get(&path.key(len)) else {
            unreachable!("just inserted");
        };
        self.leaves.insert(leaf.order(), path.key(len));
    }

    /// Drops the least recently used chunk (a leaf) and returns its key; its parent, if it
    /// has no other held child, becomes a leaf carrying the later of the two uses.
    pub(super) fn pop(&mut self) -> Option<BlockHash> {
        let (_, key) = self.leaves.pop_first()?;
        let node = self.nodes.remove(&key)?;
        if let Some(parent_key) = node.parent {
            if let Some(parent) = self.nodes.get_mut(&parent_key) {
                parent.used = parent.used.max(node.used);
                parent.children = parent.children.saturating_sub(1);
                if parent.children == 0 {
                    self.leaves.insert(parent.order(), parent_key);
                }
            }
        }
        Some(key)
    }

    /// Checks the invariants of the module docs that can be seen without the history.
    ///
    /// # Errors
    ///
    /// A description of the first violation.
    #[cfg(test)]
    pub(super) fn validate(&self) -> Result<(), String> {
        let mut children: FoldMap<BlockHash, u32> = FoldMap::default();
        for (key, node) in &self.nodes {
            if let Some(parent) = node.parent {
                let Some(p) = self.nodes.get(&parent) else {
                    return Err(format!("{key:?} is held without its parent"));
                };
                if p.depth + 1 != node.depth {
                    return Err(format!("{key:?} is not one deeper than its parent"));
                }
                *children.entry(parent).or_default() += 1;
            }
        }
        for (key, node) in &self.nodes {
            let count = children.get(key).copied().unwrap_or(0);
            let listed = self.leaves.get(&node.order()) == Some(key);
            if node.children != count || listed != (count == 0) {
                return Err(format!("{key:?}: children or leaf entry miscounted"));
            }
        }
        if self.leaves.len() != self.nodes.values().filter(|n| n.children == 0).count() {
            return Err("a stale leaf entry".to_owned());
        }
        Ok(())
    }
}
