#!/usr/bin/env python3
"""Crash campaign: is fsync on a Canopy mount crash-safe with real databases?

Each round makes a fresh image (optionally pre-filled to a fraction of its
capacity), mounts it, and runs a database client that records every
acknowledged transaction id in a file outside the mount (appended and
fsynced after each COMMIT returned). After a random delay the Canopy daemon
is killed with SIGKILL, then the client and PostgreSQL; the image is
remounted (which replays the fsync log tree) and checked:

  * the image mounts again,
  * every acknowledged id is in the database (0 missing),
  * the database is intact (SQLite `PRAGMA integrity_check`; PostgreSQL
    crash recovery succeeds, heap and index agree, amcheck, and its log
    names no I/O or read errors).

The workload then goes on from the recovered database until the next kill
(--cycles, default 3: damage left by one replay often shows only at the
next crash). At the end of the round the image is unmounted and
`canopy scrub IMG` must find no damage (exit 0) and `canopy check IMG` no
problem (exit 0). Failing rounds keep their image and logs in --keep-dir.

Clients: `postgres` (PostgreSQL from /usr/lib/postgresql/*/bin, run as the
`postgres` user with data checksums, small max_wal_size and a connection
that churns WAL so that segments are recycled; spoken to with a tiny
wire-protocol v3 client, so the script needs only the Python standard
library), `sqlite-rollback` (journal_mode=DELETE, synchronous=EXTRA: with
FULL, SQLite itself does not fsync the directory after deleting the journal
and may roll the last acknowledged commit back after a crash) and
`sqlite-wal` (journal_mode=WAL, synchronous=FULL).

Needs root (FUSE mounts, switching to the postgres user), /dev/fuse and
fusermount3. Exit status: 0 every round passed, 1 a round failed, 2 the
campaign could not run (missing binaries, not root, ...), 130 interrupted.

Examples:
    python3 scripts/crash_campaign.py --client sqlite-rollback --rounds 3 --size 4G
    python3 scripts/crash_campaign.py --client postgres --size 512M --fill 0.85 --json out.json
    python3 scripts/crash_campaign.py --cycles 1 --rounds 10 -v     # one crash per image
"""

import argparse
import errno
import hashlib
import json
import os
import pwd
import random
import shutil
import signal
import socket
import sqlite3
import string
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLIENTS = ("postgres", "sqlite-rollback", "sqlite-wal")
PG_USER = "postgres"
# Free space below which the filler is trimmed before a recovery is verified.
ROOM_FOR_RECOVERY = 16 << 20
VERBOSE = False

# Patterns in the PostgreSQL log of the recovery run that mean it read
# something broken.
PG_BAD_LOG = (
    "Input/output error",
    "could not read",
    "PANIC",
    "page verification failed",
    "invalid page in block",
    "could not locate a valid checkpoint",
)
# Where and why the recovery run's WAL replay stopped (LOG lines; not
# errors by themselves: a torn last record is normal, lost commits show up
# as missing ids).
PG_REDO_END = (
    "redo done at",
    "redo starts at",
    "invalid record length",
    "incorrect resource manager data checksum",
    "unexpected pageaddr",
    "invalid magic number",
    "incorrect prev-link",
    "invalid resource manager ID",
    "contrecord",
)


def log(msg):
    if VERBOSE:
        print(f"  [{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def tail(path, lines=15):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", "replace").rstrip("\n").split("\n")
    return "\n".join(text[-lines:])


# ---------------------------------------------------------------------------
# Processes and mounts. Everything started is registered here, so that an
# exception or Ctrl-C anywhere leaves no daemon, database or mount behind.

class Registry:
    def __init__(self):
        self.daemons = []   # Popen of `canopy mount -f`
        self.clients = []   # Popen of client processes (own session)
        self.clusters = []  # PgCluster with a running postmaster
        self.mounts = []    # mount point paths

    def cleanup(self):
        """Kills everything still registered and detaches every mount.
        Daemons first: once a FUSE daemon is dead no process can block on
        its mount any more."""
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for d in list(self.daemons):
                kill_wait(d, signal.SIGKILL)
                self.daemons.remove(d)
            for c in list(self.clients):
                kill_group_wait(c)
                self.clients.remove(c)
            for cl in list(self.clusters):
                cl.kill_all()
                self.clusters.remove(cl)
            for m in list(self.mounts):
                lazy_unmount(m)
                self.mounts.remove(m)
        finally:
            signal.signal(signal.SIGINT, old)


REG = Registry()


def kill_wait(p, sig=signal.SIGKILL, timeout=15):
    if p.poll() is None:
        try:
            os.kill(p.pid, sig)
        except ProcessLookupError:
            pass
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def kill_group_wait(p, timeout=15):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return kill_wait(p, signal.SIGKILL, timeout)


def run(cmd, timeout, out_path=None, **kw):
    """Runs cmd in its own session with output to out_path (or a temporary
    file). Returns (exit status or None on timeout, output text)."""
    own = out_path is None
    if own:
        fd, out_path = tempfile.mkstemp(prefix="crash-campaign-out-")
        os.close(fd)
    try:
        with open(out_path, "wb") as out:
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT,
                                 start_new_session=True, **kw)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group_wait(p)
            rc = None
        except BaseException:
            kill_group_wait(p)
            raise
        with open(out_path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        if rc is None:
            text += f"\n(timed out after {timeout} s)"
        return rc, text
    finally:
        if own:
            os.unlink(out_path)


def unescape_mountinfo(s):
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 3 < len(s) and s[i + 1:i + 4].isdigit():
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def is_mounted(mnt):
    mnt = os.path.realpath(mnt)
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split(" ")
                if len(fields) > 4 and unescape_mountinfo(fields[4]) == mnt:
                    return True
    except OSError:
        pass
    return False


def lazy_unmount(mnt):
    for _ in range(3):
        if not is_mounted(mnt):
            return True
        run(["fusermount3", "-uz", mnt], timeout=15)
        if is_mounted(mnt):
            run(["umount", "-l", mnt], timeout=15)
    return not is_mounted(mnt)


def proc_children_map():
    """pid -> ppid for every process."""
    m = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2:].split()
        if len(rest) > 1:
            m[int(name)] = int(rest[1])
    return m


