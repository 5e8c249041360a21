#!/usr/bin/env python3
"""Send and receive beside kernel btrfs (a benchmark, not a test; issue 39).

Each filesystem -- Canopy and kernel btrfs, each on a fresh 8 GiB image
file (btrfs loop-mounted), one at a time, rounds interleaved -- runs:

  full send:     a read-only snapshot of a copy of /usr/share, caches
                 dropped (remount), sent to /dev/null; MB/s of the
                 corpus's apparent bytes
  receive:       that stream (each filesystem's own) received on a fresh
                 filesystem of the same kind, then synced; MB/s
  incremental:   a tree of 100,000 small files (1,000 directories of 100)
                 snapshotted; then 1 file changed, snapshotted, and sent
                 with -p to /dev/null (seconds); then 1% of the files
                 (1,000) changed, snapshotted, sent with -p (seconds)

Prints medians of the rounds and Canopy/btrfs ratios (throughput: higher
is better; times: Canopy over btrfs, lower is better). Needs root and
btrfs-progs. Usage:
    python3 bench/send.py [--rounds 3] [--json FILE]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib.fs import CANOPY, Btrfs, Canopy, drop_caches, sh  # noqa: E402

WORK = os.environ.get("WORK", "/var/tmp/canopy-send")
SIZE = 8 << 30
CORPUS = "/usr/share"
FILES_DIRS, FILES_PER_DIR = 1000, 100


class Kind:
    """How one filesystem makes subvolumes, snapshots, streams and syncs."""

    def __init__(self, fs, canopy):
        self.fs, self.canopy = fs, canopy

    def subvol(self, name):
        tool = [CANOPY] if self.canopy else ["btrfs"]
        sh(" ".join(tool + ["subvolume", "create", f"'{self.fs.path(name)}'"]),
           stdout=subprocess.DEVNULL)

    def snapshot(self, src, dst):
        tool = CANOPY if self.canopy else "btrfs"
        sh(f"'{tool}' subvolume snapshot -r '{self.fs.path(src)}' '{self.fs.path(dst)}'",
           stdout=subprocess.DEVNULL)

    def sync(self):
        if self.canopy:
            sh(f"'{CANOPY}' sync '{self.fs.mnt}'")
        else:
            sh(f"sync -f '{self.fs.mnt}'")

    def send(self, snap, out, parent=None):
        tool = f"'{CANOPY}' send -q" if self.canopy else "btrfs send -q"
        p = f"-p '{self.fs.path(parent)}'" if parent else ""
        t = time.perf_counter()
        sh(f"{tool} {p} '{self.fs.path(snap)}' > '{out}'")
        return time.perf_counter() - t

    def receive(self, stream):
        tool = f"'{CANOPY}' receive -q" if self.canopy else "btrfs receive -q"
        t = time.perf_counter()
        sh(f"{tool} -f '{stream}' '{self.fs.mnt}'")
        self.sync()
        return time.perf_counter() - t


def apparent(path):
    out = subprocess.run(["du", "-sb", "--apparent-size", path], check=True,
                         capture_output=True, text=True).stdout
    return int(out.split()[0])


def make_files(root):
    for d in range(FILES_DIRS):
        dd = os.path.join(root, f"d{d:04}")
        os.mkdir(dd)
        for f in range(FILES_PER_DIR):
            with open(os.path.join(dd, f"f{f:03}"), "wb") as fh:
                fh.write(os.urandom(64) * (1 + (d * 7 + f) % 48))


def touch_files(root, count, salt):
    step = max(1, FILES_DIRS * FILES_PER_DIR // count)
    for i in range(0, FILES_DIRS * FILES_PER_DIR, step)[:count]:
        d, f = divmod(i, FILES_PER_DIR)
        with open(os.path.join(root, f"d{d:04}", f"f{f:03}"), "r+b") as fh:
            fh.write(f"changed {salt}".encode())


def one_round(name, canopy):
    cls = Canopy if canopy else Btrfs
    fs = cls(name, WORK, SIZE)
    k = Kind(fs, canopy)
    res = {}
    stream = os.path.join(WORK, f"{name}.stream")
    try:
        fs.make()
        k.subvol("src")
        sh(f"cp -a '{CORPUS}/.' '{fs.path('src')}/'")
        k.snapshot("src", "full")
        k.sync()
        fs.remount_cold()
        res["full_send_mbs"] = apparent(CORPUS) / k.send("full", "/dev/null") / 1e6
        k.send("full", stream)
        k.subvol("many")
        make_files(fs.path("many"))
        k.snapshot("many", "m0")
        touch_files(fs.path("many"), 1, "one")
        k.snapshot("many", "m1")
        touch_files(fs.path("many"), FILES_DIRS * FILES_PER_DIR // 100, "some")
        k.snapshot("many", "m2")
        k.sync()
        fs.remount_cold()
        res["incr_1_file_s"] = k.send("m1", "/dev/null", parent="m0")
        drop_caches()
        res["incr_1pct_s"] = k.send("m2", "/dev/null", parent="m1")
        fs.make()
        drop_caches()
        res["receive_mbs"] = apparent(CORPUS) / k.receive(stream) / 1e6
    finally:
        fs.destroy()
        if os.path.exists(stream):
            os.remove(stream)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    os.makedirs(WORK, exist_ok=True)
    runs = {"canopy": [], "btrfs": []}
    for r in range(a.rounds):
        for name in ("canopy", "btrfs"):
            res = one_round(name, name == "canopy")
            print(f"round {r + 1} {name}: " + ", ".join(f"{k} {v:.3f}" for k, v in res.items()),
                  flush=True)
            runs[name].append(res)
    med = {n: {k: statistics.median(x[k] for x in v) for k in v[0]} for n, v in runs.items()}
    print(f"\n{'metric':<16}{'canopy':>10}{'btrfs':>10}{'ratio':>8}")
    for k in med["canopy"]:
        c, b = med["canopy"][k], med["btrfs"][k]
        print(f"{k:<16}{c:>10.3f}{b:>10.3f}{c / b:>8.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"runs": runs, "medians": med}, f, indent=1)


if __name__ == "__main__":
    main()
