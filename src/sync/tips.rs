//! Remembered chain tips of one worker: the router paths of the blocks its next events most
//! likely name.
//!
//! An engine stores a running request's blocks as consecutive events, each continuing from
//! the previous one's last block, and evicts a finished request's blocks last first. So the
//! parent of a store, or the block of a removal, is usually a tip remembered here, and its
//! router path is found without walking the engine map's parent links (one lookup per block
//! of depth). When the tip was replaced (more requests at once than slots), the tree finds
//! a block that ends one of its edges; tips also cover the blocks that do not, such as the
//! middle of a prompt the router inserted whole before the engine's events for it came.

use core::hash::Hasher as _;

use crate::BlockHash;
use crate::tree::FoldHasher;

/// Sets of two slots each: 64 tips in all (about the number of requests an engine runs at
/// once). A tip's slot is a bit of a `u64`.
const SETS: usize = 32;
const SLOTS: usize = 2 * SETS;

/// Up to [`SLOTS`] tips, each an engine hash and the router path from the root to it, in a
/// two-way set-associative table: finding a tip reads two slots, whatever the number of
/// tips. When both slots of a set are taken, the one written less recently is replaced (its
/// tip is then found through the parent links instead, which is slower, never wrong).
///
/// Paths are swapped in and out rather than copied, and every slot keeps its buffer, so
/// that steady traffic allocates nothing.
#[derive(Debug, Default)]
pub(super) struct Tips {
    /// Engine hash of the tip in each slot (meaningful where `live` has the slot's bit);
    /// empty until the first tip.
    engines: Vec<u64>,
    paths: Vec<Vec<BlockHash>>,
    live: u64,
    /// Per set, which of its two slots was written last.
    recent_way: u32,
}

/// The set of tip `engine`.
fn set_of(engine: u64) -> usize {
    let mut h = FoldHasher::default();
    h.write_u64(engine);
    (h.finish() >> (64 - SETS.trailing_zeros())) as usize
}

impl Tips {
    /// The live slot of tip `engine`.
    fn find(&self, engine: u64) -> Option<usize> {
        if self.engines.is_empty() {
            return None;
        }
        let base = 2 * set_of(engine);
        (base..base + 2).find(|&s| self.live & (1 << s) != 0 && self.engines[s] == engine)
    }

    /// Swaps the remembered path of tip `engine` into `path` and forgets the tip; whether
    /// it was remembered (when not, `path` is unchanged).
    pub(super) fn take(&mut self, engine: u64, path: &mut Vec<BlockHash>) -> bool {
        let Some(slot) = self.find(engine) else {
            return false;
        };
        self.live &= !(1 << slot);
        core::mem::swap(path, &mut self.paths[slot]);
        true
    }

    /// Remembers `path` as the path of tip `engine`. `path` is left holding a spare buffer
    /// of unspecified contents.
    pub(super) fn remember(&mut self, engine: u64, path: &mut Vec<BlockHash>) {
        if self.engines.is_empty() {
            self.engines = vec![0; SLOTS];
            self.paths = (0..SLOTS).map(|_| Vec::new()).collect();
        }
        let set = set_of(engine);
        let slot = self.find(engine).unwrap_or_else(|| {
            let base = 2 * set;
            if self.live & (1 << base) == 0 {
                base
            } else if self.live & (1 << (base + 1)) == 0 {
                base + 1
            } else {
                // Both taken: replace the one written less recently.
                base + 1 - (self.recent_way >> set & 1) as usize
            }
        });
        self.engines[slot] = engine;
        self.live |= 1 << slot;
        self.recent_way = (self.recent_way & !(1 << set)) | ((slot as u32 & 1) << set);
        core::mem::swap(path, &mut self.paths[slot]);
    }

    /// Forgets every tip whose path runs through the last block of `removed` (the path of a
    /// block being evicted). A remembered path stays exactly what the parent links would
    /// give: the tips below an evicted block have an unknown ancestor from now on.
    pub(super) fn forget_through(&mut self, removed: &[BlockHash]) {
        let depth = removed.len();
        let block = removed[depth - 1];
        let mut live = self.live;
        while live != 0 {
            let slot = live.trailing_zeros() as usize;
            live &= live - 1;
            if self.paths[slot].get(depth - 1) == Some(&block) {
                self.live &= !(1 << slot);
            }
        }
    }

    /// Forgets every tip (keeping the buffers).
    pub(super) fn clear(&mut self) {
        self.live = 0;
    }

    /// Bytes allocated.
    pub(super) fn allocation_size(&self) -> usize {
        self.engines.capacity() * core::mem::size_of::<u64>()
            + self.paths.capacity() * core::mem::size_of::<Vec<BlockHash>>()
            + self
                .paths
                .iter()
                .map(|p| p.capacity() * core::mem::size_of::<BlockHash>())
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(blocks: &[u64]) -> Vec<BlockHash> {
        blocks.iter().map(|&b| BlockHash::new(b)).collect()
    }

    fn take(tips: &mut Tips, engine: u64) -> Option<Vec<BlockHash>> {
        let mut out = Vec::new();
        tips.take(engine, &mut out).then_some(out)
    }

    #[test]
    fn a_taken_tip_is_gone_until_remembered_again() {
        let mut tips = Tips::default();
        tips.remember(30, &mut path(&[1, 2, 3]));
        let mut out = take(&mut tips, 30).unwrap();
        assert_eq!(out, path(&[1, 2, 3]));
        assert_eq!(take(&mut tips, 30), None);
        out.push(BlockHash::new(4));
        tips.remember(40, &mut out);
        assert_eq!(take(&mut tips, 40), Some(path(&[1, 2, 3, 4])));
    }

    #[test]
    fn remembering_a_tip_again_replaces_its_path() {
        let mut tips = Tips::default();
        tips.remember(7, &mut path(&[1]));
        tips.remember(7, &mut path(&[2]));
        assert_eq!(take(&mut tips, 7), Some(path(&[2])));
        assert_eq!(take(&mut tips, 7), None);
    }

    #[test]
    fn forgetting_through_a_block_drops_exactly_the_tips_below_it() {
        let mut tips = Tips::default();
        tips.remember(3, &mut path(&[1, 2, 3]));
        tips.remember(5, &mut path(&[1, 4, 5]));
        tips.remember(2, &mut path(&[1, 2]));
        tips.forget_through(&path(&[1, 2]));
        assert_eq!(take(&mut tips, 3), None);
        assert_eq!(take(&mut tips, 2), None);
        assert_eq!(take(&mut tips, 5), Some(path(&[1, 4, 5])));
    }

    #[test]
    fn a_full_set_replaces_its_less_recently_written_slot() {
        // Three tips of one set: the first written is the one replaced.
        let same_set: Vec<u64> = (0..).filter(|&e| set_of(e) == set_of(0)).take(3).collect();
        let mut tips = Tips::default();
        for &e in &same_set {
            tips.remember(e, &mut path(&[e]));
        }
        assert_eq!(take(&mut tips, same_set[0]), None);
        assert_eq!(take(&mut tips, same_set[1]), Some(path(&[same_set[1]])));
        assert_eq!(take(&mut tips, same_set[2]), Some(path(&[same_set[2]])));
        // Tips of other sets are untouched by a full one.
        let other = (0..).find(|&e| set_of(e) != set_of(0)).unwrap();
        tips.remember(other, &mut path(&[9]));
        for &e in &same_set {
            tips.remember(e, &mut path(&[e]));
        }
        assert_eq!(take(&mut tips, other), Some(path(&[9])));
        tips.clear();
        assert_eq!(take(&mut tips, same_set[2]), None);
    }
}
