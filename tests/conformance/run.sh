#!/usr/bin/env bash
# Runs the conformance harness against vLLM VLLM_VERSION (default 0.33.0): setup.sh,
# then every run of the grid CONFORMANCE_GRID ("sample", the default and what the
# test runs, or "full"; scenarios.py defines both), one JSONL file each, in out/ (the
# sample, under the cache below) or ${CARGO_TARGET_DIR:-<repo>/target}/conformance/
# vllm-$VERSION/out-full/ (the full grid); CONFORMANCE_MEMBERS=N runs N members of every
# family instead, into out-N/ beside it. Runs are spread over CONFORMANCE_JOBS processes (default:
# the CPUs available). Prints the output directory. The files are made again only
# when tests/conformance/*.py, the requirements, the version or the grid changed
# since the last complete run (a stamp in the directory records which), so a
# repeated run returns at once. The sample's files depend on nothing else (the runs are
# seeded, PYTHONHASHSEED fixed), so they are kept beside the wheel, in
# ${PREFIX_ROUTER_CACHE:-$HOME/.cache/prefix-router}/conformance/vllm-$VERSION/out, which
# outlives the work tree: a fresh clone on a machine that ran the same harness before
# replays them without running vLLM again (the larger grids stay under the target).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
here="$root/tests/conformance"
version="${VLLM_VERSION:-0.33.0}"
grid="${CONFORMANCE_GRID:-sample}"
members="${CONFORMANCE_MEMBERS:-}"
target="${CARGO_TARGET_DIR:-$root/target}"
cache="${PREFIX_ROUTER_CACHE:-$HOME/.cache/prefix-router}"
case "$grid" in
    sample) out="$cache/conformance/vllm-$version/out" ;;
    full) out="$target/conformance/vllm-$version/out-full" ;;
    *) echo "run.sh: CONFORMANCE_GRID is sample or full, not $grid" >&2; exit 1 ;;
esac
args=(--grid "$grid")
if [ -n "$members" ]; then
    out="$target/conformance/vllm-$version/out-$members"
    args=(--members "$members")
fi

stamp="$( (echo "vllm $version grid $grid members $members"; python3 -V; cat "$here"/*.py "$here/requirements.txt") | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$out/.stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "$out"
    exit 0
fi

setup="$(VLLM_VERSION="$version" bash "$here/setup.sh")"
python="$(printf '%s\n' "$setup" | sed -n 1p)"
site="$(printf '%s\n' "$setup" | sed -n 2p)"
mkdir -p "$(dirname "$out")"

rm -rf "$out.partial"
# PYTHONHASHSEED fixes Python's set order (vllm_import.py explains why vLLM
# never sees it); bytecode goes under target/, not into the source tree.
PYTHONHASHSEED=0 PYTHONPYCACHEPREFIX="$target/conformance/pycache" \
    "$python" "$here" --site "$site" --out "$out.partial" "${args[@]}" \
    --jobs "${CONFORMANCE_JOBS:-0}" >&2
rm -rf "$out"
mv "$out.partial" "$out"
echo "$stamp" > "$out/.stamp"
echo "$out"
