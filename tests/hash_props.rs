//! Property tests for `PrefixHasher`: chaining, block alignment, salts and incremental forms.

#![allow(clippy::unwrap_used)]

use prefix_router::{HashAlgorithm, PrefixHasher};
use proptest::prelude::*;

fn hasher_strategy() -> impl Strategy<Value = PrefixHasher> {
    (
        1usize..=20,
        prop_oneof![Just(HashAlgorithm::Xxh3), Just(HashAlgorithm::Sha256)],
    )
        .prop_map(|(bs, alg)| PrefixHasher::with_algorithm(bs, alg).unwrap())
}

/// Tokens across the whole u32 range, with small values mixed in so blocks repeat.
fn token() -> impl Strategy<Value = u32> {
    prop_oneof![0u32..4, any::<u32>(), Just(u32::MAX), 250u32..260]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn shared_prefix_shares_exactly_its_blocks(
        hasher in hasher_strategy(),
        prefix in prop::collection::vec(token(), 0..80),
        tail_a in prop::collection::vec(token(), 1..40),
        tail_b in prop::collection::vec(token(), 1..40),
    ) {
        prop_assume!(tail_a[0] != tail_b[0]);
        let bs = hasher.block_size();
        let a = [prefix.clone(), tail_a].concat();
        let b = [prefix.clone(), tail_b].concat();
        let (ha, hb) = (hasher.hash(&a), hasher.hash(&b));
        let k = prefix.len() / bs; // blocks fully inside the common prefix
        prop_assert_eq!(&ha[..k.min(ha.len())], &hb[..k.min(hb.len())]);
        // The block holding the first differing token differs, and so does every later one.
        for j in k..ha.len().min(hb.len()) {
            prop_assert_ne!(ha[j], hb[j], "block {} after the divergence collided", j);
        }
    }

    #[test]
    fn one_changed_token_changes_its_block_and_all_after(
        hasher in hasher_strategy(),
        tokens in prop::collection::vec(token(), 1..120),
        at in any::<prop::sample::Index>(),
        delta in 1u32..,
    ) {
        let i = at.index(tokens.len());
        let mut changed = tokens.clone();
        changed[i] = changed[i].wrapping_add(delta);
        let (h, g) = (hasher.hash(&tokens), hasher.hash(&changed));
        prop_assert_eq!(h.len(), g.len());
        let j = i / hasher.block_size();
        for (idx, (x, y)) in h.iter().zip(&g).enumerate() {
            if idx < j { prop_assert_eq!(x, y); } else { prop_assert_ne!(x, y); }
        }
    }

    #[test]
    fn trailing_partial_block_never_matters(
        hasher in hasher_strategy(),
        tokens in prop::collection::vec(token(), 0..100),
        extra in prop::collection::vec(token(), 0..20),
    ) {
        let bs = hasher.block_size();
        let full = tokens.len() / bs * bs;
        let extra = &extra[..extra.len().min(bs - 1)];
        let cut = [&tokens[..full], extra].concat();
        prop_assert_eq!(hasher.hash(&tokens[..full]), hasher.hash(&cut));
        prop_assert_eq!(hasher.hash(&tokens).len(), tokens.len() / bs);
    }

    #[test]
    fn different_salts_share_no_hash(
        hasher in hasher_strategy(),
        tokens in prop::collection::vec(token(), 0..100),
        salt_a in prop::collection::vec(any::<u8>(), 0..12),
        salt_b in prop::collection::vec(any::<u8>(), 0..12),
    ) {
        prop_assume!(salt_a != salt_b);
        let a = hasher.hash_salted(&salt_a, &tokens);
        let b = hasher.hash_salted(&salt_b, &tokens);
        for x in &a { prop_assert!(!b.contains(x)); }
        prop_assert_eq!(hasher.hash_salted(&[], &tokens), hasher.hash(&tokens));
    }

    #[test]
    fn incremental_equals_one_shot(
        hasher in hasher_strategy(),
        salt in prop::collection::vec(any::<u8>(), 0..6),
        turns in prop::collection::vec(prop::collection::vec(token(), 0..40), 1..5),
    ) {
        let mut prompt = Vec::new();
        let mut chain = Vec::new();
        for turn in turns {
            prompt.extend(turn);
            hasher.extend_chain(&salt, &prompt, &mut chain);
            prop_assert_eq!(&chain, &hasher.hash_salted(&salt, &prompt));
        }
        // continue_from from any block boundary equals the one-shot tail.
        let full = hasher.hash_salted(&salt, &prompt);
        let bs = hasher.block_size();
        for k in 0..full.len() {
            let mut out = full[..=k].to_vec();
            hasher.continue_from(full[k], &prompt[(k + 1) * bs..], &mut out);
            prop_assert_eq!(&out, &full);
        }
    }

    #[test]
    fn hash_into_equals_hash(
        hasher in hasher_strategy(),
        first in prop::collection::vec(token(), 0..100),
        second in prop::collection::vec(token(), 0..100),
    ) {
        let mut buf = Vec::new();
        hasher.hash_into(&first, &mut buf);
        prop_assert_eq!(&buf, &hasher.hash(&first));
        hasher.hash_into(&second, &mut buf);
        prop_assert_eq!(&buf, &hasher.hash(&second));
        hasher.hash_salted_into(b"s", &second, &mut buf);
        prop_assert_eq!(&buf, &hasher.hash_salted(b"s", &second));
    }
}

#[test]
fn tokens_above_255_are_not_truncated_to_a_byte() {
    // A one-byte-per-token encoding would make these blocks equal.
    let hasher = PrefixHasher::new(2).unwrap();
    assert_ne!(hasher.hash(&[1, 2]), hasher.hash(&[257, 258]));
    assert_ne!(hasher.hash(&[0, 0]), hasher.hash(&[1 << 24, 0]));
    assert_ne!(hasher.hash(&[u32::MAX, 0]), hasher.hash(&[u32::MAX - 1, 0]));
}

#[test]
fn identical_blocks_after_different_prefixes_differ() {
    let hasher = PrefixHasher::new(4).unwrap();
    let a = hasher.hash(&[1, 2, 3, 4, 9, 9, 9, 9]);
    let b = hasher.hash(&[5, 6, 7, 8, 9, 9, 9, 9]);
    assert_ne!(a[1], b[1], "block 1 is identical but its prefix differs");
}
