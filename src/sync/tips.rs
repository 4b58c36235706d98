//! Remembered chain tips of one worker: where in the tree the blocks its next events most
//! likely name are.
//!
//! An engine stores a running request's blocks as consecutive events, each continuing from
//! the previous one's last block, and evicts a finished request's blocks last first. So the
//! parent of a store, or the block of a removal, is usually a tip remembered here, and its
//! router path is read off the tree instead of walking the engine map's parent links (one
//! lookup per block of depth).
//!
//! A tip is the block's engine hash and its tree [`Position`], which the tree checks when the
//! tip is used (`RadixTree::resolve`): a tip that went stale (its node merged away, the block
//! evicted for the worker) is never wrong, only useless. A tip displaced from a full table is
//! handed to the tree, which keeps its position in its index while the block is there
//! (`RadixTree::keep`).

use crate::bits::{bit, set_bit};
use crate::fold::fold64;
use crate::tree::Position;

/// Sets of two slots each: the table starts with [`MIN_SETS`] and doubles while tips
/// collide, up to 256 tips in all, as many requests as an engine runs at once by default
/// (vLLM's `max_num_seqs`).
const MIN_SETS: usize = 4;
const MAX_SETS: usize = 128;

/// One remembered tip.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Tip {
    /// The engine's hash of the block (the key).
    pub(super) engine: u64,
    /// Where the tree held the block (its router hash, depth and node).
    pub(super) position: Position,
}

/// Tips in a two-way set-associative table: finding one reads two slots, whatever the
/// number of tips. When both slots of a set are taken the table doubles, up to
/// [`MAX_SETS`] sets; past that the slot written less recently is replaced (its block's path
/// is then found another way, which is slower, never wrong). So a worker's tips take memory
/// in proportion to the requests it runs at once, at most 6 KiB.
#[derive(Debug, Default)]
pub(super) struct Tips {
    /// Two per set; empty until the first tip.
    slots: Vec<Tip>,
    /// A bit per slot: whether it holds a tip.
    live: Vec<u64>,
    /// A bit per set: which of its two slots was written last.
    recent_way: Vec<u64>,
}

/// The set of tip `engine` among `sets` (a power of two): the top bits of its hash, so that
/// doubling the sets splits each in two.
fn set_of(engine: u64, sets: usize) -> usize {
    (fold64(engine) >> (64 - sets.trailing_zeros())) as usize
}

impl Tips {
    fn sets(&self) -> usize {
        self.slots.len() / 2
    }

