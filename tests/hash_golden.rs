//! Golden table: pinned hash values for fixed inputs.
//!
//! The values were computed by an independent implementation (Python's `xxhash` and
//! `hashlib` packages) from the definition in `PrefixHasher`'s docs. Changing any of them is
//! a breaking change and must be recorded in CHANGELOG.md.

#![allow(clippy::unwrap_used)]

use prefix_router::{BlockHash, HashAlgorithm, HashAlgorithm::*, PrefixHasher};

fn input(name: &str) -> Vec<u32> {
    match name {
        "ascending" => (0..1200).collect(),
        "wide" => (0..1200u32)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect(),
        "extremes" => [0, u32::MAX, 255, 256, 65_535, 65_536, 151_935, 0x8000_0000].repeat(150),
        _ => unreachable!("unknown input {name}"),
    }
}

/// (algorithm, block size, input, number of hashes, first three hashes and the last one)
#[rustfmt::skip]
const GOLDEN: &[(HashAlgorithm, usize, &str, usize, &[u64])] = &[
    (Xxh3, 1, "ascending", 1200, &[0xa7df25a63df5dd1d, 0x249250313080c5ea, 0x8159d6821b50cd6f, 0x4f78a1453c5af5b5]),
    (Xxh3, 1, "wide", 1200, &[0xa7df25a63df5dd1d, 0xfbb558752e6f4aea, 0xd29d95016397cac0, 0xe9e701133ff192d0]),
    (Xxh3, 1, "extremes", 1200, &[0xa7df25a63df5dd1d, 0x0e1dcd9ca72d35ea, 0xe23755f47f17d3c3, 0x1d342e4d0f418ccd]),
    (Xxh3, 16, "ascending", 75, &[0x788b2e11e2062219, 0x1014ebdfc533af8f, 0xa54128ca9ffb38c3, 0x751c458aa5bb520c]),
    (Xxh3, 16, "wide", 75, &[0x203e31887ad0a3ac, 0x24eb1c61c1d40042, 0xcb876e90c3afdb6c, 0x9610ce45a1cb137f]),
    (Xxh3, 16, "extremes", 75, &[0xa0fb8a88b55f3de0, 0x66f40ca8d78fe6b8, 0x32afe0c811fe383b, 0xc598cbf2a66dcf9d]),
    (Xxh3, 64, "ascending", 18, &[0x556a3654902d70a5, 0xef0340d82dc093a3, 0xdea217cffdce109f, 0x8893b67e512aac80]),
    (Xxh3, 64, "wide", 18, &[0x1b0f0ab118d27b27, 0xdc7c7fd10594fcd5, 0x3f3ee5a8b33c8b54, 0x5a981ba93d85678d]),
    (Xxh3, 64, "extremes", 18, &[0x63c13bd96135bb83, 0x08344f7568fa5bc9, 0xaf1abf06798541d9, 0x24df11b8c12271ee]),
    (Xxh3, 128, "ascending", 9, &[0x54109731487033f7, 0x635aed62ceabd769, 0xe6da2df8fcfe69ab, 0xea11f8dbe63fab85]),
    (Xxh3, 128, "wide", 9, &[0xcfd284238c569521, 0x53a15dd2c12e3239, 0xbe5bd4b4e4991b82, 0x63d6997ed10ed809]),
    (Xxh3, 128, "extremes", 9, &[0x8dd2258821e55521, 0xd958cf0f3ed0f0dd, 0x7cf47e06587a61e5, 0x48a78a387bbbb051]),
    (Xxh3, 512, "ascending", 2, &[0x72e213e0a58209eb, 0x96d83ecabd3a3cdf]),
    (Xxh3, 512, "wide", 2, &[0x87031590fef940c6, 0x4a7ed45cdf127446]),
    (Xxh3, 512, "extremes", 2, &[0x2ea0b92c2e0bb755, 0x9512145286b212e7]),
    (Sha256, 1, "ascending", 1200, &[0x571b92982984cc41, 0x935ea3f7658a4372, 0x7f4430c2fda3d167, 0x3a8c2d0d5fb3c425]),
    (Sha256, 1, "wide", 1200, &[0x571b92982984cc41, 0xb9587032347af632, 0xaf81385e7f8d7a4c, 0x6fc75a6bb56b994c]),
    (Sha256, 1, "extremes", 1200, &[0x571b92982984cc41, 0x5a41bafd5ef98c2d, 0xd25078476463aef5, 0x37b9be6de8b4967c]),
    (Sha256, 16, "ascending", 75, &[0x5c89ea4867236850, 0x9603fa524c27fa44, 0xd6dcb61286a388d0, 0xb53cccf623f8e030]),
    (Sha256, 16, "wide", 75, &[0x126c4975d38f0a64, 0x2ab50ebb783a0224, 0x0719934d1787a79c, 0xf21316edc7066931]),
    (Sha256, 16, "extremes", 75, &[0x1db9611035a29a5f, 0x1da15ade21e7bcaf, 0x127beae6bf735e8f, 0x4c22d0b0e4f42645]),
    (Sha256, 64, "ascending", 18, &[0x13884bd39895c8d4, 0x51760cc749516c74, 0xd5c85b7972ded009, 0x1df59b88bb111292]),
    (Sha256, 64, "wide", 18, &[0x7bc99e03256092be, 0x7ac262e9da8f2e97, 0xc6e2519920f7a541, 0x2210883f499ba910]),
    (Sha256, 64, "extremes", 18, &[0xc87c119ed6587177, 0x511524d05fd49686, 0xa4970eef33cb4fdb, 0x822736c13370bad0]),
    (Sha256, 128, "ascending", 9, &[0x7b9e60d7731660b5, 0xa0564dea676a1a64, 0x77a0ebbea56d643b, 0x2680feacfb556819]),
    (Sha256, 128, "wide", 9, &[0x5ebed1074f997aed, 0xdd4f4e9d0dc80b33, 0x79b697ac339541b6, 0xc8439e33e4253abe]),
    (Sha256, 128, "extremes", 9, &[0x4d46f0a4dc6c9c3d, 0x92d861ff20df7072, 0xcab13e72c92e8ece, 0xe04c80f25cf7d7e3]),
    (Sha256, 512, "ascending", 2, &[0x714375571d8dc989, 0x174eff89256609f2]),
    (Sha256, 512, "wide", 2, &[0xd74ec1c2f844fd92, 0xc5bb7777d41a7185]),
    (Sha256, 512, "extremes", 2, &[0xd963206e26de311a, 0x68873181e6f1a154]),
];

