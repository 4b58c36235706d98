//! [`RadixTree`]: the layers composed, and the tree's operations.

use super::arena::{Arena, NodeId};
use super::position::{LastBlocks, Position};
use super::recency::{Cursor, Recency};
use super::search::{Held, Search};
use super::shape::{Edit, Shape};
use super::{PrefixMatch, Tier, TierSet, WorkerId};
use crate::error::Error;
use crate::hash::BlockHash;

/// Memory bounds of a [`RadixTree`], applied to all workers together.
///
/// Past either bound the tree evicts whole leaves in global least-recently-used order, so
/// total memory stays bounded however many distinct prompts arrive. Memory is about 8 bytes
/// per block plus about 110 bytes per node and 45 bytes per (node, holder) pair (a node is
/// a run of blocks that the same workers hold); `benches/README.md` has measured figures.
///
/// ```
/// use prefix_router::{RadixTree, TreeConfig};
///
/// let config = TreeConfig::default().with_max_blocks(1 << 20).with_chained(true);
/// let tree = RadixTree::with_config(config)?;
/// assert_eq!(tree.config().max_blocks, 1 << 20);
/// assert!(RadixTree::with_config(TreeConfig::default().with_max_nodes(0)).is_err());
/// # Ok::<(), prefix_router::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TreeConfig {
    /// Most distinct blocks held at once, at least 1. Default 4,194,304 (2^22: 67M tokens at
    /// block size 16).
    pub max_blocks: usize,
    /// Most nodes at once, at least 1. Default 262,144 (2^18).
    pub max_nodes: usize,
    /// Set when every block run given to the tree is a chain from a
    /// [`PrefixHasher`](crate::PrefixHasher), so that a block hash names its whole prefix:
    /// then an edge is compared with a query by its last block and a binary search for the
    /// divergence, reading O(log n) of its blocks instead of all of them. Default `false`
    /// (arbitrary block values, compared one by one). The routers'
    /// [`CacheIndex`](crate::CacheIndex) sets it.
    pub chained: bool,
}

impl Default for TreeConfig {
    fn default() -> Self {
        Self {
            max_blocks: 1 << 22,
            max_nodes: 1 << 18,
            chained: false,
        }
    }
}

impl TreeConfig {
    crate::config::setters! {
        /// Sets [`max_blocks`](Self::max_blocks).
        with_max_blocks: max_blocks: usize;
        /// Sets [`max_nodes`](Self::max_nodes).
        with_max_nodes: max_nodes: usize;
        /// Sets [`chained`](Self::chained).
        with_chained: chained: bool;
    }

    /// Checks every field.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the first field out of its range.
    pub fn validate(&self) -> Result<(), Error> {
        crate::config::int("max_blocks", self.max_blocks, 1.., "at least 1 block")?;
        crate::config::int("max_nodes", self.max_nodes, 1.., "at least 1 node")
    }
}

/// One mirror of every worker's prefix cache.
///
/// Insert the block hashes of what a worker caches (or what was routed to it), and ask in
/// one walk how many leading blocks of a prompt **each** worker holds.
///
/// - Nodes live in an arena with a free list; edges are compressed runs of [`BlockHash`] in
///   one shared pool. A node is split where prefixes diverge or where its holders differ, and
///   merged back as soon as the split is no longer needed.
/// - Each node records its holders in a bitset; worker ids up to
///   [`RadixTree::MAX_WORKERS`] are accepted.
/// - Recency is a logical clock, never wall time. For each worker, a block's recency is its
///   last [`insert`](Self::insert) or [`touch`](Self::touch) for that worker; beyond the
///   worker's [capacity](Self::set_capacity) its least recently used blocks are evicted,
///   deepest first among equals, so a parent never goes before its child.
/// - The whole tree is bounded by [`TreeConfig`]: past it, globally least recently used
///   leaves go.
///
/// # Example
///
/// ```
/// use prefix_router::{PrefixHasher, RadixTree, WorkerId};
///
/// let hasher = PrefixHasher::new(16)?;
/// let system: Vec<u32> = (0..64).collect();
/// let mut tree = RadixTree::new();
/// tree.insert(WorkerId::new(1), &hasher.hash(&[system.clone(), vec![7; 32]].concat()));
/// tree.insert(WorkerId::new(2), &hasher.hash(&system));
///
/// let query = hasher.hash(&[system.clone(), vec![7; 16]].concat());
/// let m = tree.match_prefix(&query);
/// assert_eq!(m.matched_blocks(WorkerId::new(1)), 5);
/// assert_eq!(m.matched_blocks(WorkerId::new(2)), 4);
/// assert_eq!(tree.block_count(), 6);
///
/// tree.set_capacity(WorkerId::new(1), 4); // evicts its two least recent blocks
/// assert_eq!(tree.worker_block_count(WorkerId::new(1)), 4);
/// # Ok::<(), prefix_router::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct RadixTree {
    config: TreeConfig,
    arena: Arena,
    recency: Recency,
    shape: Shape,
    ends: LastBlocks,
}

