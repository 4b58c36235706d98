//! Positions: weak, checked handles on one block of the tree, and the index that finds a
//! block's position by its hash.
//!
//! A [`Position`] names a block by its hash, its **depth** (the length of its path from the
//! root) and a node that held it when the position was taken: that node's edge, or the edge
//! of a node above it on the same path. Nodes keep their ids when a leaf grows or the part
//! above them is split off, so the block is found again by walking up from that node. A
//! position is **weak**: the tree checks it on every use ([`Position::resolve`]) and a stale
//! one (its node freed or merged away, the block evicted for the worker asked about) is
//! useless, never wrong. Event sync holds positions, never node ids.
//!
//! The **last-block index** ([`LastBlocks`]), kept once event sync turns it on in a chained
//! tree, maps an edge's last block to its node, and also holds **kept positions**: blocks
//! sync could no longer remember, indexed while they are in the tree even when they no
//! longer end an edge. Entries are not removed when they go stale (one map operation fewer
//! where a leaf grows): a lookup checks its entry against the tree, and stale entries are
//! dropped in bulk once they may be as many as the live ones.

use super::arena::{Arena, NodeId};
use crate::fold::FoldMap;
use crate::hash::BlockHash;
use crate::list::Slot;

/// A checked, weak handle on one block of a [`RadixTree`](super::RadixTree): see the module
/// docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Position {
    /// A node that held the block when the position was taken, or one below it on its path.
    pub(super) node: NodeId,
    /// The length of the block's path from the root (at least 1).
    pub(super) depth: u32,
    /// The block.
    pub(super) block: BlockHash,
}

impl Position {
    /// The block's hash.
    pub(crate) fn block(&self) -> BlockHash {
        self.block
    }

    /// The length of the block's path from the root.
    pub(crate) fn depth(&self) -> usize {
        self.depth as usize
    }

    /// A position of block `block` at `depth` in node number `node`, for tests outside the
    /// tree that need positions without a tree.
    #[cfg(test)]
    pub(crate) fn for_test(node: u32, depth: u32, block: u64) -> Position {
        Position {
            node: NodeId::from_raw(node),
            depth,
            block: BlockHash::new(block),
        }
    }

    /// The node at or above `hint` whose edge holds depth `depth` (at least 1), and the
    /// block there. `None` when `hint` is not a live node or its edge ends above `depth`.
    pub(super) fn containing(
        arena: &Arena,
        hint: NodeId,
        depth: usize,
    ) -> Option<(NodeId, BlockHash)> {
        if hint == NodeId::ROOT || depth == 0 || !arena.alive(hint) {
            return None;
        }
        let at = depth - 1;
        let mut id = hint;
        loop {
            let n = &arena[id];
            if at >= n.end() {
                return None;
            }
            if at >= n.depth() {
                return Some((id, arena.edge(id)[at - n.depth()]));
            }
            id = n.parent;
            if id == NodeId::ROOT {
                return None;
            }
        }
    }

    /// The position as the tree has it now, with the node that holds the block, when the
    /// block is still there and held by worker `w`; `None` otherwise.
    pub(super) fn resolve(self, arena: &Arena, w: usize) -> Option<Position> {
        let (node, block) = Self::containing(arena, self.node, self.depth())?;
        (block == self.block && arena.has_member(node, w)).then_some(Position { node, ..self })
    }

    /// Writes into `out` the path from the root to this block. The position must be
    /// resolved (its node holds the block).
    pub(super) fn path(self, arena: &Arena, out: &mut Vec<BlockHash>) {
        // The edges' parts, deepest first, then copied root first.
        let mut parts: smallvec::SmallVec<[(NodeId, usize); 16]> = smallvec::SmallVec::new();
        let (mut id, mut end) = (self.node, self.depth());
        while id != NodeId::ROOT {
            let n = &arena[id];
            parts.push((id, end - n.depth()));
            end = n.depth();
            id = n.parent;
        }
        out.clear();
        for &(id, len) in parts.iter().rev() {
            out.extend_from_slice(&arena.edge(id)[..len]);
        }
    }
}

/// Stale entries the index may hold beyond as many as its live ones (small in unit tests,
/// so that dropping them is exercised).
#[cfg(not(test))]
const SLACK: usize = 1024;
#[cfg(test)]
const SLACK: usize = 4;

/// An entry of the index: where the block is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    /// The node that held the block when indexed (or one below it on its path).
    node: NodeId,
    /// The block's depth, with [`Entry::KEPT`] set for a kept position.
    depth: u32,
}

impl Entry {
    const KEPT: u32 = 1 << 31;

    fn depth(self) -> u32 {
        self.depth & !Self::KEPT
    }

    fn kept(self) -> bool {
        self.depth & Self::KEPT != 0
    }
}

