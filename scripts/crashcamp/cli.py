"""The command line: options, the checks that the campaign can run here
(root, FUSE, PostgreSQL), the work directory and the private copy of
canopy, and the loop over clients, sizes, fills and rounds. main() is what
crash_campaign.py calls, for the campaign and for its helper processes."""

import argparse
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from . import common
from .common import CLIENTS, REPO
from .helpers import child_main
from .postgres import ensure_pg_user, find_pg_bindir
from .procs import REG, is_mounted
from .report import print_round, print_summary, write_json
from .round import Round


def main():
    """The campaign, or a helper process (`crash_campaign.py _child KIND
    CONFIG_JSON`, see helpers.py). Returns the exit status."""
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        return child_main(sys.argv[2:])
    return campaign()


def build_parser():
    ap = argparse.ArgumentParser(
        description="kill -9 the Canopy daemon under real databases and check that every "
                    "acknowledged commit survives the remount (fsync-log replay).")
    ap.add_argument("--client", action="append", choices=CLIENTS,
                    help="database client (repeatable; default: all three)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds per client, size and fill (default 4)")
    ap.add_argument("--size", action="append", help="image size (repeatable; default 4G and 512M)")
    ap.add_argument("--fill", action="append", type=float,
                    help="pre-fill the filesystem to this fraction of its capacity "
                         "(repeatable; 0 = fresh; default 0)")
    ap.add_argument("--seed", type=int, default=None, help="RNG seed (default: random, printed)")
    ap.add_argument("--cycles", type=int, default=3,
                    help="kill / remount / verify cycles per round on the same image, the "
                         "workload going on from the recovered database (default 3; damage "
                         "left by one log replay often shows only at the next crash)")
    ap.add_argument("--min-secs", type=float, default=3.0, help="earliest kill (s after the client starts)")
    ap.add_argument("--max-secs", type=float, default=12.0, help="latest kill")
    ap.add_argument("--canopy", default=os.path.join(REPO, "target/release/canopy"),
                    help="canopy binary (default: target/release/canopy, built if missing)")
    ap.add_argument("--mount-opts", default="", help="extra `canopy mount -o` options")
    ap.add_argument("--devices", type=int, default=1,
                    help="devices per filesystem (image files; more than 1: mkfs -m PROFILE "
                         "-d PROFILE, the others named with device= and --device)")
    ap.add_argument("--profile", default="raid1", choices=["raid1", "raid1c3", "raid10"],
                    help="profile of data and metadata with --devices over 1 (default raid1)")
    ap.add_argument("--rbd", default=None, metavar="CEPH_CONF",
                    help="put each image on RBD (rbd:rbd/NAME) on the cluster this ceph.conf names")
    ap.add_argument("--workdir", default=None, help="where images go (default: a new dir in /tmp)")
    ap.add_argument("--keep-dir", default="/tmp/crash-keep",
                    help="failing rounds' images and logs are moved here (default /tmp/crash-keep)")
    ap.add_argument("--sqlite-synchronous", choices=("FULL", "EXTRA"), default=None,
                    help="PRAGMA synchronous of the SQLite clients (default: EXTRA for "
                         "sqlite-rollback, FULL for sqlite-wal; with FULL, DELETE mode does not "
                         "fsync the directory after unlinking the journal, so SQLite itself "
                         "allows the last commit to roll back after a crash)")
    ap.add_argument("--keep-passing", action="store_true",
                    help="keep passing rounds' images and logs too")
    ap.add_argument("--pg-bindir", default=None,
                    help="PostgreSQL binaries (default /usr/lib/postgresql/15/bin, else newest)")
    ap.add_argument("--pg-threads", type=int, default=2, help="PostgreSQL client connections")
    ap.add_argument("--pg-churn-rows", type=int, default=20000,
                    help="rows per bulk insert of the WAL-churning connection (0: none)")
    ap.add_argument("--pg-recovery-timeout", type=float, default=90.0)
    ap.add_argument("--fill-timeout", type=float, default=600.0)
    ap.add_argument("--defragment", action="store_true",
                    help="run `canopy filesystem defragment -r` over the mount in a loop "
                         "beside the client until each crash (merging, then -clz4, then "
                         "-czstd, over and over, with `canopy filesystem trim` after each)")
    ap.add_argument("--nocow", action="store_true",
                    help="`chattr +C` the mount's root before the client starts, so the "
                         "database's files overwrite in place without checksums")
    ap.add_argument("--json", help="write a JSON summary here")
    ap.add_argument("-v", "--verbose", action="store_true")
    add_power_cut_options(ap)
    return ap


