//! Shape: how nodes hang together, and every change to it (attach, detach, new leaves, leaf
//! extension, split, merge, trim, drop).
//!
//! Invariants, after every tree operation:
//!
//! - the child map holds `(parent, first block of the child's edge) → child` for every live
//!   node, and each parent's child list holds the same children, with back links;
//! - edges are compressed: no node has a single child with the same holders and the same
//!   stamps (it would be merged), so a node ends where prefixes diverge or holders differ;
//! - holders shrink from root to leaf: a holder of a node holds its parent;
//! - a node is held by someone, or deleted.
//!
//! Changes go through [`Edit`], a view over the lower layers (arena, recency, last-block
//! index) and this layer's state, so that each change keeps all of them in step. Merges are
//! queued by the changes and run once at the end of an operation ([`Edit::finish_merges`]).

use smallvec::SmallVec;

use super::arena::{Arena, NodeId, bits};
use super::position::LastBlocks;
use super::recency::{Left, Recency};
use super::tier::Tier;
use crate::fold::FoldMap;
use crate::hash::BlockHash;
use crate::list::Slot;

/// Key of the child map: a parent and the first block of the child's edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ChildKey {
    parent: NodeId,
    first: BlockHash,
}

impl core::hash::Hash for ChildKey {
    #[inline]
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        // One word: the block is already a hash; the parent spreads it per subtree.
        state.write_u64(
            self.first.get() ^ u64::from(self.parent.get()).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
    }
}

#[inline]
fn child_key(parent: NodeId, first: BlockHash) -> ChildKey {
    ChildKey { parent, first }
}

/// The child map and the queue of merges to check.
#[derive(Clone, Debug, Default)]
pub(super) struct Shape {
    children: FoldMap<ChildKey, NodeId>,
    /// Nodes whose merge with their only child must be checked once the operation is done.
    merges: Vec<NodeId>,
}

impl Shape {
    /// The child of `parent` whose edge starts with `first`.
    #[inline]
    pub(super) fn child(&self, arena: &Arena, parent: NodeId, first: BlockHash) -> Option<NodeId> {
        if arena[parent].is_leaf() {
            // A leaf (a chain growing on one worker): no map lookup.
            return None;
        }
        self.children.get(&child_key(parent, first)).copied()
    }

    /// Bytes allocated.
    pub(super) fn memory_bytes(&self) -> usize {
        self.children.allocation_size() + self.merges.capacity() * core::mem::size_of::<NodeId>()
    }

    /// This layer's invariants (see the module docs).
    pub(super) fn validate(&self, arena: &Arena, recency: &Recency) -> Result<(), String> {
        let mut links = 0;
        for id in core::iter::once(NodeId::ROOT).chain(arena.live_ids()) {
            let mut prev = NodeId::NONE;
            let mut c = arena[id].first_child;
            while c != NodeId::NONE {
                let child = &arena[c];
                if child.parent != id || child.prev_sibling != prev {
                    return Err(format!("node {c:?}: bad parent/sibling links under {id:?}"));
                }
                links += 1;
                prev = c;
                c = child.next_sibling;
            }
            if id != NodeId::ROOT {
                self.validate_node(arena, recency, id)?;
            }
        }
        let live = arena.live() - 1;
        if links != live || self.children.len() != live {
            return Err(format!(
                "{live} nodes, {links} child links, {} map entries",
                self.children.len()
            ));
        }
        Ok(())
    }

    fn validate_node(&self, arena: &Arena, recency: &Recency, id: NodeId) -> Result<(), String> {
        let n = &arena[id];
        if !arena.alive(n.parent) || n.depth() != arena[n.parent].end() {
            return Err(format!("node {id:?}: dead parent or wrong depth"));
        }
        if self.child(arena, n.parent, arena.edge(id)[0]) != Some(id) {
            return Err(format!("node {id:?}: missing from the child map"));
        }
        if arena.unheld(id) {
            return Err(format!("node {id:?}: held by nobody"));
        }
        let outside = |(&c, &p): (&u64, &u64)| c & !p != 0;
        if n.parent != NodeId::ROOT
            && arena
                .words(id)
                .iter()
                .zip(arena.words(n.parent))
                .any(outside)
        {
            return Err(format!("node {id:?}: a holder does not hold the parent"));
        }
        if mergeable(arena, recency, id).is_some() {
            return Err(format!("node {id:?}: could be merged with its only child"));
        }
        Ok(())
    }
}

/// The only child of `parent` when the split between them is no longer needed (same holders,
/// same stamps).
fn mergeable(arena: &Arena, recency: &Recency, parent: NodeId) -> Option<NodeId> {
    let child = arena[parent].first_child;
    if child == NodeId::NONE || arena[child].next_sibling != NodeId::NONE {
        return None;
    }
    recency.same(arena, parent, child).then_some(child)
}

/// A view for changing the tree's shape, keeping every lower layer in step.
pub(super) struct Edit<'t> {
    pub(super) arena: &'t mut Arena,
    pub(super) recency: &'t mut Recency,
    pub(super) ends: &'t mut LastBlocks,
    pub(super) shape: &'t mut Shape,
}