/// The last-block index: an edge's last block → its node, and kept positions.
///
/// Invariants while on: every live node is indexed under its edge's last block (an entry
/// naming that node, at that depth); the map holds at most twice `bound` entries plus a
/// slack, `bound` being the most live nodes or live entries since stale ones were last
/// dropped.
#[derive(Clone, Debug, Default)]
pub(super) struct LastBlocks {
    map: FoldMap<BlockHash, Entry>,
    on: bool,
    bound: usize,
}

impl LastBlocks {
    /// Starts keeping the index (idempotent). Cost: O(nodes) the first time.
    pub(super) fn turn_on(&mut self, arena: &Arena) {
        if self.on {
            return;
        }
        self.on = true;
        for id in arena.live_ids() {
            self.note_end(arena, id);
        }
    }

    /// Indexes `node` under its edge's last block (called whenever an edge's end changes).
    /// The entry of its old last block is left to go stale.
    #[inline]
    pub(super) fn note_end(&mut self, arena: &Arena, node: NodeId) {
        if !self.on {
            return;
        }
        self.drop_stale(arena);
        let n = &arena[node];
        let depth = n.end() as u32;
        let entry = self.map.entry(n.last()).or_insert(Entry { node, depth });
        // A kept position of the same block is the same position.
        *entry = Entry {
            node,
            depth: depth | (entry.depth & Entry::KEPT),
        };
    }

    /// Keeps `position` in the index until its block leaves the tree. Not checked here
    /// (that would read the tree at a random place): checked where it is used, and dropped
    /// with the stale entries when wrong.
    pub(super) fn keep(&mut self, arena: &Arena, position: Position) {
        if !self.on || position.depth >= Entry::KEPT {
            return;
        }
        self.drop_stale(arena);
        self.map
            .entry(position.block)
            // An entry of the same block is the same position, or stale.
            .and_modify(|entry| entry.depth |= Entry::KEPT)
            .or_insert(Entry {
                node: position.node,
                depth: position.depth | Entry::KEPT,
            });
    }

    /// Where `block` is, from the index, when worker `w` holds it there.
    pub(super) fn find(&self, arena: &Arena, block: BlockHash, w: usize) -> Option<Position> {
        let &entry = self.map.get(&block)?;
        let depth = entry.depth();
        let n = arena.live_node(entry.node)?;
        if n.last() == block && n.end() == depth as usize {
            // Still the end of its node's edge: no need to read the edge.
            let position = Position {
                node: entry.node,
                depth,
                block,
            };
            return arena.has_member(entry.node, w).then_some(position);
        }
        // A kept position, or an edge's former end not dropped yet.
        Position {
            node: entry.node,
            depth,
            block,
        }
        .resolve(arena, w)
    }

    /// Whether an entry still names where its block is: kept positions while the block is
    /// there, other entries while the block ends their node's edge.
    fn live(arena: &Arena, block: BlockHash, entry: Entry) -> bool {
        if entry.kept() {
            return Position::containing(arena, entry.node, entry.depth() as usize)
                .is_some_and(|(_, b)| b == block);
        }
        arena
            .live_node(entry.node)
            .is_some_and(|n| n.last() == block)
    }

    /// Drops stale entries once they may be as many as the live ones (so amortised O(1)
    /// per entry added), before an entry is added.
    #[inline]
    fn drop_stale(&mut self, arena: &Arena) {
        self.bound = self.bound.max(arena.live());
        if self.map.len() >= 2 * self.bound + SLACK {
            self.drop_stale_now(arena);
        }
    }

    #[cold]
    fn drop_stale_now(&mut self, arena: &Arena) {
        self.map
            .retain(|&block, &mut entry| Self::live(arena, block, entry));
        self.bound = self.map.len().max(arena.live());
    }

    /// Bytes allocated.
    pub(super) fn memory_bytes(&self) -> usize {
        self.map.allocation_size()
    }

    /// The index's invariants (see [`LastBlocks`]).
    pub(super) fn validate(&self, arena: &Arena) -> Result<(), String> {
        if !self.on {
            return Ok(());
        }
        for id in arena.live_ids() {
            let n = &arena[id];
            let found = self.map.get(&n.last());
            if found.is_none_or(|e| e.node != id || e.depth() as usize != n.end()) {
                return Err(format!("node {id:?}: missing from the last-block index"));
            }
        }
        if self.map.len() > 2 * self.bound + SLACK {
            return Err(format!(
                "{} live nodes, {} last-block index entries (stale ones not dropped)",
                arena.live() - 1,
                self.map.len()
            ));
        }
        Ok(())
    }
}

impl Default for Position {
    /// A position of no block: it never resolves.
    fn default() -> Self {
        Position {
            node: NodeId::NONE,
            depth: 0,
            block: BlockHash::new(0),
        }
    }
}
