#!/usr/bin/env bash
# Healthy lock holders of the Rust, Go, Python and PHP clients, at their defaults
# (grace 750 ms), held for a long time on a busy machine: issue 44's check
# that the short default grace brings no false loss. It starts a cluster
# of three `raftlockd run` processes on free loopback ports (data in a
# temporary directory), one CPU hog per core at normal priority, and then,
# all at the same time, HOLDERS holders with each client, each taking a
# lock of its own and holding it for DURATION seconds, looking every
# 100 ms whether it is held and whether it is lost:
#
#   Rust    client/examples/soak_holder.rs: tasks sharing one Client, a
#           session each at SessionOptions::default() (ttl 10 s),
#           Guard::is_held() and the lease state;
#   Go      scripts/soak/holder.go: goroutines sharing one Client (TTL 10 s,
#           the default), Valid() and Lost(), OnLost counted;
#   Python  scripts/soak/holder.py: half threads sharing a raftlock.Client,
#           half tasks sharing a raftlock.aio.Client (ttl 10 s, the
#           default), lock.valid and lock.lost, on_lost counted;
#   PHP     scripts/soak/holder.php: a process per holder (ttl 30 s, which
#           must be given), state(), then isHeld() (which renews and pumps
#           the process's stream).
#
#   scripts/soak-clients.sh                        # 20 per client, 600 s, nproc hogs
#   DURATION=60 HOLDERS=5 scripts/soak-clients.sh  # a short run
#   scripts/soak-clients.sh --duration 60 --holders 5 --hogs 0 --clients go,php
#
# Options (or the environment variable in brackets): --duration S
# [DURATION, default 600], --holders N per client [HOLDERS, 20], --hogs N
# [HOGS, default nproc; 0: none], --python-sync N of the Python holders on
# the sync API, the rest on asyncio [PYTHON_SYNC, half], --clients LIST
# [CLIENTS, rust,go,python,php]. The binaries: RAFTLOCKD (default
# target/debug/raftlockd), SOAK_HOLDER_RUST (default: built with `cargo
# build -p raftlock-client --example soak_holder`), GO, PYTHON (an interpreter with grpcio and
# protobuf, e.g. a virtualenv with client/python/requirements-test.txt;
# the client itself is taken from client/python/src), PHP (with php-curl).
#
# Prints one line per client: holders, duration, lost locks (and lost
# notices), jeopardy episodes with their total and longest duration (timed
# by the 100 ms polls), holders that held their lock at the end (by the
# client's count and by CheckFence on the cluster), and the load average
# (1 min, mean and max of samples every 5 s, over the run). Exits non-zero
# if any holder saw its lock lost, did not hold it at the end, or failed.
# Each holder's events (jeopardy, held again, lost), its RESULT line, the
# leader changes and the nodes' logs are kept in target/soak-clients/.
# Everything it started is killed when it exits, however it exits (the
# children also get SIGKILL if this shell dies, even by SIGKILL; only the
# temporary directory is left behind then).
set -euo pipefail
cd "$(dirname "$0")/.."

duration=${DURATION:-600}
holders=${HOLDERS:-20}
hogs=${HOGS:-$(nproc)}
python_sync=${PYTHON_SYNC:-}
clients=${CLIENTS:-rust,go,python,php}
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration=$2; shift 2 ;;
    --holders) holders=$2; shift 2 ;;
    --hogs) hogs=$2; shift 2 ;;
    --python-sync) python_sync=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
python_sync=${python_sync:-$((holders / 2))}
raftlockd=${RAFTLOCKD:-target/debug/raftlockd}
go=${GO:-go}
python=${PYTHON:-python3}
php=${PHP:-php}
want() { [[ ",$clients," == *",$1,"* ]]; }

[ -x "$raftlockd" ] || { echo "no raftlockd at $raftlockd: build it (cargo build -p raftlock-node --bin raftlockd) or set RAFTLOCKD" >&2; exit 2; }
out="${CARGO_TARGET_DIR:-target}/soak-clients"
rm -rf "$out"
mkdir -p "$out"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/raftlock-soak.XXXXXX")

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
# Every child is started as `"${child[@]}" COMMAND... &`: a simple command,
# so the background process is COMMAND itself (its pid is $!, the pid the
# cleanup kills), and it gets SIGKILL if this shell dies, even by SIGKILL.
child=(setpriv --pdeathsig KILL)

