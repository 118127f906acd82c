#!/usr/bin/env bash
# Where a raftlock node's CPU goes: starts a 3-node raftlock (bench/lib/
# cluster.sh), drives one workload with raftlock-bench, records all three
# nodes with `perf record` for the measured window, and prints the samples
# grouped by node, by crate (kernel, tokio, h2, malloc/free, raftlock, …),
# the top kernel and user symbols, and every node thread's context
# switches per 1,000 operations. See docs/performance/reproduce.md, "A
# profile you can re-run".
#
#   bench/profile.sh [--workload uncontended|contended|semaphore|sessions|oneshot|multi]
#                    [--clients N] [--duration S] [--freq HZ] [--out DIR]
#
# Installs Debian's linux-perf when `perf` is missing (as root). Environment:
# BIN_DIR (prebuilt raftlockd and raftlock-bench; else a release build into
# CARGO_TARGET_DIR), BASE_PORT (default 27400), WORK_DIR (parent of the temp
# folder), RAFTLOCKD_ARGS (extra flags for every node). The recording is
# left in OUT/perf.data for `perf report -i OUT/perf.data`.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
WORKLOAD=uncontended
CLIENTS=64
DURATION=15
FREQ=499
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --workload) WORKLOAD=$2; shift ;;
    --clients) CLIENTS=$2; shift ;;
    --duration) DURATION=$2; shift ;;
    --freq) FREQ=$2; shift ;;
    --out) OUT=$2; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "profile.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

if ! command -v perf >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "profile.sh: installing linux-perf" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends linux-perf >/dev/null
  else
    echo "profile.sh: perf is missing (Debian: apt-get install linux-perf, as root)" >&2
    exit 1
  fi
fi

if [ -z "${BIN_DIR:-}" ]; then
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
  (cd "$ROOT" && cargo build --release -q -p raftlock-node -p raftlock-bench --bin raftlockd --bin raftlock-bench)
  BIN_DIR=$CARGO_TARGET_DIR/release
fi
BASE_PORT=${BASE_PORT:-27400}
TMP=$(mktemp -d "${WORK_DIR:-${TMPDIR:-/tmp}}/raftlock-profile.XXXXXX")
OUT=${OUT:-$TMP/results}
mkdir -p "$OUT"
# shellcheck source=bench/lib/cluster.sh
. "$HERE/lib/cluster.sh"
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  stop_cluster
  rm -rf "$TMP/raftlock-"*
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM
start_cluster
PIDLIST=$(IFS=,; echo "${NODE_PIDS[*]}")

WARMUP=3
echo "profile.sh: $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?'), $WORKLOAD, $CLIENTS clients," \
  "${DURATION} s at ${FREQ} Hz, load $(cut -d' ' -f1-3 /proc/loadavg), results in $OUT"
# The load runs a little longer than the recording on both sides.
"$BIN_DIR/raftlock-bench" run --target raftlock --workload "$WORKLOAD" --endpoints "$EP" \
  --clients "$CLIENTS" --duration $((DURATION + 2)) --warmup "$WARMUP" --quiet --pids "$PIDLIST" \
  --json "$OUT/run.json" >"$OUT/run.txt" 2>&1 &
