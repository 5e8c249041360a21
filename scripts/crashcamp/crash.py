"""How a round's crash happens: the one place that decides it.

Round.crash() hands the crash to the method for_args() picked; everything
around it stays the same whatever the method: before the crash the round
has noted the client's status and how far the logs got, after it the round
remounts the image (the daemon replays its fsync log), verifies every
acknowledged id and the database, and in the end scrubs and checks.

Two methods:

- KillDaemon: kill -9 of the Canopy daemon. Nothing the daemon wrote is
  lost (the host's page cache keeps it), so this tests the fsync log and
  the commit's order of writes, never where the barriers are.
- PowerCut (--power-cut): the daemon runs over the power-cut device
  (src/dev/powercut.rs), which journals what every write overwrites until
  a barrier covers it. The cut kills the daemon, at a random moment or
  exactly at a barrier (the device dies there, before flushing, when the
  trigger file exists), then `power_cut` (examples/power_cut.rs) puts
  back every unflushed write (loss "all") or any version of each sector
  (loss "sectors"): what a disk that lost its volatile cache may hold.
  With --barriers ignored the device's barriers do nothing: the negative
  control, which must lose acknowledged commits.

What a method may use from the round:

  rd.daemon         the running Daemon (daemon.py): .kill9(), .p (its Popen)
  rd.img, rd.mnt    the image the round made and its mount point
  rd.kill_client_and_database(), rd.detach_dead_mount()
  rd.rng            the round's random generator (reproducible by seed)
  rd.r["notes"], rd.fail(why)   what the round reports
"""

import os
import time

from .common import log
from .procs import run

# How long a cut at a barrier waits for the daemon's next barrier before
# it cuts anyway (a quiet client may not commit for a while).
BARRIER_WAIT_SECS = 15.0


class KillDaemon:
    """kill -9 of the daemon, then of the client and the database, then
    the dead mount is detached."""

    def daemon_env(self, rd):
        return {}

    def crash(self, rd):
        rd.daemon.kill9()
        rd.kill_client_and_database()
        rd.detach_dead_mount()


class PowerCut:
    """The power goes: the daemon dies (at a random moment or at a
    barrier), then the writes no barrier covered are lost."""

    def __init__(self, args):
        self.loss = args.power_cut  # all, sectors or mixed
        self.at = args.cut_at  # time, barrier or mixed
        self.sector = args.sector
        self.barriers = args.barriers
        self.tool = args.power_cut_bin

    @staticmethod
    def journal(rd):
        return rd.p("powercut.journal")

    @staticmethod
    def trigger(rd):
        return rd.p("powercut.trigger")

    def daemon_env(self, rd):
        return {"CANOPY_POWERCUT_JOURNAL": self.journal(rd),
                "CANOPY_POWERCUT_TRIGGER": self.trigger(rd),
                "CANOPY_POWERCUT_BARRIERS": self.barriers}

    def crash(self, rd):
        at = self.pick(rd, self.at, ("time", "barrier"))
        loss = self.pick(rd, self.loss, ("all", "sectors"))
        how = self.kill_at_barrier(rd) if at == "barrier" else self.kill_now(rd)
        rd.kill_client_and_database()
        rd.detach_dead_mount()
        self.lose_unflushed(rd, loss, how)

    @staticmethod
    def pick(rd, choice, kinds):
        return rd.rng.choice(kinds) if choice == "mixed" else choice

    @staticmethod
    def kill_now(rd):
        rd.daemon.kill9()
        return "at a random moment"

    def kill_at_barrier(self, rd):
        """Arms the trigger; the daemon kills itself at its next barrier.
        Returns how the cut came."""
        with open(self.trigger(rd), "w"):
            pass
        deadline = time.monotonic() + BARRIER_WAIT_SECS
        while rd.daemon.alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.unlink(self.trigger(rd))
        if rd.daemon.alive():
            rd.daemon.kill9()
            return f"at a random moment (no barrier within {BARRIER_WAIT_SECS:g} s)"
        rd.daemon.kill9()  # reaps it and forgets it
        return "at a barrier"

    def lose_unflushed(self, rd, loss, how):
        """Each device loses its own unflushed writes (the mounted image's
        journal, then PATH.2, PATH.3, ... for the others), independently:
        separate disks, each with its own cache."""
        whats = []
        for nth, img in enumerate([rd.img, *rd.others], start=1):
            journal = self.journal(rd) + (f".{nth}" if nth > 1 else "")
            cmd = [self.tool, img, journal]
            if loss == "sectors":
                cmd += ["sectors", str(self.sector), str(rd.rng.randrange(1, 1 << 62))]
            else:
                cmd += ["all"]
            rc, out = run(cmd, timeout=300)
            if rc != 0:
                raise RuntimeError(f"power_cut failed on device {nth}: {out.strip()}")
            what = out.strip().splitlines()[-1] if out.strip() else ""
            whats.append(what if not rd.others else f"device {nth}: {what}")
        what = "; ".join(whats)
        note = f"power cut {how}, loss {loss}: {what}"
        rd.r.setdefault("cuts", []).append({"at": how, "loss": loss, "journal": what})
        rd.r["notes"].append(note)
        log(f"{rd.name}: {note}")


def for_args(args):
    """The crash method of a campaign run with args."""
    if args.power_cut:
        return PowerCut(args)
    return KillDaemon()
