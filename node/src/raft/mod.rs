//! The Raft layer: openraft's type configuration, the sled-backed log store
//! and the outgoing gRPC network. (The state-machine store, which feeds the
//! lock table, is the apply path's: `crate::apply`.)
//!
//! Storage layout (one sled database per node, `DATA_DIR/sled`):
//!
//! * tree `log`: key = log index as 8 big-endian bytes (so sled's order is
//!   log order), value = bincode of the openraft `Entry`;
//! * tree `meta`: `format` (on-disk format version), `vote`, `committed`,
//!   `last_purged`;
//! * file `DATA_DIR/snapshot.bin`: the latest snapshot (meta + lock table,
//!   with a checksum).
//!
//! Every write that openraft must be able to count on after a crash or a
//! power loss (append, vote, truncate, purge) is on stable storage before it
//! is acknowledged: sled's flush, then `fdatasync` of sled's `db` file and
//! `fsync` of any new blob file and its directory (sled's own flush is only
//! `sync_file_range`; see `log_store::sled_disk`). Snapshots are files
//! written to a temporary name, synced, renamed and the directory synced.
//! sled's background flusher is off and never relied on.

pub mod identity;
pub mod links;
pub mod log_store;
pub mod network;
pub mod peer_input;
pub mod runtime;

use serde::{Deserialize, Serialize};

use crate::state::{Command, Response};

/// A node's id in the cluster (non-zero).
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// raftlock's openraft type configuration: terms and leader ids as
    /// openraft's defaults (`u64`, and the "advanced" leader id of term and
    /// node, totally ordered: a term may have several leaders one after
    /// another, each with a larger node id, as a node that voted for
    /// (term, 1) may still vote for (term, 2)), entries carrying a
    /// [`Batch`], members with [`NodeAddrs`], tokio with the node's random
    /// source ([`runtime::NodeRuntime`]).
    pub TypeConfig:
        D = Batch,
        R = Applied,
        NodeId = NodeId,
        Node = NodeAddrs,
        AsyncRuntime = runtime::NodeRuntime,
);

/// A log id (the leader that proposed the entry, and its index).
pub type LogId = openraft::type_config::alias::LogIdOf<TypeConfig>;
/// The leader id a log id carries (term and node).
pub type CommittedLeaderId = openraft::type_config::alias::CommittedLeaderIdOf<TypeConfig>;
/// A log entry.
pub type Entry = openraft::type_config::alias::EntryOf<TypeConfig>;
/// An entry's payload.
pub type EntryPayload = openraft::type_config::alias::EntryPayloadOf<TypeConfig>;
/// A vote (term, candidate, whether a quorum granted it).
pub type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;
/// A membership and the log id that set it.
pub type StoredMembership = openraft::type_config::alias::StoredMembershipOf<TypeConfig>;
/// What a snapshot covers.
pub type SnapshotMeta = openraft::type_config::alias::SnapshotMetaOf<TypeConfig>;
/// A snapshot as openraft hands it around: its meta and the file's bytes.
pub type Snapshot = openraft::type_config::alias::SnapshotOf<TypeConfig, SnapshotData>;
/// A snapshot's data: the bytes of a snapshot file.
pub type SnapshotData = Vec<u8>;
/// openraft's metrics of one node.
pub type RaftMetrics = openraft::RaftMetrics<TypeConfig>;

pub use openraft::async_runtime::WatchReceiver;

/// openraft's metrics of one node, as a watch channel
/// (`raft.metrics()`; read it with [`WatchReceiver::borrow_watched`]).
pub type MetricsWatch = openraft::type_config::alias::WatchReceiverOf<TypeConfig, RaftMetrics>;

/// Waits until `pred` holds for the metrics in `rx`, and returns them;
/// `None` if Raft stopped first.
pub async fn wait_metrics(
    rx: &mut MetricsWatch,
    mut pred: impl FnMut(&RaftMetrics) -> bool,
) -> Option<RaftMetrics> {
    loop {
        {
            let m = rx.borrow_and_update();
            if pred(&m) {
                return Some(m.clone());
            }
        }
        rx.changed().await.ok()?;
    }
}

/// The log id of the entry at `index` proposed by `node` in `term`.
pub fn log_id(term: u64, node: NodeId, index: u64) -> LogId {
    LogId::new(
        CommittedLeaderId {
            term,
            node_id: node,
        },
        index,
    )
}

/// A member's addresses, as the membership replicates them.
///
/// Clients and peers may reach a node on different ports: `addr` serves
/// `Locks` and `Cluster` (followers redirect clients to the leader's
/// `addr`), `peer_addr` serves `Raft` (what the other nodes dial). They are
/// the same unless the node runs a separate peer listener
/// (`raftlockd run --peer-listen`), which operators can firewall off from
/// clients, like etcd's peer port.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddrs {
    /// Where clients reach the node (host:port).
    pub addr: String,
    /// Where peers send Raft messages (host:port).
    pub peer_addr: String,
}

