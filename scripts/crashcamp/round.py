"""One round: a fresh image (optionally pre-filled) is mounted and a
database client runs on it; --cycles times the round crashes it (crash.py
decides how), remounts, and checks that every acknowledged id survived and
the database is intact; then the image is unmounted cleanly and
`canopy scrub` and `canopy check` must find nothing. A failing round keeps
its image and logs in --keep-dir."""

import errno
import json
import os
import pwd
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

from . import crash, postgres
from .clients import read_records
from .common import log, tail
from .daemon import Daemon
from .helpers import helper_cmd
from .pgwire import PgError
from .postgres import PG_BAD_LOG, PG_REDO_END, PG_USER, PgCluster, free_port
from .procs import REG, kill_group_wait, lazy_unmount, run

# Free space below which the filler is trimmed before a recovery is verified.
ROOM_FOR_RECOVERY = 16 << 20

SCRUB_KEYS = ("tree_blocks", "data_extents", "bad_tree_blocks", "bad_data_sectors",
              "damaged_files", "errors", "error")
CHECK_KEYS = ("generation", "tree_blocks", "problems", "warnings", "error")


def new_result(client, size, fill, idx, seed):
    """A round's result, as the summary and --json report it."""
    return {"client": client, "size": size, "fill": fill, "round": idx,
            "seed": seed, "kill_after": None, "acked": 0, "missing": None,
            "missing_sample": [], "found": None, "mount_error": None,
            "integrity": None, "db_log_errors": [], "scrub_rc": None,
            "scrub": None, "check_rc": None, "check": None, "daemon_status": None,
            "kills": [], "acked_per_cycle": [], "pg_redo": [], "daemon_died": False,
            "notes": [], "reasons": [], "passed": False, "kept": None}


def summarize_json(text, keys):
    try:
        j = json.loads(text[text.index("{"):text.rindex("}") + 1])
    except ValueError:
        return None, text.strip()[-2000:]
    return j, {k: j.get(k) for k in keys if k in j}


