#!/usr/bin/env bash
# What `raftlock-bench proxy` (compare.sh --rtt) costs by itself: one Redis
# (no persistence), then redis-benchmark PINGs to it directly, through the
# proxy with no delay, and through the proxy with --delay-us D each way:
# one connection (round-trip latency), then 64 (requests/s, and the
# proxy's CPU per request from /proc/PID/stat). See
# docs/performance/datacenter-round-trip.md.
#
#   bench/proxy-cost.sh [--delay-us D] [--requests N]
#
# Installs Debian's redis-server when it is missing (as root). Environment:
# BIN_DIR (a prebuilt raftlock-bench; else a release build into
# CARGO_TARGET_DIR), BASE_PORT (default 27390: Redis on +1, the proxy on +2).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
DELAY_US=100
REQUESTS=200000
while [ $# -gt 0 ]; do
  case "$1" in
    --delay-us) DELAY_US=$2; shift ;;
    --requests) REQUESTS=$2; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "proxy-cost.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-benchmark >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "proxy-cost.sh: installing redis-server" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server redis-tools >/dev/null
  else
    echo "proxy-cost.sh: redis-server and redis-benchmark are missing (Debian: apt-get install redis-server, as root)" >&2
    exit 1
  fi
fi

if [ -z "${BIN_DIR:-}" ]; then
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
  (cd "$ROOT" && cargo build --release -q -p raftlock-bench --bin raftlock-bench)
  BIN_DIR=$CARGO_TARGET_DIR/release
fi
BASE_PORT=${BASE_PORT:-27390}
REDIS_PORT=$((BASE_PORT + 1))
PROXY_PORT=$((BASE_PORT + 2))
TMP=$(mktemp -d "${TMPDIR:-/tmp}/raftlock-proxy-cost.XXXXXX")
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

wait_port() { # wait_port PORT: until something accepts on it (at most 10 s)
  local _
  for _ in $(seq 100); do
    (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "proxy-cost.sh: nothing listens on port $1" >&2
  exit 1
}
cpu_secs() { # user + system CPU seconds of process $1 so far
  awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$1/stat"
}
# redis-benchmark --csv: "test","rps","avg","min","p50","p95","p99","max" (ms).
field() { tail -1 | tr -d '"' | cut -d, -f"$1"; }

redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no \
  --dir "$TMP" --daemonize no --logfile "$TMP/redis.log" &
PIDS+=($!)
wait_port "$REDIS_PORT"

echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-24s %14s %16s %22s\n' "" "1 conn p50 ms" "64 conns req/s" "proxy CPU µs/request"
measure() { # measure LABEL PORT [PROXY_PID]
  local p50 rps c0 c1 per="-"
  p50=$(redis-benchmark -p "$2" -c 1 -n 20000 -t ping_mbulk --csv | field 5)
  [ -n "${3:-}" ] && c0=$(cpu_secs "$3")
  rps=$(redis-benchmark -p "$2" -c 64 -n "$REQUESTS" -t ping_mbulk --csv | field 2)
  if [ -n "${3:-}" ]; then
    c1=$(cpu_secs "$3")
    per=$(awk -v a="$c0" -v b="$c1" -v n="$REQUESTS" 'BEGIN { printf "%.1f", (b - a) * 1e6 / n }')
  fi
  printf '%-24s %14s %16s %22s\n' "$1" "$p50" "$rps" "$per"
}
measure direct "$REDIS_PORT"
for d in 0 "$DELAY_US"; do
  "$BIN_DIR/raftlock-bench" proxy --route "127.0.0.1:$PROXY_PORT=127.0.0.1:$REDIS_PORT" \
    --delay-us "$d" 2>>"$TMP/proxy.log" &
  proxy=$!
  wait_port "$PROXY_PORT"
  measure "proxy, $d µs each way" "$PROXY_PORT" "$proxy"
  kill "$proxy"
  wait "$proxy" 2>/dev/null || true
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
