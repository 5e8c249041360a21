"""The Canopy daemon of one mount: `canopy mount -f IMG MNT` started as our
own child, so that its pid is exactly the daemon's (kill9() kills the
daemon, nothing else) and its log (stderr) goes to a file."""

import os
import signal
import subprocess
import time

from .common import tail
from .procs import REG, is_mounted, kill_wait, lazy_unmount, run


class Daemon:
    def __init__(self, canopy, img, mnt, log_path, opts="", env=None):
        self.canopy, self.img, self.mnt, self.log_path = canopy, img, mnt, log_path
        self.opts = opts
        # Added to the daemon's environment (the power-cut device's settings).
        self.env = dict(os.environ, **(env or {}))
        self.p = None

    def command(self):
        cmd = [self.canopy, "mount", "-f"]
        if self.opts:
            cmd += ["-o", self.opts]
        return cmd + [self.img, self.mnt]

    def start(self, timeout=60):
        """Returns None once mounted, or the error text."""
        with open(self.log_path, "ab") as out:
            self.p = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=out,
                                      stderr=subprocess.STDOUT, env=self.env,
                                      start_new_session=True)
        REG.daemons.append(self.p)
        REG.mounts.append(self.mnt)
        return self._wait_mounted(timeout)

    def _wait_mounted(self, timeout):
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
        """SIGKILL of the daemon (the crash of crash.KillDaemon, and the
        last resort of every cleanup); returns its exit status."""
        rc = kill_wait(self.p, signal.SIGKILL)
        self.forget()
        return rc

    def unmount(self, timeout=30):
        """Clean unmount; returns (ok, daemon exit status, message)."""
        rc, msg = self._umount()
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

    def _umount(self):
        """`umount MNT`, retried while busy; returns (status, message)."""
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
        return rc, msg
