#!/usr/bin/env python3
"""No copy-on-write (`chattr +C`), a benchmark (not a test): a database's
or VM image's pattern, random 4 KiB overwrites each followed by
fdatasync, on Canopy and kernel btrfs with and without `+C`, and on XFS
and ext4 (which always overwrite in place), in one run.

Per round, on a fresh filesystem of each kind (image files on the same
disk, the kernel ones over loop devices): a directory (given `+C` for
the nocow variants) holding a file of FILE_MIB written sequentially and
committed; then WRITES overwrites of random 4 KiB pieces, each with an
fdatasync (timed: IOPS); then a commit, and a cold sequential read of
the file. Reports the medians of ROUNDS: overwrite IOPS, read MB/s after,
the file's extents after (Canopy: `canopy filesystem extents`; the
kernel ones: filefrag), and space used after minus before (MiB).

Usage: python3 bench/nocow.py [FILE_MIB] [WRITES] [ROUNDS]   (default 256 4000 3)
"""
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib.fs import Btrfs, Canopy, Ext4, Xfs, commit_any as commit  # noqa: E402
from benchlib.fs import cold_read_mbs, used_bytes as used  # noqa: E402

FILE_MIB = int(sys.argv[1]) if len(sys.argv) > 1 else 256
WRITES = int(sys.argv[2]) if len(sys.argv) > 2 else 4000
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
W = os.environ.get("WORK", "/var/tmp/canopy-nocow")
MIB = 1 << 20
PIECE = 4096


def extents(fs, path):
    if isinstance(fs, Canopy):
        out = subprocess.run([fs.binary, "filesystem", "extents", "--json", path],
                             check=True, capture_output=True, text=True).stdout
        return len(json.loads(out)["extents"])
    out = subprocess.run(["filefrag", path], check=True, capture_output=True, text=True).stdout
    return int(re.search(r"(\d+) extents? found", out).group(1))


def write_file(path):
    chunk = os.urandom(MIB)
    with open(path, "wb") as f:
        for _ in range(FILE_MIB):
            f.write(chunk)
        os.fsync(f.fileno())


def overwrite(path, seed):
    rng = random.Random(seed)
    pieces = FILE_MIB * MIB // PIECE
    block = bytearray(os.urandom(PIECE))
    fd = os.open(path, os.O_WRONLY)
    try:
        t = time.monotonic()
        for n in range(WRITES):
            block[0:8] = n.to_bytes(8, "little")
            os.pwrite(fd, block, rng.randrange(pieces) * PIECE)
            os.fdatasync(fd)
        return WRITES / (time.monotonic() - t)
    finally:
        os.close(fd)



def round_on(fs, nocow, seed):
    fs.make()
    d = fs.path("db")
    os.mkdir(d)
    if nocow:
        subprocess.run(["chattr", "+C", d], check=True)
    f = os.path.join(d, "file")
    write_file(f)
    commit(fs)
    before = used(fs)
    r = {"overwrite IOPS": overwrite(f, seed)}
    commit(fs)
    r["read after MB/s"] = cold_read_mbs(f)
    r["extents after"] = extents(fs, f)
    r["space grew MiB"] = (used(fs) - before) / MIB
    fs.destroy()
    return r


def main():
    os.makedirs(W, exist_ok=True)
    size = max(4 * FILE_MIB * MIB, 2 << 30)
    systems = [(Canopy("canopy", W, size), False), (Canopy("canopy", W, size), True),
               (Btrfs("btrfs", W, size), False), (Btrfs("btrfs", W, size), True),
               (Xfs("xfs", W, size), False), (Ext4("ext4", W, size), False)]
    name = {id(s): s[0].name + (" +C" if s[1] else "") for s in systems}
    results = {name[id(s)]: [] for s in systems}
    for n in range(ROUNDS):
        for s in systems:
            r = round_on(s[0], s[1], n)
            results[name[id(s)]].append(r)
            print(f"round {n + 1} {name[id(s)]}: " +
                  ", ".join(f"{k} {v:.1f}" for k, v in r.items()), file=sys.stderr)
    keys = list(next(iter(results.values()))[0])
    med = {fs: {k: statistics.median(r[k] for r in rs) for k in keys}
           for fs, rs in results.items()}
    print(f"{FILE_MIB} MiB file, {WRITES} random 4 KiB overwrites with fdatasync, "
          f"{ROUNDS} rounds (medians)")
    print(f"{'':18}" + "".join(f"{k:>17}" for k in keys))
    for fs, m in med.items():
        print(f"{fs:18}" + "".join(f"{m[k]:17.1f}" for k in keys))
    for kind in ("", " +C"):
        c, b = med["canopy" + kind], med["btrfs" + kind]
        print(f"canopy{kind} vs btrfs{kind}: overwrites {c['overwrite IOPS'] / b['overwrite IOPS']:.2f}x, "
              f"read after {c['read after MB/s'] / b['read after MB/s']:.2f}x")


if __name__ == "__main__":
    main()
