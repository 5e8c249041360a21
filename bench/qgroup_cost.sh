#!/usr/bin/env bash
# Quota accounting cost per commit as snapshots are added (a benchmark, not
# a test; issue 15's aim: 64 snapshots at most 1.2x the cost with 1). Runs
# in memory: no image, no mount. Each scenario is built once, then the
# scenarios commit in turn so that the machine's noise falls on all alike.
# Usage: bash bench/qgroup_cost.sh [extra qgroup_cost flags]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
TARGET=${CARGO_TARGET_DIR:-target}
cargo build --release --locked --example qgroup_cost
"$TARGET/release/examples/qgroup_cost" --files 50000 --commits 300 --snapshots 1,2,16,64 "$@"
