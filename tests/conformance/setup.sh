#!/usr/bin/env bash
# Prepares the conformance harness (tests/conformance/) for one vLLM version:
#   - the vLLM wheel, downloaded once with `pip download --no-deps` into
#     ${PREFIX_ROUTER_CACHE:-$HOME/.cache/prefix-router}/vllm-$VERSION/, a cache that
#     outlives the work tree;
#   - a virtual environment at ${CARGO_TARGET_DIR:-<repo>/target}/conformance-venv with
#     tests/conformance/requirements.txt (kept while the requirements are unchanged);
#   - the wheel's .py files (no compiled extensions, no metadata) unpacked into
#     <target>/conformance/vllm-$VERSION/site.
# The version is VLLM_VERSION (default 0.33.0). Prints the environment's python, then
# the site directory, one per line. Safe to run again: finished steps are skipped.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
version="${VLLM_VERSION:-0.33.0}"
cache="${PREFIX_ROUTER_CACHE:-$HOME/.cache/prefix-router}/vllm-$version"
target="${CARGO_TARGET_DIR:-$root/target}"
venv="$target/conformance-venv"
site="$target/conformance/vllm-$version/site"

find_wheel() {
    find "$cache" -maxdepth 1 -name "vllm-$version-*.whl" -print -quit 2>/dev/null || true
}

mkdir -p "$cache"
wheel="$(find_wheel)"
if [ -z "$wheel" ]; then
    echo "setup.sh: downloading vllm==$version into $cache" >&2
    python3 -m pip download --quiet --disable-pip-version-check --no-deps \
        --only-binary=:all: --dest "$cache" "vllm==$version" >&2
    wheel="$(find_wheel)"
    if [ -z "$wheel" ]; then
        echo "setup.sh: pip download left no vllm-$version wheel in $cache" >&2
        exit 1
    fi
fi

if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "setup.sh: vLLM's sources need Python 3.11 or newer; python3 is $(python3 -V 2>&1)" >&2
    exit 1
fi

stamp="$venv/.requirements"
if ! cmp -s "$root/tests/conformance/requirements.txt" "$stamp" 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        -r "$root/tests/conformance/requirements.txt" >&2
    cp "$root/tests/conformance/requirements.txt" "$stamp"
fi

unpacked="$site/.unpacked-from"
if [ "$(cat "$unpacked" 2>/dev/null)" != "$(basename "$wheel")" ]; then
    rm -rf "$site"
    mkdir -p "$site"
    "$venv/bin/python" - "$wheel" "$site" <<'EOF'
import sys
import zipfile

wheel, site = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as archive:
    names = [n for n in archive.namelist() if n.endswith(".py")]
    if not any(n == "vllm/v1/core/kv_cache_manager.py" for n in names):
        sys.exit(f"{wheel} holds no vllm/v1/core/kv_cache_manager.py")
    archive.extractall(site, members=names)
EOF
    basename "$wheel" > "$unpacked"
fi

echo "$venv/bin/python"
echo "$site"
