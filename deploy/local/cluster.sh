#!/usr/bin/env bash
# Local raftlock cluster of real `raftlockd run` processes on 127.0.0.1.
#
#   deploy/local/cluster.sh [-n NODES] [-d DIR] COMMAND [ARG]
#
# Commands:
#   start        start every node that is not running, wait for a leader
#   stop         stop (SIGTERM, then SIGKILL after 10 s) every node it started
#   status       per-node process/metrics view, then `raftlock status`
#   kill N       SIGKILL node N (a crash: no clean shutdown)
#   restart N    stop node N if it runs, start it again, wait until it follows the
#                leader and has applied what the leader had committed (exit 1 if
#                not within START_TIMEOUT; the node is left running)
#   logs N       print node N's log
#   endpoints    print the client endpoint list (for RAFTLOCK_ENDPOINTS)
#   clean        stop, then delete DIR
#
# Settings (flags win over the environment):
#   -n NODES / NODES               number of nodes (default 3)
#   -d DIR / DATA_DIR              cluster directory (default ./raftlock-local)
#   BASE_PORT                      gRPC port of node 1 (default 7101); node N uses BASE_PORT+N-1
#   METRICS_BASE_PORT              metrics port of node 1 (default BASE_PORT+2000, i.e. 9101)
#   BIN_DIR                        directory holding raftlockd and raftlock; if unset, the
#                                  workspace's binaries ($CARGO_TARGET_DIR or target/,
#                                  PROFILE release or debug), built with cargo when missing
#   START_TIMEOUT                  seconds to wait for a leader (default 30)
#
# DIR holds node-N/ (data), node-N.log, node-N.pid and cluster.conf. The
# first `start` records NODES and the ports in cluster.conf; later commands
# on the same DIR use the recorded values, so `stop` always finds what
# `start` started. Node 1 is started with --init: it bootstraps the cluster
# only when its data directory is empty, so restarting it is safe.

# shellcheck disable=SC2015  # `A && B || die` is meant: die if either fails
set -euo pipefail

usage() {
    sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

die() {
    echo "cluster.sh: $*" >&2
    exit 1
}

say() {
    echo "cluster.sh: $*" >&2
}

HOST=127.0.0.1
opt_nodes=""
opt_dir=""
while getopts "n:d:h" opt; do
    case "$opt" in
        n) opt_nodes=$OPTARG ;;
        d) opt_dir=$OPTARG ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || usage
cmd=$1
arg=${2:-}

NODES=${opt_nodes:-${NODES:-3}}
DIR=${opt_dir:-${DATA_DIR:-./raftlock-local}}
BASE_PORT=${BASE_PORT:-7101}
METRICS_BASE_PORT=${METRICS_BASE_PORT:-$((BASE_PORT + 2000))}
START_TIMEOUT=${START_TIMEOUT:-30}

is_uint() { case "$1" in '' | *[!0-9]*) return 1 ;; *) return 0 ;; esac; }

# An existing cluster directory keeps the settings it was created with.
if [ -f "$DIR/cluster.conf" ]; then
    want_nodes=$NODES want_base=$BASE_PORT want_metrics=$METRICS_BASE_PORT
    # shellcheck disable=SC1091
    . "$DIR/cluster.conf"
    if [ "$cmd" = start ] &&
        { [ "$want_nodes" != "$NODES" ] || [ "$want_base" != "$BASE_PORT" ] ||
            [ "$want_metrics" != "$METRICS_BASE_PORT" ]; }; then
        say "note: $DIR was created with NODES=$NODES BASE_PORT=$BASE_PORT" \
            "METRICS_BASE_PORT=$METRICS_BASE_PORT; using those"
    fi
fi

is_uint "$NODES" && [ "$NODES" -ge 1 ] && [ "$NODES" -le 9 ] || die "NODES must be 1..9, got '$NODES'"
is_uint "$BASE_PORT" && [ $((BASE_PORT + NODES - 1)) -le 65535 ] || die "bad BASE_PORT '$BASE_PORT'"
is_uint "$METRICS_BASE_PORT" && [ $((METRICS_BASE_PORT + NODES - 1)) -le 65535 ] ||
    die "bad METRICS_BASE_PORT '$METRICS_BASE_PORT'"
is_uint "$START_TIMEOUT" || die "bad START_TIMEOUT '$START_TIMEOUT'"

port() { echo $((BASE_PORT + $1 - 1)); }
metrics_port() { echo $((METRICS_BASE_PORT + $1 - 1)); }
addr() { echo "$HOST:$(port "$1")"; }

