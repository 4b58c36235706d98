"""``route()`` from Python at 2,048-token prompts and 16 workers, against hashing the same
prompts in pure Python (the ``xxhash`` package, the crate's definition) and the package's
own ``PrefixHasher``.

The workload is the crate's criterion bench's (``benches/router.rs``, ``route_complete``):
4,096 prompts of 128 blocks of 16 tokens, each one of 200 system prompts of 32 blocks
chosen by Zipf(1.0), then a unique tail; the router is warmed with 2,000 of them first. Each
figure is the median over rounds of the mean time per call over the whole pool.

    python bindings/python/benches/route.py [--rounds 7]

It needs the package and ``numpy`` and ``xxhash`` installed (``bindings/python/setup.sh``
makes such an environment).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import prefix_router as pr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from reference_hash import xxh3_chain  # noqa: E402

BLOCK, BLOCKS, SYSTEM_BLOCKS, SYSTEMS, POOL = 16, 128, 32, 200, 4_096


def workload(seed: int = 11) -> list[np.ndarray]:
    """The prompts: a Zipf(1.0)-chosen system prompt, then a unique tail."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, 150_000, SYSTEM_BLOCKS * BLOCK, dtype=np.uint32) for _ in range(SYSTEMS)]
    weights = 1.0 / np.arange(1, SYSTEMS + 1)
    picks = rng.choice(SYSTEMS, size=POOL, p=weights / weights.sum())
    tail = (BLOCKS - SYSTEM_BLOCKS) * BLOCK
    return [np.concatenate([systems[s], rng.integers(0, 150_000, tail, dtype=np.uint32)]) for s in picks]


def per_call(run, items, rounds: int) -> float:
    """Median over `rounds` of the mean seconds per call of `run` over `items`."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for item in items:
            run(item)
        times.append((time.perf_counter_ns() - start) / len(items) / 1e9)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    prompts = workload()
    lists = [p.tolist() for p in prompts]
    router = pr.Router(16)
    for p in workload(seed=12)[:2_000]:
        router.complete(router.route(p))

    def route(p) -> None:
        router.complete(router.route(p))

    hasher = pr.PrefixHasher(16)
    rows = [
        ("route() + complete(), NumPy uint32 array", per_call(route, prompts, args.rounds)),
        ("route() + complete(), list of ints", per_call(route, lists, args.rounds)),
        ("PrefixHasher.hash(), NumPy uint32 array", per_call(hasher.hash, prompts, args.rounds)),
        ("pure Python: xxhash per block + chain, list of ints", per_call(lambda t: xxh3_chain(t, BLOCK), lists[:512], max(3, args.rounds // 2))),
    ]
    assert xxh3_chain(lists[0], BLOCK) == hasher.hash(prompts[0])  # the same hashes
    print(f"prefix_router {pr.__version__}, Python {sys.version.split()[0]}, {POOL} prompts of {BLOCK * BLOCKS} tokens, 16 workers")
    for name, seconds in rows:
        print(f"{name:55s} {seconds * 1e6:9.2f} µs")


if __name__ == "__main__":
    main()