impl NodeAddrs {
    /// A node that serves clients and peers on one address.
    pub fn shared(addr: impl Into<String>) -> Self {
        let addr = addr.into();
        NodeAddrs {
            peer_addr: addr.clone(),
            addr,
        }
    }

    /// A node with a separate peer address.
    pub fn new(addr: impl Into<String>, peer_addr: impl Into<String>) -> Self {
        NodeAddrs {
            addr: addr.into(),
            peer_addr: peer_addr.into(),
        }
    }

    /// Parses `CLIENT_ADDR` or `CLIENT_ADDR/PEER_ADDR`, as `--peers` and
    /// the TOML file's `[peers]` take them. `None` if either address is not
    /// `host:port`.
    pub fn parse(s: &str) -> Option<Self> {
        let (addr, peer) = match s.split_once('/') {
            Some((a, p)) => (a.trim(), p.trim()),
            None => (s.trim(), s.trim()),
        };
        (valid_addr(addr) && valid_addr(peer)).then(|| NodeAddrs::new(addr, peer))
    }
}

impl std::fmt::Display for NodeAddrs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.addr == self.peer_addr {
            f.write_str(&self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.peer_addr)
        }
    }
}

/// True for `host:port` with a non-empty host (no `/` or whitespace in it)
/// and a non-zero port.
pub fn valid_addr(addr: &str) -> bool {
    matches!(addr.rsplit_once(':'), Some((h, p))
        if !h.is_empty()
            && !h.contains(|c: char| c == '/' || c.is_whitespace())
            && p.parse::<u16>().is_ok_and(|p| p != 0))
}

/// One log entry's payload: lock commands applied in order.
///
/// Concurrent client requests are grouped into one entry (see
/// `api::batcher`), so one append, one fsync and one replication round
/// serve many requests. Inside the lock table each command gets its own
/// *command index*, `log index × BATCH_SLOTS + position`, which is unique
/// and increasing, so session ids and queue order stay well defined.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch(pub Vec<Command>);

impl std::fmt::Display for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "batch of {} command(s)", self.0.len())
    }
}

/// Command-index slots per log entry; a batch holds at most this many
/// commands.
pub const BATCH_SLOTS: u64 = 1024;

/// Most commands in one entry: what the batcher groups and what the lease
/// keeper proposes at once.
pub const MAX_BATCH: usize = 1000;
const _: () = assert!(MAX_BATCH as u64 <= BATCH_SLOTS);

/// The command index of the `position`-th command of the entry at
/// `log_index`.
pub fn command_index(log_index: u64, position: usize) -> u64 {
    log_index * BATCH_SLOTS + position as u64
}

/// The log index a command index belongs to (what clients are shown).
pub fn log_index_of(command_index: u64) -> u64 {
    command_index / BATCH_SLOTS
}

/// What applying one log entry produced: its log index and, for a batch,
/// the lock table's response to each command in order (blank and
/// membership entries have none).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// The entry's log index.
    pub index: u64,
    /// The lock table's responses, one per command of the batch.
    pub responses: Vec<Response>,
}

impl std::fmt::Display for Applied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "entry {}: {} response(s)",
            self.index,
            self.responses.len()
        )
    }
}

/// Largest Raft message a node decodes. An `AppendEntries` carries at most
/// [`MAX_PAYLOAD_ENTRIES`](crate::node::MAX_PAYLOAD_ENTRIES) entries of at most
/// [`MAX_BATCH_BYTES`](crate::api::batcher::MAX_BATCH_BYTES) (plus one
/// command, at most a restore part) each, about 6.3 MiB; an
/// `InstallSnapshot` one chunk of [`SNAPSHOT_CHUNK_BYTES`]. Anything larger
/// is refused (`OUT_OF_RANGE`) before it is read into memory.
pub const MAX_RAFT_MESSAGE_BYTES: usize = 16 << 20;

/// Bytes of snapshot in one `InstallSnapshot` message: the leader streams
/// a snapshot file in chunks of this size, each well under a peer's
/// message limit.
pub const SNAPSHOT_CHUNK_BYTES: u64 = 4 << 20;
const _: () = assert!((SNAPSHOT_CHUNK_BYTES as usize) * 2 < MAX_RAFT_MESSAGE_BYTES);

/// Largest snapshot a node takes from a leader (`InstallSnapshot`, a
/// stream of messages of at most [`MAX_RAFT_MESSAGE_BYTES`]); a table that
/// large is far past every limit of the lock table.
pub const MAX_SNAPSHOT_BYTES: usize = 2 << 30;

/// On-disk format version written to `meta/format`. A node refuses to open
/// a data directory with another version, saying how to move its data (a
/// backup from the old version restores into a new cluster). Version 3:
/// restore parts carry a fence bump, lock tables an index floor, snapshot
/// files a checksum. Version 4: members carry a client and a peer address
/// ([`NodeAddrs`]).
pub const FORMAT_VERSION: u64 = 4;
