//! The bottom layer: nodes in a slab addressed by [`NodeId`], their edges in one pool, their
//! holders in bitsets.
//!
//! The arena owns the edge pool and its garbage accounting, so every change to an edge
//! (a new leaf, a split, an extension, a shortening, a merge) goes through it and the
//! invariants below hold after each call:
//!
//! - a live node's edge is `pool[start..start + len]`, `len ≥ 1` (the root's is empty);
//! - `last` is the edge's last block, `depth` the number of blocks above the edge;
//! - `pool.len() = live blocks + garbage`: a slot no live edge uses is garbage, and the pool
//!   is rewritten without it, in place, when it would grow; after a rewrite its capacity is
//!   between 1.5 and 3 times the live blocks (plus what the operation appends), and it is
//!   reallocated only to stay in that range;
//! - a node's holder bitset has `stride` words; a free node's is all zero.
//!
//! Links between nodes (`parent`, children, siblings) belong to the shape layer and recency
//! links and stamps to the recency layer; the arena only stores them.

use super::members::Members;
use crate::hash::BlockHash;
use crate::list::Slot;

/// A node of the tree: an index into the arena. [`NodeId::ROOT`] is never freed;
/// [`NodeId::NONE`] is "no node" in links.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct NodeId(u32);

impl NodeId {
    /// The root: holds no blocks, never freed.
    pub(super) const ROOT: NodeId = NodeId(0);

    /// The id's number, for keys of maps.
    #[inline]
    pub(super) fn get(self) -> u32 {
        self.0
    }

    /// An id from a number (tests make ids a tree never had).
    #[cfg(test)]
    pub(super) fn from_raw(id: u32) -> Self {
        NodeId(id)
    }
}

impl Slot for NodeId {
    const NONE: NodeId = NodeId(u32::MAX);
    #[inline]
    fn index(self) -> usize {
        self.0 as usize
    }
}

/// One node. The link fields are public to the tree's layers, which document who writes
/// them; the edge is the arena's own.
#[derive(Clone, Copy, Debug)]
pub(super) struct Node {
    /// Shape: the parent (`NONE` for the root and for free nodes).
    pub(super) parent: NodeId,
    /// Shape: the first child in the child list.
    pub(super) first_child: NodeId,
    /// Shape: siblings in the parent's child list.
    pub(super) next_sibling: NodeId,
    pub(super) prev_sibling: NodeId,
    /// Recency: the global least-recently-used list.
    pub(super) lru_prev: NodeId,
    pub(super) lru_next: NodeId,
    /// Recency: logical time of the last insert or touch through this node (any worker).
    pub(super) stamp: u64,
    /// The edge is `pool[edge_start..edge_start + edge_len]`.
    edge_start: u32,
    edge_len: u32,
    /// Blocks above this node's edge.
    depth: u32,
    /// The edge's last block, kept beside the node so that a walk over a whole edge of
    /// chained hashes compares it without reading the pool.
    last: BlockHash,
}

crate::list::linked!(Node, NodeId, lru_prev, lru_next);

impl Node {
    const FREE: Node = Node {
        parent: NodeId::NONE,
        first_child: NodeId::NONE,
        next_sibling: NodeId::NONE,
        prev_sibling: NodeId::NONE,
        lru_prev: NodeId::NONE,
        lru_next: NodeId::NONE,
        stamp: 0,
        edge_start: 0,
        edge_len: 0,
        depth: 0,
        last: BlockHash::new(0),
    };

    /// Blocks on the edge.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.edge_len as usize
    }

    /// Blocks above the edge.
    #[inline]
    pub(super) fn depth(&self) -> usize {
        self.depth as usize
    }

    /// Blocks down to the end of the edge: the depth of its last block.
    #[inline]
    pub(super) fn end(&self) -> usize {
        (self.depth + self.edge_len) as usize
    }

    /// The edge's last block.
    #[inline]
    pub(super) fn last(&self) -> BlockHash {
        self.last
    }

    /// Whether the node has children.
    #[inline]
    pub(super) fn is_leaf(&self) -> bool {
        self.first_child == NodeId::NONE
    }
}

