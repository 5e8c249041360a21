#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit, property, crash, hostile,
# concurrency and command-line tests. Extra arguments go to `cargo test`.
# PROPTEST_CASES raises the number of random cases (default: quick).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --all-targets --locked -- -D warnings
# Tests that need root, /dev/fuse or losetup record themselves here when
# they cannot run (CANOPY_REQUIRE_ALL=1 makes that a failure instead).
skipped=target/tmp/skipped-tests.txt
mkdir -p target/tmp && rm -f "$skipped"
echo "== cargo test"
cargo test --locked "$@"
echo "== mount tests again, mounted with the kernel's writeback cache"
CANOPY_TEST_MOUNT_OPTS=writeback_cache cargo test --locked --test mount --test mount_posix --test exerciser "$@"
if [ -s "$skipped" ]; then
    echo "== SKIPPED: $(sort -u "$skipped" | wc -l) tests could not run on this machine:"
    sort -u "$skipped" | sed 's/^/   /'
else
    echo "== every test ran (none skipped)"
fi
