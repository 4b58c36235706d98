//! Decoding KV-cache event batches of vLLM, SGLang and TensorRT-LLM (feature `vllm`).
//!
//! A vLLM engine publishes `(topic, seq as 8-byte big-endian, payload)` messages on its ZMQ
//! PUB socket (one socket per data-parallel rank); [`decode_batch`] decodes the msgpack
//! `payload`. Accepted, at batch and at event level: positional arrays (event tag string
//! first, fields in declaration order, trailing fields missing as older versions send them)
//! and maps (the tag under `"type"`). Every field of vLLM 0.33's `KVEventBatch`,
//! `BlockStored`, `BlockRemoved` and `AllBlocksCleared` is decoded and carried; SGLang's
//! batches (rank under `attn_dp_rank`, signed 64-bit hashes, mediums `GPU`, `CPU_PINNED`,
//! `CPU_TIER1`, `CPU_TIER2`) and TensorRT-LLM's (vLLM's payloads, consecutive blocks in one
//! event) decode the same way. Hashes may be unsigned ints, signed ints (two's complement)
//! or byte strings (the key is the last 8 bytes read big-endian). Unknown fields are
//! ignored; anything malformed is an [`Error::Decode`], never a
//! panic.
//!
//! [`EngineEvent::to_cache_event`] turns an event into the router's terms, and
//! [`apply_batch`] applies a whole batch to the data-parallel rank that published it.
//!
//! ```
//! use prefix_router::sync::vllm::{decode_batch, EngineEvent};
//!
//! // [ts, [["AllBlocksCleared"]], 0] in msgpack
//! let payload = [0x93, 0xcb, 0x41, 0xd9, 0x54, 0xfc, 0x40, 0, 0, 0, 0x91, 0x91, 0xb0,
//!     b'A', b'l', b'l', b'B', b'l', b'o', b'c', b'k', b's', b'C', b'l', b'e', b'a', b'r',
//!     b'e', b'd', 0x00];
//! let batch = decode_batch(&payload)?;
//! assert_eq!(batch.events, [EngineEvent::AllBlocksCleared]);
//! assert_eq!(batch.data_parallel_rank, Some(0));
//! # Ok::<(), prefix_router::Error>(())
//! ```

mod decode;

pub use self::decode::decode_batch;

use super::{CacheEvent, CacheSync, GroupKind, SyncOutcome};
use crate::error::Error;
use crate::hash::{BlockKey, namespace_salt};
use crate::ranks::RankLayout;
use crate::tree::Tier;

/// One decoded payload: the events of one batch.
#[derive(Clone, Debug, PartialEq)]
pub struct EventBatch {
    /// The engine's timestamp (seconds).
    pub ts: f64,
    /// The events, in order.
    pub events: Vec<EngineEvent>,
    /// The data-parallel rank that published the batch (vLLM's `data_parallel_rank`,
    /// SGLang's `attn_dp_rank`), when given.
    pub data_parallel_rank: Option<u32>,
}

/// One element of a block's extra keys (vLLM's `extra_keys`: a LoRA name, multimodal
/// `(identifier, offset)` pairs, a cache salt, prompt-embedding hashes).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyPart {
    /// A string.
    Str(String),
    /// An integer.
    Int(i128),
    /// A byte string.
    Bytes(Vec<u8>),
    /// A nested tuple.
    Tuple(Vec<KeyPart>),
    /// Anything else (nil, a boolean, a float), by its text.
    Other(String),
}

impl KeyPart {
    /// Appends the part's leaves as key parts: strings and byte strings as their bytes,
    /// integers in decimal, tuples flattened (see [`BlockKey::from_parts`]).
    fn leaves(&self, out: &mut Vec<Vec<u8>>) {
        match self {
            KeyPart::Str(s) | KeyPart::Other(s) => out.push(s.as_bytes().to_vec()),
            KeyPart::Int(i) => out.push(i.to_string().into_bytes()),
            KeyPart::Bytes(b) => out.push(b.clone()),
            KeyPart::Tuple(parts) => parts.iter().for_each(|p| p.leaves(out)),
        }
    }
}

/// One KV-cache event.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EngineEvent {
    /// Blocks were cached.
    #[non_exhaustive]
    BlockStored {
        /// Engine hashes of the stored blocks, in order.
        block_hashes: Vec<u64>,
        /// Engine hash of the block before them (`None` at the root).
        parent_block_hash: Option<u64>,
        /// Token IDs of all stored blocks, concatenated (empty in a placeholder).
        token_ids: Vec<u32>,
        /// Tokens per block (0 in a placeholder).
        block_size: usize,
        /// The LoRA adapter's id (deprecated by vLLM), when present.
        lora_id: Option<i64>,
        /// Where the blocks live (`"GPU"`, `"CPU"`, ...), when present.
        medium: Option<String>,
        /// The LoRA adapter's name, when present.
        lora_name: Option<String>,
        /// Per-block extra keys, one entry per block, when present.
        extra_keys: Option<Vec<Option<Vec<KeyPart>>>>,
        /// The KV-cache group, when present.
        group_idx: Option<u32>,
        /// The group's cache spec (`"full_attention"`, `"sliding_window"`, `"mamba"`, ...).
        kv_cache_spec_kind: Option<String>,
        /// The group's sliding window in tokens, when it has one.
        kv_cache_spec_sliding_window: Option<u32>,
        /// Where the blocks are relative to the engine (`"LOCAL"`, `"REMOTE"`), when present.
        locality: Option<String>,
        /// Who owns the blocks, when present (carried, not used).
        ownership: Option<String>,
        /// The session the blocks belong to, when present (carried, not used).
        session_id: Option<String>,
        /// Speculative tokens past the last block that the engine's hash covers, when
        /// present (carried: the router hashes a block by its own tokens).
        lookahead_token_ids: Option<Vec<u32>>,
    },
    /// Blocks were evicted.
    #[non_exhaustive]
    BlockRemoved {
        /// Engine hashes of the evicted blocks.
        block_hashes: Vec<u64>,
        /// Where the blocks lived, when present.
        medium: Option<String>,
        /// The KV-cache group, when present.
        group_idx: Option<u32>,
        /// Where the blocks were relative to the engine, when present.
        locality: Option<String>,
        /// Who owned the blocks, when present (carried, not used).
        ownership: Option<String>,
    },
    /// The whole device cache was dropped (a prefix-cache reset).
    AllBlocksCleared,
}

