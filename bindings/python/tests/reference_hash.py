"""The crate's block-hash definition (``PrefixHasher``'s docs) in pure Python with the
``xxhash`` and ``hashlib`` packages: an independent implementation for the golden test and
the benchmark's pure-Python baseline."""

from __future__ import annotations

import hashlib
import struct

import xxhash

DEFAULT_SEED = 0x5052_4546_4958_5231
MASK = (1 << 64) - 1


def link(parent: int, block: int) -> int:
    """The chain step: the 128-bit product of the two mixed values, halves xored."""
    product = (parent ^ 0x9E3779B97F4A7C15) * (block ^ 0x243F6A8885A308D3)
    return (product ^ (product >> 64)) & MASK


def xxh3_chain(tokens: list[int], block_size: int, salt: bytes = b"", seed: int = DEFAULT_SEED) -> list[int]:
    """One chained XXH3 hash per full block of ``tokens``."""
    h = xxhash.xxh3_64_intdigest(salt, seed=seed)
    out = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        data = struct.pack(f"<{block_size}I", *tokens[start : start + block_size])
        h = link(h, xxhash.xxh3_64_intdigest(data, seed=seed))
        out.append(h)
    return out


def sha256_chain(tokens: list[int], block_size: int, salt: bytes = b"", seed: int = DEFAULT_SEED) -> list[int]:
    """One chained, truncated SHA-256 hash per full block of ``tokens``."""
    trunc = lambda digest: int.from_bytes(digest[:8], "little")  # noqa: E731
    h = trunc(hashlib.sha256(struct.pack("<Q", seed) + salt).digest())
    out = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        data = struct.pack(f"<{block_size}I", *tokens[start : start + block_size])
        h = trunc(hashlib.sha256(struct.pack("<Q", h) + data).digest())
        out.append(h)
    return out
