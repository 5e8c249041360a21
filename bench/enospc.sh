#!/usr/bin/env bash
# How much of an image a single `dd` gets before ENOSPC (a benchmark, not a
# test): Canopy beside kernel btrfs, XFS and ext4 on loop-mounted images of
# the same sizes, in one run. For each: the share of the image size the
# file reached, and the share of what df said was available beforehand.
# Needs root. Usage: bash bench/enospc.sh [SIZE...]   (default 256M 1G 4G)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
SIZES=("$@")
[ ${#SIZES[@]} -gt 0 ] || SIZES=(256M 1G 4G)
W=${WORK:-/var/tmp/canopy-enospc}
M=$W/mnt
mkdir -p "$M"
command -v mkfs.btrfs >/dev/null && command -v mkfs.xfs >/dev/null || {
    apt-get update -qq && apt-get install -y -qq btrfs-progs xfsprogs >/dev/null
}
cargo build --release --locked -q
CANOPY=$(pwd)/target/release/canopy
trap 'umount "$M" 2>/dev/null || true' EXIT

mount_fs() { # fs image
    case $1 in
    canopy) "$CANOPY" mkfs -q -s "$SIZE" "$2" && "$CANOPY" mount "$2" "$M" ;;
    btrfs) mkfs.btrfs -q -f "$2" >/dev/null && mount -o loop "$2" "$M" ;;
    xfs) mkfs.xfs -q -f "$2" 2>/dev/null && mount -o loop "$2" "$M" ;;
    ext4) mkfs.ext4 -q -F "$2" && mount -o loop "$2" "$M" ;;
    esac
}

printf "%-6s %-7s %12s %12s %12s %8s %8s\n" size fs image_bytes df_avail written "%image" "%avail"
for SIZE in "${SIZES[@]}"; do
    for fs in canopy btrfs xfs ext4; do
        img=$W/$fs.img
        rm -f "$img"
        truncate -s "$SIZE" "$img"
        if ! mount_fs "$fs" "$img" 2>/dev/null; then
            printf "%-6s %-7s %12s\n" "$SIZE" "$fs" "(cannot make this size)"
            continue
        fi
        bytes=$(stat -c %s "$img")
        avail=$(df -B1 --output=avail "$M" | tail -1 | tr -d ' ')
        dd if=/dev/zero of="$M/fill" bs=1M status=none 2>/dev/null || true
        sync -f "$M/fill" 2>/dev/null || true
        [ "$fs" = canopy ] && "$CANOPY" sync "$M"
        written=$(stat -c %s "$M/fill")
        umount "$M"
        [ "$fs" = canopy ] && while pgrep -f -- "$img" >/dev/null; do sleep 0.1; done
        printf "%-6s %-7s %12d %12d %12d %7.1f%% %7.1f%%\n" "$SIZE" "$fs" "$bytes" "$avail" "$written" \
            "$(echo "100*$written/$bytes" | bc -l)" "$(echo "100*$written/$avail" | bc -l)"
        rm -f "$img"
    done
done
