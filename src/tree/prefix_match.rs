//! The result of one longest-prefix walk: how many leading blocks each worker holds.

use super::search::Held;
use super::{Tier, WorkerId};

/// How many leading blocks of a query each worker holds, from one walk of the tree.
///
/// Filled by [`RadixTree::match_prefix`](super::RadixTree::match_prefix) or reused through
/// [`RadixTree::match_prefix_into`](super::RadixTree::match_prefix_into), which allocates
/// nothing once the buffers are warm.
///
/// ```
/// use prefix_router::{BlockHash, RadixTree, WorkerId};
///
/// let blocks: Vec<BlockHash> = (1..=4).map(BlockHash::new).collect();
/// let mut tree = RadixTree::new();
/// tree.insert(WorkerId::new(0), &blocks[..2]);
/// tree.insert(WorkerId::new(3), &blocks);
/// let m = tree.match_prefix(&blocks);
/// assert_eq!(m.matched_blocks(WorkerId::new(0)), 2);
/// assert_eq!(m.matched_blocks(WorkerId::new(3)), 4);
/// assert_eq!(m.matched_blocks(WorkerId::new(7)), 0);
/// assert_eq!(m.best(), Some((WorkerId::new(3), 4)));
/// ```
#[derive(Clone, Debug, Default)]
pub struct PrefixMatch {
    /// (worker, matched blocks) for every worker with at least one block, in the order the
    /// walk found them: by matched blocks, fewest first, then by worker id.
    entries: Vec<(WorkerId, u32)>,
    /// Blocks held below the device tier (host, disk, remote), by entry, kept only once a
    /// match meets a tier below the device.
    lower: Vec<[u32; 3]>,
    /// Matched blocks indexed by worker; only the entries' slots are non-zero.
    dense: Vec<u32>,
    /// Blocks in the query.
    query_blocks: usize,
}

impl PrefixMatch {
    /// An empty match, for reuse with `match_prefix_into`.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// How many leading blocks of the query `worker` holds (0 for an unknown worker).
    #[inline]
    #[must_use]
    pub fn matched_blocks(&self, worker: WorkerId) -> usize {
        self.dense.get(worker.index()).map_or(0, |&b| b as usize)
    }

    /// The worker holding the longest prefix and its length; ties go to the lowest id.
    /// `None` when no worker holds even the first block.
    ///
    /// Routers break ties in ways that spread load; this is the plain structural answer.
    #[must_use]
    pub fn best(&self) -> Option<(WorkerId, usize)> {
        self.entries
            .iter()
            .copied()
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
            .map(|(w, b)| (w, b as usize))
    }

    /// Every worker that holds at least one leading block, with its matched blocks: by
    /// matched blocks, fewest first, then by worker id.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (WorkerId, usize)> + '_ {
        self.entries.iter().map(|&(w, b)| (w, b as usize))
    }

    /// How many of the leading blocks `worker` holds it holds at `tier` (each block counted
    /// at the best tier holding it; 0 for an unknown worker).
    #[must_use]
    pub fn matched_blocks_at(&self, worker: WorkerId, tier: Tier) -> usize {
        let Some(i) = self.entries.iter().position(|(w, _)| *w == worker) else {
            return 0;
        };
        let lower = self.lower.get(i).copied().unwrap_or_default();
        match tier.index() {
            0 => (self.entries[i].1 - lower.iter().sum::<u32>()) as usize,
            t => lower[t - 1] as usize,
        }
    }

    /// The number of workers that hold at least one leading block.
    #[inline]
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no worker holds the first block.
    #[inline]
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The number of blocks in the query.
    #[inline]
    #[must_use]
    pub fn query_blocks(&self) -> usize {
        self.query_blocks
    }

    /// Forgets the previous result, keeping the buffers.
    pub(crate) fn reset(&mut self, query_blocks: usize) {
        for &(w, _) in &self.entries {
            if let Some(slot) = self.dense.get_mut(w.index()) {
                *slot = 0;
            }
        }
        self.entries.clear();
        self.lower.clear();
        self.query_blocks = query_blocks;
    }

    /// Records that `worker` holds `blocks` leading blocks, all at the device tier. Each
    /// worker is recorded once.
    #[inline]
    pub(crate) fn record_blocks(&mut self, worker: usize, blocks: usize) {
        if self.dense.len() <= worker {
            self.dense.resize(worker + 1, 0);
        }
        let blocks = u32::try_from(blocks).unwrap_or(u32::MAX);
        self.dense[worker] = blocks;
        self.entries.push((WorkerId::new(worker as u32), blocks));
    }

    /// Records what `worker` holds. Each worker is recorded once.
    #[inline]
    pub(crate) fn record(&mut self, worker: usize, held: Held) {
        if self.dense.len() <= worker {
            self.dense.resize(worker + 1, 0);
        }
        self.dense[worker] = held.blocks;
        let lower = [held.by_tier[1], held.by_tier[2], held.by_tier[3]];
        if lower != [0; 3] || !self.lower.is_empty() {
            // Entries before the first one with lower tiers held none.
            self.lower.resize(self.entries.len(), [0; 3]);
            self.lower.push(lower);
        }
        self.entries
            .push((WorkerId::new(worker as u32), held.blocks));
    }
}
