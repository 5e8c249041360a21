"""Where a workload's CPU goes, by process, on a machine whose two cores
everything shares (issue 57): the OSDs, the client (Canopy's daemon or
`rbd`), the program doing the I/O (`dd`) and what the whole machine did.
A workload bound by CPU runs only as fast as the sum of these allows, so
these figures say what a faster client could still gain."""

import os
import resource
import time

HZ = os.sysconf("SC_CLK_TCK")


def machine_ticks():
    """/proc/stat's first line: user, nice, system, idle, iowait, irq,
    softirq, steal, in ticks."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


def process_seconds():
    """CPU seconds by command name, each process's threads (living and
    exited) summed, as /proc/PID/stat counts them."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                s = f.read()
        except OSError:
            continue  # gone meanwhile
        name = s[s.index("(") + 1:s.rindex(")")]
        fields = s[s.rindex(")") + 2:].split()
        out[(int(pid), name)] = (int(fields[11]) + int(fields[12])) / HZ
    return out


def children_seconds():
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


class Meter:
    """CPU seconds spent between `start` and `stop`: by each process alive
    at both ends (by command name), by the children this script waited for
    meanwhile (`dd`, `rbd bench`), and the machine's busy and idle time."""

    def start(self):
        self.t0 = time.monotonic()
        self.procs0, self.children0, self.ticks0 = (process_seconds(), children_seconds(),
                                                     machine_ticks())
        return self

    def stop(self):
        wall = time.monotonic() - self.t0
        procs, ticks = process_seconds(), machine_ticks()
        by_name = {}
        for key, secs in procs.items():
            if key in self.procs0:
                by_name[key[1]] = by_name.get(key[1], 0.0) + secs - self.procs0[key]
        d = [b - a for a, b in zip(self.ticks0, ticks)]
        total = max(sum(d), 1)
        idle = (d[3] + d[4]) / total
        return {
            "wall_s": wall,
            "by_name": by_name,
            "children_s": children_seconds() - self.children0,
            "idle": idle,
            # Every core's busy time: user, system, interrupts, all of it.
            "busy_s": (total - d[3] - d[4]) / HZ,
        }


def named(usage, prefix):
    """CPU seconds of the processes whose command starts with `prefix`
    (the kernel keeps the first 15 bytes of a name)."""
    return sum(s for n, s in usage["by_name"].items() if n.startswith(prefix[:15]))
