//! The radix tree that mirrors every worker's prefix cache.
//!
//! One [`RadixTree`] holds the router's belief about which worker caches which prefix. See
//! [`RadixTree`] for the operations and their costs; this page defines the words its docs
//! use and how the module is cut.
//!
//! # Glossary
//!
//! - **block**: a [`BlockHash`](crate::BlockHash); in a chained tree it names its whole
//!   prefix.
//! - **node**: a run of consecutive blocks that the same workers hold with the same
//!   recency; its blocks are its **edge**. The root holds no blocks.
//! - **depth** of a node: the blocks above its edge; of a block: the length of its path from
//!   the root (so at least 1).
//! - **holder**: a worker holding a node; every node records its holders in a bitset.
//! - **holding**: one holder's hold on one node, with its **stamp**, the logical time of
//!   that worker's last insert or touch through the node, and its **tiers**, the storage
//!   tiers it holds the node's blocks at (the best one counts in a match).
//! - **position**: a checked, weak handle on one block (a node that held it, its depth and
//!   its hash); stale positions are useless, never wrong. A **kept position** is one the
//!   last-block index holds while its block is in the tree.
//! - **tip**: a position event sync remembers for the last block of a recent store (see
//!   `sync`).
//!
//! # Invariants
//!
//! After every public operation: edges are compressed (no node could be merged with its
//! only child); holders shrink from root to leaf; every list of holdings is ordered by stamp,
//! deepest first among equals, so evicting from a list's head removes leaves; every worker
//! holds at most its capacity; the edge pool's capacity stays within 1.5 × the live blocks.
//! [`RadixTree::validate`] checks all of them, layer by layer.
//!
//! # Layers
//!
//! Each file owns a part with its own type, and calls only the parts below it:
//!
//! ```text
//!  radix.rs     RadixTree: the parts composed; public and sync-facing operations
//!  search.rs    read-only walks from the root (match, held prefix, locate)
//!  shape.rs     the child map; attach, split, merge, trim, drop (through `Edit`)
//!  recency.rs   holdings, per-worker and global LRU lists, victims   position.rs  Position, last-block index
//!  arena.rs     NodeId, nodes, the edge pool       members.rs  holder bitsets and tier planes
//! ```
//!
//! Recency chooses what to evict; shape removes it; `RadixTree` runs the loop.

mod arena;
mod members;
mod position;
mod prefix_match;
mod radix;
mod recency;
mod search;
mod shape;
mod tier;

pub(crate) use self::position::Position;
pub use self::prefix_match::PrefixMatch;
pub use self::radix::{RadixTree, TreeConfig};
pub(crate) use self::search::Held;
pub use self::tier::Tier;
pub(crate) use self::tier::TierSet;

/// Identifies one inference worker: a dense index (`0..n`) chosen by the host.
///
/// Opaque apart from its number; routers hand out `WorkerId::new(0)..WorkerId::new(n)`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct WorkerId(u32);

impl WorkerId {
    /// The worker with index `id`.
    #[inline]
    #[must_use]
    pub const fn new(id: u32) -> Self {
        Self(id)
    }

    /// The worker's index.
    #[inline]
    #[must_use]
    pub const fn get(self) -> u32 {
        self.0
    }

    /// The worker's index as a `usize`, for indexing a host's per-worker arrays.
    #[inline]
    #[must_use]
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

#[cfg(test)]
mod tests;
