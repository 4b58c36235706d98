#!/usr/bin/env bash
# Builds the Python package from this tree and installs it into a fresh virtual environment:
#   - maturin (build-requirements.txt) in <target>/python/tools, kept while the file is
#     unchanged;
#   - the wheel, built by `maturin build --release` into <target>/python/wheels (Cargo's
#     build directory <target>/python/cargo is kept, so a second build only relinks);
#   - a new environment <target>/python/venv (removed first) with the wheel and
#     tests/requirements*.txt.
# <target> is ${CARGO_TARGET_DIR:-<repo>/target}. Prints the environment's python.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}/python"
tools="$target/tools"
pip=(--quiet --disable-pip-version-check)

if ! cmp -s "$here/build-requirements.txt" "$tools/.requirements" 2>/dev/null; then
    rm -rf "$tools"
    python3 -m venv "$tools" >&2
    "$tools/bin/python" -m pip install "${pip[@]}" -r "$here/build-requirements.txt" >&2
    cp "$here/build-requirements.txt" "$tools/.requirements"
fi

rm -rf "$target/wheels"
CARGO_TARGET_DIR="$target/cargo" "$tools/bin/maturin" build --release --quiet \
    --manifest-path "$here/Cargo.toml" --out "$target/wheels" >&2
wheel="$(find "$target/wheels" -name 'prefix_router-*.whl' -print -quit)"
if [ -z "$wheel" ]; then
    echo "setup.sh: maturin left no wheel in $target/wheels" >&2
    exit 1
fi

venv="$target/venv"
rm -rf "$venv"
python3 -m venv "$venv" >&2
"$venv/bin/python" -m pip install "${pip[@]}" "$wheel" >&2
for r in "$here"/tests/requirements*.txt; do
    "$venv/bin/python" -m pip install "${pip[@]}" -r "$r" >&2
done
echo "$venv/bin/python"
