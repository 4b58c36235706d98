//! Block-aligned, chained prefix hashing.
//!
//! A prompt of token IDs is cut into blocks of `block_size` tokens. Only full blocks are
//! hashed (engines cache only full blocks). Block `i`'s hash covers block `i - 1`'s hash and
//! block `i`'s tokens, so one [`BlockHash`] names a whole prefix.

use sha2::{Digest, Sha256};
use xxhash_rust::const_xxh3::const_custom_default_secret;
use xxhash_rust::xxh3::{Xxh3, xxh3_64_with_secret, xxh3_64_with_seed};

/// Size of an XXH3 secret.
const SECRET_SIZE: usize = 192;

use crate::error::Error;

mod keys;
pub use self::keys::{BlockKey, namespace_salt};

/// A token ID. Any `u32` value is valid; tokens are hashed as 4 little-endian bytes.
pub type TokenId = u32;

/// The hash of one block **and everything before it** (block hashes are chained).
///
/// A transparent `u64` newtype. Values produced by [`PrefixHasher`] are a stable contract,
/// pinned by golden tests: the same algorithm, seed, salt, block size and tokens give the
/// same hashes on every platform and in every process.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct BlockHash(u64);

impl BlockHash {
    /// Wraps a raw 64-bit hash value.
    #[inline]
    #[must_use]
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The raw 64-bit value.
    #[inline]
    #[must_use]
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl core::fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "BlockHash({:#018x})", self.0)
    }
}

impl From<u64> for BlockHash {
    #[inline]
    fn from(value: u64) -> Self {
        Self(value)
    }
}

impl From<BlockHash> for u64 {
    #[inline]
    fn from(value: BlockHash) -> Self {
        value.0
    }
}

/// The hash function behind a [`PrefixHasher`].
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum HashAlgorithm {
    /// XXH3-64, seeded. Fast; the default. Not collision resistant against an attacker who
    /// knows the seed: keep the seed secret (see [`PrefixHasher::with_seed`]) or use
    /// [`HashAlgorithm::Sha256`] where tenants may be hostile.
    #[default]
    Xxh3,
    /// SHA-256 truncated to its first 8 bytes read little-endian. Slower, but a second
    /// preimage (steering a request onto another tenant's prefix) costs about 2^64 work.
    Sha256,
}

/// Turns token IDs into a chain of [`BlockHash`]es, one per full block.
///
/// # Definition (stable; changing it is a breaking change)
///
/// With `le(x)` the little-endian bytes of `x` and `trunc(d)` the first 8 bytes of a SHA-256
/// digest read little-endian:
///
/// | | `Xxh3` | `Sha256` |
/// |---|---|---|
/// | root (before block 0) | `xxh3_64_with_seed(salt, seed)` | `trunc(sha256(le(seed) ‖ salt))` |
/// | block `i` | `link(h[i-1], xxh3_64_with_seed(le(tokens of block i), seed))` | `trunc(sha256(le(h[i-1]) ‖ le(tokens of block i)))` |
///
/// `h[-1]` is the root. `link(p, b)` is the 128-bit product
/// `(p ^ 0x9E3779B97F4A7C15) × (b ^ 0x243F6A8885A308D3)` with its two 64-bit halves xored:
/// the blocks' own hashes are independent of each other (the CPU computes them in
/// parallel) and only that one multiply is serial along the chain. The salt is mixed into the root only; the unsalted form is the empty
/// salt. The default seed is [`PrefixHasher::DEFAULT_SEED`].
///
/// # Example
///
/// ```
/// use prefix_router::PrefixHasher;
///
/// let hasher = PrefixHasher::new(16)?;
/// let a: Vec<u32> = (0..40).collect(); // 2 full blocks and 8 tokens that are ignored
/// let hashes = hasher.hash(&a);
/// assert_eq!(hashes.len(), 2);
///
/// // A prompt that shares the first block shares exactly the first hash.
/// let mut b = a.clone();
/// b[20] = 99_999;
/// let other = hasher.hash(&b);
/// assert_eq!(hashes[0], other[0]);
/// assert_ne!(hashes[1], other[1]);
/// # Ok::<(), prefix_router::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixHasher {
    block_size: usize,
    algorithm: HashAlgorithm,
    seed: u64,
    /// The root for the empty salt, precomputed.
    root: u64,
    /// XXH3's secret derived from `seed`, for blocks above 240 bytes.
    secret: [u8; SECRET_SIZE],
}

