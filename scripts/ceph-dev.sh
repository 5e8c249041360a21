#!/usr/bin/env bash
# A one-node Ceph cluster for Canopy's RBD tests (issue 42), from Debian's
# packages: one monitor and one manager on 127.0.0.1, three OSDs on
# bluestore block files, a pool `rbd` of size 2. Everything (config,
# keyrings, data, logs, pid files, sockets) lives under DIR; nothing
# touches /etc/ceph or systemd.
#
#   scripts/ceph-dev.sh start DIR    bring it up (prints CEPH_CONF=DIR/ceph.conf)
#   scripts/ceph-dev.sh stop DIR     stop every daemon it started, by pid
#   scripts/ceph-dev.sh status DIR   `ceph -s`
#   scripts/ceph-dev.sh kill-osd DIR N    SIGKILL osd.N, as a crash would
#   scripts/ceph-dev.sh start-osd DIR N   start osd.N again, wait for active+clean
#
# Needs root and the packages: ceph ceph-mon ceph-mgr ceph-osd (install
# with --no-install-recommends). DIR must be on a filesystem with O_DIRECT
# (not tmpfs): bluestore opens its block file that way. OSDS=N (default 3)
# and POOL_SIZE=N (default 2) change the shape.
set -euo pipefail

usage() {
    awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
    exit 2
}

