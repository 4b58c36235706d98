"""Writes the vLLM 0.33, SGLang and TensorRT-LLM wire vectors of this folder.

Each folder holds payload frames (`batch_NN.msgpack`) and `expected.json` (each file's seq,
ts, rank and events with every field, hashes as unsigned 64-bit keys). The payloads are
encoded with msgspec, the encoder vLLM and SGLang use, from struct layouts that follow the
engines' published schemas. Run with `python generate.py` (needs `pip install msgspec`);
the committed files are what the tests read, so this script is needed only to change them.
"""

import json
import pathlib
from typing import Any, Optional, Union

import msgspec

HERE = pathlib.Path(__file__).parent


def tagged(array_like):
    """The event structs of one encoding (positional arrays or maps)."""

    class Batch(msgspec.Struct, array_like=array_like, omit_defaults=True):
        ts: float
        events: list
        data_parallel_rank: Optional[int] = None

    class SglBatch(msgspec.Struct, array_like=array_like, omit_defaults=True):
        ts: float
        events: list
        attn_dp_rank: Optional[int] = None

    class BlockStored(msgspec.Struct, array_like=array_like, omit_defaults=True, tag=True):
        block_hashes: list
        parent_block_hash: Optional[Any]
        token_ids: list
        block_size: int
        lora_id: Optional[int] = None
        medium: Optional[str] = None
        lora_name: Optional[str] = None
        extra_keys: Optional[list] = None
        group_idx: Optional[int] = None
        kv_cache_spec_kind: Optional[str] = None
        kv_cache_spec_sliding_window: Optional[int] = None
        locality: Optional[str] = None
        ownership: Optional[str] = None
        session_id: Optional[str] = None
        lookahead_token_ids: Optional[list] = None

    class BlockRemoved(msgspec.Struct, array_like=array_like, omit_defaults=True, tag=True):
        block_hashes: list
        medium: Optional[str] = None
        group_idx: Optional[int] = None
        locality: Optional[str] = None
        ownership: Optional[str] = None

    class AllBlocksCleared(msgspec.Struct, array_like=array_like, omit_defaults=True, tag=True):
        pass

    return Batch, SglBatch, BlockStored, BlockRemoved, AllBlocksCleared


def tokens(seed, blocks, size=16):
    return [(seed * 7919 + i * 104729) % 151936 for i in range(blocks * size)]


def u64(h):
    return h & 0xFFFF_FFFF_FFFF_FFFF


def as_i64(h):
    return h - (1 << 64) if h >= 1 << 63 else h


def events_v033(S, R, C, signed=False):
    """Batches exercising every field of vLLM 0.33: (seq, ts, rank, events)."""
    hs = lambda *xs: [as_i64(x) if signed else x for x in xs]
    a, b, c, d = 0xF1A1_0000_0000_0001, 0xF1A1_0000_0000_0002, 0xF1A1_0000_0000_0003, 0xF1A1_0000_0000_0004
    lora = "finance"
    image = ["img-7f3a", 0]
    return [
        (0, 1700000100.0, 1, [
            S(hs(a, b), None, tokens(1, 2), 16, None, "GPU", lora,
              [[lora, image, "tenant-9"], [lora]], 0, "full_attention", None,
              "LOCAL", "owned", "session-42", [11, 12]),
            S(hs(c), None, tokens(2, 1), 16, 3, "GPU", None, None, 1,
              "sliding_window", 512),
        ]),
        (1, 1700000101.5, 1, [
            S(hs(d), None, [], 0, None, "CPU"),
            R(hs(b), "GPU", 0, "LOCAL", "owned"),
            R(hs(c), "GPU", 1),
        ]),
        (2, 1700000102.0, 1, [
            R(hs(d), "CPU"),
            C(),
        ]),
    ]


def events_sglang(S, R, C):
    """SGLang: its mediums and signed hashes; the rank is `attn_dp_rank`."""
    a, b = 0x8000_0000_0000_0011, 0x0000_0000_0000_0012
    return [
        (0, 1700000200.0, 3, [
            S([as_i64(a), as_i64(b)], None, tokens(3, 2), 16, None, "GPU"),
            S([as_i64(b)], None, [], 0, None, "CPU_PINNED"),
        ]),
        (1, 1700000201.0, 3, [
            S([as_i64(b)], None, [], 0, None, "CPU_TIER2"),
            R([as_i64(b)], "CPU_TIER1"),
            R([as_i64(a)], "GPU"),
        ]),
    ]


def events_trtllm(S, R, C):
    """TensorRT-LLM's push mode: vLLM's payloads, consecutive blocks coalesced."""
    hashes = [0x7000_0000_0000_0000 + i for i in range(6)]
    return [
        (0, 1700000300.0, None, [
            S(hashes[:4], None, tokens(4, 4), 16, None, "GPU"),
            S(hashes[4:], hashes[3], tokens(5, 2), 16, None, "GPU"),
        ]),
        (1, 1700000301.0, None, [R(hashes[2:], "GPU")]),
    ]


def expected(event):
    """An event as `expected.json` gives it: every field, hashes unsigned."""
    out = {"type": type(event).__name__}
    for field in event.__struct_fields__:
        value = getattr(event, field)
        if field in ("block_hashes",):
            value = [u64(h) for h in value]
        elif field == "parent_block_hash" and value is not None:
            value = u64(value)
        out[field] = value
    return out


def write(folder, batch_type, rank_field, batches):
    path = HERE / folder
    path.mkdir(exist_ok=True)
    listing = []
    for i, (seq, ts, rank, events) in enumerate(batches):
        name = f"batch_{i:02}.msgpack"
        kwargs = {} if rank is None else {rank_field: rank}
        (path / name).write_bytes(msgspec.msgpack.encode(batch_type(ts=ts, events=events, **kwargs)))
        listing.append({
            "file": name,
            "seq": seq,
            "ts": ts,
            "data_parallel_rank": rank,
            "events": [expected(e) for e in events],
        })
    (path / "expected.json").write_text(json.dumps(listing, indent=1) + "\n")


def main():
    for array_like, suffix in ((True, "array"), (False, "map")):
        Batch, SglBatch, S, R, C = tagged(array_like)
        write(f"v033_{suffix}_u64", Batch, "data_parallel_rank", events_v033(S, R, C))
        write(f"sglang_{suffix}_i64", SglBatch, "attn_dp_rank", events_sglang(S, R, C))
    Batch, _, S, R, C = tagged(False)
    write("trtllm_coalesced_u64", Batch, "data_parallel_rank", events_trtllm(S, R, C))
    Batch, _, S, R, C = tagged(True)
    write("v033_array_i64", Batch, "data_parallel_rank", events_v033(S, R, C, signed=True))


if __name__ == "__main__":
    main()