/// Blocks of at most this many bytes are hashed one-shot from a stack buffer; larger ones
/// are streamed through it in chunks of this size.
const ONE_SHOT_BYTES: usize = 1024;
/// XXH3 inputs up to this many bytes take the seed directly.
const SHORT_BYTES: usize = 240;

impl PrefixHasher {
    /// The largest accepted block size, in tokens.
    pub const MAX_BLOCK_SIZE: usize = 1 << 16;

    /// The default seed: the ASCII bytes `PREFIXR1` read as a big-endian `u64`.
    pub const DEFAULT_SEED: u64 = 0x5052_4546_4958_5231;

    /// `Ok` for a block size a hasher accepts: 1 to [`Self::MAX_BLOCK_SIZE`] tokens.
    pub(crate) fn check_block_size(block_size: usize) -> Result<(), Error> {
        if block_size == 0 || block_size > Self::MAX_BLOCK_SIZE {
            return Err(Error::InvalidBlockSize {
                block_size,
                max: Self::MAX_BLOCK_SIZE,
            });
        }
        Ok(())
    }

    /// A hasher with the default algorithm ([`HashAlgorithm::Xxh3`]) and seed.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidBlockSize`] when `block_size` is 0 or above [`Self::MAX_BLOCK_SIZE`].
    pub fn new(block_size: usize) -> Result<Self, Error> {
        Self::with_algorithm(block_size, HashAlgorithm::Xxh3)
    }

    /// A hasher with the given algorithm and the default seed.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidBlockSize`] when `block_size` is 0 or above [`Self::MAX_BLOCK_SIZE`].
    pub fn with_algorithm(block_size: usize, algorithm: HashAlgorithm) -> Result<Self, Error> {
        Self::check_block_size(block_size)?;
        Ok(Self {
            block_size,
            algorithm,
            seed: Self::DEFAULT_SEED,
            root: root_hash(algorithm, Self::DEFAULT_SEED, &[]),
            secret: const_custom_default_secret(Self::DEFAULT_SEED),
        })
    }