impl Default for RadixTree {
    fn default() -> Self {
        Self::new()
    }
}

impl RadixTree {
    /// The largest number of workers a tree indexes: worker ids must be below this.
    pub const MAX_WORKERS: u32 = 4096;

    /// An empty tree with the default [`TreeConfig`].
    #[must_use]
    pub fn new() -> Self {
        Self::build(TreeConfig::default())
    }

    /// An empty tree with the given memory bounds.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when `config` does not [validate](TreeConfig::validate).
    pub fn with_config(config: TreeConfig) -> Result<Self, Error> {
        config.validate()?;
        Ok(Self::build(config))
    }

    fn build(config: TreeConfig) -> Self {
        Self {
            config,
            arena: Arena::new(),
            recency: Recency::default(),
            shape: Shape::default(),
            ends: LastBlocks::default(),
        }
    }

    /// The tree's memory bounds.
    #[must_use]
    pub fn config(&self) -> TreeConfig {
        self.config
    }

    #[inline]
    fn search(&self) -> Search<'_> {
        Search {
            arena: &self.arena,
            shape: &self.shape,
            chained: self.config.chained,
        }
    }

    #[inline]
    fn edit(&mut self) -> Edit<'_> {
        Edit {
            arena: &mut self.arena,
            recency: &mut self.recency,
            ends: &mut self.ends,
            shape: &mut self.shape,
        }
    }

    // ----- inserting --------------------------------------------------------------------

    /// Marks the whole prefix `blocks` (a chain from the root) as held by `worker` and makes
    /// it that worker's most recently used. May evict: the worker's least recently used
    /// blocks beyond its capacity, and globally least recently used leaves beyond the
    /// [`TreeConfig`] bounds.
    ///
    /// Empty `blocks` and worker ids at or above [`Self::MAX_WORKERS`] are no-ops.
    ///
    /// Cost: one walk of the prefix plus O(1) per node on it (and O(holders) per split).
    pub fn insert(&mut self, worker: WorkerId, blocks: &[BlockHash]) {
        self.insert_path(worker, blocks, Tier::Device);
    }

    /// [`Self::insert`] of blocks `worker` holds at `tier`: each block of the path is held
    /// at `tier` too (besides any tier it was held at), and the path becomes the worker's most
    /// recently used.
    ///
    /// ```
    /// use prefix_router::{BlockHash, RadixTree, Tier, WorkerId};
    ///
    /// let blocks: Vec<BlockHash> = (1..=4).map(BlockHash::new).collect();
    /// let w = WorkerId::new(0);
    /// let mut tree = RadixTree::new();
    /// tree.insert(w, &blocks[..2]);
    /// tree.insert_at(w, &blocks, Tier::Host);
    /// let m = tree.match_prefix(&blocks);
    /// assert_eq!(m.matched_blocks(w), 4);
    /// assert_eq!(m.matched_blocks_at(w, Tier::Device), 2); // best tier of the first two
    /// assert_eq!(m.matched_blocks_at(w, Tier::Host), 2);
    /// tree.remove_tier(w, &blocks, 0, Tier::Device); // the device copies go
    /// assert_eq!(tree.match_prefix(&blocks).matched_blocks_at(w, Tier::Host), 4);
    /// ```
    pub fn insert_at(&mut self, worker: WorkerId, blocks: &[BlockHash], tier: Tier) {
        self.insert_path(worker, blocks, tier);
    }

    /// [`Self::insert_at`], returning the position of the path's last block (`None` when
    /// nothing was inserted).
    pub(crate) fn insert_path(
        &mut self,
        worker: WorkerId,
        blocks: &[BlockHash],
        tier: Tier,
    ) -> Option<Position> {
        if blocks.is_empty() || !self.ensure_worker(worker) {
            return None;
        }
        let w = worker.index();
        let mut cursor = self.recency.start();
        let end = self.descend(w, &mut cursor, NodeId::ROOT, blocks, tier);
        Some(self.finish_insert(w, end, blocks.len(), blocks[blocks.len() - 1]))
    }

    /// [`Self::insert`] of a path that continues the one to `at` (a position resolved for
    /// `worker`) with `blocks`, without the path itself. Done when `at` ends its node's edge
    /// (where a walk from the root would reach it), or is inside the edge where `blocks` go
    /// on as the rest of the edge does (a store of blocks a routed prompt put there first):
    /// then the position of the last block. `None`, and nothing done, otherwise (`blocks`
    /// diverge from the edge: the caller inserts the whole path).
    pub(crate) fn insert_below(
        &mut self,
        worker: WorkerId,
        at: Position,
        blocks: &[BlockHash],
        tier: Tier,
    ) -> Option<Position> {
        let n = self.arena.live_node(at.node)?;
        let (depth, start, end) = (at.depth(), n.depth(), n.end());
        if blocks.is_empty() || depth <= start || depth > end || !self.ensure_worker(worker) {
            return None;
        }
        let w = worker.index();
        // Inside the edge, the blocks must be the edge's own.
        let along = (end - depth).min(blocks.len());
        let mut node = at.node;
        if along > 0 {
            let from = depth - start;
            if self.arena.edge(node)[from..from + along] != blocks[..along] {
                return None;
            }
            if depth + along < end {
                // Ending inside the edge: split there, as the walk from the root does, so
                // that only the part above is refreshed.
                node = self.edit().split(node, depth + along - start);
            }
        }
        let mut cursor = self.recency.start();
        self.refresh_path(w, &mut cursor, node, tier);
        let end = if along == blocks.len() {
            node
        } else {
            self.descend(w, &mut cursor, node, &blocks[along..], tier)
        };
        let last = blocks[blocks.len() - 1];
        Some(self.finish_insert(w, end, depth + blocks.len(), last))
    }

    /// [`Self::insert_path`] of the path from the root to `at` (a position resolved for
    /// `worker`), without the path: the same insert, continued below the block above `at`
    /// ([`Self::insert_below`]), so that its cost is the nodes above `at`, not its depth.
    pub(crate) fn insert_to(
        &mut self,
        worker: WorkerId,
        at: Position,
        tier: Tier,
    ) -> Option<Position> {
        let above = at.depth().checked_sub(1).filter(|&d| d > 0);
        if let Some(parent) = above.and_then(|depth| self.ancestor(at, depth)) {
            if let Some(end) = self.insert_below(worker, parent, &[at.block()], tier) {
                return Some(end);
            }
        }
        let mut path = Vec::new();
        at.path(&self.arena, &mut path);
        self.insert_path(worker, &path, tier)
    }

    /// The position of the block at `depth` (at least 1, at most `at`'s) on the path to
    /// `at`, a position resolved or found since the tree last changed.
    pub(crate) fn ancestor(&self, at: Position, depth: usize) -> Option<Position> {
        let (node, block) = Position::containing(&self.arena, at.node, depth)?;
        Some(Position {
            node,
            depth: u32::try_from(depth).ok()?,
            block,
        })
    }

    /// The position of `block` right below `at` (a position resolved or found since the tree
    /// last changed), when the tree continues `at`'s path with it.
    pub(crate) fn below(&self, at: Position, block: BlockHash) -> Option<Position> {
        let depth = at.depth();
        let (node, _) = Position::containing(&self.arena, at.node, depth)?;
        let n = &self.arena[node];
        let node = if depth < n.end() {
            (self.arena.edge(node)[depth - n.depth()] == block).then_some(node)?
        } else {
            self.search().child(node, block)?
        };
        Some(Position {
            node,
            depth: u32::try_from(depth + 1).ok()?,
            block,
        })
    }

    /// Refreshes the path from the root down to `node` for `w` at `tier`, root first, as the
    /// walk from the root does.
    fn refresh_path(&mut self, w: usize, cursor: &mut Cursor, node: NodeId, tier: Tier) {
        let mut above: smallvec::SmallVec<[NodeId; 16]> = smallvec::SmallVec::new();
        let mut id = node;
        while id != NodeId::ROOT {
            above.push(id);
            id = self.arena[id].parent;
        }
        for &id in above.iter().rev() {
            self.recency.refresh(&mut self.arena, cursor, id, w, tier);
            self.edit().queue_merge(id);
        }
    }

    /// The insert's walk below `node` (already refreshed, or the root) along `blocks`:
    /// matching, splitting, extending or adding a leaf, refreshing each node reached for
    /// `w`. Returns the deepest node reached.
    fn descend(
        &mut self,
        w: usize,
        cursor: &mut Cursor,
        mut node: NodeId,
        blocks: &[BlockHash],
        tier: Tier,
    ) -> NodeId {
        let mut pos = 0;
        while pos < blocks.len() {
            let next = match self.search().child(node, blocks[pos]) {
                None if self.edit().extendable(node, w, tier) => {
                    // A chain growing on one worker (an engine storing a running request's
                    // blocks, a conversation's next turn): what a new leaf merged back into
                    // this one would give, without making and freeing the leaf.
                    self.edit().extend_leaf(node, w, &blocks[pos..]);
                    break;
                }
                None => {
                    let leaf = self.edit().new_leaf(node, &blocks[pos..]);
                    pos = blocks.len();
                    leaf
                }
                Some(child) => {
                    let common = self.search().common(child, &blocks[pos..]);
                    pos += common;
                    if common < self.arena[child].len() {
                        self.edit().split(child, common)
                    } else {
                        child
                    }
                }
            };
            self.recency.refresh(&mut self.arena, cursor, next, w, tier);
            self.edit().queue_merge(next);
            node = next;
        }
        node
    }

    /// What every insert does last, `end` being the node whose edge ends with the path's
    /// last block `last`, at `depth`: merges, bounds. Returns the block's position (stale
    /// when the bounds evicted it).
    fn finish_insert(&mut self, w: usize, end: NodeId, depth: usize, last: BlockHash) -> Position {
        // The deepest node is the most recent on the path: a merge keeps its id.
        self.edit().finish_merges();
        self.enforce_capacity(w);
        self.enforce_budget();
        self.arena.maybe_compact();
        Position {
            node: end,
            depth: u32::try_from(depth).unwrap_or(u32::MAX),
            block: last,
        }
    }

    /// Refreshes the recency of the part of `blocks` that `worker` already holds, as if it
    /// had been inserted again. Adds nothing; a no-op where the worker holds nothing.
    pub fn touch(&mut self, worker: WorkerId, blocks: &[BlockHash]) {
        let held = self.held_prefix(worker, blocks);
        if held > 0 {
            self.insert(worker, &blocks[..held]);
        }
    }

    // ----- matching ---------------------------------------------------------------------

    /// In one walk, how many leading blocks of `blocks` each worker holds.
    #[must_use]
    pub fn match_prefix(&self, blocks: &[BlockHash]) -> PrefixMatch {
        let mut out = PrefixMatch::new();
        self.match_prefix_into(blocks, &mut out);
        out
    }

    /// Like [`match_prefix`](Self::match_prefix), reusing `out`'s buffers: a warm call
    /// allocates nothing.
    pub fn match_prefix_into(&self, blocks: &[BlockHash], out: &mut PrefixMatch) {
        out.reset(blocks.len());
        if self.arena.tiered() {
            self.search()
                .for_each_match(blocks, |w, held| out.record(w, held));
        } else {
            self.search()
                .for_each_blocks(blocks, |w, matched| out.record_blocks(w, matched));
        }
    }

    /// The walk behind [`match_prefix`](Self::match_prefix), with tiers: calls `f(worker,
    /// held)` once for every worker holding at least the first block. Allocates nothing.
    #[inline]
    pub(crate) fn for_each_held(&self, blocks: &[BlockHash], mut f: impl FnMut(WorkerId, Held)) {
        self.search()
            .for_each_match(blocks, |w, held| f(WorkerId::new(w as u32), held));
    }

    /// The walk behind [`match_prefix`](Self::match_prefix): calls `f(worker, blocks)` once
    /// for every worker holding at least the first block of `blocks`, with how many leading
    /// blocks it holds, shallowest first. Allocates nothing.
    pub fn for_each_match(&self, blocks: &[BlockHash], mut f: impl FnMut(WorkerId, usize)) {
        self.search()
            .for_each_blocks(blocks, |w, matched| f(WorkerId::new(w as u32), matched));
    }

    /// How many leading blocks of `blocks` `worker` holds (one walk, no allocation).
    #[must_use]
    pub fn held_prefix(&self, worker: WorkerId, blocks: &[BlockHash]) -> usize {
        if !self.recency.knows(worker.index()) {
            return 0;
        }
        self.search().held_prefix(worker.index(), blocks)
    }

    // ----- removing ---------------------------------------------------------------------

    /// `worker` drops the listed blocks and everything below them.
    ///
    /// `blocks` is a run of consecutive blocks of one chain: a prefix from the root (as
    /// passed to [`insert`](Self::insert)) or any later part of it, such as `&chain[k..]`
    /// or a single block. Because block hashes are chained, the run's first block names
    /// where it is; blocks the worker does not hold are ignored. `remove(w, &chain)` drops
    /// the whole prefix; `remove(w, &chain[k..])` keeps the first `k` blocks.
    ///
    /// Cost: a run that starts at the root is found in one walk; one that starts deeper is
    /// found by scanning the nodes the worker holds (O(nodes held by the worker)). Then O(1)
    /// per node dropped.
    pub fn remove(&mut self, worker: WorkerId, blocks: &[BlockHash]) {
        let w = worker.index();
        if !self.recency.knows(w) {
            return;
        }
        let mut rest = blocks;
        while let Some(&first) = rest.first() {
            let search = self.search();
            let Some((node, offset)) = search.locate(first, w, self.recency.nodes_of(w)) else {
                rest = &rest[1..];
                continue;
            };
            // The rest of the run hangs below `first`: skip what continues the chain.
            let skipped = search.run_length(node, offset, rest);
            let mut edit = self.edit();
            edit.drop_from(w, node, offset);
            edit.finish_merges();
            rest = &rest[skipped..];
        }
        self.arena.maybe_compact();
    }

    /// `worker` keeps at most the first `keep` blocks of the prefix `blocks` (a chain from
    /// the root): block `keep` of it and everything the worker holds below are dropped.
    /// A no-op where the worker holds `keep` blocks or fewer of that prefix.
    ///
    /// This is how a mirror is corrected when a worker reports fewer cached tokens than
    /// predicted, or evicts a block. Cost: one walk plus O(1) per node dropped.
    pub fn truncate(&mut self, worker: WorkerId, blocks: &[BlockHash], keep: usize) {
        let w = worker.index();
        if !self.recency.knows(w) || keep >= blocks.len() {
            return;
        }
        if let Some((node, offset)) = self.search().locate_depth(blocks, keep) {
            self.drop_held_from(w, node, offset);
        }
    }

    /// `worker` stops holding, at `tier`, block `keep` of the prefix `blocks` and every block
    /// below it; a block then held at no tier is dropped (as [`Self::truncate`] drops it). The
    /// blocks above stay as they are. A no-op where the worker does not hold block `keep`.
    ///
    /// This is how an engine's eviction from one tier is mirrored: a block evicted from the
    /// GPU but kept in host memory stays held, at the host tier.
    pub fn remove_tier(&mut self, worker: WorkerId, blocks: &[BlockHash], keep: usize, tier: Tier) {
        let w = worker.index();
        if !self.recency.knows(w) || keep >= blocks.len() {
            return;
        }
        if let Some((node, offset)) = self.search().locate_depth(blocks, keep) {
            self.drop_tier_held_from(w, node, offset, tier);
        }
    }

    /// [`Self::remove_tier`] from `at` (a block's position): `worker` stops holding that block
    /// and everything below it at `tier`.
    pub(crate) fn remove_tier_at(&mut self, worker: WorkerId, at: Position, tier: Tier) {
        let w = worker.index();
        if !self.recency.knows(w) {
            return;
        }
        if let Some((node, _)) = Position::containing(&self.arena, at.node, at.depth()) {
            let offset = at.depth() - 1 - self.arena[node].depth();
            self.drop_tier_held_from(w, node, offset, tier);
        }
    }

    /// What a tier removal does once it has found the first block: `node`'s block at `offset`.
    /// Where `w` holds the node at that tier alone, so everything below too (each tier's
    /// blocks are a prefix), the blocks are dropped outright.
    fn drop_tier_held_from(&mut self, w: usize, node: NodeId, offset: usize, tier: Tier) {
        if !self.arena.tiered() {
            // Every holding is at the device tier alone.
            if tier == Tier::Device {
                self.drop_held_from(w, node, offset);
            }
            return;
        }
        match self.recency.tiers(node, w) {
            Some(tiers) if tiers == TierSet::of(tier) => self.drop_held_from(w, node, offset),
            Some(tiers) if tiers.contains(tier) => {
                let mut edit = self.edit();
                edit.drop_tier_from(w, node, offset, tier);
                edit.finish_merges();
                self.arena.maybe_compact();
            }
            _ => {}
        }
    }

    /// `worker` stops holding anything at `tier` (an engine's reset of one tier).
    pub fn clear_tier(&mut self, worker: WorkerId, tier: Tier) {
        if !self.recency.knows(worker.index()) {
            return;
        }
        let mut edit = self.edit();
        edit.drop_tier_everywhere(worker.index(), tier);
        edit.finish_merges();
        self.arena.maybe_compact();
    }

    /// What a truncation does once it has found the first dropped block: `node`'s block at
    /// `offset` in its edge.
    fn drop_held_from(&mut self, w: usize, node: NodeId, offset: usize) {
        if self.arena.has_member(node, w) {
            let mut edit = self.edit();
            edit.drop_from(w, node, offset);
            edit.finish_merges();
            self.arena.maybe_compact();
        }
    }

    /// The tree's logical clock: it advances by one with every [`insert`](Self::insert)
    /// (and every [`touch`](Self::touch) that refreshes something).
    #[must_use]
    pub fn clock(&self) -> u64 {
        self.recency.clock()
    }

    /// Drops, for every worker, the blocks it last inserted or touched before logical time
    /// `before` (see [`clock`](Self::clock)): the time-to-live of a mirror kept without
    /// events. Cost: O(workers + nodes dropped).
    pub fn expire(&mut self, before: u64) {
        for w in self.recency.workers() {
            while let Some(node) = self.recency.older_than(w, before) {
                self.edit().remove_holder(node, w);
            }
        }
        self.edit().finish_merges();
        self.arena.maybe_compact();
    }

    /// Forgets everything `worker` holds and its capacity. Cost: O(nodes it holds).
    pub fn remove_worker(&mut self, worker: WorkerId) {
        let w = worker.index();
        if !self.recency.knows(w) {
            return;
        }
        // The least recent node is always one the worker holds no child of.
        while let Some(node) = self.recency.least_recent(w) {
            self.edit().remove_holder(node, w);
        }
        self.recency.reset_worker(w);
        self.edit().finish_merges();
        self.arena.maybe_compact();
    }

    // ----- bounds -----------------------------------------------------------------------

    /// Bounds `worker` to `blocks` blocks, evicting its least recently used blocks beyond
    /// it (deepest first among equals). `usize::MAX` means unbounded (the default).
    /// A worker id at or above [`Self::MAX_WORKERS`] is ignored.
    pub fn set_capacity(&mut self, worker: WorkerId, blocks: usize) {
        if !self.ensure_worker(worker) {
            return;
        }
        self.recency.set_capacity(worker.index(), blocks);
        self.enforce_capacity(worker.index());
        self.arena.maybe_compact();
    }

    /// The blocks `worker` holds, at any tier.
    #[must_use]
    pub fn blocks_held(&self, worker: WorkerId) -> usize {
        self.recency.blocks_of(worker.index())
    }

    /// The capacity of `worker` in blocks (`usize::MAX` when unbounded or unknown).
    #[must_use]
    pub fn capacity(&self, worker: WorkerId) -> usize {
        self.recency.capacity(worker.index())
    }

    /// Evicts `w`'s least recently used blocks until it is within its capacity.
    fn enforce_capacity(&mut self, w: usize) {
        let mut trimmed = false;
        while let Some((node, excess)) = self.recency.over_capacity(w) {
            self.edit().trim(node, w, excess);
            trimmed = true;
        }
        if trimmed {
            self.edit().finish_merges();
        }
    }

    /// Evicts globally least recently used leaves until the tree is within its bounds.
    fn enforce_budget(&mut self) {
        let over = |t: &Self| {
            t.arena.blocks() > t.config.max_blocks || t.arena.live() - 1 > t.config.max_nodes
        };
        if !over(self) {
            return;
        }
        while over(self) {
            // The head holds no child of any holder's; an unheld head cannot happen while
            // the invariants hold, and stops the loop rather than spinning.
            let Some(node) = self.recency.oldest() else {
                break;
            };
            if !self.edit().drop_node(node) {
                break;
            }
        }
        self.edit().finish_merges();
    }

    /// Registers `worker` in every layer if needed; false when its id is out of range.
    fn ensure_worker(&mut self, worker: WorkerId) -> bool {
        if worker.get() >= Self::MAX_WORKERS {
            return false;
        }
        self.recency.ensure_worker(worker.index());
        self.arena.ensure_worker(worker.index());
        true
    }

    // ----- positions (event sync) -------------------------------------------------------

    /// Starts keeping the last-block index (chained trees only; idempotent), so that
    /// [`Self::find`] can answer. Cost: O(nodes) the first time.
    pub(crate) fn track_positions(&mut self) {
        if self.config.chained {
            self.ends.turn_on(&self.arena);
        }
    }

    /// `at` as the tree has it now, when its block is still there for `holder`.
    pub(crate) fn resolve(&self, at: Position, holder: WorkerId) -> Option<Position> {
        at.resolve(&self.arena, holder.index())
    }

    /// Where `block` is, from the last-block index and kept positions, when `holder` holds
    /// it there (in a chained tree a block's hash names its whole prefix, so that is the
    /// block's own position).
    pub(crate) fn find(&self, block: BlockHash, holder: WorkerId) -> Option<Position> {
        self.ends.find(&self.arena, block, holder.index())
    }

    /// Keeps `at` in the last-block index until its block leaves the tree, even once the
    /// block no longer ends an edge (a no-op unless the index is kept).
    pub(crate) fn keep(&mut self, at: Position) {
        self.ends.keep(&self.arena, at);
    }

    /// The position of the last block of `blocks` (a path from the root), if the tree has
    /// that path. Cost: one child lookup per node on the path.
    pub(crate) fn find_path(&self, blocks: &[BlockHash]) -> Option<Position> {
        let node = self.search().path_end(blocks)?;
        Some(Position {
            node,
            depth: u32::try_from(blocks.len()).ok()?,
            block: blocks[blocks.len() - 1],
        })
    }

    /// Writes into `out` the path from the root to `at`, a position [resolved](Self::resolve)
    /// or [found](Self::find) since the tree last changed.
    pub(crate) fn path_to(&self, at: Position, out: &mut Vec<BlockHash>) {
        at.path(&self.arena, out);
    }

    // ----- sizes ------------------------------------------------------------------------

    /// Distinct blocks held by any worker.
    #[must_use]
    pub fn block_count(&self) -> usize {
        self.arena.blocks()
    }

    /// Blocks held by `worker` (0 for an unknown worker).
    #[must_use]
    pub fn worker_block_count(&self, worker: WorkerId) -> usize {
        self.recency.blocks_of(worker.index())
    }

    /// Nodes in the tree, not counting the root.
    #[must_use]
    pub fn node_count(&self) -> usize {
        self.arena.live() - 1
    }

    /// Bytes allocated by the tree: the node arena, edge pool, holder bitsets, holdings,
    /// maps and free lists, counted from their real capacities.
    #[must_use]
    pub fn memory_bytes(&self) -> usize {
        core::mem::size_of::<Self>()
            + self.arena.memory_bytes()
            + self.recency.memory_bytes()
            + self.shape.memory_bytes()
            + self.ends.memory_bytes()
    }

    /// The edge pool's capacity in blocks.
    #[cfg(test)]
    pub(super) fn pool_capacity(&self) -> usize {
        self.arena.pool_capacity()
    }

    /// Checks every invariant of the tree and returns the first violation found: each
    /// layer's own (the arena's counts and pool accounting, the shape's links and compressed
    /// edges, recency's holdings, lists and capacities, the last-block index). Cost: O(size
    /// of the tree). Meant for tests and fuzzing.
    ///
    /// # Errors
    ///
    /// A description of the first broken invariant.
    pub fn validate(&self) -> Result<(), String> {
        self.arena.validate()?;
        self.shape.validate(&self.arena, &self.recency)?;
        self.recency.validate(&self.arena)?;
        self.ends.validate(&self.arena)
    }
}
