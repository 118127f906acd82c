#!/usr/bin/env bash
# Flaky tests found, not hidden: runs every integration-test binary of the
# workspace (the ones that start clusters, processes and servers: `tests/`,
# `node/tests/`, `client/tests/`, `client/fenced/tests/`, `jepsen/tests/`)
# N times under load (one CPU hog per core beside it, as
# scripts/test-under-load.sh), and lists every failure with its output.
#
#   scripts/test-campaign.sh N [FILTER]
#   scripts/test-campaign.sh 10              # every binary, 10 runs each
#   scripts/test-campaign.sh 3 cluster       # binaries whose name has "cluster"
#   JOBS=2 HOGS=0 scripts/test-campaign.sh 10   # two binaries at a time,
#                                               # the load from elsewhere
#
# Each binary runs as `cargo test` runs it (in its package's directory,
# with the tests built once up front). Failed runs are kept in
# target/test-campaign/BINARY-RUN.log (passed runs are not); the summary
# lists each binary's passes and failures, and the failing tests of each
# failed run. Exit status 1 if anything failed.
# HOGS=N sets the number of hogs (default: nproc); JOBS=N runs N binaries
# side by side (default 1; the tests wait on clusters more than they
# compute, and every one is meant to pass on a loaded machine). Tests that
# repeat a racy window run RAFTLOCK_ROUNDS times their rounds (default
# here 4; plain `cargo test` runs 1).
set -euo pipefail
export RAFTLOCK_ROUNDS="${RAFTLOCK_ROUNDS:-4}"
cd "$(dirname "$0")/.."
n=${1:?N (runs of each binary)}
filter=${2:-}
hogs=${HOGS:-$(nproc)}
jobs=${JOBS:-1}
out="${CARGO_TARGET_DIR:-target}/test-campaign"
rm -rf "$out"
mkdir -p "$out"

echo "== building the tests (no load yet)"
# package<TAB>test target<TAB>executable<TAB>package directory, for every
# integration test of the workspace.
cargo test --workspace --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys
seen = set()
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    t = m.get("target") or {}
    if m.get("reason") == "compiler-artifact" and t.get("kind") == ["test"] and m.get("executable"):
        pkg = m["package_id"]
        # "path+file:///.../node#raftlock-node@0.1.0" or "name 0.1.0 (path+...)"
        # ("path+file:///.../foo#0.1.0" when the directory is the name)
        if "#" in pkg:
            frag = pkg.split("#", 1)[1]
            name = frag.split("@", 1)[0] if "@" in frag else pkg.split("#", 1)[0].rsplit("/", 1)[1]
        else:
            name = pkg.split(" ", 1)[0]
        key = (name, t["name"])
        if key not in seen:
            seen.add(key)
            d = m["manifest_path"].rsplit("/", 1)[0]
            print("\t".join([name, t["name"], m["executable"], d]))
' > "$out/binaries.tsv"
if [ -n "$filter" ]; then
  awk -F'\t' -v f="$filter" 'index($1 "/" $2, f)' "$out/binaries.tsv" > "$out/selected.tsv"
else
  cp "$out/binaries.tsv" "$out/selected.tsv"
fi
count=$(wc -l < "$out/selected.tsv")
[ "$count" -gt 0 ] || { echo "no test binary matches '$filter'" >&2; exit 2; }
echo "== $count test binaries, $n runs each, $jobs at a time, with $hogs CPU hogs"

pids=()
stop_hogs() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  pids=()
}
trap stop_hogs EXIT INT TERM
for _ in $(seq 1 "$hogs"); do
  ( while :; do :; done ) &
  pids+=($!)
done

# jepsen/tests/t10_checkers_can_fail.rs runs this raftlockd (the build
# above made it) instead of building one itself.
RAFTLOCK_JEPSEN_RAFTLOCKD="$(pwd)/${CARGO_TARGET_DIR:-target}/debug/raftlockd"
case "${CARGO_TARGET_DIR:-}" in /*) RAFTLOCK_JEPSEN_RAFTLOCKD="$CARGO_TARGET_DIR/debug/raftlockd" ;; esac
export RAFTLOCK_JEPSEN_RAFTLOCKD
case "$out" in /*) ;; *) out="$(pwd)/$out" ;; esac

# One binary's N runs; its summary line goes to $out/BINARY.summary.
campaign_of() {
  local pkg=$1 bin=$2 exe=$3 dir=$4 passes=0 fails=() run log start
  for run in $(seq 1 "$n"); do
    log="$out/$bin-$run.log"
    start=$SECONDS
    if (cd "$dir" && CARGO_MANIFEST_DIR="$dir" "$exe") > "$log" 2>&1 < /dev/null; then
      passes=$((passes + 1))
      rm -f "$log"
    else
      fails+=("$run")
      echo "  $bin run $run FAILED after $((SECONDS - start)) s: $log"
      grep -E '^test .* FAILED|^---- .* stdout ----' "$log" | sed 's/^/    /' | head -10 || true
    fi
  done
  echo "$pkg/$bin: $passes of $n passed${fails:+; failed runs: ${fails[*]}}" \
    | tee "$out/$bin.summary"
}

started=$SECONDS
running=0
# The binaries' jobs only: a bare `wait` would also wait for the hogs,
# which never end (the run hung after its last binary until 2026-12-01).
campaigns=()
while IFS=$'\t' read -r pkg bin exe dir; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true   # a binary's job: the hogs never end
    running=$((running - 1))
  fi
  campaign_of "$pkg" "$bin" "$exe" "$dir" < /dev/null &
  campaigns+=($!)
  running=$((running + 1))
done < "$out/selected.tsv"
for p in "${campaigns[@]}"; do wait "$p" 2>/dev/null || true; done
stop_hogs
summary="$out/summary.txt"
cat "$out"/*.summary > "$summary"
failed=$(grep -c 'failed runs' "$summary" || true)
echo "== $(ls "$out"/*-[0-9]*.log 2>/dev/null | wc -l) failed runs in $failed binaries, $((SECONDS - started)) s; summary in $summary"
[ "$failed" -eq 0 ]
