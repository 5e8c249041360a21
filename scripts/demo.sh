#!/usr/bin/env bash
# From a fresh machine to a mounted Canopy filesystem: installs FUSE if it is
# missing, builds, creates a 1 GiB image, mounts it on ./canopy-mnt and
# shows it at work. Unmount with `umount canopy-mnt` (or
# `fusermount3 -u canopy-mnt`).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
IMG=${1:-canopy-demo.img}
MNT=${2:-canopy-mnt}

if ! command -v fusermount3 >/dev/null && [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq fuse3 >/dev/null
fi
cargo build --release --locked
BIN=target/release/canopy
if mountpoint -q "$MNT" 2>/dev/null; then umount "$MNT"; sleep 1; fi
rm -f "$IMG"
mkdir -p "$MNT"
$BIN mkfs --size 1G --label demo "$IMG"
$BIN mount "$IMG" "$MNT"
echo
echo "== mounted"
grep " $(realpath "$MNT") " /proc/mounts
echo
echo "== some files"
mkdir -p "$MNT/docs"
cp README.md docs/*.md "$MNT/docs/"
dd if=/dev/urandom of="$MNT/random.bin" bs=1M count=32 status=none
ln -s docs/README.md "$MNT/readme-link"
ls -la "$MNT" "$MNT/docs"
sha256sum "$MNT/random.bin"
df -h "$MNT"
echo
echo "== a subvolume and a read-only snapshot of it"
$BIN subvolume create "$MNT/projects"
cp -a docs "$MNT/projects/"
$BIN subvolume snapshot -r "$MNT/projects" "$MNT/projects-monday"
echo "changed after the snapshot" >> "$MNT/projects/docs/architecture.md"
rm "$MNT/projects/docs/testing.md"
$BIN subvolume list "$MNT"
echo "live:     $(ls "$MNT/projects/docs" | tr '\n' ' ')"
echo "snapshot: $(ls "$MNT/projects-monday/docs" | tr '\n' ' ')"
tail -n 1 "$MNT/projects/docs/architecture.md"
diff -q "$MNT/projects/docs/architecture.md" "$MNT/projects-monday/docs/architecture.md" || true
touch "$MNT/projects-monday/x" 2>&1 || echo "(the snapshot is read-only)"
echo
echo "== quota groups: what each subvolume references and holds alone, and a limit"
$BIN quota enable "$MNT"
$BIN qgroup limit 20M "$MNT/projects"
$BIN qgroup show "$MNT"
dd if=/dev/zero of="$MNT/projects/too-big" bs=1M count=40 status=none 2>&1 \
    || echo "(a write past the 20M limit of projects fails with EDQUOT)"
rm -f "$MNT/projects/too-big"
$BIN qgroup limit none "$MNT/projects"
echo
echo "== send and receive: the snapshot as a btrfs send stream, then only what changed"
mkdir "$MNT/backup"
DEMO_DIR=$(mktemp -d /tmp/canopy-demo-streams.XXXXXX)
$BIN send -q "$MNT/projects-monday" -f "$DEMO_DIR/monday.stream"
$BIN receive -q -f "$DEMO_DIR/monday.stream" "$MNT/backup"
$BIN subvolume snapshot -r "$MNT/projects" "$MNT/projects-tuesday"
$BIN send -p "$MNT/projects-monday" "$MNT/projects-tuesday" -f "$DEMO_DIR/tuesday.stream"
$BIN receive --dump -f "$DEMO_DIR/tuesday.stream" | grep -v utimes
$BIN receive -q -f "$DEMO_DIR/tuesday.stream" "$MNT/backup"
$BIN subvolume list -R "$MNT"
diff -r "$MNT/projects-tuesday" "$MNT/backup/projects-tuesday" && echo "(the received copy is the same)"
rm -rf "$DEMO_DIR"
echo
echo "== a compressed directory: new files in it inherit the property"
mkdir "$MNT/logs"
$BIN property set "$MNT/logs" compression zstd
$BIN property get "$MNT/logs" compression
for i in $(seq 1 8); do cp docs/*.md "$MNT/logs/" 2>/dev/null; \
    seq 1 200000 | sed "s/^/request $i served in /" > "$MNT/logs/access-$i.log"; done
$BIN sync "$MNT"
$BIN filesystem du "$MNT/logs"
echo "(apparent size $(du -sh --apparent-size "$MNT/logs" | cut -f1), on disk $(du -sh "$MNT/logs" | cut -f1))"
echo
echo "== balance: every block moves, shared blocks once; no qgroup number changes"
BEFORE=$($BIN qgroup show --raw "$MNT")
$BIN balance start "$MNT" | cat
[ "$($BIN qgroup show --raw "$MNT")" = "$BEFORE" ] && echo "(qgroup numbers unchanged)"
$BIN sync "$MNT"
$BIN filesystem usage "$MNT"
echo
echo "== every checksum read back by the daemon (canopy scrub); tree blocks are kept"
echo "   twice (metadata,dup above), so a bad copy is repaired from the other"
$BIN sync "$MNT"
$BIN scrub "$MNT"
$BIN filesystem show "$MNT"
$BIN device stats "$MNT"
echo
echo "Canopy is mounted on $MNT (image $IMG). Try it, then unmount with:"
echo "    umount $MNT"
echo "and check the image with:"
echo "    $BIN check $IMG      (--repair mends wrong counters: usage, free space, link counts)"
echo "Snapshots: canopy subvolume --help. Quota groups: canopy quota --help, canopy qgroup --help."
echo "Balance: canopy balance --help. Block groups: canopy filesystem usage --help."
echo "Two copies of tree blocks: canopy mkfs -m dup|single, canopy balance start -mconvert=dup,"
echo "canopy scrub (repairs bad copies), canopy device stats (errors found and repaired)."
echo "Several devices: canopy mkfs -d raid1 A B, canopy mount A DIR -o device=B,"
echo "canopy device add|remove|replace (online), -o degraded when one is lost."
echo "Compression: canopy mount -o compress=zstd, canopy property set DIR compression zstd|lz4|none,"
echo "canopy filesystem du PATH (bytes on disk per compression type)."
echo "Send and receive (btrfs send streams): canopy send --help, canopy receive --help."
