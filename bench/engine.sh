#!/usr/bin/env bash
# Storage-engine benchmark (a benchmark, not a test): insert, lookup, ordered
# scan and delete of 1,000,000 keys with commits, on a real image file.
# Usage: bash bench/engine.sh [DIR] [extra engine_bench flags]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
DIR=${1:-$(pwd)/target}
shift || true
cargo build --release --locked --example engine_bench
for ns in 4096 16384; do
    target/release/examples/engine_bench --keys 1000000 --rounds 3 --nodesize $ns "$@" "$DIR"
done
