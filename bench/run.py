#!/usr/bin/env python3
"""Runs the seed workloads on Canopy and on kernel btrfs, XFS, ext4 and
fuse2fs in one run, alternating filesystems round by round, and writes
bench/results/<date>.md with PNG plots plus the summary in
docs/benchmarks.md (and its current table at the top, which `report`
alone rebuilds from bench/results). A benchmark, never a test. Needs root.

    python3 bench/run.py                      # every workload, scale 1/16
    python3 bench/run.py --scale 1 seek       # one workload at mail size
    python3 bench/run.py --fs canopy,btrfs --rounds 5 rename dbench
    python3 bench/run.py --fs canopy,btrfs,passthrough_hp everyday scale
    python3 bench/run.py report               # no benchmark: the current table

Workloads: seek, rename, dbench, dirty, fsync-random, everyday, qgroups, stall,
fsync-isolated, fsync-stream, pgbench, parallel, snapshot, roundtrip, reads,
scale.

passthrough_hp (libfuse's example over ext4, the FUSE ceiling) is built at
run time from libfuse's source at the installed libfuse3's tag: downloaded
from GitHub, or given with --passthrough-hp-src / $PASSTHROUGH_HP_SRC.
"""

import argparse
import atexit
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib import fs as fslib  # noqa: E402
from benchlib import current, report, workloads  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = {"mkfs.btrfs": "btrfs-progs", "mkfs.xfs": "xfsprogs", "xfs_io": "xfsprogs",
            "fuse2fs": "fuse2fs", "dbench": "dbench", "fusermount3": "fuse3",
            "fio": "fio"}


def ensure_tools():
    missing = sorted({pkg for tool, pkg in PACKAGES.items()
                      if subprocess.run(["which", tool], capture_output=True).returncode})
    if missing:
        print(f"installing {' '.join(missing)}", file=sys.stderr)
        fslib.sh("apt-get update -qq && apt-get install -y -qq " + " ".join(missing)
                 + " >/dev/null")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        # For the PNG plots only; the tables do without.
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "matplotlib"], check=False)
    fslib.sh(f"cd '{ROOT}' && cargo build --release --locked -q")


def prepare_drivers(chosen, work):
    """Lets each chosen driver get what it needs (passthrough_hp: its
    build) before the first round, so a missing piece stops the run at
    once with the driver's own explanation."""
    for name in chosen:
        try:
            fslib.DRIVERS[name].prepare(work)
        except (RuntimeError, subprocess.CalledProcessError) as e:
            sys.exit(f"run.py: {name}: {e}")


def machine():
    def first(cmd):
        r = subprocess.run(cmd, shell=True, capture_output=True, text=True)
        return (r.stdout.strip().splitlines() or ["?"])[0]
    return {
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "memory": first("free -g | awk '/Mem:/ {print $2 \" GiB\"}'"),
        "canopy": first(f"cd '{ROOT}' && git rev-parse --short HEAD"),
        "btrfs-progs": first("mkfs.btrfs --version"),
        "xfsprogs": first("mkfs.xfs -V"),
        "e2fsprogs (ext4, fuse2fs)": first("mkfs.ext4 -V 2>&1"),
        "dbench": first("dbench --help 2>&1 | head -1"),
        "libfuse3 (passthrough_hp)": first("pkg-config --modversion fuse3"),
    }


