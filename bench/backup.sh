#!/usr/bin/env bash
# Backup and restore at scale: a 3-node raftlock on 127.0.0.1 holding N
# locks (default 1,000,000, held by sessions of an hour), then the three
# operations of docs/operations/backup-and-recovery.md's "Backup and
# restore", timed:
#
#   1. `raftlock snapshot save FILE` on the full cluster (its size too);
#   2. `raftlock snapshot inspect FILE` (no cluster);
#   3. `raftlock snapshot restore FILE` into a new, empty 3-node cluster;
#   4. `raftlockd restore FILE --data-dir DIR`, then a third cluster
#      bootstrapped from DIR, until `Status` shows the restored sessions;
#
# and, on the full cluster after step 1, a fourth node joining it
# (`raftlock members add`, until it is a voter) with the new node's peak
# RSS: what the Kubernetes manifests' memory limit must hold.
#
# After 3 and 4 it checks that the restored cluster holds what the backup
# holds (sessions, grants) and prints the largest node's peak RSS (VmHWM)
# while it restored. Figures go to docs/operations/backup-and-recovery.md
# by hand, with the commit and the machine.
#
#   bench/backup.sh [--locks N] [--sessions M] [--no-build]
#
# --sessions M opens M more sessions (of an hour, holding nothing) after
# the locks, as the operator review's 1M locks + 100k sessions did.
#
# Environment: CARGO_TARGET_DIR (where to build), BIN_DIR (use prebuilt
# raftlockd, raftlock and raftlock-bench from here and skip the build),
# BASE_PORT (default 27400), WORK_DIR (parent of the temp folder; default
# $TMPDIR or /tmp: put it on the disk you want to measure).
#
# Everything it starts is stopped on exit (trap EXIT); every wait is
# bounded.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
LOCKS=1000000
SESSIONS=0
BUILD=1
while [ $# -gt 0 ]; do
  case "$1" in
    --locks) LOCKS=$2; shift ;;
    --sessions) SESSIONS=$2; shift ;;
    --no-build) BUILD=0 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "backup.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
case "$LOCKS" in ''|*[!0-9]*) echo "backup.sh: --locks takes a number" >&2; exit 2 ;; esac
case "$SESSIONS" in ''|*[!0-9]*) echo "backup.sh: --sessions takes a number" >&2; exit 2 ;; esac

