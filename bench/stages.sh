#!/usr/bin/env bash
# Where a raftlock write's time goes: starts a 3-node raftlock (3 x
# `raftlockd run` on 127.0.0.1, data in a temp folder) and runs
# `raftlock-bench run --trace-stages` for each workload and client count,
# printing a per-stage p50/p99 table each time. See
# docs/performance/reproduce.md, "Where a write's time goes".
#
#   bench/stages.sh [--duration S] [--clients "1 64"] [--workloads "uncontended contended"] [--out DIR]
#
# Environment: BIN_DIR (prebuilt raftlockd and raftlock-bench; else a
# release build into CARGO_TARGET_DIR), BASE_PORT (default 27300: nodes on
# +1..3, their metrics on +11..13), WORK_DIR (parent of the temp folder: put
# it on the disk you want to measure), RAFTLOCKD_ARGS (extra flags for
# every node).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
DURATION=10
CLIENTS="1 64"
WORKLOADS="uncontended contended"
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) DURATION=$2; shift ;;
    --clients) CLIENTS=$2; shift ;;
    --workloads) WORKLOADS=$2; shift ;;
    --out) OUT=$2; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "stages.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

if [ -z "${BIN_DIR:-}" ]; then
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
  (cd "$ROOT" && cargo build --release -q -p raftlock-node -p raftlock-bench --bin raftlockd --bin raftlock-bench)
  BIN_DIR=$CARGO_TARGET_DIR/release
fi
BASE_PORT=${BASE_PORT:-27300}
TMP=$(mktemp -d "${WORK_DIR:-${TMPDIR:-/tmp}}/raftlock-stages.XXXXXX")
OUT=${OUT:-$TMP/results}
mkdir -p "$OUT"
# shellcheck source=bench/lib/cluster.sh
. "$HERE/lib/cluster.sh"
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  stop_cluster
  rm -rf "$TMP/raftlock-"*
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM
start_cluster

echo "stages.sh: $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?'), load $(cut -d' ' -f1-3 /proc/loadavg), results in $OUT"
for w in $WORKLOADS; do
  for c in $CLIENTS; do
    echo
    echo "== $w, $c client(s), ${DURATION} s"
    "$BIN_DIR/raftlock-bench" run --target raftlock --workload "$w" --endpoints "$EP" \
      --clients "$c" --duration "$DURATION" --quiet --trace-stages "$METRICS" \
      --json "$OUT/$w-$c.json"
  done
done
