//! The arena radix tree.

use smallvec::SmallVec;

use super::{FoldMap, PrefixMatch, WorkerId};
use crate::BlockHash;
pub(super) use crate::list::{Linked, List, NIL, link_after, link_before, unlink};
/// The root node: holds no blocks, never freed.
pub(super) const ROOT: u32 = 0;

/// Memory bounds of a [`RadixTree`], applied to all workers together.
///
/// Past either bound the tree evicts whole leaves in global least-recently-used order, so
/// total memory stays bounded however many distinct prompts arrive.
///
/// Memory is about 8 bytes per block (12 with the edge pool's garbage) plus about 110 bytes
/// per node and 45 bytes per (node, holder) pair (a node is a run of blocks that the same
/// workers hold). With the defaults and up to 16 workers that stays below **128 MiB**
/// whatever the traffic: 1,000,000 unique random 2,048-token prompts through a
/// `BalancedRouter` peak at 90 MiB of `memory_bytes()` (`examples/memory_bound.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TreeConfig {
    /// Most distinct blocks held at once. Default 4,194,304 (2^22: 67M tokens at block
    /// size 16).
    pub max_blocks: usize,
    /// Most nodes at once. Default 262,144 (2^18).
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

#[derive(Clone, Copy, Debug)]
pub(super) struct Node {
    pub(super) parent: u32,
    pub(super) first_child: u32,
    pub(super) next_sibling: u32,
    pub(super) prev_sibling: u32,
    /// The edge is `pool[edge_start..edge_start + edge_len]`.
    pub(super) edge_start: u32,
    pub(super) edge_len: u32,
    /// Blocks above this node's edge.
    pub(super) depth: u32,
    /// The edge's last block, kept beside the node so that a walk over a whole edge of
    /// chained hashes compares it without reading the pool.
    pub(super) last: BlockHash,
    /// Global LRU links.
    pub(super) lru_prev: u32,
    pub(super) lru_next: u32,
    /// Logical time of the last insert or touch through this node (any worker).
    pub(super) stamp: u64,
}

impl Node {
    const FREE: Node = Node {
        parent: NIL,
        first_child: NIL,
        next_sibling: NIL,
        prev_sibling: NIL,
        edge_start: 0,
        edge_len: 0,
        depth: 0,
        last: BlockHash::new(0),
        lru_prev: NIL,
        lru_next: NIL,
        stamp: 0,
    };
}

/// One worker's hold on one node, linked into that worker's LRU list.
#[derive(Clone, Copy, Debug)]
pub(super) struct Holding {
    pub(super) node: u32,
    pub(super) worker: u32,
    pub(super) prev: u32,
    pub(super) next: u32,
    /// Logical time of this worker's last insert or touch through the node.
    pub(super) stamp: u64,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct WorkerState {
    /// Blocks held.
    pub(super) blocks: usize,
    /// Capacity in blocks (`usize::MAX`: unbounded).
    pub(super) capacity: usize,
    /// LRU list of holdings: least recent (and deepest among equals) at the head.
    pub(super) list: List,
    pub(super) holdings: usize,
}

impl WorkerState {
    const NEW: WorkerState = WorkerState {
        blocks: 0,
        capacity: usize::MAX,
        list: List::EMPTY,
        holdings: 0,
    };
}

crate::list::linked!(Node, lru_prev, lru_next);

crate::list::linked!(Holding, prev, next);

/// One mirror of every worker's prefix cache.
///
/// Insert the block hashes of what a worker caches (or what was routed to it), and ask in
/// one walk how many leading blocks of a prompt **each** worker holds.
///
/// # Structure
///
/// - Nodes live in an arena addressed by `u32` ids with a free list; edges are compressed
///   runs of [`BlockHash`] in one shared pool. A node is split where prefixes diverge or
///   where its holders differ, and merged back as soon as the split is no longer needed.
/// - Each node records its holders in a bitset of `⌈workers / 64⌉` words (one word for up
///   to 64 workers); worker ids up to [`RadixTree::MAX_WORKERS`] are accepted.
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
    pub(super) config: TreeConfig,
    pub(super) nodes: Vec<Node>,
    pub(super) free_nodes: Vec<u32>,
    pub(super) live_nodes: usize,
    /// Edge storage; `garbage` counts slots no live edge uses.
    pub(super) pool: Vec<BlockHash>,
    pub(super) garbage: usize,
    /// (parent, first block of the child's edge) → child.
    pub(super) children: FoldMap<ChildKey, u32>,
    /// Holder bitsets: node `n` owns `members[n * stride..(n + 1) * stride]`.
    pub(super) members: Vec<u64>,
    pub(super) stride: usize,
    pub(super) holdings: Vec<Holding>,
    pub(super) free_holdings: Vec<u32>,
    /// (node << 32 | worker) → holding.
    pub(super) holding_index: FoldMap<u64, u32>,
    pub(super) workers: Vec<WorkerState>,
    /// Global LRU over nodes: least recent (and deepest among equals) at the head.
    pub(super) lru: List,
    pub(super) block_count: usize,
    pub(super) clock: u64,
    /// Nodes whose merge with their only child must be checked once the operation is done.
    merge_queue: Vec<u32>,
    /// The node holding the last block of the last [`Self::insert`] (a hint for
    /// [`Self::position`]).
    last_end: u32,
    /// Edge's last block → node and depth, kept once [`Self::index_last_blocks`] has been
    /// called (by event sync, for chained trees): a block that ends an edge is found by its
    /// hash alone. Also positions kept by [`Self::keep_position`] while their blocks are in
    /// the tree.
    pub(super) by_last: FoldMap<BlockHash, Indexed>,
    pub(super) last_indexed: bool,
    /// The most live nodes, or live entries, `by_last` has had since it last dropped stale
    /// entries: it holds at most twice that (plus [`INDEX_SLACK`]).
    pub(super) index_bound: usize,
}

impl Default for RadixTree {
    fn default() -> Self {
        Self::new()
    }
}

/// Stale entries the index of edges' last blocks may hold beyond as many as its live ones
/// (small in unit tests, so that dropping them is exercised).
#[cfg(not(test))]
pub(super) const INDEX_SLACK: usize = 1024;
#[cfg(test)]
pub(super) const INDEX_SLACK: usize = 4;

/// An entry of the index of edges' last blocks: where the block is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Indexed {
    /// The node that held the block when indexed (or one below it on its path).
    pub(super) node: u32,
    /// The block's depth, with [`Self::KEPT`] set for a position kept while the block is
    /// in the tree (`RadixTree::keep_position`), not only while it ends an edge.
    pub(super) depth: u32,
}

