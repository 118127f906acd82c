//! Which cluster a node belongs to.
//!
//! The node that bootstraps a cluster (`--init`) picks a random cluster id
//! and keeps it in its data directory; every Raft RPC carries the sender's
//! id in metadata [`CLUSTER_ID_KEY`]. A node without one (a new member)
//! adopts the first it hears, durably, before it acts on the RPC; a node
//! with another id refuses the RPC (`FAILED_PRECONDITION`), so a node that
//! holds another cluster's log is never mixed into this one (its log, from
//! a higher term, could win an election and overwrite committed entries).
//!
//! An empty node (no cluster id, never voted or logged) is a new member
//! only if the cluster did not already count it as a voter: every RPC also
//! says, in metadata [`VOTER_KEY`], when its target is a voter of the
//! sender's membership and that membership's log index. A voter of any
//! membership but the bootstrap one (log index 0) had to be added, as a
//! learner first and then promoted, so it held the log; found empty, it
//! lost its data directory, with the votes it granted and the entries it
//! acknowledged, and taking part again could let a leader be elected twice
//! in one term or an acknowledged entry be lost. It refuses the RPC
//! (`FAILED_PRECONDITION`) and stays out until the cluster has removed its
//! id; then it can be added again, as a learner (`raftlock members remove
//! N`, then `raftlock members add N`).

use std::sync::atomic::{AtomicU64, Ordering};

use tonic::metadata::MetadataMap;
use tonic::Status;

use super::log_store::LogStore;
use crate::throttle::Throttle;

/// Metadata key carrying the sender's cluster id (hex) on Raft RPCs.
pub const CLUSTER_ID_KEY: &str = "raftlock-cluster-id";

/// Metadata key on Raft RPCs whose target is a voter of the sender's
/// membership: `ID@INDEX`, the target's node id and the log index of that
/// membership (0: the one the cluster was bootstrapped with).
pub const VOTER_KEY: &str = "raftlock-voter";

/// The [`VOTER_KEY`] value for an RPC to `target`, if `membership` (the
/// sender's) counts it as a voter.
pub fn voter_mark(
    membership: &super::StoredMembership,
    target: super::NodeId,
) -> Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>> {
    if !membership.membership().voter_ids().any(|v| v == target) {
        return None;
    }
    let index = membership.log_id().as_ref().map_or(0, |l| l.index);
    format!("{target}@{index}").parse().ok()
}

/// This node's cluster id, and where it is kept.
pub struct ClusterIdentity {
    /// This node's id.
    node: super::NodeId,
    /// The id, 0 while unknown.
    id: AtomicU64,
    /// Durable home of the id.
    store: LogStore,
    /// Serializes adoption.
    adopt: tokio::sync::Mutex<()>,
    /// Refusals are logged once a minute per foreign cluster.
    refusals: Throttle<u64>,
    /// Refusals as a lost voter ([`VOTER_KEY`]), once a minute.
    lost_voter: Throttle<()>,
    /// Set once the store was seen holding a vote or a log (it never
    /// becomes empty again while the node runs).
    has_data: std::sync::atomic::AtomicBool,
}

/// How often a refusal of RPCs from one foreign cluster is logged.
pub const REFUSAL_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

