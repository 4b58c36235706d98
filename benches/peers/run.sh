#!/usr/bin/env bash
# Runs the side-by-side benchmark of prefix-router, kv-index 2.0.0 and dynamo-kv-router 1.6.1
# and prints one table: operation x size x crate, median time and ratio to prefix-router,
# then bytes per (block, worker) pair. Takes a few minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p target
log=target/peers.log
cargo bench --bench peers -- --noplot 2>&1 | tee "$log" >/dev/null
python3 - "$log" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
rows = {}
for m in re.finditer(r"^peers/(\S+)/(\S+)/(w\d+/pairs\d+)\s*\n?\s*time:\s+\[\S+ \S+ (\S+) (\S+)", text, re.M):
    op, crate, size, value, unit = m.groups()
    rows[(op, size, crate)] = float(value) * {"ns": 1, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9}[unit]
crates = ["prefix-router", "kv-index-ChainIndex", "kv-index-Sharded", "kv-index-TokenTree", "dynamo-RadixTree", "dynamo-ThreadPool"]
def show(ns):
    return f"{ns:.0f} ns" if ns < 1e4 else f"{ns / 1e3:.1f} µs"
print("| operation | workers, pairs | " + " | ".join(crates) + " |")
print("|---|---|" + "---|" * len(crates))
order = {"match": 0, "hash+match": 1, "store8": 2, "load": 3, "remove_worker": 4}
keys = sorted({(op, size) for op, size, _ in rows}, key=lambda k: (order.get(k[0], 9), int(k[1].split("/")[0][1:]), int(k[1].split("pairs")[1])))
for op, size in keys:
    ours = rows.get((op, size, "prefix-router"))
    cells = []
    for c in crates:
        ns = rows.get((op, size, c))
        if ns is None:
            cells.append("")
        elif c == "prefix-router" or not ours:
            cells.append(show(ns))
        else:
            cells.append(f"{show(ns)} ({ns / ours:.2f}×)")
    w, p = size.split("/")
    print(f"| {op} | {w[1:]}, {int(p[5:]):,} | " + " | ".join(cells) + " |")
print()
print("| workers | pairs | structure | bytes per (block, worker) |")
print("|---|---|---|---|")
for line in text.splitlines():
    if line.startswith("memory,"):
        _, workers, pairs, name, b = line.split(",")
        print(f"| {workers} | {int(pairs):,} | {name} | {b} |")
PY
echo
echo "(raw criterion output: benches/peers/$log)"