def descendants(pid):
    m = proc_children_map()
    kids = {}
    for p, pp in m.items():
        kids.setdefault(pp, []).append(p)
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in kids.get(p, []):
            out.append(c)
            todo.append(c)
    return out


# ---------------------------------------------------------------------------
# The Canopy daemon.

class Daemon:
    """`canopy mount -f IMG MNT` as our own child: its pid is exactly the
    daemon's, and its log (stderr) goes to a file."""

    def __init__(self, canopy, img, mnt, log_path, opts=""):
        self.canopy, self.img, self.mnt, self.log_path = canopy, img, mnt, log_path
        self.opts = opts
        self.p = None

    def start(self, timeout=60):
        """Returns None once mounted, or the error text."""
        cmd = [self.canopy, "mount", "-f"]
        if self.opts:
            cmd += ["-o", self.opts]
        cmd += [self.img, self.mnt]
        with open(self.log_path, "ab") as out:
            self.p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                      stderr=subprocess.STDOUT,
                                      start_new_session=True)
        REG.daemons.append(self.p)
        REG.mounts.append(self.mnt)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if is_mounted(self.mnt):
                return None
            if self.p.poll() is not None:
                self.forget()
                return (f"daemon exited with status {self.p.returncode}: "
                        + (tail(self.log_path, 20) or "(no output)"))
            time.sleep(0.05)
        self.kill9()
        lazy_unmount(self.mnt)
        self.forget_mount()
        return f"not mounted after {timeout} s: " + tail(self.log_path, 20)

    def alive(self):
        return self.p is not None and self.p.poll() is None

    def forget(self):
        if self.p in REG.daemons:
            REG.daemons.remove(self.p)

    def forget_mount(self):
        if self.mnt in REG.mounts:
            REG.mounts.remove(self.mnt)

    def kill9(self):
        rc = kill_wait(self.p, signal.SIGKILL)
        self.forget()
        return rc

    def unmount(self, timeout=30):
        """Clean unmount; returns (ok, daemon exit status, message)."""
        msg = ""
        for _ in range(50):
            rc, out = run(["umount", self.mnt], timeout=30)
            if rc == 0:
                break
            msg = out.strip()
            if "busy" not in out:
                break
            time.sleep(0.1)
        else:
            rc = 1
        if rc != 0:
            # Still mounted: fall back to a lazy unmount.
            lazy_unmount(self.mnt)
        self.forget_mount()
        try:
            status = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            status = None
            msg += f" daemon still running {timeout} s after umount; killed"
            self.kill9()
        self.forget()
        return rc == 0, status, msg


# ---------------------------------------------------------------------------
# PostgreSQL: a minimal wire-protocol v3 client (simple queries only).

class PgError(Exception):
    def __init__(self, fields):
        self.fields = fields
        self.code = fields.get("C", "")
        super().__init__(f"{fields.get('S', 'ERROR')} {self.code}: {fields.get('M', '?')}")


