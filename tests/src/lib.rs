//! Cluster integration tests for raftlock: real nodes, real gRPC, real sled
//! on loopback, each node in its own temp directory. The tests are in
//! `tests/cluster/` (one binary, a module per area, run in the order of
//! their numbers); what they run on (`TestCluster`, polling helpers,
//! partitions) is the `raftlock-testkit` crate.

use raftlock_node::state::limits::MAX_SESSION_TTL_MS;
use raftlock_node::state::{cmd, Command, LockTable, Reply};

/// A lock table holding `n` open sessions (log indexes 1..=n, the longest
/// ttl), built in process: opening them one request at a time would take
/// minutes. A test restores its backup (`raftlock_node::api::backup::write`).
pub fn table_of_sessions(n: u64) -> LockTable {
    let mut table = LockTable::new();
    for index in 1..=n {
        let r = table.apply(
            index,
            Command::OpenSessionV0(cmd::OpenSessionV0 {
                ttl_ms: MAX_SESSION_TTL_MS,
                lock_delay_ms: 0,
                nonce: 0,
                owner: String::new(),
            }),
        );
        assert!(matches!(r.reply, Reply::Opened { .. }), "{:?}", r.reply);
    }
    table
}
