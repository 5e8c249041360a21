"""Filesystems under test: each on its own image file of the same size,
made, mounted, remounted cold and unmounted the same way every time."""

import os
import subprocess
import time

CANOPY = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..",
                                      "target", "release", "canopy"))


def sh(cmd, check=True, **kw):
    """Runs a bash command; output goes to ours unless captured."""
    return subprocess.run(cmd, shell=True, check=check, executable="/bin/bash", **kw)


def drop_caches():
    sh("sync")
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def is_mounted(path):
    return sh(f"mountpoint -q '{path}'", check=False).returncode == 0


def wait_for(cond, what, timeout=20.0):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


class Fs:
    """One filesystem on `work/<name>.img`, mounted on `work/mnt`."""

    kernel = True  # kernel filesystems: loop mount, filefrag works

    def __init__(self, name, work, size_bytes):
        self.name = name
        self.image = os.path.join(work, f"{name}.img")
        self.mnt = os.path.join(work, "mnt")
        self.size = size_bytes
        self.opts = ""
        os.makedirs(self.mnt, exist_ok=True)

    # -- to override -------------------------------------------------
    def mkfs(self):
        raise NotImplementedError

    def do_mount(self):
        raise NotImplementedError

    # -- common ------------------------------------------------------
    def make(self, opts=""):
        """Fresh image and mount with extra mount options `opts`."""
        self.release_mountpoint()
        if os.path.exists(self.image):
            os.remove(self.image)
        self.opts = opts
        self.mkfs()
        self.mount()

    def mount(self):
        self.do_mount()
        wait_for(lambda: is_mounted(self.mnt), f"{self.name} mount")

    def umount(self):
        sh(f"umount '{self.mnt}'")
        # FUSE daemons finish writing after umount returns.
        wait_for(lambda: sh(f"pgrep -f -- '{self.image}'", check=False,
                            stdout=subprocess.DEVNULL).returncode != 0,
                 f"{self.name} daemon exit")

    def remount_cold(self):
        self.umount()
        drop_caches()
        self.mount()

    def release_mountpoint(self):
        while is_mounted(self.mnt):
            sh(f"umount '{self.mnt}'", check=False)
            time.sleep(0.2)

    def destroy(self):
        self.release_mountpoint()
        if os.path.exists(self.image):
            os.remove(self.image)

    def path(self, rel=""):
        return os.path.join(self.mnt, rel)

    def _loop_opts(self):
        return "loop" + (f",{self.opts}" if self.opts else "")

    def _truncate(self):
        with open(self.image, "wb") as f:
            f.truncate(self.size)


class Canopy(Fs):
    kernel = False
    binary = CANOPY

    def mkfs(self):
        sh(f"'{self.binary}' mkfs -q -s {self.size} '{self.image}'")

    # Mount options every Canopy mount of a run gets first (run.py's
    # --canopy-opts, e.g. transport=dev).
    base_opts = ""

    def do_mount(self):
        opts = ",".join(o for o in (self.base_opts, self.opts) if o)
        o = f"-o {opts}" if opts else ""
        sh(f"'{self.binary}' mount {o} '{self.image}' '{self.mnt}'")


class CanopyOld(Canopy):
    """An older build of Canopy beside this one (an A/B in one run): the
    binary `CANOPY_OLD` names, mounted without --canopy-opts."""
    binary = os.environ.get("CANOPY_OLD", CANOPY)
    # An older build may not know the options this run gives Canopy.
    base_opts = ""


class CanopyWbc(Canopy):
    """Canopy with `-o writeback_cache`: the kernel buffers writes, and its
    dirty limits govern them (issue 40, the `dirty` workload)."""
    def do_mount(self):
        opts = ",".join(o for o in (self.base_opts, "writeback_cache", self.opts) if o)
        sh(f"'{self.binary}' mount -o {opts} '{self.image}' '{self.mnt}'")


class CanopyZstd(Canopy):
    """Canopy with `compress=zstd` (issue 38: pgbench with and without)."""
    def do_mount(self):
        opts = ",".join(o for o in (self.base_opts, "compress=zstd", self.opts) if o)
        sh(f"'{self.binary}' mount -o {opts} '{self.image}' '{self.mnt}'")


class BtrfsZstd(Fs):
    """Kernel btrfs with `compress=zstd:3`, the same codec and level."""
    def mkfs(self):
        self._truncate()
        sh(f"mkfs.btrfs -q -f '{self.image}' >/dev/null")

    def do_mount(self):
        opts = ",".join(o for o in ("loop", "compress=zstd:3", self.opts) if o)
        sh(f"mount -o {opts} '{self.image}' '{self.mnt}'")


class Btrfs(Fs):
    def mkfs(self):
        self._truncate()
        sh(f"mkfs.btrfs -q -f '{self.image}' >/dev/null")

    def do_mount(self):
        sh(f"mount -o {self._loop_opts()} '{self.image}' '{self.mnt}'")


class Xfs(Btrfs):
    def mkfs(self):
        self._truncate()
        sh(f"mkfs.xfs -q -f '{self.image}'")


class Ext4(Btrfs):
    def mkfs(self):
        self._truncate()
        sh(f"mkfs.ext4 -q -F '{self.image}'")


class Fuse2fs(Fs):
    kernel = False

    def mkfs(self):
        self._truncate()
        sh(f"mkfs.ext4 -q -F '{self.image}'")

    def do_mount(self):
        o = f",{self.opts}" if self.opts else ""
        sh(f"fuse2fs '{self.image}' '{self.mnt}' -o fakeroot{o} 2>/dev/null")


class Tmpfs(Fs):
    kernel = False

    def mkfs(self):
        pass

    def do_mount(self):
        sh(f"mount -t tmpfs -o size={self.size} tmpfs '{self.mnt}'")

    def umount(self):
        sh(f"umount '{self.mnt}'")

    def remount_cold(self):
        drop_caches()  # a tmpfs has nothing to reread


DRIVERS = {
    "canopy": Canopy,
    "canopy-old": CanopyOld,
    "canopy-zstd": CanopyZstd,
    "canopy-wbc": CanopyWbc,
    "btrfs-zstd": BtrfsZstd,
    "btrfs": Btrfs,
    "xfs": Xfs,
    "ext4": Ext4,
    "fuse2fs": Fuse2fs,
    "tmpfs": Tmpfs,
}