class PgConn:
    def __init__(self, sock_path, user="postgres", database="postgres", timeout=None):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(timeout)
        try:
            self.s.connect(sock_path)
            params = b"".join(k.encode() + b"\0" + v.encode() + b"\0" for k, v in
                              (("user", user), ("database", database),
                               ("application_name", "crash_campaign")))
            body = struct.pack("!i", 196608) + params + b"\0"
            self.s.sendall(struct.pack("!i", len(body) + 4) + body)
            self._until_ready()
        except BaseException:
            self.s.close()
            raise

    def _recv(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self.s.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("server closed the connection")
            buf += chunk
        return bytes(buf)

    def _msg(self):
        t, n = struct.unpack("!ci", self._recv(5))
        return t, self._recv(n - 4)

    @staticmethod
    def _fields(body):
        out = {}
        for part in body.split(b"\0"):
            if part:
                out[chr(part[0])] = part[1:].decode("utf-8", "replace")
        return out

    def _until_ready(self):
        rows, err = [], None
        while True:
            t, body = self._msg()
            if t == b"R":
                code = struct.unpack("!i", body[:4])[0]
                if code != 0:
                    raise PgError({"M": f"authentication method {code} not supported (need trust)"})
            elif t == b"E":
                err = PgError(self._fields(body))
                if not hasattr(self, "_started"):
                    raise err
            elif t == b"D":
                ncols = struct.unpack("!h", body[:2])[0]
                pos, row = 2, []
                for _ in range(ncols):
                    ln = struct.unpack("!i", body[pos:pos + 4])[0]
                    pos += 4
                    if ln < 0:
                        row.append(None)
                    else:
                        row.append(body[pos:pos + ln].decode("utf-8", "replace"))
                        pos += ln
                rows.append(row)
            elif t == b"Z":
                self._started = True
                self.status = body[:1]
                if err is not None:
                    raise err
                return rows
            # 'S', 'K', 'N', 'T', 'C', 'I', 'A': nothing to do.

    def query(self, sql):
        data = sql.encode() + b"\0"
        self.s.sendall(b"Q" + struct.pack("!i", len(data) + 4) + data)
        return self._until_ready()

    def close(self):
        try:
            self.s.sendall(b"X" + struct.pack("!i", 4))
        except OSError:
            pass
        self.s.close()


def find_pg_bindir(explicit):
    cands = [explicit] if explicit else []
    if not explicit:
        cands.append("/usr/lib/postgresql/15/bin")
        try:
            vers = sorted((v for v in os.listdir("/usr/lib/postgresql") if v.isdigit()),
                          key=int, reverse=True)
        except OSError:
            vers = []
        cands += [f"/usr/lib/postgresql/{v}/bin" for v in vers]
    for c in cands:
        if all(os.access(os.path.join(c, b), os.X_OK) for b in ("initdb", "postgres")):
            return c
    return None


def ensure_pg_user():
    try:
        return pwd.getpwnam(PG_USER)
    except KeyError:
        pass
    rc, out = run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                   "--shell", "/usr/sbin/nologin", "--user-group", PG_USER], timeout=30)
    if rc != 0:
        print(f"crash_campaign: cannot create the {PG_USER} user: {out.strip()}",
              file=sys.stderr)
        return None
    return pwd.getpwnam(PG_USER)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgCluster:
    def __init__(self, bindir, datadir, sockdir, port):
        self.bindir, self.datadir, self.sockdir, self.port = bindir, datadir, sockdir, port
        self.p = None
        self.sock_path = os.path.join(sockdir, f".s.PGSQL.{port}")
        self.env = {"PATH": "/usr/bin:/bin", "LANG": "C", "LC_ALL": "C",
                    "HOME": sockdir, "PGTZ": "UTC"}

    def _as_user(self):
        return dict(user=PG_USER, group=pwd.getpwnam(PG_USER).pw_gid, extra_groups=[],
                    env=self.env, cwd=self.sockdir)

    def initdb(self, out_path, timeout=180):
        return run([os.path.join(self.bindir, "initdb"), "-D", self.datadir, "--auth=trust",
                    "-U", PG_USER, "-E", "UTF8", "--locale=C", "--data-checksums"],
                   timeout=timeout, out_path=out_path, **self._as_user())

    def start(self, log_path):
        cmd = [os.path.join(self.bindir, "postgres"), "-D", self.datadir,
               "-p", str(self.port), "-k", self.sockdir,
               "-c", "listen_addresses=", "-c", "fsync=on",
               "-c", "synchronous_commit=on", "-c", "full_page_writes=on",
               "-c", "max_wal_size=32MB", "-c", "min_wal_size=32MB",
               "-c", "checkpoint_timeout=30s", "-c", "shared_buffers=16MB",
               "-c", "logging_collector=off", "-c", "max_connections=20"]
        with open(log_path, "ab") as out:
            self.p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                      stderr=subprocess.STDOUT, start_new_session=True,
                                      **self._as_user())
        if self not in REG.clusters:
            REG.clusters.append(self)

    def wait_ready(self, timeout):
        """Returns None once it answers a query, or why not."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                return f"postgres exited with status {self.p.returncode}"
            try:
                c = PgConn(self.sock_path, timeout=10)
                c.query("SELECT 1")
                c.close()
                return None
            except (OSError, PgError, ConnectionError) as e:
                last = str(e)
            time.sleep(0.2)
        return f"postgres did not accept connections within {timeout} s ({last})"

    def connect(self, timeout=60):
        return PgConn(self.sock_path, timeout=timeout)

    def kill_all(self):
        """SIGKILL the postmaster and every process of the cluster. Its
        children call setsid(), so a process group does not reach them:
        stop the postmaster (so that it forks no more and its children keep
        it as their parent), kill its descendants, then it."""
        if self.p is None:
            return
        if self.p.poll() is None:
            try:
                os.kill(self.p.pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
            for _ in range(10):
                kids = descendants(self.p.pid)
                if not kids:
                    break
                for k in kids:
                    try:
                        os.kill(k, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.05)
        kill_wait(self.p, signal.SIGKILL)
        # Children that were orphaned before we looked (they keep the data
        # directory as their working directory).
        for pid in list(proc_children_map()):
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
                st = os.stat(f"/proc/{pid}")
            except OSError:
                continue
            if st.st_uid == pwd.getpwnam(PG_USER).pw_uid and \
                    cwd.startswith(self.datadir.rstrip("/")):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self in REG.clusters:
            REG.clusters.remove(self)

    def stop(self, timeout=60):
        """Fast shutdown (SIGINT); kills everything if it takes too long."""
        if self.p is None:
            return True
        if self.p.poll() is None:
            try:
                os.kill(self.p.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
        try:
            self.p.wait(timeout=timeout)
            ok = True
        except subprocess.TimeoutExpired:
            ok = False
        self.kill_all()
        return ok


# ---------------------------------------------------------------------------
# Clients: run as `crash_campaign.py _client KIND CONFIG_JSON` subprocesses.

class Recorder:
    """Appends acknowledged ids to a file outside the mount, durably."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.lock = threading.Lock()

    def record(self, ids):
        data = "".join(f"{i}\n" for i in ids).encode()
        with self.lock:
            os.write(self.fd, data)
            os.fsync(self.fd)


def read_records(path):
    try:
        with open(path, "rb") as f:
            data = f.read().decode("ascii", "replace")
    except FileNotFoundError:
        return []
    lines = data.split("\n")
    if lines and lines[-1] != "":
        lines = lines[:-1]  # a line cut short by the kill: not acknowledged
    return [int(x) for x in lines if x.strip().isdigit()]


def rand_text(rng, lo=100, hi=500):
    alphabet = string.ascii_letters + string.digits
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))


