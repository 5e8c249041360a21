"""Filesystems under test: each on its own image file of the same size,
made, mounted, remounted cold and unmounted the same way every time."""

import contextlib
import glob
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
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


def cold_read_mbs(path):
    """MB/s of a sequential read of `path` with the page cache dropped
    first (MiB read over seconds)."""
    drop_caches()
    t = time.monotonic()
    read = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(4 << 20):
            read += len(chunk)
    return read / (1 << 20) / (time.monotonic() - t)


def out(cmd):
    """A bash command's standard output."""
    return sh(cmd, capture_output=True, text=True).stdout


def full_image(path, mib):
    """A fully written image file, so I/O meets the disk, not holes."""
    sh(f"dd if=/dev/zero of={path} bs=1M count={mib} status=none")


@contextlib.contextmanager
def images(paths, mib, loop=False):
    """Fully written image files of `mib` MiB at `paths`, yielded as
    themselves or, with `loop`, as loop devices over them; detached and
    removed at the end, however it comes."""
    loops = []
    try:
        for p in paths:
            full_image(p, mib)
        if loop:
            loops = [out(f"losetup -f --show {p}").strip() for p in paths]
        yield loops if loop else list(paths)
    finally:
        for dev in loops:
            subprocess.run(["losetup", "-d", dev], check=False)
        for p in paths:
            if os.path.exists(p):
                os.remove(p)


def wait_daemon(img):
    """Waits until no Canopy daemon serves `img` (umount returns first)."""
    while subprocess.run(["pgrep", "-f", img], capture_output=True).returncode == 0:
        time.sleep(0.1)


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

    @classmethod
    def prepare(cls, work):
        """Run once before the first round: whatever the driver needs
        beyond the packages run.py installs (a RuntimeError says what is
        missing and how to provide it)."""

    def daemon_pid(self):
        """The pid of the FUSE daemon serving the mount (None: no daemon,
        or a kernel filesystem)."""
        return None

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

    def daemon_pid(self):
        # `canopy mount` exits once the mount is live; what is left with
        # the image on its command line is the daemon.
        return oldest_pid(self.image)


class CanopyOld(Canopy):
    """An older build of Canopy beside this one (an A/B in one run): the
    binary `CANOPY_OLD` names, mounted without --canopy-opts."""
    binary = os.environ.get("CANOPY_OLD", CANOPY)
    # An older build may not know the options this run gives Canopy.
    base_opts = ""


class CanopySingle(Canopy):
    """Canopy keeping one copy of tree blocks (`mkfs -m single`): the
    cost of the default second copy (issue 55) in an A/B."""
    def mkfs(self):
        sh(f"'{self.binary}' mkfs -q -m single -s {self.size} '{self.image}'")


class CanopyRaid1(Canopy):
    """Canopy over two image files with `mkfs -m raid1 -d raid1`: every
    block written twice, reads spread over the two (issue 55: pgbench on
    raid1 against one device)."""
    def second(self):
        return self.image + ".2"

    def mkfs(self):
        with open(self.second(), "wb") as f:
            f.truncate(self.size)
        sh(f"'{self.binary}' mkfs -q -f -m raid1 -d raid1 -s {self.size} "
           f"'{self.image}' '{self.second()}'")

    def do_mount(self):
        opts = ",".join(o for o in (self.base_opts, f"device={self.second()}", self.opts) if o)
        sh(f"'{self.binary}' mount -o {opts} '{self.image}' '{self.mnt}'")

    def destroy(self):
        super().destroy()
        if os.path.exists(self.second()):
            os.remove(self.second())


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


def oldest_pid(pattern):
    """The oldest process whose command line matches `pattern` (pgrep -f),
    or None."""
    # Not through a shell, whose own command line would match too.
    r = subprocess.run(["pgrep", "-o", "-f", "--", pattern], capture_output=True, text=True)
    return int(r.stdout) if r.returncode == 0 else None


