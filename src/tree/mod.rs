//! The radix tree that mirrors every worker's prefix cache.
//!
//! One [`RadixTree`] holds the router's belief about which worker caches which prefix. Nodes
//! live in an arena (`Vec` addressed by `u32` ids with a free list), edges are compressed runs
//! of [`BlockHash`](crate::BlockHash) stored in one shared pool, and every node records which
//! workers hold it in a bitset. See [`RadixTree`] for the operations and their costs.

mod prefix_match;
mod radix;
mod validate;

pub use self::prefix_match::PrefixMatch;
pub use self::radix::{RadixTree, TreeConfig};

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

/// A deterministic, fast hasher for keys that are already hashes or small integers.
///
/// Never a per-process `RandomState`: iteration orders and costs are the same in every
/// process. Each written word is folded in with a 64×64→128-bit multiply.
#[derive(Clone, Copy, Default)]
pub(crate) struct FoldHasher(u64);

impl core::hash::Hasher for FoldHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    #[inline]
    fn write_u64(&mut self, value: u64) {
        let product = u128::from(self.0 ^ value ^ 0x243F_6A88_85A3_08D3)
            * u128::from(0x9E37_79B9_7F4A_7C15_u64);
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }

    #[inline]
    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }
}

/// `BuildHasher` for [`FoldHasher`].
pub(crate) type FoldBuild = core::hash::BuildHasherDefault<FoldHasher>;

/// A hashbrown map with the deterministic [`FoldHasher`].
pub(crate) type FoldMap<K, V> = hashbrown::HashMap<K, V, FoldBuild>;

#[cfg(test)]
mod tests;
