"""The database workloads, run in helper processes on the live mount until
they are killed. Each records every id whose COMMIT returned in a file
outside the mount (appended and fsynced: the acknowledged commits that a
crash must not lose); read_records reads that file back."""

import os
import random
import sqlite3
import string
import sys
import threading
import time

from .pgwire import PgConn


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


# ---------------------------------------------------------------------------
# PostgreSQL: writer connections inserting ids, and one connection churning
# WAL.

class IdAllocator:
    """Hands out consecutive ids to the writer threads."""

    def __init__(self, first):
        self.lock = threading.Lock()
        self.next = first

    def take(self, n):
        with self.lock:
            lo = self.next
            self.next += n
            return lo


def client_postgres(cfg):
    rec = Recorder(cfg["record"])
    ids = IdAllocator(cfg["first_id"])
    threads = [threading.Thread(target=pg_writer, args=(cfg, rec, ids, t), daemon=True)
               for t in range(cfg["threads"])]
    if cfg["churn_rows"] > 0:
        threads.append(threading.Thread(target=pg_churn, args=(cfg,), daemon=True))
    for t in threads:
        t.start()
    for t in threads[:cfg["threads"]]:
        t.join()
    print("every writer gave up", file=sys.stderr, flush=True)
    return 1


def pg_writer(cfg, rec, ids, tid):
    """Commits rows until 1000 errors in a row, recording each commit."""
    rng = random.Random(cfg["seed"] * 1000 + tid)
    conn, i, errors = None, 0, 0
    while errors < 1000:
        try:
            if conn is None:
                conn = PgConn(cfg["sock"])
            i += 1
            committed = pg_commit(conn, cfg, ids, rng, big=i % cfg["big_every"] == 0)
            if conn.status != b"I":
                raise RuntimeError(f"transaction status {conn.status!r} after COMMIT")
            rec.record(committed)
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


def pg_commit(conn, cfg, ids, rng, big):
    """One transaction: a big multi-row one or a single row. Returns the
    ids it inserted."""
    if big:
        lo = ids.take(cfg["big_rows"])
        hi = lo + cfg["big_rows"] - 1
        conn.query("BEGIN; INSERT INTO t(id, pad) SELECT g, "
                   "repeat(md5(g::text || random()::text), 2 + (g % 14)) "
                   f"FROM generate_series({lo}, {hi}) g; COMMIT")
        return range(lo, hi + 1)
    n = ids.take(1)
    conn.query(f"INSERT INTO t(id, pad) VALUES ({n}, '{rand_text(rng)}')")
    return (n,)


def pg_churn(cfg):
    """Fills WAL quickly (with max_wal_size=32MB) and forces checkpoints,
    so that WAL segments get recycled and rewritten in place."""
    conn, n = None, 0
    while True:
        try:
            if conn is None:
                conn = PgConn(cfg["sock"])
            n += 1
            pg_churn_step(conn, n, cfg["churn_rows"])
        except Exception as e:  # noqa: BLE001
            print(f"churn: {e}", file=sys.stderr, flush=True)
            conn = None
            time.sleep(0.2)


def pg_churn_step(conn, n, rows):
    conn.query("INSERT INTO bulk(id, pad) SELECT g, repeat(md5(random()::text), 8) "
               f"FROM generate_series(1, {rows}) g")
    if n % 2 == 0:
        conn.query("DELETE FROM bulk WHERE id % 3 <> 0")
        conn.query("VACUUM bulk")
    if n % 3 == 0:
        conn.query("CHECKPOINT")
    if n % 5 == 0:
        conn.query("TRUNCATE bulk")


# ---------------------------------------------------------------------------
# SQLite: one connection in the journal mode of the client.

def client_sqlite(cfg):
    rec = Recorder(cfg["record"])
    rng = random.Random(cfg["seed"])
    con = sqlite_open(cfg)
    if con is None:
        return 1
    next_id, i = cfg["first_id"], 0
    while True:
        i += 1
        n = cfg["big_rows"] if i % cfg["big_every"] == 0 else 1
        ids = list(range(next_id, next_id + n))
        sqlite_commit(con, rng, ids, next_id)
        if not dir_opens(cfg["db"]):
            return 1
        rec.record(ids)
        next_id += n


def sqlite_open(cfg):
    """The database in the wanted journal mode, with its table; None (and a
    message) if SQLite refuses the mode."""
    con = sqlite3.connect(cfg["db"], isolation_level=None, timeout=30)
    mode = con.execute(f"PRAGMA journal_mode={cfg['journal']}").fetchone()[0]
    if mode.lower() != cfg["journal"].lower():
        print(f"journal_mode is {mode}, wanted {cfg['journal']}", file=sys.stderr)
        return None
    con.execute(f"PRAGMA synchronous={cfg['synchronous']}")
    con.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, k INTEGER NOT NULL, "
                "pad BLOB NOT NULL)")
    con.execute("CREATE INDEX IF NOT EXISTS t_k ON t(k)")
    return con


def sqlite_commit(con, rng, ids, next_id):
    rows = [(x, rng.getrandbits(62), rng.randbytes(rng.randint(100, 500))) for x in ids]
    con.execute("BEGIN IMMEDIATE")
    con.executemany("INSERT INTO t(id, k, pad) VALUES (?, ?, ?)", rows)
    if next_id > 10:
        # Rewrite an older row too (its page and its index entry move).
        old = rng.randint(1, next_id - 1)
        con.execute("UPDATE t SET k = ?, pad = ? WHERE id = ?",
                    (rng.getrandbits(62), rng.randbytes(rng.randint(100, 500)), old))
    con.execute("COMMIT")


def dir_opens(db):
    """Whether a COMMIT that returned counts as acknowledged.

    SQLite ignores a failure to open the directory whose fsync makes the
    journal's unlink durable (unixDelete turns that into SQLITE_OK), so
    COMMIT returns OK when the daemon died between the UNLINK and that
    open: the commit was never made durable. The dead connection never
    comes back, so if the directory cannot be opened now, SQLite could not
    open it either: the commit is not acknowledged. (Found by tracing the
    requests of a failing round: UNLINK was the daemon's last request, no
    FSYNCDIR followed.)"""
    try:
        os.close(os.open(os.path.dirname(db) or ".", os.O_RDONLY))
    except OSError:
        return False
    return True
