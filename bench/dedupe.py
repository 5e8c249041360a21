#!/usr/bin/env python3
"""Deduplication, a benchmark (not a test): `canopy dedupe -r` on Canopy
against `duperemove -dr` on kernel btrfs, over the same corpus, in one run.

The corpus (CORPUS_MIB in all, written with plain writes so that nothing
is shared to begin with): a quarter unique files, a quarter exact copies
of them, a quarter files that repeat half of one of them at a 128 KiB
boundary after a unique start, and a quarter unique again; 16 MiB files.
Per round, on a fresh filesystem of each kind (image files on the same
disk, btrfs over a loop device): write the corpus, commit (sync), note
the space used, run the dedupe, commit, note the space used again. Prints
the medians of ROUNDS: seconds of the dedupe command, MiB it gave back,
and Canopy's speed and savings over btrfs's. duperemove runs with its
defaults (128 KiB blocks, hashes in memory).
Needs root, btrfs-progs and duperemove.

Usage: python3 bench/dedupe.py [CORPUS_MIB] [ROUNDS]   (default 2048 3)
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib.fs import Btrfs, Canopy, commit_any as commit, drop_caches, sh  # noqa: E402
from benchlib.fs import used_bytes as used  # noqa: E402

CORPUS = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
W = os.environ.get("WORK", "/var/tmp/canopy-dedupe")
FILE = 16  # MiB per file
MIB = 1 << 20


def corpus(seed):
    """(name, bytes) of the corpus: the same for the same seed."""
    import random
    rng = random.Random(seed)
    n = max(4, CORPUS // FILE // 4)
    unique = [rng.randbytes(FILE * MIB) for _ in range(n)]
    for i, data in enumerate(unique):
        yield f"u{i}", data
        yield f"copy{i}", data
        half = data[:FILE * MIB // 2]
        yield f"half{i}", rng.randbytes(FILE * MIB // 2) + half
        yield f"other{i}", rng.randbytes(FILE * MIB)




def dedupe(fs, d):
    if isinstance(fs, Canopy):
        sh(f"'{fs.binary}' dedupe -r '{d}' >/dev/null")
    else:
        sh(f"duperemove -dr -q '{d}' >/dev/null")


def round_on(fs, seed):
    fs.make()
    d = fs.path("corpus")
    os.makedirs(d)
    for name, data in corpus(seed):
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    commit(fs)
    drop_caches()
    before = used(fs)
    t = time.monotonic()
    dedupe(fs, d)
    secs = time.monotonic() - t
    commit(fs)
    freed = (before - used(fs)) / MIB
    fs.destroy()
    return secs, freed


def main():
    os.makedirs(W, exist_ok=True)
    size = max(4 * CORPUS * MIB, 2 << 30)
    systems = [Canopy("canopy", W, size), Btrfs("btrfs", W, size)]
    results = {fs.name: [] for fs in systems}
    for r in range(ROUNDS):
        for fs in systems:
            secs, freed = round_on(fs, r)
            results[fs.name].append((secs, freed))
            print(f"round {r + 1} {fs.name}: {secs:.2f} s, {freed:.0f} MiB freed", file=sys.stderr)
    med = {k: (statistics.median(s for s, _ in v), statistics.median(f for _, f in v))
           for k, v in results.items()}
    print(f"corpus {CORPUS} MiB, {ROUNDS} rounds (medians)")
    print(f"{'':8} {'seconds':>8} {'MiB freed':>10}")
    for k, (s, f) in med.items():
        print(f"{k:8} {s:8.2f} {f:10.0f}")
    (cs, cf), (bs, bf) = med["canopy"], med["btrfs"]
    print(f"canopy speed vs duperemove on btrfs: {bs / cs:.2f}x; savings {cf / bf:.2f}x")


if __name__ == "__main__":
    main()
