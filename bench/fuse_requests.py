#!/usr/bin/env python3
"""FUSE requests per operation on a Canopy mount, counted with the
kernel's `fuse:fuse_request_send` tracepoint (needs root and tracefs).

    python3 bench/fuse_requests.py [--canopy BIN] [-o MOUNT_OPTS] [-n N]

Each operation runs N times on fresh names after a warm-up; the table
gives requests per operation by opcode. Run it before and after a change
to the session layer (docs/benchmarks.md keeps the figures).
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import time

TRACING = "/sys/kernel/tracing"
EVENT = f"{TRACING}/events/fuse/fuse_request_send"
LINE = re.compile(r"connection (\d+) req \d+ opcode \d+ \((\w+)\)")


def tracing_on(on):
    with open(f"{EVENT}/enable", "w") as f:
        f.write("1" if on else "0")


def drain():
    """Clears the trace buffer."""
    with open(f"{TRACING}/trace", "w") as f:
        f.write("")


def counted(conn):
    """Opcode counts for connection `conn` in the buffer."""
    counts = collections.Counter()
    with open(f"{TRACING}/trace") as f:
        for line in f:
            m = LINE.search(line)
            if m and int(m.group(1)) == conn:
                counts[m.group(2).removeprefix("FUSE_")] += 1
    return counts


def operations(mnt, n):
    """(name, setup, action) per operation; action(i) acts on item i."""
    d = lambda name: os.path.join(mnt, name)

    def mkfiles(prefix):
        os.makedirs(d(prefix), exist_ok=True)
        for i in range(n):
            with open(d(f"{prefix}/{i}"), "w") as f:
                f.write("x")

    def statx_forced(path):
        # os.stat goes through the kernel's cached attributes; a forced
        # statx is what `stat` on a network filesystem does.
        subprocess.run(["stat", "--cached=never", path], stdout=subprocess.DEVNULL, check=True)

    def create(i):
        fd = os.open(d(f"c/{i}"), os.O_CREAT | os.O_WRONLY, 0o644)
        os.close(fd)

    def write_close(i):
        with open(d(f"w/{i}"), "wb") as f:
            f.write(b"y" * 4096)

    def read_close(i):
        with open(d(f"r/{i}"), "rb") as f:
            f.read()

    return [
        ("create+close", lambda: os.makedirs(d("c"), exist_ok=True), create),
        ("open+write 4K+close", lambda: os.makedirs(d("w"), exist_ok=True), write_close),
        ("open+read+close (cached)", lambda: (mkfiles("r"), [read_close(i) for i in range(n)]), read_close),
        ("stat (cached)", lambda: mkfiles("s"), lambda i: os.stat(d(f"s/{i}"))),
        ("rename", lambda: mkfiles("m"), lambda i: os.rename(d(f"m/{i}"), d(f"m/{i}.new"))),
        ("unlink", lambda: mkfiles("u"), lambda i: os.unlink(d(f"u/{i}"))),
        ("mkdir", lambda: os.makedirs(d("k"), exist_ok=True), lambda i: os.mkdir(d(f"k/{i}"))),
        ("readlink", lambda: (os.makedirs(d("l"), exist_ok=True),
                              [os.symlink("target", d(f"l/{i}")) for i in range(n)],
                              [os.readlink(d(f"l/{i}")) for i in range(n)]),
         lambda i: os.readlink(d(f"l/{i}"))),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--canopy", default="target/release/canopy")
    ap.add_argument("-o", "--options", default="")
    ap.add_argument("-n", type=int, default=200)
    a = ap.parse_args()
    if not os.path.exists(EVENT):
        sys.exit(f"no {EVENT}: needs root and tracefs")
    work = tempfile.mkdtemp(prefix="canopy-req-")
    img, mnt = os.path.join(work, "fs.img"), os.path.join(work, "mnt")
    os.mkdir(mnt)
    subprocess.run([a.canopy, "mkfs", "-q", "-s", "1G", img], check=True)
    opts = ["-o", a.options] if a.options else []
    daemon = subprocess.Popen([a.canopy, "mount", "-f", "--notify-ready", *opts, img, mnt],
                              stdout=subprocess.PIPE)
    try:
        assert daemon.stdout.readline().strip() == b"canopy-ready"
        conn = os.minor(os.stat(mnt).st_dev)
        print(f"{'operation':<28} {'requests/op':>11}  by opcode")
        for name, setup, action in operations(mnt, a.n):
            setup()
            tracing_on(True)
            drain()
            for i in range(a.n):
                action(i)
            time.sleep(0.2)
            counts = counted(conn)
            tracing_on(False)
            total = sum(counts.values()) / a.n
            detail = ", ".join(f"{k} {v / a.n:.2f}" for k, v in counts.most_common())
            print(f"{name:<28} {total:>11.2f}  {detail}")
    finally:
        tracing_on(False)
        subprocess.run(["umount", mnt])
        daemon.wait()
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
