#!/usr/bin/env bash
# A long campaign: COUNT seeds from FROM, split over JOBS processes at
# once (default: one per core), on a release build (its own target
# directory, target/release). Every seed runs in a fresh process; the
# failed ones are listed at the end of each job's log and replay with
# `./target/release/raftlock-sim --reproduce SEED` (plus the same flags).
#
#   ./campaign.sh FROM COUNT [JOBS] [-- FLAGS...]
#   ./campaign.sh 100000 5000            # seeds 100000..104999
#   ./campaign.sh 200000 1000 2 -- --nodes 5
set -euo pipefail
cd "$(dirname "$0")"
from=${1:?FROM}; count=${2:?COUNT}; jobs=${3:-$(nproc)}
shift $(( $# >= 3 ? 3 : $# ))
[ "${1:-}" = "--" ] && shift
cargo build --release -q
out="target/campaign-$from-$count"
mkdir -p "$out"
per=$(( (count + jobs - 1) / jobs ))
pids=()
for j in $(seq 0 $(( jobs - 1 ))); do
  a=$(( from + j * per )); b=$(( a + per )); end=$(( from + count ))
  [ $b -gt $end ] && b=$end
  [ $a -ge $b ] && continue
  ./target/release/raftlock-sim --seeds "$a..$b" --keep-going "$@" > "$out/job-$j.log" 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
grep -h 'seeds in' "$out"/job-*.log
grep -h '^FAILED\|^seed .* replay' "$out"/job-*.log || true
exit $status
