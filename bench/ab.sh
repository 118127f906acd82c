#!/usr/bin/env bash
# Before and after one change: runs bench/profile.sh on two builds in
# turn (round 1 before then after, round 2 after then before, ...), for
# each workload, and prints one line per run: ops/s, the servers' CPU s
# per 1,000 operations, the contended hand-off and the nodes' context
# switches per 1,000 operations. See docs/performance/reproduce.md,
# "Before and after one change".
#
#   bench/ab.sh BEFORE_DIR AFTER_DIR [--rounds N] [--workloads W,W] [--clients N]
#               [--duration S] [--out DIR]
#
# BEFORE_DIR and AFTER_DIR each hold a raftlockd and a raftlock-bench
# (copies of target/release from the two commits). Each run's whole
# profile.sh output is kept in OUT (default: a new folder under /tmp).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ $# -lt 2 ]; then
  sed -n '2,13p' "$0"
  exit 2
fi
BEFORE=$1
AFTER=$2
shift 2
ROUNDS=2
WORKLOADS=uncontended,contended
CLIENTS=64
DURATION=10
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift ;;
    --workloads) WORKLOADS=$2; shift ;;
    --clients) CLIENTS=$2; shift ;;
    --duration) DURATION=$2; shift ;;
    --out) OUT=$2; shift ;;
    *) echo "ab.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
for d in "$BEFORE" "$AFTER"; do
  for b in raftlockd raftlock-bench; do
    [ -x "$d/$b" ] || { echo "ab.sh: $d/$b is missing" >&2; exit 2; }
  done
done
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/raftlock-ab.XXXXXX")}
mkdir -p "$OUT"
echo "ab.sh: before $BEFORE, after $AFTER, $CLIENTS clients, ${DURATION} s a run, $ROUNDS rounds; outputs in $OUT"
printf '%-12s %-6s %5s %9s %10s %22s %22s\n' workload build round ops/s "CPU s/1k" "hand-off p50/p99 ms" "switches vol/invol/1k"
for r in $(seq 1 "$ROUNDS"); do
  for w in ${WORKLOADS//,/ }; do
    if [ $((r % 2)) = 1 ]; then order="before after"; else order="after before"; fi
    for which in $order; do
      dir=$BEFORE
      [ "$which" = after ] && dir=$AFTER
      log="$OUT/$w-$which-$r.txt"
      BIN_DIR=$dir "$HERE/profile.sh" --workload "$w" --clients "$CLIENTS" --duration "$DURATION" \
        --out "$OUT/$w-$which-$r" >"$log" 2>&1 || echo "ab.sh: profile.sh failed, see $log" >&2
      ops=$(awk '/ ops\/s / { for (i = 1; i < NF; i++) if ($(i + 1) == "ops/s") { print $i; exit } }' "$log")
      cpu=$(sed -n 's/.*CPU s per 1,000 ops: servers \([0-9.]*\).*/\1/p' "$log" | head -n 1)
      hand=$(sed -n 's/.*hand-off.*p50 \([0-9.]*\) ms *p99 \([0-9.]*\) ms.*/\1\/\2/p' "$log" | head -n 1)
      sw=$(awk '$1 == "all" { print $2 "/" $3 }' "$log" | head -n 1)
      printf '%-12s %-6s %5s %9s %10s %22s %22s\n' "$w" "$which" "$r" "${ops:--}" "${cpu:--}" "${hand:--}" "${sw:--}"
    done
  done
done