def add_power_cut_options(ap):
    g = ap.add_argument_group(
        "power cut", "instead of kill -9 alone, cut the power: the daemon journals what each "
        "write overwrites until a barrier covers it (src/dev/powercut.rs); after it dies, "
        "the unflushed writes are lost (see crashcamp/crash.py)")
    g.add_argument("--power-cut", choices=("all", "sectors", "mixed"), default=None,
                   help="what the cut loses: every unflushed write, a random version of each "
                        "sector written since the last barrier, or either at random per cut")
    g.add_argument("--cut-at", choices=("time", "barrier", "mixed"), default="mixed",
                   help="when: a random moment, exactly at a barrier (before its flush), or "
                        "either at random per cut (default mixed)")
    g.add_argument("--sector", type=int, default=4096,
                   help="bytes a disk writes atomically, for --power-cut sectors (default 4096)")
    g.add_argument("--barriers", choices=("honest", "ignored"), default="honest",
                   help="ignored: barriers flush nothing, the negative control that must fail")
    g.add_argument("--power-cut-bin",
                   default=os.path.join(REPO, "target/release/examples/power_cut"),
                   help="the tool that applies a cut (default: target/release/examples/"
                        "power_cut, built if missing)")


def parse_size(s):
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    s = s.strip().upper().rstrip("B").rstrip("I")
    num = s.rstrip("KMGT")
    return int(float(num) * units[s[len(num):]])


def parse_args():
    """Returns (args, clients, sizes, fills, seed); exits 2 on bad options."""
    ap = build_parser()
    args = ap.parse_args()
    common.set_verbose(args.verbose)
    clients = args.client or list(CLIENTS)
    clients = list(dict.fromkeys(clients))
    sizes = args.size or ["4G", "512M"]
    fills = args.fill or [0.0]
    for f in fills:
        if not 0 <= f < 1:
            ap.error("--fill takes a fraction in [0, 1)")
    if args.min_secs > args.max_secs:
        ap.error("--min-secs is larger than --max-secs")
    for s in sizes:
        try:
            parse_size(s)
        except (KeyError, ValueError):
            ap.error(f"bad --size {s!r}")
    if not 1 <= args.devices <= 16:
        ap.error("--devices takes 1 to 16")
    needs = {"raid1": 2, "raid1c3": 3, "raid10": 4}[args.profile]
    if args.devices > 1 and args.devices < needs:
        ap.error(f"--profile {args.profile} needs --devices {needs} or more")
    if args.devices > 1 and args.rbd:
        ap.error("--devices puts the other devices in image files, not on --rbd")
    if args.sector < 512 or args.sector & (args.sector - 1):
        ap.error("--sector takes a power of two of at least 512")
    if args.barriers == "ignored" and not args.power_cut:
        ap.error("--barriers ignored is for --power-cut")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    return args, clients, sizes, fills, seed


def can_run(args, clients):
    """Whether this machine can run the campaign (says why not); finds the
    PostgreSQL binaries and makes the postgres user if needed."""
    if os.geteuid() != 0:
        print("crash_campaign: must run as root (FUSE mounts, the postgres user)", file=sys.stderr)
        return False
    for tool in ("fusermount3", "umount"):
        if shutil.which(tool) is None:
            print(f"crash_campaign: {tool} not found (install fuse3)", file=sys.stderr)
            return False
    if not os.path.exists("/dev/fuse"):
        print("crash_campaign: /dev/fuse missing", file=sys.stderr)
        return False
    if "postgres" in clients:
        args.pg_bindir = find_pg_bindir(args.pg_bindir)
        if args.pg_bindir is None:
            print("crash_campaign: PostgreSQL binaries not found (need "
                  "/usr/lib/postgresql/15/bin/initdb and postgres; "
                  "apt-get install postgresql-15, or --pg-bindir)", file=sys.stderr)
            return False
        if ensure_pg_user() is None:
            return False
    return True


def build_canopy(path, target=("--bin", "canopy")):
    if os.path.exists(path):
        return
    print(f"crash_campaign: {path} missing; running cargo build --release", flush=True)
    rc = subprocess.call(["cargo", "build", "--release", *target], cwd=REPO)
    if rc != 0 or not os.path.exists(path):
        raise SystemExit(2)