# ---- the holders' programs, ready before anything starts
rust_holder=${SOAK_HOLDER_RUST:-}
if want rust && [ -z "$rust_holder" ]; then
  echo "== building client/examples/soak_holder.rs"
  cargo build -q -p raftlock-client --example soak_holder
  rust_holder="${CARGO_TARGET_DIR:-target}/debug/examples/soak_holder"
fi
if want go; then
  echo "== building scripts/soak/holder.go"
  (cd scripts/soak && GOPROXY=off GOFLAGS=-mod=mod "$go" build -o "$tmp/holder-go" .)
fi
if want python; then
  PYTHONPATH="$PWD/client/python/src" "$python" -c 'import raftlock, raftlock.aio' \
    || { echo "PYTHON=$python cannot import the client (pip install -r client/python/requirements-test.txt)" >&2; exit 2; }
fi
if want php; then
  "$php" -r 'exit(extension_loaded("curl") ? 0 : 1);' || { echo "PHP=$php has no curl extension" >&2; exit 2; }
fi

# ---- the cluster
status() { curl -s -m 2 -X POST -H 'Content-Type: application/json' -d '{}' "http://$1/v1/cluster/Status" || true; }
field() { sed -nE "s/.*\"$1\":\"([^\"]*)\".*/\1/p"; }
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start_cluster() {
  local base i peers="" n
  while :; do
    base=$((20000 + RANDOM % 30000))
    port_free "$base" && port_free $((base + 1)) && port_free $((base + 2)) && break
  done
  addrs=("127.0.0.1:$base" "127.0.0.1:$((base + 1))" "127.0.0.1:$((base + 2))")
  for i in 1 2 3; do peers+="${peers:+,}$i=${addrs[$((i - 1))]}"; done
  node_pids=()
  # Node 1 bootstraps: started last, so that its first election finds its peers.
  for i in 3 2 1; do
    local args=(run --id "$i" --listen "${addrs[$((i - 1))]}" --data-dir "$tmp/node-$i" --peers "$peers" --insecure-peers)
    [ "$i" = 1 ] && args+=(--init)
    RUST_LOG=${RUST_LOG:-warn} "${child[@]}" "$raftlockd" "${args[@]}" >> "$out/node-$i.log" 2>&1 &
    pids+=($!)
    node_pids+=($!)
  done
  for _ in $(seq 1 300); do
    for p in "${node_pids[@]}"; do kill -0 "$p" 2>/dev/null || return 1; done
    local leaders=""
    for a in "${addrs[@]}"; do leaders+="$(status "$a" | field leader_addr) "; done
    n=$(echo "$leaders" | tr ' ' '\n' | grep -c . || true)
    if [ "$n" = 3 ] && [ "$(echo "$leaders" | tr ' ' '\n' | grep . | sort -u | wc -l)" = 1 ]; then
      return 0
    fi
    sleep 0.1
  done
  return 1
}

for try in 1 2 3 4 5; do
  start_cluster && break
  for p in "${node_pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"/node-*
  [ "$try" = 5 ] && { echo "the cluster did not start; see $out/node-*.log" >&2; exit 1; }
done
endpoints=$(IFS=,; echo "${addrs[*]}")
echo "== cluster of 3 raftlockd processes on $endpoints ($raftlockd)"

# ---- the load
for _ in $(seq 1 "$hogs"); do
  # A busy loop of a shell: one core's worth of work, no I/O.
  "${child[@]}" bash -c 'while :; do :; done' &
  pids+=($!)
done

# ---- the holders, all at once
py_async=$((holders - python_sync))
started=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
echo "== $started: $holders holders per client ($clients), ${duration} s each, $hogs CPU hogs; events in $out/"
holder_pids=()
if want rust; then
  "${child[@]}" "$rust_holder" "$endpoints" "$holders" "$duration" \
    > "$out/rust.results" 2> "$out/rust.events" &
  pids+=($!); holder_pids+=($!)
fi
if want go; then
  "${child[@]}" "$tmp/holder-go" -endpoints "$endpoints" -holders "$holders" -duration "${duration}s" \
    > "$out/go.results" 2> "$out/go.events" &
  pids+=($!); holder_pids+=($!)
fi
if want python; then
  for api in sync asyncio; do
    n=$python_sync; [ "$api" = asyncio ] && n=$py_async
    [ "$n" -gt 0 ] || continue
    PYTHONPATH="$PWD/client/python/src" "${child[@]}" "$python" scripts/soak/holder.py "$api" "$endpoints" "$n" "$duration" \
      > "$out/python-$api.results" 2> "$out/python-$api.events" &
    pids+=($!); holder_pids+=($!)
  done