impl Edit<'_> {
    /// Links `child` (whose `parent` field is set) into its parent's child list and map.
    fn attach(&mut self, parent: NodeId, child: NodeId) {
        let first = self.arena.edge(child)[0];
        self.shape.children.insert(child_key(parent, first), child);
        let old_first = self.arena[parent].first_child;
        let c = &mut self.arena[child];
        c.parent = parent;
        c.prev_sibling = NodeId::NONE;
        c.next_sibling = old_first;
        if old_first != NodeId::NONE {
            self.arena[old_first].prev_sibling = child;
        }
        self.arena[parent].first_child = child;
    }

    /// Unlinks `child` from its parent's child list and map.
    fn detach(&mut self, child: NodeId) {
        let c = self.arena[child];
        let first = self.arena.edge(child)[0];
        self.shape.children.remove(&child_key(c.parent, first));
        if c.prev_sibling == NodeId::NONE {
            self.arena[c.parent].first_child = c.next_sibling;
        } else {
            self.arena[c.prev_sibling].next_sibling = c.next_sibling;
        }
        if c.next_sibling != NodeId::NONE {
            self.arena[c.next_sibling].prev_sibling = c.prev_sibling;
        }
        let c = &mut self.arena[child];
        c.prev_sibling = NodeId::NONE;
        c.next_sibling = NodeId::NONE;
    }

    /// Hangs a new leaf with edge `blocks` (non-empty) under `parent`; nobody holds it yet.
    pub(super) fn new_leaf(&mut self, parent: NodeId, blocks: &[BlockHash]) -> NodeId {
        let leaf = self.arena.alloc_leaf(parent, blocks);
        self.attach(parent, leaf);
        self.ends.note_end(self.arena, leaf);
        leaf
    }

    /// Whether `node` is a leaf that `w` alone holds at exactly `tier`, so that blocks
    /// inserted below it for `w` at `tier` extend its edge instead of hanging a new leaf.
    pub(super) fn extendable(&self, node: NodeId, w: usize, tier: Tier) -> bool {
        node != NodeId::ROOT
            && self.arena[node].is_leaf()
            && self.arena.only_holder(node, w)
            // Without tier planes every holding is at the device tier alone.
            && if self.arena.tiered() {
                self.recency.tiers(node, w) == Some(super::tier::TierSet::of(tier))
            } else {
                tier == Tier::Device
            }
    }

    /// Appends `blocks` to the edge of `node`, an [extendable](Self::extendable) leaf of `w`.
    pub(super) fn extend_leaf(&mut self, node: NodeId, w: usize, blocks: &[BlockHash]) {
        self.arena.extend_edge(node, blocks);
        self.ends.note_end(self.arena, node);
        self.recency.grow(w, blocks.len());
    }

    /// Splits `node` after `at` blocks (`0 < at < len`). The upper part gets a new id and
    /// takes the node's place; the lower part keeps the id (and so its children, holdings
    /// and map entries). Returns the upper part.
    pub(super) fn split(&mut self, node: NodeId, at: usize) -> NodeId {
        let n = self.arena[node];
        let upper = self.arena.split_edge(node, at);
        // The upper part takes the node's place among its siblings and in the map.
        {
            let u = &mut self.arena[upper];
            u.first_child = node;
            u.next_sibling = n.next_sibling;
            u.prev_sibling = n.prev_sibling;
        }
        if n.prev_sibling == NodeId::NONE {
            self.arena[n.parent].first_child = upper;
        } else {
            self.arena[n.prev_sibling].next_sibling = upper;
        }
        if n.next_sibling != NodeId::NONE {
            self.arena[n.next_sibling].prev_sibling = upper;
        }
        let first = self.arena.edge(upper)[0];
        self.shape
            .children
            .insert(child_key(n.parent, first), upper);
        // The node becomes the upper part's only child.
        let lower = &mut self.arena[node];
        lower.parent = upper;
        lower.next_sibling = NodeId::NONE;
        lower.prev_sibling = NodeId::NONE;
        let lower_first = self.arena.edge(node)[0];
        self.shape
            .children
            .insert(child_key(upper, lower_first), node);
        self.recency.split(self.arena, node, upper);
        self.ends.note_end(self.arena, upper);
        upper
    }

    /// Queues `node` for a merge check at the end of the operation.
    #[inline]
    pub(super) fn queue_merge(&mut self, node: NodeId) {
        self.shape.merges.push(node);
    }

    /// Runs the merge checks queued by the operation.
    pub(super) fn finish_merges(&mut self) {
        while let Some(node) = self.shape.merges.pop() {
            if node != NodeId::ROOT && self.arena.alive(node) {
                self.try_merge(node);
            }
        }
    }

    /// Merges `parent` into its only child when the split is no longer needed. The child's id
    /// survives, so its children, map entries and holdings stay as they are.
    fn try_merge(&mut self, parent: NodeId) {
        let Some(child) = mergeable(self.arena, self.recency, parent) else {
            return;
        };
        let grandparent = self.arena[parent].parent;
        // The child takes the parent's place among the grandparent's children.
        self.detach(child);
        self.detach(parent);
        self.arena.join_edges(parent, child);
        self.attach(grandparent, child);
        self.recency.merge(self.arena, parent, child);
        self.arena.free(parent);
        self.shape.merges.push(grandparent);
    }

    /// `w` stops holding `node`, which must hold no child `w` holds. Deletes the node when
    /// nobody holds it any more.
    pub(super) fn remove_holder(&mut self, node: NodeId, w: usize) {
        match self.recency.release(self.arena, node, w) {
            Left::Unheld => self.delete(node),
            Left::Held => self.shape.merges.push(node),
            Left::Untouched => {}
        }
    }

    /// Deletes a node nobody holds (and which therefore has no children).
    fn delete(&mut self, node: NodeId) {
        let parent = self.arena[node].parent;
        self.detach(node);
        self.recency.forget(self.arena, node);
        self.arena.free(node);
        self.shape.merges.push(parent);
    }

    /// `w` drops the last `count` blocks of `node` (which must hold no child `w` holds).
    pub(super) fn trim(&mut self, node: NodeId, w: usize, count: usize) {
        let len = self.arena[node].len();
        if count >= len {
            self.remove_holder(node, w);
        } else if self.arena[node].is_leaf() && self.arena.only_holder(node, w) {
            self.arena.shorten_edge(node, count);
            self.ends.note_end(self.arena, node);
            self.recency.shrink(w, count);
        } else {
            self.split(node, len - count);
            self.remove_holder(node, w);
        }
    }

    /// `w` drops blocks `offset..` of `node` and everything it holds below it.
    pub(super) fn drop_from(&mut self, w: usize, node: NodeId, offset: usize) {
        if !self.arena[node].is_leaf() {
            self.drop_below(w, node);
        }
        let len = self.arena[node].len();
        self.trim(node, w, len - offset);
    }

    /// Drops `w` from every node below `node` (deepest first).
    fn drop_below(&mut self, w: usize, node: NodeId) {
        let mut order = self.held_post_order(w, node);
        order.pop(); // `node` itself
        for n in order {
            self.remove_holder(n, w);
        }
    }

    /// `node` and every node below it that `w` holds, each after its children (holders
    /// shrink from root to leaf, so the walk is pruned where `w` holds nothing).
    fn held_post_order(&self, w: usize, node: NodeId) -> SmallVec<[NodeId; 8]> {
        let mut order: SmallVec<[NodeId; 8]> = SmallVec::new();
        let mut stack: SmallVec<[(NodeId, bool); 8]> = smallvec::smallvec![(node, false)];
        while let Some((n, expanded)) = stack.pop() {
            if expanded {
                order.push(n);
                continue;
            }
            stack.push((n, true));
            let mut c = self.arena[n].first_child;
            while c != NodeId::NONE {
                if self.arena.has_member(c, w) {
                    stack.push((c, false));
                }
                c = self.arena[c].next_sibling;
            }
        }
        order
    }

    /// `w` stops holding, at `tier`, blocks `offset..` of `node` and every block below them;
    /// a block then held at no tier is dropped.
    pub(super) fn drop_tier_from(&mut self, w: usize, node: NodeId, offset: usize, tier: Tier) {
        if offset > 0 {
            // The node keeps its id for the part from `offset` on.
            self.split(node, offset);
        }
        for n in self.held_post_order(w, node) {
            self.untier(n, w, tier);
        }
    }

    /// `w` stops holding anything at `tier`.
    pub(super) fn drop_tier_everywhere(&mut self, w: usize, tier: Tier) {
        let mut held: Vec<NodeId> = self.recency.nodes_of(w).collect();
        // Deepest first, so that a node dropped holds no child `w` still holds.
        held.sort_unstable_by_key(|&n| core::cmp::Reverse(self.arena[n].depth()));
        for n in held {
            self.untier(n, w, tier);
        }
    }

    /// `w` stops holding `n` at `tier`; with no tier left, it stops holding `n` (which must
    /// hold no child `w` holds).
    fn untier(&mut self, n: NodeId, w: usize, tier: Tier) {
        let Some(tiers) = self.recency.tiers(n, w) else {
            return;
        };
        if !tiers.contains(tier) {
            return;
        }
        let left = tiers.without(tier);
        if left.is_empty() {
            self.remove_holder(n, w);
        } else {
            self.recency.retier(self.arena, n, w, left);
            let parent = self.arena[n].parent;
            self.shape.merges.extend([n, parent]);
        }
    }

    /// Every holder drops `node`, a node none of them holds a child of (the global list's
    /// head).
    pub(super) fn drop_node(&mut self, node: NodeId) -> bool {
        let holders: SmallVec<[usize; 16]> = bits(self.arena.words(node)).collect();
        for &w in &holders {
            self.remove_holder(node, w);
        }
        !holders.is_empty()
    }
}