impl Indexed {
    pub(super) const KEPT: u32 = 1 << 31;
}

/// An insert's walk: its time and the anchors its refreshes link before (the node and the
/// holding refreshed last, one level up).
struct Walk {
    now: u64,
    node: u32,
    holding: u32,
}

impl Walk {
    fn new(now: u64) -> Self {
        Self {
            now,
            node: NIL,
            holding: NIL,
        }
    }
}

/// Key of the child map: a parent and the first block of the child's edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ChildKey {
    parent: u32,
    first: BlockHash,
}

impl core::hash::Hash for ChildKey {
    #[inline]
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        // One word: the block is already a hash; the parent spreads it per subtree.
        state.write_u64(
            self.first.get() ^ u64::from(self.parent).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
    }
}

#[inline]
fn child_key(parent: u32, first: BlockHash) -> ChildKey {
    ChildKey { parent, first }
}

#[inline]
fn holding_key(node: u32, worker: usize) -> u64 {
    (u64::from(node) << 32) | worker as u64
}

/// Length of the common prefix of two block runs.
#[inline]
fn common_prefix(a: &[BlockHash], b: &[BlockHash]) -> usize {
    const CHUNK: usize = 8;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    // Whole chunks first (the compiler turns each into a few wide compares).
    let mut i = 0;
    for (x, y) in a.chunks_exact(CHUNK).zip(b.chunks_exact(CHUNK)) {
        if x != y {
            break;
        }
        i += CHUNK;
    }
    i + a[i..]
        .iter()
        .zip(&b[i..])
        .take_while(|(x, y)| x == y)
        .count()
}

