#!/usr/bin/env bash
# Checks the dependency tree against deny.toml: duplicate versions, licenses,
# sources (crates.io only). Installs cargo-deny first if it is missing
# (a source build: about 12 minutes on 2 cores, once per machine).
#
#   scripts/deny.sh              offline checks: bans licenses sources
#   scripts/deny.sh advisories   also the RustSec advisories (needs network)
#
# Not part of .ci/run: the install alone would take most of CI's budget.
set -euo pipefail
cd "$(dirname "$0")/.."

DENY_VERSION=0.20.2
if ! cargo deny --version 2>/dev/null | grep -q "$DENY_VERSION"; then
  echo "== installing cargo-deny $DENY_VERSION"
  cargo install cargo-deny --locked --version "$DENY_VERSION"
fi

checks=(bans licenses sources)
if [ "${1:-}" = advisories ]; then
  checks+=(advisories)
fi
cargo deny check "${checks[@]}"
