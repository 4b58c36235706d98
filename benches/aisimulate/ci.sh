#!/usr/bin/env bash
# CI for the NVIDIA-replay harness (benches/aisimulate/, a package of its own): fmt, clippy,
# the release build, and one small replay (the conversation trace's first 300 requests on 4
# vLLM workers, the crate's default `balanced` and Dynamo's own KV router) that must complete
# every request and print a JSON report that parses (`--check`).
#
# aisimulate-core is about 190,000 lines: its first release build takes over half an hour on
# two busy cores, and clippy's check build of it some minutes more. Both are kept in a target
# directory outside the repository that later runs on the same machine reuse:
# $AISIMULATE_TARGET_DIR, by default ~/.cache/prefix-router/aisimulate-target. A fresh machine
# builds them once.
set -euo pipefail
cd "$(dirname "$0")"

export CARGO_TARGET_DIR="${AISIMULATE_TARGET_DIR:-$HOME/.cache/prefix-router/aisimulate-target}"
mkdir -p "$CARGO_TARGET_DIR"
echo "target directory: $CARGO_TARGET_DIR"

cargo fmt -- --check
nice -n 10 cargo build --release --locked
nice -n 10 cargo clippy --release --locked --all-targets -- -D warnings

start=$(date +%s)
out="$CARGO_TARGET_DIR/ci-replay.json"
nice -n 10 "$CARGO_TARGET_DIR/release/aisimulate" \
    --trace ../../data/mooncake_conversation_trace.jsonl --max-requests 300 \
    --workers 4 --speedup 1 --engine vllm --router balanced,dynamo --format json --check \
    >"$out"
echo "small replay: $(($(date +%s) - start)) s, report in $out"
