use super::*;

#[test]
fn block_size_bounds_are_errors() {
    assert!(matches!(
        PrefixHasher::new(0),
        Err(Error::InvalidBlockSize { block_size: 0, .. })
    ));
    let too_big = PrefixHasher::MAX_BLOCK_SIZE + 1;
    let err = PrefixHasher::with_algorithm(too_big, HashAlgorithm::Sha256).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid block size 65537: must be between 1 and 65536 tokens"
    );
    assert!(PrefixHasher::new(PrefixHasher::MAX_BLOCK_SIZE).is_ok());
}

#[test]
fn streamed_path_equals_one_shot_definition() {
    // Three code paths (seeded short input, derived secret, streaming) all implement the
    // one definition: seeded one-shot XXH3 over the block's bytes, then `link`.
    for block_size in [
        1, 5, 8, 16, 31, 32, 33, 60, 61, 64, 65, 128, 255, 256, 257, 300, 512, 2048,
    ] {
        for seed in [PrefixHasher::DEFAULT_SEED, 0, u64::MAX] {
            let hasher = PrefixHasher::new(block_size).unwrap().with_seed(seed);
            let tokens: Vec<u32> = (0..block_size as u32 * 2 + 3)
                .map(|i| i.wrapping_mul(0x9E37_79B9))
                .collect();
            let mut prev = xxh3_64_with_seed(&[], seed);
            let mut expected = Vec::new();
            for block in tokens.chunks_exact(block_size) {
                let bytes: Vec<u8> = block.iter().flat_map(|t| t.to_le_bytes()).collect();
                prev = link(prev, xxh3_64_with_seed(&bytes, seed));
                expected.push(BlockHash(prev));
            }
            assert_eq!(
                hasher.hash(&tokens),
                expected,
                "block size {block_size} seed {seed}"
            );
        }
    }
}

#[test]
fn empty_and_sub_block_inputs_hash_to_nothing() {
    let hasher = PrefixHasher::new(16).unwrap();
    assert!(hasher.hash(&[]).is_empty());
    assert!(hasher.hash(&[1; 15]).is_empty());
    let mut out = vec![BlockHash::new(7)];
    hasher.hash_into(&[1; 15], &mut out);
    assert!(out.is_empty(), "hash_into clears the buffer first");
}

#[test]
fn extend_chain_with_a_longer_chain_than_tokens_appends_nothing() {
    let hasher = PrefixHasher::new(4).unwrap();
    let mut chain = hasher.hash(&[1, 2, 3, 4, 5, 6, 7, 8]);
    hasher.extend_chain(&[], &[1, 2, 3, 4], &mut chain);
    assert_eq!(chain.len(), 2);
}

#[test]
fn root_is_what_chains_start_from() {
    let hasher = PrefixHasher::new(2).unwrap();
    let mut out = Vec::new();
    hasher.continue_from(hasher.root(b"t"), &[5, 6, 7, 8], &mut out);
    assert_eq!(out, hasher.hash_salted(b"t", &[5, 6, 7, 8]));
    assert_eq!(hasher.root(&[]).get(), hasher.root);
}
