"""The live bench's results: per-cell metrics from the per-request records, the tables of
benches/live.md, and checks. Standard library only (CI runs it on a recorded output).

    python3 benches/live/summarise.py RESULTS.json            # the tables (markdown)
    python3 benches/live/summarise.py RESULTS.json --check    # exit 1 if a check fails

The checks (`--check`): every cell served every request without error, and every cell
reported cached tokens (engine-reported `usage.prompt_tokens_details.cached_tokens`); a
cell with prefixes to reuse (every workload here) whose engines reported no cached token
at all fails. With `--expect-routers A,B`, each named router has a cell.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SLA_TTFT_MS = 2000.0
SLA_TPOT_MS = 100.0


def pct(values, q):
    """The q-th percentile (0-100) by linear interpolation, as numpy's default; None if empty."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    k = (len(v) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def metrics(cell: dict) -> dict:
    """A cell's figures; times in model milliseconds (wall x the engines' speedup)."""
    s = cell["speedup"]
    recs = cell["records"]
    ok = [r for r in recs if r.get("error") is None]
    ms = lambda x: None if x is None else x * 1000.0 * s  # noqa: E731
    ttft = [ms(r["ttft"]) for r in ok]
    tpot = [ms(r["tpot"]) for r in ok if r.get("tpot") is not None]
    e2e = [ms(r["e2e"]) for r in ok]
    prompt = sum(r.get("prompt_tokens") or 0 for r in ok)
    cached = sum(r.get("cached_tokens") or 0 for r in ok)
    good = sum(1 for r in ok if ms(r["ttft"]) <= SLA_TTFT_MS
               and (r.get("tpot") is None or ms(r["tpot"]) <= SLA_TPOT_MS))
    workers = cell.get("workers") or []
    per_worker = {w: 0 for w in workers}
    for r in ok:
        w = r.get("worker")
        per_worker[w] = per_worker.get(w, 0) + 1
    order = list(workers) + sorted(k for k in per_worker if k not in workers and k is not None)
    if None in per_worker:
        order.append(None)
    errors = [r["error"] for r in recs if r.get("error") is not None]
    # Client TTFT minus the TTFT the engine's frontend measured (Dynamo's `timing.ttft_ms`):
    # the path in front of that frontend (the router, and an adapter where there is one).
    path = [r["ttft"] * 1000.0 - r["engine_ttft_ms"] for r in ok
            if r.get("engine_ttft_ms") is not None and r.get("ttft") is not None]
    return {
        "requests": len(recs),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "cached_ratio": cached / prompt if prompt else 0.0,
        "cached_tokens": cached,
        "prompt_tokens": prompt,
        "ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99),
        "tpot_p50": pct(tpot, 50), "tpot_p99": pct(tpot, 99),
        "e2e_p99": pct(e2e, 99),
        "goodput": good / len(recs) if recs else 0.0,
        "per_worker": [per_worker.get(w, 0) for w in order],
        "path_wall_ms_p50": pct(path, 50),
        "frontend_ttft_p50": pct([r["engine_ttft_ms"] * s for r in ok
                                  if r.get("engine_ttft_ms") is not None], 50),
    }


def fmt(x, digits=0):
    if x is None:
        return "–"
    return f"{x:,.{digits}f}"


