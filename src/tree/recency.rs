//! Recency: which worker holds which node since when, in least-recently-used order.
//!
//! A **holding** is one worker's hold on one node, with the logical time (**stamp**) of
//! that worker's last insert or touch through the node, and the set of storage **tiers** it
//! holds the node's blocks at. Each worker's holdings form a list,
//! least recent first; all live nodes form one global list by their own stamp (the most
//! recent over their holders). Invariants, after every tree operation:
//!
//! - a holding exists exactly where the node's holder bit is set;
//! - both kinds of list are ordered by stamp, and among equal stamps deepest first, so a
//!   list's head is never the parent of a node that is still held (it has no held child);
//! - a holding is never more recent than its node, nor than its holder's holding of the
//!   parent; so eviction from a list's head removes leaves;
//! - a worker's `blocks` is the sum of the edges it holds, at most its capacity;
//! - a holding's tier set is never empty, holds no tier its holder's holding of the parent
//!   lacks (each tier's blocks are a prefix), and its best tier is the one the arena's tier
//!   planes record.
//!
//! This layer only chooses what to evict (the victims); the shape layer removes it.

use super::arena::{Arena, NodeId, bits};
use super::tier::{Tier, TierSet};
use crate::fold::FoldMap;
use crate::list::{self, List, Slot, is_linked, link_after, link_before, unlink};

/// A holding: an index into the recency layer's holding arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct HoldingId(u32);

impl Slot for HoldingId {
    const NONE: HoldingId = HoldingId(u32::MAX);
    #[inline]
    fn index(self) -> usize {
        self.0 as usize
    }
}

/// One worker's hold on one node, linked into that worker's list.
#[derive(Clone, Copy, Debug)]
struct Holding {
    /// `NONE` while the slot is free.
    node: NodeId,
    /// The worker index (below `RadixTree::MAX_WORKERS`, so it fits).
    worker: u16,
    /// The tiers the worker holds the node's blocks at.
    tiers: TierSet,
    prev: HoldingId,
    next: HoldingId,
    stamp: u64,
}

crate::list::linked!(Holding, HoldingId, prev, next);

#[derive(Clone, Copy, Debug)]
struct WorkerState {
    /// Blocks held.
    blocks: usize,
    /// Capacity in blocks (`usize::MAX`: unbounded).
    capacity: usize,
    /// Holdings, least recent (and deepest among equals) at the head.
    list: List<HoldingId>,
    holdings: usize,
}

impl WorkerState {
    const NEW: WorkerState = WorkerState {
        blocks: 0,
        capacity: usize::MAX,
        list: List::EMPTY,
        holdings: 0,
    };
}

/// An insert's refresh cursor: its time and the anchors its refreshes link before (the
/// node and the holding refreshed last, one level up), so that a path refreshed root first
/// ends up deepest first in every list.
#[derive(Clone, Copy, Debug)]
pub(super) struct Cursor {
    now: u64,
    node: NodeId,
    holding: HoldingId,
}

/// What [`Recency::release`] left of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Left {
    /// Other workers still hold it.
    Held,
    /// Nobody holds it: the caller deletes it.
    Unheld,
    /// The worker did not hold it.
    Untouched,
}

/// Holdings, per-worker lists and the global list.
#[derive(Clone, Debug, Default)]
pub(super) struct Recency {
    holdings: Vec<Holding>,
    free: Vec<HoldingId>,
    /// (node << 32 | worker) → holding.
    index: FoldMap<u64, HoldingId>,
    workers: Vec<WorkerState>,
    /// Every live node but the root, least recent (and deepest among equals) first.
    lru: List<NodeId>,
    clock: u64,
}

#[inline]
fn key(node: NodeId, w: usize) -> u64 {
    (u64::from(node.get()) << 32) | w as u64
}

impl Recency {
    /// The logical clock: it advances by one with every insert.
    pub(super) fn clock(&self) -> u64 {
        self.clock
    }

    /// Starts an insert: advances the clock.
    pub(super) fn start(&mut self) -> Cursor {
        self.clock += 1;
        Cursor {
            now: self.clock,
            node: NodeId::NONE,
            holding: HoldingId::NONE,
        }
    }

    /// Registers worker index `w` if needed.
    pub(super) fn ensure_worker(&mut self, w: usize) {
        if w >= self.workers.len() {
            self.workers.resize(w + 1, WorkerState::NEW);
        }
    }

    /// Whether worker index `w` was ever registered.
    #[inline]
    pub(super) fn knows(&self, w: usize) -> bool {
        w < self.workers.len()
    }

