//! Which cluster a node belongs to.
//!
//! The node that bootstraps a cluster (`--init`) picks a random cluster id
//! and keeps it in its data directory; every Raft RPC carries the sender's
//! id in metadata [`CLUSTER_ID_KEY`]. A node without one (a new member)
//! adopts the first it hears, durably, before it acts on the RPC; a node
//! with another id refuses the RPC (`FAILED_PRECONDITION`), so a node that
//! holds another cluster's log is never mixed into this one (its log, from
//! a higher term, could win an election and overwrite committed entries).

use std::sync::atomic::{AtomicU64, Ordering};

use tonic::metadata::MetadataMap;
use tonic::Status;

use super::backend::Log;
use crate::throttle::Throttle;

/// Metadata key carrying the sender's cluster id (hex) on Raft RPCs.
pub const CLUSTER_ID_KEY: &str = "raftlock-cluster-id";

/// This node's cluster id, and where it is kept.
pub struct ClusterIdentity {
    /// The id, 0 while unknown.
    id: AtomicU64,
    /// Durable home of the id.
    store: Log,
    /// Serializes adoption.
    adopt: tokio::sync::Mutex<()>,
    /// Refusals are logged once a minute per foreign cluster.
    refusals: Throttle<u64>,
}

/// How often a refusal of RPCs from one foreign cluster is logged.
pub const REFUSAL_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

impl ClusterIdentity {
    /// The identity kept in `store`.
    pub fn open(store: impl Into<Log>) -> anyhow::Result<Self> {
        let store = store.into();
        let id = store.cluster_id()?.unwrap_or(0);
        Ok(ClusterIdentity {
            id: AtomicU64::new(id),
            store,
            adopt: tokio::sync::Mutex::new(()),
            refusals: Throttle::new(REFUSAL_LOG_EVERY),
        })
    }

    /// Picks a new cluster id (bootstrap) unless there is one.
    pub async fn create(&self) -> anyhow::Result<()> {
        if self.id() == 0 {
            let id = crate::random::next_u64().max(1);
            self.store.set_cluster_id(id).await?;
            self.id.store(id, Ordering::SeqCst);
        }
        Ok(())
    }

    /// The cluster id, 0 while unknown.
    pub fn id(&self) -> u64 {
        self.id.load(Ordering::SeqCst)
    }

    /// The metadata value to send with an RPC, if the id is known.
    pub fn header(&self) -> Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>> {
        let id = self.id();
        (id != 0).then(|| format!("{id:016x}").parse().expect("hex is ascii"))
    }

    /// Checks an incoming RPC's cluster id: adopts it if this node has
    /// none, refuses another.
    pub async fn check(&self, metadata: &MetadataMap) -> Result<(), Status> {
        let Some(value) = metadata.get(CLUSTER_ID_KEY) else {
            return Ok(());
        };
        let theirs = value
            .to_str()
            .ok()
            .and_then(|v| u64::from_str_radix(v, 16).ok())
            .ok_or_else(|| Status::invalid_argument("malformed cluster id"))?;
        let ours = self.id();
        if ours == theirs {
            return Ok(());
        }
        if ours != 0 {
            return Err(self.refusal(ours, theirs));
        }
        let _one = self.adopt.lock().await;
        match self.id() {
            0 => {
                self.store.set_cluster_id(theirs).await.map_err(|e| {
                    Status::unavailable(format!("cannot record the cluster id: {e}"))
                })?;
                self.id.store(theirs, Ordering::SeqCst);
                tracing::info!(cluster = format!("{theirs:016x}"), "joined cluster");
                Ok(())
            }
            ours if ours == theirs => Ok(()),
            ours => Err(self.refusal(ours, theirs)),
        }
    }
}

impl ClusterIdentity {
    /// The refusal of an RPC from cluster `theirs`, logged at most once a
    /// minute per foreign cluster (with the number held back).
    fn refusal(&self, ours: u64, theirs: u64) -> Status {
        if let Some(held_back) = self.refusals.pass(theirs) {
            tracing::error!(
                ours = format!("{ours:016x}"),
                theirs = format!("{theirs:016x}"),
                refused_since_last_line = held_back,
                "refusing Raft RPCs from another cluster (logged at most once every {REFUSAL_LOG_EVERY:?})"
            );
        }
        refusal(ours, theirs)
    }
}

fn refusal(ours: u64, theirs: u64) -> Status {
    Status::failed_precondition(format!(
        "this node belongs to cluster {ours:016x}, the sender to cluster {theirs:016x}: a node \
         keeps one cluster's data; to move it to another cluster, empty its data directory first"
    ))
}
