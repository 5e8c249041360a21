#!/usr/bin/env python3
"""Readers on raid1 (or raid10), a benchmark (not a test): do two readers of two
files read faster than one, because their reads go to different devices?

In one run, on image files on the same disk: a Canopy filesystem over two
images (`-m raid1 -d raid1`) and a kernel btrfs over two loop devices of
the same images, each holding two files of FILE MiB of random bytes.
Per round, page caches dropped (and Canopy remounted) first:
- one reader: `cat` of the first file;
- two readers: `cat` of both files at once.
Prints MiB/s of the data read (median of ROUNDS) and, for each
filesystem, the two readers' rate over the one reader's. CANOPY_OLD=path
also runs another canopy binary (an A/B of the read path).

PROFILE (raid1, raid1c3 or raid10; default raid1) and DEVICES (default
2; raid10 needs 4) choose the profile both filesystems get and how many
images they span.

Two image files on one disk share its queue, so spreading reads cannot
show there. THROTTLE=MIBS gives each device a bandwidth of its own:
both filesystems then run on loop devices over the images, and a blkio
cgroup (v1) holding the Canopy daemon, or btrfs's readers, limits reads
of each device to MIBS MiB/s.
Needs root and btrfs-progs.

Usage: python3 bench/raid1_read.py [FILE_MIB] [ROUNDS]   (default 1024 3)
"""
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib.fs import CANOPY, drop_caches, images, out, sh, wait_daemon  # noqa: E402

FILE = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
W = os.environ.get("WORK", "/var/tmp/canopy-raid1-read")
THROTTLE = int(os.environ.get("THROTTLE", "0"))
PROFILE = os.environ.get("PROFILE", "raid1")
DEVICES = int(os.environ.get("DEVICES", "2"))
NAMES = "abcdefghijklmnop"[:DEVICES]
CGROUP = "/sys/fs/cgroup/blkio/canopy-raid1-read"
M = f"{W}/mnt"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def throttle(devices):
    """The cgroup limiting each of `devices` to THROTTLE MiB/s of reads."""
    os.makedirs(CGROUP, exist_ok=True)
    limits = []
    for d in devices:
        st = os.stat(d)
        limits.append(f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)} {THROTTLE << 20}")
    for line in limits:
        with open(f"{CGROUP}/blkio.throttle.read_bps_device", "w") as f:
            f.write(line + "\n")


def confine(pid):
    with open(f"{CGROUP}/cgroup.procs", "w") as f:
        f.write(f"{pid}\n")


def reader(f, confined):
    """`cat f`, inside the throttled cgroup when `confined`."""
    if not confined:
        return subprocess.Popen(["cat", f], stdout=subprocess.DEVNULL)
    cmd = f'echo $$ > {CGROUP}/cgroup.procs && exec cat "{f}"'
    return subprocess.Popen(["bash", "-c", cmd], stdout=subprocess.DEVNULL)


def read_rate(files, remount, confined=False):
    """MiB/s of `cat` of `files` at once, from cold caches."""
    remount()
    drop_caches()
    t = time.monotonic()
    procs = [reader(f, confined) for f in files]
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"cat failed: {files}")
    return FILE * len(files) / (time.monotonic() - t)


def rounds(who, remount, rates, confined=False):
    files = [f"{M}/a", f"{M}/b"]
    for _ in range(ROUNDS):
        rates[f"{who} one"].append(read_rate(files[:1], remount, confined))
        rates[f"{who} two"].append(read_rate(files, remount, confined))


def fill():
    for name in "ab":
        sh(f"head -c {FILE}M /dev/urandom > {M}/{name}")


def canopy_rounds(who, binary, size, rates):
    # With THROTTLE, on loop devices whose reads the cgroup limits.
    paths = [f"{W}/canopy-{n}.img" for n in NAMES]
    with images(paths, size, loop=bool(THROTTLE)) as devs:
        a = devs[0]
        if THROTTLE:
            throttle(devs)
        sh(f"{binary} mkfs -f -q -m {PROFILE} -d {PROFILE} {' '.join(devs)}")
        others = ",".join(f"device={d}" for d in devs[1:])
        mount = f"{binary} mount {a} {M} -o {others}"
        sh(mount)
        fill()
        sh(f"{binary} sync {M}")

        def remount():
            sh(f"umount {M}")
            wait_daemon(a)
            sh(mount)
            if THROTTLE:
                confine(out(f"pgrep -o -f -- ' {a} {M}$'").strip())

        rounds(who, remount, rates)
        sh(f"umount {M}")
        wait_daemon(a)


def btrfs_rounds(size, rates):
    with images([f"{W}/btrfs-{n}.img" for n in NAMES], size, loop=True) as loops:
        sh(f"mkfs.btrfs -q -f -m {PROFILE} -d {PROFILE} {' '.join(loops)} >/dev/null")
        sh(f"mount {loops[0]} {M}")
        fill()
        sh(f"sync -f {M}")

        def remount():
            sh(f"umount {M} && mount {loops[0]} {M}")

        if THROTTLE:
            throttle(loops)
        rounds("btrfs", remount, rates, confined=bool(THROTTLE))
        sh(f"umount {M}")


def main():
    os.makedirs(M, exist_ok=True)
    sh(f"cd {ROOT} && cargo build --release --locked -q")
    size = FILE * 3 + 512
    builds = [("canopy", CANOPY)]
    if os.environ.get("CANOPY_OLD"):
        builds.append(("canopy-old", os.environ["CANOPY_OLD"]))
    rates = {}
    for who in [b[0] for b in builds] + ["btrfs"]:
        rates[f"{who} one"] = []
        rates[f"{who} two"] = []
    for who, binary in builds:
        canopy_rounds(who, binary, size, rates)
    btrfs_rounds(size, rates)
    limit = f", reads of each device limited to {THROTTLE} MiB/s" if THROTTLE else ""
    print(f"two files of {FILE} MiB on {PROFILE} over {DEVICES} images{limit}, {ROUNDS} rounds, medians:")
    med = {k: statistics.median(v) for k, v in rates.items()}
    for k, v in med.items():
        print(f"  {k:16s} {v:8.1f} MiB/s")
    for who in [b[0] for b in builds] + ["btrfs"]:
        print(f"  {who}: two readers {med[who + ' two'] / med[who + ' one']:.2f}x one")


if __name__ == "__main__":
    main()
