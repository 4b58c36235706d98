//! A deterministic hasher for keys that are already hashes or small integers, shared by the
//! tree, event sync and the routers' tables.
//!
//! Never a per-process `RandomState`: iteration orders and costs are the same in every
//! process, and with a secret hash seed (see the crate docs on hash flooding) an attacker
//! cannot aim at the buckets.

/// Folds each written word into the state with a 64×64→128-bit multiply.
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

/// The [`FoldHasher`] hash of one word.
#[inline]
pub(crate) fn fold64(value: u64) -> u64 {
    use core::hash::Hasher as _;
    let mut h = FoldHasher::default();
    h.write_u64(value);
    h.finish()
}

/// A deterministic 64-bit mix (SplitMix64's finaliser), for tie-breaks, request keys and
/// seeded choices.
#[inline]
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