impl ClusterIdentity {
    /// The identity of node `node`, kept in `store`.
    pub fn open(node: super::NodeId, store: LogStore) -> anyhow::Result<Self> {
        let id = store.cluster_id()?.unwrap_or(0);
        Ok(ClusterIdentity {
            node,
            id: AtomicU64::new(id),
            store,
            adopt: tokio::sync::Mutex::new(()),
            refusals: Throttle::new(REFUSAL_LOG_EVERY),
            lost_voter: Throttle::new(REFUSAL_LOG_EVERY),
            has_data: std::sync::atomic::AtomicBool::new(false),
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
    /// none (unless the sender counts this empty node as a voter it must
    /// have been before: see [`VOTER_KEY`]), refuses another.
    pub async fn check(&self, metadata: &MetadataMap) -> Result<(), Status> {
        // Before anything else, and for as long as the node is empty: an
        // id adopted from an unmarked RPC (a sender with an older
        // membership) lets nothing through.
        if let Some(at) = self.lost_voter_at(metadata) {
            return Err(self.lost_voter_refusal(at));
        }
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
                if let Some(at) = self.lost_voter_at(metadata) {
                    return Err(self.lost_voter_refusal(at));
                }
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
    /// The log index of the sender's membership, if it counts this node,
    /// found empty, as a voter it cannot be new in (see [`VOTER_KEY`]).
    /// A mark for another node id (a sender with a stale address book)
    /// or a malformed one says nothing.
    fn lost_voter_at(&self, metadata: &MetadataMap) -> Option<u64> {
        if self.has_data.load(Ordering::Relaxed) {
            return None;
        }
        let (id, index) = metadata.get(VOTER_KEY)?.to_str().ok()?.split_once('@')?;
        let (id, index): (u64, u64) = (id.parse().ok()?, index.parse().ok()?);
        if id != self.node || index == 0 {
            return None;
        }
        if !self.store.is_fresh() {
            // A node with a vote or a log keeps one: not asked again.
            self.has_data.store(true, Ordering::Relaxed);
            return None;
        }
        Some(index)
    }

    /// The refusal of an RPC that counts this empty node as a voter of
    /// the membership at log index `at`; logged at most once a minute.
    fn lost_voter_refusal(&self, at: u64) -> Status {
        let node = self.node;
        let why = format!(
            "this node's data directory is empty, but the cluster counts node {node} as a voter \
             (membership at log index {at}): a voter that lost its data has forgotten the votes \
             it granted and the entries it acknowledged, and must not take part again under its \
             old id; remove it first (raftlock members remove {node}), then add it again \
             (raftlock members add {node} ...). A node made a voter before it ever ran is refused \
             the same way: it cannot be told from one that lost its data"
        );
        if let Some(held_back) = self.lost_voter.pass(()) {
            tracing::error!(refused_since_last_line = held_back, "{why}");
        }
        Status::failed_precondition(why)
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::log_store::{LogStore, MemDisk};
    use crate::raft::Vote;
    use openraft::storage::RaftLogStorage;

    const THEIRS: u64 = 0xabc;

    fn rpc(voter: Option<&str>) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert(CLUSTER_ID_KEY, format!("{THEIRS:016x}").parse().unwrap());
        if let Some(v) = voter {
            m.insert(VOTER_KEY, v.parse().unwrap());
        }
        m
    }

    fn empty_node_2() -> ClusterIdentity {
        let store = LogStore::in_memory(MemDisk::new()).expect("open");
        ClusterIdentity::open(2, store).expect("identity")
    }

    /// Issue 45, item 4: an empty node the cluster counts as a voter of a
    /// membership after the bootstrap one refuses, adopts nothing, and
    /// says how to bring it back.
    #[tokio::test]
    async fn an_empty_node_counted_as_a_voter_after_bootstrap_refuses() {
        let identity = empty_node_2();
        for _ in 0..2 {
            let refused = identity.check(&rpc(Some("2@7"))).await.unwrap_err();
            assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
            assert!(
                refused.message().contains("raftlock members remove 2"),
                "{refused:?}"
            );
            assert_eq!(identity.id(), 0, "nothing adopted");
            assert_eq!(identity.store.cluster_id().unwrap(), None);
        }
        // Removed, then added again: a learner, unmarked.
        identity.check(&rpc(None)).await.expect("a learner joins");
        assert_eq!(identity.id(), THEIRS);
    }

    /// Review of issue 45, item 4: the guard holds while the node is
    /// empty, not only until it has adopted a cluster id (an unmarked RPC,
    /// from a sender whose membership is older, adopts it), and whether or
    /// not the RPC carries the cluster id.
    #[tokio::test]
    async fn the_guard_holds_while_the_node_is_empty_after_adopting() {
        let identity = empty_node_2();
        identity.check(&rpc(None)).await.expect("adopted, unmarked");
        assert_eq!(identity.id(), THEIRS);
        let refused = identity.check(&rpc(Some("2@7"))).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        let mut no_id = MetadataMap::new();
        no_id.insert(VOTER_KEY, "2@7".parse().unwrap());
        let refused = identity.check(&no_id).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    }

    #[tokio::test]
    async fn an_empty_node_may_join_as_a_learner_or_a_bootstrap_voter() {
        for mark in [None, Some("2@0"), Some("3@7"), Some("2@"), Some("junk")] {
            let identity = empty_node_2();
            identity
                .check(&rpc(mark))
                .await
                .unwrap_or_else(|e| panic!("{mark:?}: {e:?}"));
            assert_eq!(identity.id(), THEIRS, "{mark:?}");
            assert_eq!(identity.store.cluster_id().unwrap(), Some(THEIRS));
        }
    }

    /// A node that has voted or logged is not empty, whatever its cluster
    /// id (a data directory from before cluster ids).
    #[tokio::test]
    async fn a_node_with_a_vote_adopts_even_when_marked_a_voter() {
        let disk = MemDisk::new();
        let mut store = LogStore::in_memory(disk.clone()).expect("open");
        store.save_vote(&Vote::new(3, 1)).await.expect("vote");
        let identity = ClusterIdentity::open(2, store).expect("identity");
        identity.check(&rpc(Some("2@7"))).await.expect("adopted");
        assert_eq!(identity.id(), THEIRS);
    }

    #[test]
    fn only_a_voter_is_marked_with_its_membership_index() {
        use crate::raft::{NodeAddrs, StoredMembership};
        let nodes = |ids: &[u64]| -> std::collections::BTreeMap<u64, NodeAddrs> {
            ids.iter()
                .map(|id| (*id, NodeAddrs::shared(format!("n{id}:1"))))
                .collect()
        };
        let membership =
            openraft::Membership::new(vec![[1u64, 2].into_iter().collect()], nodes(&[1, 2, 3]))
                .expect("membership");
        let stored = StoredMembership::new(Some(crate::raft::log_id(2, 1, 9)), membership);
        assert_eq!(voter_mark(&stored, 2).unwrap(), "2@9");
        assert_eq!(voter_mark(&stored, 3), None, "a learner");
        assert_eq!(voter_mark(&stored, 4), None, "not a member");
    }
}
