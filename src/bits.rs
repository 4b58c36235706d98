//! Bit sets over `u64` words: bit `i` is bit `i % 64` of word `i / 64`.

/// Whether bit `i` is set.
///
/// # Panics
///
/// If `i` is past the words (a caller's bug).
#[inline]
pub(crate) fn bit(words: &[u64], i: usize) -> bool {
    words[i / 64] & (1 << (i % 64)) != 0
}

/// Sets bit `i` to `on`.
///
/// # Panics
///
/// If `i` is past the words (a caller's bug).
#[inline]
pub(crate) fn set_bit(words: &mut [u64], i: usize, on: bool) {
    if on {
        words[i / 64] |= 1 << (i % 64);
    } else {
        words[i / 64] &= !(1 << (i % 64));
    }
}
