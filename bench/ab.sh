#!/usr/bin/env bash
# A/B of two Canopy builds in one run (a benchmark, not a test): sequential
# 1 GiB write (dd conv=fsync), cold read after remount and dropped caches,
# 10,000 creates of empty files (then sync), dbench with 2 clients, and the
# metadata steps of bench/run.py's everyday workload (cp -a /usr/share;
# find, du -s and tar cold; rm -rf), alternating the builds for ROUNDS
# rounds.
# Needs root. Build the older one with, for example,
#   git worktree add /var/tmp/old REV && (cd /var/tmp/old && CARGO_TARGET_DIR=/var/tmp/old-target cargo build --release)
# Usage: bash bench/ab.sh OLD_CANOPY NEW_CANOPY [ROUNDS]
set -euo pipefail
OLD=$1 NEW=$2 ROUNDS=${3:-3}
W=${WORK:-/var/tmp/canopy-ab}
M=$W/mnt
mkdir -p "$M"
command -v dbench >/dev/null || { apt-get update -qq && apt-get install -y -qq dbench >/dev/null; }
trap 'umount "$M" 2>/dev/null || true' EXIT
unmount() { umount "$M"; while pgrep -f -- "$W/ab.img" >/dev/null; do sleep 0.1; done; }
secs() { date +%s.%N; }
for r in $(seq "$ROUNDS"); do
    for v in old new; do
        C=$OLD; [ $v = new ] && C=$NEW
        rm -f "$W/ab.img"; "$C" mkfs -q -s 4G "$W/ab.img"; "$C" mount "$W/ab.img" "$M"
        s=$(secs); dd if=/dev/zero of="$M/big" bs=1M count=1024 conv=fsync status=none; e=$(secs)
        echo -e "$v\twrite MB/s\t$(echo "1024/($e-$s)" | bc -l)"
        unmount; sync; echo 3 > /proc/sys/vm/drop_caches
        "$C" mount "$W/ab.img" "$M"
        s=$(secs); dd if="$M/big" of=/dev/null bs=1M status=none; e=$(secs)
        echo -e "$v\tcold read MB/s\t$(echo "1024/($e-$s)" | bc -l)"
        rm "$M/big"; mkdir "$M/c"
        s=$(secs); (cd "$M/c" && for i in $(seq 10000); do : > "f$i"; done); "$C" sync "$M"; e=$(secs)
        echo -e "$v	10k creates/s	$(echo "10000/($e-$s)" | bc -l)"
        mkdir "$M/db"
        echo -e "$v\tdbench MB/s\t$(dbench -D "$M/db" -t 20 2 2>/dev/null | awk '/^Throughput/ {print $2}')"
        s=$(secs); cp -a /usr/share "$M/tree"; e=$(secs)
        echo -e "$v\tcp -a /usr/share s\t$(echo "$e-$s" | bc -l)"
        for step in "find $M/tree" "du -s $M/tree" "tar cf - -C $M tree"; do
            unmount; sync; echo 3 > /proc/sys/vm/drop_caches; "$C" mount "$W/ab.img" "$M"
            s=$(secs); $step | cat > /dev/null; e=$(secs)
            echo -e "$v\t${step%% *} cold s\t$(echo "$e-$s" | bc -l)"
        done
        s=$(secs); rm -rf "$M/tree"; "$C" sync "$M"; e=$(secs)
        echo -e "$v\trm -rf s\t$(echo "$e-$s" | bc -l)"
        unmount
    done
done