    /// The same hasher with another seed.
    ///
    /// A secret per-deployment seed is the defence against hash flooding with
    /// [`HashAlgorithm::Xxh3`]: without it an attacker cannot craft colliding blocks. Every
    /// router replica that shares a mirror must use the same seed.
    #[must_use]
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self.root = root_hash(self.algorithm, seed, &[]);
        self.secret = const_custom_default_secret(seed);
        self
    }

    /// Tokens per block.
    #[inline]
    #[must_use]
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The algorithm in use.
    #[inline]
    #[must_use]
    pub fn algorithm(&self) -> HashAlgorithm {
        self.algorithm
    }

    /// The seed in use.
    #[inline]
    #[must_use]
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// How many full blocks `tokens` holds (the length of [`hash`](Self::hash)'s result).
    #[inline]
    #[must_use]
    pub fn full_blocks(&self, tokens: usize) -> usize {
        tokens / self.block_size
    }

    /// One hash per full block of `tokens`; a trailing partial block is ignored.
    #[must_use]
    pub fn hash(&self, tokens: &[TokenId]) -> Vec<BlockHash> {
        let mut out = Vec::with_capacity(self.full_blocks(tokens.len()));
        self.chain(self.root, tokens, &mut out);
        out
    }

    /// Like [`hash`](Self::hash), with `salt` (model, LoRA adapter, tenant) mixed into the
    /// root so that different salts never share a prefix. The empty salt is the unsalted form.
    #[must_use]
    pub fn hash_salted(&self, salt: &[u8], tokens: &[TokenId]) -> Vec<BlockHash> {
        let mut out = Vec::with_capacity(self.full_blocks(tokens.len()));
        self.hash_salted_into(salt, tokens, &mut out);
        out
    }

    /// Like [`hash`](Self::hash), writing into `out` (cleared first) so that a warm buffer
    /// is reused and nothing is allocated.
    pub fn hash_into(&self, tokens: &[TokenId], out: &mut Vec<BlockHash>) {
        out.clear();
        self.chain(self.root, tokens, out);
    }

    /// Like [`hash_salted`](Self::hash_salted), writing into `out` (cleared first).
    pub fn hash_salted_into(&self, salt: &[u8], tokens: &[TokenId], out: &mut Vec<BlockHash>) {
        out.clear();
        let root = self.root_for(salt);
        self.chain(root, tokens, out);
    }

    /// Incremental hashing: `chain` holds the hashes of a prefix of `tokens` (for example
    /// the previous turn of a conversation); appends the hashes of the remaining full
    /// blocks without rehashing the history. With an empty `chain` this equals
    /// [`hash_salted`](Self::hash_salted); `salt` is used only then.
    ///
    /// If `chain` already covers every full block of `tokens`, nothing is appended. The
    /// caller is responsible for `chain` really being the hash of a prefix of `tokens`.
    ///
    /// ```
    /// use prefix_router::PrefixHasher;
    ///
    /// let hasher = PrefixHasher::new(4)?;
    /// let turn1: Vec<u32> = (0..10).collect();
    /// let mut chain = hasher.hash(&turn1);
    /// let turn2: Vec<u32> = (0..23).collect(); // turn 1, its answer and a new question
    /// hasher.extend_chain(&[], &turn2, &mut chain);
    /// assert_eq!(chain, hasher.hash(&turn2));
    /// # Ok::<(), prefix_router::Error>(())
    /// ```
    pub fn extend_chain(&self, salt: &[u8], tokens: &[TokenId], chain: &mut Vec<BlockHash>) {
        let start = chain.len().saturating_mul(self.block_size);
        let Some(rest) = tokens.get(start..) else {
            return;
        };
        let prev = match chain.last() {
            Some(last) => last.get(),
            None => self.root_for(salt),
        };
        self.chain(prev, rest, chain);
    }

    /// Continues a chain after `parent` with the full blocks of `tokens`, appending to
    /// `out`. This is how a block-aligned run of tokens whose parent hash is known (a KV
    /// event, a conversation's next turn) is hashed.
    pub fn continue_from(&self, parent: BlockHash, tokens: &[TokenId], out: &mut Vec<BlockHash>) {
        self.chain(parent.get(), tokens, out);
    }

    /// The root hash for `salt`: the value a chain starts from.
    #[must_use]
    pub fn root(&self, salt: &[u8]) -> BlockHash {
        BlockHash(self.root_for(salt))
    }

    #[inline]
    fn root_for(&self, salt: &[u8]) -> u64 {
        if salt.is_empty() {
            self.root
        } else {
            root_hash(self.algorithm, self.seed, salt)
        }
    }

    /// Like [`hash_salted_into`](Self::hash_salted_into), appending to a `SmallVec` (the
    /// routers hash into stack buffers).
    pub(crate) fn hash_salted_small<const N: usize>(
        &self,
        salt: &[u8],
        tokens: &[TokenId],
        out: &mut smallvec::SmallVec<[BlockHash; N]>,
    ) where
        [BlockHash; N]: smallvec::Array<Item = BlockHash>,
    {
        let start = out.len();
        let mut slots = self.full_blocks(tokens.len());
        // `SmallVec::resize` writes its slots one at a time; copied from a block of zeros
        // they are one `memcpy` per 256 blocks. A `static`, so that the zeros are not
        // written onto the stack first, as a `const` array is on every call.
        static ZEROS: [BlockHash; 256] = [BlockHash(0); 256];
        out.reserve(slots);
        while slots > 0 {
            let take = slots.min(ZEROS.len());
            out.extend_from_slice(&ZEROS[..take]);
            slots -= take;
        }
        self.chain_into(self.root_for(salt), tokens, &mut out[start..]);
    }

    /// Appends the chained hashes of the full blocks of `tokens`, starting after `prev`.
    fn chain(&self, prev: u64, tokens: &[TokenId], out: &mut Vec<BlockHash>) {
        let start = out.len();
        out.resize(start + self.full_blocks(tokens.len()), BlockHash(0));
        self.chain_into(prev, tokens, &mut out[start..]);
    }

    /// Writes the chained hashes of the full blocks of `tokens` into `out` (one slot per
    /// full block), starting after `prev`.
    fn chain_into(&self, prev: u64, tokens: &[TokenId], out: &mut [BlockHash]) {
        let blocks = tokens.chunks_exact(self.block_size);
        match self.algorithm {
            HashAlgorithm::Xxh3 => {
                chain_xxh3(prev, self.seed, &self.secret, self.block_size, blocks, out);
            }
            HashAlgorithm::Sha256 => chain_sha256(prev, blocks, out),
        }
    }
}

