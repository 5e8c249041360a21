#!/usr/bin/env python3
"""Defragmentation, a benchmark (not a test): `canopy filesystem
defragment` on Canopy against `btrfs filesystem defragment` on kernel
btrfs, over the same fragmented file, in one run.

Per round, on a fresh filesystem of each kind (image files on the same
disk, btrfs over a loop device): a file of FILE_MIB written in 4 KiB
pieces in a scattered order with an fsync after every 64 (each piece its
own extent, as a database's file or a VM image gets), and a clean file of
the same size written sequentially; both committed. Then, with the page
cache dropped before each read: a sequential read of the clean file, of
the fragmented one, the defragment of the fragmented one (timed until its
commit), and its read again. A snapshot of the filesystem taken before
the defragment shows what each keeps shared: on btrfs the defragment
unshares the file from the snapshot (its space doubles), on Canopy it
does not; the space used after the commit is noted.

Prints the medians of ROUNDS: read MB/s (clean, fragmented, after),
defragment seconds and MB/s, space used before and after (MiB), and
Canopy's defragment speed over btrfs's and its read after over its clean
read. Needs root and btrfs-progs.

Usage: python3 bench/defrag.py [FILE_MIB] [ROUNDS]   (default 1024 3)
"""
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib.fs import Btrfs, Canopy, commit_any as commit, drop_caches, sh  # noqa: E402
from benchlib.fs import snapshot_root  # noqa: E402
from benchlib.fs import cold_read_mbs, used_bytes as used  # noqa: E402

FILE_MIB = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
W = os.environ.get("WORK", "/var/tmp/canopy-defrag")
MIB = 1 << 20
PIECE = 4096
FSYNC_EVERY = 64




def write_fragmented(path, seed):
    pieces = FILE_MIB * MIB // PIECE
    order = list(range(pieces))
    random.Random(seed).shuffle(order)
    block = bytearray(os.urandom(PIECE))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, pieces * PIECE)
        for n, p in enumerate(order):
            block[0:8] = p.to_bytes(8, "little")
            os.pwrite(fd, block, p * PIECE)
            if n % FSYNC_EVERY == FSYNC_EVERY - 1:
                os.fdatasync(fd)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_clean(path):
    chunk = os.urandom(MIB)
    with open(path, "wb") as f:
        for _ in range(FILE_MIB):
            f.write(chunk)



def defragment(fs, path):
    if isinstance(fs, Canopy):
        sh(f"'{fs.binary}' filesystem defragment -q '{path}'")
    else:
        sh(f"btrfs filesystem defragment -t 32M '{path}'")
    commit(fs)


def round_on(fs, seed):
    fs.make()
    frag, clean = fs.path("fragmented"), fs.path("clean")
    write_fragmented(frag, seed)
    write_clean(clean)
    commit(fs)
    r = {"clean": cold_read_mbs(clean), "fragmented": cold_read_mbs(frag)}
    snapshot_root(fs)
    commit(fs)
    r["used before"] = used(fs) / MIB
    drop_caches()
    t = time.monotonic()
    defragment(fs, frag)
    r["defragment s"] = time.monotonic() - t
    r["defragment MB/s"] = FILE_MIB / r["defragment s"]
    r["used after"] = used(fs) / MIB
    r["after"] = cold_read_mbs(frag)
    fs.destroy()
    return r


def main():
    os.makedirs(W, exist_ok=True)
    size = max(6 * FILE_MIB * MIB, 2 << 30)
    systems = [Canopy("canopy", W, size), Btrfs("btrfs", W, size)]
    results = {fs.name: [] for fs in systems}
    for n in range(ROUNDS):
        for fs in systems:
            r = round_on(fs, n)
            results[fs.name].append(r)
            print(f"round {n + 1} {fs.name}: " +
                  ", ".join(f"{k} {v:.1f}" for k, v in r.items()), file=sys.stderr)
    keys = list(results["canopy"][0])
    med = {fs: {k: statistics.median(r[k] for r in rs) for k in keys}
           for fs, rs in results.items()}
    print(f"file {FILE_MIB} MiB in {PIECE} B pieces, {ROUNDS} rounds (medians)")
    print(f"{'':24}" + "".join(f"{fs:>10}" for fs in med))
    for k in keys:
        print(f"{k:24}" + "".join(f"{med[fs][k]:10.1f}" for fs in med))
    c, b = med["canopy"], med["btrfs"]
    print(f"canopy defragment speed vs btrfs: {b['defragment s'] / c['defragment s']:.2f}x")
    for fs in med:
        m = med[fs]
        print(f"{fs}: read after defragment / clean read: {m['after'] / m['clean']:.2f}; "
              f"space grew by {m['used after'] - m['used before']:.0f} MiB")


if __name__ == "__main__":
    main()