/// The node slab, the edge pool and the holder bitsets.
#[derive(Clone, Debug)]
pub(super) struct Arena {
    nodes: Vec<Node>,
    free: Vec<NodeId>,
    /// Live nodes, the root included.
    live: usize,
    /// Edge storage.
    pool: Vec<BlockHash>,
    /// Pool slots no live edge uses.
    garbage: usize,
    members: Members,
}

impl core::ops::Index<NodeId> for Arena {
    type Output = Node;
    #[inline]
    fn index(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }
}

impl core::ops::IndexMut<NodeId> for Arena {
    #[inline]
    fn index_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[id.index()]
    }
}

/// The set bits of a bitset, as worker indices.
#[inline]
pub(super) fn bits(words: &[u64]) -> impl Iterator<Item = usize> + '_ {
    words.iter().enumerate().flat_map(|(i, &word)| {
        let mut w = word;
        core::iter::from_fn(move || {
            if w == 0 {
                return None;
            }
            let bit = w.trailing_zeros() as usize;
            w &= w - 1;
            Some(i * 64 + bit)
        })
    })
}

/// Bits of an edge's start that one pass of [`sort_by_start`] sorts by.
const DIGIT: u32 = 11;

/// Sorts `edges` (distinct starts below `bound`) by start: a stable counting sort on each
/// [`DIGIT`] bits of the start, lowest first, as many passes as `bound` needs.
fn sort_by_start(edges: &mut Vec<(u32, NodeId)>, bound: usize) {
    let mask = (1u32 << DIGIT) - 1;
    let mut scratch = vec![(0, NodeId::NONE); edges.len()];
    let mut shift = 0;
    while shift < u32::BITS && (bound.saturating_sub(1) as u64) >> shift != 0 {
        let mut next = [0u32; 1 << DIGIT];
        for &(start, _) in edges.iter() {
            next[((start >> shift) & mask) as usize] += 1;
        }
        let mut sum = 0;
        for n in &mut next {
            (*n, sum) = (sum, sum + *n);
        }
        for &edge in edges.iter() {
            let digit = ((edge.0 >> shift) & mask) as usize;
            scratch[next[digit] as usize] = edge;
            next[digit] += 1;
        }
        core::mem::swap(edges, &mut scratch);
        shift += DIGIT;
    }
}

impl Arena {
    /// An arena holding only the root.
    pub(super) fn new() -> Self {
        Self {
            nodes: vec![Node::FREE],
            free: Vec::new(),
            live: 1,
            pool: Vec::new(),
            garbage: 0,
            members: Members::new(1),
        }
    }

    /// Live nodes, the root included.
    #[inline]
    pub(super) fn live(&self) -> usize {
        self.live
    }

    /// Blocks on live edges.
    #[inline]
    pub(super) fn blocks(&self) -> usize {
        self.pool.len() - self.garbage
    }

    /// Whether `id` is a live node (the root always is).
    #[inline]
    pub(super) fn alive(&self, id: NodeId) -> bool {
        id == NodeId::ROOT
            || self
                .nodes
                .get(id.index())
                .is_some_and(|n| n.parent != NodeId::NONE)
    }

    /// The node `id` if it is live and not the root.
    #[inline]
    pub(super) fn live_node(&self, id: NodeId) -> Option<&Node> {
        self.nodes
            .get(id.index())
            .filter(|n| n.parent != NodeId::NONE)
    }