[ $# -ge 2 ] || usage
cmd=$1
dir=$(realpath -m "$2")
osds=${OSDS:-3}
pool_size=${POOL_SIZE:-2}
conf=$dir/ceph.conf

ceph_() { timeout 60 ceph -c "$conf" "$@"; }

write_config() {
    local fsid=$1
    cat > "$conf" <<EOF
[global]
fsid = $fsid
mon host = [v2:127.0.0.1:3300,v1:127.0.0.1:6789]
public network = 127.0.0.0/8
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
keyring = $dir/keyring/\$name.keyring
run dir = $dir/run
log file = $dir/log/\$name.log
admin socket = $dir/run/\$name.\$pid.asok
osd pool default size = $pool_size
osd pool default min size = 1
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail warn = 5
# The host's disk is shared with everything else: at the default 5% a
# monitor on a large, busy disk exits (status 28) with gigabytes free.
mon data avail crit = 1
mon allow pool delete = true
osd memory target = 1073741824
bluestore block create = true
bluestore block size = 10737418240

[mon.a]
mon data = $dir/mon/a

[mgr.x]
mgr data = $dir/mgr/x

[osd]
osd data = $dir/osd/\$id
osd objectstore = bluestore
EOF
}

make_keys() {
    local k=$dir/keyring
    ceph-authtool --create-keyring "$k/mon.a.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
    ceph-authtool --create-keyring "$k/client.admin.keyring" --gen-key -n client.admin \
        --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
    # The monitor's mkfs takes one keyring holding both.
    cat "$k/mon.a.keyring" "$k/client.admin.keyring" > "$dir/mon-mkfs.keyring"
}

start_mon() {
    local fsid=$1
    monmaptool --create --clobber --fsid "$fsid" \
        --addv a '[v2:127.0.0.1:3300,v1:127.0.0.1:6789]' "$dir/monmap" >/dev/null
    ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/mon-mkfs.keyring"
    ceph-mon -c "$conf" -i a --pid-file "$dir/run/mon.a.pid" 2>>"$dir/log/mon.a.stderr" ||
        daemon_failed "ceph-mon" "$dir/log/mon.a.stderr"
}

# A daemon that refuses to start says why only in its log: show it, since
# its exit status alone (28, say, for a monitor short of disk) names nothing.
daemon_failed() {
    local status=$? name=$1 log=$2
    echo "ceph-dev: $name exited with status $status; the end of $log:" >&2
    tail -n 5 "$log" >&2 || true
    exit 1
}

start_mgr() {
    mkdir -p "$dir/mgr/x"
    ceph_ auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' \
        -o "$dir/keyring/mgr.x.keyring"
    ceph-mgr -c "$conf" -i x --pid-file "$dir/run/mgr.x.pid" 2>>"$dir/log/mgr.x.stderr" ||
        daemon_failed "ceph-mgr" "$dir/log/mgr.x.stderr"
}

start_osd() {
    local uuid secret id
    uuid=$(uuidgen)
    secret=$(ceph-authtool --gen-print-key)
    id=$(echo "{\"cephx_secret\": \"$secret\"}" |
        ceph_ osd new "$uuid" -i - -n client.admin)
    mkdir -p "$dir/osd/$id"
    ceph-authtool --create-keyring "$dir/keyring/osd.$id.keyring" --name "osd.$id" \
        --add-key "$secret" >/dev/null
    ceph-osd -c "$conf" -i "$id" --mkfs --osd-uuid "$uuid" >>"$dir/log/osd.$id.stderr" 2>&1 ||
        daemon_failed "ceph-osd --mkfs (osd.$id)" "$dir/log/osd.$id.stderr"
    run_osd "$id"
}

# Starts the daemon of osd.$1 on its data (at start, and again after
# kill-osd).
run_osd() {
    ceph-osd -c "$conf" -i "$1" --pid-file "$dir/run/osd.$1.pid" 2>>"$dir/log/osd.$1.stderr" ||
        daemon_failed "ceph-osd (osd.$1)" "$dir/log/osd.$1.stderr"
}

wait_for() {
    local what=$1 test=$2 limit=${3:-90}
    for _ in $(seq "$limit"); do
        if eval "$test" >/dev/null 2>&1; then return 0; fi
        sleep 1
    done
    echo "ceph-dev: $what did not happen within ${limit}s (logs in $dir/log)" >&2
    return 1
}

# The OSDs' block files are sparse and grow with what is written (up to
# $osds x 10 GiB); the tests write a few GiB. Say so up front when the disk
# is short, rather than leave a stalled or dying cluster to explain it.
warn_if_short_of_room() {
    local free_gib
    free_gib=$(df --output=avail -BG "$dir" | tail -1 | tr -dc 0-9)
    if [ "$free_gib" -lt 4 ]; then
        echo "ceph-dev: warning: only ${free_gib} GiB free under $dir; the OSDs' block files grow with every write" >&2
    fi
}

start() {
    for tool in ceph ceph-mon ceph-mgr ceph-osd ceph-authtool monmaptool uuidgen; do
        command -v "$tool" >/dev/null || {
            echo "ceph-dev: $tool is missing (apt-get install --no-install-recommends ceph ceph-mon ceph-mgr ceph-osd)" >&2
            exit 1
        }
    done
    if [ -e "$dir/run" ] && ls "$dir"/run/*.pid >/dev/null 2>&1; then
        echo "ceph-dev: $dir already has a cluster (stop it first)" >&2
        exit 1
    fi
    rm -rf "$dir"
    mkdir -p "$dir"/{keyring,run,log,mon/a,osd}
    warn_if_short_of_room
    local fsid
    fsid=$(uuidgen)
    write_config "$fsid"
    make_keys
    start_mon "$fsid"
    wait_for "the monitor answering" "ceph_ mon stat"
    start_mgr
    for _ in $(seq "$osds"); do start_osd; done
    wait_for "$osds OSDs up" "ceph_ osd stat -f json | grep -q '\"num_up_osds\":$osds'"
    ceph_ osd pool create rbd 32 >/dev/null
    ceph_ osd pool set rbd size "$pool_size" >/dev/null
    timeout 60 rbd -c "$conf" pool init rbd
    # Every placement group (the manager's own pool's too) active+clean.
    wait_for "every placement group active+clean" \
        "ceph_ pg stat | grep -Eq '^([0-9]+) pgs: \\1 active\\+clean;'" 120
    echo "CEPH_CONF=$conf"
}

stop() {
    local pids=()
    for f in "$dir"/run/*.pid; do
        [ -e "$f" ] && pids+=("$(cat "$f")")
    done
    [ ${#pids[@]} -gt 0 ] || return 0
    kill "${pids[@]}" 2>/dev/null || true
    for _ in $(seq 30); do
        local alive=0
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && break
        sleep 1
    done
    kill -9 "${pids[@]}" 2>/dev/null || true
    rm -f "$dir"/run/*.pid
}

# kill-osd DIR N: SIGKILL osd.N, as a crash would (the tests of issue 42).
kill_osd() {
    local id=${1:?OSD id} pidf="$dir/run/osd.${1}.pid"
    [ -e "$pidf" ] || { echo "ceph-dev: no osd.$id running under $dir" >&2; exit 1; }
    kill -9 "$(cat "$pidf")" 2>/dev/null || true
    rm -f "$pidf"
}

# start-osd DIR N: starts osd.N again on its data and waits for every
# placement group to be active+clean.
restart_osd() {
    local id=${1:?OSD id}
    run_osd "$id"
    wait_for "osd.$id up" "ceph_ osd stat -f json | grep -q '\"num_up_osds\":$osds'"
    wait_for "every placement group active+clean" \
        "ceph_ pg stat | grep -Eq '^([0-9]+) pgs: \\1 active\\+clean;'" 120
}

case $cmd in
    start) start ;;
    stop) stop ;;
    kill-osd) kill_osd "${3:-}" ;;
    start-osd) restart_osd "${3:-}" ;;
    status) ceph_ -s ;;
    *) usage ;;
esac
