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
#
# Failed runs are kept in target/test-campaign/BINARY-RUN.log (passed runs
# are not); the summary lists each binary's passes and failures, and the
# failing tests of each failed run. Exit status 1 if anything failed.
# HOGS=N sets the number of hogs (default: nproc). Tests that repeat a racy
# window run RAFTLOCK_ROUNDS times their rounds (default here 4; plain
# `cargo test` runs 1).
set -euo pipefail
export RAFTLOCK_ROUNDS="${RAFTLOCK_ROUNDS:-4}"
cd "$(dirname "$0")/.."
n=${1:?N (runs of each binary)}
filter=${2:-}
hogs=${HOGS:-$(nproc)}
out="${CARGO_TARGET_DIR:-target}/test-campaign"
rm -rf "$out"
mkdir -p "$out"

echo "== building the tests (no load yet)"
# package<TAB>test target, for every integration test of the workspace.
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
        name = pkg.split("#", 1)[1].split("@", 1)[0] if "#" in pkg else pkg.split(" ", 1)[0]
        key = (name, t["name"])
        if key not in seen:
            seen.add(key)
            print(f"{name}\t{t[\"name\"]}")
' > "$out/binaries.tsv"
if [ -n "$filter" ]; then
  grep -- "$filter" "$out/binaries.tsv" > "$out/selected.tsv" || true
else
  cp "$out/binaries.tsv" "$out/selected.tsv"
fi
count=$(wc -l < "$out/selected.tsv")
[ "$count" -gt 0 ] || { echo "no test binary matches '$filter'" >&2; exit 2; }
echo "== $count test binaries, $n runs each, with $hogs CPU hogs"

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

failed=0
summary="$out/summary.txt"
: > "$summary"
while IFS=$'\t' read -r pkg bin; do
  passes=0
  fails=()
  for run in $(seq 1 "$n"); do
    log="$out/$bin-$run.log"
    start=$SECONDS
    if cargo test -q -p "$pkg" --test "$bin" > "$log" 2>&1 < /dev/null; then
      passes=$((passes + 1))
      rm -f "$log"
    else
      fails+=("$run")
      failed=$((failed + 1))
      echo "  $bin run $run FAILED after $((SECONDS - start)) s: $log"
      grep -E '^test .* FAILED|^---- .* stdout ----' "$log" | sed 's/^/    /' | head -10 || true
    fi
  done
  line="$pkg/$bin: $passes of $n passed${fails:+; failed runs: ${fails[*]}}"
  echo "$line" | tee -a "$summary"
done < "$out/selected.tsv"
stop_hogs
echo "== $failed failed runs; summary in $summary"
[ "$failed" -eq 0 ]
