#!/usr/bin/env bash
# Runs every fuzz target for a bounded time each (default 60 s): `fuzz/run.sh [SECONDS]`.
#
# With cargo-fuzz and a nightly toolchain (`cargo install cargo-fuzz`,
# `rustup toolchain install nightly`) the targets run coverage-guided under libFuzzer.
# Without them (this project's machines have stable Rust only) the same binaries are built on
# stable and run uninstrumented: libFuzzer still feeds them random and mutated inputs, with
# no coverage guidance. The same properties also run as proptests in CI
# (tests/tree_model.rs, tests/sync.rs, tests/stress.rs, tests/replica.rs).
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-60}"
targets=(tree_ops vllm_decode router_api replica_frame)
if cargo +nightly fuzz --version >/dev/null 2>&1; then
    for target in "${targets[@]}"; do
        echo "== $target: coverage-guided, $seconds s"
        cargo +nightly fuzz run "$target" -- -max_total_time="$seconds"
    done
else
    echo "cargo-fuzz on nightly not found: running the targets uninstrumented on stable"
    cargo build --release
    for target in "${targets[@]}"; do
        echo "== $target: uninstrumented, $seconds s"
        "./target/release/$target" -max_total_time="$seconds"
    done
fi