def on_sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def catch_signals():
    # Started in the background by a non-interactive shell, SIGINT arrives
    # ignored: take it back, so that Ctrl-C / kill -INT clean up too.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGHUP, on_sigterm)


def make_workdir(args, clients):
    """A new directory for the rounds' images; None if the postgres user
    could not reach it."""
    parent = os.path.abspath(args.workdir or "/tmp")
    os.makedirs(parent, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="crash-campaign-", dir=parent)
    os.chmod(workdir, 0o755)  # the postgres user walks down to its data dir
    if "postgres" in clients and not searchable_by_others(workdir):
        os.rmdir(workdir)
        return None
    return workdir


def searchable_by_others(workdir):
    d = os.path.dirname(workdir)
    while True:
        if not os.stat(d).st_mode & 0o001:
            print(f"crash_campaign: the postgres user cannot reach {workdir} "
                  f"({d} is not searchable by others); choose another --workdir",
                  file=sys.stderr)
            return False
        if d == "/":
            return True
        d = os.path.dirname(d)


def copy_canopy(args, workdir):
    """A private copy of the binary: a rebuild during the campaign does not
    change what is tested. Sets args.canopy_bin and args.canopy_sha;
    returns the stat of the original."""
    args.canopy_bin = os.path.join(workdir, "canopy")
    shutil.copy2(args.canopy, args.canopy_bin)
    st = os.stat(args.canopy)
    with open(args.canopy_bin, "rb") as f:
        args.canopy_sha = hashlib.sha256(f.read()).hexdigest()
    return st


def print_banner(args, st, clients, sizes, fills, seed, workdir):
    print(f"crash campaign: seed {seed}, canopy {args.canopy} "
          f"(built {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(st.st_mtime))}, "
          f"sha256 {args.canopy_sha[:12]}), "
          f"clients {','.join(clients)}, sizes {','.join(sizes)}, "
          f"fills {','.join(f'{f:g}' for f in fills)}, {args.rounds} rounds each, "
          f"workdir {workdir}", flush=True)
    if args.power_cut:
        print(f"power cut: loss {args.power_cut}, at {args.cut_at}, sector {args.sector} B, "
              f"barriers {args.barriers}", flush=True)


def run_rounds(args, clients, sizes, fills, seed, workdir):
    """Every round, printed as it ends; returns (results, interrupted).
    Whatever happens, nothing is left running or mounted."""
    results, interrupted = [], False
    try:
        for client in clients:
            for size in sizes:
                for fill in fills:
                    for i in range(1, args.rounds + 1):
                        rs = f"{seed}-{client}-{size}-{fill:g}-{i}"
                        r = Round(args, client, size, fill, i, rs, workdir).execute()
                        results.append(r)
                        print_round(r, common.VERBOSE)
    except KeyboardInterrupt:
        interrupted = True
        print("\ncrash_campaign: interrupted; cleaning up", file=sys.stderr, flush=True)
    finally:
        REG.cleanup()
        remove_workdir(workdir)
    return results, interrupted


def remove_workdir(workdir):
    left = [m for m in REG.mounts if is_mounted(m)]
    if not left and not any(is_mounted(os.path.join(workdir, d, "mnt"))
                            for d in os.listdir(workdir)
                            if os.path.isdir(os.path.join(workdir, d))):
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"crash_campaign: WARNING: mounts left under {workdir}", file=sys.stderr)


def campaign():
    args, clients, sizes, fills, seed = parse_args()
    if not can_run(args, clients):
        return 2
    args.canopy = os.path.abspath(args.canopy)
    build_canopy(args.canopy)
    if args.power_cut:
        args.power_cut_bin = os.path.abspath(args.power_cut_bin)
        build_canopy(args.power_cut_bin, ("--example", "power_cut"))
    catch_signals()
    workdir = make_workdir(args, clients)
    if workdir is None:
        return 2
    args.keep_dir = os.path.abspath(args.keep_dir)
    st = copy_canopy(args, workdir)
    print_banner(args, st, clients, sizes, fills, seed, workdir)

    t0 = time.monotonic()
    results, interrupted = run_rounds(args, clients, sizes, fills, seed, workdir)
    passed, failed = print_summary(results, time.monotonic() - t0, seed, args.keep_passing)
    if args.json:
        write_json(args.json, seed, args, results, passed, failed, interrupted)
    if interrupted:
        return 130
    return 0 if failed == 0 and results else 1