    /// Every live node but the root, in id order.
    pub(super) fn live_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        (1..self.nodes.len() as u32)
            .map(NodeId)
            .filter(|&id| self.alive(id))
    }

    /// Every node slot (for the recency layer's lists, whose links the nodes carry).
    #[inline]
    pub(super) fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Every node slot, mutably: only the public link fields can be written through it.
    #[inline]
    pub(super) fn nodes_mut(&mut self) -> &mut [Node] {
        &mut self.nodes
    }

    /// The edge of `id`.
    #[inline]
    pub(super) fn edge(&self, id: NodeId) -> &[BlockHash] {
        let n = &self.nodes[id.index()];
        let start = n.edge_start as usize;
        &self.pool[start..start + n.edge_len as usize]
    }

    /// Allocates a leaf below `parent` (not yet linked: the shape layer attaches it) whose
    /// edge is `blocks` (non-empty), appended to the pool.
    pub(super) fn alloc_leaf(&mut self, parent: NodeId, blocks: &[BlockHash]) -> NodeId {
        self.make_room(blocks.len());
        let start = self.pool.len() as u32;
        self.pool.extend_from_slice(blocks);
        let depth = self.nodes[parent.index()].end() as u32;
        self.alloc(Node {
            parent,
            edge_start: start,
            edge_len: blocks.len() as u32,
            depth,
            last: blocks[blocks.len() - 1],
            ..Node::FREE
        })
    }

    /// Cuts the first `at` blocks (`0 < at < len`) of `id`'s edge off into a new node, which
    /// gets `id`'s holders, parent and stamp (the shape layer relinks it in `id`'s place);
    /// `id` keeps the rest. Returns the new, upper node.
    pub(super) fn split_edge(&mut self, id: NodeId, at: usize) -> NodeId {
        let n = self.nodes[id.index()];
        let at = at as u32;
        let upper = self.alloc(Node {
            parent: n.parent,
            stamp: n.stamp,
            edge_start: n.edge_start,
            edge_len: at,
            depth: n.depth,
            last: self.pool[(n.edge_start + at - 1) as usize],
            ..Node::FREE
        });
        let lower = &mut self.nodes[id.index()];
        lower.edge_start += at;
        lower.edge_len -= at;
        lower.depth += at;
        self.members.copy_node(id.index(), upper.index());
        upper
    }

    /// Appends `blocks` to the edge of `id`, moving the edge to the end of the pool first
    /// unless it is there already.
    pub(super) fn extend_edge(&mut self, id: NodeId, blocks: &[BlockHash]) {
        self.make_room(self.nodes[id.index()].len() + blocks.len());
        let n = self.nodes[id.index()];
        let (start, len) = (n.edge_start as usize, n.edge_len as usize);
        if start + len != self.pool.len() {
            let new_start = self.pool.len() as u32;
            self.pool.extend_from_within(start..start + len);
            self.garbage += len;
            self.nodes[id.index()].edge_start = new_start;
        }
        self.pool.extend_from_slice(blocks);
        let n = &mut self.nodes[id.index()];
        n.edge_len += blocks.len() as u32;
        n.last = blocks[blocks.len() - 1];
    }

    /// Drops the last `count` blocks (`count < len`) of `id`'s edge.
    pub(super) fn shorten_edge(&mut self, id: NodeId, count: usize) {
        let n = &mut self.nodes[id.index()];
        n.edge_len -= count as u32;
        n.last = self.pool[(n.edge_start + n.edge_len - 1) as usize];
        self.garbage += count;
    }

    /// Prepends the edge of `parent` to the edge of its only child `child`, which takes the
    /// parent's depth; the parent is left with an empty edge (the shape layer then frees it).
    pub(super) fn join_edges(&mut self, parent: NodeId, child: NodeId) {
        let (p, c) = (self.nodes[parent.index()], self.nodes[child.index()]);
        let len = p.edge_len + c.edge_len;
        let start = if p.edge_start + p.edge_len == c.edge_start {
            p.edge_start
        } else {
            self.make_room(len as usize);
            // (Re-read: making room may have moved the edges.)
            let (p, c) = (self.nodes[parent.index()], self.nodes[child.index()]);
            let start = self.pool.len() as u32;
            let (ps, cs) = (p.edge_start as usize, c.edge_start as usize);
            self.pool.extend_from_within(ps..ps + p.edge_len as usize);
            self.pool.extend_from_within(cs..cs + c.edge_len as usize);
            self.garbage += len as usize;
            start
        };
        let c = &mut self.nodes[child.index()];
        c.edge_start = start;
        c.edge_len = len;
        c.depth = p.depth;
        self.nodes[parent.index()].edge_len = 0;
    }

    fn alloc(&mut self, node: Node) -> NodeId {
        self.live += 1;
        if let Some(id) = self.free.pop() {
            self.nodes[id.index()] = node;
            return id;
        }
        let id = NodeId(u32::try_from(self.nodes.len()).unwrap_or(u32::MAX));
        self.nodes.push(node);
        self.members.push_node();
        id
    }

    /// Frees `id` (unlinked by the shape and recency layers); its edge becomes garbage.
    pub(super) fn free(&mut self, id: NodeId) {
        self.garbage += self.nodes[id.index()].len();
        self.nodes[id.index()] = Node::FREE;
        self.members.clear_node(id.index());
        self.free.push(id);
        self.live -= 1;
    }

    // ----- holders ------------------------------------------------------------------

    /// Makes room in every bitset for worker index `w`.
    pub(super) fn ensure_worker(&mut self, w: usize) {
        self.members.ensure_worker(self.nodes.len(), w);
    }

    /// The holder bitset of `id`.
    #[inline]
    pub(super) fn words(&self, id: NodeId) -> &[u64] {
        self.members.holders(id.index())
    }

    /// Whether worker `w` holds `id`.
    #[inline]
    pub(super) fn has_member(&self, id: NodeId, w: usize) -> bool {
        self.members.has(id.index(), w)
    }

    /// Makes `w` a holder of `id` (at the device tier) or not.
    #[inline]
    pub(super) fn set_member(&mut self, id: NodeId, w: usize, on: bool) {
        self.members.set(id.index(), w, on);
    }

    /// Whether blocks are held below the device tier anywhere (tier planes are kept).
    #[inline]
    pub(super) fn tiered(&self) -> bool {
        self.members.tiered()
    }

    /// The best tier index of holder `w` of `id` (0: device).
    #[inline]
    pub(super) fn best_tier(&self, id: NodeId, w: usize) -> u8 {
        self.members.best(id.index(), w)
    }

    /// Starts keeping tier planes (once any block is held below the device tier).
    pub(super) fn enable_tiers(&mut self) {
        self.members.enable_tiers(self.nodes.len());
    }

    /// Sets the best tier index of holder `w` of `id`, keeping tier planes from the first
    /// index above 0 on.
    #[inline]
    pub(super) fn set_best_tier(&mut self, id: NodeId, w: usize, tier: u8) {
        if tier > 0 && !self.members.tiered() {
            self.members.enable_tiers(self.nodes.len());
        }
        self.members.set_best(id.index(), w, tier);
    }

    /// Whether two nodes have the same holders at the same best tiers.
    #[inline]
    pub(super) fn same_members(&self, a: NodeId, b: NodeId) -> bool {
        self.members.same(a.index(), b.index())
    }

    /// Whether nobody holds `id`.
    #[inline]
    pub(super) fn unheld(&self, id: NodeId) -> bool {
        self.words(id).iter().all(|&word| word == 0)
    }

    /// Whether `w` is the only holder of `id`.
    #[inline]
    pub(super) fn only_holder(&self, id: NodeId, w: usize) -> bool {
        self.words(id)
            .iter()
            .enumerate()
            .all(|(i, &word)| word == if i == w / 64 { 1 << (w % 64) } else { 0 })
    }

    // ----- the pool -----------------------------------------------------------------

    /// Rewrites the edge pool when a third of it is garbage.
    pub(super) fn maybe_compact(&mut self) {
        let live = self.pool.len() - self.garbage;
        if self.garbage >= 4096 && self.garbage >= live / 2 {
            self.compact(0);
        }
    }

    /// Before `additional` blocks are appended to the pool: when they would make it grow, it
    /// is rewritten without its garbage, with half the live blocks to spare.
    fn make_room(&mut self, additional: usize) {
        if self.pool.len() + additional > self.pool.capacity() {
            self.compact(additional);
        }
    }

    /// Rewrites the edge pool without garbage, in place: each live edge slides down to the
    /// end of the one before it in the pool (edges below the first garbage stay). The pool
    /// then has room for the live blocks, half as many more (at least 64) and `additional`;
    /// it is reallocated only to grow to that, or to shrink to it from more than twice as
    /// much, so a tree of steady size rewrites its pool in the same allocation.
    fn compact(&mut self, additional: usize) {
        let mut edges: Vec<(u32, NodeId)> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].edge_len > 0)
            .map(|i| (self.nodes[i].edge_start, NodeId(i as u32)))
            .collect();
        sort_by_start(&mut edges, self.pool.len());
        let mut end = 0;
        for (start, id) in edges {
            let (start, len) = (start as usize, self.nodes[id.index()].len());
            // Edges below the first garbage stay where they are.
            if start != end {
                self.pool.copy_within(start..start + len, end);
                self.nodes[id.index()].edge_start = end as u32;
            }
            end += len;
        }
        self.pool.truncate(end);
        self.garbage = 0;
        let room = end + (end / 2).max(64) + additional;
        if self.pool.capacity() < room {
            self.pool.reserve_exact(room - end);
        } else if self.pool.capacity() > 2 * room {
            self.pool.shrink_to(room);
        }
    }

    /// The pool's capacity in blocks.
    #[cfg(test)]
    pub(super) fn pool_capacity(&self) -> usize {
        self.pool.capacity()
    }

    /// Bytes allocated.
    pub(super) fn memory_bytes(&self) -> usize {
        use core::mem::size_of;
        self.nodes.capacity() * size_of::<Node>()
            + self.free.capacity() * size_of::<NodeId>()
            + self.pool.capacity() * size_of::<BlockHash>()
            + self.members.memory_bytes()
    }

    /// The arena's invariants: counts, edges inside the pool, `last` copies, the pool's
    /// accounting, free nodes unheld.
    pub(super) fn validate(&self) -> Result<(), String> {
        let mut live = 1;
        let mut blocks = 0;
        for id in self.live_ids() {
            let n = &self.nodes[id.index()];
            live += 1;
            blocks += n.len();
            if n.edge_len == 0 || (n.edge_start + n.edge_len) as usize > self.pool.len() {
                return Err(format!("node {id:?}: empty or out-of-pool edge"));
            }
            if self.edge(id).last() != Some(&n.last) {
                return Err(format!("node {id:?}: stale copy of the edge's last block"));
            }
        }
        if self.nodes[0].edge_len != 0 || !self.unheld(NodeId::ROOT) {
            return Err("the root holds blocks".into());
        }
        if live != self.live || self.live + self.free.len() != self.nodes.len() {
            return Err("node counts disagree".into());
        }
        if self.free.iter().any(|&id| !self.unheld(id)) {
            return Err("a free node has holders".into());
        }
        if blocks + self.garbage != self.pool.len() {
            return Err(format!(
                "{blocks} blocks in edges, pool {} with {} garbage",
                self.pool.len(),
                self.garbage
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The radix sort orders edges as a comparison sort does, over one pass and several.
        #[test]
        fn sort_by_start_agrees_with_a_comparison_sort(
            starts in proptest::collection::hash_set(0u32..(1 << 24), 0..300),
            small in any::<bool>(),
        ) {
            let bound = if small { 1 << 11 } else { 1 << 24 };
            let mut edges: Vec<(u32, NodeId)> = starts
                .iter()
                .map(|&s| (s % bound, NodeId(s)))
                .collect::<std::collections::HashMap<_, _>>()
                .into_iter()
                .collect();
            let mut expected = edges.clone();
            expected.sort_unstable();
            sort_by_start(&mut edges, bound as usize);
            prop_assert_eq!(edges, expected);
        }
    }
}
