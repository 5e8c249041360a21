#!/usr/bin/env bash
# The FUSE ceiling of `bench/run.py pgbench` (issue 54): PostgreSQL on
# libfuse's passthrough_hp over ext4. A benchmark, not a test.
#
# run.py's passthrough_hp driver cannot run this workload: passthrough_hp
# creates every file as the user it runs as (it never switches to the
# caller's), so mounted by root it leaves PostgreSQL, which runs as
# `postgres`, unable to write what it made. Here passthrough_hp runs as
# `postgres` itself, which needs /dev/fuse open to it: its mode is
# widened for the run and put back on exit.
#
#   bench/pgbench_passthrough_hp.sh PASSTHROUGH_HP [ROUNDS]
#
# PASSTHROUGH_HP: the binary run.py builds (WORK/passthrough_hp/fuse-*/
# passthrough_hp). Each round: a fresh 8 GiB ext4 image, initdb,
# `pgbench -i -s 20` timed, then `pgbench -c 4 -j 2 -T 60` (run.py's
# settings at scale 1). Needs root and PostgreSQL.
set -euo pipefail

HP=${1:?usage: $0 PASSTHROUGH_HP [ROUNDS]}
ROUNDS=${2:-3}
WORK=${WORK:-/var/tmp/canopy-pghp}
PORT=5440
PG_BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
as_pg() { runuser -u postgres -- env PATH="$PG_BIN:$PATH" "$@"; }

mode=$(stat -c %a /dev/fuse)
cleanup() {
    as_pg pg_ctl -D "$WORK/mnt/pg" -m fast -w stop >/dev/null 2>&1 || true
    grep -q " $WORK/mnt " /proc/mounts && umount "$WORK/mnt" || true
    mountpoint -q "$WORK/lower" && umount "$WORK/lower" || true
    rm -f "$WORK/img"
    chmod "$mode" /dev/fuse
}
trap cleanup EXIT
chmod 666 /dev/fuse
mkdir -p "$WORK/lower" "$WORK/mnt"

for ((r = 1; r <= ROUNDS; r++)); do
    rm -f "$WORK/img"
    truncate -s 8G "$WORK/img"
    mkfs.ext4 -q -F -i 8192 -E lazy_itable_init=0 "$WORK/img"
    mount -o loop "$WORK/img" "$WORK/lower"
    chown postgres: "$WORK/lower" "$WORK/mnt"
    # The mount is postgres's alone (no allow_other): root checks it in
    # /proc/mounts, as stat of the mount point is refused.
    as_pg bash -c "ulimit -n \$(ulimit -Hn); '$HP' '$WORK/lower' '$WORK/mnt'"
    for _ in $(seq 50); do grep -q " $WORK/mnt " /proc/mounts && break; sleep 0.1; done
    as_pg mkdir "$WORK/mnt/pg"
    as_pg initdb -D "$WORK/mnt/pg" -A trust >/dev/null
    as_pg pg_ctl -D "$WORK/mnt/pg" -o "-p $PORT -k /tmp" -l "$WORK/mnt/pg/log" -w start >/dev/null
    start=$(date +%s.%N)
    as_pg pgbench -h /tmp -p "$PORT" -U postgres -i -s 20 postgres >/dev/null 2>&1
    end=$(date +%s.%N)
    tps=$(as_pg pgbench -h /tmp -p "$PORT" -U postgres -c 4 -j 2 -T 60 postgres 2>/dev/null |
        sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    as_pg pg_ctl -D "$WORK/mnt/pg" -m fast -w stop >/dev/null
    umount "$WORK/mnt"
    umount "$WORK/lower"
    printf 'round %d: pgbench -i -s 20 %.2f s, 4 clients %s TPS\n' "$r" "$(echo "$end - $start" | bc)" "$tps"
done
