#!/usr/bin/env bash
# Side-by-side benchmark: a 3-node raftlock, a 3-node etcd 3.4 and one
# Redis on 127.0.0.1, the same workloads against each in one run, ratios in
# a table and bench/results/latest.json. See docs/performance/reproduce.md
# (how to run it) and docs/performance/README.md (today's figures).
#
#   bench/compare.sh [--quick] [--rounds N] [--duration S] [--clients N]
#                    [--workloads W,W…] [--rtt MS] [--no-scale] [--no-failover]
#                    [--no-install] [--keep]
#
# --workloads picks from uncontended,contended,semaphore,sessions,oneshot,
# multi (default: all of them); a run of some of them writes
# bench/results/partial-W-W….json instead of latest.json.
#
# --rtt MS adds MS milliseconds of round trip to every link of all three
# systems (client to node and node to node; MS/2 each way) through
# `raftlock-bench proxy`, a user-space TCP proxy, since these kernels have
# no netem; --rtt 0 puts the proxies in with no delay (their own cost).
# Its results go to latest-rttMS.json (partial-W-W…-rttMS.json).
#
# Environment: CARGO_TARGET_DIR (where to build), BIN_DIR (use prebuilt
# raftlockd and raftlock-bench from here and skip the build), BASE_PORT
# (default 27100), WORK_DIR (parent of the temp folder; default $TMPDIR or
# /tmp: put it on the disk you want to measure).
#
# Everything it starts is stopped on exit (trap EXIT), and every load loop
# is bounded in time.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")

QUICK=0
ROUNDS=2
DURATION=15
CLIENTS=64
SCALE=1
FAILOVER=1
INSTALL=1
KEEP=0
RTT=""
FAILOVER_ROUNDS=3
ALL_WORKLOADS=uncontended,contended,semaphore,sessions,oneshot,multi
WORKLOADS=$ALL_WORKLOADS
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --rounds) ROUNDS=$2; shift ;;
    --duration) DURATION=$2; shift ;;
    --clients) CLIENTS=$2; shift ;;
    --workloads) WORKLOADS=$2; shift ;;
    --no-scale) SCALE=0 ;;
    --no-failover) FAILOVER=0 ;;
    --no-install) INSTALL=0 ;;
    --keep) KEEP=1 ;;
    --rtt) RTT=$2; shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "compare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
DELAY_US=0
if [ -n "$RTT" ]; then
  DELAY_US=$(awk -v ms="$RTT" 'BEGIN { if (ms !~ /^[0-9]+(\.[0-9]+)?$/ || ms > 1000) exit 1; printf "%d", ms * 500 + 0.5 }') \
    || { echo "compare.sh: --rtt takes milliseconds from 0 to 1000, e.g. 0.2 (got $RTT)" >&2; exit 2; }
fi
if [ "$QUICK" = 1 ]; then
  ROUNDS=1
  DURATION=5
  FAILOVER_ROUNDS=1
  LOCK_STEPS=1000,10000,100000
  SESSION_STEPS=1000,10000
  HELD_STEPS=0,1000,10000
  SCALE_SECS=4
else
  LOCK_STEPS=1000,10000,100000,1000000
  SESSION_STEPS=1000,10000,100000
  HELD_STEPS=0,1000,10000,100000
  SCALE_SECS=8
fi