endpoints() {
    local i out=""
    for ((i = 1; i <= NODES; i++)); do out="${out:+$out,}$(addr "$i")"; done
    echo "$out"
}

peers() {
    local i out=""
    for ((i = 1; i <= NODES; i++)); do out="${out:+$out,}$i=$(addr "$i")"; done
    echo "$out"
}

# ---------------------------------------------------------------- binaries

find_binaries() {
    if [ -n "${BIN_DIR:-}" ]; then
        RAFTLOCKD=$BIN_DIR/raftlockd
        RAFTLOCK=$BIN_DIR/raftlock
        [ -x "$RAFTLOCKD" ] && [ -x "$RAFTLOCK" ] ||
            die "BIN_DIR=$BIN_DIR does not hold executable raftlockd and raftlock"
        return
    fi
    local root target
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    target=${CARGO_TARGET_DIR:-$root/target}
    case "$target" in /*) ;; *) target=$PWD/$target ;; esac
    local profile=${PROFILE:-release} flag=--release
    case "$profile" in
        release) ;;
        debug) flag="" ;;
        *) die "PROFILE must be release or debug, got '$profile'" ;;
    esac
    RAFTLOCKD=$target/$profile/raftlockd
    RAFTLOCK=$target/$profile/raftlock
    if [ ! -x "$RAFTLOCKD" ] || [ ! -x "$RAFTLOCK" ]; then
        command -v cargo >/dev/null || die "cargo not found; build the binaries or set BIN_DIR"
        say "building raftlockd and raftlock ($profile) in $target"
        # shellcheck disable=SC2086 # $flag is empty or one word
        (cd "$root" && CARGO_TARGET_DIR=$target cargo build $flag -p raftlock-node \
            --bin raftlockd -p raftlock-client --bin raftlock) >&2 || die "cargo build failed"
    fi
}

# -------------------------------------------------------------- processes

abs_dir() {
    mkdir -p "$DIR"
    DIR=$(cd "$DIR" && pwd)
}

pidfile() { echo "$DIR/node-$1.pid"; }
logfile() { echo "$DIR/node-$1.log"; }
datadir() { echo "$DIR/node-$1"; }

# True if PID runs (a zombie awaiting its reaper counts as gone).
alive() {
    kill -0 "$1" 2>/dev/null || return 1
    [ ! -r "/proc/$1/stat" ] || [ "$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)" != Z ]
}

# The pid of node N if it is running and is really that node (not a
# recycled pid), else nothing.
node_pid() {
    local f pid
    f=$(pidfile "$1")
    [ -f "$f" ] || return 1
    pid=$(cat "$f")
    is_uint "$pid" || return 1
    alive "$pid" || return 1
    if [ -r "/proc/$pid/cmdline" ]; then
        tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "--data-dir $(datadir "$1") " || return 1
    fi
    echo "$pid"
}

port_busy() {
    (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null
}

start_node() {
    local i=$1 pid
    if pid=$(node_pid "$i"); then
        say "node $i already running (pid $pid)"
        return 0
    fi
    rm -f "$(pidfile "$i")"
    port_busy "$(port "$i")" && die "port $(port "$i") (node $i) is already in use"
    port_busy "$(metrics_port "$i")" && die "port $(metrics_port "$i") (node $i metrics) is already in use"
    local args=(run --id "$i" --listen "$(addr "$i")" --data-dir "$(datadir "$i")"
        --metrics-listen "$HOST:$(metrics_port "$i")")
    # Loopback only: nothing but this machine can reach the Raft service.
    # Set RAFTLOCK_ACL_FILE (with a peer_token) to run authenticated anyway.
    [ -n "${RAFTLOCK_ACL_FILE:-}" ] || args+=(--insecure-peers)
    # Node 1 bootstraps; --init does nothing once its data directory has data.
    if [ "$i" = 1 ]; then args+=(--peers "$(peers)" --init); fi
    echo "=== $(date '+%F %T') starting: raftlockd ${args[*]}" >>"$(logfile "$i")"
    # setsid: a Ctrl-C in the terminal that ran this script must not reach
    # the nodes; `stop` is the way to end them.
    RUST_LOG=${RUST_LOG:-info,openraft=error,sled=warn} NO_COLOR=1 \
        setsid "$RAFTLOCKD" "${args[@]}" </dev/null >>"$(logfile "$i")" 2>&1 &
    pid=$!
    echo "$pid" >"$(pidfile "$i")"
    STARTED+=("$i")
    # Until the child has exec'd raftlockd its command line is still this
    # script's; wait for the exec so node_pid recognises it.
    local n
    for ((n = 0; n < 100; n++)); do
        node_pid "$i" >/dev/null && break
        alive "$pid" || break
        sleep 0.02
    done
    say "node $i started: pid $pid grpc $(addr "$i") metrics http://$HOST:$(metrics_port "$i")/metrics"
}

stop_node() {
    local i=$1 pid n
    if ! pid=$(node_pid "$i"); then
        rm -f "$(pidfile "$i")"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    for ((n = 0; n < 100; n++)); do
        alive "$pid" || break
        sleep 0.1
    done
    if alive "$pid"; then
        say "node $i (pid $pid) did not stop within 10 s; SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        while alive "$pid"; do sleep 0.1; done
    fi
    rm -f "$(pidfile "$i")"
    say "node $i stopped (pid $pid)"
}

# Exits with a message if a node started by this invocation has died.
check_started_alive() {
    local i
    for i in "${STARTED[@]}"; do
        if ! node_pid "$i" >/dev/null; then
            say "node $i exited; last lines of $(logfile "$i"):"
            tail -n 15 "$(logfile "$i")" >&2 || true
            return 1
        fi
    done
}

# Prints the metrics text of node N (empty if it does not answer).
metrics_of() {
    local p
    p=$(metrics_port "$1")
    if command -v curl >/dev/null; then
        curl -fsS --max-time 2 "http://$HOST:$p/metrics" 2>/dev/null || true
    else
        (
            exec 3<>"/dev/tcp/$HOST/$p" || exit 0
            printf 'GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n' "$HOST:$p" >&3
            timeout 2 cat <&3 | sed '1,/^\r\{0,1\}$/d'
        ) 2>/dev/null || true
    fi
}

metric() { # metric TEXT NAME -> value or "-"
    local v
    v=$(printf '%s\n' "$1" | awk -v n="$2" '$1 == n { print $2; exit }')
    echo "${v:--}"
}

# The leader id reported by the cluster, or nothing.
cluster_leader() {
    local out
    out=$(timeout 20 "$RAFTLOCK" --endpoints "$(endpoints)" status --json 2>/dev/null) || return 1
    printf '%s' "$out" | grep -o '"leader_id":[1-9][0-9]*' | cut -d: -f2
}

wait_for_leader() {
    local deadline=$((SECONDS + START_TIMEOUT)) leader
    while ((SECONDS < deadline)); do
        check_started_alive || return 1
        if leader=$(cluster_leader) && [ -n "$leader" ]; then
            say "leader: node $leader"
            return 0
        fi
        sleep 0.3
    done
    say "no leader within ${START_TIMEOUT} s"
    return 1
}

# A number field of a one-line JSON object: json_num JSON FIELD.
json_num() {
    printf '%s' "$1" | grep -o "\"$2\":[0-9]*" | head -n 1 | cut -d: -f2
}

# Waits until node N follows the cluster's current leader (same term and
# leader as the leader itself reports, asked through the other nodes) and
# has applied everything the leader had committed. Knowing "a" leader is
# not enough: a restarted ex-leader briefly reports itself as leader of its
# old term.
wait_node_follows() {
    local i=$1 deadline=$((SECONDS + START_TIMEOUT)) others="" j m st
    for ((j = 1; j <= NODES; j++)); do
        [ "$j" = "$i" ] || others="${others:+$others,}$(addr "$j")"
    done
    [ -n "$others" ] || others=$(addr "$i")
    local term leader commit
    while ((SECONDS < deadline)); do
        check_started_alive || return 1
        st=$(timeout 10 "$RAFTLOCK" --endpoints "$others" status --json 2>/dev/null) || st=""
        term=$(json_num "$st" term)
        leader=$(json_num "$st" leader_id)
        commit=$(json_num "$st" commit_index)
        m=$(metrics_of "$i")
        if [ -n "$m" ] && [ -n "$leader" ] && [ "$leader" != 0 ] &&
            [ "$(metric "$m" raftlock_term)" = "$term" ] &&
            [ "$(metric "$m" raftlock_leader_id)" = "$leader" ] &&
            [ "$(metric "$m" raftlock_applied_index)" -ge "$commit" ] 2>/dev/null; then
            say "node $i follows leader $leader (term $term), applied index" \
                "$(metric "$m" raftlock_applied_index) >= leader's commit index $commit"
            return 0
        fi
        sleep 0.3
    done
    say "node $i has not caught up with a leader after ${START_TIMEOUT} s"
    return 1
}

# Nodes this invocation started and has not yet handed over. Whatever
# way the script ends while the list is not empty (an error, `die`, Ctrl-C,
# SIGTERM), it stops them, so a failed start leaves nothing running.
STARTED=()
undo_started() {
    local i
    ((${#STARTED[@]} > 0)) || return 0
    say "stopping the nodes this command started: ${STARTED[*]}"
    for i in "${STARTED[@]}"; do stop_node "$i"; done
    STARTED=()
}
on_exit() {
    local rc=$?
    trap - EXIT INT TERM
    undo_started
    exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

write_conf() {
    [ -f "$DIR/cluster.conf" ] && return 0
    cat >"$DIR/cluster.conf" <<EOF
# written by deploy/local/cluster.sh on first start; do not edit while running
NODES=$NODES
BASE_PORT=$BASE_PORT
METRICS_BASE_PORT=$METRICS_BASE_PORT
EOF
}

node_arg() {
    is_uint "$arg" && [ "$arg" -ge 1 ] && [ "$arg" -le "$NODES" ] ||
        die "$cmd needs a node number 1..$NODES, got '${arg}'"
}

# ---------------------------------------------------------------- commands

cmd_start() {
    find_binaries
    abs_dir
    write_conf
    local i
    # Node 1 (the bootstrapper) last, so its first election finds the
    # others listening.
    for ((i = NODES; i >= 1; i--)); do
        start_node "$i"
    done
    wait_for_leader || exit 1
    STARTED=() # the cluster is up: hand the nodes over
    echo "ready: RAFTLOCK_ENDPOINTS=$(endpoints)"
}

cmd_stop() {
    [ -d "$DIR" ] || { say "no cluster directory $DIR"; return 0; }
    abs_dir
    local i
    for ((i = 1; i <= NODES; i++)); do stop_node "$i"; done
}

cmd_status() {
    [ -d "$DIR" ] || die "no cluster directory $DIR"
    abs_dir
    local i pid m state running=0
    printf '%-5s %-8s %-22s %-8s %-6s %-7s %-8s %-8s\n' \
        node pid grpc state term leader commit applied
    for ((i = 1; i <= NODES; i++)); do
        pid=$(node_pid "$i") || pid=-
        m=""
        [ "$pid" = - ] || m=$(metrics_of "$i")
        [ "$pid" = - ] || running=$((running + 1))
        if [ "$pid" = - ]; then
            state=down
        elif [ -z "$m" ]; then
            state=no-metrics
        elif [ "$(metric "$m" raftlock_is_leader)" = 1 ]; then
            state=leader
        else
            state=follower
        fi
        printf '%-5s %-8s %-22s %-8s %-6s %-7s %-8s %-8s\n' "$i" "$pid" "$(addr "$i")" "$state" \
            "$(metric "$m" raftlock_term)" "$(metric "$m" raftlock_leader_id)" \
            "$(metric "$m" raftlock_commit_index)" "$(metric "$m" raftlock_applied_index)"
    done
    ((running > 0)) || return 0
    find_binaries
    echo
    timeout 20 "$RAFTLOCK" --endpoints "$(endpoints)" status || say "raftlock status failed"
}

cmd_kill() {
    node_arg
    abs_dir
    local pid
    pid=$(node_pid "$arg") || die "node $arg is not running"
    kill -KILL "$pid"
    while alive "$pid"; do sleep 0.1; done
    rm -f "$(pidfile "$arg")"
    say "node $arg killed (pid $pid)"
}

cmd_restart() {
    node_arg
    find_binaries
    abs_dir
    [ -f "$DIR/cluster.conf" ] || die "no cluster in $DIR; run start first"
    stop_node "$arg"
    start_node "$arg"
    STARTED=()
    # A node that runs but finds no leader (say, the others are down) is
    # left running: it is part of the cluster, and `stop` ends it.
    wait_node_follows "$arg"
}

case "$cmd" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    kill) cmd_kill ;;
    restart) cmd_restart ;;
    logs)
        node_arg
        cat "$(logfile "$arg")"
        ;;
    endpoints) endpoints ;;
    clean)
        cmd_stop
        if [ -d "$DIR" ]; then
            [ -f "$DIR/cluster.conf" ] || die "$DIR has no cluster.conf; not deleting it"
            rm -rf "$DIR"
            say "deleted $DIR"
        fi
        ;;
    *) usage ;;
esac
