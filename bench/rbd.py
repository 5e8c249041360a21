#!/usr/bin/env python3
"""Canopy on an RBD image against the cluster itself (issue 42): what the
backend adds to what the cluster can do. A benchmark, never a test; root.

    python3 bench/rbd.py                  # starts its own cluster (scripts/ceph-dev.sh)
    python3 bench/rbd.py --conf C --rounds 5

For each round, on fresh images:
  * sequential 1 GiB: `rbd bench` write and read (4 MiB I/O, its default 16
    threads) against Canopy on RBD: `dd` of 1 GiB of random bytes with
    conv=fsync, then a cold `dd` read after a remount and drop_caches;
    the same dd runs through libfuse's passthrough_hp (--nosplice) over
    tmpfs, FUSE with no storage behind it; each run's CPU per GiB by
    process (the OSDs, the client, dd) and the machine's busy time, and
    from them the most a client costing what FUSE alone costs could reach
    on these cores;
  * 4 KiB random writes with a flush per write: fio's rbd engine (one
    client, iodepth 4, fsync=1) against fio on the Canopy mount (4 jobs,
    psync, fsync=1, the files laid out and committed first), each with
    the OSD write operations it caused per write; `rbd bench` 4 KiB
    random writes (no flush) for scale;
  * failover: Canopy mounted as one client, SIGSTOPped, then a second
    client's `canopy mount --break-lock` until its first fsynced write;
  * giving space back (issue 57): a 10 GiB image, 8 GiB written, deleted
    and committed; `canopy filesystem trim` under `-o nodiscard`, timed,
    and with `discard=async` (the default) the time from the commit until
    `rbd du` is within 5% of what the filesystem uses, or of what the trim
    left (objects holding live tree blocks stay), and 16 MiB.

Writes bench/results/<date>-rbd.md with the medians and ratios.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib import cpu  # noqa: E402
from benchlib import fs as fslib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1 << 30
# The most a round keeps in the pool at once (the give-back step's 8 GiB
# written on a 10 GiB image), with a margin.
NEEDED_ROOM = 10 * GIB


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


class Bench:
    def __init__(self, conf, canopy, work, passthrough=None):
        self.conf, self.canopy, self.work = conf, canopy, work
        self.passthrough = passthrough
        self.n = 0
        self.mnt = os.path.join(work, "mnt")
        os.makedirs(self.mnt, exist_ok=True)
        self.data = os.path.join(work, "rand1g")
        if not os.path.exists(self.data):
            with open(self.data, "wb") as f:
                for _ in range(1024):
                    f.write(os.urandom(1 << 20))

    def check_room(self):
        """Stops before the first round when the pool cannot hold the
        give-back step's 8 GiB: a full cluster holds every write without a
        word (librbd waits for room), which looks like a hung benchmark.
        Images left by an aborted run are the usual cause, so it names them."""
        df = json.loads(run(["ceph", "-c", self.conf, "df", "-f", "json"]))
        pool = next((p for p in df.get("pools", []) if p.get("name") == "rbd"), None)
        avail = pool["stats"]["max_avail"] if pool else 0
        if avail >= NEEDED_ROOM:
            return
        images = run(["rbd", "-c", self.conf, "ls", "rbd"]).split()
        sys.exit(f"rbd.py: pool rbd has {avail / GIB:.1f} GiB free, a round needs "
                 f"{NEEDED_ROOM / GIB:.0f} GiB; images in it: {' '.join(images) or 'none'} "
                 f"(`rbd -c {self.conf} rm rbd/NAME` removes one)")

    def image(self, size="4G", mkfs=True):
        self.n += 1
        name = f"bench-{os.getpid()}-{self.n}"
        spec = f"rbd:rbd/{name}?conf={self.conf}"
        if mkfs:
            run([self.canopy, "mkfs", "-q", "--size", size, spec])
        else:
            run(["rbd", "-c", self.conf, "create", f"rbd/{name}", "--size", size])
        return name, spec

    def remove(self, name):
        """The cluster's space is this machine's disk: images go after use."""
        subprocess.run(["rbd", "-c", self.conf, "rm", "--no-progress", f"rbd/{name}"],
                       capture_output=True, timeout=120)

    def rbd_bench(self, name, io_type, size, pattern="seq", total="1G"):
        out = run(["rbd", "-c", self.conf, "bench", "--io-type", io_type, "--io-size", size,
                   "--io-pattern", pattern, "--io-total", total, f"rbd/{name}"])
        last = [l for l in out.splitlines() if l.startswith("elapsed")][-1]
        ops = float(re.search(r"ops/sec: ([\d.]+)", last).group(1))
        return ops

    def mount(self, spec, opts=None):
        cmd = [self.canopy, "mount"] + (["-o", opts] if opts else []) + [spec, self.mnt]
        run(cmd)

    def umount(self):
        subprocess.run(["umount", self.mnt], check=True)
        time.sleep(1)

    def dd_mbs(self, args):
        out = subprocess.run(["dd"] + args, check=True, capture_output=True, text=True).stderr
        secs = float(re.search(r"copied, ([\d.]+) s", out).group(1))
        return GIB / secs / (1 << 20)

    def metered(self, fn):
        """`fn()` and the CPU it cost (benchlib.cpu.Meter)."""
        m = cpu.Meter().start()
        value = fn()
        return value, m.stop()

    def sequential(self):
        name, _ = self.image(mkfs=False)
        w, w_cpu = self.metered(lambda: self.rbd_bench(name, "write", "4M") * 4)
        r, r_cpu = self.metered(lambda: self.rbd_bench(name, "read", "4M") * 4)
        self.remove(name)
        name, spec = self.image()
        canopy = self.write_then_cold_read("canopy", lambda: self.mount(spec),
                                           os.path.basename(self.canopy))
        self.remove(name)
        return {"rbd_write": w, "rbd_read": r, **canopy,
                **cpu_fields("rbd_write", w_cpu, None), **cpu_fields("rbd_read", r_cpu, None)}

    def write_then_cold_read(self, case, mount, daemon):
        """dd of 1 GiB onto what `mount` mounts (conv=fsync), then a cold
        dd read of it after a remount and drop_caches; each with its CPU
        (`daemon`: the serving process's command name)."""
        mount()
        w, w_cpu = self.metered(lambda: self.dd_mbs(
            [f"if={self.data}", f"of={self.mnt}/seq", "bs=4M", "conv=fsync"]))
        self.umount()
        drop_caches()
        mount()
        r, r_cpu = self.metered(lambda: self.dd_mbs(
            [f"if={self.mnt}/seq", "of=/dev/null", "bs=4M"]))
        self.umount()
        return {f"{case}_write": w, f"{case}_read": r,
                **cpu_fields(f"{case}_write", w_cpu, daemon),
                **cpu_fields(f"{case}_read", r_cpu, daemon)}

    def fuse_ceiling(self):
        """The same dd write and cold read through libfuse's passthrough_hp
        over tmpfs: FUSE with no storage behind it. `--nosplice`, because
        a daemon that checksums (or hands bytes to librbd) needs them in
        its memory, as Canopy does."""
        if not self.passthrough:
            return {}
        src = tempfile.mkdtemp(prefix="canopy-rbd-bench-", dir="/dev/shm")
        try:
            return self.write_then_cold_read("fuse", lambda: self.mount_passthrough(src),
                                             "passthrough_hp")
        finally:
            if os.path.ismount(self.mnt):
                subprocess.run(["umount", "-l", self.mnt])
            subprocess.run(["rm", "-rf", src])

    def mount_passthrough(self, src):
        run([self.passthrough, "--nosplice", src, self.mnt])
        for _ in range(200):
            if os.path.ismount(self.mnt):
                return
            time.sleep(0.05)
        raise RuntimeError("passthrough_hp did not mount in 10 s")

    FIO_FSYNC = ["--name=r", "--rw=randwrite", "--bs=4k", "--fsync=1"]

    def osd_write_ops(self):
        """Client write operations the OSDs have done so far, summed."""
        total = 0
        for osd in run(["ceph", "-c", self.conf, "osd", "ls"]).split():
            d = json.loads(run(["ceph", "-c", self.conf, "tell", f"osd.{osd}", "perf", "dump"]))
            total += d["osd"]["op_w"] + d["osd"]["op_rw"]
        return total

    def fio_iops(self, args):
        """fio's IOPS, and the OSD write operations per write it made."""
        before = self.osd_write_ops()
        out = run(["fio", "--output-format=json", "--group_reporting", *self.FIO_FSYNC,
                   "--runtime=20", "--time_based"] + args,
                  env={**os.environ, "CEPH_CONF": self.conf})
        ops = self.osd_write_ops() - before
        w = json.loads(out)["jobs"][0]["write"]
        return w["iops"], ops / max(w["total_ios"], 1)

    def random_fsync(self):
        name, _ = self.image(size="2G", mkfs=False)
        base, base_ops = self.fio_iops(["--ioengine=rbd", "--clientname=admin", "--pool=rbd",
                                        f"--rbdname={name}", "--iodepth=4", "--size=1G"])
        bench = self.rbd_bench(name, "write", "4K", "rand", "64M")
        self.remove(name)
        name, spec = self.image()
        self.mount(spec)
        jobs = ["--ioengine=psync", "--numjobs=4", "--size=256M", f"--directory={self.mnt}"]
        # The files laid out and committed first, so the operations counted
        # are the fsyncs' alone (fio's rbd engine lays nothing out).
        run(["fio", *self.FIO_FSYNC, "--create_only=1"] + jobs)
        run([self.canopy, "sync", self.mnt])
        canopy, canopy_ops = self.fio_iops(jobs)
        self.umount()
        self.remove(name)
        return {"fio_rbd_fsync_iops": base, "rbd_bench_4k_iops": bench,
                "canopy_fsync_iops": canopy, "fio_rbd_osd_ops_per_write": base_ops,
                "canopy_osd_ops_per_write": canopy_ops}

    def failover(self):
        name, spec = self.image(size="1G")
        a = subprocess.Popen([self.canopy, "mount", "-f", spec, self.mnt],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(600):
            if os.path.ismount(self.mnt):
                break
            time.sleep(0.05)
        with open(os.path.join(self.mnt, "a"), "w") as f:
            f.write("a")
            os.fsync(f.fileno())
        a.send_signal(signal.SIGSTOP)
        mnt_b = os.path.join(self.work, "mnt-b")
        os.makedirs(mnt_b, exist_ok=True)
        t = time.monotonic()
        run([self.canopy, "mount", "--break-lock", spec, mnt_b])
        with open(os.path.join(mnt_b, "b"), "w") as f:
            f.write("b")
            os.fsync(f.fileno())
        secs = time.monotonic() - t
        a.send_signal(signal.SIGCONT)
        subprocess.run(["umount", "-l", self.mnt])
        a.kill()
        a.wait()
        subprocess.run(["umount", mnt_b], check=True)
        time.sleep(1)
        self.remove(name)
        return {"failover_s": secs}


    def rbd_used(self, name):
        out = run(["rbd", "-c", self.conf, "du", "--format", "json", f"rbd/{name}"])
        return json.loads(out)["images"][0]["used_size"]

    def fs_used(self):
        st = os.statvfs(self.mnt)
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def write_and_delete(self, gib):
        for i in range(gib):
            subprocess.run(["dd", f"if={self.data}", f"of={self.mnt}/f{i}", "bs=4M",
                            "status=none"], check=True)
        run([self.canopy, "sync", self.mnt])
        stored = self.rbd_used(self.name_mounted)
        for i in range(gib):
            os.remove(os.path.join(self.mnt, f"f{i}"))
        run([self.canopy, "sync", self.mnt])
        return stored

    def give_back(self):
        name, spec = self.image(size="10G")
        self.name_mounted = name
        self.mount(spec, "nodiscard")
        stored = self.write_and_delete(8)
        t = time.monotonic()
        run([self.canopy, "filesystem", "trim", self.mnt])
        trim = time.monotonic() - t
        after_trim = self.rbd_used(name)
        self.umount()
        self.mount(spec)
        self.write_and_delete(8)
        # What a trim leaves is the floor: objects that hold a live tree
        # block or a superblock stay whole.
        t = time.monotonic()
        while True:
            near = max(self.fs_used() * 21 // 20, after_trim) + (16 << 20)
            if self.rbd_used(name) <= near:
                break
            if time.monotonic() - t > 300:
                raise RuntimeError("discard=async left the space for 300 s")
            time.sleep(0.25)
        discarded = time.monotonic() - t
        self.umount()
        self.remove(name)
        return {"stored_8g_mib": stored / (1 << 20), "trim_s": trim,
                "after_trim_mib": after_trim / (1 << 20), "async_discard_s": discarded}


def drop_caches():
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def cpu_fields(case, usage, daemon):
    """The CPU seconds of one 1 GiB run (so per GiB): the OSDs, the client
    (`daemon`'s process, or else the child this script ran: `rbd bench`),
    dd (the child, when a daemon is the client) and every core's busy
    time."""
    client = cpu.named(usage, daemon) if daemon else usage["children_s"]
    return {f"{case}_osd_s": cpu.named(usage, "ceph-osd"), f"{case}_client_s": client,
            f"{case}_dd_s": usage["children_s"] if daemon else 0.0,
            f"{case}_busy_s": usage["busy_s"], f"{case}_idle": usage["idle"]}


def median(rows, key):
    return statistics.median(r[key] for r in rows)


def write_report(rows, path):
    m = {k: median(rows, k) for k in rows[0]}
    lines = [
        f"# Canopy on RBD against the cluster ({datetime.date.today()})", "",
        f"{len(rows)} rounds, medians. One-node cluster from scripts/ceph-dev.sh "
        "(3 OSDs, pool size 2) on this 2-core machine.", "",
        "| workload | cluster alone | Canopy on RBD | ratio | aim |", "|---|---|---|---|---|",
        f"| 1 GiB sequential write, MiB/s | {m['rbd_write']:.0f} (rbd bench 4M) | "
        f"{m['canopy_write']:.0f} | {m['canopy_write'] / m['rbd_write']:.2f}x | 0.8x |",
        f"| 1 GiB cold sequential read, MiB/s | {m['rbd_read']:.0f} (rbd bench 4M) | "
        f"{m['canopy_read']:.0f} | {m['canopy_read'] / m['rbd_read']:.2f}x | 0.8x |",
        f"| 4 KiB random writes, fsync each, IOPS | {m['fio_rbd_fsync_iops']:.0f} "
        f"(fio rbd engine, iodepth 4) | {m['canopy_fsync_iops']:.0f} (fio, 4 jobs) | "
        f"{m['canopy_fsync_iops'] / m['fio_rbd_fsync_iops']:.2f}x | 0.7x |",
        f"| failover: takeover to first fsynced write, s | | {m['failover_s']:.2f} | | < 10 s |",
        f"| trim of a 10 GiB image after deleting 8 GiB, s | | {m['trim_s']:.2f} | | < 10 s |",
        f"| discard=async: commit to `rbd du` near use, s | | {m['async_discard_s']:.2f} | | |",
        "", f"`rbd bench` 4 KiB random writes without a flush: {m['rbd_bench_4k_iops']:.0f} IOPS.",
        "OSD write operations per 4 KiB write with fsync (op_w + op_rw of every OSD over the "
        f"timed run): fio's rbd engine {m['fio_rbd_osd_ops_per_write']:.2f}, Canopy "
        f"{m['canopy_osd_ops_per_write']:.2f} (a small write's bytes travel in the log write, "
        "and concurrent fsyncs share one; docs/benchmarks.md, issue 57).",
        f"`rbd du` with 8 GiB written: {m['stored_8g_mib']:.0f} MiB; after deleting it and "
        f"trimming: {m['after_trim_mib']:.0f} MiB.",
        "", *cpu_report(m), "Rounds:", "", "```", *[json.dumps(r) for r in rows], "```", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


def cpu_report(m):
    """Where the sequential runs' CPU went, per GiB, and how fast a client
    costing what FUSE alone costs could go when the cores are the bound."""
    cases = [("rbd_write", "rbd bench write"), ("canopy_write", "Canopy write"),
             ("fuse_write", "passthrough_hp --nosplice on tmpfs, write"),
             ("rbd_read", "rbd bench read"), ("canopy_read", "Canopy cold read"),
             ("fuse_read", "passthrough_hp --nosplice on tmpfs, cold read")]
    lines = ["CPU seconds per GiB (medians; busy is every core's, interrupts included):", "",
             "| run | MiB/s | OSDs | client daemon or rbd | dd | machine busy | idle |",
             "|---|---|---|---|---|---|---|"]
    for case, label in cases:
        if f"{case}_busy_s" not in m:
            continue
        lines.append(f"| {label} | {m[case]:.0f} | {m[case + '_osd_s']:.2f} | "
                     f"{m[case + '_client_s']:.2f} | {m[case + '_dd_s']:.2f} | "
                     f"{m[case + '_busy_s']:.2f} | {100 * m[case + '_idle']:.0f}% |")
    lines.append("")
    cores = os.cpu_count() or 1
    for kind in ("write", "read"):
        if f"fuse_{kind}_busy_s" not in m:
            continue
        # The cluster's cost as rbd bench meets it, plus FUSE's own with
        # nothing behind it: on cores that are all busy, the most a
        # filesystem that cost no more than FUSE itself could reach.
        per_gib = m[f"rbd_{kind}_busy_s"] + m[f"fuse_{kind}_busy_s"]
        most = cores / per_gib * 1024
        lines.append(f"{kind}: the cluster ({m[f'rbd_{kind}_busy_s']:.2f} s/GiB under rbd bench) "
                     f"and FUSE alone ({m[f'fuse_{kind}_busy_s']:.2f} s/GiB) on {cores} cores: "
                     f"at most {most:.0f} MiB/s, {most / m[f'rbd_{kind}']:.2f}x of rbd bench; "
                     f"Canopy {m[f'canopy_{kind}'] / m[f'rbd_{kind}']:.2f}x.")
    return lines + [""]


def passthrough_binary(work, src):
    """libfuse's passthrough_hp built for the installed libfuse3, or None
    (with the reason) when it cannot be built here."""
    try:
        return fslib.build_passthrough_hp(work, src)
    except Exception as e:  # noqa: BLE001 - any failure only drops a row
        print(f"rbd.py: no FUSE ceiling rows: {e}", file=sys.stderr)
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conf", help="ceph.conf of a running cluster (default: start one)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--canopy", default=os.path.join(ROOT, "target/release/canopy"))
    ap.add_argument("--passthrough-hp-src", default=None,
                    help="libfuse git clone, source tree or tarball to build passthrough_hp "
                         "from (the FUSE ceiling rows; default: $PASSTHROUGH_HP_SRC or GitHub)")
    ap.add_argument("--out", default=os.path.join(
        ROOT, "bench/results", f"{datetime.date.today()}-rbd.md"))
    args = ap.parse_args()
    # Asked first: a tool missing halfway through a round loses the round.
    missing = [t for t in ("fio", "rbd", "dd", "g++", "pkg-config") if not shutil.which(t)]
    if missing:
        sys.exit(f"rbd.py: needs {', '.join(missing)} (apt-get install fio ceph-common g++ "
                 "pkg-config libfuse3-dev; fio with its rbd engine)")
    work = tempfile.mkdtemp(prefix="canopy-rbd-bench-", dir="/var/tmp")
    conf, cluster = args.conf, None
    if not conf:
        cluster = os.path.join(work, "ceph")
        subprocess.run(["bash", os.path.join(ROOT, "scripts/ceph-dev.sh"), "start", cluster],
                       check=True)
        conf = os.path.join(cluster, "ceph.conf")
    try:
        b = Bench(conf, args.canopy, work, passthrough_binary(work, args.passthrough_hp_src))
        b.check_room()
        rows = []
        for i in range(args.rounds):
            row = {**b.sequential(), **b.fuse_ceiling(), **b.random_fsync(), **b.failover(), **b.give_back()}
            print(f"round {i + 1}: {json.dumps(row)}", file=sys.stderr)
            rows.append(row)
        write_report(rows, args.out)
    finally:
        if cluster:
            subprocess.run(["bash", os.path.join(ROOT, "scripts/ceph-dev.sh"), "stop", cluster])


if __name__ == "__main__":
    main()
