"""The workloads of the seed mails, each run on one freshly made filesystem.

A workload returns samples: (metric, value, unit, better) where better is
"higher" or "lower". `scale` shrinks (or grows) sizes and counts; 1.0 is the
size of the mails where that is practical on these machines.
"""

import hashlib
import json
import os
import random
import re
import subprocess
import time

from .fs import CANOPY, drop_caches, sh

MIB = 1 << 20
GIB = 1 << 30
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def timed(cmd):
    """Wall seconds of a shell command."""
    t0 = time.perf_counter()
    sh(cmd, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def out(cmd):
    return sh(cmd, capture_output=True, text=True).stdout


# -- 1. seek hole/data (002) ---------------------------------------------

def seek(fs, scale):
    """A file of many 128 KiB extents with a 1 MiB hole near the end; times
    `xfs_io seek -h 0` cold and warm and `seek -d` from inside the hole.

    The mail gets 131073 extents from btrfs compression (16 GiB in 128 KiB
    compressed extents). Canopy does not compress yet: it gets one extent
    per 128 KiB write by mounting with dirty_limit=4K, so each write is
    flushed (given its own extent) before the next one is buffered. btrfs is
    mounted compress=lzo as in the mail; XFS and ext4 lay the file out in
    whatever extents they choose (the extent count is reported)."""
    size = max(64 * MIB, int(16 * GIB * scale)) // MIB * MIB
    opts = {"canopy": "dirty_limit=4K", "btrfs": "compress=lzo"}.get(fs.name, "")
    fs.make(opts)
    f = fs.path("foobar")
    sh(f"xfs_io -f -c 'pwrite -S 0xab -b 128K 0 {size}' '{f}'", stdout=subprocess.DEVNULL)
    hole = size - size // 16
    sh(f"xfs_io -c 'fpunch {hole} 1M' '{f}'")
    fs.remount_cold()
    cold = timed(f"xfs_io -c 'seek -h 0' '{f}'")
    warm = timed(f"xfs_io -c 'seek -h 0' '{f}'")
    data = timed(f"xfs_io -c 'seek -d {hole + 4096}' '{f}'")
    found = out(f"xfs_io -c 'seek -h 0' '{f}'")
    if str(hole) not in found:
        raise RuntimeError(f"{fs.name}: seek -h 0 did not find the hole at {hole}: {found}")
    samples = [
        ("seek -h 0, cold (ms)", cold * 1000, "ms", "lower"),
        ("seek -h 0, warm (ms)", warm * 1000, "ms", "lower"),
        ("seek -d from the hole (ms)", data * 1000, "ms", "lower"),
    ]
    extents = extent_count(fs, f, size)
    if extents is not None:
        samples.append(("extents in the file", extents, "", "info"))
    fs.umount()
    return samples


def extent_count(fs, path, size):
    if fs.kernel:
        m = re.search(r"(\d+) extents? found", out(f"filefrag '{path}'"))
        return int(m.group(1)) if m else None
    if fs.name == "canopy":
        # By construction: one per 128 KiB write, less the punched MiB.
        return size // (128 << 10) - 8
    return None


# -- 2. rename after an unrelated fsync (003) ----------------------------

def rename(fs, scale):
    """The mail's script: N empty files (their creation timed too), sync,
    an fsync of an unrelated file, one more file, then rename all N, with
    one `mv` per file and with one process calling rename(2)."""
    samples = []
    for n in sorted({max(100, int(n * scale)) for n in (1000, 10000)}):
        for how in ("mv", "rename(2)"):
            fs.make()
            d = fs.path("testdir")
            os.mkdir(d)
            t0 = time.perf_counter()
            for i in range(1, n + 1):
                open(os.path.join(d, f"file_{i}"), "w").close()
            if how == "mv":
                samples.append((f"{n} creates (s)", time.perf_counter() - t0, "s", "lower"))
            sh("sync")
            sh(f"xfs_io -f -c 'pwrite 0 4K' -c fsync '{fs.path('foo')}'",
               stdout=subprocess.DEVNULL)
            open(os.path.join(d, f"file_{n + 1}"), "w").close()
            if how == "mv":
                t = timed(f"for ((i = 1; i <= {n}; i++)); do "
                          f"mv '{d}'/file_$i '{d}'/file_$i-RPMDELETE; done")
            else:
                t0 = time.perf_counter()
                for i in range(1, n + 1):
                    os.rename(os.path.join(d, f"file_{i}"),
                              os.path.join(d, f"file_{i}-RPMDELETE"))
                t = time.perf_counter() - t0
            samples.append((f"{n} renames, {how} (s)", t, "s", "lower"))
            fs.umount()
    return samples


# -- 3. dbench ------------------------------------------------------------

def dbench(fs, scale):
    clients = os.cpu_count() or 2
    secs = max(10, int(60 * scale))
    fs.make()
    text = out(f"dbench -D '{fs.mnt}' -t {secs} {clients} 2>/dev/null")
    fs.umount()
    m = re.search(r"Throughput ([\d.]+) MB/sec.*max_latency=([\d.]+) ms", text)
    if not m:
        raise RuntimeError(f"{fs.name}: no dbench throughput in output")
    samples = [
        (f"dbench {clients} clients, throughput (MB/s)", float(m.group(1)), "MB/s", "higher"),
        ("dbench max latency (ms)", float(m.group(2)), "ms", "lower"),
    ]
    for op in ("Rename", "Flush"):
        r = re.search(rf"^\s*{op}\s+(\d+)\s+([\d.]+)\s+([\d.]+)", text, re.M)
        if r:
            samples.append((f"dbench {op} avg latency (ms)", float(r.group(2)), "ms", "lower"))
            samples.append((f"dbench {op} max latency (ms)", float(r.group(3)), "ms", "lower"))
    return samples


# -- 4. writes under a low dirty limit (001) ------------------------------

DIRTY_KEYS = ("dirty_bytes", "dirty_background_bytes", "dirty_ratio",
              "dirty_background_ratio")


def read_dirty_settings():
    return {k: open(f"/proc/sys/vm/{k}").read().strip() for k in DIRTY_KEYS}


def restore_dirty_settings(saved):
    # Ratios and bytes exclude each other: writing one zeroes the other,
    # so write back whichever of each pair was in force.
    for pair in (("dirty_bytes", "dirty_ratio"),
                 ("dirty_background_bytes", "dirty_background_ratio")):
        key = pair[0] if saved[pair[0]] != "0" else pair[1]
        with open(f"/proc/sys/vm/{key}", "w") as f:
            f.write(saved[key] + "\n")


def set_dirty_limit(limit):
    with open("/proc/sys/vm/dirty_bytes", "w") as f:
        f.write(f"{limit}\n")
    with open("/proc/sys/vm/dirty_background_bytes", "w") as f:
        f.write(f"{max(limit // 2, 4096)}\n")


def dirty(fs, scale):
    """1 and 10 concurrent dd writers with the dirty limit at 1, 10, 100 and
    1000 MB (vm.dirty_bytes; Canopy also gets dirty_limit= of the same
    size, and canopy-wbc, mounted with writeback_cache, is throttled by
    the kernel as the kernel filesystems are). The caller restores the
    host's vm.dirty_* settings."""
    total = max(64 * MIB, int(4 * GIB * scale))
    samples = []
    for limit_mb in (1, 10, 100, 1000):
        limit = limit_mb * 1000 * 1000
        for writers in (1, 10):
            opts = f"dirty_limit={limit}" if fs.name.startswith("canopy") else ""
            fs.make(opts)
            set_dirty_limit(limit)
            each = max(1, total // writers // MIB)
            t0 = time.perf_counter()
            procs = [subprocess.Popen(
                ["dd", "if=/dev/zero", f"of={fs.path(f'w{i}')}", "bs=1M",
                 f"count={each}", "conv=fsync", "status=none"]) for i in range(writers)]
            for p in procs:
                if p.wait() != 0:
                    raise RuntimeError(f"{fs.name}: dd failed")
            t = time.perf_counter() - t0
            samples.append((f"{writers} writer(s), dirty {limit_mb} MB (MB/s)",
                            each * writers / t, "MB/s", "higher"))
            fs.umount()
    return samples


# -- 5. concurrent write+fsync of random-size files (004) -----------------

def commit(fs):
    """Makes frees visible to statfs: fsync of the mount's root directory
    (a commit on Canopy: the kernel does not pass syncfs on to FUSE
    daemons), then syncfs for the kernel filesystems."""
    if fs.name == "canopy":
        # fsync makes only its own file durable (the log tree); syncfs
        # does not reach FUSE daemons: ask the daemon to commit.
        sh(f"'{CANOPY}' sync '{fs.mnt}'")
        return
    if fs.name == "passthrough_hp":
        # syncfs of the FUSE mount writes the kernel's cached pages back
        # to the daemon (writeback cache); that of the ext4 under it makes
        # them durable.
        sh(f"sync -f '{fs.mnt}' && sync -f '{fs.lower}'")
        return
    sh(f"sync -f '{fs.mnt}'")


def fill_random(fs, writers, stop_at, max_size, rng):
    """Writers write and fsync files of log-uniform sizes in [4 KiB,
    max_size] until the filesystem is `stop_at` full. Returns bytes."""
    script = f"""
import os, random, sys
rng = random.Random({rng.randrange(1 << 30)} + int(sys.argv[1]))
buf = os.urandom(1 << 20)
written, i = 0, 0
while True:
    st = os.statvfs({fs.mnt!r})
    if 1 - st.f_bavail / st.f_blocks >= {stop_at}:
        break
    size = int(2 ** rng.uniform(12, {max_size.bit_length() - 1}))
    path = os.path.join({fs.mnt!r}, "r%s-%d" % (sys.argv[1], i))
    try:
        with open(path, "wb") as f:
            left = size
            while left:
                n = min(left, len(buf))
                f.write(buf[:n])
                left -= n
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        break
    written += size
    i += 1
print(written)
"""
    procs = [subprocess.Popen(["python3", "-c", script, str(w)], stdout=subprocess.PIPE,
                              text=True) for w in range(writers)]
    return sum(int(p.communicate()[0].strip() or 0) for p in procs)


def fsync_random(fs, scale):
    """Writers writing and fsyncing files of 4 KiB–64 MiB until 70% full, on
    a clean filesystem and on one fragmented first (filled to 90%, then
    random files deleted back to about 45%)."""
    rng = random.Random(4)
    writers = 4
    max_size = max(1 * MIB, int(64 * MIB * scale))
    samples = []
    for state in ("clean", "fragmented"):
        fs.make()
        if state == "fragmented":
            fill_random(fs, writers, 0.9, max_size, rng)
            files = sorted(n for n in os.listdir(fs.mnt) if n.startswith("r"))
            rng.shuffle(files)
            for name in files[: len(files) // 2]:
                os.remove(fs.path(name))
            # The second fill names its files as the first did.
            for name in files[len(files) // 2:]:
                os.rename(fs.path(name), fs.path("old-" + name))
            commit(fs)
        t0 = time.perf_counter()
        written = fill_random(fs, writers, 0.7, max_size, rng)
        t = time.perf_counter() - t0
        samples.append((f"{state}: write+fsync to 70% (MB/s)", written / MIB / t, "MB/s", "higher"))
        if fs.kernel:
            counts = []
            for name in os.listdir(fs.mnt)[:200]:
                m = re.search(r"(\d+) extents? found", out(f"filefrag '{fs.path(name)}'"))
                if m:
                    counts.append(int(m.group(1)))
            if counts:
                samples.append((f"{state}: extents per file (mean)", sum(counts) / len(counts),
                                "", "info"))
        locality = xfs_locality(fs) if fs.name == "xfs" else None
        fs.umount()
        if fs.name == "canopy":
            locality = canopy_locality(fs)
        if locality is not None:
            median, switched, total = locality
            samples.append((f"{state}: median distance from the allocation hint (KiB)",
                            median / 1024 if median is not None else float("inf"), "KiB", "lower"))
            samples.append((f"{state}: extents in another group than their hint (%)",
                            100 * switched / max(total, 1), "%", "lower"))
        if fs.name == "canopy":
            per_file = canopy_extent_items(fs)
            if per_file:
                samples.append((f"{state}: extents per file (mean)",
                                sum(per_file) / len(per_file), "", "info"))
        hist = free_space_histogram(fs)
        if hist is not None:
            samples.append((f"{state}: free-space extents", sum(n for _, n in hist), "", "info"))
            small = sum(n for low, n in hist if low < 256)  # under 1 MiB
            samples.append((f"{state}: free-space extents under 1 MiB", small, "", "info"))
    return samples


def median_distance(distances, switched):
    """The median of `distances` with `switched` extents counted as
    farthest (None when that median is a switch)."""
    ranked = sorted(distances) + [None] * switched
    return ranked[len(ranked) // 2] if ranked else None


def canopy_locality(fs):
    """(median distance in bytes, extents in another group, extents with a
    hint) from `canopy inspect frag` (seed mail 004's locality histogram;
    the hint: the file's previous extent; a first extent, placed by size,
    is measured from the data of the inode before it)."""
    r = json.loads(out(f"'{CANOPY}' inspect frag --json '{fs.image}'"))
    total = sum(b["count"] for b in r["locality"])
    median = r["median_distance"]
    return (None if median in (None, 2**64 - 1) else median, r["switched_group"], total)


def xfs_locality(fs, max_files=500):
    """The same for a mounted XFS, from `xfs_bmap -v`: each extent's
    distance from the end of the file's previous extent, or for a first
    extent from the file's inode (XFS's own hints), AG changes apart."""
    info = out(f"xfs_info '{fs.mnt}'")
    agsize = int(re.search(r"agsize=(\d+)", info).group(1))
    bsize = int(re.search(r"bsize=(\d+)", info).group(1))
    isize = int(re.search(r"isize=(\d+)", info).group(1))
    agblklog = (agsize - 1).bit_length()
    inopblog = (bsize // isize).bit_length() - 1
    sectors = bsize // 512
    distances, switched = [], 0
    for name in sorted(os.listdir(fs.mnt))[:max_files]:
        ino = os.stat(fs.path(name)).st_ino
        agno = ino >> (agblklog + inopblog)
        agbno = (ino & ((1 << (agblklog + inopblog)) - 1)) >> inopblog
        hint, hint_ag = (agno * agsize + agbno) * sectors, agno
        for line in out(f"xfs_bmap -v '{fs.path(name)}'").splitlines():
            m = re.match(r"\s*\d+: \[\d+\.\.\d+\]:\s+(\d+)\.\.(\d+)\s+(\d+) ", line)
            if not m:
                continue
            start, end, ag = int(m.group(1)), int(m.group(2)), int(m.group(3))
            if ag != hint_ag:
                switched += 1
            else:
                distances.append(abs(start - hint) * 512)
            hint, hint_ag = end + 1, ag
    return (median_distance(distances, switched), switched, len(distances) + switched)


def canopy_extent_items(fs):
    """Extent items (EXTENT_DATA, not inline) of each file of an unmounted
    Canopy image. Canopy caps an extent at 2 MiB, so a 64 MiB file has at
    least 32 even when laid out contiguously; filefrag, used for the kernel
    filesystems, merges physically adjacent extents."""
    counts = {}
    for line in out(f"'{CANOPY}' inspect dump-tree --tree 5 '{fs.image}'").splitlines():
        m = re.match(r"key \((\d+) 108 \d+\) size (\d+)", line)
        if m and int(m.group(2)) > 40:
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return list(counts.values())


def free_space_histogram(fs):
    """[(bucket low in 4 KiB sectors or blocks, extents)] of an unmounted
    image, where the filesystem offers one (Canopy, XFS)."""
    if fs.name == "canopy":
        text = out(f"'{CANOPY}' inspect freesp '{fs.image}'")
    elif fs.name == "xfs":
        text = out(f"xfs_db -r -c 'freesp' '{fs.image}'")
    else:
        return None
    rows = []
    for line in text.splitlines():
        cols = line.split()
        if len(cols) >= 3 and cols[0].isdigit() and cols[2].isdigit():
            rows.append((int(cols[0]), int(cols[2])))
    return rows


# -- 6. everyday work -------------------------------------------------------

# The tree everyday copies when not the one its scale picks (run.py
# --everyday-src), e.g. a smaller one where a driver cannot hold more files.
EVERYDAY_SOURCE = None


def everyday(fs, scale):
    """cp -a of real files (timed alone and with the commit after it),
    find, du and tar of them cold, a git clone of a local repository (a
    snapshot of Canopy's own, taken once per run) with its commit, rm -rf
    with its commit; sequential write and cold read. Cold: unmounted, page
    cache dropped, mounted again. Commit: `canopy sync` on Canopy, syncfs
    of the FUSE mount and of the ext4 under it on passthrough_hp, syncfs
    elsewhere (issue 54's step list)."""
    src = EVERYDAY_SOURCE or ("/usr" if scale >= 0.5 else "/usr/share")
    fs.make()
    t0 = time.perf_counter()
    sh(f"cp -a {src} '{fs.path('tree')}'")
    copied = time.perf_counter() - t0
    commit(fs)
    samples = [("cp -a " + src + " (s)", copied, "s", "lower"),
               ("cp -a " + src + " + sync (s)", time.perf_counter() - t0, "s", "lower")]
    fs.remount_cold()
    samples.append(("find, cold (s)", timed(f"find '{fs.path('tree')}' | wc -l"), "s", "lower"))
    fs.remount_cold()
    samples.append(("du -s, cold (s)", timed(f"du -s '{fs.path('tree')}'"), "s", "lower"))
    fs.remount_cold()
    # Through a pipe: GNU tar skips reading file data when writing to
    # /dev/null itself.
    samples.append(("tar out, cold (s)",
                    timed(f"tar cf - -C '{fs.mnt}' tree | cat > /dev/null"), "s", "lower"))
    samples.append(("git clone of a local repository + sync (s)", git_clone(fs), "s", "lower"))
    t0 = time.perf_counter()
    sh(f"rm -rf '{fs.path('tree')}'")
    commit(fs)
    samples.append(("rm -rf, then commit (s)", time.perf_counter() - t0, "s", "lower"))
    size_mb = max(64, int(4096 * scale))
    t = timed(f"dd if=/dev/zero of='{fs.path('big')}' bs=1M count={size_mb} conv=fsync status=none")
    samples.append((f"seq write {size_mb} MiB (MB/s)", size_mb / t, "MB/s", "higher"))
    fs.remount_cold()
    t = timed(f"dd if='{fs.path('big')}' of=/dev/null bs=1M status=none")
    samples.append((f"seq read {size_mb} MiB, cold (MB/s)", size_mb / t, "MB/s", "higher"))
    fs.umount()
    return samples


# The repository every git clone of a run copies: a snapshot of Canopy's
# own taken at the first clone, so that commits made meanwhile do not
# change the work between rounds or filesystems.
_clone_source = {}


def clone_source(work):
    """A bare copy of Canopy's repository in `work`, made once per run."""
    if "path" not in _clone_source:
        path = os.path.join(work, "everyday-clone-source.git")
        sh(f"rm -rf '{path}' && git clone -q --bare --no-hardlinks '{ROOT}' '{path}'")
        _clone_source["path"] = path
    return _clone_source["path"]


def git_clone(fs):
    """Seconds of `git clone` of a local repository onto the mount
    (objects copied, not hard-linked: another filesystem) and the commit
    after it."""
    source = clone_source(os.path.dirname(fs.image))
    t0 = time.perf_counter()
    sh(f"git clone -q --no-hardlinks '{source}' '{fs.path('clone')}'")
    commit(fs)
    return time.perf_counter() - t0


# -- 7. quota groups and balance (000) ------------------------------------

def qgroups(fs, scale):
    """Canopy and btrfs, seed 000: a subvolume of real files (/usr/share,
    /usr/include and /usr/bin: 1.1 GiB, 55k files at scale >= 0.5;
    /usr/share/doc below), then snapshots of it with 3 files changed after
    each, and a metadata balance at 16 and at 64 snapshots, once with
    quotas on and once off, with `ls` of a 200-entry directory every 2 ms
    while it runs. Qgroup numbers and a sample of file contents must be the
    same after each balance; the change of used bytes is reported. The commit of 3 changed files (median of 15) is timed with 1
    and with 64 snapshots: accounting must not cost more as snapshots are
    added."""
    q = quota_cmds(fs)
    if q is None:
        return []
    samples = []
    srcs = ("/usr/share /usr/include /usr/bin" if scale >= 0.5 else "/usr/share/doc")
    for quotas in ("on", "off"):
        rng = random.Random(0)
        fs.make()
        sub = fs.path("sub")
        sh(f"{q['subvol']} create '{sub}'")
        os.makedirs(os.path.join(sub, "tree"))
        sh(f"cp -a {srcs} '{sub}/tree/'")
        lsdir = fs.path("lsdir")
        make_files(lsdir, 200)
        files = out(f"find '{sub}' -type f").split("\n")[:-1]
        sample = rng.sample(files, min(200, len(files)))
        if quotas == "on":
            sh(f"{q['enable']} '{fs.mnt}'")
        taken = []

        def change():
            append_to(rng.sample(files, 3))

        for goal in (1, 16, 64):
            while len(taken) < goal:
                taken.append(fs.path(f"snap-{len(taken)}"))
                sh(f"{q['subvol']} snapshot '{sub}' '{taken[-1]}'")
                change()
            if goal in (1, 64):
                samples.append((f"commit of 3 changed files, {goal} snapshots, quotas {quotas}, "
                                "median (ms)", commit_cost(q["sync"], change), "ms", "lower"))
            if goal == 1:
                continue
            before = state(fs, q, quotas, sub, taken, sample)
            t, lat = balance_with_ls(f"{q['balance']} '{fs.mnt}'", lsdir)
            after = state(fs, q, quotas, sub, taken, sample)
            for what, b, a in (("qgroup numbers", before[0], after[0]),
                               ("file contents", before[2], after[2])):
                if b != a:
                    raise RuntimeError(f"{fs.name}: {what} changed across balance:\n{b}\n{a}")
            samples.append((f"{goal} snapshots, metadata balance, quotas {quotas} (s)",
                            t, "s", "lower"))
            samples.append((f"{goal} snapshots, ls during balance, quotas {quotas}, p99 (ms)",
                            lat[int(len(lat) * 0.99)] if lat else 0, "ms", "lower"))
            samples.append((f"{goal} snapshots, used bytes change across balance, quotas "
                            f"{quotas} (KiB)", (after[1] - before[1]) / 1024, "KiB", "lower"))
        fs.umount()
    return samples


def quota_cmds(fs):
    """Commands of Canopy or btrfs for the qgroups workload (None for
    others)."""
    if fs.name == "canopy":
        c = f"'{CANOPY}'"
        return {"subvol": f"{c} subvolume", "enable": f"{c} quota enable",
                "show": f"{c} qgroup show --raw", "balance": f"{c} balance start -m",
                "sync": f"{c} sync '{fs.mnt}'"}
    if fs.name == "btrfs":
        # Enabling starts a rescan; waiting for it makes the numbers exact.
        return {"subvol": "btrfs -q subvolume",
                "enable": "f() { btrfs quota enable \"$1\" && btrfs quota rescan -w \"$1\" "
                          ">/dev/null; }; f",
                "show": "btrfs qgroup show --raw", "balance": "btrfs balance start -m",
                "sync": "sync"}
    return None


def balance_with_ls(cmd, lsdir):
    """Runs a balance command; its seconds, and the latencies (ms) of
    listing a 200-entry directory every 2 ms meanwhile, sorted."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, shell=True, executable="/bin/bash", stdout=subprocess.DEVNULL)
    lat = list_while(lsdir, lambda: p.poll() is None)
    t = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"balance failed: {cmd}")
    lat.sort()
    return t, lat


def append_to(paths):
    for f in paths:
        with open(f, "ab") as fh:
            fh.write(os.urandom(4096))


def commit_cost(sync, change, rounds=15):
    """Median milliseconds of committing after `change()`."""
    times = []
    for _ in range(rounds):
        change()
        t0 = time.perf_counter()
        sh(sync)
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return times[len(times) // 2]


def state(fs, q, quotas, sub, snaps, sample):
    """What a balance must not change: qgroup numbers, used bytes and the
    contents of the sampled files in the source and in its first and last
    snapshots (hashed). Read first: reading updates access times, which
    a commit then writes; the numbers are taken after that commit."""
    h = hashlib.sha256()
    for root in (sub, snaps[0], snaps[-1]):
        for f in sample:
            with open(os.path.join(root, os.path.relpath(f, sub)), "rb") as fh:
                h.update(fh.read())
    sh(q["sync"])
    numbers = out(f"{q['show']} '{fs.mnt}'") if quotas == "on" else ""
    st = os.statvfs(fs.mnt)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    return numbers, used, h.hexdigest()


# -- stalls: listing a directory during a large fsync'd write -------------

def list_while(d, busy, then=lambda: None):
    """Latencies (ms) of listing `d` every 2 ms while `busy()`; `then()`
    after each."""
    lat = []
    while busy():
        t = time.perf_counter()
        os.listdir(d)
        lat.append((time.perf_counter() - t) * 1000)
        time.sleep(0.002)
        then()
    return lat


def stall(fs, scale):
    """`ls` of a 200-entry directory every 2 ms while `dd` writes a large
    file with conv=fsync (the issue: a long write or fsync in one process
    must not stall a `stat` or `ls` in another). Reports the listing's
    median, 99th percentile and worst latency, and the write's speed."""
    size_mib = max(256, int(2048 * scale))
    fs.make()
    d = fs.path("dir")
    os.makedirs(d)
    for i in range(200):
        open(os.path.join(d, f"f{i}"), "w").close()
    t0 = time.perf_counter()
    dd = subprocess.Popen(["dd", "if=/dev/zero", f"of={fs.path('big')}", "bs=1M",
                           f"count={size_mib}", "conv=fsync", "status=none"])
    lat = list_while(d, lambda: dd.poll() is None)
    secs = time.perf_counter() - t0
    fs.umount()
    if dd.returncode != 0 or not lat:
        raise RuntimeError(f"{fs.name}: dd failed or no listing ran")
    lat.sort()
    return [
        ("ls during write, median (ms)", lat[len(lat) // 2], "ms", "lower"),
        ("ls during write, p99 (ms)", lat[int(len(lat) * 0.99)], "ms", "lower"),
        ("ls during write, max (ms)", lat[-1], "ms", "lower"),
        (f"write {size_mib} MiB with fsync (MB/s)", size_mib * MIB / 1e6 / secs, "MB/s", "higher"),
    ]


# -- 8. fsync through the log tree (003) -----------------------------------

def fsync_isolated(fs, scale):
    """fsync of a 4 KiB file while another file holds 40 MiB of data
    written but not synced: only the small file should be written (the
    log tree), not everything. Median and worst of 15 rounds, each on
    fresh data."""
    rounds = max(5, int(15 * scale))
    fs.make()
    lat = []
    for r in range(rounds):
        with open(fs.path("bulk"), "wb") as f:
            f.write(os.urandom(1 << 20) * 40)
        fd = os.open(fs.path(f"small{r}"), os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, os.urandom(4096))
        t = time.perf_counter()
        os.fsync(fd)
        lat.append((time.perf_counter() - t) * 1000)
        os.close(fd)
        commit(fs)
    fs.umount()
    lat.sort()
    return [
        ("fsync 4 KiB beside 40 MiB unsynced, median (ms)", lat[len(lat) // 2], "ms", "lower"),
        ("fsync 4 KiB beside 40 MiB unsynced, max (ms)", lat[-1], "ms", "lower"),
    ]


def fsync_beside_stream(fs, scale):
    """Issue 36's shape of seed 003: each round writes 40 MiB to a new
    file and does not sync it (from the second round on the writes cross
    Canopy's dirty limit, so its writeback is running), then fsyncs a
    4 KiB file. Nothing commits between rounds: the fsync must wait only
    for its own file and the log, never for the stream's flush."""
    rounds = max(8, int(15 * scale))
    fs.make()
    chunk = os.urandom(1 << 20)
    lat = []
    fd = os.open(fs.path("small"), os.O_CREAT | os.O_WRONLY, 0o644)
    for r in range(rounds):
        with open(fs.path(f"stream{r}"), "wb") as f:
            for _ in range(40):
                f.write(chunk)
        os.pwrite(fd, os.urandom(4096), 0)
        t = time.perf_counter()
        os.fsync(fd)
        lat.append((time.perf_counter() - t) * 1000)
    os.close(fd)
    fs.umount()
    steady = sorted(lat[1:])
    return [
        ("fsync 4 KiB beside a 40 MiB/round stream, median of rounds 1.. (ms)",
         steady[len(steady) // 2], "ms", "lower"),
        ("fsync 4 KiB beside a 40 MiB/round stream, max (ms)", max(lat), "ms", "lower"),
    ]


def pgbench(fs, scale):
    """PostgreSQL on the mount: initdb, `pgbench -i -s 20`, then
    `pgbench -c 4 -j 2 -T 60` (the issue's settings at scale 1). Reports
    the initialisation time and the transactions per second."""
    secs = max(15, int(60 * scale))
    fs.make()
    data = fs.path("pg")
    sock = "/tmp"
    port = 5439
    os.makedirs(data)
    sh(f"chown postgres: '{data}'")
    su = "runuser -u postgres --"
    sh(f"{su} initdb -D '{data}' -A trust", stdout=subprocess.DEVNULL)
    sh(f"{su} pg_ctl -D '{data}' -o '-p {port} -k {sock}' -l '{data}/log' -w start",
       stdout=subprocess.DEVNULL)
    try:
        conn = f"-h {sock} -p {port} -U postgres"
        t_init = timed(f"{su} pgbench {conn} -i -s 20 postgres")
        text = out(f"{su} pgbench {conn} -c 4 -j 2 -T {secs} postgres")
    finally:
        sh(f"{su} pg_ctl -D '{data}' -m fast -w stop", check=False,
           stdout=subprocess.DEVNULL)
    fs.umount()
    m = re.search(r"tps = ([\d.]+)", text)
    if not m:
        raise RuntimeError(f"{fs.name}: no tps in pgbench output")
    return [
        ("pgbench -i -s 20 (s)", t_init, "s", "lower"),
        (f"pgbench 4 clients {secs} s (TPS)", float(m.group(1)), "TPS", "higher"),
    ]


# -- parallel writers: 4 fio jobs against 1 (issue 13) ----------------------

def parallel(fs, scale):
    """fio random 4 KiB writes, each job to its own 256 MiB file, for a
    fixed time with a final fsync: 1 job, then 4 jobs on a fresh image.
    Reports both aggregate throughputs and their ratio (the issue asks
    for 4 jobs >= 1.5x one job)."""
    secs = max(10, int(30 * scale))
    bw = {}
    for jobs in (1, 4):
        fs.make()
        text = out(f"fio --name=w --directory='{fs.mnt}' --ioengine=psync "
                   f"--rw=randwrite --bs=4k --size=256M --numjobs={jobs} "
                   f"--time_based --runtime={secs} --end_fsync=1 "
                   f"--group_reporting --output-format=json")
        fs.umount()
        job = json.loads(text[text.index("{"):])["jobs"][0]
        bw[jobs] = job["write"]["bw_bytes"] / 1e6
    return [
        ("fio randwrite 4k, 1 job (MB/s)", bw[1], "MB/s", "higher"),
        ("fio randwrite 4k, 4 jobs (MB/s)", bw[4], "MB/s", "higher"),
        ("fio 4 jobs / 1 job (x)", bw[4] / bw[1], "x", "higher"),
    ]


# -- the FUSE transport (issue 43) -----------------------------------------

def forced_statx_us(path, n=20000):
    """Microseconds per statx(AT_STATX_FORCE_SYNC) of `path`: one round
    trip to a FUSE daemon each (through ctypes, which adds well under a
    microsecond; tmpfs shows how much)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(256)
    at_fdcwd, force_sync, basic = -100, 0x2000, 0x7FF
    p = path.encode()
    for _ in range(1000):
        libc.statx(at_fdcwd, p, force_sync, basic, buf)
    t0 = time.perf_counter()
    for _ in range(n):
        if libc.statx(at_fdcwd, p, force_sync, basic, buf) != 0:
            raise OSError(ctypes.get_errno(), "statx")
    return (time.perf_counter() - t0) / n * 1e6


def roundtrip(fs, scale):
    """A forced statx round trip; on Canopy once per transport: io_uring,
    /dev/fuse with the default 4 threads and with one."""
    configs = [("", "")]
    if fs.name == "canopy":
        configs = [(" io_uring", "transport=uring"), (" /dev/fuse 4 threads", "transport=dev"),
                   (" /dev/fuse 1 thread", "transport=dev,threads=1")]
    samples = []
    for label, opts in configs:
        fs.make(opts)
        with open(fs.path("f"), "w") as f:
            f.write("x")
        us = forced_statx_us(fs.path("f"), max(5000, int(20000 * scale * 4)))
        samples.append((f"forced statx{label} (us)", us, "us", "lower"))
        fs.umount()
    return samples


def reads(fs, scale):
    """Cold sequential read of one 1 GiB file; then cold reads of 256 MiB
    files, one reader and four at once on four files (aggregate MB/s)."""
    big = max(256, int(1024 * scale * 4))
    fs.make()
    sh(f"dd if=/dev/urandom of='{fs.path('big')}' bs=1M count={big} status=none")
    for i in range(4):
        sh(f"dd if=/dev/urandom of='{fs.path(f'part{i}')}' bs=1M count=256 status=none")
    sh("sync")
    fs.remount_cold()
    t = timed(f"dd if='{fs.path('big')}' of=/dev/null bs=1M status=none")
    samples = [(f"seq read {big} MiB, cold (MB/s)", big / t, "MB/s", "higher")]
    fs.remount_cold()
    one = 256 / timed(f"dd if='{fs.path('part0')}' of=/dev/null bs=1M status=none")
    fs.remount_cold()
    readers = " & ".join(f"dd if='{fs.path(f'part{i}')}' of=/dev/null bs=1M status=none"
                         for i in range(4))
    four = 1024 / timed(f"{readers} & wait")
    fs.umount()
    samples += [("cold read, 1 reader (MB/s)", one, "MB/s", "higher"),
                ("cold read, 4 readers (MB/s)", four, "MB/s", "higher"),
                ("4 readers / 1 reader (x)", four / one, "x", "higher")]
    return samples


# -- subvolumes and snapshots (issue 14) -----------------------------------

def subvol_cmds(fs):
    """The subvolume commands of Canopy or btrfs (None for others)."""
    if fs.name == "canopy":
        return f"'{CANOPY}' subvolume", f"'{CANOPY}' sync '{fs.mnt}'"
    if fs.name == "btrfs":
        return "btrfs -q subvolume", "sync"
    return None, None


def make_files(d, count, start=0):
    """`count` empty files in subdirectories of 1000."""
    for i in range(start, start + count):
        sub = os.path.join(d, f"d{i // 1000}")
        if i % 1000 == 0:
            os.makedirs(sub, exist_ok=True)
        open(os.path.join(sub, f"f{i}"), "w").close()


def snapshot(fs, scale):
    """Canopy and btrfs: snapshot time of a subvolume of N files (100k at
    scale 1) and of the same subvolume grown to 10 N (median of 5 each,
    after a sync); then deleting a 10 N snapshot that shares most of its
    blocks, and one that owns all of them: the command's time, `ls`
    latency while it and its cleaning run, and how long until the
    cleaning is done (`subvolume sync` returns)."""
    cmd, sync = subvol_cmds(fs)
    if cmd is None:
        return []
    n = max(1000, int(100_000 * scale))
    fs.make()
    sub = fs.path("sub")
    sh(f"{cmd} create '{sub}'")
    samples = []
    made = 0
    for size in (n, 10 * n):
        make_files(sub, size - made, made)
        made = size
        # Each snapshot's files differ from the last, so none is free.
        with open(os.path.join(sub, "stamp"), "w") as f:
            f.write(str(size))
        sh(sync)
        times = []
        for i in range(5):
            t = timed(f"{cmd} snapshot '{sub}' '{fs.path(f's{size}-{i}')}'")
            times.append(t * 1000)
        times.sort()
        samples.append((f"snapshot of {size} files, median (ms)", times[2], "ms", "lower"))
    # Delete one of the big snapshots after changing every directory of
    # it, so it holds blocks of its own that its deletion frees.
    victim = fs.path(f"s{10 * n}-0")
    for d in os.listdir(victim):
        if d.startswith("d"):
            open(os.path.join(victim, d, "new"), "w").close()
    sh(sync)
    lsdir = fs.path("lsdir")
    os.makedirs(lsdir)
    make_files(lsdir, 200)
    shared = delete_and_clean(fs, cmd, victim, lsdir)
    # Then make one snapshot the sole owner of all its blocks (delete the
    # source and every other snapshot, and wait for that), and delete it:
    # the cleaner now frees the whole tree.
    last = fs.path(f"s{10 * n}-1")
    for name in sorted(os.listdir(fs.mnt)):
        if name == "sub" or (name.startswith("s") and fs.path(name) != last):
            sh(f"{cmd} delete '{fs.path(name)}'")
    sh(f"{cmd} sync '{fs.mnt}'")
    sh(sync)
    owned = delete_and_clean(fs, cmd, last, lsdir)
    fs.umount()
    rows = []
    for what, (returned, lat, back) in ((f"snapshot of {10 * n} files", shared),
                                        (f"sole owner of {10 * n} files", owned)):
        rows += [
            (f"delete {what}, command (s)", returned, "s", "lower"),
            (f"ls while deleting {what}, p99 (ms)", lat[int(len(lat) * 0.99)] if lat else 0,
             "ms", "lower"),
            (f"delete {what}, until cleaned (s)", back, "s", "lower"),
        ]
    return samples + rows


def delete_and_clean(fs, cmd, victim, lsdir):
    """Deletes subvolume `victim` and waits for `subvolume sync` (the
    cleaner done, the space back), listing `lsdir` every 2 ms throughout.
    Returns (seconds until the delete command returned, sorted listing
    latencies in ms, seconds until the cleaning finished)."""
    t0 = time.perf_counter()
    rm = subprocess.Popen(f"{cmd} delete '{victim}'", shell=True, stdout=subprocess.DEVNULL)
    lat = list_while(lsdir, lambda: rm.poll() is None)
    returned = time.perf_counter() - t0
    if rm.returncode != 0:
        raise RuntimeError(f"{fs.name}: deleting {victim} failed")
    waiter = subprocess.Popen(f"{cmd} sync '{fs.mnt}'", shell=True, stdout=subprocess.DEVNULL)
    lat += list_while(lsdir, lambda: waiter.poll() is None)
    back = time.perf_counter() - t0
    lat.sort()
    return returned, lat, back


# -- many files: creation rate, memory per inode, cold walk (issue 54) ------

def daemon_rss_mib(fs):
    """VmRSS of the filesystem's FUSE daemon in MiB (None: no daemon)."""
    pid = fs.daemon_pid()
    if pid is None:
        return None
    with open(f"/proc/{pid}/status") as f:
        m = re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M)
    return int(m.group(1)) / 1024 if m else None


def create_spread(top, n, dirs):
    """Creates `n` empty files in `dirs` directories under `top`, one
    directory after the other, one open(2) and close(2) each. Returns the
    seconds taken overall, for the first quarter and for the last."""
    per_dir = n // dirs
    os.makedirs(top)
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
    marks = {}
    t0 = time.perf_counter()
    for i in range(n):
        if i in (n // 4, n - n // 4):
            marks[i] = time.perf_counter()
        d = os.path.join(top, f"d{i // per_dir}")
        if i % per_dir == 0:
            os.mkdir(d)
        try:
            os.close(os.open(os.path.join(d, f"f{i}"), flags, 0o644))
        except OSError as e:
            raise RuntimeError(f"create {i + 1} of {n} failed: {e}") from e
    end = time.perf_counter()
    return end - t0, marks[n // 4] - t0, end - marks[n - n // 4]


def many_files(fs, scale):
    """N empty files (1,000,000 at scale 1) in 1,000 directories created
    from Python: creates/s overall and over the first and last quarter
    (does the rate hold as the tree grows?); the FUSE daemon's RSS right
    after them and after drop_caches (the kernel forgets the inodes: FORGET
    reaches the daemon); then, after a commit (not timed), a cold find over
    them."""
    dirs = 1000
    n = max(10 * dirs, int(1_000_000 * scale)) // dirs * dirs
    fs.make()
    total, first, last = create_spread(fs.path("many"), n, dirs)
    quarter = n // 4
    samples = [
        (f"{n} creates in {dirs} directories (creates/s)", n / total, "/s", "higher"),
        ("creates/s, first quarter", quarter / first, "/s", "higher"),
        ("creates/s, last quarter", quarter / last, "/s", "higher"),
        ("last quarter's rate / first quarter's (x)", first / last, "x", "info"),
    ]
    rss = daemon_rss_mib(fs)
    if rss is not None:
        samples += [("daemon RSS after the creates (MiB)", rss, "MiB", "lower"),
                    ("daemon RSS per file created (bytes)", rss * MIB / n, "B", "lower")]
        drop_caches()
        time.sleep(1)  # FORGETs are queued; give the daemon a moment
        samples.append(("daemon RSS after drop_caches (MiB)", daemon_rss_mib(fs), "MiB",
                        "lower"))
    commit(fs)
    fs.remount_cold()
    t0 = time.perf_counter()
    found = int(out(f"find '{fs.path('many')}' | wc -l"))
    samples.append((f"find over {n} files, cold (s)", time.perf_counter() - t0, "s", "lower"))
    fs.umount()
    if found != n + dirs + 1:
        raise RuntimeError(f"{fs.name}: find saw {found} entries, expected {n + dirs + 1}")
    return samples


def image_size(workload, scale):
    """Bytes of each filesystem's image for a workload (the same for all)."""
    if workload == "fsync-random":
        # The workload fills the image: its size sets the amount of work.
        return max(1 * GIB, int(8 * GIB * scale))
    if workload == "everyday":
        return 16 * GIB if scale >= 0.5 else 8 * GIB
    if workload == "seek":
        return max(2 * GIB, int(20 * GIB * scale))
    if workload == "scale":
        # Room for 1,000,000 inodes on passthrough_hp's ext4 (one per 8 KiB).
        return max(4 * GIB, int(16 * GIB * scale))
    return max(4 * GIB, int(8 * GIB * scale))


WORKLOADS = {
    "seek": seek,
    "rename": rename,
    "dbench": dbench,
    "dirty": dirty,
    "fsync-random": fsync_random,
    "everyday": everyday,
    "qgroups": qgroups,
    "stall": stall,
    "fsync-isolated": fsync_isolated,
    "fsync-stream": fsync_beside_stream,
    "pgbench": pgbench,
    "parallel": parallel,
    "snapshot": snapshot,
    "roundtrip": roundtrip,
    "reads": reads,
    "scale": many_files,
}

# Filesystems each workload runs on by default (tmpfs is the floor for the
# rename workload, as the issue asks).
DEFAULT_FS = ["canopy", "btrfs", "xfs", "ext4", "fuse2fs"]
EXTRA_FS = {"rename": ["tmpfs"]}