# -- passthrough_hp: the FUSE ceiling (issue 54) ---------------------------

LIBFUSE_TARBALL = "https://github.com/libfuse/libfuse/archive/refs/tags/fuse-{version}.tar.gz"
SOURCE_ENV = "PASSTHROUGH_HP_SRC"


def libfuse_version():
    """The installed libfuse3's version (e.g. 3.14.0), installing its
    headers first if pkg-config does not know it: passthrough_hp must be
    built from the example of the same release, since the newest example
    needs newer headers than Debian 12 has."""
    if sh("pkg-config --exists fuse3", check=False).returncode != 0:
        # Another apt may hold the dpkg lock: wait for it rather than fail.
        sh("apt-get -o DPkg::Lock::Timeout=600 install -y -qq libfuse3-dev pkg-config g++ "
           ">/dev/null")
    return sh("pkg-config --modversion fuse3", capture_output=True, text=True).stdout.strip()


def local_includes(source):
    """The files a C++ source includes with quotes ("cxxopts.hpp"): they
    sit beside it in libfuse's example/ directory."""
    with open(source) as f:
        return re.findall(r'^#include\s+"([^"]+)"', f.read(), re.M)


def copy_from_tree(tree, version, dest):
    """Copies example/passthrough_hp.cc and what it includes out of an
    unpacked libfuse source tree, refusing a tree of another release."""
    meson = os.path.join(tree, "meson.build")
    if os.path.exists(meson):
        m = re.search(r"version\s*:\s*'([^']+)'", open(meson).read())
        if m and m.group(1) != version:
            raise RuntimeError(f"{tree} is libfuse {m.group(1)}, the installed libfuse3 is "
                               f"{version}")
    cc = os.path.join(tree, "example", "passthrough_hp.cc")
    if not os.path.exists(cc):
        raise RuntimeError(f"{tree} has no example/passthrough_hp.cc")
    for name in ["passthrough_hp.cc"] + local_includes(cc):
        shutil.copy(os.path.join(tree, "example", name), dest)


def copy_from_git(repo, version, dest):
    """The same out of a libfuse git repository (bare or not), at the tag
    of the installed release. False if `repo` is no such repository."""
    tag = f"fuse-{version}"

    def show(name):
        r = subprocess.run(["git", "-C", repo, "show", f"{tag}:example/{name}"],
                           capture_output=True)
        return r.stdout if r.returncode == 0 else None

    cc = show("passthrough_hp.cc")
    if cc is None:
        return False
    with open(os.path.join(dest, "passthrough_hp.cc"), "wb") as f:
        f.write(cc)
    for name in local_includes(os.path.join(dest, "passthrough_hp.cc")):
        data = show(name)
        if data is None:
            raise RuntimeError(f"{repo}: {tag}:example/{name} is missing")
        with open(os.path.join(dest, name), "wb") as f:
            f.write(data)
    return True


def copy_from_tarball(tarball, version, dest):
    """The same out of a libfuse release or GitHub tag tarball."""
    with tempfile.TemporaryDirectory() as tmp:
        sh(f"tar -xf '{tarball}' -C '{tmp}'")
        trees = glob.glob(os.path.join(tmp, "*", "example", "passthrough_hp.cc"))
        if not trees:
            raise RuntimeError(f"{tarball} holds no */example/passthrough_hp.cc")
        copy_from_tree(os.path.dirname(os.path.dirname(trees[0])), version, dest)


def download_tarball(version, dest):
    """GitHub's tarball of the tag into `dest`; its path, or None when
    the network does not allow it."""
    path = os.path.join(dest, f"libfuse-fuse-{version}.tar.gz")
    url = LIBFUSE_TARBALL.format(version=version)
    r = sh(f"curl -fsSL --max-time 120 -o '{path}' '{url}'", check=False,
           stderr=subprocess.DEVNULL)
    return path if r.returncode == 0 else None