    /// Forgets worker `w`'s capacity (its holdings must be gone).
    pub(super) fn reset_worker(&mut self, w: usize) {
        if let Some(state) = self.workers.get_mut(w) {
            *state = WorkerState::NEW;
        }
    }

    pub(super) fn set_capacity(&mut self, w: usize, blocks: usize) {
        self.workers[w].capacity = blocks;
    }

    pub(super) fn capacity(&self, w: usize) -> usize {
        self.workers.get(w).map_or(usize::MAX, |s| s.capacity)
    }

    pub(super) fn blocks_of(&self, w: usize) -> usize {
        self.workers.get(w).map_or(0, |s| s.blocks)
    }

    /// The holding of `node` by `w`.
    #[inline]
    fn holding(&self, node: NodeId, w: usize) -> Option<HoldingId> {
        self.index.get(&key(node, w)).copied()
    }

    /// Makes `node` most recently used for `w` at the cursor's time, held at `tier` too:
    /// adds `w` as a holder if it was not one (setting its holder bit), and links the node
    /// and the holding just before the cursor's anchors, which then move to them.
    pub(super) fn refresh(
        &mut self,
        arena: &mut Arena,
        cursor: &mut Cursor,
        node: NodeId,
        w: usize,
        tier: Tier,
    ) {
        arena[node].stamp = cursor.now;
        let linked = is_linked(arena.nodes_mut(), &self.lru, node);
        // Already just before the anchor (a chain's nodes refreshed again by its next
        // store): the list stays as it is.
        if !(linked && arena[node].lru_next == cursor.node) {
            if linked {
                unlink(arena.nodes_mut(), &mut self.lru, node);
            }
            link_before(arena.nodes_mut(), &mut self.lru, node, cursor.node);
        }
        cursor.node = node;

        let h = match self.holding(node, w) {
            Some(h) => {
                self.holdings[h.index()].stamp = cursor.now;
                let tiers = self.holdings[h.index()].tiers;
                if !tiers.contains(tier) {
                    self.set_tiers(arena, h, tiers.with(tier));
                }
                if self.holdings[h.index()].next == cursor.holding {
                    cursor.holding = h;
                    return;
                }
                unlink(&mut self.holdings, &mut self.workers[w].list, h);
                h
            }
            None => {
                let h = self.new_holding(node, w, cursor.now, TierSet::of(tier));
                arena.set_member(node, w, true);
                if tier != Tier::Device {
                    arena.set_best_tier(node, w, tier.index() as u8);
                }
                self.workers[w].blocks += arena[node].len();
                h
            }
        };
        link_before(
            &mut self.holdings,
            &mut self.workers[w].list,
            h,
            cursor.holding,
        );
        cursor.holding = h;
    }

    /// `w`, the only holder of a leaf, holds `count` more blocks on it.
    pub(super) fn grow(&mut self, w: usize, count: usize) {
        self.workers[w].blocks += count;
    }

    /// `w` holds `count` fewer blocks of a node it keeps holding.
    pub(super) fn shrink(&mut self, w: usize, count: usize) {
        self.workers[w].blocks -= count;
    }

    /// Sets holding `h`'s tiers (not empty) and its node's tier planes.
    fn set_tiers(&mut self, arena: &mut Arena, h: HoldingId, tiers: TierSet) {
        let holding = &mut self.holdings[h.index()];
        holding.tiers = tiers;
        let (node, w) = (holding.node, usize::from(holding.worker));
        if tiers != TierSet::of(Tier::Device) {
            // A tier below the device: from now on holdings are not all device-only.
            arena.enable_tiers();
        }
        if arena.best_tier(node, w) != tiers.best_index() {
            arena.set_best_tier(node, w, tiers.best_index());
        }
    }

    /// The tiers `w` holds `node` at (`None`: it does not hold it).
    #[inline]
    pub(super) fn tiers(&self, node: NodeId, w: usize) -> Option<TierSet> {
        self.holding(node, w)
            .map(|h| self.holdings[h.index()].tiers)
    }

    /// `w` keeps holding `node` at `tiers` (not empty) instead.
    pub(super) fn retier(&mut self, arena: &mut Arena, node: NodeId, w: usize, tiers: TierSet) {
        if let Some(h) = self.holding(node, w) {
            self.set_tiers(arena, h, tiers);
        }
    }