/// Length of the common prefix of two runs of **chained** hashes: equal blocks at a depth
/// mean equal prefixes, so equality is monotone and a binary search finds where they part.
#[inline]
/// `a[0] == b[0]` is known (the child map matched it), so it is not read again.
fn chained_common_prefix(a: &[BlockHash], b: &[BlockHash]) -> usize {
    let n = a.len().min(b.len());
    if n <= 1 || a[n - 1] == b[n - 1] {
        return n;
    }
    // a[lo] == b[lo] and a[hi] != b[hi].
    let (mut lo, mut hi) = (0, n - 1);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if a[mid] == b[mid] {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo + 1
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

impl RadixTree {
    /// The largest number of workers a tree indexes: worker ids must be below this.
    pub const MAX_WORKERS: u32 = 4096;

    /// An empty tree with the default [`TreeConfig`].
    #[must_use]
    pub fn new() -> Self {
        Self::with_config(TreeConfig::default())
    }

    /// An empty tree with the given memory bounds.
    #[must_use]
    pub fn with_config(config: TreeConfig) -> Self {
        Self {
            config,
            nodes: vec![Node {
                parent: NIL,
                ..Node::FREE
            }],
            free_nodes: Vec::new(),
            live_nodes: 1,
            pool: Vec::new(),
            garbage: 0,
            children: FoldMap::default(),
            members: vec![0],
            stride: 1,
            holdings: Vec::new(),
            free_holdings: Vec::new(),
            holding_index: FoldMap::default(),
            workers: Vec::new(),
            lru: List::EMPTY,
            block_count: 0,
            clock: 0,
            merge_queue: Vec::new(),
            last_end: ROOT,
            by_last: FoldMap::default(),
            last_indexed: false,
            index_bound: 0,
        }
    }

    /// The tree's memory bounds.
    #[must_use]
    pub fn config(&self) -> TreeConfig {
        self.config
    }

    /// Marks the whole prefix `blocks` (a chain from the root) as held by `worker` and makes
    /// it that worker's most recently used. May evict: the worker's least recently used
    /// blocks beyond its capacity, and globally least recently used leaves beyond the
    /// [`TreeConfig`] bounds.
    ///
    /// Empty `blocks` and worker ids at or above [`Self::MAX_WORKERS`] are no-ops.
    ///
    /// Cost: one walk of the prefix plus O(1) per node on it (and O(holders) per split).
    pub fn insert(&mut self, worker: WorkerId, blocks: &[BlockHash]) {
        if blocks.is_empty() || !self.ensure_worker(worker) {
            return;
        }
        let w = worker.index();
        let mut walk = Walk::new(self.tick());
        let end = self.descend(w, &mut walk, ROOT, blocks);
        self.finish_insert(w, end);
    }

    /// [`Self::insert`] of a path that continues the one to position `depth` of `node` (as
    /// [`Self::position`] or [`Self::indexed_position`] found it) with `blocks`, without the
    /// path itself: done, and `true`, when that position ends `node`'s edge (where a walk from
    /// the root would reach it), or inside the edge where `blocks` go on as the rest of the
    /// edge does (a store of blocks a routed prompt put there first); `false`, and nothing
    /// done, otherwise (`blocks` diverge from the edge: the caller inserts the whole path).
    pub(crate) fn insert_below(
        &mut self,
        worker: WorkerId,
        node: u32,
        depth: usize,
        blocks: &[BlockHash],
    ) -> bool {
        if blocks.is_empty() || node == ROOT || !self.alive(node) {
            return false;
        }
        let n = self.nodes[node as usize];
        let (start, end) = (n.depth as usize, (n.depth + n.edge_len) as usize);
        if depth <= start || depth > end || !self.ensure_worker(worker) {
            return false;
        }
        let w = worker.index();
        // Inside the edge, the blocks must be the edge's own.
        let along = (end - depth).min(blocks.len());
        let mut node = node;
        if along > 0 {
            let from = n.edge_start as usize + depth - start;
            if self.pool[from..from + along] != blocks[..along] {
                return false;
            }
            if depth + along < end {
                // Ending inside the edge: split there, as the walk from the root does, so
                // that only the part above is refreshed.
                node = self.split(node, depth + along - start);
            }
        }
        let mut walk = Walk::new(self.tick());
        // The path down to `node`, refreshed root first as the walk from the root does.
        let mut above: SmallVec<[u32; 16]> = SmallVec::new();
        let mut id = node;
        while id != ROOT {
            above.push(id);
            id = self.nodes[id as usize].parent;
        }
        for &id in above.iter().rev() {
            self.refresh(id, w, walk.now, &mut walk.node, &mut walk.holding);
            self.merge_queue.push(id);
        }
        let end = if along == blocks.len() {
            node
        } else {
            self.descend(w, &mut walk, node, &blocks[along..])
        };
        self.finish_insert(w, end);
        true
    }

    /// Advances the logical clock for one insert; the new time.
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The insert's walk below `node` (already refreshed, or the root) along `blocks`:
    /// matching, splitting, extending or adding a leaf, refreshing each node reached for
    /// `w`. Returns the deepest node reached.
    fn descend(&mut self, w: usize, walk: &mut Walk, mut node: u32, blocks: &[BlockHash]) -> u32 {
        let mut pos = 0;
        while pos < blocks.len() {
            let next = match self.child(node, blocks[pos]) {
                None if self.extendable(node, w) => {
                    // A chain growing on one worker (an engine storing a running request's
                    // blocks, a conversation's next turn): what a new leaf merged back into
                    // this one would give, without making and freeing the leaf.
                    self.extend_leaf(node, w, &blocks[pos..]);
                    break;
                }
                None => {
                    let leaf = self.new_leaf(node, &blocks[pos..]);
                    pos = blocks.len();
                    leaf
                }
                Some(child) => {
                    let common = self.common(child, &blocks[pos..]);
                    pos += common;
                    if common < self.nodes[child as usize].edge_len as usize {
                        self.split(child, common)
                    } else {
                        child
                    }
                }
            };
            self.refresh(next, w, walk.now, &mut walk.node, &mut walk.holding);
            self.merge_queue.push(next);
            node = next;
        }
        node
    }

    /// What every insert does last, `end` being the deepest node its walk reached.
    fn finish_insert(&mut self, w: usize, end: u32) {
        // The deepest node is the most recent on the path: no merge removes it.
        self.last_end = end;
        self.finish_merges();
        self.enforce_capacity(w);
        self.enforce_budget();
        self.maybe_compact();
    }

    /// Refreshes the recency of the part of `blocks` that `worker` already holds, as if it
    /// had been inserted again. Adds nothing; a no-op where the worker holds nothing.
    pub fn touch(&mut self, worker: WorkerId, blocks: &[BlockHash]) {
        let held = self.held_prefix(worker, blocks);
        if held > 0 {
            self.insert(worker, &blocks[..held]);
        }
    }

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
        self.for_each_match(blocks, |worker, matched| {
            out.record(worker.index(), matched)
        });
    }

    /// The walk behind [`match_prefix`](Self::match_prefix): calls `f(worker, blocks)` once
    /// for every worker holding at least the first block of `blocks`, with how many leading
    /// blocks it holds, shallowest first. Allocates nothing.
    pub fn for_each_match(&self, blocks: &[BlockHash], mut f: impl FnMut(WorkerId, usize)) {
        let mut node = ROOT;
        let mut pos = 0;
        while pos < blocks.len() {
            let Some(child) = self.child(node, blocks[pos]) else {
                break;
            };
            let common = self.common(child, &blocks[pos..]);
            let edge_len = self.nodes[child as usize].edge_len as usize;
            if node != ROOT {
                // Holders of `node` that do not hold `child` match exactly `pos` blocks.
                let (above, below) = (self.words(node), self.words(child));
                for (i, (&a, &b)) in above.iter().zip(below).enumerate() {
                    let mut gone = a & !b;
                    while gone != 0 {
                        let w = i * 64 + gone.trailing_zeros() as usize;
                        f(WorkerId::new(w as u32), pos);
                        gone &= gone - 1;
                    }
                }
            }
            pos += common;
            node = child;
            if common < edge_len {
                break;
            }
        }
        if node != ROOT {
            for w in bits(self.words(node)) {
                f(WorkerId::new(w as u32), pos);
            }
        }
    }

    /// How many leading blocks of `blocks` `worker` holds (one walk, no allocation).
    #[must_use]
    pub fn held_prefix(&self, worker: WorkerId, blocks: &[BlockHash]) -> usize {
        let w = worker.index();
        if w >= self.workers.len() {
            return 0;
        }
        let mut node = ROOT;
        let mut pos = 0;
        while pos < blocks.len() {
            let Some(child) = self.child(node, blocks[pos]) else {
                break;
            };
            if !self.has_member(child, w) {
                break;
            }
            let common = self.common(child, &blocks[pos..]);
            let edge_len = self.nodes[child as usize].edge_len as usize;
            pos += common;
            node = child;
            if common < edge_len {
                break;
            }
        }
        pos
    }

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
        if w >= self.workers.len() {
            return;
        }
        let mut rest = blocks;
        while let Some(&first) = rest.first() {
            let Some((node, offset)) = self.locate(w, first) else {
                rest = &rest[1..];
                continue;
            };
            // The rest of the run hangs below `first`: skip what continues the chain.
            let mut skipped = 1;
            let mut at = (node, offset + 1);
            while skipped < rest.len() {
                let (n, o) = at;
                if o < self.nodes[n as usize].edge_len as usize {
                    if self.edge(n)[o] != rest[skipped] {
                        break;
                    }
                    at = (n, o + 1);
                } else {
                    match self.child(n, rest[skipped]) {
                        Some(c) => at = (c, 1),
                        None => break,
                    }
                }
                skipped += 1;
            }
            self.drop_from(w, node, offset);
            self.finish_merges();
            rest = &rest[skipped..];
        }
        self.maybe_compact();
    }

    /// `worker` keeps at most the first `keep` blocks of the prefix `blocks` (a chain from
    /// the root): block `keep` of it and everything the worker holds below are dropped.
    /// A no-op where the worker holds `keep` blocks or fewer of that prefix.
    ///
    /// This is how a mirror is corrected when a worker reports fewer cached tokens than
    /// predicted, or evicts a block. Cost: one walk plus O(1) per node dropped.
    pub fn truncate(&mut self, worker: WorkerId, blocks: &[BlockHash], keep: usize) {
        let w = worker.index();
        if w >= self.workers.len() || keep >= blocks.len() {
            return;
        }
        let mut node = ROOT;
        let mut pos = 0;
        let found = loop {
            let Some(child) = self.child(node, blocks[pos]) else {
                break None;
            };
            let len = self.nodes[child as usize].edge_len as usize;
            let common = self.common(child, &blocks[pos..]);
            if keep < pos + common {
                break Some((child, keep - pos));
            }
            if common < len || pos + len >= blocks.len() {
                break None;
            }
            pos += len;
            node = child;
        };
        if let Some((node, offset)) = found {
            self.drop_held_from(w, node, offset);
        }
    }

    /// [`Self::truncate`] of the path through `hint` (a node that holds position `keep + 1`
    /// of it, or one below it on the path, as [`Self::position`] found it), without the
    /// path: `worker` keeps the first `keep` blocks.
    pub(crate) fn truncate_at(&mut self, worker: WorkerId, hint: u32, keep: usize) {
        let w = worker.index();
        if w >= self.workers.len() {
            return;
        }
        if let Some((node, _)) = self.containing(hint, keep + 1) {
            let offset = keep - self.nodes[node as usize].depth as usize;
            self.drop_held_from(w, node, offset);
        }
    }

    /// What a truncation does once it has found the first dropped block: `node`'s block at
    /// `offset` in its edge.
    fn drop_held_from(&mut self, w: usize, node: u32, offset: usize) {
        if self.has_member(node, w) {
            self.drop_from(w, node, offset);
            self.finish_merges();
            self.maybe_compact();
        }
    }

    /// The tree's logical clock: it advances by one with every [`insert`](Self::insert)
    /// (and every [`touch`](Self::touch) that refreshes something).
    #[must_use]
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// Drops, for every worker, the blocks it last inserted or touched before logical time
    /// `before` (see [`clock`](Self::clock)): the time-to-live of a mirror kept without
    /// events. Cost: O(workers + nodes dropped).
    pub fn expire(&mut self, before: u64) {
        for w in 0..self.workers.len() {
            loop {
                let head = self.workers[w].list.head;
                if head == NIL || self.holdings[head as usize].stamp >= before {
                    break;
                }
                let node = self.holdings[head as usize].node;
                self.remove_holder(node, w);
            }
        }
        self.finish_merges();
        self.maybe_compact();
    }

    /// Forgets everything `worker` holds and its capacity. Cost: O(nodes it holds).
    pub fn remove_worker(&mut self, worker: WorkerId) {
        let w = worker.index();
        if w >= self.workers.len() {
            return;
        }
        // The list head is always a node the worker holds no child of.
        while self.workers[w].list.head != NIL {
            let node = self.holdings[self.workers[w].list.head as usize].node;
            self.remove_holder(node, w);
        }
        self.workers[w] = WorkerState::NEW;
        self.finish_merges();
        self.maybe_compact();
    }

    /// Bounds `worker` to `blocks` blocks, evicting its least recently used blocks beyond
    /// it (deepest first among equals). `usize::MAX` means unbounded (the default).
    /// A worker id at or above [`Self::MAX_WORKERS`] is ignored.
    pub fn set_capacity(&mut self, worker: WorkerId, blocks: usize) {
        if !self.ensure_worker(worker) {
            return;
        }
        self.workers[worker.index()].capacity = blocks;
        self.enforce_capacity(worker.index());
        self.maybe_compact();
    }

    /// The capacity of `worker` in blocks (`usize::MAX` when unbounded or unknown).
    #[must_use]
    pub fn capacity(&self, worker: WorkerId) -> usize {
        self.workers
            .get(worker.index())
            .map_or(usize::MAX, |s| s.capacity)
    }

    /// Distinct blocks held by any worker.
    #[must_use]
    pub fn block_count(&self) -> usize {
        self.block_count
    }

    /// Blocks held by `worker` (0 for an unknown worker).
    #[must_use]
    pub fn worker_block_count(&self, worker: WorkerId) -> usize {
        self.workers.get(worker.index()).map_or(0, |s| s.blocks)
    }

    /// Nodes in the tree, not counting the root.
    #[must_use]
    pub fn node_count(&self) -> usize {
        self.live_nodes - 1
    }

    /// Bytes allocated by the tree: the node arena, edge pool, holder bitsets, holdings,
    /// both maps and the free lists, counted from their real capacities.
    #[must_use]
    pub fn memory_bytes(&self) -> usize {
        use core::mem::size_of;
        size_of::<Self>()
            + self.nodes.capacity() * size_of::<Node>()
            + self.free_nodes.capacity() * size_of::<u32>()
            + self.pool.capacity() * size_of::<BlockHash>()
            + self.children.allocation_size()
            + self.members.capacity() * size_of::<u64>()
            + self.holdings.capacity() * size_of::<Holding>()
            + self.free_holdings.capacity() * size_of::<u32>()
            + self.holding_index.allocation_size()
            + self.by_last.allocation_size()
            + self.workers.capacity() * size_of::<WorkerState>()
            + self.merge_queue.capacity() * size_of::<u32>()
    }

    // ----- internals -------------------------------------------------------------------

    /// Registers `worker` if needed; false when its id is out of range.
    fn ensure_worker(&mut self, worker: WorkerId) -> bool {
        if worker.get() >= Self::MAX_WORKERS {
            return false;
        }
        let w = worker.index();
        if w >= self.workers.len() {
            self.workers.resize(w + 1, WorkerState::NEW);
        }
        let stride = w / 64 + 1;
        if stride > self.stride {
            let mut members = vec![0u64; self.nodes.len() * stride];
            for (n, words) in self.members.chunks_exact(self.stride).enumerate() {
                members[n * stride..n * stride + self.stride].copy_from_slice(words);
            }
            self.members = members;
            self.stride = stride;
        }
        true
    }

    /// Common prefix of an edge and a query, by the configured comparison. Both are
    /// non-empty and their first blocks are equal: the edge was found in the child map by the
    /// query's first block.
    #[inline]
    fn common(&self, node: u32, query: &[BlockHash]) -> usize {
        if self.config.chained {
            // A whole edge is matched when its last block is: no pool read.
            let n = &self.nodes[node as usize];
            let len = n.edge_len as usize;
            if len <= query.len() && n.last == query[len - 1] {
                return len;
            }
            chained_common_prefix(self.edge(node), query)
        } else {
            1 + common_prefix(&self.edge(node)[1..], &query[1..])
        }
    }

    #[inline]
    pub(super) fn edge(&self, node: u32) -> &[BlockHash] {
        let n = &self.nodes[node as usize];
        let start = n.edge_start as usize;
        &self.pool[start..start + n.edge_len as usize]
    }

    #[inline]
    pub(super) fn child(&self, parent: u32, first: BlockHash) -> Option<u32> {
        if self.nodes[parent as usize].first_child == NIL {
            // A leaf (a chain growing on one worker): no map lookup.
            return None;
        }
        self.children.get(&child_key(parent, first)).copied()
    }

    #[inline]
    pub(super) fn words(&self, node: u32) -> &[u64] {
        let start = node as usize * self.stride;
        &self.members[start..start + self.stride]
    }

    #[inline]
    pub(super) fn has_member(&self, node: u32, w: usize) -> bool {
        w / 64 < self.stride && self.words(node)[w / 64] & (1 << (w % 64)) != 0
    }

    #[inline]
    fn set_member(&mut self, node: u32, w: usize, on: bool) {
        let word = &mut self.members[node as usize * self.stride + w / 64];
        if on {
            *word |= 1 << (w % 64);
        } else {
            *word &= !(1 << (w % 64));
        }
    }

    #[inline]
    pub(super) fn holding_of(&self, node: u32, w: usize) -> Option<u32> {
        self.holding_index.get(&holding_key(node, w)).copied()
    }

    pub(super) fn alive(&self, node: u32) -> bool {
        node == ROOT
            || self
                .nodes
                .get(node as usize)
                .is_some_and(|n| n.parent != NIL)
    }

    fn alloc_node(&mut self, node: Node) -> u32 {
        self.live_nodes += 1;
        if let Some(id) = self.free_nodes.pop() {
            self.nodes[id as usize] = node;
            return id;
        }
        let id = u32::try_from(self.nodes.len()).unwrap_or(NIL);
        self.nodes.push(node);
        self.members.resize(self.members.len() + self.stride, 0);
        id
    }

    fn free_node(&mut self, id: u32) {
        self.nodes[id as usize] = Node::FREE;
        let start = id as usize * self.stride;
        self.members[start..start + self.stride].fill(0);
        self.free_nodes.push(id);
        self.live_nodes -= 1;
    }

    /// Appends `blocks` to the pool and hangs a new leaf with that edge under `parent`.
    fn new_leaf(&mut self, parent: u32, blocks: &[BlockHash]) -> u32 {
        self.make_room(blocks.len());
        let start = self.pool.len() as u32;
        self.pool.extend_from_slice(blocks);
        let p = self.nodes[parent as usize];
        let leaf = self.alloc_node(Node {
            parent,
            edge_start: start,
            edge_len: blocks.len() as u32,
            depth: p.depth + p.edge_len,
            last: blocks[blocks.len() - 1],
            ..Node::FREE
        });
        self.block_count += blocks.len();
        self.attach(parent, leaf);
        self.index_last(leaf);
        leaf
    }

    /// The node that held the last block of the last [`Self::insert`] when it returned.
    pub(crate) fn last_insert_end(&self) -> u32 {
        self.last_end
    }

    /// The node holding the block at `depth` (the length of the path through it; at least 1)
    /// when that block is `block` and `holder` holds it. `hint` is a node that held the block,
    /// or one below it on its path, when last seen: nodes keep their ids when a leaf grows or
    /// the node above is split off, so the position is found by walking up from the hint.
    /// `None` when the hint went stale (its node was freed, or merged away) or the block is
    /// no longer there for `holder`: the caller finds the path another way.
    pub(crate) fn position(
        &self,
        hint: u32,
        depth: usize,
        block: BlockHash,
        holder: WorkerId,
    ) -> Option<u32> {
        self.node_at(hint, depth, block)
            .filter(|&id| self.has_member(id, holder.index()))
    }

    /// [`Self::position`] for any holder: the node at or above `hint` whose edge has `block`
    /// at `depth`.
    fn node_at(&self, hint: u32, depth: usize, block: BlockHash) -> Option<u32> {
        let (id, index) = self.containing(hint, depth)?;
        (self.pool[index] == block).then_some(id)
    }

    /// The node at or above `hint` whose edge holds position `depth` (at least 1), and the
    /// position's index in the pool. `None` when `hint` is not a live node, or its edge ends
    /// above `depth`.
    fn containing(&self, hint: u32, depth: usize) -> Option<(u32, usize)> {
        if hint == ROOT || depth == 0 || !self.alive(hint) {
            return None;
        }
        let at = depth - 1;
        let mut id = hint;
        loop {
            let n = &self.nodes[id as usize];
            let start = n.depth as usize;
            if at >= start + n.edge_len as usize {
                return None;
            }
            if at >= start {
                return Some((id, n.edge_start as usize + at - start));
            }
            id = n.parent;
            if id == ROOT {
                return None;
            }
        }
    }

    /// The node holding the last block of `blocks` (a path from the root), if the tree has it.
    /// Cost: one child lookup per node on the path.
    pub(crate) fn node_holding_end(&self, blocks: &[BlockHash]) -> Option<u32> {
        let mut node = ROOT;
        let mut pos = 0;
        while pos < blocks.len() {
            let child = self.child(node, blocks[pos])?;
            let common = self.common(child, &blocks[pos..]);
            if pos + common == blocks.len() {
                return Some(child);
            }
            if common < self.nodes[child as usize].edge_len as usize {
                return None;
            }
            pos += common;
            node = child;
        }
        None
    }

    /// Writes into `out` the path from the root to position `depth` (at least 1) of `node`,
    /// a node [`Self::position`] or [`Self::indexed_position`] returned for it.
    pub(crate) fn path_to_position(&self, node: u32, depth: usize, out: &mut Vec<BlockHash>) {
        // The edges' pool ranges, leaf first, then copied root first.
        let mut ranges: SmallVec<[(usize, usize); 16]> = SmallVec::new();
        let (mut id, mut end) = (node, depth);
        while id != ROOT {
            let n = &self.nodes[id as usize];
            let start = n.depth as usize;
            ranges.push((n.edge_start as usize, end - start));
            end = start;
            id = n.parent;
        }
        out.clear();
        for &(from, len) in ranges.iter().rev() {
            out.extend_from_slice(&self.pool[from..from + len]);
        }
    }

    /// Starts keeping the index of edges' last blocks (chained trees only; idempotent), so
    /// that [`Self::indexed_position`] can answer. Cost: O(nodes) the first time.
    pub(crate) fn index_last_blocks(&mut self) {
        if self.last_indexed || !self.config.chained {
            return;
        }
        self.last_indexed = true;
        for id in 1..self.nodes.len() as u32 {
            if self.alive(id) {
                self.index_last(id);
            }
        }
    }

    /// Indexes `node` under its edge's last block. The entry under its old last block (or
    /// of a freed node) is left to go stale rather than removed, one map operation fewer
    /// where a leaf grows: lookups check an entry against the tree, and stale entries are
    /// dropped once they are as many as the rest.
    fn index_last(&mut self, node: u32) {
        if !self.last_indexed {
            return;
        }
        self.drop_stale_positions();
        let n = &self.nodes[node as usize];
        let depth = n.depth + n.edge_len;
        let kept = self
            .by_last
            .entry(n.last)
            .or_insert(Indexed { node, depth });
        // A kept position of the same block is the same position.
        *kept = Indexed {
            node,
            depth: depth | (kept.depth & Indexed::KEPT),
        };
    }

    /// Keeps the position of `block` (at `depth`, in `hint` or a node above it) in the index
    /// until the block leaves the tree, even once it no longer ends an edge: a chain tip the
    /// sync state can no longer remember, whose block a later event may name after a leaf
    /// grew past it (a conversation's next turn, routed whole). A no-op unless the index is
    /// kept. The position is not checked here (that would read the tree at a random place):
    /// it is checked where it is used, and dropped with the stale entries when wrong.
    pub(crate) fn keep_position(&mut self, block: BlockHash, hint: u32, depth: usize) {
        let Ok(depth) = u32::try_from(depth) else {
            return;
        };
        if !self.last_indexed || depth >= Indexed::KEPT {
            return;
        }
        self.drop_stale_positions();
        self.by_last
            .entry(block)
            // An entry of the same block is the same position, or stale.
            .and_modify(|entry| entry.depth |= Indexed::KEPT)
            .or_insert(Indexed {
                node: hint,
                depth: depth | Indexed::KEPT,
            });
    }

    /// Whether the index entry of `block` still names where the block is: kept positions
    /// while the block is there, other entries while the block ends their node's edge.
    fn indexed_live(&self, block: BlockHash, entry: Indexed) -> bool {
        if entry.depth & Indexed::KEPT != 0 {
            return self
                .node_at(entry.node, (entry.depth & !Indexed::KEPT) as usize, block)
                .is_some();
        }
        self.nodes
            .get(entry.node as usize)
            .is_some_and(|n| n.parent != NIL && n.last == block)
    }

    /// Drops the index's stale entries once they may be as many as the live ones (so
    /// amortised O(1) per entry added), before an entry is added.
    #[inline]
    fn drop_stale_positions(&mut self) {
        self.index_bound = self.index_bound.max(self.live_nodes);
        if self.by_last.len() >= 2 * self.index_bound + INDEX_SLACK {
            self.drop_stale_now();
        }
    }

    #[cold]
    fn drop_stale_now(&mut self) {
        let mut by_last = core::mem::take(&mut self.by_last);
        by_last.retain(|&block, &mut entry| self.indexed_live(block, entry));
        self.by_last = by_last;
        self.index_bound = self.by_last.len().max(self.live_nodes);
    }

    /// Where `block` is in the tree, from the index of edges' last blocks and kept positions,
    /// when `holder` holds it there: the node and the block's depth (in a chained tree a
    /// block's hash names its whole prefix, so that is the block's own position).
    pub(crate) fn indexed_position(
        &self,
        block: BlockHash,
        holder: WorkerId,
    ) -> Option<(u32, usize)> {
        let &entry = self.by_last.get(&block)?;
        let depth = entry.depth & !Indexed::KEPT;
        let n = self.nodes.get(entry.node as usize)?;
        let node = if n.parent != NIL && n.last == block && n.depth + n.edge_len == depth {
            // Still the end of its node's edge: no need to read the edge.
            self.has_member(entry.node, holder.index())
                .then_some(entry.node)?
        } else {
            // A kept position, or an edge's former end not dropped yet.
            self.position(entry.node, depth as usize, block, holder)?
        };
        Some((node, depth as usize))
    }

    /// Whether `node` is a leaf that `w` alone holds, so that blocks inserted below it for
    /// `w` (which has just refreshed it) extend its edge instead of hanging a new leaf.
    fn extendable(&self, node: u32, w: usize) -> bool {
        node != ROOT
            && self.nodes[node as usize].first_child == NIL
            && self
                .words(node)
                .iter()
                .enumerate()
                .all(|(i, &word)| word == if i == w / 64 { 1 << (w % 64) } else { 0 })
    }

    /// Appends `blocks` to the edge of `node`, an [extendable](Self::extendable) leaf of
    /// `w`, moving the edge to the end of the pool first unless it is there already.
    fn extend_leaf(&mut self, node: u32, w: usize, blocks: &[BlockHash]) {
        self.make_room(self.nodes[node as usize].edge_len as usize + blocks.len());
        let n = self.nodes[node as usize];
        let (start, len) = (n.edge_start as usize, n.edge_len as usize);
        if start + len != self.pool.len() {
            let new_start = self.pool.len() as u32;
            self.pool.extend_from_within(start..start + len);
            self.garbage += len;
            self.nodes[node as usize].edge_start = new_start;
        }
        self.pool.extend_from_slice(blocks);
        let n = &mut self.nodes[node as usize];
        n.edge_len += blocks.len() as u32;
        n.last = blocks[blocks.len() - 1];
        self.index_last(node);
        self.block_count += blocks.len();
        self.workers[w].blocks += blocks.len();
    }

    /// Links `child` (whose `parent` field is set) into its parent's child list and map.
    fn attach(&mut self, parent: u32, child: u32) {
        let first = self.edge(child)[0];
        self.children.insert(child_key(parent, first), child);
        let old_first = self.nodes[parent as usize].first_child;
        let c = &mut self.nodes[child as usize];
        c.parent = parent;
        c.prev_sibling = NIL;
        c.next_sibling = old_first;
        if old_first != NIL {
            self.nodes[old_first as usize].prev_sibling = child;
        }
        self.nodes[parent as usize].first_child = child;
    }

    /// Unlinks `child` from its parent's child list and map.
    fn detach(&mut self, child: u32) {
        let c = self.nodes[child as usize];
        let first = self.edge(child)[0];
        self.children.remove(&child_key(c.parent, first));
        if c.prev_sibling == NIL {
            self.nodes[c.parent as usize].first_child = c.next_sibling;
        } else {
            self.nodes[c.prev_sibling as usize].next_sibling = c.next_sibling;
        }
        if c.next_sibling != NIL {
            self.nodes[c.next_sibling as usize].prev_sibling = c.prev_sibling;
        }
        let c = &mut self.nodes[child as usize];
        c.prev_sibling = NIL;
        c.next_sibling = NIL;
    }

    /// Makes `node` most recently used for `w` at time `now`: adds `w` as a holder if it
    /// was not one, and moves the node and the holding just before the anchors (the
    /// previously refreshed, shallower node), so that the lists stay ordered by recency and,
    /// among equals, deepest first.
    fn refresh(&mut self, node: u32, w: usize, now: u64, anchor_node: &mut u32, anchor: &mut u32) {
        let n = &mut self.nodes[node as usize];
        n.stamp = now;
        let linked = n.lru_prev != NIL || self.lru.head == node;
        // Already just before the anchor (a chain's nodes refreshed again by its next
        // store): the list stays as it is.
        if !(linked && n.lru_next == *anchor_node) {
            if linked {
                unlink(&mut self.nodes, &mut self.lru, node);
            }
            link_before(&mut self.nodes, &mut self.lru, node, *anchor_node);
        }
        *anchor_node = node;

        let h = match self.holding_of(node, w) {
            Some(h) => {
                self.holdings[h as usize].stamp = now;
                if self.holdings[h as usize].next == *anchor {
                    *anchor = h;
                    return;
                }
                unlink(&mut self.holdings, &mut self.workers[w].list, h);
                h
            }
            None => {
                let h = self.new_holding(node, w, now);
                self.set_member(node, w, true);
                self.workers[w].blocks += self.nodes[node as usize].edge_len as usize;
                h
            }
        };
        link_before(&mut self.holdings, &mut self.workers[w].list, h, *anchor);
        *anchor = h;
    }

    fn new_holding(&mut self, node: u32, w: usize, stamp: u64) -> u32 {
        let holding = Holding {
            node,
            worker: w as u32,
            prev: NIL,
            next: NIL,
            stamp,
        };
        let h = if let Some(h) = self.free_holdings.pop() {
            self.holdings[h as usize] = holding;
            h
        } else {
            self.holdings.push(holding);
            (self.holdings.len() - 1) as u32
        };
        self.holding_index.insert(holding_key(node, w), h);
        self.workers[w].holdings += 1;
        h
    }

    fn free_holding(&mut self, h: u32) {
        let Holding { node, worker, .. } = self.holdings[h as usize];
        let w = worker as usize;
        unlink(&mut self.holdings, &mut self.workers[w].list, h);
        self.holding_index.remove(&holding_key(node, w));
        self.holdings[h as usize].node = NIL;
        self.free_holdings.push(h);
        self.workers[w].holdings -= 1;
    }

    /// Splits `node` after `at` blocks (0 < at < len). The upper part gets a new id and
    /// takes the node's place; the lower part keeps the id (and so its children, holdings
    /// and map entries). Returns the upper part.
    fn split(&mut self, node: u32, at: usize) -> u32 {
        let n = self.nodes[node as usize];
        let at = at as u32;
        let upper = self.alloc_node(Node {
            parent: n.parent,
            first_child: node,
            next_sibling: n.next_sibling,
            prev_sibling: n.prev_sibling,
            edge_start: n.edge_start,
            edge_len: at,
            depth: n.depth,
            last: self.pool[(n.edge_start + at - 1) as usize],
            lru_prev: NIL,
            lru_next: NIL,
            stamp: n.stamp,
        });
        // The upper part takes the node's place among its siblings and in the map.
        if n.prev_sibling == NIL {
            self.nodes[n.parent as usize].first_child = upper;
        } else {
            self.nodes[n.prev_sibling as usize].next_sibling = upper;
        }
        if n.next_sibling != NIL {
            self.nodes[n.next_sibling as usize].prev_sibling = upper;
        }
        let first = self.pool[n.edge_start as usize];
        self.children.insert(child_key(n.parent, first), upper);
        // The node becomes the upper part's only child.
        let lower = &mut self.nodes[node as usize];
        lower.parent = upper;
        lower.next_sibling = NIL;
        lower.prev_sibling = NIL;
        lower.edge_start += at;
        lower.edge_len -= at;
        lower.depth += at;
        let lower_first = self.pool[(n.edge_start + at) as usize];
        self.children.insert(child_key(upper, lower_first), node);
        // Same holders, same recency; the upper part is shallower, so it goes right after.
        let (from, to) = (node as usize * self.stride, upper as usize * self.stride);
        self.members.copy_within(from..from + self.stride, to);
        let holders: SmallVec<[usize; 16]> = bits(self.words(node)).collect();
        for w in holders {
            if let Some(h) = self.holding_of(node, w) {
                let stamp = self.holdings[h as usize].stamp;
                let hu = self.new_holding(upper, w, stamp);
                link_after(&mut self.holdings, &mut self.workers[w].list, hu, h);
            }
        }
        link_after(&mut self.nodes, &mut self.lru, upper, node);
        self.index_last(upper);
        upper
    }

    /// Runs the merge checks queued by the operation.
    fn finish_merges(&mut self) {
        while let Some(node) = self.merge_queue.pop() {
            if node != ROOT && self.alive(node) {
                self.try_merge(node);
            }
        }
    }

    /// True when `parent` and its only child are held by the same workers with the same
    /// recency, so the split between them is no longer needed.
    pub(super) fn mergeable(&self, parent: u32) -> Option<u32> {
        let p = &self.nodes[parent as usize];
        let child = p.first_child;
        if child == NIL || self.nodes[child as usize].next_sibling != NIL {
            return None;
        }
        if self.words(parent) != self.words(child) {
            return None;
        }
        for w in bits(self.words(parent)) {
            let (hp, hc) = (self.holding_of(parent, w)?, self.holding_of(child, w)?);
            if self.holdings[hp as usize].stamp != self.holdings[hc as usize].stamp {
                return None;
            }
        }
        Some(child)
    }

    /// Merges `parent` into its only child when the split is no longer needed. The child's id
    /// survives, so its children, map entries and holdings stay as they are.
    fn try_merge(&mut self, parent: u32) {
        let Some(child) = self.mergeable(parent) else {
            return;
        };
        let (p, c) = (self.nodes[parent as usize], self.nodes[child as usize]);
        if p.edge_start + p.edge_len != c.edge_start {
            self.make_room((p.edge_len + c.edge_len) as usize);
        }
        // (Re-read: making room may have moved the edges.)
        let (p, c) = (self.nodes[parent as usize], self.nodes[child as usize]);
        let (start, len) = if p.edge_start + p.edge_len == c.edge_start {
            (p.edge_start, p.edge_len + c.edge_len)
        } else {
            let start = self.pool.len();
            self.pool
                .extend_from_within(p.edge_start as usize..(p.edge_start + p.edge_len) as usize);
            self.pool
                .extend_from_within(c.edge_start as usize..(c.edge_start + c.edge_len) as usize);
            self.garbage += (p.edge_len + c.edge_len) as usize;
            (start as u32, p.edge_len + c.edge_len)
        };
        // The child takes the parent's place among the grandparent's children.
        self.detach(child);
        let grandparent = p.parent;
        self.detach(parent);
        {
            let c = &mut self.nodes[child as usize];
            c.edge_start = start;
            c.edge_len = len;
            c.depth = p.depth;
            c.stamp = c.stamp.max(p.stamp);
        }
        self.attach(grandparent, child);
        // Drop the parent's holdings; the child's are adjacent to them in every list.
        let holders: SmallVec<[usize; 16]> = bits(self.words(parent)).collect();
        for w in holders {
            if let Some(h) = self.holding_of(parent, w) {
                self.free_holding(h);
            }
        }
        // In the global list the merged node takes the parent's (shallower) place.
        unlink(&mut self.nodes, &mut self.lru, child);
        link_after(&mut self.nodes, &mut self.lru, child, parent);
        unlink(&mut self.nodes, &mut self.lru, parent);
        self.free_node(parent);
        self.merge_queue.push(grandparent);
    }

    /// `w` stops holding `node`, which must hold no child `w` holds. Deletes the node when
    /// nobody holds it any more.
    fn remove_holder(&mut self, node: u32, w: usize) {
        let Some(h) = self.holding_of(node, w) else {
            return;
        };
        self.free_holding(h);
        self.set_member(node, w, false);
        let len = self.nodes[node as usize].edge_len as usize;
        self.workers[w].blocks -= len;
        if self.words(node).iter().all(|&word| word == 0) {
            self.delete_node(node);
        } else {
            self.merge_queue.push(node);
        }
    }

    /// Deletes a node nobody holds (and which therefore has no children).
    fn delete_node(&mut self, node: u32) {
        let n = self.nodes[node as usize];
        self.detach(node);
        unlink(&mut self.nodes, &mut self.lru, node);
        self.garbage += n.edge_len as usize;
        self.block_count -= n.edge_len as usize;
        self.free_node(node);
        self.merge_queue.push(n.parent);
    }

    /// `w` drops the last `count` blocks of `node` (which must hold no child `w` holds).
    fn trim(&mut self, node: u32, w: usize, count: usize) {
        let len = self.nodes[node as usize].edge_len as usize;
        if count >= len {
            self.remove_holder(node, w);
            return;
        }
        let only_holder = self.nodes[node as usize].first_child == NIL
            && bits(self.words(node)).all(|holder| holder == w);
        if only_holder {
            let n = &mut self.nodes[node as usize];
            n.edge_len -= count as u32;
            n.last = self.pool[(n.edge_start + n.edge_len - 1) as usize];
            self.index_last(node);
            self.garbage += count;
            self.block_count -= count;
            self.workers[w].blocks -= count;
        } else {
            self.split(node, len - count);
            self.remove_holder(node, w);
        }
    }

    /// `w` drops blocks `offset..` of `node` and everything it holds below it.
    fn drop_from(&mut self, w: usize, node: u32, offset: usize) {
        if self.nodes[node as usize].first_child != NIL {
            self.drop_below(w, node);
        }
        let len = self.nodes[node as usize].edge_len as usize;
        self.trim(node, w, len - offset);
    }

    /// Drops `w` from every node below `node` (deepest first).
    fn drop_below(&mut self, w: usize, node: u32) {
        // Post-order over the subtree, pruned where `w` holds nothing (membership shrinks
        // from root to leaf), so every node is dropped after its children.
        let mut order: SmallVec<[u32; 8]> = SmallVec::new();
        let mut stack: SmallVec<[(u32, bool); 8]> = smallvec::smallvec![(node, false)];
        while let Some((n, expanded)) = stack.pop() {
            if expanded {
                order.push(n);
                continue;
            }
            stack.push((n, true));
            let mut c = self.nodes[n as usize].first_child;
            while c != NIL {
                if self.has_member(c, w) {
                    stack.push((c, false));
                }
                c = self.nodes[c as usize].next_sibling;
            }
        }
        order.pop(); // `node` itself
        for n in order {
            self.remove_holder(n, w);
        }
    }

    /// Where `w` holds the block `first`: a child of the root, or a scan of `w`'s nodes.
    fn locate(&self, w: usize, first: BlockHash) -> Option<(u32, usize)> {
        if let Some(c) = self.child(ROOT, first) {
            return self.has_member(c, w).then_some((c, 0));
        }
        let mut h = self.workers[w].list.head;
        while h != NIL {
            let holding = self.holdings[h as usize];
            if let Some(offset) = self.edge(holding.node).iter().position(|&b| b == first) {
                return Some((holding.node, offset));
            }
            h = holding.next;
        }
        None
    }

    /// Evicts `w`'s least recently used blocks until it is within its capacity.
    fn enforce_capacity(&mut self, w: usize) {
        let mut trimmed = false;
        loop {
            let state = self.workers[w];
            if state.blocks <= state.capacity || state.list.head == NIL {
                break;
            }
            let node = self.holdings[state.list.head as usize].node;
            self.trim(node, w, state.blocks - state.capacity);
            trimmed = true;
        }
        if trimmed {
            self.finish_merges();
        }
    }

    /// Evicts globally least recently used leaves until the tree is within its bounds.
    fn enforce_budget(&mut self) {
        if self.block_count <= self.config.max_blocks
            && self.live_nodes - 1 <= self.config.max_nodes
        {
            return;
        }
        while (self.block_count > self.config.max_blocks
            || self.live_nodes - 1 > self.config.max_nodes)
            && self.lru.head != NIL
        {
            let node = self.lru.head;
            let holders: SmallVec<[usize; 16]> = bits(self.words(node)).collect();
            if holders.is_empty() {
                break; // unreachable while the invariants hold; never loop forever
            }
            for w in holders {
                self.remove_holder(node, w);
            }
        }
        self.finish_merges();
    }

    /// Rewrites the edge pool when a third of it is garbage.
    fn maybe_compact(&mut self) {
        let live = self.pool.len() - self.garbage;
        if self.garbage >= 4096 && self.garbage >= live / 2 {
            self.compact(0);
        }
    }

    /// Before `additional` blocks are appended to the pool: when they would make it grow, it
    /// is rewritten without its garbage and with half the live blocks to spare instead of
    /// doubled, so that its capacity stays within 1.5 × the live blocks (a doubled pool
    /// full of garbage reached 3 ×). As often as [`Self::maybe_compact`] rewrites it anyway.
    fn make_room(&mut self, additional: usize) {
        if self.pool.len() + additional > self.pool.capacity() {
            self.compact(additional);
        }
    }

    /// Rewrites the edge pool without garbage, with room for the live blocks, half as many
    /// more (at least 64) and `additional`.
    fn compact(&mut self, additional: usize) {
        let live = self.pool.len() - self.garbage;
        let mut pool = Vec::with_capacity(live + (live / 2).max(64) + additional);
        for node in &mut self.nodes {
            if node.edge_len > 0 {
                let start = node.edge_start as usize;
                let new_start = pool.len() as u32;
                pool.extend_from_slice(&self.pool[start..start + node.edge_len as usize]);
                node.edge_start = new_start;
            }
        }
        self.pool = pool;
        self.garbage = 0;
    }
}
