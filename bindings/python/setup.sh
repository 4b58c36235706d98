#!/usr/bin/env bash
# Builds the Python package from this tree and installs it into a fresh virtual environment:
#   - maturin (build-requirements.txt) in <target>/python/tools, kept while the file is
#     unchanged;
#   - the wheel, built by `maturin build --release` into <target>/python/wheels (Cargo's
#     build directory <target>/python/cargo is kept, so a second build only relinks);
#   - an environment <target>/python/venv with the wheel and tests/requirements*.txt, made
#     anew (removed first) unless the one there holds the same wheel contents (its RECORD of
#     file hashes) and the same requirements.
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
# What the environment holds: the wheel's files by their hashes, and the requirements. The
# software bill of materials maturin writes into the wheel's metadata is left out: it carries
# a fresh serial number and time on every build, so the same code would never match.
stamp="$(
    {
        python3 -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
record = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))).decode()
sys.stdout.write("".join(l for l in record.splitlines(True) if "/sboms/" not in l.split(",")[0]))' "$wheel"
        cat "$here"/tests/requirements*.txt
    } | sha256sum | cut -d' ' -f1
)"
if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv" >&2
    "$venv/bin/python" -m pip install "${pip[@]}" "$wheel" >&2
    for r in "$here"/tests/requirements*.txt; do
        "$venv/bin/python" -m pip install "${pip[@]}" -r "$r" >&2
    done
    echo "$stamp" >"$venv/.installed"
fi
echo "$venv/bin/python"
