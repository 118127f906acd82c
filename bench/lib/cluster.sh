# Sourced by bench/stages.sh and bench/profile.sh: a 3-node raftlock on
# 127.0.0.1 (3 x `raftlockd run`, data in $TMP), nodes on BASE_PORT+1..3,
# their metrics on +11..13. Needs BIN_DIR, TMP and BASE_PORT; sets EP,
# PEERS, METRICS and NODE_PIDS (node i is NODE_PIDS[i-1]). RAFTLOCKD_ARGS
# adds flags to every node.

EP=""; PEERS=""; METRICS=""
for i in 1 2 3; do
  EP+="${EP:+,}127.0.0.1:$((BASE_PORT + i))"
  PEERS+="${PEERS:+,}$i=127.0.0.1:$((BASE_PORT + i))"
  METRICS+="${METRICS:+,}127.0.0.1:$((BASE_PORT + 10 + i))"
done
NODE_PIDS=()

start_node() { # start_node ID [--init]
  local i=$1; shift
  # shellcheck disable=SC2086
  RUST_LOG=${RUST_LOG:-warn} "$BIN_DIR/raftlockd" run --id "$i" --listen "127.0.0.1:$((BASE_PORT + i))" \
    --metrics-listen "127.0.0.1:$((BASE_PORT + 10 + i))" --data-dir "$TMP/raftlock-$i" \
    --peers "$PEERS" --insecure-peers ${RAFTLOCKD_ARGS:-} "$@" >>"$TMP/raftlock-$i.log" 2>&1 &
  NODE_PIDS[$((i - 1))]=$!
}

start_cluster() {
  # Node 1 bootstraps; start it last so its first election finds its peers.
  start_node 2; start_node 3; sleep 0.3; start_node 1 --init
  "$BIN_DIR/raftlock-bench" wait --target raftlock --endpoints "$EP" --timeout 60
}

stop_cluster() {
  local p
  for p in "${NODE_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
