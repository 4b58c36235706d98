//! Read-only walks from the root: how far a query's blocks follow the tree, for every holder
//! or for one.

use smallvec::SmallVec;

use super::arena::{Arena, NodeId, bits};
use super::shape::Shape;
use crate::hash::BlockHash;

/// How many leading blocks of a query a worker holds, and how many of them at each tier
/// (by [`Tier::index`](super::Tier::index)): each block counts at the best tier holding it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) blocks: u32,
    pub(crate) by_tier: [u32; 4],
}

impl Held {
    /// `blocks` blocks, all at the device tier.
    #[inline]
    pub(crate) fn device(blocks: usize) -> Self {
        let blocks = u32::try_from(blocks).unwrap_or(u32::MAX);
        Held {
            blocks,
            by_tier: [blocks, 0, 0, 0],
        }
    }
}

/// A read-only view for walks: the arena, the child map and how edges are compared.
#[derive(Clone, Copy)]
pub(super) struct Search<'t> {
    pub(super) arena: &'t Arena,
    pub(super) shape: &'t Shape,
    /// Whether block runs are chains (see [`TreeConfig::chained`](super::TreeConfig)).
    pub(super) chained: bool,
}

/// Where a walk along a query stopped: the deepest node it reached (the root when none) and
/// how many of the query's blocks matched, and whether it stopped inside that node's edge.
#[derive(Clone, Copy, Debug)]
pub(super) struct Reached {
    pub(super) node: NodeId,
    pub(super) matched: usize,
    pub(super) inside: bool,
}