def table(cells: list[dict]) -> str:
    out = []
    key = lambda c: (c["workload"], c["load"])  # noqa: E731
    groups: dict = {}
    for c in cells:
        groups.setdefault(key(c), []).append(c)
    for (workload, load), group in groups.items():
        c0 = group[0]
        cpu = ", ".join(sorted({fmt(c.get("cpu", {}).get("busy"), 2) for c in group}))
        replay = c0.get("replay") or {}
        head = (f"### {workload}, load {load:g}x ({c0['requests_desc']}), {c0['engines']} engines, "
                f"speedup {c0['speedup']:g}")
        out.append(head)
        out.append("")
        if replay:
            out.append(f"NVIDIA's offline replay of the same slice and engine settings: round robin "
                       f"TTFT p50 {fmt(replay.get('rr_ttft_p50'))} ms, p99 "
                       f"{fmt(replay.get('rr_ttft_p99'))} ms, goodput "
                       f"{fmt(replay.get('rr_goodput'), 3)}; Dynamo KV router TTFT p50 "
                       f"{fmt(replay.get('kv_ttft_p50'))} ms, goodput "
                       f"{fmt(replay.get('kv_goodput'), 3)}.")
        check = c0.get("machine_check")
        if check:
            rr = next((c for c in group if c["router"] == "gateway round_robin"), None)
            fe = metrics(rr)["frontend_ttft_p50"] if rr else None
            fe_ratio = (fe / replay["rr_ttft_p50"]) if fe and replay.get("rr_ttft_p50") else None
            out.append(f"Live round robin (the gateway's) TTFT p50 / the replay's: "
                       f"{fmt(check.get('ratio'), 2)} at the client, {fmt(fe_ratio, 2)} as the "
                       f"engines' frontends measured it "
                       f"({'**machine-bound**' if check.get('bound') else 'within 20 %'}); "
                       f"the machine's busy share (2 cores) per run: {cpu}.")
        out.append("")
        out.append("| router | cached/prompt | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | "
                   "e2e p99 | errors | goodput | path p50 (wall ms) | requests per worker |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for c in group:
            m = metrics(c)
            out.append(
                f"| {c['router']} | {fmt(m['cached_ratio'], 3)} | {fmt(m['ttft_p50'])} | "
                f"{fmt(m['ttft_p99'])} | {fmt(m['tpot_p50'], 1)} | {fmt(m['tpot_p99'], 1)} | "
                f"{fmt(m['e2e_p99'])} | {m['errors']} | {fmt(m['goodput'], 3)} | "
                f"{fmt(m['path_wall_ms_p50'], 1)} | "
                f"{' '.join(str(x) for x in m['per_worker'])} |")
        out.append("")
        by = {c["router"]: c for c in group}
        gw, direct = by.get("gateway balanced"), by.get("direct to the gateway's choices")
        if gw and direct:
            g, d = metrics(gw)["ttft_p50"], metrics(direct)["ttft_p50"]
            if g is not None and d is not None:
                s = gw["speedup"]
                out.append(f"The gateway's overhead: TTFT p50 through it {fmt(g, 1)} ms, straight to "
                           f"the engines it chose {fmt(d, 1)} ms: {fmt(g - d, 1)} model ms, "
                           f"{fmt((g - d) / s, 2)} wall ms at speedup {s:g}.")
                out.append("")
    return "\n".join(out)


def check(cells: list[dict], expect: list[str]) -> list[str]:
    problems = []
    for c in cells:
        m = metrics(c)
        name = f"{c['router']} on {c['workload']} at {c['load']:g}x"
        if m["requests"] == 0:
            problems.append(f"{name}: no request")
        if m["errors"]:
            problems.append(f"{name}: {m['errors']} errors (first: {m['first_error']})")
        if m["cached_tokens"] <= 0:
            problems.append(f"{name}: no cached token reported over {m['prompt_tokens']} prompt tokens")
        if m["prompt_tokens"] <= 0:
            problems.append(f"{name}: no prompt token reported")
    routers = {c["router"] for c in cells}
    for r in expect:
        if r not in routers:
            problems.append(f"no cell for {r} (cells: {sorted(routers)})")
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path)
    p.add_argument("--check", action="store_true")
    p.add_argument("--expect-routers", default="")
    a = p.parse_args(argv)
    doc = json.loads(a.results.read_text())
    cells = doc["cells"]
    print(table(cells))
    if a.check:
        expect = [r for r in a.expect_routers.split(",") if r]
        problems = check(cells, expect)
        for pr in problems:
            print(f"CHECK FAILED: {pr}", file=sys.stderr)
        if problems:
            return 1
        print(f"checks passed: {len(cells)} cells, no errors, cached tokens reported in each",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