/// Writes `tokens` as little-endian bytes into the front of `buf`; returns the bytes used.
#[inline(always)]
fn le_bytes<'a>(tokens: &[TokenId], buf: &'a mut [u8]) -> &'a [u8] {
    let dst = &mut buf[..tokens.len() * 4];
    for (chunk, token) in dst.chunks_exact_mut(4).zip(tokens) {
        chunk.copy_from_slice(&token.to_le_bytes());
    }
    dst
}

/// The chain step of [`HashAlgorithm::Xxh3`]: a folded 64×64→128-bit multiply of the
/// previous hash and the block's own hash, each offset by a constant.
///
/// The block hashes do not depend on each other, so the CPU computes them in parallel; only
/// this short step (one multiply) is serial along the chain.
#[inline(always)]
fn link(prev: u64, block: u64) -> u64 {
    let product = u128::from(prev ^ LINK_PREV) * u128::from(block ^ LINK_BLOCK);
    (product as u64) ^ ((product >> 64) as u64)
}

/// `link`'s offset for the previous hash: the 64-bit golden ratio.
const LINK_PREV: u64 = 0x9E37_79B9_7F4A_7C15;
/// `link`'s offset for the block hash: the first 64 bits of the fractional part of pi.
const LINK_BLOCK: u64 = 0x243F_6A88_85A3_08D3;

fn chain_xxh3(
    mut prev: u64,
    seed: u64,
    secret: &[u8; SECRET_SIZE],
    block_size: usize,
    blocks: core::slice::ChunksExact<'_, TokenId>,
    out: &mut [BlockHash],
) {
    match block_size {
        8 => return chain_xxh3_native::<8>(prev, secret, blocks, out),
        16 => return chain_xxh3_native::<16>(prev, secret, blocks, out),
        32 => return chain_xxh3_native::<32>(prev, secret, blocks, out),
        64 => return chain_xxh3_native_long::<64>(prev, secret, blocks, out),
        128 => return chain_xxh3_native_long::<128>(prev, secret, blocks, out),
        256 => return chain_xxh3_native_long::<256>(prev, secret, blocks, out),
        _ => {}
    }
    let mut buf = [0u8; ONE_SHOT_BYTES];
    if block_size * 4 <= SHORT_BYTES {
        // Up to 240 bytes XXH3 takes the seed directly.
        for (block, slot) in blocks.zip(out.iter_mut()) {
            prev = link(prev, xxh3_64_with_seed(le_bytes(block, &mut buf), seed));
            *slot = BlockHash(prev);
        }
    } else if block_size * 4 <= ONE_SHOT_BYTES {
        // Above 240 bytes seeded XXH3 is XXH3 with a secret derived from the seed: derive it
        // once per hasher instead of once per block.
        for (block, slot) in blocks.zip(out.iter_mut()) {
            prev = link(prev, xxh3_64_with_secret(le_bytes(block, &mut buf), secret));
            *slot = BlockHash(prev);
        }
    } else {
        for (block, slot) in blocks.zip(out.iter_mut()) {
            let mut state = Xxh3::with_seed(seed);
            for part in block.chunks(ONE_SHOT_BYTES / 4) {
                state.update(le_bytes(part, &mut buf));
            }
            prev = link(prev, state.digest());
            *slot = BlockHash(prev);
        }
    }
}

