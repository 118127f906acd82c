#!/usr/bin/env bash
# `cargo test --workspace` (README's second command) with CPU hogs beside
# it: one busy loop per core (`nproc`), at normal priority, for as long as
# the tests run. The tests assert behaviour, with deadlines far above what
# an idle machine needs, so they pass on a machine busy with other work.
#
#   scripts/test-under-load.sh [RUNS] [-- CARGO TEST ARGS...]
#   scripts/test-under-load.sh            # one run of the whole workspace
#   scripts/test-under-load.sh 3          # three runs; fails if any fails
#   scripts/test-under-load.sh 1 -- -p raftlock-tests --test cluster
#
# The tests are built first, without the hogs (a build under load proves
# nothing and takes twice as long). Each run's output is kept in
# target/test-under-load/run-N.log; the summary says how each run ended
# and how long it took. HOGS=N sets the number of hogs (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-1}
shift $(( $# >= 1 ? 1 : 0 ))
[ "${1:-}" = "--" ] && shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--workspace)
hogs=${HOGS:-$(nproc)}
out="${CARGO_TARGET_DIR:-target}/test-under-load"
mkdir -p "$out"

echo "== building the tests (no load yet)"
cargo test "${args[@]}" --no-run

pids=()
stop_hogs() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  pids=()
}
trap stop_hogs EXIT INT TERM

failed=0
for run in $(seq 1 "$runs"); do
  for _ in $(seq 1 "$hogs"); do
    # A busy loop of the shell itself: one core's worth of work, no I/O.
    ( while :; do :; done ) &
    pids+=($!)
  done
  log="$out/run-$run.log"
  start=$SECONDS
  if cargo test "${args[@]}" > "$log" 2>&1; then
    status=passed
  else
    status=FAILED
    failed=$((failed + 1))
  fi
  load=$(cut -d' ' -f1 /proc/loadavg)
  stop_hogs
  echo "run $run of $runs: $status in $((SECONDS - start)) s with $hogs CPU hogs (load average at the end: $load); output in $log"
  if [ "$status" = FAILED ]; then
    grep -E '^(test .* FAILED|---- .* stdout ----|failures:|error: test failed)' "$log" | head -20 || true
  fi
done
echo "== $((runs - failed)) of $runs runs passed under load"
[ "$failed" -eq 0 ]
