//! What one store event carries into a worker's sync ([`Stored`]), the paths reused from
//! event to event ([`Scratch`]), and how a mirror treats events beyond their hashes
//! ([`SyncConfig`]): shared by the main group's sync, the other groups' and the state that
//! routes events to them.

use crate::hash::{BlockHash, BlockKey, TokenId};
use crate::tree::Tier;

/// Paths reused from event to event, so that applying one allocates nothing once warm.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    /// The router path of a store (or of a removed block found through the parent links).
    pub(super) path: Vec<BlockHash>,
    /// A store's whole path from the root, when it must be inserted whole.
    pub(super) full: Vec<BlockHash>,
    /// A finer-grained store's engine hashes, one per router block.
    pub(super) coarse: Vec<u64>,
    /// The indices, in a store, of blocks recorded before it.
    pub(super) again: Vec<u32>,
}

/// The fields of a `Stored` event with tokens, in the router's block size.
#[derive(Clone, Copy)]
pub(super) struct Stored<'e> {
    pub(super) parent: Option<u64>,
    pub(super) blocks: &'e [u64],
    pub(super) tokens: &'e [TokenId],
    pub(super) tier: Tier,
    pub(super) salt: &'e [u8],
    pub(super) keys: &'e [BlockKey],
    /// Whether blocks already held are stored again as second copies (`false` for a
    /// prefix hit reported again: see `SyncState::reported_again`).
    pub(super) copies: bool,
}

/// How a sync state treats events beyond their block hashes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SyncConfig {
    /// Groups mirrored: events of groups at or beyond it are skipped and counted.
    pub(crate) max_groups: u32,
    /// Blocks per chunk of a lower tier (at least 1).
    pub(crate) chunk_blocks: usize,
    /// Whether engines report prefix hits again as stores (see
    /// `SyncState::reported_again`).
    pub(crate) full_reports: bool,
}

impl Default for SyncConfig {
    fn default() -> Self {
        Self {
            max_groups: 8,
            chunk_blocks: 1,
            full_reports: false,
        }
    }
}