def fetch_passthrough_hp_source(version, dest, given=None):
    """Puts passthrough_hp.cc of libfuse `version` and the headers it
    includes into `dest`, from `given` (a libfuse git repository, source
    tree or tarball; default $PASSTHROUGH_HP_SRC) or else downloaded from
    GitHub. Never from the repository: libfuse's code is not Canopy's."""
    given = given or os.environ.get(SOURCE_ENV)
    if given:
        if os.path.isdir(given):
            if not copy_from_git(given, version, dest):
                copy_from_tree(given, version, dest)
        else:
            copy_from_tarball(given, version, dest)
        return
    tarball = download_tarball(version, dest)
    if tarball is None:
        raise RuntimeError(
            f"passthrough_hp: could not download {LIBFUSE_TARBALL.format(version=version)} "
            f"(no network?). Provide libfuse {version}'s source with "
            f"{SOURCE_ENV}=PATH or run.py --passthrough-hp-src PATH, where PATH is a "
            f"libfuse git clone (git clone https://github.com/libfuse/libfuse; tag "
            f"fuse-{version} is used), a source tree of that release, or its tarball "
            f"(or the directory `apt-get source fuse3` unpacks).")
    copy_from_tarball(tarball, version, dest)


# What libfuse's own configuration finds on glibc. Its 3.14 meson build
# never hands them to C++ sources, so the example built there answers
# EOPNOTSUPP to every utimensat of a path (cp -a and git clone fail) and
# ENOSYS to every xattr call (skipping work Canopy does); with them it
# passes both through to ext4.
PASSTHROUGH_HP_DEFINES = "-DHAVE_UTIMENSAT -DHAVE_POSIX_FALLOCATE -DHAVE_SETXATTR"
PASSTHROUGH_HP_BUILD = ("g++ -std=c++17 -O2 " + PASSTHROUGH_HP_DEFINES
                        + " -o passthrough_hp.tmp passthrough_hp.cc"
                        " $(pkg-config --cflags --libs fuse3) -lpthread")


def build_passthrough_hp(work, given=None):
    """The path of passthrough_hp built for the installed libfuse3 under
    `work/passthrough_hp/fuse-<version>/`, compiling it there on first use
    (a newer libfuse3 or another build command gets a fresh build)."""
    version = libfuse_version()
    out_dir = os.path.join(work, "passthrough_hp", f"fuse-{version}")
    binary = os.path.join(out_dir, "passthrough_hp")
    stamp = os.path.join(out_dir, "build-command")
    if os.path.exists(binary) and os.path.exists(stamp) and \
            open(stamp).read() == PASSTHROUGH_HP_BUILD:
        return binary
    os.makedirs(out_dir, exist_ok=True)
    if not os.path.exists(os.path.join(out_dir, "passthrough_hp.cc")):
        fetch_passthrough_hp_source(version, out_dir, given)
    sh(f"cd '{out_dir}' && {PASSTHROUGH_HP_BUILD} && mv passthrough_hp.tmp passthrough_hp")
    with open(stamp, "w") as f:
        f.write(PASSTHROUGH_HP_BUILD)
    return binary


# passthrough_hp keeps a descriptor open for every inode the kernel knows
# (until FORGET) and raises its soft limit only to the hard one: the shell
# that starts it raises the hard limit to the most the kernel allows
# (/usr/share alone is 54,000 files), where it may (CAP_SYS_RESOURCE).
RAISE_NOFILE = "ulimit -n $(cat /proc/sys/fs/nr_open)"


def warn_if_few_descriptors():
    """Says up front when passthrough_hp cannot get enough descriptors, so
    that its EMFILE failures later on are not a mystery."""
    if sh(RAISE_NOFILE, check=False, stderr=subprocess.DEVNULL).returncode == 0:
        return
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    print(f"warning: passthrough_hp gets at most {hard} open files here (raising the hard "
          "limit needs CAP_SYS_RESOURCE): it holds one per inode the kernel knows, so work "
          f"on more than about {hard} files at once (everyday's /usr/share: 54,000) fails "
          "on it with 'Too many open files'", file=sys.stderr)


