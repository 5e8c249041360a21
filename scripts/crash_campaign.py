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

With --power-cut the crash is a power cut instead: the daemon runs over a
device that journals what each write overwrites until a barrier covers it,
and after the daemon dies (at a random moment, or exactly at a barrier
before its flush) every unflushed write is lost, or a random version of
each sector written since the last barrier (crashcamp/crash.py). With
--barriers ignored, barriers flush nothing: the negative control, which
must fail.

Examples:
    python3 scripts/crash_campaign.py --client sqlite-rollback --rounds 3 --size 4G
    python3 scripts/crash_campaign.py --client postgres --size 512M --fill 0.85 --json out.json
    python3 scripts/crash_campaign.py --cycles 1 --rounds 10 -v     # one crash per image
    python3 scripts/crash_campaign.py --power-cut mixed --size 512M --rounds 2
    python3 scripts/crash_campaign.py --power-cut all --barriers ignored --size 512M  # must fail
"""

# The code is in crashcamp/ next to this file (crashcamp/__init__.py says
# which module holds what); this file stays the entry point, and the campaign
# re-invokes it for its helper processes (crashcamp/helpers.py).

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from crashcamp import cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli.main())
