#!/usr/bin/env python3
"""Scrub speed, a benchmark (not a test).

In one run, on image files on the same disk: `dd` of the Canopy image,
`canopy scrub` of the unmounted image and of its mount, and `btrfs scrub`
of a loop-mounted kernel btrfs holding the same data. Page caches are
dropped before every read. Prints MiB/s (median of ROUNDS) and each
scrub's ratio to dd. Needs root and btrfs-progs.

Usage: python3 bench/scrub.py [DATA_MIB] [ROUNDS]   (default 1536 3)
"""
import json
import os
import statistics
import subprocess
import sys
import time

DATA = int(sys.argv[1]) if len(sys.argv) > 1 else 1536
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
W = os.environ.get("WORK", "/var/tmp/canopy-scrub")
M = f"{W}/mnt"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CANOPY = f"{ROOT}/target/release/canopy"
MiB = 1 << 20


def sh(cmd, **kw):
    return subprocess.run(cmd, shell=True, check=True, **kw)


def drop_caches():
    sh("sync; echo 3 > /proc/sys/vm/drop_caches")


def timed(cmd):
    drop_caches()
    t = time.monotonic()
    out = subprocess.run(cmd, shell=True, check=False, capture_output=True, text=True)
    return time.monotonic() - t, out


def wait_daemon(img):
    while subprocess.run(["pgrep", "-f", img], capture_output=True).returncode == 0:
        time.sleep(0.1)


def fill():
    for i in range(DATA // 64):
        sh(f"cp {W}/src {M}/f{i}")


def main():
    os.makedirs(M, exist_ok=True)
    sh(f"cd {ROOT} && cargo build --release --locked -q")
    sh(f"head -c 64M /dev/urandom > {W}/src")
    size = DATA * 2
    can, btr = f"{W}/canopy.img", f"{W}/btrfs.img"
    # Fully written images, so dd reads the disk rather than holes.
    for img in (can, btr):
        sh(f"dd if=/dev/zero of={img} bs=1M count={size} status=none")
    sh(f"{CANOPY} mkfs -f -q {can} && {CANOPY} mount {can} {M}")
    fill()
    sh(f"{CANOPY} sync {M} && umount {M}")
    wait_daemon(can)
    rates = {"dd": [], "canopy scrub (image)": [], "canopy scrub (mounted)": [], "btrfs scrub": []}
    scrubbed = 0
    for _ in range(ROUNDS):
        t, _ = timed(f"dd if={can} of=/dev/null bs=1M status=none")
        rates["dd"].append(size * MiB / t / MiB)
        t, out = timed(f"{CANOPY} scrub -q --json {can}")
        r = json.loads(out.stdout)
        scrubbed = r["data_bytes"] + r["tree_blocks"] * 16384
        rates["canopy scrub (image)"].append(scrubbed / t / MiB)
        sh(f"{CANOPY} mount {can} {M}")
        t, out = timed(f"{CANOPY} scrub -q --json {M}")
        rates["canopy scrub (mounted)"].append(scrubbed / t / MiB)
        sh(f"umount {M}")
        wait_daemon(can)
    sh(f"mkfs.btrfs -q -f {btr} >/dev/null && mount -o loop {btr} {M}")
    fill()
    sh(f"sync -f {M}")
    used = int(subprocess.run(["df", "-B1", "--output=used", M], capture_output=True,
                              text=True).stdout.split()[-1])
    for _ in range(ROUNDS):
        t, _ = timed(f"btrfs scrub start -B -q {M}")
        rates["btrfs scrub"].append(used / t / MiB)
    sh(f"umount {M}")
    dd = statistics.median(rates["dd"])
    print(f"data {DATA} MiB, images {size} MiB, {ROUNDS} rounds, medians:")
    for name, rs in rates.items():
        med = statistics.median(rs)
        print(f"  {name:24s} {med:8.1f} MiB/s   {med / dd:5.2f}x dd")
    for img in (can, btr, f"{W}/src"):
        os.remove(img)


if __name__ == "__main__":
    main()
