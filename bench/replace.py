#!/usr/bin/env python3
"""Device replace and raid1 scrub, a benchmark (not a test).

In one run, on image files on the same disk: a Canopy filesystem over two
images (`-m raid1 -d raid1`) and a kernel btrfs over two loop devices of
the same images' size and profiles, each holding the same data (DATA MiB
in 64 MiB files of random bytes), both mounted throughout, their rounds
alternating. Per round, page caches dropped first:
- `canopy scrub` of the mount against `btrfs scrub start -B`;
- `canopy device replace start -B 2 NEW MNT` against `btrfs replace start
  -B 2 /dev/loopN MNT`, each to a fresh image of the same size, then
  back again (so every round replaces the same amount).
Prints MiB/s of the data (median of ROUNDS) and Canopy's ratio to btrfs.
Needs root and btrfs-progs.

Usage: python3 bench/replace.py [DATA_MIB] [ROUNDS]   (default 2048 3)
"""
import contextlib
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib.fs import CANOPY, drop_caches, images, sh, wait_daemon  # noqa: E402

DATA = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
W = os.environ.get("WORK", "/var/tmp/canopy-replace")
M = f"{W}/mnt"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(cmd):
    drop_caches()
    t = time.monotonic()
    sh(cmd, stdout=subprocess.DEVNULL)
    return time.monotonic() - t


def fill(mnt):
    for i in range(DATA // 64):
        sh(f"cp {W}/src {mnt}/f{i}")


def canopy_setup(stack, size):
    """A raid1 Canopy filesystem over two images, mounted and filled; the
    spare image; the scrub and replace commands."""
    a, b, c = stack.enter_context(images([f"{W}/canopy-{n}.img" for n in "abc"], size))
    m = f"{M}/canopy"
    sh(f"{CANOPY} mkfs -f -q -m raid1 -d raid1 {a} {b}")
    sh(f"{CANOPY} mount {a} {m} -o device={b}")
    stack.callback(lambda: (sh(f"umount {m}"), wait_daemon(a)))
    fill(m)
    sh(f"{CANOPY} sync {m}")
    replace = f"{CANOPY} device replace start -B 2 {{spare}} {m}"
    return f"{CANOPY} scrub -q {m}", replace, [c, b]


def btrfs_setup(stack, size):
    """The same on kernel btrfs over loop devices."""
    loops = stack.enter_context(images([f"{W}/btrfs-{n}.img" for n in "abc"], size, loop=True))
    m = f"{M}/btrfs"
    sh(f"mkfs.btrfs -q -f -m raid1 -d raid1 {loops[0]} {loops[1]} >/dev/null")
    sh(f"mount {loops[0]} {m}")
    stack.callback(lambda: sh(f"umount {m}"))
    fill(m)
    sh(f"sync -f {m}")
    replace = f"btrfs replace start -B -f 2 {{spare}} {m}"
    return f"btrfs scrub start -B -q {m}", replace, [loops[2], loops[1]]


def one_round(who, setup, rates):
    """A scrub, then a replace of device 2 by the spare; the replaced
    device is the next round's spare, so every round replaces the same
    amount."""
    scrub, replace, spares = setup
    rates[f"{who} scrub"].append(DATA / timed(scrub))
    sh(f"wipefs -a -q {spares[0]}")
    rates[f"{who} replace"].append(DATA / timed(replace.format(spare=spares[0])))
    spares.reverse()


def main():
    os.makedirs(M, exist_ok=True)
    sh(f"cd {ROOT} && cargo build --release --locked -q")
    sh(f"head -c 64M /dev/urandom > {W}/src")
    size = DATA * 3 // 2 + 512
    rates = {k: [] for k in ("canopy scrub", "btrfs scrub", "canopy replace", "btrfs replace")}
    # Both filesystems at once, their rounds alternating: the disk's speed
    # here drifts by more than the difference measured over minutes.
    with contextlib.ExitStack() as stack:
        for d in ("canopy", "btrfs"):
            os.makedirs(f"{M}/{d}", exist_ok=True)
        canopy = canopy_setup(stack, size)
        btrfs = btrfs_setup(stack, size)
        for _ in range(ROUNDS):
            one_round("canopy", canopy, rates)
            one_round("btrfs", btrfs, rates)
    os.remove(f"{W}/src")
    print(f"data {DATA} MiB on two devices of {size} MiB (raid1), {ROUNDS} rounds, medians:")
    med = {k: statistics.median(v) for k, v in rates.items()}
    for k, v in med.items():
        print(f"  {k:16s} {v:8.1f} MiB/s")
    for what in ("scrub", "replace"):
        print(f"  {what}: Canopy {med['canopy ' + what] / med['btrfs ' + what]:.2f}x btrfs")


if __name__ == "__main__":
    main()
