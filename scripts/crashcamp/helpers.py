"""The helper processes. The campaign re-invokes its entry script as
`crash_campaign.py _child KIND CONFIG_JSON` (helper_cmd builds that command
line, child_main runs it) for the database workloads, which get killed with
the crash, and for work on the mount that must not hang the campaign itself
if the mount does: reading a recovered SQLite database back, and the filler
that pre-fills the file system."""

import errno
import json
import os
import shutil
import sqlite3
import sys

from .clients import client_postgres, client_sqlite
from .common import SCRIPT


def helper_cmd(kind, cfg):
    return [sys.executable, SCRIPT, "_child", kind, json.dumps(cfg)]


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


def verify_sqlite(db, out_path, save=None):
    """Reads the database back after a remount; writes the result (JSON)
    to out_path."""
    res = {"error": None, "integrity": None, "ids": [], "leftovers": {}}
    for suffix in ("-journal", "-wal"):
        try:
            res["leftovers"][suffix] = os.stat(db + suffix).st_size
        except OSError:
            pass
    if save:
        save_as_found(db, save, res)
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


def save_as_found(db, save, res):
    """The files as the remount left them, before SQLite rolls back a hot
    journal or checkpoints the WAL (kept with a failing round)."""
    os.makedirs(save, exist_ok=True)
    for suffix in ("", "-journal", "-wal"):
        try:
            shutil.copyfile(db + suffix, os.path.join(save, os.path.basename(db) + suffix))
        except OSError as e:
            if e.errno != errno.ENOENT:
                res["copy_error"] = f"copying {db + suffix}: {e}"
    res["file_only"] = read_file_only(os.path.join(save, os.path.basename(db)))


def read_file_only(copy):
    """The database file alone, as if there were no journal or WAL: tells
    a lost write of the file from a journal that came back."""
    try:
        con = sqlite3.connect(f"file:{copy}?immutable=1", uri=True)
        row = con.execute("SELECT count(*), max(id) FROM t").fetchone()
        out = {"count": row[0], "max_id": row[1]}
        con.close()
        return out
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}


def fill_file(path, nbytes, out_path):
    """Writes nbytes of incompressible data to path (or until ENOSPC);
    writes how much (JSON) to out_path."""
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
