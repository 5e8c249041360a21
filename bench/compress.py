#!/usr/bin/env python3
"""Compression beside kernel btrfs (a benchmark, not a test; issue 38).

For each corpus -- a copy of /usr/share, a PostgreSQL data directory after
`pgbench -i -s 20`, 1 GiB of random bytes -- and each filesystem -- Canopy
with compress=zstd, kernel btrfs with compress=zstd:3 (the same algorithm
and level), Canopy with compress=lz4 (btrfs has no lz4), Canopy without
compression (what compression costs: the random corpus shows the
heuristic at work) -- on a fresh 8 GiB
loop/image file, in one run, rounds interleaved:

  write:  cp -a CORPUS MNT/, then `canopy sync` / `sync -f` (MB/s of
          apparent bytes)
  ratio:  used bytes (statvfs, data and metadata) after the copy less
          before, divided by the corpus's apparent bytes (btrfs keeps two
          copies of metadata on one device, Canopy one)
  data:   data extents' bytes on disk over apparent bytes: `canopy
          filesystem du` less its inline bytes on Canopy, Data used of
          `btrfs filesystem df` on btrfs (inline data is in metadata on
          both)
  read:   unmount, mount again (cold caches), tar the copy to /dev/null
          (MB/s)

Prints medians and Canopy/btrfs ratios. Needs root, btrfs-progs and
PostgreSQL. Usage:
    python3 bench/compress.py [--rounds 3] [--corpus usr-share,pgbench,random]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CANOPY = os.path.join(ROOT, "target", "release", "canopy")
WORK = os.environ.get("WORK", "/var/tmp/canopy-compress")
MNT = os.path.join(WORK, "mnt")
IMG = os.path.join(WORK, "fs.img")
SIZE = 8 << 30


def sh(*cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def apparent_bytes(path):
    out = subprocess.run(["du", "-sb", "--apparent-size", path], check=True,
                         capture_output=True, text=True).stdout
    return int(out.split()[0])


def pg_corpus():
    """A PostgreSQL data directory after pgbench -i -s 20, made once."""
    data = os.path.join(WORK, "corpus", "pgdata")
    if os.path.isdir(data):
        return data
    bindir = sorted(p for p in os.listdir("/usr/lib/postgresql"))[-1]
    bindir = os.path.join("/usr/lib/postgresql", bindir, "bin")
    os.makedirs(os.path.dirname(data), exist_ok=True)
    sock = os.path.join(WORK, "corpus")
    shutil.chown(os.path.dirname(data), "postgres", "postgres")
    as_pg = ["runuser", "-u", "postgres", "--"]
    sh(*as_pg, f"{bindir}/initdb", "-D", data, stdout=subprocess.DEVNULL)
    sh(*as_pg, f"{bindir}/pg_ctl", "-D", data, "-o", f"-k {sock} -p 54329 -c listen_addresses=''",
       "-w", "start", stdout=subprocess.DEVNULL)
    try:
        sh(*as_pg, f"{bindir}/pgbench", "-h", sock, "-p", "54329", "-i", "-s", "20", "postgres",
           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finally:
        sh(*as_pg, f"{bindir}/pg_ctl", "-D", data, "-w", "stop", stdout=subprocess.DEVNULL)
    return data


def random_corpus():
    d = os.path.join(WORK, "corpus", "random")
    f = os.path.join(d, "random.bin")
    if not os.path.exists(f):
        os.makedirs(d, exist_ok=True)
        sh("dd", "if=/dev/urandom", f"of={f}", "bs=1M", "count=1024", "status=none")
    return d


CORPORA = {"usr-share": lambda: "/usr/share", "pgbench": pg_corpus, "random": random_corpus}


def used(path):
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def wait_mounted():
    for _ in range(200):
        if os.path.ismount(MNT):
            return
        time.sleep(0.05)
    raise RuntimeError("mount did not appear")


class Canopy:
    def __init__(self, codec):
        self.name = f"canopy-{codec}"
        self.codec = codec

    def make(self):
        sh(CANOPY, "mkfs", "--size", str(SIZE), IMG, stdout=subprocess.DEVNULL)

    def mount(self):
        sh(CANOPY, "mount", "-o", f"compress={self.codec}", IMG, MNT)
        wait_mounted()

    def sync(self):
        sh(CANOPY, "sync", MNT)

    def data_bytes(self):
        out = subprocess.run([CANOPY, "filesystem", "du", "--json", MNT], check=True,
                             capture_output=True, text=True).stdout
        report = json.loads(out)
        return report["total"]["disk"] - report.get("inline_disk", 0)

    def umount(self):
        sh("umount", MNT)
        for _ in range(200):
            if subprocess.run(["pgrep", "-f", IMG], capture_output=True).returncode != 0:
                return
            time.sleep(0.05)


class Btrfs:
    name = "btrfs-zstd"

    def make(self):
        with open(IMG, "wb") as f:
            f.truncate(SIZE)
        sh("mkfs.btrfs", "-q", "-f", IMG, stdout=subprocess.DEVNULL)

    def mount(self):
        sh("mount", "-o", "loop,compress=zstd:3", IMG, MNT)

    def sync(self):
        sh("sync", "-f", MNT)

    def data_bytes(self):
        out = subprocess.run(["btrfs", "filesystem", "df", "-b", MNT], check=True,
                             capture_output=True, text=True).stdout
        line = next(x for x in out.splitlines() if x.startswith("Data"))
        return int(line.rsplit("used=", 1)[1].split()[0])

    def umount(self):
        sh("umount", MNT)


def one_round(fs, src, nbytes):
    if os.path.exists(IMG):
        os.remove(IMG)
    fs.make()
    fs.mount()
    try:
        before = used(MNT)
        t0 = time.monotonic()
        sh("cp", "-a", src, os.path.join(MNT, "copy"))
        fs.sync()
        write_s = time.monotonic() - t0
        ratio = (used(MNT) - before) / nbytes
        data = fs.data_bytes() / nbytes
    finally:
        fs.umount()
    sh("sh", "-c", "echo 3 > /proc/sys/vm/drop_caches")
    fs.mount()
    try:
        t0 = time.monotonic()
        sh("sh", "-c", f"tar cf - -C {MNT} copy | cat > /dev/null")
        read_s = time.monotonic() - t0
    finally:
        fs.umount()
        os.remove(IMG)
    return nbytes / write_s / 1e6, ratio, nbytes / read_s / 1e6, data


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--corpus", default=",".join(CORPORA))
    a = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (loop mounts)")
    sh("cargo", "build", "--release", "--locked", cwd=ROOT)
    os.makedirs(MNT, exist_ok=True)
    systems = [Canopy("zstd"), Btrfs(), Canopy("lz4"), Canopy("no")]
    results = {}
    for corpus in a.corpus.split(","):
        src = CORPORA[corpus]()
        nbytes = apparent_bytes(src)
        print(f"== {corpus}: {nbytes / 1e6:.0f} MB", flush=True)
        for r in range(a.rounds):
            for fs in systems:
                w, ratio, rd, data = one_round(fs, src, nbytes)
                results.setdefault((corpus, fs.name), []).append((w, ratio, rd, data))
                print(f"  round {r + 1} {fs.name:12} write {w:7.1f} MB/s  ratio {ratio:.3f}  "
                      f"data {data:.3f}  cold read {rd:7.1f} MB/s", flush=True)
    print("\nmedians (write MB/s, on-disk ratio, cold read MB/s, data ratio); "
          "canopy-zstd / btrfs-zstd, canopy-zstd / canopy-no")
    print(f"{'corpus':10} {'fs':12} {'write':>8} {'ratio':>7} {'read':>8} {'data':>7}")
    for corpus in a.corpus.split(","):
        med = {}
        for fs in systems:
            rows = results[(corpus, fs.name)]
            med[fs.name] = tuple(statistics.median(x[i] for x in rows) for i in range(4))
            w, ratio, rd, data = med[fs.name]
            print(f"{corpus:10} {fs.name:12} {w:8.1f} {ratio:7.3f} {rd:8.1f} {data:7.3f}")
        c, b, n = med["canopy-zstd"], med["btrfs-zstd"], med["canopy-no"]
        print(f"{corpus:10} {'vs btrfs':12} {c[0] / b[0]:7.2f}x {c[1] / b[1]:6.2f}x "
              f"{c[2] / b[2]:7.2f}x {c[3] / b[3]:6.2f}x")
        print(f"{corpus:10} {'vs no comp.':12} {c[0] / n[0]:7.2f}x {c[1] / n[1]:6.2f}x "
              f"{c[2] / n[2]:7.2f}x {c[3] / n[3]:6.2f}x")


if __name__ == "__main__":
    main()
