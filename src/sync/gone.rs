//! Records of engine blocks a worker dropped lately, kept a while for the lower-tier stores
//! that still name them.
//!
//! vLLM copies a block to the CPU as it is computed, and reports the copy when the transfer
//! completes, a few engine steps later; by then the GPU may have evicted the block (a
//! placeholder then names a block the mirror no longer knows) or the block before a chunk
//! (a self-describing chunk then names an unknown parent). The last dropped records, up to
//! a bound, let such a store still find the router's hash of the block it names.

use std::collections::VecDeque;

use crate::fold::FoldMap;
use crate::hash::BlockHash;

/// A record as it was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Dropped {
    /// The router hash.
    pub(super) router: BlockHash,
    /// The parent link (`None` at the root), so a record brought back is placed where it
    /// was, never at the root for want of its parent.
    pub(super) parent: Option<u64>,
}

/// The last records dropped, oldest first, at most a bound.
#[derive(Debug, Default)]
pub(super) struct Gone {
    /// Engine hash → the record as it was, and the serial of its newest entry in `order`.
    map: FoldMap<u64, (Dropped, u64)>,
    /// (engine hash, serial), oldest first.
    order: VecDeque<(u64, u64)>,
    /// The next serial.
    serial: u64,
}

impl Gone {
    /// The fewest records kept, whatever the worker holds.
    const MIN_BOUND: usize = 1024;

    /// Keeps the dropped record of `engine`, then forgets the oldest beyond
    /// `max(MIN_BOUND, bound)`.
    pub(super) fn keep(&mut self, engine: u64, dropped: Dropped, bound: usize) {
        self.map.insert(engine, (dropped, self.serial));
        self.order.push_back((engine, self.serial));
        self.serial += 1;
        while self.order.len() > bound.max(Self::MIN_BOUND) {
            let Some((old, serial)) = self.order.pop_front() else {
                break;
            };
            if self.map.get(&old).is_some_and(|&(_, s)| s == serial) {
                self.map.remove(&old);
            }
        }
    }

    /// The router hash of the dropped block `engine`, if kept.
    pub(super) fn router(&self, engine: u64) -> Option<BlockHash> {
        self.get(engine).map(|d| d.router)
    }

    /// The dropped record of `engine`, if kept.
    pub(super) fn get(&self, engine: u64) -> Option<Dropped> {
        self.map.get(&engine).map(|&(dropped, _)| dropped)
    }

    /// Forgets every record.
    pub(super) fn clear(&mut self) {
        self.map.clear();
        self.order.clear();
    }

    /// Bytes allocated.
    pub(super) fn allocation_size(&self) -> usize {
        self.map.allocation_size() + self.order.capacity() * core::mem::size_of::<(u64, u64)>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_records_up_to_the_bound() {
        let mut gone = Gone::default();
        let bound = Gone::MIN_BOUND;
        let dropped = |router, parent| Dropped {
            router: BlockHash::new(router),
            parent,
        };
        for e in 0..(bound as u64 + 10) {
            gone.keep(e, dropped(e + 100, e.checked_sub(1)), 0);
        }
        assert_eq!(gone.router(5), None, "the oldest went");
        assert_eq!(
            gone.router(bound as u64 + 9),
            Some(BlockHash::new(bound as u64 + 109))
        );
        // A record kept again is kept from its newest entry.
        gone.keep(20, dropped(7, Some(3)), 0);
        for e in 0..(bound as u64 - 1) {
            gone.keep(10_000 + e, dropped(e, None), 0);
        }
        assert_eq!(gone.router(20), Some(BlockHash::new(7)));
        assert_eq!(gone.get(20), Some(dropped(7, Some(3))));
        gone.clear();
        assert_eq!(gone.router(20), None);
    }
}
