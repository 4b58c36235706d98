#!/usr/bin/env bash
# Runs the conformance harness against vLLM VLLM_VERSION (default 0.33.0): setup.sh,
# then every scenario, one JSONL file each in
# ${CARGO_TARGET_DIR:-<repo>/target}/conformance/vllm-$VERSION/out/. Prints that
# directory. The files are made again only when tests/conformance/*.py, the
# requirements or the version changed since the last complete run (a stamp in the
# directory records which), so a repeated run returns at once.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
here="$root/tests/conformance"
version="${VLLM_VERSION:-0.33.0}"
target="${CARGO_TARGET_DIR:-$root/target}"
out="$target/conformance/vllm-$version/out"

setup="$(VLLM_VERSION="$version" bash "$here/setup.sh")"
python="$(printf '%s\n' "$setup" | sed -n 1p)"
site="$(printf '%s\n' "$setup" | sed -n 2p)"

stamp="$( (echo "vllm $version"; cat "$here"/*.py "$here/requirements.txt") | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$out/.stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "$out"
    exit 0
fi

rm -rf "$out.partial"
# PYTHONHASHSEED fixes Python's set order (vllm_import.py explains why vLLM
# never sees it); bytecode goes under target/, not into the source tree.
PYTHONHASHSEED=0 PYTHONPYCACHEPREFIX="$target/conformance/pycache" \
    "$python" "$here" --site "$site" --out "$out.partial" >&2
rm -rf "$out"
mv "$out.partial" "$out"
echo "$stamp" > "$out/.stamp"
echo "$out"
