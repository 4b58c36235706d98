#!/usr/bin/env bash
# The live fleet bench (benches/live.md): installs what it needs, builds the gateways, runs.
#
#   bash benches/live/run.sh            # every router, every workload (21 min on 2 cores)
#   bash benches/live/run.sh --quick    # CI smoke: 4 engines, 95 requests, the Rust gateway
#                                       # (KV events) and Dynamo's KV router, checked (80 s)
#   bash benches/live/run.sh --routers "gateway balanced,dynamo kv" --workloads synthetic:3
#
# Installed at run time, never committed:
#   - ai-dynamo 1.6.1 (--no-deps: its aisimulate requirement is a stub that downloads from
#     elsewhere) with its other requirements, sglang-router 0.3.2, vllm-router 0.1.17 and
#     the openai client, into ~/.cache/prefix-router/live-venv (kept while the
#     requirement files are unchanged);
#   - the gateway example (--features zmq) into $LIVE_TARGET (default <repo>/target-live),
#     unless $LIVE_GATEWAY_BIN names one already built with the zmq feature (CI's);
#   - the Python package (bindings/python/setup.sh) into $LIVE_TARGET/python (not --quick).
# Everything listens on 127.0.0.1. Builds run under `nice`. Extra flags go to bench.py.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
target="${LIVE_TARGET:-$root/target-live}"
venv="${LIVE_VENV:-$HOME/.cache/prefix-router/live-venv}"
pip=(--quiet --disable-pip-version-check)
quick=0
for a in "$@"; do [ "$a" = "--quick" ] && quick=1; done

stamp="$(cat "$here/requirements-nodeps.txt" "$here/requirements.txt" | sha256sum | cut -c1-16)"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.stamp" 2>/dev/null)" != "$stamp" ]; then
    echo "live: installing ai-dynamo, the peer routers and openai into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install "${pip[@]}" --no-deps -r "$here/requirements-nodeps.txt"
    "$venv/bin/python" -m pip install "${pip[@]}" -r "$here/requirements.txt"
    echo "$stamp" > "$venv/.stamp"
fi

gateway="${LIVE_GATEWAY_BIN:-}"
if [ -n "$gateway" ] && [ -x "$gateway" ]; then
    echo "live: the gateway example as built: $gateway" >&2
else
    echo "live: building the gateway example (release, --features zmq) into $target" >&2
    CARGO_TARGET_DIR="$target" nice -n 10 cargo build --quiet --release --features zmq \
        --example gateway --manifest-path "$root/Cargo.toml"
    gateway="$target/release/examples/gateway"
fi
args=(--python "$venv/bin/python" --gateway-bin "$gateway")

if [ "$quick" = 0 ]; then
    echo "live: building the Python package into $target/python" >&2
    pygw="$(CARGO_TARGET_DIR="$target" nice -n 10 bash "$root/bindings/python/setup.sh")"
    args+=(--py-gateway-python "$pygw")
fi

exec "$venv/bin/python" "$here/bench.py" "${args[@]}" --workdir "$target/live" "$@"
