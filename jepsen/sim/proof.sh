#!/usr/bin/env bash
# Issue 32's proof: each patch in proof/ puts back one defect that an
# earlier fix removed (its hunks are marked PLANTED DEFECT). For each, this
# builds the simulator against the patched node in a scratch worktree of
# HEAD, runs the seed recorded for it in proof/seeds and expects that run
# to fail with the recorded violation; then it runs the same seed on the
# code as it is (target/release/raftlock-sim, built first) and expects a
# pass.
#
#   ./proof.sh                 every patch in proof/seeds
#   ./proof.sh NAME...         only these (e.g. disk-full-zombie)
#   ./proof.sh --find NAME...  instead, run seeds 1, 2, 3, ... (up to 300)
#                              on each patched build until one shows the
#                              expected violation, and print it (for
#                              proof/seeds, after the simulator's course
#                              changed)
#
# Run from anywhere; needs git and the Rust toolchain. The patched builds
# share target/proof/ (the first one builds every dependency again, about
# as long as the simulator's first build; each later one rebuilds
# raftlock-node and up, about a minute here).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(git -C "$here" rev-parse --show-toplevel)"
cd "$here"

find=0
if [ "${1:-}" = "--find" ]; then find=1; shift; fi
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  mapfile -t names < <(grep -v '^#' proof/seeds | awk 'NF {print $1}' | sort -u)
fi

echo "== the simulator on the code as it is"
cargo build --release -q
fixed="$here/target/release/raftlock-sim"

scratch="$(mktemp -d)"
cleanup() {
  git -C "$repo" worktree remove --force "$scratch/tree" >/dev/null 2>&1 || true
  rm -rf "$scratch"
}
trap cleanup EXIT
git -C "$repo" worktree add -q --detach "$scratch/tree" HEAD
# The simulator itself as it is here (uncommitted changes included).
cp -r "$here/src" "$here/build.rs" "$here/Cargo.toml" "$here/Cargo.lock" "$scratch/tree/jepsen/sim/"

failed=0
for name in "${names[@]}"; do
  patch="proof/$name.patch"
  [ -f "$patch" ] || { echo "no $patch"; exit 2; }
  grep -q 'PLANTED DEFECT' "$patch" || { echo "$patch marks no PLANTED DEFECT"; exit 2; }
  echo "== $name: $patch"
  git -C "$scratch/tree" checkout -q -- node client proto
  git -C "$scratch/tree" apply "$here/$patch"
  (cd "$scratch/tree/jepsen/sim" && CARGO_TARGET_DIR="$here/target/proof" cargo build --release -q)
  planted="$here/target/proof/release/raftlock-sim"
  if [ $find = 1 ]; then
    expect="$(awk -v n="$name" '$1 == n {$1 = ""; $2 = ""; sub(/^ +/, ""); print; exit}' proof/seeds)"
    # Without an expectation any failure would do: refuse.
    [ -n "$expect" ] || { echo "   no line for $name in proof/seeds (the violation to look for)"; failed=1; continue; }
    found=""
    for seed in $(seq 1 300); do
      # A failing seed exits 1: keep its output, not the pipe's status
      # (with pipefail a match in a failed run would read as no match).
      out="$("$planted" --seed "$seed" 2>&1 || true)"
      if grep -q "^FAILED: .*$expect" <<<"$out"; then found=$seed; break; fi
    done
    echo "   first seed that finds it: ${found:-none in 1..300}"
    [ -n "$found" ] || failed=1
    continue
  fi
  while read -r pname seed expect; do
    [ "$pname" = "$name" ] || continue
    out="$("$planted" --seed "$seed" 2>&1 || true)"
    if grep -q "^FAILED: .*$expect" <<<"$out"; then
      echo "   seed $seed with the defect: $(grep -m1 "^FAILED" <<<"$out")"
    else
      echo "   seed $seed with the defect: NOT FOUND (expected FAILED: ...$expect)"
      grep -m1 -E '^FAILED|^seed' <<<"$out" || true
      failed=1
    fi
    if "$fixed" --seed "$seed" >/dev/null 2>&1; then
      echo "   seed $seed on the code as it is: passes"
    else
      echo "   seed $seed on the code as it is: FAILS"
      failed=1
    fi
  done < <(grep -v '^#' proof/seeds)
done
if [ $failed = 0 ]; then echo "every planted defect was found, and the fixed code passes its seeds"; fi
exit $failed
