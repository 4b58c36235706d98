#!/usr/bin/env bash
# Creates (once) the virtual environment tests/gateway/openai.rs runs the OpenAI client in:
# target/openai-venv, with tests/python/requirements.txt installed from the package registry.
# Prints the environment's python. Safe to run again: an environment whose requirements
# are already installed is kept.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${CARGO_TARGET_DIR:-$root/target}/openai-venv"
stamp="$venv/.requirements"
if ! cmp -s "$root/tests/python/requirements.txt" "$stamp" 2>/dev/null; then
    python3 -m venv "$venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        -r "$root/tests/python/requirements.txt" >&2
    cp "$root/tests/python/requirements.txt" "$stamp"
fi
echo "$venv/bin/python"
