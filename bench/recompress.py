#!/usr/bin/env python3
"""Recompression, a benchmark (not a test): `canopy filesystem defragment
-r -czstd` on Canopy against `btrfs filesystem defragment -r -czstd` on
kernel btrfs, over the same uncompressed data, in one run.

Per round, on a fresh filesystem of each kind (image files on the same
disk, btrfs over a loop device) mounted without compression: a copy of
/usr/share/doc (many small and mid-sized files, the everyday case) and
one FILE_MIB text file (a log, the large case), committed, then a
snapshot of the filesystem (a backup, as users keep them). Then, with the
page cache dropped: each tree recompressed, timed until its commit. The
space used (statfs) before and after shows what each keeps shared: btrfs
rewrites the data as new writes, so the snapshot keeps the old extents
and the live files get new ones (space grows); Canopy's snapshot follows
the live files to the compressed extents (space falls).

Prints the medians of ROUNDS: seconds and MB/s of each recompression,
space used before and after (MiB); then Canopy's speed over btrfs's.
Needs root and btrfs-progs.

Usage: python3 bench/recompress.py [FILE_MIB] [ROUNDS]   (default 512 3)
"""
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib.fs import Btrfs, Canopy, commit_any as commit, drop_caches, sh  # noqa: E402
from benchlib.fs import snapshot_root  # noqa: E402
from benchlib.fs import used_bytes as used  # noqa: E402

FILE_MIB = int(sys.argv[1]) if len(sys.argv) > 1 else 512
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
W = os.environ.get("WORK", "/var/tmp/canopy-recompress")
TREE = "/usr/share/doc"
MIB = 1 << 20


def write_log(path, seed):
    """FILE_MIB of log lines: compresses about 4:1 with zstd."""
    rng = random.Random(seed)
    words = [f"{w}{rng.randrange(1000)}" for w in
             ("request", "reply", "worker", "commit", "flush", "extent", "inode")]
    with open(path, "w") as f:
        written = 0
        n = 0
        while written < FILE_MIB * MIB:
            line = (f"2026-11-29T12:{n % 60:02}:{n % 59:02}.{n % 997:03} "
                    f"{rng.choice(words)} {rng.randrange(1 << 20)} "
                    f"{rng.choice(words)} took {rng.randrange(5000)} us\n")
            f.write(line)
            written += len(line)
            n += 1


def recompress(fs, path):
    if isinstance(fs, Canopy):
        sh(f"'{fs.binary}' filesystem defragment -q -r -czstd '{path}' >/dev/null")
    else:
        sh(f"btrfs filesystem defragment -r -czstd '{path}'")
    commit(fs)


def timed(fs, path, mib, r, what):
    drop_caches()
    t = time.monotonic()
    recompress(fs, path)
    r[f"{what} s"] = time.monotonic() - t
    r[f"{what} MB/s"] = mib / r[f"{what} s"]


def round_on(fs, seed, tree_mib):
    fs.make()
    sh(f"cp -a '{TREE}' '{fs.path('doc')}'")
    write_log(fs.path("log"), seed)
    commit(fs)
    snapshot_root(fs)
    commit(fs)
    r = {"used before": used(fs) / MIB}
    timed(fs, fs.path("doc"), tree_mib, r, "tree")
    timed(fs, fs.path("log"), FILE_MIB, r, "file")
    r["used after"] = used(fs) / MIB
    fs.destroy()
    return r


def main():
    os.makedirs(W, exist_ok=True)
    tree_mib = int(sh(f"du -sm '{TREE}'", capture_output=True, text=True)
                   .stdout.split()[0])
    size = max(4 * (FILE_MIB + tree_mib) * MIB, 2 << 30)
    systems = [Canopy("canopy", W, size), Btrfs("btrfs", W, size)]
    results = {fs.name: [] for fs in systems}
    for n in range(ROUNDS):
        for fs in systems:
            r = round_on(fs, n, tree_mib)
            results[fs.name].append(r)
            print(f"round {n + 1} {fs.name}: " +
                  ", ".join(f"{k} {v:.1f}" for k, v in r.items()), file=sys.stderr)
    keys = list(results["canopy"][0])
    med = {fs: {k: statistics.median(r[k] for r in rs) for k in keys}
           for fs, rs in results.items()}
    print(f"{TREE} ({tree_mib} MiB) and a {FILE_MIB} MiB log, snapshot kept, "
          f"{ROUNDS} rounds (medians)")
    print(f"{'':16}" + "".join(f"{fs:>10}" for fs in med))
    for k in keys:
        print(f"{k:16}" + "".join(f"{med[fs][k]:10.1f}" for fs in med))
    c, b = med["canopy"], med["btrfs"]
    for what in ("tree", "file"):
        print(f"canopy {what} recompression speed vs btrfs: "
              f"{b[what + ' s'] / c[what + ' s']:.2f}x")
    for fs in med:
        m = med[fs]
        print(f"{fs}: space {m['used before']:.0f} -> {m['used after']:.0f} MiB")


if __name__ == "__main__":
    main()