    /// The live slot of tip `engine`.
    fn find(&self, engine: u64) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let base = 2 * set_of(engine, self.sets());
        (base..base + 2).find(|&s| bit(&self.live, s) && self.slots[s].engine == engine)
    }

    /// Takes (forgets) tip `engine`.
    pub(super) fn take(&mut self, engine: u64) -> Option<Tip> {
        let slot = self.find(engine)?;
        set_bit(&mut self.live, slot, false);
        Some(self.slots[slot])
    }

    /// Remembers `tip`, replacing any tip of the same engine hash. Returns the tip it
    /// displaced to make room (another block's, once the table is at its largest).
    pub(super) fn remember(&mut self, tip: Tip) -> Option<Tip> {
        if self.slots.is_empty() {
            self.resize(MIN_SETS);
        }
        loop {
            let sets = self.sets();
            let base = 2 * set_of(tip.engine, sets);
            let live = [bit(&self.live, base), bit(&self.live, base + 1)];
            // The tip's own slot, else a free one.
            let way = (0..2)
                .find(|&k| live[k] && self.slots[base + k].engine == tip.engine)
                .or_else(|| (0..2).find(|&k| !live[k]));
            let slot = match way {
                Some(k) => base + k,
                None if sets < MAX_SETS => {
                    self.resize(2 * sets);
                    continue;
                }
                None => {
                    // Both taken and the table at its size: replace the one written less
                    // recently.
                    let slot = base + usize::from(!bit(&self.recent_way, base / 2));
                    let displaced = self.slots[slot];
                    self.put(slot, tip);
                    return Some(displaced);
                }
            };
            self.put(slot, tip);
            return None;
        }
    }

    fn put(&mut self, slot: usize, tip: Tip) {
        self.slots[slot] = tip;
        set_bit(&mut self.live, slot, true);
        set_bit(&mut self.recent_way, slot / 2, slot % 2 == 1);
    }

    /// Rebuilds the table with `sets` sets, keeping every live tip: a set of the old table
    /// splits into two of the new one, so two slots each still suffice.
    fn resize(&mut self, sets: usize) {
        let old = core::mem::take(&mut self.slots);
        let live = core::mem::take(&mut self.live);
        self.slots = vec![Tip::default(); 2 * sets];
        self.live = vec![0; (2 * sets).div_ceil(64)];
        self.recent_way = vec![0; sets.div_ceil(64)];
        for (slot, tip) in old.iter().enumerate() {
            if bit(&live, slot) {
                let base = 2 * set_of(tip.engine, sets);
                let way = usize::from(bit(&self.live, base));
                self.put(base + way, *tip);
            }
        }
    }

    /// Forgets every tip (keeping the allocation).
    pub(super) fn clear(&mut self) {
        self.live.fill(0);
    }

    /// Bytes allocated.
    pub(super) fn allocation_size(&self) -> usize {
        self.slots.capacity() * core::mem::size_of::<Tip>()
            + (self.live.capacity() + self.recent_way.capacity()) * core::mem::size_of::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tip(engine: u64) -> Tip {
        Tip {
            engine,
            position: Position::for_test(engine as u32, 3, engine * 10),
        }
    }

    #[test]
    fn a_taken_tip_is_gone_until_remembered_again() {
        let mut tips = Tips::default();
        tips.remember(tip(30));
        assert_eq!(tips.take(30).map(|t| t.position.block().get()), Some(300));
        assert!(tips.take(30).is_none());
        tips.remember(tip(30));
        assert!(tips.take(30).is_some());
    }

    #[test]
    fn remembering_a_tip_again_replaces_it() {
        let mut tips = Tips::default();
        tips.remember(tip(7));
        tips.remember(Tip {
            position: Position::for_test(7, 9, 70),
            ..tip(7)
        });
        assert_eq!(tips.take(7).map(|t| t.position.depth()), Some(9));
        assert!(tips.take(7).is_none());
    }

    /// Three engine hashes in the set of 0 among `sets`.
    fn same_set(sets: usize) -> Vec<u64> {
        (0..)
            .filter(|&e| set_of(e, sets) == set_of(0, sets))
            .take(3)
            .collect()
    }

    #[test]
    fn colliding_tips_grow_the_table_and_past_its_size_replace_the_older_slot() {
        let mut tips = Tips::default();
        // Three tips of one set of the smallest table: it grows instead of dropping one.
        let same = same_set(MIN_SETS);
        for &e in &same {
            tips.remember(tip(e));
        }
        assert!(tips.sets() > MIN_SETS);
        for &e in &same {
            assert_eq!(tips.take(e).map(|t| t.engine), Some(e));
        }
        // At the largest size, three tips of one set: the first written is replaced.
        let full = same_set(MAX_SETS);
        for &e in &full {
            tips.remember(tip(e));
        }
        assert_eq!(tips.sets(), MAX_SETS);
        assert!(tips.take(full[0]).is_none());
        assert!(tips.take(full[1]).is_some());
        assert!(tips.take(full[2]).is_some());
        // Tips of other sets are untouched, and clearing forgets them all.
        let other = (0..)
            .find(|&e| set_of(e, MAX_SETS) != set_of(0, MAX_SETS))
            .unwrap();
        tips.remember(tip(other));
        for &e in &full {
            tips.remember(tip(e));
        }
        assert!(tips.take(other).is_some());
        tips.remember(tip(other));
        tips.clear();
        assert!(tips.take(other).is_none());
        assert!(tips.allocation_size() <= 2 * MAX_SETS * 24 + 64);
    }

    #[test]
    fn growing_keeps_every_tip() {
        let mut tips = Tips::default();
        for e in 0..200u64 {
            tips.remember(tip(e));
        }
        // 200 tips fit in 256 slots unless three hash to one set of the largest table.
        let kept = (0..200u64).filter(|&e| tips.take(e).is_some()).count();
        assert!(kept >= 190, "{kept}");
        assert!(tips.sets() <= MAX_SETS);
    }
}