def client_postgres(cfg):
    rec = Recorder(cfg["record"])
    lock = threading.Lock()
    counter = [cfg["first_id"]]

    def alloc(n):
        with lock:
            lo = counter[0]
            counter[0] += n
            return lo

    def writer(tid):
        rng = random.Random(cfg["seed"] * 1000 + tid)
        conn, i, errors = None, 0, 0
        while errors < 1000:
            try:
                if conn is None:
                    conn = PgConn(cfg["sock"])
                i += 1
                if i % cfg["big_every"] == 0:
                    lo = alloc(cfg["big_rows"])
                    hi = lo + cfg["big_rows"] - 1
                    conn.query("BEGIN; INSERT INTO t(id, pad) SELECT g, "
                               "repeat(md5(g::text || random()::text), 2 + (g % 14)) "
                               f"FROM generate_series({lo}, {hi}) g; COMMIT")
                    ids = range(lo, hi + 1)
                else:
                    n = alloc(1)
                    conn.query(f"INSERT INTO t(id, pad) VALUES ({n}, '{rand_text(rng)}')")
                    ids = (n,)
                if conn.status != b"I":
                    raise RuntimeError(f"transaction status {conn.status!r} after COMMIT")
                rec.record(ids)
                errors = 0
            except Exception as e:  # noqa: BLE001 - keep going until killed
                errors += 1
                print(f"writer {tid}: {e}", file=sys.stderr, flush=True)
                if conn is not None:
                    try:
                        conn.s.close()
                    except OSError:
                        pass
                conn = None
                time.sleep(0.2)

    def churn():
        # Fills WAL quickly (with max_wal_size=32MB) and forces checkpoints,
        # so that WAL segments get recycled and rewritten in place.
        conn, n = None, 0
        while True:
            try:
                if conn is None:
                    conn = PgConn(cfg["sock"])
                n += 1
                conn.query("INSERT INTO bulk(id, pad) SELECT g, repeat(md5(random()::text), 8) "
                           f"FROM generate_series(1, {cfg['churn_rows']}) g")
                if n % 2 == 0:
                    conn.query("DELETE FROM bulk WHERE id % 3 <> 0")
                    conn.query("VACUUM bulk")
                if n % 3 == 0:
                    conn.query("CHECKPOINT")
                if n % 5 == 0:
                    conn.query("TRUNCATE bulk")
            except Exception as e:  # noqa: BLE001
                print(f"churn: {e}", file=sys.stderr, flush=True)
                conn = None
                time.sleep(0.2)

    threads = [threading.Thread(target=writer, args=(t,), daemon=True)
               for t in range(cfg["threads"])]
    if cfg["churn_rows"] > 0:
        threads.append(threading.Thread(target=churn, daemon=True))
    for t in threads:
        t.start()
    for t in threads[:cfg["threads"]]:
        t.join()
    print("every writer gave up", file=sys.stderr, flush=True)
    return 1


def client_sqlite(cfg):
    rec = Recorder(cfg["record"])
    rng = random.Random(cfg["seed"])
    con = sqlite3.connect(cfg["db"], isolation_level=None, timeout=30)
    mode = con.execute(f"PRAGMA journal_mode={cfg['journal']}").fetchone()[0]
    if mode.lower() != cfg["journal"].lower():
        print(f"journal_mode is {mode}, wanted {cfg['journal']}", file=sys.stderr)
        return 1
    con.execute(f"PRAGMA synchronous={cfg['synchronous']}")
    con.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, k INTEGER NOT NULL, "
                "pad BLOB NOT NULL)")
    con.execute("CREATE INDEX IF NOT EXISTS t_k ON t(k)")
    next_id, i = cfg["first_id"], 0
    while True:
        i += 1
        n = cfg["big_rows"] if i % cfg["big_every"] == 0 else 1
        ids = list(range(next_id, next_id + n))
        rows = [(x, rng.getrandbits(62), rng.randbytes(rng.randint(100, 500))) for x in ids]
        con.execute("BEGIN IMMEDIATE")
        con.executemany("INSERT INTO t(id, k, pad) VALUES (?, ?, ?)", rows)
        if next_id > 10:
            # Rewrite an older row too (its page and its index entry move).
            old = rng.randint(1, next_id - 1)
            con.execute("UPDATE t SET k = ?, pad = ? WHERE id = ?",
                        (rng.getrandbits(62), rng.randbytes(rng.randint(100, 500)), old))
        con.execute("COMMIT")
        # SQLite ignores a failure to open the directory whose fsync makes
        # the journal's unlink durable (unixDelete turns that into
        # SQLITE_OK), so COMMIT returns OK when the daemon died between the
        # UNLINK and that open: the commit was never made durable. The dead
        # connection never comes back, so if the directory cannot be opened
        # now, SQLite could not open it either: the commit is not
        # acknowledged. (Found by tracing the requests of a failing round:
        # UNLINK was the daemon's last request, no FSYNCDIR followed.)
        try:
            os.close(os.open(os.path.dirname(cfg["db"]) or ".", os.O_RDONLY))
        except OSError:
            return 1
        rec.record(ids)
        next_id += n


def verify_sqlite(db, out_path, save=None):
    res = {"error": None, "integrity": None, "ids": [], "leftovers": {}}
    for suffix in ("-journal", "-wal"):
        try:
            res["leftovers"][suffix] = os.stat(db + suffix).st_size
        except OSError:
            pass
    if save:
        # The files as the remount left them, before SQLite rolls back a hot
        # journal or checkpoints the WAL (kept with a failing round).
        os.makedirs(save, exist_ok=True)
        for suffix in ("", "-journal", "-wal"):
            try:
                shutil.copyfile(db + suffix, os.path.join(save, os.path.basename(db) + suffix))
            except OSError as e:
                if e.errno != errno.ENOENT:
                    res["copy_error"] = f"copying {db + suffix}: {e}"
        # The database file alone, as if there were no journal or WAL: tells
        # a lost write of the file from a journal that came back.
        try:
            copy = os.path.join(save, os.path.basename(db))
            con = sqlite3.connect(f"file:{copy}?immutable=1", uri=True)
            row = con.execute("SELECT count(*), max(id) FROM t").fetchone()
            res["file_only"] = {"count": row[0], "max_id": row[1]}
            con.close()
        except Exception as e:  # noqa: BLE001
            res["file_only"] = {"error": f"{type(e).__name__}: {e}"}
    try:
        con = sqlite3.connect(db, isolation_level=None, timeout=30)
        res["integrity"] = [r[0] for r in con.execute("PRAGMA integrity_check")]
        res["journal_mode"] = con.execute("PRAGMA journal_mode").fetchone()[0]
        res["ids"] = [r[0] for r in con.execute("SELECT id FROM t")]
        con.close()
    except Exception as e:  # noqa: BLE001
        res["error"] = f"{type(e).__name__}: {e}"
    with open(out_path, "w") as f:
        json.dump(res, f)


