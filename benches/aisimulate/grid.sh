#!/usr/bin/env bash
# The grid of benches/aisimulate.md: every router in NVIDIA's replay on both Mooncake traces at
# 1x, 2x, 4x and 8x on 8 vLLM workers, the conversation at 4x with SGLang's scheduler, and two
# synthetic multi-turn workloads with shared prefixes. Writes each cell's table (.md) and JSON
# report (.json) to $OUT (default target/aisimulate-grid under the harness's target
# directory). CELLS="conv-1x conv-4x" runs only those cells; ROUTERS=balanced,dynamo narrows the
# routers. A release replay of the 12,031-request conversation takes about a minute per router.
set -euo pipefail
cd "$(dirname "$0")"

export CARGO_TARGET_DIR="${AISIMULATE_TARGET_DIR:-$HOME/.cache/prefix-router/aisimulate-target}"
bin="${AISIMULATE_BIN:-$CARGO_TARGET_DIR/release/aisimulate}"
if [ -z "${AISIMULATE_BIN:-}" ]; then
    nice -n 10 cargo build --release --locked
fi
out="${OUT:-$CARGO_TARGET_DIR/aisimulate-grid}"
mkdir -p "$out"
routers="${ROUTERS:-all}"
conv=../../data/mooncake_conversation_trace.jsonl
synth=../../data/mooncake_synthetic_trace.jsonl

declare -A cells=(
    [conv-1x]="--trace $conv --speedup 1"
    [conv-2x]="--trace $conv --speedup 2"
    [conv-4x]="--trace $conv --speedup 4"
    [conv-8x]="--trace $conv --speedup 8"
    [synth-1x]="--trace $synth --speedup 1"
    [synth-2x]="--trace $synth --speedup 2"
    [synth-4x]="--trace $synth --speedup 4"
    [synth-8x]="--trace $synth --speedup 8"
    [conv-4x-sglang]="--trace $conv --speedup 4 --engine sglang"
    # Chat: 1,200 sessions of 4 turns, 1,024 new tokens and 256 output tokens a turn, half of
    # each turn's new blocks from one of 16 system prompts, 2 s between turns, 12 sessions/s.
    [chat]="--synthetic --requests 1200 --turns-per-session 4 --input-tokens 1024 --output-tokens 256 --shared-prefix-ratio 0.5 --prefix-groups 16 --inter-turn-delay-ms 2000 --request-rate 12"
    # Agents: 300 sessions of 8 turns, 4,096 new tokens and 128 output tokens a turn, 75 % of
    # them from one of 4 tool preambles, 500 ms between turns, 2 sessions/s.
    [agents]="--synthetic --requests 300 --turns-per-session 8 --input-tokens 4096 --output-tokens 128 --shared-prefix-ratio 0.75 --prefix-groups 4 --inter-turn-delay-ms 500 --request-rate 2"
)
order=(conv-1x conv-4x conv-2x conv-8x synth-1x synth-2x synth-4x synth-8x conv-4x-sglang chat agents)

for cell in ${CELLS:-${order[@]}}; do
    args=${cells[$cell]}
    echo "== $cell: aisimulate $args --workers 8 --router $routers ($(date -u +%T))"
    # shellcheck disable=SC2086
    nice -n 10 "$bin" $args --workers 8 --router "$routers" --format json --check \
        >"$out/$cell.json"
    # shellcheck disable=SC2086
    python3 - "$out/$cell.json" "$cell" <<'PY' | tee "$out/$cell.md"
import json, sys
rows = json.load(open(sys.argv[1]))
print(f"| {sys.argv[2]} | reuse | TTFT p50 ms | TTFT p99 ms | TPOT p99 ms | ITL p99 ms | E2E p99 ms | goodput |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    good = r["goodput_completed_requests"] / r["num_requests"]
    print(f"| {r['router']} | {r['prefix_cache_reused_ratio']:.3f} | {r['median_ttft_ms']:.0f} | "
          f"{r['p99_ttft_ms']:.0f} | {r['p99_tpot_ms']:.1f} | {r['p99_itl_ms']:.1f} | "
          f"{r['p99_e2e_latency_ms']:.0f} | {good:.3f} |")
PY
done
