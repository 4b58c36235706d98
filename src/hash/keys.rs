//! What besides tokens makes a block what it is: a namespace (LoRA adapter, cache salt) for
//! the whole prompt, and per-block extra keys (multimodal inputs).
//!
//! One convention serves requests and engine events alike, so that a block an engine
//! reports is the block a request for the same content names:
//!
//! - **Namespace**: [`namespace_salt`] of the LoRA adapter's name and the request's cache
//!   salt is the salt of [`RouteRequest::with_salt`](crate::RouteRequest::with_salt) and of
//!   event sync (vLLM's `lora_name`, and the cache salt its first block carries).
//! - **Extra keys**: a block carrying other inputs (an image's identifier and offset, a
//!   prompt embedding's hash) gets a [`BlockKey`]; its chained hash, and so every hash after
//!   it, changes with the key.

use sha2::{Digest, Sha256};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::{BlockHash, HashAlgorithm, PrefixHasher, TokenId, link, truncate_digest};

/// An extra key of one block of a prompt or event: the block's index and a 64-bit key.
///
/// ```
/// use prefix_router::{BlockKey, PrefixHasher};
///
/// let hasher = PrefixHasher::new(16)?;
/// let prompt = vec![7u32; 64]; // four blocks of image placeholder tokens
/// let cat = [BlockKey::from_parts(1, &[b"image-cat", b"0"])];
/// let dog = [BlockKey::from_parts(1, &[b"image-dog", b"0"])];
/// let (a, b) = (hasher.hash_keyed(&[], &prompt, &cat), hasher.hash_keyed(&[], &prompt, &dog));
/// assert_eq!(a[0], b[0]); // before the image: the same prefix
/// assert_ne!(a[1], b[1]); // from the image on: different
/// assert_ne!(a[3], b[3]);
/// # Ok::<(), prefix_router::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey {
    block: u32,
    key: u64,
}

/// Seed of the canonical hash of a key's parts.
const KEY_SEED: u64 = 0x4B45_5953_5F56_3031;
/// Separator after each part of a key, so that parts never run into each other.
const PART_END: u8 = 0x1F;

impl BlockKey {
    /// Block `block` (0-based) carries `key`.
    #[must_use]
    pub fn new(block: usize, key: u64) -> BlockKey {
        BlockKey {
            block: u32::try_from(block).unwrap_or(u32::MAX),
            key,
        }
    }

    /// Block `block` carries the key made of `parts`: XXH3-64 (seed `0x4B4559535F563031`) of
    /// each part followed by the byte `0x1F`. This is the key event sync gives a block whose
    /// vLLM `extra_keys` entry holds those parts, strings and byte strings as their bytes and
    /// integers in decimal (an image is `(identifier, offset)`: parts `b"<identifier>"` and
    /// `b"<offset>"`).
    #[must_use]
    pub fn from_parts(block: usize, parts: &[&[u8]]) -> BlockKey {
        let mut bytes = Vec::with_capacity(parts.iter().map(|p| p.len() + 1).sum());
        for part in parts {
            bytes.extend_from_slice(part);
            bytes.push(PART_END);
        }
        BlockKey::new(block, xxh3_64_with_seed(&bytes, KEY_SEED))
    }

    /// The block's index.
    #[must_use]
    pub fn block(&self) -> usize {
        self.block as usize
    }

    /// The key.
    #[must_use]
    pub fn key(&self) -> u64 {
        self.key
    }
}