class Round:
    def __init__(self, args, client, size, fill, idx, rng_seed, workdir):
        self.args, self.client, self.size, self.fill, self.idx = args, client, size, fill, idx
        self.rng = random.Random(rng_seed)
        self.sqlite_file_only = None
        self.name = f"{client}-{size}-fill{fill:g}-r{idx}"
        self.dir = os.path.join(workdir, self.name)
        os.makedirs(self.dir)
        os.chmod(self.dir, 0o755)
        self.img = self.image_name()
        # The filesystem's other devices (--devices), image files beside it.
        self.others = [os.path.join(self.dir, f"dev{i}.img")
                       for i in range(2, max(1, args.devices) + 1)]
        self.mnt = os.path.join(self.dir, "mnt")
        os.mkdir(self.mnt)
        self.record = os.path.join(self.dir, "acked.txt")
        self.canopy = args.canopy_bin
        self.crash_method = crash.for_args(args)
        self.daemon = None
        self.client_p = None
        self.defrag_p = None
        self.cluster = None
        self.sockdir = None
        self.r = new_result(client, size, fill, idx, rng_seed)

    def image_name(self):
        if self.args.rbd:
            # An RBD image on the cluster args.rbd configures (issue 42).
            return (f"rbd:rbd/crash-{os.getpid()}-{int(time.time() * 1000)}-{self.name}"
                    f"?conf={self.args.rbd}")
        return os.path.join(self.dir, "fs.img")

    def p(self, name):
        return os.path.join(self.dir, name)

    def fail(self, why):
        self.r["reasons"].append(why)

    def mount(self, logname):
        opts = ",".join([o for o in [self.args.mount_opts] if o]
                        + [f"device={d}" for d in self.others])
        if self.args.rbd:
            # The killed daemon's client still holds the image's lock until
            # the cluster times it out (30 s): take it over, as an operator
            # restarting after a crash would.
            opts = ",".join(o for o in (opts, "takeover") if o)
        self.daemon = Daemon(self.canopy, self.img, self.mnt, self.p(logname), opts,
                             env=self.crash_method.daemon_env(self))
        return self.daemon.start()

    # -- the round from start to end -----------------------------------------

    def execute(self):
        t0 = time.monotonic()
        try:
            self._execute()
        except Exception:  # noqa: BLE001 - a round that cannot finish fails
            self.fail("error in the round: " + traceback.format_exc().strip().replace("\n", "\n      "))
        finally:
            self.cleanup()
            self.r["seconds"] = round(time.monotonic() - t0, 1)
        return self.r

    def _execute(self):
        if not self.make_and_mount():
            return
        # PostgreSQL's cluster is made first, so that the filler leaves the
        # free space the fraction asks for to the running database.
        if self.client == "postgres" and not self.setup_postgres():
            return
        if self.fill > 0 and not self.prefill():
            return
        self.run_cycles()
        if self.daemon.alive():
            self.shut_down()
        self.scrub_and_check()

    def make_and_mount(self):
        p = self.args.profile
        profiles = ["-m", p, "-d", p] if self.others else []
        rc, out = run([self.canopy, "mkfs", "--size", self.size, *profiles, self.img, *self.others],
                      timeout=120)
        if rc != 0:
            self.fail(f"mkfs failed: {out.strip()}")
            return False
        err = self.mount("daemon-1.log")
        if err:
            self.r["mount_error"] = f"first mount: {err}"
            self.fail(f"first mount failed: {err}")
            return False
        log(f"{self.name}: mounted (pid {self.daemon.p.pid})")
        if self.args.nocow:
            # Everything the client makes inherits it: files overwrite
            # their data in place, without checksums (btrfs's nodatacow).
            rc, out = run(["chattr", "+C", self.mnt], timeout=30)
            if rc != 0:
                self.fail(f"chattr +C failed: {out.strip()}")
                return False
        return True

    def run_cycles(self):
        first_id = 1
        for cycle in range(1, self.args.cycles + 1):
            found = self.crash_cycle(cycle, first_id)
            if found is None or self.r["reasons"]:
                break
            # The next cycle goes on from the recovered database.
            first_id = max(found | set(read_records(self.record)) | {0}) + 1

    def shut_down(self):
        """The clean end: the database stopped, the image unmounted; the
        daemon must exit 0."""
        r = self.r
        if self.cluster is not None and not self.cluster.stop():
            r["notes"].append("postgres did not shut down within 60 s; killed")
        ok, status, msg = self.daemon.unmount()
        r["daemon_status"] = status
        if not ok:
            r["notes"].append(f"umount failed ({msg}); unmounted lazily")
        if status != 0:
            self.fail(f"daemon exited with status {status} after umount: "
                      f"{tail(self.daemon.log_path, 10)}")

    # -- one crash cycle -----------------------------------------------------

    def crash_cycle(self, cycle, first_id):
        """Runs the client, crashes, remounts and verifies every id
        acknowledged so far. Returns the ids found, or None."""
        self.start_client(first_id, cycle)
        kill_after = self.wait_for_crash_time()
        # What happened on the live mount: the client's status and how far
        # the logs had got before the crash (errors after it are expected).
        client_rc = self.client_p.poll()
        pg_log = self.p(f"postgres-{cycle}.log")
        pg_log_size = os.path.getsize(pg_log) if self.cluster is not None else 0
        self.crash()
        self.judge_client_before_crash(cycle, client_rc)
        self.judge_postgres_before_crash(cycle, pg_log, pg_log_size)
        acked = self.count_acked(cycle)
        log(f"{self.name}: kill {cycle} after {kill_after} s, {len(acked)} ids acknowledged")
        return self.remount_and_verify(cycle, acked)

    def wait_for_crash_time(self):
        """Lets the client run for a random delay (less if the daemon dies
        by itself, which fails the round); returns the time it ran (s)."""
        r = self.r
        delay = self.rng.uniform(self.args.min_secs, self.args.max_secs)
        t_start = time.monotonic()
        while time.monotonic() - t_start < delay:
            if not self.daemon.alive():
                break
            time.sleep(0.05)
        kill_after = round(time.monotonic() - t_start, 1)
        r["kill_after"] = kill_after if r["kill_after"] is None else r["kill_after"]
        r["kills"].append(kill_after)
        if not self.daemon.alive():
            r["daemon_died"] = True
            self.fail(f"daemon died by itself (status {self.daemon.p.returncode}) "
                      f"after {kill_after} s: {tail(self.daemon.log_path, 10)}")
        self.fail_on_panic()
        return kill_after

    def fail_on_panic(self):
        """A thread of the daemon that panicked leaves its request without
        an answer: the client hangs in it, and what it acknowledged before
        survives the crash, so the round would pass. The log tells."""
        try:
            with open(self.daemon.log_path, errors="replace") as f:
                lines = [line for line in f if "panicked at" in line]
        except OSError:
            return
        if lines:
            self.fail(f"a daemon thread panicked: {lines[0].strip()[:300]}")

    def crash(self):
        """The crash: how it happens is the crash method's business
        (crash.py): kill -9 of the daemon, or a power cut that also loses
        the unflushed writes; then the client and the database are killed
        and the dead mount is detached."""
        self.crash_method.crash(self)

    def kill_client_and_database(self):
        for p in (self.client_p, self.defrag_p):
            if p is not None:
                kill_group_wait(p)
                if p in REG.clients:
                    REG.clients.remove(p)
        self.defrag_p = None
        if self.cluster is not None:
            self.cluster.kill_all()

    def detach_dead_mount(self):
        if not lazy_unmount(self.mnt):
            raise RuntimeError(f"cannot detach the dead mount {self.mnt}")
        self.daemon.forget_mount()

    def judge_client_before_crash(self, cycle, client_rc):
        """A client that had stopped before the crash fails the round,
        unless the disk was full."""
        if client_rc is None:
            return
        last = tail(self.p(f"client-{cycle}.log"), 3).strip().splitlines()
        last = last[-1] if last else "(no output)"
        if "database or disk is full" in last or "No space left" in last:
            self.r["notes"].append(f"client stopped, out of space, before kill {cycle}: {last}")
        else:
            self.fail(f"client died with status {client_rc} on the live mount before kill "
                      f"{cycle}: {last}")

    def judge_postgres_before_crash(self, cycle, pg_log, size):
        """I/O errors in what PostgreSQL logged on the live mount (the first
        size bytes of its log) fail the round."""
        if self.cluster is None:
            return
        with open(pg_log, "rb") as f:
            live = f.read(size).decode("utf-8", "replace").splitlines()
        bad = [ln for ln in live if any(pat in ln for pat in PG_BAD_LOG)
               and "No space left on device" not in ln]
        if bad:
            self.r["db_log_errors"] += bad[:10]
            self.fail(f"postgres on the live mount before kill {cycle}: {bad[0]}")

    def count_acked(self, cycle):
        """The ids acknowledged so far (the record file)."""
        r = self.r
        acked = read_records(self.record)
        r["acked"] = len(acked)
        new = len(acked) - sum(r["acked_per_cycle"])
        r["acked_per_cycle"].append(new)
        if new == 0:
            r["notes"].append(f"no transaction was acknowledged before kill {cycle}")
        for path in (self.p(f"postgres-{cycle}.log"), self.p(f"client-{cycle}.log")):
            text = tail(path, 100000)
            if "No space left on device" in text or "database or disk is full" in text:
                r["notes"].append(f"out of space before kill {cycle} "
                                  f"({os.path.basename(path)}); lower --fill")
                break
        return acked

    def remount_and_verify(self, cycle, acked):
        """Remounts (which replays the fsync log) and verifies the database;
        returns the ids found, or None."""
        if os.environ.get("CANOPY_CAMPAIGN_KEEP_CRASHED") and not self.args.rbd:
            # For debugging a failure: the image as the crash left it,
            # before the remount replays its log.
            subprocess.run(["cp", "--sparse=always", self.img,
                            self.p(f"crashed-{cycle}.img")], check=False)
        err = self.mount(f"daemon-{cycle + 1}.log")
        if err:
            self.r["mount_error"] = err
            self.fail(f"remount after kill {cycle} failed: {err}")
            return None
        log(f"{self.name}: remounted (pid {self.daemon.p.pid})")
        self.make_room_for_recovery(cycle)
        if self.client == "postgres":
            found = self.verify_postgres(self.p(f"postgres-{cycle + 1}.log"), cycle)
        else:
            found = self.verify_sqlite(cycle)
        if found is None:
            return None
        self.count_missing(cycle, acked, found)
        return found

    def count_missing(self, cycle, acked, found):
        r = self.r
        missing = sorted(set(acked) - found)
        r["found"] = len(found)
        r["missing"] = len(missing)
        r["missing_sample"] = missing[:20]
        if missing:
            self.fail(f"{len(missing)} of {len(acked)} acknowledged ids missing after kill "
                      f"{cycle} (e.g. {missing[:10]}){self.file_only_note()}")

    def file_only_note(self):
        """For SQLite: what the database file held without its journal/WAL."""
        fo = self.sqlite_file_only if self.client != "postgres" else None
        if not fo:
            return ""
        if "error" in fo:
            return f"; the database file alone (no journal/WAL): {fo['error']}"
        return (f"; the database file alone (no journal/WAL) held {fo['count']} rows, "
                f"max id {fo['max_id']}")

    # -- space ---------------------------------------------------------------

    def prefill(self):
        st = os.statvfs(self.mnt)
        total = st.f_blocks * st.f_frsize
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        want = int(self.fill * total) - used
        if want <= 0:
            return True
        res = self.run_filler(want)
        if res is None:
            return False
        self.r["notes"].append(f"filler {res['written'] >> 20} MiB of {total >> 20} MiB"
                               + (" (ENOSPC)" if res["error"] else ""))
        rc, text = run([self.canopy, "sync", self.mnt], timeout=120)
        if rc != 0:
            self.fail(f"canopy sync failed: {text.strip()}")
            return False
        log(f"{self.name}: filled {res['written'] >> 20} MiB")
        return True

    def run_filler(self, nbytes):
        """The filler helper writing nbytes; its result, or None."""
        out = self.p("fill.json")
        rc, text = run(helper_cmd("fill", {"path": os.path.join(self.mnt, "filler"),
                                           "bytes": nbytes, "out": out}),
                       timeout=self.args.fill_timeout, out_path=self.p("fill.log"))
        if rc != 0:
            self.fail(f"pre-fill failed (status {rc}): {text.strip()[-500:]}")
            return None
        with open(out) as f:
            return json.load(f)

    def make_room_for_recovery(self, cycle):
        """A client that ran into ENOSPC leaves a full disk, and recovery
        must grow files (SQLite's -shm, PostgreSQL's WAL): trimming the filler,
        which is never verified, makes that room so a full disk is not
        mistaken for lost data. What was acknowledged stays untouched."""
        st = os.statvfs(self.mnt)
        if st.f_bavail * st.f_frsize >= ROOM_FOR_RECOVERY:
            return
        filler = os.path.join(self.mnt, "filler")
        try:
            size = os.stat(filler).st_size
            os.truncate(filler, max(0, size - 2 * ROOM_FOR_RECOVERY))
        except OSError as e:
            self.r["notes"].append(f"could not trim the filler after kill {cycle}: {e}")
            return
        self.r["notes"].append(f"trimmed the filler by {2 * ROOM_FOR_RECOVERY >> 20} MiB "
                               f"after kill {cycle}: the disk was full")

    # -- the client ----------------------------------------------------------

    def setup_postgres(self):
        datadir = self.make_pg_dirs()
        self.cluster = PgCluster(self.args.pg_bindir, datadir, self.sockdir, free_port())
        t = time.monotonic()
        rc, out = self.cluster.initdb(self.p("initdb.log"))
        if rc != 0:
            self.fail(f"initdb failed (status {rc}): {out.strip()[-800:]}")
            return False
        log(f"{self.name}: initdb took {time.monotonic() - t:.1f} s")
        self.cluster.start(self.p("postgres-1.log"))
        err = self.cluster.wait_ready(60)
        if err:
            self.fail(f"postgres did not start: {err}: {tail(self.p('postgres-1.log'), 10)}")
            return False
        c = self.cluster.connect()
        c.query("CREATE TABLE t(id bigint PRIMARY KEY, pad text NOT NULL)")
        c.query("CREATE TABLE bulk(id bigint NOT NULL, pad text NOT NULL)")
        c.close()
        return True

    def make_pg_dirs(self):
        """The socket directory (in /tmp) and the data directory (on the
        mount), owned by the postgres user; returns the data directory."""
        pw = pwd.getpwnam(PG_USER)
        self.sockdir = tempfile.mkdtemp(prefix="ccpg-", dir="/tmp")
        os.chown(self.sockdir, pw.pw_uid, pw.pw_gid)
        os.chmod(self.sockdir, 0o700)
        datadir = os.path.join(self.mnt, "pgdata")
        os.mkdir(datadir)
        os.chown(datadir, pw.pw_uid, pw.pw_gid)
        os.chmod(datadir, 0o700)
        return datadir

    def churn_rows(self):
        """Rows per bulk insert of the WAL-churning connection: fewer on a
        nearly full filesystem, so that the database does not run out of
        space (about 330 bytes of heap and as much WAL per row)."""
        st = os.statvfs(self.mnt)
        free = st.f_bavail * st.f_frsize
        rows = min(self.args.pg_churn_rows, free // 12000)
        if rows < self.args.pg_churn_rows:
            self.r["notes"].append(f"{free >> 20} MiB free: churn of {rows} rows")
        return rows

    def client_cmd(self, first_id):
        if self.client == "postgres":
            cfg = {"sock": self.cluster.sock_path, "record": self.record, "first_id": first_id,
                   "seed": self.rng.getrandbits(32), "threads": self.args.pg_threads,
                   "big_every": 50, "big_rows": 200, "churn_rows": self.churn_rows()}
            return helper_cmd("postgres", cfg)
        cfg = {"db": os.path.join(self.mnt, "db.sqlite"), "record": self.record,
               "first_id": first_id,
               "seed": self.rng.getrandbits(32),
               "journal": "WAL" if self.client == "sqlite-wal" else "DELETE",
               "synchronous": self.args.sqlite_synchronous or
               ("FULL" if self.client == "sqlite-wal" else "EXTRA"),
               "big_every": 50, "big_rows": 200}
        return helper_cmd("sqlite", cfg)

    def start_client(self, first_id, cycle):
        cmd = self.client_cmd(first_id)
        with open(self.p(f"client-{cycle}.log"), "ab") as out:
            self.client_p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                             stderr=subprocess.STDOUT, start_new_session=True)
        REG.clients.append(self.client_p)
        if self.args.defragment:
            self.start_defragmenter(cycle)

    def start_defragmenter(self, cycle):
        """Defragments the database's files over and over while the
        client writes them, merging extents, then recompressing them with
        lz4, then with zstd, and trims the free space after each pass
        (what it rewrites and discards must survive the crash as
        everything else does). Its errors are logged, not judged: files
        come and go under it; the checks after the crash judge."""
        canopy, mnt = shlex.quote(self.canopy), shlex.quote(self.mnt)
        loop = (f"while :; do for c in '' -clz4 -czstd; do {canopy} "
                f"filesystem defragment -r -v -t 2M $c {mnt}; {canopy} filesystem trim -v {mnt}; "
                f"sleep 0.2; done; done")
        with open(self.p(f"defrag-{cycle}.log"), "ab") as out:
            self.defrag_p = subprocess.Popen(["sh", "-c", loop], stdin=subprocess.DEVNULL,
                                             stdout=out, stderr=subprocess.STDOUT,
                                             start_new_session=True)
        REG.clients.append(self.defrag_p)

    # -- verification after a remount ----------------------------------------

    def verify_sqlite(self, cycle):
        out = self.p(f"verify-{cycle}.json")
        rc, text = run(helper_cmd("verify-sqlite", {"db": os.path.join(self.mnt, "db.sqlite"),
                                                    "out": out,
                                                    "save": self.p(f"at-remount-{cycle}")}),
                       timeout=120, out_path=self.p(f"verify-{cycle}.log"))
        if rc != 0:
            self.r["integrity"] = (f"verification after kill {cycle} failed (status {rc}): "
                                   f"{text.strip()[-500:]}")
            self.fail(self.r["integrity"])
            return None
        with open(out) as f:
            res = json.load(f)
        self.sqlite_file_only = res.get("file_only")
        if res["leftovers"]:
            self.r["notes"].append("at remount: " + ", ".join(
                f"db.sqlite{k} {v} bytes" for k, v in res["leftovers"].items()))
        self.judge_sqlite(cycle, res)
        if res["error"] and not res["ids"]:
            return None
        return set(res["ids"])

    def judge_sqlite(self, cycle, res):
        if res["error"]:
            self.r["integrity"] = res["error"]
            self.fail(f"sqlite after kill {cycle}: {res['error']}")
        elif res["integrity"] != ["ok"]:
            self.r["integrity"] = "; ".join(res["integrity"][:10])
            self.fail(f"integrity_check after kill {cycle}: {self.r['integrity']}")
        else:
            self.r["integrity"] = "ok"

    def verify_postgres(self, log2, cycle):
        r = self.r
        self.cluster.start(log2)
        err = self.cluster.wait_ready(self.args.pg_recovery_timeout)
        if err:
            r["integrity"] = f"recovery failed: {err}"
            self.fail(f"postgres crash recovery after kill {cycle} failed: {err}: "
                      f"{tail(log2, 12)}")
            r["db_log_errors"] += postgres.log_errors(log2)
            return None
        problems = []
        found = self.pg_read_back(problems)
        r["db_log_errors"] += postgres.log_errors(log2)
        r["pg_redo"] += postgres.log_lines(log2, PG_REDO_END)
        bad = postgres.log_errors(log2)
        if bad:
            problems.append(f"postgres log: {bad[0]}")
        r["integrity"] = "ok" if not problems and r["integrity"] in (None, "ok") \
            else "; ".join(problems) or r["integrity"]
        for pr in problems:
            self.fail(f"after kill {cycle}: {pr}")
        return found

    def pg_read_back(self, problems):
        """The ids in t after recovery (None if they cannot be read); what
        is wrong with the table goes to problems."""
        found = None
        try:
            c = self.cluster.connect(timeout=120)
            try:
                found = {int(row[0]) for row in c.query("SELECT id FROM t")}
                self.pg_check_table(c, len(found), problems)
            finally:
                c.close()
        except (OSError, PgError, ConnectionError, ValueError) as e:
            problems.append(f"query failed: {e}")
        return found

    def pg_check_table(self, c, nfound, problems):
        """Heap and index agree, and amcheck finds the index sound."""
        seq = int(c.query("SELECT count(*) FROM t")[0][0])
        idx = int(c.query("SET enable_seqscan = off; SET enable_bitmapscan = off; "
                          "SELECT count(*) FROM t WHERE id > -1")[0][0])
        if not (nfound == seq == idx):
            problems.append(f"row counts disagree: ids {nfound}, seq scan {seq}, "
                            f"index scan {idx}")
        try:
            c.query("CREATE EXTENSION IF NOT EXISTS amcheck")
        except PgError as e:
            self.r["notes"].append(f"amcheck unavailable: {e}")
        else:
            try:
                c.query("SELECT bt_index_check('t_pkey'::regclass, true)")
            except PgError as e:
                problems.append(f"amcheck: {e}")

    # -- the end -------------------------------------------------------------

    def scrub_and_check(self):
        self.offline_tool("scrub", SCRUB_KEYS)
        self.offline_tool("check", CHECK_KEYS)

    def offline_tool(self, tool, keys):
        """`canopy TOOL --json -q IMG` on the unmounted image: its status
        and the keys of its JSON go to r[TOOL_rc] and r[TOOL]; it must exit 0."""
        devices = [a for d in self.others for a in ("--device", d)]
        rc, out = run([self.canopy, tool, "--json", "-q", *devices, self.img], timeout=600,
                      out_path=self.p(f"{tool}.json"))
        self.r[f"{tool}_rc"] = rc
        _, self.r[tool] = summarize_json(out, keys)
        if rc != 0:
            self.fail(f"{tool} exit {rc}: {json.dumps(self.r[tool])[:600]}")

    def cleanup(self):
        """Leaves nothing running and nothing mounted; keeps the round's
        files when it failed, removes them when it passed."""
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            if self.daemon is not None and self.daemon.alive():
                self.daemon.kill9()
            self.kill_client_and_database()
            if not lazy_unmount(self.mnt):
                print(f"crash_campaign: WARNING: {self.mnt} is still mounted", file=sys.stderr)
                return
            if self.daemon is not None:
                self.daemon.forget_mount()
            if self.sockdir:
                shutil.rmtree(self.sockdir, ignore_errors=True)
            r = self.r
            r["passed"] = not r["reasons"]
            if r["passed"] and not self.args.keep_passing:
                self.remove()
            else:
                r["kept"] = keep(self.dir, self.args.keep_dir, self.name)
        finally:
            signal.signal(signal.SIGINT, old)

    def remove(self):
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.args.rbd:
            # The cluster's space is the test machine's disk.
            run(["rbd", "-c", self.args.rbd, "rm", "--no-progress",
                 self.img[len("rbd:"):].split("?")[0]], timeout=120)


def keep(src, keep_dir, name):
    """Moves a round's directory into keep_dir; returns where its image is
    now."""
    os.makedirs(keep_dir, exist_ok=True)
    dst = os.path.join(keep_dir, f"{time.strftime('%Y%m%d-%H%M%S')}-{name}")
    n = 1
    while os.path.exists(dst):
        n += 1
        dst = os.path.join(keep_dir, f"{time.strftime('%Y%m%d-%H%M%S')}-{name}-{n}")
    try:
        os.rename(src, dst)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        # Another file system: copy (keeping the image sparse), then remove.
        rc, out = run(["cp", "-a", "--sparse=always", src, dst], timeout=600)
        if rc != 0:
            print(f"crash_campaign: cannot keep {src} in {dst}: {out}", file=sys.stderr)
            return src
        shutil.rmtree(src, ignore_errors=True)
    for sub in ("mnt",):
        try:
            os.rmdir(os.path.join(dst, sub))
        except OSError:
            pass
    return os.path.join(dst, "fs.img")