LOAD=$!
sleep $((WARMUP + 1))
# cpu-clock: a software event, so it works where hardware counters are not
# exposed (VMs, containers); -g keeps the call chains for `perf report`.
# Every node thread's context switches (voluntary: it slept, mostly to be
# woken again; involuntary: preempted) at both ends of the recording.
switches() {
  local pid t
  for pid in "${NODE_PIDS[@]}"; do
    for t in /proc/"$pid"/task/*; do
      printf '%s\t%s\t%s\t%s\n' "$pid" "$(cat "$t/comm" 2>/dev/null)" \
        "$(awk '/^voluntary_ctxt_switches/ { print $2 }' "$t/status" 2>/dev/null)" \
        "$(awk '/^nonvoluntary_ctxt_switches/ { print $2 }' "$t/status" 2>/dev/null)"
    done
  done
}
switches >"$OUT/switches-start.tsv"
SWITCH_START=$(date +%s.%N)
perf record -q -e cpu-clock -F "$FREQ" -g -p "$PIDLIST" -o "$OUT/perf.data" -- sleep "$DURATION" 2>"$OUT/perf-record.log"
SWITCH_SECS=$(python3 -c "import time; print(time.time() - $SWITCH_START)")
switches >"$OUT/switches-end.tsv"
wait "$LOAD" || echo "profile.sh: the load generator failed (see $OUT/run.txt)" >&2
cat "$OUT/run.txt"

# Context switches per 1,000 operations, by thread name (threads that
# started or ended within the window count from zero or not at all).
python3 - "$OUT/switches-start.tsv" "$OUT/switches-end.tsv" "$SWITCH_SECS" "$OUT/run.json" <<'PY'
import json, re, sys
from collections import defaultdict

def load(path):
    rows = {}
    for line in open(path):
        pid, comm, vol, invol = (line.rstrip("\n").split("\t") + ["", "", "", ""])[:4]
        if vol.isdigit() and invol.isdigit():
            rows.setdefault((pid, comm), []).append((int(vol), int(invol)))
    return rows

start, end = load(sys.argv[1]), load(sys.argv[2])
secs = float(sys.argv[3])
try:
    ops = float(json.load(open(sys.argv[4]))["ops_per_sec"]) * secs
except (OSError, KeyError, ValueError):
    ops = 0.0
vol, invol, threads = defaultdict(int), defaultdict(int), defaultdict(dict)
for key, after in end.items():
    before = start.get(key, [])
    name = re.sub(r"[-_]?\d+$", "", key[1])
    # Threads of one name in one process, in /proc's (tid) order.
    for i, (v, n) in enumerate(after):
        v0, n0 = before[i] if i < len(before) else (0, 0)
        vol[name] += v - v0
        invol[name] += n - n0
    threads[name][key[0]] = threads[name].get(key[0], 0) + len(after)
if ops <= 0:
    print("\ncontext switches: no operation count in run.json")
    sys.exit(0)
print(f"\ncontext switches of the three nodes per 1,000 operations ({secs:.1f} s, {ops:,.0f} operations)")
print(f"  {'thread':<22}{'threads':>8}{'voluntary':>12}{'involuntary':>13}")
rows = sorted(vol, key=lambda k: -(vol[k] + invol[k]))
for k in rows:
    n = sum(threads[k].values())
    print(f"  {k:<22}{n:>8}{vol[k] * 1000 / ops:>12.1f}{invol[k] * 1000 / ops:>13.1f}")
tv, ti = sum(vol.values()), sum(invol.values())
print(f"  {'all':<22}{'':>8}{tv * 1000 / ops:>12.1f}{ti * 1000 / ops:>13.1f}")
PY

# Self time per (pid, dso, symbol), then grouped.
perf report -i "$OUT/perf.data" --stdio --no-children -g none --sort pid,dso,sym \
  --percent-limit 0 -t $'\t' 2>/dev/null >"$OUT/self.tsv"
python3 - "$OUT/self.tsv" "$PIDLIST" <<'PY'
import re, sys
from collections import defaultdict

path, pids = sys.argv[1], sys.argv[2].split(",")
node_of = {p: i + 1 for i, p in enumerate(pids)}

def crate(dso, sym):
    """The group a sample's own function belongs to."""
    if "kernel" in dso or sym.startswith("[k]"):
        return "kernel"
    s = re.sub(r"^\[[.k]\]\s*", "", sym).strip()
    if "libc" in dso:
        if re.search(r"malloc|free|realloc|calloc|_int_|tcache|arena", s):
            return "malloc/free"
        if re.search(r"mem(move|cpy|set|cmp)", s):
            return "memmove/memcpy"
        return "libc (other)"
    s = s.lstrip("<&*").replace("dyn ", "").replace("mut ", "")
    head = s.split("::", 1)[0] if "::" in s else ""
    if not head or head.startswith("0x"):
        return "[unknown]"
    if head.startswith("raftlock"):
        return "raftlock"
    if head in ("core", "alloc", "std"):
        return "std/core/alloc (generic code)"
    return head

def tgid(tid):
    """The process of a thread (perf's `pid` key is the thread)."""
    try:
        for l in open(f"/proc/{tid}/status"):
            if l.startswith("Tgid:"):
                return l.split()[1]
    except OSError:
        pass
    return tid

by_node, by_thread, by_crate, kernel_syms, user_syms = (defaultdict(float) for _ in range(5))
total = 0.0
for line in open(path, errors="replace"):
    if line.startswith("#") or not line.strip():
        continue
    parts = line.rstrip("\n").split("\t")
    if len(parts) < 4:
        continue
    pct = float(parts[0].strip().rstrip("%"))
    tid, _, comm = parts[1].strip().partition(":")
    pid = tgid(tid)
    dso, sym = parts[2].strip(), parts[3].strip()
    total += pct
    by_node[f"node {node_of[pid]}" if pid in node_of else f"pid {pid}"] += pct
    # Thread names without their number (sled-io-3 -> sled-io).
    by_thread[re.sub(r"[-_]?\d+$", "", comm.strip())] += pct
    c = crate(dso, sym)
    by_crate[c] += pct
    name = re.sub(r"^\[[.k]\]\s*", "", sym)
    (kernel_syms if c == "kernel" else user_syms)[name[:110]] += pct

def table(title, d, n):
    print(f"\n{title}")
    for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:n]:
        print(f"  {v:6.2f} %  {k}")

print(f"\nself time of the three nodes' samples ({total:.1f} % accounted)")
table("by node (the leader is the busy one)", by_node, 5)
table("by thread", by_thread, 8)
table("by crate", by_crate, 20)
table("top kernel functions", kernel_syms, 12)
table("top user-space functions", user_syms, 25)
PY
echo
echo "profile.sh: perf report -i $OUT/perf.data  (call chains: --children -g caller)"