/// The salt of a namespace: a LoRA adapter's name, a cache salt (vLLM's `cache_salt`), both
/// or neither. The adapter's name alone is its UTF-8 bytes, the cache salt alone likewise;
/// both are the name, a zero byte, then the cache salt; neither is the empty salt.
///
/// Route a request for adapter `finance` with `.with_salt(&namespace_salt(Some("finance"),
/// None))`: event sync hashes the blocks an engine reports with `lora_name = "finance"`
/// under the same salt.
///
/// ```
/// use prefix_router::namespace_salt;
///
/// assert_eq!(namespace_salt(Some("finance"), None), b"finance");
/// assert_eq!(namespace_salt(Some("finance"), Some("t1")), b"finance\0t1");
/// assert!(namespace_salt(None, None).is_empty());
/// ```
#[must_use]
pub fn namespace_salt(lora_name: Option<&str>, cache_salt: Option<&str>) -> Vec<u8> {
    match (lora_name, cache_salt) {
        (Some(lora), Some(salt)) => [lora.as_bytes(), &[0], salt.as_bytes()].concat(),
        (Some(one), None) | (None, Some(one)) => one.as_bytes().to_vec(),
        (None, None) => Vec::new(),
    }
}

/// [`PrefixHasher`]'s offset for an extra key mixed into a block's hash.
const KEY_OFFSET: u64 = 0x6A09_E667_F3BC_C908;

impl PrefixHasher {
    /// Like [`hash_salted`](Self::hash_salted), with per-block extra keys: block `i`
    /// carrying key `k` hashes as `mix(h[i], k)` instead of `h[i]`, and the chain goes on
    /// from there. `mix` is `link(h, k ^ 0x6A09E667F3BCC908)` with [`HashAlgorithm::Xxh3`]
    /// and `trunc(sha256(le(h) ‖ "key" ‖ le(k)))` with [`HashAlgorithm::Sha256`]. Keys of
    /// blocks past the full blocks are ignored; several keys of one block are mixed in
    /// order. Without keys this is `hash_salted`.
    #[must_use]
    pub fn hash_keyed(&self, salt: &[u8], tokens: &[TokenId], keys: &[BlockKey]) -> Vec<BlockHash> {
        let mut out = Vec::with_capacity(self.full_blocks(tokens.len()));
        self.hash_keyed_into(salt, tokens, keys, &mut out);
        out
    }

    /// Like [`hash_keyed`](Self::hash_keyed), writing into `out` (cleared first).
    pub fn hash_keyed_into(
        &self,
        salt: &[u8],
        tokens: &[TokenId],
        keys: &[BlockKey],
        out: &mut Vec<BlockHash>,
    ) {
        out.clear();
        self.continue_keyed(self.root(salt), tokens, keys, out);
    }

    /// Like [`continue_from`](Self::continue_from), with extra keys indexed from the first
    /// block of `tokens`.
    pub fn continue_keyed(
        &self,
        parent: BlockHash,
        tokens: &[TokenId],
        keys: &[BlockKey],
        out: &mut Vec<BlockHash>,
    ) {
        if keys.is_empty() {
            return self.continue_from(parent, tokens, out);
        }
        let mut sorted = keys.to_vec();
        sorted.sort_unstable();
        let blocks = self.full_blocks(tokens.len());
        let (mut prev, mut from) = (parent, 0usize);
        let mut i = 0;
        while i < sorted.len() && sorted[i].block() < blocks {
            let at = sorted[i].block();
            // The blocks up to and including the keyed one, then its key(s).
            let start = out.len();
            self.continue_from(
                prev,
                &tokens[from * self.block_size..(at + 1) * self.block_size],
                out,
            );
            let mut h = out.last().map_or(prev, |&h| h).get();
            while i < sorted.len() && sorted[i].block() == at {
                h = self.mix_key(h, sorted[i].key);
                i += 1;
            }
            if out.len() > start {
                let last = out.len() - 1;
                out[last] = BlockHash(h);
            }
            prev = BlockHash(h);
            from = at + 1;
        }
        self.continue_from(prev, &tokens[from * self.block_size..], out);
    }

    fn mix_key(&self, h: u64, key: u64) -> u64 {
        match self.algorithm {
            HashAlgorithm::Xxh3 => link(h, key ^ KEY_OFFSET),
            HashAlgorithm::Sha256 => {
                let mut state = Sha256::new();
                state.update(h.to_le_bytes());
                state.update(b"key");
                state.update(key.to_le_bytes());
                truncate_digest(&state.finalize())
            }
        }
    }
}