log() { printf '[%s] %s\n' "$(date +%T)" "$*"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

if [ -n "${BIN_DIR:-}" ] || [ "$BUILD" = 0 ]; then
  BIN_DIR=${BIN_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
  log "using prebuilt binaries in $BIN_DIR"
else
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
  log "building (release) into $CARGO_TARGET_DIR"
  (cd "$ROOT" && cargo build --release -q -p raftlock-node -p raftlock-client -p raftlock-bench \
     --bin raftlockd --bin raftlock --bin raftlock-bench)
  BIN_DIR=$CARGO_TARGET_DIR/release
fi
RAFTLOCK=$BIN_DIR/raftlock

WORK=$(mktemp -d "${WORK_DIR:-${TMPDIR:-/tmp}}/raftlock-backup.XXXXXX")
BASE_PORT=${BASE_PORT:-27400}
# start_node, stop_cluster, EP, NODE_PIDS; each cluster's data and logs in
# $TMP, set per cluster below.
# shellcheck source=bench/lib/cluster.sh
. "$HERE/lib/cluster.sh"
cleanup() {
  stop_cluster
  rm -rf "$WORK"
}
trap cleanup EXIT

start_cluster_in() { # start_cluster_in NAME: data and logs in $WORK/NAME
  TMP=$WORK/$1
  mkdir -p "$TMP"
  NODE_PIDS=()
  start_node 2; start_node 3; sleep 0.3; start_node 1 --init
  # A leader, and nothing written: a restore needs an empty cluster (the
  # lock cycle of lib/cluster.sh's start_cluster would make it non-empty).
  for _ in $(seq 240); do
    [ "$(status_field leader_id 2>/dev/null || echo 0)" != 0 ] && return 0
    sleep 0.5
  done
  echo "backup.sh: cluster $1 elected no leader in 2 minutes" >&2; exit 1
}
peak_rss_mib() { # the largest VmHWM of the running nodes, MiB
  local most=0 kb
  for p in "${NODE_PIDS[@]}"; do
    kb=$(awk '/^VmHWM/ { print $2 }' "/proc/$p/status" 2>/dev/null || echo 0)
    [ "${kb:-0}" -gt "$most" ] && most=$kb
  done
  echo $((most / 1024))
}
status_field() { # status_field NAME: the field of `raftlock status --json`
  "$RAFTLOCK" --endpoints "$EP" status --json | python3 -c "import json, sys; print(json.load(sys.stdin)['$1'])"
}

log "temp folder $WORK; $LOCKS locks, $SESSIONS more sessions; load $(cut -d' ' -f1-3 /proc/loadavg)"
start_cluster_in a
log "filling: $LOCKS held locks"
"$BIN_DIR/raftlock-bench" scale --kind locks --endpoints "$EP" --steps "$LOCKS" --secs 1 --clients 4 --no-cleanup --quiet \
  >"$WORK/scale.log" 2>&1 || { cat "$WORK/scale.log"; exit 1; }
if [ "$SESSIONS" -gt 0 ]; then
  log "filling: $SESSIONS more open sessions"
  "$BIN_DIR/raftlock-bench" scale --kind sessions --endpoints "$EP" --steps "$SESSIONS" --secs 1 --clients 4 --no-cleanup --quiet \
    >"$WORK/scale-sessions.log" 2>&1 || { cat "$WORK/scale-sessions.log"; exit 1; }
fi
FILE=$WORK/backup.bin
t=$(now)
"$RAFTLOCK" --endpoints "$EP" snapshot save "$FILE" | tee "$WORK/save.out"
SAVE_S=$(since "$t")
SIZE_MB=$(awk -v b="$(stat -c %s "$FILE")" 'BEGIN { printf "%.1f", b / 1e6 }')
SAVE_RSS=$(peak_rss_mib)
log "a fourth node joins the full cluster (raftlock members add 4)"
start_node 4
t=$(now)
"$RAFTLOCK" --endpoints "$EP" members add 4 "127.0.0.1:$((BASE_PORT + 4))" --timeout 600
JOIN_S=$(since "$t")
JOIN_RSS=$(awk '/^VmHWM/ { printf "%d", $2 / 1024 }' "/proc/${NODE_PIDS[3]}/status")
stop_cluster

t=$(now)
"$RAFTLOCK" snapshot inspect --json "$FILE" >"$WORK/inspect.json"
INSPECT_S=$(since "$t")
read -r SESSIONS GRANTS < <(python3 -c "import json; h = json.load(open('$WORK/inspect.json')); print(h['sessions'], h['grants'])")
[ "$GRANTS" -ge "$LOCKS" ] || { echo "backup.sh: the backup holds $GRANTS grants, not $LOCKS" >&2; exit 1; }

log "restoring through the API into a new cluster"
start_cluster_in b
t=$(now)
"$RAFTLOCK" --endpoints "$EP" snapshot restore "$FILE"
RESTORE_S=$(since "$t")
RESTORE_RSS=$(peak_rss_mib)
[ "$(status_field sessions)" = "$SESSIONS" ] || { echo "backup.sh: the restored cluster holds $(status_field sessions) sessions, not $SESSIONS" >&2; exit 1; }
stop_cluster

log "restoring at bootstrap (raftlockd restore) into a third cluster"
t=$(now)
"$BIN_DIR/raftlockd" restore "$FILE" --data-dir "$WORK/c/raftlock-1" >/dev/null
start_cluster_in c
for _ in $(seq 1200); do
  [ -e "$WORK/c/raftlock-1/restore.applied" ] && break
  [ -e "$WORK/c/raftlock-1/restore.refused" ] && { echo "backup.sh: the bootstrap restore was refused: $(tail -5 "$WORK/c/raftlock-1.log")" >&2; exit 1; }
  sleep 0.5
done
[ -e "$WORK/c/raftlock-1/restore.applied" ] || { echo "backup.sh: the bootstrap restore did not finish in 10 minutes" >&2; exit 1; }
BOOT_S=$(since "$t")
BOOT_RSS=$(peak_rss_mib)
[ "$(status_field sessions)" = "$SESSIONS" ] || { echo "backup.sh: the bootstrapped cluster holds $(status_field sessions) sessions, not $SESSIONS" >&2; exit 1; }
stop_cluster

cat <<EOF

backup of $GRANTS grants, $SESSIONS sessions: $SIZE_MB MB
| step | seconds | largest node's peak RSS |
|---|---|---|
| snapshot save (3 nodes, $LOCKS held) | $SAVE_S | $SAVE_RSS MiB |
| members add of a 4th node, until it is a voter | $JOIN_S | $JOIN_RSS MiB (the new node) |
| snapshot inspect | $INSPECT_S | |
| snapshot restore into an empty cluster | $RESTORE_S | $RESTORE_RSS MiB |
| raftlockd restore, start, until applied | $BOOT_S | $BOOT_RSS MiB |
EOF