/// XXH3-64 of `N` tokens' little-endian bytes (17 to 128 bytes), read straight from the
/// `u32`s instead of copying them into a byte buffer first. Equal to `xxh3_64_with_seed`
/// on those bytes (a unit test checks it against the library); `keys[2k]` and
/// `keys[2k + 1]` are the secret's words at byte `16k` and `16k + 8` with the seed added
/// and subtracted, as XXH3's mid-size path uses them.
#[inline(always)]
fn xxh3_tokens<const N: usize>(block: &[TokenId; N], keys: &[u64; 16]) -> u64 {
    const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
    let len = N * 4;
    let word = |byte: usize| u64::from(block[byte / 4]) | (u64::from(block[byte / 4 + 1]) << 32);
    let mix = |byte: usize, k: usize| {
        let product =
            u128::from(word(byte) ^ keys[2 * k]) * u128::from(word(byte + 8) ^ keys[2 * k + 1]);
        (product as u64) ^ ((product >> 64) as u64)
    };
    let mut acc = (len as u64).wrapping_mul(PRIME64_1);
    if len > 32 {
        if len > 64 {
            if len > 96 {
                acc = acc.wrapping_add(mix(48, 6)).wrapping_add(mix(len - 64, 7));
            }
            acc = acc.wrapping_add(mix(32, 4)).wrapping_add(mix(len - 48, 5));
        }
        acc = acc.wrapping_add(mix(16, 2)).wrapping_add(mix(len - 32, 3));
    }
    acc = acc.wrapping_add(mix(0, 0)).wrapping_add(mix(len - 16, 1));
    // XXH3's avalanche.
    acc ^= acc >> 37;
    acc = acc.wrapping_mul(0x1656_6791_9E37_79F9);
    acc ^ (acc >> 32)
}

fn chain_xxh3_native<const N: usize>(
    mut prev: u64,
    secret: &[u8; SECRET_SIZE],
    blocks: core::slice::ChunksExact<'_, TokenId>,
    out: &mut [BlockHash],
) {
    const { assert!(N * 4 > 16 && N * 4 <= 128) };
    // The derived secret holds exactly the default secret's words plus and minus the seed.
    let keys: [u64; 16] = core::array::from_fn(|k| secret_word(secret, 8 * k));
    for (block, slot) in blocks.zip(out.iter_mut()) {
        let Ok(block) = <&[TokenId; N]>::try_from(block) else {
            continue; // unreachable: chunks_exact yields N tokens
        };
        prev = link(prev, xxh3_tokens(block, &keys));
        *slot = BlockHash(prev);
    }
}

/// The secret's 64-bit word at byte `offset` (little-endian).
fn secret_word(secret: &[u8; SECRET_SIZE], offset: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&secret[offset..offset + 8]);
    u64::from_le_bytes(bytes)
}

