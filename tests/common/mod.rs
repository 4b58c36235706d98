//! Helpers shared by the integration tests.

#![allow(dead_code, unreachable_pub)]

use proptest::prelude::*;

/// `blocks` blocks of 16 distinct tokens, distinct per `seed`.
pub fn tokens(seed: u32, blocks: usize) -> Vec<u32> {
    (0..blocks as u32 * 16).map(|i| seed * 10_000 + i).collect()
}

/// Prompts of 1 to 7 blocks from an alphabet of three blocks, so that prompts share
/// prefixes and diverge often.
pub fn prompt_strategy() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0u32..3, 1..8).prop_map(|blocks| {
        blocks
            .iter()
            .flat_map(|&b| (0..16).map(move |i| b * 100 + i))
            .collect()
    })
}