impl Search<'_> {
    /// The child of `parent` whose edge starts with `first`.
    #[inline]
    pub(super) fn child(&self, parent: NodeId, first: BlockHash) -> Option<NodeId> {
        self.shape.child(self.arena, parent, first)
    }

    /// Common prefix of `node`'s edge and `query`, by the configured comparison. Both are
    /// non-empty and their first blocks are equal (the child map matched them).
    #[inline]
    pub(super) fn common(&self, node: NodeId, query: &[BlockHash]) -> usize {
        if self.chained {
            // A whole edge is matched when its last block is: no pool read.
            let n = &self.arena[node];
            let len = n.len();
            if len <= query.len() && n.last() == query[len - 1] {
                return len;
            }
            chained_common_prefix(self.arena.edge(node), query)
        } else {
            1 + common_prefix(&self.arena.edge(node)[1..], &query[1..])
        }
    }

    /// Walks `blocks` from the root while `keep(node)` holds for each node entered,
    /// calling `entered(parent, child, matched before the child)` before each step down.
    #[inline]
    pub(super) fn walk(
        &self,
        blocks: &[BlockHash],
        mut keep: impl FnMut(NodeId) -> bool,
        mut entered: impl FnMut(NodeId, NodeId, usize),
    ) -> Reached {
        let mut reached = Reached {
            node: NodeId::ROOT,
            matched: 0,
            inside: false,
        };
        while reached.matched < blocks.len() {
            let Some(child) = self.child(reached.node, blocks[reached.matched]) else {
                break;
            };
            if !keep(child) {
                break;
            }
            entered(reached.node, child, reached.matched);
            let common = self.common(child, &blocks[reached.matched..]);
            reached.matched += common;
            reached.node = child;
            if common < self.arena[child].len() {
                reached.inside = true;
                break;
            }
        }
        reached
    }

    /// Calls `f(worker index, held)` once for every worker holding at least the first
    /// block of `blocks`, with how many leading blocks it holds (at which tiers), fewest
    /// first, then by worker index.
    #[inline]
    pub(super) fn for_each_match(&self, blocks: &[BlockHash], mut f: impl FnMut(usize, Held)) {
        if self.arena.tiered() {
            self.for_each_tiered_match(blocks, f);
        } else {
            self.for_each_blocks(blocks, |w, matched| f(w, Held::device(matched)));
        }
    }

    /// [`Self::for_each_match`] counting blocks only (every block counted as held at the
    /// device tier): calls `f(worker index, blocks)`.
    #[inline]
    pub(super) fn for_each_blocks(&self, blocks: &[BlockHash], mut f: impl FnMut(usize, usize)) {
        let arena = self.arena;
        let reached = self.walk(
            blocks,
            |_| true,
            |node, child, matched| {
                if node != NodeId::ROOT {
                    // Holders of `node` that do not hold `child` match exactly `matched`.
                    let (above, below) = (arena.words(node), arena.words(child));
                    for (i, (&a, &b)) in above.iter().zip(below).enumerate() {
                        let mut gone = a & !b;
                        while gone != 0 {
                            f(i * 64 + gone.trailing_zeros() as usize, matched);
                            gone &= gone - 1;
                        }
                    }
                }
            },
        );
        if reached.node != NodeId::ROOT {
            for w in bits(arena.words(reached.node)) {
                f(w, reached.matched);
            }
        }
    }

    /// [`Self::for_each_match`] where tier planes are kept: the path is walked first, then
    /// each holder's blocks are counted at its best tier node by node.
    fn for_each_tiered_match(&self, blocks: &[BlockHash], mut f: impl FnMut(usize, Held)) {
        // (node, blocks of the query matched in its edge), root excluded.
        let mut path: SmallVec<[(NodeId, u32); 16]> = SmallVec::new();
        self.walk(blocks, |_| true, |_, child, _| path.push((child, 0)));
        let mut matched = 0usize;
        for entry in &mut path {
            let len = self.arena[entry.0].len().min(blocks.len() - matched);
            let common = self.common(entry.0, &blocks[matched..]).min(len);
            entry.1 = common as u32;
            matched += common;
        }
        for (j, &(node, _)) in path.iter().enumerate() {
            let here = self.arena.words(node);
            let below = path.get(j + 1).map(|&(n, _)| self.arena.words(n));
            for (i, &word) in here.iter().enumerate() {
                let mut gone = word & !below.map_or(0, |b| b[i]);
                while gone != 0 {
                    let w = i * 64 + gone.trailing_zeros() as usize;
                    f(w, self.held_along(&path[..=j], w));
                    gone &= gone - 1;
                }
            }
        }
    }

    /// What worker `w` holds of `path` (every node of which it holds), tier by tier.
    fn held_along(&self, path: &[(NodeId, u32)], w: usize) -> Held {
        let mut held = Held::default();
        for &(node, len) in path {
            held.blocks += len;
            held.by_tier[usize::from(self.arena.best_tier(node, w))] += len;
        }
        held
    }

    /// How many leading blocks of `blocks` worker `w` holds.
    #[inline]
    pub(super) fn held_prefix(&self, w: usize, blocks: &[BlockHash]) -> usize {
        self.walk(blocks, |n| self.arena.has_member(n, w), |_, _, _| {})
            .matched
    }

    /// The node holding the last block of `blocks` (a path from the root), if the tree has
    /// that path.
    pub(super) fn path_end(&self, blocks: &[BlockHash]) -> Option<NodeId> {
        let reached = self.walk(blocks, |_| true, |_, _, _| {});
        (reached.node != NodeId::ROOT && reached.matched == blocks.len()).then_some(reached.node)
    }

    /// The node whose edge holds block `at` (0-based) of `blocks` (a path from the root),
    /// and the block's offset in that edge, if the tree has the path that far.
    pub(super) fn locate_depth(&self, blocks: &[BlockHash], at: usize) -> Option<(NodeId, usize)> {
        let mut node = NodeId::ROOT;
        let mut pos = 0;
        loop {
            let child = self.child(node, blocks[pos])?;
            let len = self.arena[child].len();
            let common = self.common(child, &blocks[pos..]);
            if at < pos + common {
                return Some((child, at - pos));
            }
            if common < len || pos + len >= blocks.len() {
                return None;
            }
            pos += len;
            node = child;
        }
    }

    /// Where worker `w` holds the block `first`: a child of the root, or a scan of the nodes
    /// `w` holds (least recent first).
    pub(super) fn locate(
        &self,
        first: BlockHash,
        w: usize,
        held: impl Iterator<Item = NodeId>,
    ) -> Option<(NodeId, usize)> {
        if let Some(c) = self.child(NodeId::ROOT, first) {
            return self.arena.has_member(c, w).then_some((c, 0));
        }
        held.into_iter().find_map(|node| {
            let offset = self.arena.edge(node).iter().position(|&b| b == first)?;
            Some((node, offset))
        })
    }

    /// How many blocks of `run` (a run of consecutive blocks whose first is at offset
    /// `offset` of `node`'s edge) continue the chain below that first block.
    pub(super) fn run_length(&self, node: NodeId, offset: usize, run: &[BlockHash]) -> usize {
        let mut skipped = 1;
        let (mut n, mut o) = (node, offset + 1);
        while skipped < run.len() {
            if o < self.arena[n].len() {
                if self.arena.edge(n)[o] != run[skipped] {
                    break;
                }
                o += 1;
            } else {
                match self.child(n, run[skipped]) {
                    Some(c) => (n, o) = (c, 1),
                    None => break,
                }
            }
            skipped += 1;
        }
        skipped
    }
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
/// `a[0] == b[0]` is known (the child map matched it), so it is not read again.
#[inline]
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
