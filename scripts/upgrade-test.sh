#!/usr/bin/env bash
# A rolling upgrade, not only a rolling restart (node/tests/upgrade.rs):
# builds the previous release's raftlockd (the commit in
# deploy/upgrade-from, or REF) in a worktree with a target directory of
# its own, then starts a three-node cluster of it and upgrades it to this
# tree one node at a time, under load, asserting that no lock fails.
#
#   scripts/upgrade-test.sh [REF]
#
# The old binary is kept (target/upgrade/raftlockd-SHA), so a second run
# only runs the test. The first build of another commit is a full debug
# build of the node (several minutes on 2 cores), which is why
# `cargo test` and CI leave this test out.
set -euo pipefail
cd "$(dirname "$0")/.."
ref=${1:-$(grep -v '^#' deploy/upgrade-from | head -n 1)}
sha=$(git rev-parse --verify "$ref^{commit}")
base="${CARGO_TARGET_DIR:-target}/upgrade"
mkdir -p "$base"
base=$(cd "$base" && pwd)
old="$base/raftlockd-$sha"
if [ ! -x "$old" ]; then
  tree="$base/tree-$sha"
  rm -rf "$tree"
  git worktree prune
  git worktree add --detach "$tree" "$sha"
  echo "== building raftlockd at $sha (the previous release)"
  (cd "$tree" && CARGO_TARGET_DIR="$base/target" cargo build -p raftlock-node --bin raftlockd)
  cp "$base/target/debug/raftlockd" "$old"
  git worktree remove --force "$tree"
fi
echo "== upgrading a cluster of $sha's raftlockd to this tree, under load"
RAFTLOCK_PREVIOUS_RAFTLOCKD="$old" \
  cargo test -p raftlock-node --test upgrade -- --ignored --nocapture
