//! Remembered chain tips of one worker: where in the tree the blocks its next events most
//! likely name are.
//!
//! An engine stores a running request's blocks as consecutive events, each continuing from
//! the previous one's last block, and evicts a finished request's blocks last first. So the
//! parent of a store, or the block of a removal, is usually a tip remembered here, and its
//! router path is read off the tree instead of walking the engine map's parent links (one
//! lookup per block of depth).
//!
//! A tip is a weak pointer: the block's router hash, its depth and the tree node that held it.
//! The tree checks all three when the tip is used (`RadixTree::position`), so a tip that
//! went stale (its node merged away, the block evicted for the worker) is never wrong, only
//! useless.

use core::hash::Hasher as _;

use crate::BlockHash;
use crate::tree::FoldHasher;

/// Sets of two slots each: 256 tips in all, as many requests as an engine runs at once by
/// default (vLLM's `max_num_seqs`).
const SETS: usize = 128;
const SLOTS: usize = 2 * SETS;
const WORDS: usize = SLOTS / 64;

/// One remembered tip.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Tip {
    /// The engine's hash of the block (the key).
    pub(super) engine: u64,
    /// The router's hash of the block.
    pub(super) router: BlockHash,
    /// The tree node that held the block when it was remembered.
    pub(super) node: u32,
    /// The length of the block's path from the root.
    pub(super) depth: u32,
}

/// Up to [`SLOTS`] tips in a two-way set-associative table: finding one reads two slots,
/// whatever the number of tips. When both slots of a set are taken, the one written less
/// recently is replaced (its block's path is then found through the parent links instead,
/// which is slower, never wrong).
#[derive(Debug, Default)]
pub(super) struct Tips {
    /// Empty until the first tip.
    slots: Vec<Tip>,
    live: [u64; WORDS],
    /// Per set, which of its two slots was written last.
    recent_way: [u64; SETS / 64],
}

/// The set of tip `engine`.
fn set_of(engine: u64) -> usize {
    let mut h = FoldHasher::default();
    h.write_u64(engine);
    (h.finish() >> (64 - SETS.trailing_zeros())) as usize
}

fn bit(words: &[u64], i: usize) -> bool {
    words[i / 64] & (1 << (i % 64)) != 0
}

fn set_bit(words: &mut [u64], i: usize, on: bool) {
    if on {
        words[i / 64] |= 1 << (i % 64);
    } else {
        words[i / 64] &= !(1 << (i % 64));
    }
}

impl Tips {
    /// The live slot of tip `engine`.
    fn find(&self, engine: u64) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let base = 2 * set_of(engine);
        (base..base + 2).find(|&s| bit(&self.live, s) && self.slots[s].engine == engine)
    }

    /// Takes (forgets) tip `engine`.
    pub(super) fn take(&mut self, engine: u64) -> Option<Tip> {
        let slot = self.find(engine)?;
        set_bit(&mut self.live, slot, false);
        Some(self.slots[slot])
    }

    /// Remembers `tip`, replacing any tip of the same engine hash.
    pub(super) fn remember(&mut self, tip: Tip) {
        if self.slots.is_empty() {
            self.slots = vec![Tip::default(); SLOTS];
        }
        let set = set_of(tip.engine);
        let slot = self.find(tip.engine).unwrap_or_else(|| {
            let base = 2 * set;
            if !bit(&self.live, base) {
                base
            } else if !bit(&self.live, base + 1) {
                base + 1
            } else {
                // Both taken: replace the one written less recently.
                base + usize::from(!bit(&self.recent_way, set))
            }
        });
        self.slots[slot] = tip;
        set_bit(&mut self.live, slot, true);
        set_bit(&mut self.recent_way, set, slot % 2 == 1);
    }

    /// Forgets every tip (keeping the allocation).
    pub(super) fn clear(&mut self) {
        self.live = [0; WORDS];
    }

    /// Bytes allocated.
    pub(super) fn allocation_size(&self) -> usize {
        self.slots.capacity() * core::mem::size_of::<Tip>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tip(engine: u64) -> Tip {
        Tip {
            engine,
            router: BlockHash::new(engine * 10),
            node: engine as u32,
            depth: 3,
        }
    }

    #[test]
    fn a_taken_tip_is_gone_until_remembered_again() {
        let mut tips = Tips::default();
        tips.remember(tip(30));
        assert_eq!(tips.take(30).map(|t| t.router), Some(BlockHash::new(300)));
        assert!(tips.take(30).is_none());
        tips.remember(tip(30));
        assert!(tips.take(30).is_some());
    }

    #[test]
    fn remembering_a_tip_again_replaces_it() {
        let mut tips = Tips::default();
        tips.remember(tip(7));
        tips.remember(Tip { depth: 9, ..tip(7) });
        assert_eq!(tips.take(7).map(|t| t.depth), Some(9));
        assert!(tips.take(7).is_none());
    }

    #[test]
    fn a_full_set_replaces_its_less_recently_written_slot() {
        // Three tips of one set: the first written is the one replaced.
        let same_set: Vec<u64> = (0..).filter(|&e| set_of(e) == set_of(0)).take(3).collect();
        let mut tips = Tips::default();
        for &e in &same_set {
            tips.remember(tip(e));
        }
        assert!(tips.take(same_set[0]).is_none());
        assert!(tips.take(same_set[1]).is_some());
        assert!(tips.take(same_set[2]).is_some());
        // Tips of other sets are untouched by a full one.
        let other = (0..).find(|&e| set_of(e) != set_of(0)).unwrap();
        tips.remember(tip(other));
        for &e in &same_set {
            tips.remember(tip(e));
        }
        assert!(tips.take(other).is_some());
        tips.clear();
        assert!(tips.take(same_set[2]).is_none());
    }
}
