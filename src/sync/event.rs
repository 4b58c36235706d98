//! [`CacheEvent`]: one change to a worker's KV cache, in the router's terms.

use super::GroupKind;
use crate::hash::{BlockKey, TokenId};
use crate::tree::Tier;

/// One change to a worker's KV cache, as an engine reports it.
///
/// Block hashes are the **engine's** opaque 64-bit keys, not the router's. Build events with
/// [`CacheEvent::stored`] and [`CacheEvent::removed`] (device tier, main group, no namespace)
/// and the `with_*` methods; match them with `..`, since variants grow fields.
///
/// ```
/// use prefix_router::{CacheEvent, Tier};
///
/// let tokens: Vec<u32> = (0..32).collect();
/// let stored = CacheEvent::stored(None, vec![11, 12], tokens).with_tier(Tier::Host);
/// assert!(matches!(stored, CacheEvent::Stored { tier: Tier::Host, .. }));
/// let removed = CacheEvent::removed(vec![12]).with_group(1);
/// assert!(matches!(removed, CacheEvent::Removed { group: 1, .. }));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CacheEvent {
    /// The worker cached `blocks` (consecutive, in order) after the block `parent` (`None`:
    /// at the root), at `tier`, in KV-cache group `group`.
    #[non_exhaustive]
    Stored {
        /// The engine hash of the block before the first stored one.
        parent: Option<u64>,
        /// Engine hashes of the stored blocks.
        blocks: Vec<u64>,
        /// Token IDs of the stored blocks, concatenated: `block_size` per block. Empty for a
        /// placeholder store (an engine's copy of blocks it reported before, at another
        /// tier, named by its last block: see [`CacheEvent::placeholder`]).
        tokens: Vec<TokenId>,
        /// Tokens per block of `tokens`; `None`: `tokens.len() / blocks.len()`.
        block_size: Option<usize>,
        /// Where the blocks are kept.
        tier: Tier,
        /// The KV-cache group (hybrid models report each group apart); 0 is the main one.
        group: u32,
        /// The namespace the blocks were computed in (see [`crate::namespace_salt`]): their
        /// router hashes are salted with it, as a request's are with
        /// [`RouteRequest::with_salt`](crate::RouteRequest::with_salt).
        salt: Vec<u8>,
        /// Per-block extra keys (multimodal inputs and the like), by index in `blocks`.
        keys: Vec<BlockKey>,
        /// How the group decides a hit (groups other than 0).
        kind: GroupKind,
    },
    /// The worker evicted these blocks (engine hashes) from `tier` of group `group`. A block
    /// evicted from its last tier is gone, with what hangs below it (a prefix match can no
    /// longer reach it); one still held at another tier stays, at that tier.
    #[non_exhaustive]
    Removed {
        /// Engine hashes of the evicted blocks.
        blocks: Vec<u64>,
        /// The tier they were evicted from.
        tier: Tier,
        /// The KV-cache group.
        group: u32,
    },
    /// The worker dropped its whole device cache (every group); copies at lower tiers stay,
    /// as an engine's prefix-cache reset leaves its host copies.
    Cleared,
}

impl CacheEvent {
    /// `blocks` were stored after `parent` with `tokens` (`tokens.len() / blocks.len()` per
    /// block), at the device tier, in the main group, without a namespace.
    #[must_use]
    pub fn stored(parent: Option<u64>, blocks: Vec<u64>, tokens: Vec<TokenId>) -> CacheEvent {
        CacheEvent::Stored {
            parent,
            blocks,
            tokens,
            block_size: None,
            tier: Tier::Device,
            group: 0,
            salt: Vec::new(),
            keys: Vec::new(),
            kind: GroupKind::FullAttention,
        }
    }

    /// `blocks` were evicted from the device tier of the main group.
    #[must_use]
    pub fn removed(blocks: Vec<u64>) -> CacheEvent {
        CacheEvent::Removed {
            blocks,
            tier: Tier::Device,
            group: 0,
        }
    }

    /// The same event at `tier` (a `Stored` or `Removed`; `Cleared` is unchanged).
    #[must_use]
    pub fn with_tier(mut self, tier: Tier) -> CacheEvent {
        match &mut self {
            CacheEvent::Stored { tier: t, .. } | CacheEvent::Removed { tier: t, .. } => *t = tier,
            CacheEvent::Cleared => {}
        }
        self
    }

    /// The same event in KV-cache group `group` (`Cleared` is unchanged).
    #[must_use]
    pub fn with_group(mut self, group: u32) -> CacheEvent {
        match &mut self {
            CacheEvent::Stored { group: g, .. } | CacheEvent::Removed { group: g, .. } => {
                *g = group;
            }
            CacheEvent::Cleared => {}
        }
        self
    }

    /// A `Stored` event of a group of `kind` (others are unchanged).
    #[must_use]
    pub fn with_group_kind(mut self, kind: GroupKind) -> CacheEvent {
        if let CacheEvent::Stored { kind: k, .. } = &mut self {
            *k = kind;
        }
        self
    }

    /// A `Stored` event in namespace `salt` (others are unchanged).
    #[must_use]
    pub fn with_salt(mut self, salt: impl Into<Vec<u8>>) -> CacheEvent {
        if let CacheEvent::Stored { salt: s, .. } = &mut self {
            *s = salt.into();
        }
        self
    }

    /// A `Stored` event with per-block extra keys (others are unchanged).
    #[must_use]
    pub fn with_keys(mut self, keys: Vec<BlockKey>) -> CacheEvent {
        if let CacheEvent::Stored { keys: k, .. } = &mut self {
            *k = keys;
        }
        self
    }

    /// A `Stored` event whose `tokens` hold `block_size` tokens per block (others are
    /// unchanged). A block size finer than the router's (which it divides) is accepted:
    /// the router forms its own blocks from whole runs of the engine's.
    #[must_use]
    pub fn with_block_size(mut self, block_size: usize) -> CacheEvent {
        if let CacheEvent::Stored { block_size: b, .. } = &mut self {
            *b = Some(block_size);
        }
        self
    }

    /// A placeholder store: the worker keeps a copy at `tier` of blocks it reported before,
    /// named by the last block of each copied chunk, with no tokens (as vLLM's CPU offloading
    /// reports its copies without self-describing events). The mirror marks each chunk's
    /// blocks (see [`IndexConfig::host_chunk_blocks`](crate::IndexConfig)) held at `tier`;
    /// a block it does not know is skipped and counted.
    #[must_use]
    pub fn placeholder(blocks: Vec<u64>, tier: Tier) -> CacheEvent {
        CacheEvent::Stored {
            parent: None,
            blocks,
            tokens: Vec::new(),
            block_size: Some(0),
            tier,
            group: 0,
            salt: Vec::new(),
            keys: Vec::new(),
            kind: GroupKind::FullAttention,
        }
    }

    /// Whether this is a placeholder store (blocks named, no tokens).
    #[must_use]
    pub fn is_placeholder(&self) -> bool {
        matches!(self, CacheEvent::Stored { tokens, blocks, .. } if tokens.is_empty() && !blocks.is_empty())
    }
}