class PassthroughHp(Fs):
    """libfuse's example passthrough_hp (`passthrough_hp SOURCE MOUNTPOINT`,
    default options: multi-threaded, writeback cache, 86400 s timeouts)
    over an ext4 image loop-mounted on `work/<name>.lower`: FUSE with
    almost no filesystem behind it, the ceiling for any FUSE filesystem on
    this machine (issue 54). Built at run time by prepare()."""

    kernel = False
    binary = None  # set by prepare()
    source = None  # run.py --passthrough-hp-src; else $PASSTHROUGH_HP_SRC or GitHub

    @classmethod
    def prepare(cls, work):
        cls.binary = build_passthrough_hp(work, cls.source)
        warn_if_few_descriptors()

    def __init__(self, name, work, size_bytes):
        super().__init__(name, work, size_bytes)
        self.lower = os.path.join(work, f"{name}.lower")
        os.makedirs(self.lower, exist_ok=True)

    def mkfs(self):
        if self.opts:
            raise ValueError(f"{self.name} takes no mount options ({self.opts})")
        self._truncate()
        # Twice ext4's default inode density, so that the scale workload's
        # 1,000,000 files fit; inode tables written now, not by ext4's lazy
        # init thread during the measurements.
        sh(f"mkfs.ext4 -q -F -i 8192 -E lazy_itable_init=0 '{self.image}'")

    def do_mount(self):
        if not is_mounted(self.lower):
            sh(f"mount -o loop '{self.image}' '{self.lower}'")
        # It daemonizes before mounting; mount() waits for the mount.
        sh(f"{RAISE_NOFILE} 2>/dev/null; '{self.binary}' '{self.lower}' '{self.mnt}'")

    def daemon_pid(self):
        return oldest_pid(f"{self.binary} {self.lower} ")

    def umount(self):
        sh(f"fusermount3 -u '{self.mnt}'")
        self._stop_lower()

    def release_mountpoint(self):
        super().release_mountpoint()
        self._stop_lower()

    def _stop_lower(self):
        """Waits for the daemon to exit (it holds a descriptor of every
        inode the kernel knows), then unmounts the ext4 under it."""
        wait_for(lambda: self.daemon_pid() is None, f"{self.name} daemon exit")
        while is_mounted(self.lower):
            sh(f"umount '{self.lower}'", check=False)
            time.sleep(0.2)


DRIVERS = {
    "canopy": Canopy,
    "canopy-old": CanopyOld,
    "canopy-single": CanopySingle,
    "canopy-raid1": CanopyRaid1,
    "canopy-zstd": CanopyZstd,
    "canopy-wbc": CanopyWbc,
    "btrfs-zstd": BtrfsZstd,
    "btrfs": Btrfs,
    "xfs": Xfs,
    "ext4": Ext4,
    "fuse2fs": Fuse2fs,
    "tmpfs": Tmpfs,
    "passthrough_hp": PassthroughHp,
}


def used_bytes(fs):
    """Bytes statfs counts used on the mount."""
    st = os.statvfs(fs.mnt)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def snapshot_root(fs, name="snap"):
    """A snapshot of the whole mount at `name` in it (Canopy's or btrfs's
    subvolume command)."""
    tool = f"'{fs.binary}'" if isinstance(fs, Canopy) else "btrfs"
    sh(f"{tool} subvolume snapshot '{fs.mnt}' '{fs.path(name)}' >/dev/null")


def commit_any(fs):
    """Commits the mount: `canopy sync` on Canopy (syncfs does not reach a
    FUSE daemon), syncfs on a kernel filesystem."""
    if isinstance(fs, Canopy):
        sh(f"'{fs.binary}' sync '{fs.mnt}'")
    else:
        sh(f"sync -f '{fs.mnt}'")
