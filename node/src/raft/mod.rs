//! The Raft layer: openraft's type configuration, the sled-backed log store,
//! the state-machine store that feeds [`crate::state`], and the outgoing
//! gRPC network.
//!
//! Storage layout (one sled database per node, `DATA_DIR/sled`):
//!
//! * tree `log`: key = log index as 8 big-endian bytes (so sled's order is
//!   log order), value = bincode of the openraft `Entry`;
//! * tree `meta`: `format` (on-disk format version), `vote`, `committed`,
//!   `last_purged`, `snapshot` (the latest snapshot: meta + lock table).
//!
//! Every write that openraft must be able to count on after a crash (append,
//! vote, truncate, purge, snapshot) is flushed with `flush_async` before it
//! is acknowledged. sled's own background flusher runs only every 500 ms
//! and is never relied on.

pub mod log_store;
pub mod network;
pub mod state_machine;

use std::io::Cursor;

use serde::{Deserialize, Serialize};

use crate::state::{Command, Response};

/// A node's id in the cluster (non-zero).
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// raftlock's openraft type configuration.
    pub TypeConfig:
        D = Command,
        R = Applied,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// What applying one log entry produced: the log index, and for a lock
/// command the state machine's response (blank and membership entries have
/// none).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// The entry's log index.
    pub index: u64,
    /// The lock table's response, for normal entries.
    pub response: Option<Response>,
}

/// The openraft handle used throughout the node.
pub type Raft = openraft::Raft<TypeConfig>;

/// On-disk format version written to `meta/format`. A node refuses to open
/// a data directory with another version.
pub const FORMAT_VERSION: u64 = 1;

/// A storage failure inside openraft's traits.
pub type StorageError = openraft::StorageError<NodeId>;

/// Wraps any error as an openraft storage I/O error.
pub(crate) fn io_err(
    subject: openraft::ErrorSubject<NodeId>,
    verb: openraft::ErrorVerb,
    e: impl std::error::Error + 'static,
) -> StorageError {
    openraft::StorageIOError::new(subject, verb, openraft::AnyError::new(&e)).into()
}
