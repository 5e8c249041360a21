#!/usr/bin/env bash
# Quick comparison (a benchmark, not a test) of Canopy with fuse2fs (a FUSE
# peer) and kernel btrfs on a loop-mounted image, in one run:
#   - sequential 1 GiB write (dd, conv=fsync) and cold read
#   - 10,000 creates, 10,000 renames from one process (rename(2) in a loop)
#   - dbench with 2 clients for 30 s
# Each filesystem gets its own 4 GiB sparse image under WORK (default
# /var/tmp/canopy-bench). Prints a table of medians over ROUNDS rounds
# (default 3), run alternately. Needs root. Usage:
#   bash bench/quick.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
ROUNDS=${1:-3}
WORK=${WORK:-/var/tmp/canopy-bench}
DBENCH_SECS=${DBENCH_SECS:-30}
command -v fuse2fs >/dev/null && command -v mkfs.btrfs >/dev/null && command -v dbench >/dev/null || {
    apt-get update -qq && apt-get install -y -qq fuse2fs btrfs-progs dbench >/dev/null
}
cargo build --release --locked
CANOPY=$(pwd)/target/release/canopy
mkdir -p "$WORK"
MNT=$WORK/mnt
mkdir -p "$MNT"
RESULTS=$WORK/results.tsv
: > "$RESULTS"

# Waits until MNT is a mount point (FUSE daemons mount asynchronously).
wait_mounted() {
    for _ in $(seq 100); do
        mountpoint -q "$MNT" && return 0
        sleep 0.1
    done
    echo "mount on $MNT did not appear" >&2
    return 1
}
# Waits until no daemon serves the image any more.
wait_daemon_gone() { # image
    for _ in $(seq 100); do
        pgrep -f -- "$1" >/dev/null || return 0
        sleep 0.1
    done
}
umount "$MNT" 2>/dev/null || true
trap 'umount "$MNT" 2>/dev/null || true' EXIT

fs_mount() { # fs image
    case $1 in
    canopy) rm -f "$2"; $CANOPY mkfs -q -s 4G "$2"; $CANOPY mount "$2" "$MNT" ;;
    fuse2fs) rm -f "$2"; truncate -s 4G "$2"; mkfs.ext4 -q -F "$2"; fuse2fs "$2" "$MNT" -o fakeroot ;;
    btrfs) rm -f "$2"; truncate -s 4G "$2"; mkfs.btrfs -q -f "$2"; mount -o loop "$2" "$MNT" ;;
    esac
    wait_mounted
}
fs_remount() { # fs image
    fs_umount
    case $1 in
    canopy) $CANOPY mount "$2" "$MNT" ;;
    fuse2fs) fuse2fs "$2" "$MNT" -o fakeroot ;;
    btrfs) mount -o loop "$2" "$MNT" ;;
    esac
    wait_mounted
}
fs_umount() {
    umount "$MNT"
    # FUSE daemons finish after umount returns.
    for img in "$WORK"/*.img; do wait_daemon_gone "$img"; done
    sync
    echo 3 > /proc/sys/vm/drop_caches
}
now() { date +%s.%N; }
record() { echo -e "$1\t$2\t$3" >> "$RESULTS"; }

run_one() { # fs
    local fs=$1 img=$WORK/$1.img t0 t1
    fs_mount "$fs" "$img"
    t0=$(now); dd if=/dev/zero of="$MNT/big" bs=1M count=1024 conv=fsync status=none; t1=$(now)
    record "$fs" "seq write 1 GiB (MB/s)" "$(echo "1024 / ($t1 - $t0)" | bc -l)"
    fs_remount "$fs" "$img"
    t0=$(now); dd if="$MNT/big" of=/dev/null bs=1M status=none; t1=$(now)
    record "$fs" "seq read 1 GiB cold (MB/s)" "$(echo "1024 / ($t1 - $t0)" | bc -l)"
    rm "$MNT/big"
    mkdir "$MNT/c"
    t0=$(now); python3 -c "
import os
for i in range(10000):
    os.close(os.open('$MNT/c/f%d' % i, os.O_CREAT | os.O_WRONLY, 0o644))
"; t1=$(now)
    record "$fs" "10k creates (s)" "$(echo "$t1 - $t0" | bc -l)"
    t0=$(now); python3 -c "
import os
for i in range(10000):
    os.rename('$MNT/c/f%d' % i, '$MNT/c/f%d-RPMDELETE' % i)
"; t1=$(now)
    record "$fs" "10k renames (s)" "$(echo "$t1 - $t0" | bc -l)"
    mkdir "$MNT/db"
    local tput
    tput=$(dbench -D "$MNT/db" -t "$DBENCH_SECS" 2 2>/dev/null | awk '/^Throughput/ {print $2}')
    record "$fs" "dbench 2 clients (MB/s)" "${tput:-0}"
    fs_umount
}

for r in $(seq "$ROUNDS"); do
    for fs in canopy fuse2fs btrfs; do
        echo "round $r: $fs" >&2
        run_one "$fs"
    done
done

python3 - "$RESULTS" <<'PY'
import sys, statistics, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    fs, metric, v = line.rstrip("\n").split("\t")
    rows[(metric, fs)].append(float(v))
metrics = list(dict.fromkeys(m for m, _ in rows))
fss = ["canopy", "fuse2fs", "btrfs"]
print("| workload | " + " | ".join(f"{f} (median, min-max)" for f in fss) + " | canopy/fuse2fs | canopy/btrfs |")
print("|---" * (len(fss) + 3) + "|")
for m in metrics:
    med = {f: statistics.median(rows[(m, f)]) for f in fss}
    cells = [f"{med[f]:.2f} ({min(rows[(m, f)]):.2f}-{max(rows[(m, f)]):.2f})" for f in fss]
    def ratio(f):
        if "(s)" in m:  # time: lower is better; report speedup
            return f"{med[f] / med['canopy']:.2f}x faster" if med['canopy'] else "-"
        return f"{med['canopy'] / med[f]:.2f}x" if med[f] else "-"
    print(f"| {m} | " + " | ".join(cells) + f" | {ratio('fuse2fs')} | {ratio('btrfs')} |")
PY