fi
if want php; then
  for i in $(seq 0 $((holders - 1))); do
    "${child[@]}" "$php" scripts/soak/holder.php "$endpoints" "soak/php/$i" "$duration" \
      >> "$out/php.results" 2>> "$out/php.events" &
    pids+=($!); holder_pids+=($!)
  done
fi

# While they hold: the load average every 5 s, and the leader's changes.
loads=()
leader=""
running() { for p in "${holder_pids[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
while running; do
  for _ in 1 2 3 4 5; do running && sleep 1; done
  loads+=("$(cut -d' ' -f1 /proc/loadavg)")
  for a in "${addrs[@]}"; do
    s=$(status "$a")
    now_leader="$(echo "$s" | field leader_addr) term $(echo "$s" | field term)"
    [ "$now_leader" != " term " ] && break
  done
  if [ "$now_leader" != " term " ] && [ "$now_leader" != "$leader" ]; then
    echo "$(date -u +%H:%M:%S) leader $now_leader" >> "$out/leader.log"
    leader=$now_leader
  fi
done
failed_programs=0
for p in "${holder_pids[@]}"; do wait "$p" || failed_programs=$((failed_programs + 1)); done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
load=$(printf '%s\n' "${loads[@]:-0}" | awk '{ s += $1; if ($1 > m) m = $1 } END { printf "%.2f mean, %.2f max", s / NR, m }')

# ---- the summary
# summarize LABEL EXPECTED FILE...: one line from the holders' RESULT lines;
# fails if a holder lost its lock, did not hold it at the end, or is missing.
summarize() {
  local label=$1 expected=$2
  shift 2
  cat "$@" 2>/dev/null | awk -v label="$label" -v expected="$expected" -v duration="$duration" -v load="$load" '
    /^RESULT / {
      n++
      delete v
      for (i = 2; i <= NF; i++) { k = substr($i, 1, index($i, "=") - 1); if (k == "error") break; v[k] = substr($i, index($i, "=") + 1) }
      lost += v["lost"]; notices += v["on_lost"]; episodes += v["jeopardy"]; total += v["jeopardy_total"]
      if (v["jeopardy_longest"] + 0 > longest) longest = v["jeopardy_longest"] + 0
      held += v["held_at_end"]
      if (index($0, "error=") && $0 !~ /error=(""|'\'''\'')$/) errors[++ne] = $0
    }
    END {
      printf "%-16s %d holders, %d s: lost %d (lost notices %d), jeopardy %d episodes (total %.1f s, longest %.1f s), held at the end %d/%d; load average %s\n",
        label ":", expected, duration, lost, notices, episodes, total, longest, held, expected, load
      for (i = 1; i <= ne && i <= 5; i++) print "    " errors[i]
      exit (n == expected && lost == 0 && held == expected) ? 0 : 1
    }'
}

changes=$(($(cat "$out/leader.log" 2>/dev/null | wc -l) - 1))
echo "== $(date -u '+%Y-%m-%d %H:%M:%S UTC'): done (load average at the end: $load_end; leader changes seen: $((changes < 0 ? 0 : changes)), $out/leader.log)"
failed=0
if want rust; then summarize rust "$holders" "$out/rust.results" || failed=1; fi
if want go; then summarize go "$holders" "$out/go.results" || failed=1; fi
if want python; then
  summarize python "$holders" "$out"/python-*.results || failed=1
  # The same, for each of its two APIs (their failures are the line above's).
  if [ "$python_sync" -gt 0 ]; then summarize "  sync" "$python_sync" "$out/python-sync.results" | head -1 || true; fi
  if [ "$py_async" -gt 0 ]; then summarize "  asyncio" "$py_async" "$out/python-asyncio.results" | head -1 || true; fi
fi
if want php; then summarize php "$holders" "$out/php.results" || failed=1; fi
if [ "$failed_programs" -gt 0 ]; then
  echo "$failed_programs holder programs exited with an error: see $out/*.events"
  failed=1
fi
[ "$failed" -eq 0 ] || { echo "== FAILED: a lock was lost, not held at the end, or a holder failed (events in $out/)"; exit 1; }
echo "== passed: no lock lost, every lock held at the end"