def cpu_ticks():
    """The machine's CPU time so far, in ticks: (all, stolen). Stolen is
    time the host ran other guests while this one wanted the CPU."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is
    # already inside user and nice).
    return sum(fields[:8]), fields[7] if len(fields) > 7 else 0


def stolen_share(before, after):
    """The percentage of the CPU time between two cpu_ticks() that the
    host took: rounds that lost much are slow for reasons of the host,
    and ratios between them mean little."""
    total, stolen = after[0] - before[0], after[1] - before[1]
    return 100.0 * stolen / total if total > 0 else 0.0


def report_only(argv):
    """`run.py report`: rewrites the current summary at the top of
    docs/benchmarks.md from the results already in bench/results, so the
    table can be brought up to date (or its layout changed) without
    measuring anything; no root needed."""
    p = argparse.ArgumentParser(prog="run.py report", description=report_only.__doc__)
    p.add_argument("--results", default=os.path.join(ROOT, "bench", "results"),
                   help="where the runs' .jsonl and .md are (default bench/results)")
    p.add_argument("--docs", default=os.path.join(ROOT, "docs", "benchmarks.md"),
                   help="the file whose current summary is rewritten")
    a = p.parse_args(argv)
    if not os.path.isdir(a.results) or not os.path.isfile(a.docs):
        p.error(f"needs the directory {a.results} and the file {a.docs}")
    n = current.update_docs(a.docs, a.results, list(workloads.WORKLOADS))
    print(f"{os.path.relpath(a.docs)}: current figures for {n} workload(s)", file=sys.stderr)


def main():
    if sys.argv[1:2] == ["report"]:
        return report_only(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workloads", nargs="*", help="default: all")
    p.add_argument("--scale", type=float, default=1 / 16,
                   help="size factor; 1 = the mails' sizes (default 1/16, a few minutes each)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--fs", default=",".join(workloads.DEFAULT_FS),
                   help="comma-separated: canopy,btrfs,xfs,ext4,fuse2fs (tmpfs is added "
                        "for rename)")
    p.add_argument("--work", default="/var/tmp/canopy-bench", help="where the images go")
    p.add_argument("--no-docs", action="store_true", help="leave docs/benchmarks.md alone")
    p.add_argument("--canopy-opts", default="",
                   help="mount options every Canopy mount gets, e.g. transport=dev")
    p.add_argument("--passthrough-hp-src", default=None,
                   help="libfuse git clone, source tree or tarball to build passthrough_hp "
                        f"from (default ${fslib.SOURCE_ENV}, else downloaded from GitHub)")
    p.add_argument("--everyday-src", default=None,
                   help="the tree everyday copies (default /usr/share, /usr at --scale >= 0.5)")
    a = p.parse_args()
    workloads.EVERYDAY_SOURCE = a.everyday_src
    fslib.Canopy.base_opts = a.canopy_opts
    fslib.PassthroughHp.source = a.passthrough_hp_src
    names = a.workloads or list(workloads.WORKLOADS)
    unknown = [w for w in names if w not in workloads.WORKLOADS]
    if unknown:
        p.error(f"unknown workload(s): {', '.join(unknown)}")
    if os.geteuid() != 0:
        p.error("needs root (mkfs, mount, drop_caches, vm.dirty_*)")
    chosen = a.fs.split(",")
    bad = [f for f in chosen if f not in fslib.DRIVERS]
    if bad:
        p.error(f"unknown filesystem(s): {', '.join(bad)}")

    ensure_tools()
    os.makedirs(a.work, exist_ok=True)
    prepare_drivers(chosen, a.work)
    saved = workloads.read_dirty_settings()
    live = []

    def cleanup():
        for f in live:
            f.release_mountpoint()
        workloads.restore_dirty_settings(saved)

    atexit.register(cleanup)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    date = datetime.datetime.now().strftime("%Y-%m-%d")
    results_dir = os.path.join(ROOT, "bench", "results")
    os.makedirs(results_dir, exist_ok=True)
    # A second run on the same day gets <date>-2 and so on.
    stem, n = date, 1
    while os.path.exists(os.path.join(results_dir, f"{stem}.md")) or \
            os.path.exists(os.path.join(results_dir, f"{stem}.jsonl")):
        n += 1
        stem = f"{date}-{n}"
    raw_path = os.path.join(results_dir, f"{stem}.jsonl")
    samples = []
    all_fs = []
    for w in names:
        fss = chosen + [f for f in workloads.EXTRA_FS.get(w, []) if f not in chosen]
        size = workloads.image_size(w, a.scale)
        for r in range(a.rounds):
            for name in fss:
                f = fslib.DRIVERS[name](name, a.work, size)
                live.append(f)
                print(f"[{w}] round {r + 1}/{a.rounds}: {name}", file=sys.stderr, flush=True)
                ticks = cpu_ticks()
                try:
                    got = workloads.WORKLOADS[w](f, a.scale)
                except Exception:  # a broken run is reported, the others go on
                    traceback.print_exc()
                    got = []
                finally:
                    f.destroy()
                    live.remove(f)
                    workloads.restore_dirty_settings(saved)
                if got:
                    got.append(("CPU stolen by the host (%)",
                                round(stolen_share(ticks, cpu_ticks()), 1), "%", "info"))
                for metric, value, unit, better in got:
                    s = {"workload": w, "fs": name, "round": r, "metric": metric,
                         "value": value, "unit": unit, "better": better, "scale": a.scale}
                    samples.append(s)
                    with open(raw_path, "a") as out:
                        out.write(json.dumps(s) + "\n")
        all_fs += [f for f in fss if f not in all_fs]

    summary = report.summarize(samples, all_fs)
    meta = {"date": date, "rounds": a.rounds, "machine": machine(),
            "command": "python3 bench/run.py " + " ".join(sys.argv[1:]),
            "docs": {w: " ".join((workloads.WORKLOADS[w].__doc__ or "").split())
                     for w in names}}
    md = os.path.join(results_dir, f"{stem}.md")
    report.write_report(md, os.path.join(results_dir, stem), summary, all_fs, meta)
    if not a.no_docs:
        report.update_docs_summary(os.path.join(ROOT, "docs", "benchmarks.md"), summary, all_fs,
                                   os.path.relpath(md, ROOT), date)
        current.update_docs(os.path.join(ROOT, "docs", "benchmarks.md"), results_dir,
                            list(workloads.WORKLOADS))
    print(f"report: {md}", file=sys.stderr)


if __name__ == "__main__":
    main()