def fill_file(path, nbytes, out_path):
    chunk = bytearray(os.urandom(1 << 20))
    written, err = 0, None
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        n = 0
        while written < nbytes:
            n += 1
            chunk[0:8] = n.to_bytes(8, "little")
            want = min(len(chunk), nbytes - written)
            try:
                written += os.write(fd, memoryview(chunk)[:want])
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    err = "ENOSPC"
                    break
                raise
    finally:
        os.close(fd)
    with open(out_path, "w") as f:
        json.dump({"written": written, "error": err}, f)


def child_main(argv):
    kind, cfg = argv[0], json.loads(argv[1])
    if kind == "postgres":
        return client_postgres(cfg)
    if kind == "sqlite":
        return client_sqlite(cfg)
    if kind == "verify-sqlite":
        verify_sqlite(cfg["db"], cfg["out"], cfg.get("save"))
        return 0
    if kind == "fill":
        fill_file(cfg["path"], cfg["bytes"], cfg["out"])
        return 0
    print(f"unknown child kind {kind}", file=sys.stderr)
    return 2


def helper_cmd(kind, cfg):
    return [sys.executable, os.path.abspath(__file__), "_child", kind, json.dumps(cfg)]


# ---------------------------------------------------------------------------
# One round.

def parse_size(s):
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    s = s.strip().upper().rstrip("B").rstrip("I")
    num = s.rstrip("KMGT")
    return int(float(num) * units[s[len(num):]])


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
        self.img = os.path.join(self.dir, "fs.img")
        if args.rbd:
            # An RBD image on the cluster args.rbd configures (issue 42).
            self.img = (f"rbd:rbd/crash-{os.getpid()}-{int(time.time() * 1000)}-{self.name}"
                        f"?conf={args.rbd}")
        self.mnt = os.path.join(self.dir, "mnt")
        os.mkdir(self.mnt)
        self.record = os.path.join(self.dir, "acked.txt")
        self.canopy = args.canopy_bin
        self.daemon = None
        self.client_p = None
        self.cluster = None
        self.sockdir = None
        self.r = {"client": client, "size": size, "fill": fill, "round": idx,
                  "seed": rng_seed, "kill_after": None, "acked": 0, "missing": None,
                  "missing_sample": [], "found": None, "mount_error": None,
                  "integrity": None, "db_log_errors": [], "scrub_rc": None,
                  "scrub": None, "check_rc": None, "check": None, "daemon_status": None,
                  "kills": [], "acked_per_cycle": [], "pg_redo": [], "daemon_died": False,
                  "notes": [], "reasons": [], "passed": False, "kept": None}

    def p(self, name):
        return os.path.join(self.dir, name)

    def mount(self, logname):
        opts = self.args.mount_opts
        if self.args.rbd:
            # The killed daemon's client still holds the image's lock until
            # the cluster times it out (30 s): take it over, as an operator
            # restarting after a crash would.
            opts = ",".join(o for o in (opts, "takeover") if o)
        self.daemon = Daemon(self.canopy, self.img, self.mnt, self.p(logname), opts)
        return self.daemon.start()

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

    def fail(self, why):
        self.r["reasons"].append(why)

    def _execute(self):
        r = self.r
        rc, out = run([self.canopy, "mkfs", "--size", self.size, self.img], timeout=120)
        if rc != 0:
            self.fail(f"mkfs failed: {out.strip()}")
            return
        err = self.mount("daemon-1.log")
        if err:
            r["mount_error"] = f"first mount: {err}"
            self.fail(f"first mount failed: {err}")
            return
        log(f"{self.name}: mounted (pid {self.daemon.p.pid})")
        # PostgreSQL's cluster is made first, so that the filler leaves the
        # free space the fraction asks for to the running database.
        if self.client == "postgres" and not self.setup_postgres():
            return
        if self.fill > 0 and not self.prefill():
            return
        first_id = 1
        for cycle in range(1, self.args.cycles + 1):
            found = self.crash_cycle(cycle, first_id)
            if found is None or r["reasons"]:
                break
            # The next cycle goes on from the recovered database.
            first_id = max(found | set(read_records(self.record)) | {0}) + 1
        if self.daemon.alive():
            if self.cluster is not None and not self.cluster.stop():
                r["notes"].append("postgres did not shut down within 60 s; killed")
            ok, status, msg = self.daemon.unmount()
            r["daemon_status"] = status
            if not ok:
                r["notes"].append(f"umount failed ({msg}); unmounted lazily")
            if status != 0:
                self.fail(f"daemon exited with status {status} after umount: "
                          f"{tail(self.daemon.log_path, 10)}")
        self.scrub_and_check()

    def crash_cycle(self, cycle, first_id):
        """Runs the client, kills everything, remounts and verifies every id
        acknowledged so far. Returns the ids found, or None."""
        r = self.r
        self.start_client(first_id, cycle)
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
        # What happened on the live mount: the client's status and how far
        # the logs had got before the kill (errors after it are expected).
        client_rc = self.client_p.poll()
        client_log = self.p(f"client-{cycle}.log")
        pg_log = self.p(f"postgres-{cycle}.log")
        pg_log_size = os.path.getsize(pg_log) if self.cluster is not None else 0
        self.crash()
        if client_rc is not None:
            last = tail(client_log, 3).strip().splitlines()
            last = last[-1] if last else "(no output)"
            if "database or disk is full" in last or "No space left" in last:
                r["notes"].append(f"client stopped, out of space, before kill {cycle}: {last}")
            else:
                self.fail(f"client died with status {client_rc} on the live mount before kill "
                          f"{cycle}: {last}")
        if self.cluster is not None:
            with open(pg_log, "rb") as f:
                live = f.read(pg_log_size).decode("utf-8", "replace").splitlines()
            bad = [ln for ln in live if any(pat in ln for pat in PG_BAD_LOG)
                   and "No space left on device" not in ln]
            if bad:
                r["db_log_errors"] += bad[:10]
                self.fail(f"postgres on the live mount before kill {cycle}: {bad[0]}")
        acked = read_records(self.record)
        r["acked"] = len(acked)
        new = len(acked) - sum(r["acked_per_cycle"])
        r["acked_per_cycle"].append(new)
        if new == 0:
            r["notes"].append(f"no transaction was acknowledged before kill {cycle}")
        for path in (self.p(f"postgres-{cycle}.log"), client_log):
            text = tail(path, 100000)
            if "No space left on device" in text or "database or disk is full" in text:
                r["notes"].append(f"out of space before kill {cycle} "
                                  f"({os.path.basename(path)}); lower --fill")
                break
        log(f"{self.name}: kill {cycle} after {kill_after} s, {len(acked)} ids acknowledged")
        # Remount: replays the fsync log.
        err = self.mount(f"daemon-{cycle + 1}.log")
        if err:
            r["mount_error"] = err
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
        missing = sorted(set(acked) - found)
        r["found"] = len(found)
        r["missing"] = len(missing)
        r["missing_sample"] = missing[:20]
        if missing:
            self.fail(f"{len(missing)} of {len(acked)} acknowledged ids missing after kill "
                      f"{cycle} (e.g. {missing[:10]}){self.file_only_note()}")
        return found

    def file_only_note(self):
        """For SQLite: what the database file held without its journal/WAL."""
        fo = self.sqlite_file_only if self.client != "postgres" else None
        if not fo:
            return ""
        if "error" in fo:
            return f"; the database file alone (no journal/WAL): {fo['error']}"
        return (f"; the database file alone (no journal/WAL) held {fo['count']} rows, "
                f"max id {fo['max_id']}")

    def prefill(self):
        st = os.statvfs(self.mnt)
        total = st.f_blocks * st.f_frsize
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        want = int(self.fill * total) - used
        if want <= 0:
            return True
        out = self.p("fill.json")
        rc, text = run(helper_cmd("fill", {"path": os.path.join(self.mnt, "filler"),
                                           "bytes": want, "out": out}),
                       timeout=self.args.fill_timeout, out_path=self.p("fill.log"))
        if rc != 0:
            self.fail(f"pre-fill failed (status {rc}): {text.strip()[-500:]}")
            return False
        with open(out) as f:
            res = json.load(f)
        self.r["notes"].append(f"filler {res['written'] >> 20} MiB of {total >> 20} MiB"
                               + (" (ENOSPC)" if res["error"] else ""))
        rc, text = run([self.canopy, "sync", self.mnt], timeout=120)
        if rc != 0:
            self.fail(f"canopy sync failed: {text.strip()}")
            return False
        log(f"{self.name}: filled {res['written'] >> 20} MiB")
        return True

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

    def setup_postgres(self):
        pw = pwd.getpwnam(PG_USER)
        self.sockdir = tempfile.mkdtemp(prefix="ccpg-", dir="/tmp")
        os.chown(self.sockdir, pw.pw_uid, pw.pw_gid)
        os.chmod(self.sockdir, 0o700)
        datadir = os.path.join(self.mnt, "pgdata")
        os.mkdir(datadir)
        os.chown(datadir, pw.pw_uid, pw.pw_gid)
        os.chmod(datadir, 0o700)
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

    def start_client(self, first_id, cycle):
        if self.client == "postgres":
            cfg = {"sock": self.cluster.sock_path, "record": self.record, "first_id": first_id,
                   "seed": self.rng.getrandbits(32), "threads": self.args.pg_threads,
                   "big_every": 50, "big_rows": 200, "churn_rows": self.churn_rows()}
            cmd = helper_cmd("postgres", cfg)
        else:
            cfg = {"db": os.path.join(self.mnt, "db.sqlite"), "record": self.record,
                   "first_id": first_id,
                   "seed": self.rng.getrandbits(32),
                   "journal": "WAL" if self.client == "sqlite-wal" else "DELETE",
                   "synchronous": self.args.sqlite_synchronous or
                   ("FULL" if self.client == "sqlite-wal" else "EXTRA"),
                   "big_every": 50, "big_rows": 200}
            cmd = helper_cmd("sqlite", cfg)
        with open(self.p(f"client-{cycle}.log"), "ab") as out:
            self.client_p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                             stderr=subprocess.STDOUT, start_new_session=True)
        REG.clients.append(self.client_p)

    def kill_client_and_database(self):
        if self.client_p is not None:
            kill_group_wait(self.client_p)
            if self.client_p in REG.clients:
                REG.clients.remove(self.client_p)
        if self.cluster is not None:
            self.cluster.kill_all()

    def crash(self):
        """kill -9 of the daemon, then of the client and the database, then
        the dead mount is detached."""
        self.daemon.kill9()
        self.kill_client_and_database()
        if not lazy_unmount(self.mnt):
            raise RuntimeError(f"cannot detach the dead mount {self.mnt}")
        self.daemon.forget_mount()

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
        if res["error"]:
            self.r["integrity"] = res["error"]
            self.fail(f"sqlite after kill {cycle}: {res['error']}")
        elif res["integrity"] != ["ok"]:
            self.r["integrity"] = "; ".join(res["integrity"][:10])
            self.fail(f"integrity_check after kill {cycle}: {self.r['integrity']}")
        else:
            self.r["integrity"] = "ok"
        if res["error"] and not res["ids"]:
            return None
        return set(res["ids"])

    def verify_postgres(self, log2, cycle):
        r = self.r
        self.cluster.start(log2)
        err = self.cluster.wait_ready(self.args.pg_recovery_timeout)
        if err:
            r["integrity"] = f"recovery failed: {err}"
            self.fail(f"postgres crash recovery after kill {cycle} failed: {err}: "
                      f"{tail(log2, 12)}")
            r["db_log_errors"] += self.pg_log_errors(log2)
            return None
        found, problems = None, []
        try:
            c = self.cluster.connect(timeout=120)
            try:
                found = {int(row[0]) for row in c.query("SELECT id FROM t")}
                seq = int(c.query("SELECT count(*) FROM t")[0][0])
                idx = int(c.query("SET enable_seqscan = off; SET enable_bitmapscan = off; "
                                  "SELECT count(*) FROM t WHERE id > -1")[0][0])
                if not (len(found) == seq == idx):
                    problems.append(f"row counts disagree: ids {len(found)}, seq scan {seq}, "
                                    f"index scan {idx}")
                try:
                    c.query("CREATE EXTENSION IF NOT EXISTS amcheck")
                except PgError as e:
                    r["notes"].append(f"amcheck unavailable: {e}")
                else:
                    try:
                        c.query("SELECT bt_index_check('t_pkey'::regclass, true)")
                    except PgError as e:
                        problems.append(f"amcheck: {e}")
            finally:
                c.close()
        except (OSError, PgError, ConnectionError, ValueError) as e:
            problems.append(f"query failed: {e}")
        r["db_log_errors"] += self.pg_log_errors(log2)
        r["pg_redo"] += self.pg_log_lines(log2, PG_REDO_END)
        bad = self.pg_log_errors(log2)
        if bad:
            problems.append(f"postgres log: {bad[0]}")
        r["integrity"] = "ok" if not problems and r["integrity"] in (None, "ok") \
            else "; ".join(problems) or r["integrity"]
        for pr in problems:
            self.fail(f"after kill {cycle}: {pr}")
        return found

    @staticmethod
    def pg_log_lines(path, patterns):
        try:
            with open(path, "rb") as f:
                lines = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return []
        return [ln for ln in lines if any(pat in ln for pat in patterns)][:20]

    @classmethod
    def pg_log_errors(cls, path):
        return cls.pg_log_lines(path, PG_BAD_LOG)

    def scrub_and_check(self):
        r = self.r
        rc, out = run([self.canopy, "scrub", "--json", "-q", self.img], timeout=600,
                      out_path=self.p("scrub.json"))
        r["scrub_rc"] = rc
        _, r["scrub"] = summarize_json(out, ("tree_blocks", "data_extents", "bad_tree_blocks",
                                             "bad_data_sectors", "damaged_files", "errors",
                                             "error"))
        if rc != 0:
            self.fail(f"scrub exit {rc}: {json.dumps(r['scrub'])[:600]}")
        rc, out = run([self.canopy, "check", "--json", "-q", self.img], timeout=600,
                      out_path=self.p("check.json"))
        r["check_rc"] = rc
        _, r["check"] = summarize_json(out, ("generation", "tree_blocks", "problems",
                                             "warnings", "error"))
        if rc != 0:
            self.fail(f"check exit {rc}: {json.dumps(r['check'])[:600]}")

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
                shutil.rmtree(self.dir, ignore_errors=True)
                if self.args.rbd:
                    # The cluster's space is the test machine's disk.
                    run(["rbd", "-c", self.args.rbd, "rm", "--no-progress",
                         self.img[len("rbd:"):].split("?")[0]], timeout=120)
            else:
                r["kept"] = keep(self.dir, self.args.keep_dir, self.name)
        finally:
            signal.signal(signal.SIGINT, old)


