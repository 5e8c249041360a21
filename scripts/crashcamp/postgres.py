"""The PostgreSQL server under test: finding its binaries and user, a
cluster whose data directory is on the mount (initdb, start, crash-kill,
stop), and what its log may and may not say after a recovery."""

import os
import pwd
import signal
import socket
import subprocess
import sys
import time

from .pgwire import PgConn, PgError
from .procs import REG, descendants, kill_wait, proc_children_map, run

PG_USER = "postgres"

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


def log_lines(path, patterns):
    """The first 20 lines of the log at path that contain one of patterns."""
    try:
        with open(path, "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    return [ln for ln in lines if any(pat in ln for pat in patterns)][:20]


def log_errors(path):
    return log_lines(path, PG_BAD_LOG)


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


def kill_pid(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


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

    def command(self):
        return [os.path.join(self.bindir, "postgres"), "-D", self.datadir,
                "-p", str(self.port), "-k", self.sockdir,
                "-c", "listen_addresses=", "-c", "fsync=on",
                "-c", "synchronous_commit=on", "-c", "full_page_writes=on",
                "-c", "max_wal_size=32MB", "-c", "min_wal_size=32MB",
                "-c", "checkpoint_timeout=30s", "-c", "shared_buffers=16MB",
                "-c", "logging_collector=off", "-c", "max_connections=20"]

    def start(self, log_path):
        with open(log_path, "ab") as out:
            self.p = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=out,
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
            self._freeze_and_kill_children()
        kill_wait(self.p, signal.SIGKILL)
        self._kill_orphans()
        if self in REG.clusters:
            REG.clusters.remove(self)

    def _freeze_and_kill_children(self):
        try:
            os.kill(self.p.pid, signal.SIGSTOP)
        except ProcessLookupError:
            pass
        for _ in range(10):
            kids = descendants(self.p.pid)
            if not kids:
                break
            for k in kids:
                kill_pid(k)
            time.sleep(0.05)

    def _kill_orphans(self):
        """Children that were orphaned before we looked (they keep the data
        directory as their working directory)."""
        for pid in list(proc_children_map()):
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
                st = os.stat(f"/proc/{pid}")
            except OSError:
                continue
            if st.st_uid == pwd.getpwnam(PG_USER).pw_uid and \
                    cwd.startswith(self.datadir.rstrip("/")):
                kill_pid(pid)

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