    fn new_holding(&mut self, node: NodeId, w: usize, stamp: u64, tiers: TierSet) -> HoldingId {
        let holding = Holding {
            node,
            worker: w as u16,
            tiers,
            prev: HoldingId::NONE,
            next: HoldingId::NONE,
            stamp,
        };
        let h = if let Some(h) = self.free.pop() {
            self.holdings[h.index()] = holding;
            h
        } else {
            self.holdings.push(holding);
            HoldingId((self.holdings.len() - 1) as u32)
        };
        self.index.insert(key(node, w), h);
        self.workers[w].holdings += 1;
        h
    }

    fn free_holding(&mut self, h: HoldingId) {
        let Holding { node, worker, .. } = self.holdings[h.index()];
        let w = usize::from(worker);
        unlink(&mut self.holdings, &mut self.workers[w].list, h);
        self.index.remove(&key(node, w));
        self.holdings[h.index()].node = NodeId::NONE;
        self.free.push(h);
        self.workers[w].holdings -= 1;
    }

    /// `upper` was split off above `lower` (same holders, same stamp): it gets a holding per
    /// holder with the same stamp, and goes right after `lower` in every list, being
    /// shallower.
    pub(super) fn split(&mut self, arena: &mut Arena, lower: NodeId, upper: NodeId) {
        for w in bits(arena.words(lower)).collect::<smallvec::SmallVec<[usize; 16]>>() {
            if let Some(h) = self.holding(lower, w) {
                let Holding { stamp, tiers, .. } = self.holdings[h.index()];
                let hu = self.new_holding(upper, w, stamp, tiers);
                link_after(&mut self.holdings, &mut self.workers[w].list, hu, h);
            }
        }
        link_after(arena.nodes_mut(), &mut self.lru, upper, lower);
    }

    /// Whether `parent` and its only child have the same holders with the same stamps and
    /// tiers, so that the split between them is no longer needed.
    pub(super) fn same(&self, arena: &Arena, parent: NodeId, child: NodeId) -> bool {
        if !arena.same_members(parent, child) {
            return false;
        }
        bits(arena.words(parent)).all(
            |w| match (self.holding(parent, w), self.holding(child, w)) {
                (Some(hp), Some(hc)) => {
                    let (p, c) = (&self.holdings[hp.index()], &self.holdings[hc.index()]);
                    p.stamp == c.stamp && p.tiers == c.tiers
                }
                _ => false,
            },
        )
    }

    /// `child` absorbs its parent (whose holdings go; the child's are next to them in every
    /// list) and takes the parent's, shallower, place in the global list.
    pub(super) fn merge(&mut self, arena: &mut Arena, parent: NodeId, child: NodeId) {
        arena[child].stamp = arena[child].stamp.max(arena[parent].stamp);
        for w in bits(arena.words(parent)).collect::<smallvec::SmallVec<[usize; 16]>>() {
            if let Some(h) = self.holding(parent, w) {
                self.free_holding(h);
            }
        }
        unlink(arena.nodes_mut(), &mut self.lru, child);
        link_after(arena.nodes_mut(), &mut self.lru, child, parent);
        unlink(arena.nodes_mut(), &mut self.lru, parent);
    }

    /// `w` stops holding `node` (which must hold no child `w` holds): its holding and holder
    /// bit go, and its blocks leave `w`'s count.
    pub(super) fn release(&mut self, arena: &mut Arena, node: NodeId, w: usize) -> Left {
        let Some(h) = self.holding(node, w) else {
            return Left::Untouched;
        };
        self.free_holding(h);
        arena.set_member(node, w, false);
        self.workers[w].blocks -= arena[node].len();
        if arena.unheld(node) {
            Left::Unheld
        } else {
            Left::Held
        }
    }

    /// Takes a node nobody holds out of the global list (it is being deleted).
    pub(super) fn forget(&mut self, arena: &mut Arena, node: NodeId) {
        unlink(arena.nodes_mut(), &mut self.lru, node);
    }

    // ----- victims ------------------------------------------------------------------

    /// When `w` holds more than its capacity: its least recent node and how many blocks
    /// must go.
    pub(super) fn over_capacity(&self, w: usize) -> Option<(NodeId, usize)> {
        let state = self.workers.get(w)?;
        if state.blocks <= state.capacity {
            return None;
        }
        let h = state.list.first()?;
        Some((self.holdings[h.index()].node, state.blocks - state.capacity))
    }

    /// The globally least recent node.
    pub(super) fn oldest(&self) -> Option<NodeId> {
        self.lru.first()
    }