#[test]
fn golden_table() {
    for &(algorithm, block_size, name, count, expected) in GOLDEN {
        let hasher = PrefixHasher::with_algorithm(block_size, algorithm).unwrap();
        let hashes: Vec<u64> = hasher
            .hash(&input(name))
            .into_iter()
            .map(BlockHash::get)
            .collect();
        assert_eq!(hashes.len(), count, "{algorithm:?} bs={block_size} {name}");
        let mut picked: Vec<u64> = hashes.iter().take(3).copied().collect();
        if hashes.len() > 3 {
            picked.push(*hashes.last().unwrap());
        }
        assert_eq!(picked, expected, "{algorithm:?} bs={block_size} {name}");
    }
}

#[test]
fn golden_salted_and_seeded() {
    let tokens: Vec<u32> = (0..32).collect();
    let salt = b"llama-3-70b/lora:a";
    let get = |v: Vec<BlockHash>| v.into_iter().map(BlockHash::get).collect::<Vec<_>>();
    let xxh3 = PrefixHasher::new(16).unwrap();
    assert_eq!(
        get(xxh3.hash_salted(salt, &tokens)),
        [0x0e1cada6905df249, 0x70847c329ffe6609]
    );
    let sha = PrefixHasher::with_algorithm(16, Sha256).unwrap();
    assert_eq!(
        get(sha.hash_salted(salt, &tokens)),
        [0xc5a0844f2a7aba82, 0x82d93b9153183b02]
    );
    let seeded = PrefixHasher::new(16).unwrap().with_seed(42);
    assert_eq!(
        get(seeded.hash(&tokens)),
        [0xfff882b30ea94297, 0x1fe69db1af467d28]
    );
}