log() { printf '[compare %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

# --- 1. what is missing ------------------------------------------------------
PKGROOT=""
install_missing() {
  local need=()
  command -v etcd >/dev/null || need+=(etcd-server)
  command -v etcdctl >/dev/null || need+=(etcd-client)
  command -v redis-server >/dev/null || need+=(redis-server)
  command -v protoc >/dev/null || need+=(protobuf-compiler)
  # etcd-client's build imports google/protobuf/descriptor.proto, which is in
  # libprotobuf-dev, not in protobuf-compiler (and --no-install-recommends
  # leaves it out).
  [ -e /usr/include/google/protobuf/descriptor.proto ] || need+=(libprotobuf-dev)
  [ ${#need[@]} -eq 0 ] && return 0
  [ "$INSTALL" = 1 ] || { echo "compare.sh: missing ${need[*]} (and --no-install)" >&2; exit 1; }
  log "installing ${need[*]}"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    # A container's policy-rc.d keeps Debian from starting the packaged
    # redis service; where it does start, it is on 6379, not our port.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    # No root: unpack the packages (and the libraries they need) into a
    # private folder instead of installing them.
    PKGROOT=$(mktemp -d "${TMPDIR:-/tmp}/raftlock-pkgs.XXXXXX")
    (cd "$PKGROOT" && apt-get download etcd-server etcd-client redis-tools libjemalloc2 liblzf1 \
       protobuf-compiler libprotoc32 libprotobuf32 libprotobuf-dev >/dev/null)
    for deb in "$PKGROOT"/*.deb; do dpkg -x "$deb" "$PKGROOT/root"; done
    export PATH="$PKGROOT/root/usr/bin:$PATH"
    export LD_LIBRARY_PATH="$PKGROOT/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    # Where prost-build finds google/protobuf/*.proto.
    export PROTOC_INCLUDE="$PKGROOT/root/usr/include"
  fi
}
install_missing
log "etcd $(etcd --version 2>/dev/null | head -1 | awk '{print $3}'), redis $(redis-server --version | awk '{print $3}' | tr -d v=), $(protoc --version)"

# --- 2. build ------------------------------------------------------------------
if [ -n "${BIN_DIR:-}" ]; then
  log "using prebuilt binaries in $BIN_DIR"
else
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
  log "building (release) into $CARGO_TARGET_DIR, load $(loadavg)"
  (cd "$ROOT" && cargo build --release -q -p raftlock-node -p raftlock-bench \
     --bin raftlockd --bin raftlock-bench --features raftlock-bench/etcd)
  BIN_DIR=$CARGO_TARGET_DIR/release
fi
RAFTLOCKD=$BIN_DIR/raftlockd
BENCH=$BIN_DIR/raftlock-bench

# --- 3. start everything -------------------------------------------------------
TMP=$(mktemp -d "${WORK_DIR:-${TMPDIR:-/tmp}}/raftlock-compare.XXXXXX")
RUNS=$TMP/runs
FAILOVERS=$TMP/failover
mkdir -p "$RUNS" "$FAILOVERS"
BASE_PORT=${BASE_PORT:-27100}
declare -A PID=()

stop_pid() {
  local p=$1
  kill -TERM "$p" 2>/dev/null || return 0
  for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$p" 2>/dev/null || true
}
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for k in "${!PID[@]}"; do stop_pid "${PID[$k]}"; done
  wait 2>/dev/null || true
  if [ "$KEEP" = 1 ]; then log "kept $TMP"; else rm -rf "$TMP"; fi
  [ -n "$PKGROOT" ] && rm -rf "$PKGROOT"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Clients and peers dial each server at its public port (raftlock
# BASE_PORT+1..3, Redis +79, etcd +81..86: client, peer, client, …). Without
# --rtt the servers listen there; with it they listen SHIFT higher and the
# proxy listens on the public ports. Metrics (+11..13) are never proxied.
SHIFT=0
[ -n "$RTT" ] && SHIFT=100
PUBLIC_PORTS="$(seq $((BASE_PORT + 1)) $((BASE_PORT + 3))) $((BASE_PORT + 79)) $(seq $((BASE_PORT + 81)) $((BASE_PORT + 86)))"
CHECK_PORTS="$PUBLIC_PORTS $(seq $((BASE_PORT + 11)) $((BASE_PORT + 13)))"
if [ "$SHIFT" != 0 ]; then
  for p in $PUBLIC_PORTS; do CHECK_PORTS+=" $((p + SHIFT))"; done
fi
for p in $CHECK_PORTS; do
  if (echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    echo "compare.sh: port $p is in use; set BASE_PORT" >&2; exit 1
  fi
done

RL_EP=""; RL_PEERS=""; RL_METRICS=""
for i in 1 2 3; do
  RL_EP+="${RL_EP:+,}127.0.0.1:$((BASE_PORT + i))"
  RL_PEERS+="${RL_PEERS:+,}$i=127.0.0.1:$((BASE_PORT + i))"
  RL_METRICS+="${RL_METRICS:+,}127.0.0.1:$((BASE_PORT + 10 + i))"
done
ETCD_EP=""; ETCD_CLUSTER=""
for i in 1 2 3; do
  ETCD_EP+="${ETCD_EP:+,}127.0.0.1:$((BASE_PORT + 79 + 2 * i))"
  ETCD_CLUSTER+="${ETCD_CLUSTER:+,}e$i=http://127.0.0.1:$((BASE_PORT + 80 + 2 * i))"
done
REDIS_PORT=$((BASE_PORT + 79))
REDIS_EP=127.0.0.1:$REDIS_PORT

start_proxy() { # with --rtt: one raftlock-bench proxy for every public port
  [ -n "$RTT" ] || return 0
  local routes=() p
  for p in $PUBLIC_PORTS; do routes+=(--route "127.0.0.1:$p=127.0.0.1:$((p + SHIFT))"); done
  "$BENCH" proxy --delay-us "$DELAY_US" "${routes[@]}" >>"$TMP/proxy.log" 2>&1 &
  PID[proxy]=$!
  # It binds its routes in order: the last one listening means all are.
  for _ in $(seq 100); do
    (echo >"/dev/tcp/127.0.0.1/$((BASE_PORT + 86))") 2>/dev/null && return 0
    kill -0 "${PID[proxy]}" 2>/dev/null || break
    sleep 0.1
  done
  echo "compare.sh: the proxy did not start: $(cat "$TMP/proxy.log")" >&2; exit 1
}
cpu_secs_of() { # CPU seconds (user + system) process $1 has used so far
  awk -v hz="$(getconf CLK_TCK)" '{ printf "%.1f", ($14 + $15) / hz }' "/proc/$1/stat" 2>/dev/null || echo "?"
}
start_raftlock() { # start_raftlock ID [--init]
  local i=$1; shift
  # Peers and clients reach it at its advertised (public) address, which
  # --peers names too: with --rtt, the proxy in front of it.
  RUST_LOG=${RUST_LOG:-warn} "$RAFTLOCKD" run --id "$i" --listen "127.0.0.1:$((BASE_PORT + SHIFT + i))" \
    --advertise "127.0.0.1:$((BASE_PORT + i))" --metrics-listen "127.0.0.1:$((BASE_PORT + 10 + i))" \
    --data-dir "$TMP/raftlock-$i" --peers "$RL_PEERS" --insecure-peers "$@" >>"$TMP/raftlock-$i.log" 2>&1 &
  PID[raftlock$i]=$!
}
start_etcd() { # start_etcd ID  (a restart reuses the data dir; the flags are then ignored)
  local i=$1 c=$((BASE_PORT + 79 + 2 * $1)) p=$((BASE_PORT + 80 + 2 * $1))
  # etcd 3.4 defaults otherwise: WAL fsync on every commit, heartbeat
  # 100 ms, election timeout 1000 ms, snapshot every 100,000 entries.
  # Members reach each other at the advertised peer URLs, which
  # --initial-cluster names too: with --rtt, the proxies in front of them.
  etcd --name "e$i" --data-dir "$TMP/etcd-$i" \
    --listen-client-urls "http://127.0.0.1:$((c + SHIFT))" --advertise-client-urls "http://127.0.0.1:$c" \
    --listen-peer-urls "http://127.0.0.1:$((p + SHIFT))" --initial-advertise-peer-urls "http://127.0.0.1:$p" \
    --initial-cluster "$ETCD_CLUSTER" --initial-cluster-token raftlock-bench \
    --initial-cluster-state new --logger zap --log-level error >>"$TMP/etcd-$i.log" 2>&1 &
  PID[etcd$i]=$!
}
start_redis() {
  mkdir -p "$TMP/redis"
  # Durability as close to the others as Redis allows: every write goes to
  # the append-only file and is fsynced before the reply (appendfsync
  # always); no RDB snapshots. Still one node: no replication.
  redis-server --bind 127.0.0.1 --port "$((REDIS_PORT + SHIFT))" --dir "$TMP/redis" \
    --appendonly yes --appendfsync always --save "" --protected-mode yes \
    --daemonize no --logfile "$TMP/redis.log" &
  PID[redis]=$!
}
wait_ready() { # wait_ready TARGET ENDPOINTS
  "$BENCH" wait --target "$1" --endpoints "$2" --timeout 60
}
start_raftlock_cluster() {
  rm -rf "$TMP"/raftlock-[123]
  # Node 1 bootstraps; start it last so its first election finds its peers.
  start_raftlock 2; start_raftlock 3; sleep 0.3; start_raftlock 1 --init
  wait_ready raftlock "$RL_EP"
}
stop_raftlock_cluster() {
  for i in 1 2 3; do [ -n "${PID[raftlock$i]:-}" ] && stop_pid "${PID[raftlock$i]}"; unset "PID[raftlock$i]"; done
}
pids_of() { # pids_of raftlock|etcd|redis -> "p1,p2,p3" in endpoint order
  case $1 in
    redis) echo "${PID[redis]}" ;;
    *) echo "${PID[${1}1]},${PID[${1}2]},${PID[${1}3]}" ;;
  esac
}
endpoints_of() {
  case $1 in raftlock) echo "$RL_EP" ;; etcd) echo "$ETCD_EP" ;; redis) echo "$REDIS_EP" ;; esac
}

log "temp folder $TMP ($(df -h "$TMP" | awk 'NR==2 {print $1", "$2" total"}'))"
# How fast this disk makes small writes durable: what every fsync-bound
# figure below is made of.
FSYNC_SECS=$(dd if=/dev/zero of="$TMP/fsync-probe" bs=4k count=300 oflag=dsync 2>&1 \
  | awk '/copied/ {for (i = 1; i <= NF; i++) if ($i == "s,") print $(i-1)}')
FSYNC_RATE=$(awk -v s="${FSYNC_SECS:-0}" 'BEGIN { if (s > 0) printf "%d", 300 / s; else print "?" }')
rm -f "$TMP/fsync-probe"
log "disk: ${FSYNC_RATE}/s 4 KiB writes with O_DSYNC"

if [ -n "$RTT" ]; then
  log "every link through raftlock-bench proxy: $RTT ms round trip added, ${DELAY_US} µs each way"
  start_proxy
fi
log "starting 3 raftlockd, 3 etcd, 1 redis on 127.0.0.1"
start_raftlock_cluster
for i in 1 2 3; do start_etcd "$i"; done
start_redis
wait_ready etcd "$ETCD_EP"
wait_ready redis "$REDIS_EP"
LOAD_START=$(loadavg)
log "all up, load $LOAD_START"

# --- 4. every workload against every target, alternating ----------------------
TARGETS=(raftlock etcd redis)
for round in $(seq "$ROUNDS"); do
  for w in ${WORKLOADS//,/ }; do
    # Rotate the order each round so no target always runs first.
    for k in 0 1 2; do
      t=${TARGETS[$(( (k + round - 1) % 3 ))]}
      # --pids: the CPU every server process of the target uses in the
      # window, per 1,000 operations (and the load generator's own).
      "$BENCH" run --target "$t" --workload "$w" --endpoints "$(endpoints_of "$t")" \
        --clients "$CLIENTS" --duration "$DURATION" --warmup 2 --pids "$(pids_of "$t")" \
        --json "$RUNS/$w-$t-$round.json" || log "run $w/$t failed (round $round)"
    done
  done
done

# One client, where a single write's time goes (the nodes' stage histograms).
STAGE_FILES=()
for w in uncontended contended; do
  "$BENCH" run --target raftlock --workload "$w" --endpoints "$RL_EP" --clients 1 \
    --duration "$DURATION" --warmup 2 --quiet --trace-stages "$RL_METRICS" \
    --json "$TMP/stages-$w-1.json" || log "stage trace $w failed"
  STAGE_FILES+=("$TMP/stages-$w-1.json")
done

# --- 5. failover: kill the leader under the contended workload ----------------
if [ "$FAILOVER" = 1 ]; then
  for round in $(seq "$FAILOVER_ROUNDS"); do
    for t in raftlock etcd; do
      out=$FAILOVERS/$t-$round.json
      "$BENCH" failover --target "$t" --endpoints "$(endpoints_of "$t")" --pids "$(pids_of "$t")" \
        --clients 16 --before 3 --timeout 20 --json "$out" || log "failover $t round $round failed"
      # Restart the node that was killed, from its data, and wait for the
      # cluster to serve again before the next round.
      killed=$(sed -n 's/.*"killed_index": *\([0-9]*\).*/\1/p' "$out" 2>/dev/null || true)
      if [ -n "$killed" ]; then
        i=$((killed + 1))
        wait "${PID[$t$i]}" 2>/dev/null || true
        if [ "$t" = raftlock ]; then start_raftlock "$i"; else start_etcd "$i"; fi
        wait_ready "$t" "$(endpoints_of "$t")"
        sleep 2
      fi
    done
  done
fi

# --- 6. scale: held locks and open sessions on a fresh raftlock ---------------
SCALE_FILES=()
if [ "$SCALE" = 1 ]; then
  # The others sit idle from here on; stop them so they take no CPU.
  for k in etcd1 etcd2 etcd3 redis; do stop_pid "${PID[$k]}"; unset "PID[$k]"; done
  for kind in locks sessions; do
    steps=$LOCK_STEPS; [ "$kind" = sessions ] && steps=$SESSION_STEPS
    stop_raftlock_cluster
    start_raftlock_cluster
    "$BENCH" scale --kind "$kind" --endpoints "$RL_EP" --pids "$(pids_of raftlock)" \
      --steps "$steps" --secs "$SCALE_SECS" --clients "$CLIENTS" --no-cleanup \
      --json "$TMP/scale-$kind.json" || log "scale $kind failed"
    SCALE_FILES+=("$TMP/scale-$kind.json")
  done
  # Live sessions (raftlock) and leases (etcd) kept alive by their client
  # at ttl 10 s while the uncontended workload runs, each system fresh and
  # alone on the machine.
  stop_raftlock_cluster
  start_raftlock_cluster
  "$BENCH" scale --kind sessions-held --target raftlock --endpoints "$RL_EP" --metrics "$RL_METRICS" \
    --pids "$(pids_of raftlock)" --steps "$HELD_STEPS" --secs "$SCALE_SECS" --clients "$CLIENTS" \
    --no-cleanup --json "$TMP/scale-held-raftlock.json" || log "scale sessions-held raftlock failed"
  SCALE_FILES+=("$TMP/scale-held-raftlock.json")
  stop_raftlock_cluster
  rm -rf "$TMP"/etcd-[123]
  for i in 1 2 3; do start_etcd "$i"; done
  wait_ready etcd "$ETCD_EP"
  "$BENCH" scale --kind sessions-held --target etcd --endpoints "$ETCD_EP" \
    --pids "$(pids_of etcd)" --steps "$HELD_STEPS" --secs "$SCALE_SECS" --clients "$CLIENTS" \
    --no-cleanup --json "$TMP/scale-held-etcd.json" || log "scale sessions-held etcd failed"
  SCALE_FILES+=("$TMP/scale-held-etcd.json")
  for k in etcd1 etcd2 etcd3; do stop_pid "${PID[$k]}"; unset "PID[$k]"; done
fi

# --- 7. report -----------------------------------------------------------------
mkdir -p "$HERE/results"
OUT=latest.json
[ "$WORKLOADS" = "$ALL_WORKLOADS" ] || OUT="partial-${WORKLOADS//,/-}.json"
RTT_ARGS=()
if [ -n "$RTT" ]; then
  # Beside the loopback record, not over it.
  OUT="${OUT%.json}-rtt$RTT.json"
  RTT_ARGS=(--rtt-ms "$RTT" --machine "proxy_cpu_s=$(cpu_secs_of "${PID[proxy]}") (the proxy over the whole run, not in the servers' CPU)")
fi
SCALE_ARG=$(IFS=,; echo "${SCALE_FILES[*]:-}")
STAGES_ARG=$(IFS=,; echo "${STAGE_FILES[*]:-}")
"$BENCH" report --runs "$RUNS" --failover "$FAILOVERS" ${SCALE_ARG:+--scale "$SCALE_ARG"} \
  ${STAGES_ARG:+--stages "$STAGES_ARG"} "${RTT_ARGS[@]}" \
  --machine "disk=$(df -h "$TMP" | awk 'NR==2 {print $1" ("$2")"}'), $(findmnt -no FSTYPE -T "$TMP" 2>/dev/null || echo '?')" \
  --machine "fsync_per_sec=${FSYNC_RATE:-?} (dd 4 KiB O_DSYNC)" \
  --machine "load_avg_start=$LOAD_START" --machine "load_avg_end=$(loadavg)" \
  --machine "mode=$([ "$QUICK" = 1 ] && echo quick || echo full), rounds $ROUNDS x ${DURATION}s, $CLIENTS clients" \
  --machine "commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo ?)" \
  --machine "versions=etcd $(etcd --version 2>/dev/null | head -1 | awk '{print $3}'), redis $(redis-server --version | awk '{print $3}' | tr -d v=)" \
  --out "$HERE/results/$OUT"