    /// `w`'s least recent node, if `w` last refreshed it before time `before`.
    pub(super) fn older_than(&self, w: usize, before: u64) -> Option<NodeId> {
        let h = self.workers.get(w)?.list.first()?;
        let holding = &self.holdings[h.index()];
        (holding.stamp < before).then_some(holding.node)
    }

    /// `w`'s least recent node.
    pub(super) fn least_recent(&self, w: usize) -> Option<NodeId> {
        self.older_than(w, u64::MAX)
    }

    /// Worker indices ever registered.
    pub(super) fn workers(&self) -> core::ops::Range<usize> {
        0..self.workers.len()
    }

    /// The nodes `w` holds, least recent first.
    pub(super) fn nodes_of(&self, w: usize) -> impl Iterator<Item = NodeId> + '_ {
        let mut h = self.workers.get(w).map_or(HoldingId::NONE, |s| s.list.head);
        core::iter::from_fn(move || {
            let holding = self.holdings.get(h.index())?;
            h = holding.next;
            Some(holding.node)
        })
    }

    /// Bytes allocated.
    pub(super) fn memory_bytes(&self) -> usize {
        use core::mem::size_of;
        self.holdings.capacity() * size_of::<Holding>()
            + self.free.capacity() * size_of::<HoldingId>()
            + self.index.allocation_size()
            + self.workers.capacity() * size_of::<WorkerState>()
    }

    /// This layer's invariants (see the module docs) over the arena's live nodes.
    pub(super) fn validate(&self, arena: &Arena) -> Result<(), String> {
        let mut holders = 0;
        for id in arena.live_ids() {
            let n = &arena[id];
            if n.parent != NodeId::ROOT && arena[n.parent].stamp < n.stamp {
                return Err(format!("node {id:?} is more recent than its parent"));
            }
            for w in bits(arena.words(id)) {
                holders += 1;
                let Some(h) = self.holding(id, w) else {
                    return Err(format!("node {id:?}: worker {w} has no holding"));
                };
                let holding = &self.holdings[h.index()];
                if holding.node != id || usize::from(holding.worker) != w {
                    return Err(format!("holding {h:?}: wrong node or worker"));
                }
                if holding.tiers.is_empty() || arena.best_tier(id, w) != holding.tiers.best_index()
                {
                    return Err(format!(
                        "node {id:?}: worker {w} has no tier or a wrong best tier"
                    ));
                }
                if holding.stamp > n.stamp {
                    return Err(format!("node {id:?}: holding more recent than the node"));
                }
                if n.parent != NodeId::ROOT {
                    let parent = self.holding(n.parent, w).map(|p| self.holdings[p.index()]);
                    if parent.is_none_or(|p| p.stamp < holding.stamp) {
                        return Err(format!("node {id:?}: worker {w} more recent than parent"));
                    }
                    if parent.is_some_and(|p| !holding.tiers.within(p.tiers)) {
                        return Err(format!(
                            "node {id:?}: worker {w} at a tier the parent lacks"
                        ));
                    }
                }
            }
        }
        let live_holdings = self.holdings.len() - self.free.len();
        if holders != self.index.len() || holders != live_holdings {
            return Err("holding counts disagree".into());
        }
        let listed = list::check(
            arena.nodes(),
            &self.lru,
            |n| arena.alive(n) && n != NodeId::ROOT,
            |n| (arena[n].stamp, core::cmp::Reverse(arena[n].depth())),
        )
        .map_err(|e| format!("global LRU: {e}"))?;
        if listed + 1 != arena.live() {
            return Err(format!(
                "global LRU lists {listed} of {} nodes",
                arena.live() - 1
            ));
        }
        for (w, state) in self.workers.iter().enumerate() {
            self.validate_worker(arena, w, state)?;
        }
        Ok(())
    }

    fn validate_worker(&self, arena: &Arena, w: usize, state: &WorkerState) -> Result<(), String> {
        let listed = list::check(
            &self.holdings,
            &state.list,
            |h| {
                let holding = &self.holdings[h.index()];
                holding.node != NodeId::NONE && usize::from(holding.worker) == w
            },
            |h| {
                let holding = &self.holdings[h.index()];
                (
                    holding.stamp,
                    core::cmp::Reverse(arena[holding.node].depth()),
                )
            },
        )
        .map_err(|e| format!("worker {w} LRU: {e}"))?;
        let held: usize = self.nodes_of(w).map(|n| arena[n].len()).sum();
        if listed != state.holdings || held != state.blocks {
            return Err(format!("worker {w}: counts disagree with its list"));
        }
        if state.blocks > state.capacity {
            return Err(format!("worker {w}: above its capacity"));
        }
        Ok(())
    }
}