/// XXH3-64's long path for `N` tokens' little-endian bytes when 240 < 4N ≤ 1024 (fewer
/// stripes than one XXH3 block, so no scrambling), read straight from the `u32`s. Equal to
/// `xxh3_64_with_secret` on those bytes; a unit test checks it against the library.
#[inline(always)]
fn xxh3_tokens_long<const N: usize>(block: &[TokenId; N], keys: &LongKeys) -> u64 {
    const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
    let mut acc: [u64; 8] = [
        0xC2B2_AE3D,
        PRIME64_1,
        0xC2B2_AE3D_27D4_EB4F,
        0x1656_67B1_9E37_79F9,
        0x85EB_CA77_C2B2_AE63,
        0x85EB_CA77,
        0x27D4_EB2F_1656_67C5,
        0x9E37_79B1,
    ];
    // Written lane-wise so that the compiler vectorises it.
    let accumulate = |acc: &mut [u64; 8], stripe: &[TokenId; 16], key: &[u64; 8]| {
        let value: [u64; 8] = core::array::from_fn(|i| {
            u64::from(stripe[2 * i]) | (u64::from(stripe[2 * i + 1]) << 32)
        });
        for i in 0..8 {
            let keyed = value[i] ^ key[i];
            acc[i] = acc[i].wrapping_add((keyed & 0xFFFF_FFFF).wrapping_mul(keyed >> 32));
        }
        for i in 0..8 {
            acc[i] = acc[i].wrapping_add(value[i ^ 1]);
        }
    };
    let len = N * 4;
    let stripes = (len - 1) / 64;
    for (s, stripe) in block.chunks_exact(16).take(stripes).enumerate() {
        if let Ok(stripe) = <&[TokenId; 16]>::try_from(stripe) {
            accumulate(&mut acc, stripe, &keys.stripe[s]);
        }
    }
    if let Some(last) = block.last_chunk::<16>() {
        accumulate(&mut acc, last, &keys.last);
    }
    let mut result = (len as u64).wrapping_mul(PRIME64_1);
    for i in 0..4 {
        let product = u128::from(acc[2 * i] ^ keys.merge[2 * i])
            * u128::from(acc[2 * i + 1] ^ keys.merge[2 * i + 1]);
        result = result.wrapping_add((product as u64) ^ ((product >> 64) as u64));
    }
    result ^= result >> 37;
    result = result.wrapping_mul(0x1656_6791_9E37_79F9);
    result ^ (result >> 32)
}

/// The secret's words as XXH3's long path reads them.
struct LongKeys {
    /// For stripe `s`, the words at bytes `8s`..`8s + 64`.
    stripe: [[u64; 8]; 16],
    /// Words at byte `121 + 8i`, for the last stripe.
    last: [u64; 8],
    /// Words at byte `11 + 8j`, for merging the accumulators.
    merge: [u64; 8],
}

fn chain_xxh3_native_long<const N: usize>(
    mut prev: u64,
    secret: &[u8; SECRET_SIZE],
    blocks: core::slice::ChunksExact<'_, TokenId>,
    out: &mut [BlockHash],
) {
    const { assert!(N * 4 > SHORT_BYTES && N * 4 <= 1024) };
    let keys = LongKeys {
        stripe: core::array::from_fn(|s| {
            core::array::from_fn(|i| secret_word(secret, 8 * (s + i)))
        }),
        last: core::array::from_fn(|i| secret_word(secret, 121 + 8 * i)),
        merge: core::array::from_fn(|j| secret_word(secret, 11 + 8 * j)),
    };
    for (block, slot) in blocks.zip(out.iter_mut()) {
        let Ok(block) = <&[TokenId; N]>::try_from(block) else {
            continue; // unreachable: chunks_exact yields N tokens
        };
        prev = link(prev, xxh3_tokens_long(block, &keys));
        *slot = BlockHash(prev);
    }
}

fn chain_sha256(
    mut prev: u64,
    blocks: core::slice::ChunksExact<'_, TokenId>,
    out: &mut [BlockHash],
) {
    let mut buf = [0u8; ONE_SHOT_BYTES];
    for (block, slot) in blocks.zip(out.iter_mut()) {
        let mut state = Sha256::new();
        state.update(prev.to_le_bytes());
        for part in block.chunks(ONE_SHOT_BYTES / 4) {
            state.update(le_bytes(part, &mut buf));
        }
        prev = truncate_digest(&state.finalize());
        *slot = BlockHash(prev);
    }
}

fn truncate_digest(digest: &[u8]) -> u64 {
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first)
}

fn root_hash(algorithm: HashAlgorithm, seed: u64, salt: &[u8]) -> u64 {
    match algorithm {
        HashAlgorithm::Xxh3 => xxh3_64_with_seed(salt, seed),
        HashAlgorithm::Sha256 => {
            let mut state = Sha256::new();
            state.update(seed.to_le_bytes());
            state.update(salt);
            truncate_digest(&state.finalize())
        }
    }
}

#[cfg(test)]
mod tests;
