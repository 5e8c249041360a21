"""Processes and mounts. Everything the campaign starts is registered in
REG, so that an exception or Ctrl-C anywhere leaves no daemon, database or
mount behind."""

import os
import signal
import subprocess
import tempfile


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
        rc = _run_to_file(cmd, timeout, out_path, kw)
        with open(out_path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        if rc is None:
            text += f"\n(timed out after {timeout} s)"
        return rc, text
    finally:
        if own:
            os.unlink(out_path)


def _run_to_file(cmd, timeout, out_path, kw):
    """Exit status of cmd (output to out_path), None on timeout."""
    with open(out_path, "wb") as out:
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                             stderr=subprocess.STDOUT,
                             start_new_session=True, **kw)
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group_wait(p)
        return None
    except BaseException:
        kill_group_wait(p)
        raise


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