/// The tier of an event's `medium` (device when absent), or [`Tier::Remote`] when its
/// `locality` says the blocks are not local.
fn tier(medium: Option<&str>, locality: Option<&str>) -> Tier {
    match locality {
        Some(l) if !l.eq_ignore_ascii_case("local") => Tier::Remote,
        _ => medium.map_or(Tier::Device, Tier::from_medium),
    }
}

/// The namespace and the per-block keys of a stored run, from its `lora_name` and
/// `extra_keys`: the LoRA name and, on the first block of a prompt, the cache salt (the last
/// string element) make the namespace (see [`namespace_salt`]); what else a block's entry
/// holds (multimodal identifiers and offsets, embedding hashes) is its [`BlockKey`].
fn namespace(
    lora_name: Option<&str>,
    extra_keys: Option<&[Option<Vec<KeyPart>>]>,
    at_root: bool,
) -> (Vec<u8>, Vec<BlockKey>) {
    let mut cache_salt = None;
    let mut keys = Vec::new();
    for (i, entry) in extra_keys.unwrap_or(&[]).iter().enumerate() {
        let Some(parts) = entry else { continue };
        let mut parts: Vec<&KeyPart> = parts
            .iter()
            .filter(|p| !matches!(p, KeyPart::Str(s) if Some(s.as_str()) == lora_name))
            .collect();
        if i == 0 && at_root {
            if let Some(KeyPart::Str(salt)) = parts.last() {
                cache_salt = Some(salt.as_str());
                parts.pop();
            }
        }
        let mut leaves = Vec::new();
        parts.iter().for_each(|p| p.leaves(&mut leaves));
        if !leaves.is_empty() {
            let refs: Vec<&[u8]> = leaves.iter().map(Vec::as_slice).collect();
            keys.push(BlockKey::from_parts(i, &refs));
        }
    }
    (namespace_salt(lora_name, cache_salt), keys)
}

impl EngineEvent {
    /// The event in the router's terms: its tier (from `medium`, see [`Tier::from_medium`];
    /// [`Tier::Remote`] for blocks not local), its group and the group's kind, its namespace
    /// and per-block keys (from `lora_name` and `extra_keys`), its block size (a placeholder
    /// for a store without tokens). Block sizes are checked when it is applied.
    #[must_use]
    pub fn to_cache_event(&self) -> CacheEvent {
        match self {
            EngineEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                medium,
                lora_name,
                extra_keys,
                group_idx,
                kv_cache_spec_kind,
                kv_cache_spec_sliding_window,
                locality,
                ..
            } => {
                let (salt, keys) = namespace(
                    lora_name.as_deref(),
                    extra_keys.as_deref(),
                    parent_block_hash.is_none(),
                );
                let kind = GroupKind::from_spec(
                    kv_cache_spec_kind.as_deref(),
                    *kv_cache_spec_sliding_window,
                );
                CacheEvent::stored(*parent_block_hash, block_hashes.clone(), token_ids.clone())
                    .with_block_size(*block_size)
                    .with_tier(tier(medium.as_deref(), locality.as_deref()))
                    .with_group(group_idx.unwrap_or(0))
                    .with_group_kind(kind)
                    .with_salt(salt)
                    .with_keys(keys)
            }
            EngineEvent::BlockRemoved {
                block_hashes,
                medium,
                group_idx,
                locality,
                ..
            } => CacheEvent::removed(block_hashes.clone())
                .with_tier(tier(medium.as_deref(), locality.as_deref()))
                .with_group(group_idx.unwrap_or(0)),
            EngineEvent::AllBlocksCleared => CacheEvent::Cleared,
        }
    }
}

impl From<&EngineEvent> for CacheEvent {
    fn from(event: &EngineEvent) -> Self {
        event.to_cache_event()
    }
}

/// Applies every event of `batch`, published with batch sequence number `seq` by the engine
/// at `endpoint`, to the routing target of the rank that published it (rank 0 when the
/// batch names none): see [`RankLayout`]. Returns the events' outcomes summed, with the
/// first event's sequence check.
///
/// # Errors
///
/// [`Error::InvalidRank`] when the batch's rank is beyond the layout's; any error of
/// [`CacheSync::apply_event`] (the events before it stay applied).
pub fn apply_batch<S: CacheSync + ?Sized>(
    sync: &S,
    layout: &RankLayout,
    endpoint: u32,
    seq: u64,
    batch: &EventBatch,
) -> Result<SyncOutcome, Error> {
    let target = layout.target(endpoint, batch.data_parallel_rank.unwrap_or(0))?;
    let mut total = SyncOutcome::default();
    for (i, event) in batch.events.iter().enumerate() {
        let outcome = sync.apply_event(target, seq, &event.to_cache_event())?;
        if i == 0 {
            total.sequence = outcome.sequence;
        }
        total.add(&outcome);
    }
    Ok(total)
}