def keep(src, keep_dir, name):
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


# ---------------------------------------------------------------------------

def round_line(r):
    status = "PASS" if r["passed"] else "FAIL"
    missing = "-" if r["missing"] is None else str(r["missing"])
    kill = "+".join(f"{k:.1f}" for k in r["kills"]) + "s" if r["kills"] else "-"
    sc = lambda rc: "-" if rc is None else str(rc)  # noqa: E731
    return (f"{r['client']:<15} {r['size']:>5} fill={r['fill']:<4g} r{r['round']:<3} "
            f"kill@{kill:<6} acked={r['acked']:<6} missing={missing:<5} "
            f"integrity={'-' if r['integrity'] is None else ('ok' if r['integrity'] == 'ok' else 'BAD')} "
            f"scrub={sc(r['scrub_rc'])} check={sc(r['check_rc'])} "
            f"{r['seconds']:5.1f}s  {status}")


def build_canopy(path):
    if os.path.exists(path):
        return
    print(f"crash_campaign: {path} missing; running cargo build --release", flush=True)
    rc = subprocess.call(["cargo", "build", "--release", "--bin", "canopy"], cwd=REPO)
    if rc != 0 or not os.path.exists(path):
        raise SystemExit(2)


def on_sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main():
    global VERBOSE
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
    ap.add_argument("--json", help="write a JSON summary here")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    VERBOSE = args.verbose
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
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)

    if os.geteuid() != 0:
        print("crash_campaign: must run as root (FUSE mounts, the postgres user)", file=sys.stderr)
        return 2
    for tool in ("fusermount3", "umount"):
        if shutil.which(tool) is None:
            print(f"crash_campaign: {tool} not found (install fuse3)", file=sys.stderr)
            return 2
    if not os.path.exists("/dev/fuse"):
        print("crash_campaign: /dev/fuse missing", file=sys.stderr)
        return 2
    if "postgres" in clients:
        args.pg_bindir = find_pg_bindir(args.pg_bindir)
        if args.pg_bindir is None:
            print("crash_campaign: PostgreSQL binaries not found (need "
                  "/usr/lib/postgresql/15/bin/initdb and postgres; "
                  "apt-get install postgresql-15, or --pg-bindir)", file=sys.stderr)
            return 2
        if ensure_pg_user() is None:
            return 2
    args.canopy = os.path.abspath(args.canopy)
    build_canopy(args.canopy)

    # Started in the background by a non-interactive shell, SIGINT arrives
    # ignored: take it back, so that Ctrl-C / kill -INT clean up too.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGHUP, on_sigterm)
    parent = os.path.abspath(args.workdir or "/tmp")
    os.makedirs(parent, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="crash-campaign-", dir=parent)
    os.chmod(workdir, 0o755)  # the postgres user walks down to its data dir
    if "postgres" in clients:
        d = os.path.dirname(workdir)
        while True:
            if not os.stat(d).st_mode & 0o001:
                print(f"crash_campaign: the postgres user cannot reach {workdir} "
                      f"({d} is not searchable by others); choose another --workdir",
                      file=sys.stderr)
                os.rmdir(workdir)
                return 2
            if d == "/":
                break
            d = os.path.dirname(d)
    args.keep_dir = os.path.abspath(args.keep_dir)
    # A private copy of the binary: a rebuild during the campaign does not
    # change what is tested.
    args.canopy_bin = os.path.join(workdir, "canopy")
    shutil.copy2(args.canopy, args.canopy_bin)
    st = os.stat(args.canopy)
    with open(args.canopy_bin, "rb") as f:
        args.canopy_sha = hashlib.sha256(f.read()).hexdigest()
    print(f"crash campaign: seed {seed}, canopy {args.canopy} "
          f"(built {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(st.st_mtime))}, "
          f"sha256 {args.canopy_sha[:12]}), "
          f"clients {','.join(clients)}, sizes {','.join(sizes)}, "
          f"fills {','.join(f'{f:g}' for f in fills)}, {args.rounds} rounds each, "
          f"workdir {workdir}", flush=True)

    results, interrupted = [], False
    t0 = time.monotonic()
    try:
        for client in clients:
            for size in sizes:
                for fill in fills:
                    for i in range(1, args.rounds + 1):
                        rs = f"{seed}-{client}-{size}-{fill:g}-{i}"
                        rd = Round(args, client, size, fill, i, rs, workdir)
                        r = rd.execute()
                        results.append(r)
                        print(round_line(r), flush=True)
                        for why in r["reasons"]:
                            print(f"    - {why}", flush=True)
                        if VERBOSE:
                            for note in r["notes"]:
                                print(f"    note: {note}", flush=True)
                            for line in r.get("pg_redo", []):
                                print(f"    postgres: {line}", flush=True)
                        if r["kept"]:
                            print(f"    kept: {r['kept']}", flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print("\ncrash_campaign: interrupted; cleaning up", file=sys.stderr, flush=True)
    finally:
        REG.cleanup()
        left = [m for m in REG.mounts if is_mounted(m)]
        if not left and not any(is_mounted(os.path.join(workdir, d, "mnt"))
                                for d in os.listdir(workdir)
                                if os.path.isdir(os.path.join(workdir, d))):
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"crash_campaign: WARNING: mounts left under {workdir}", file=sys.stderr)

    passed = sum(r["passed"] for r in results)
    failed = len(results) - passed
    print(f"\nsummary: {len(results)} rounds, {passed} passed, {failed} failed "
          f"in {time.monotonic() - t0:.0f} s (seed {seed})")
    groups = {}
    for r in results:
        groups.setdefault((r["client"], r["size"], r["fill"]), []).append(r)
    for (c, s, f), rs in groups.items():
        nf = sum(not r["passed"] for r in rs)
        kinds = []
        if any(r["daemon_died"] for r in rs):
            kinds.append("daemon died by itself")
        if any(r["mount_error"] for r in rs):
            kinds.append(f"{sum(bool(r['mount_error']) for r in rs)} mount failures")
        if any(r["missing"] for r in rs):
            kinds.append(f"{sum(r['missing'] or 0 for r in rs)} missing ids")
        if any(r["integrity"] not in (None, "ok") for r in rs):
            kinds.append("integrity errors")
        if any(r["scrub_rc"] == 3 for r in rs):
            kinds.append("scrub damage")
        if any(r["scrub_rc"] not in (0, 3) for r in rs):
            kinds.append("scrub could not run")
        if any(r["check_rc"] == 4 for r in rs):
            kinds.append("check problems")
        if any(r["check_rc"] not in (0, 4) for r in rs):
            kinds.append("check could not check")
        print(f"  {c:<15} {s:>5} fill={f:<4g}: {len(rs) - nf}/{len(rs)} passed"
              + (f" ({', '.join(kinds)})" if kinds else ""))
    kept = [r["kept"] for r in results if r["kept"]]
    if kept:
        print("images kept (failing rounds" + (", and passing ones" if args.keep_passing else "")
              + "; logs next to them):")
        for k in kept:
            print(f"  {k}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seed": seed, "canopy": args.canopy, "canopy_sha256": args.canopy_sha,
                       "mount_opts": args.mount_opts, "rounds": results,
                       "passed": passed, "failed": failed, "interrupted": interrupted},
                      f, indent=2)
    if interrupted:
        return 130
    return 0 if failed == 0 and results else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        sys.exit(child_main(sys.argv[2:]))
    sys.exit(main())
