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
//! An empty node (never voted or logged) is a new member only if the
//! cluster has not known it to hold data. Every RPC names, in metadata
//! [`VOTERS_WITH_DATA_KEY`], the voters of the sender's membership that
//! the sender knows have held data: itself, each peer that has answered
//! it with a log or a granted vote, and each that an RPC from another
//! node named so (the names spread with every RPC, replication streams
//! carrying them in every message, and each node keeps them in its data
//! directory). A voter named so and found empty lost its data directory,
//! with the votes it granted and the entries it acknowledged; taking part
//! again could let a leader be elected twice in one term or an
//! acknowledged entry be lost. It refuses the RPC (`FAILED_PRECONDITION`)
//! and stays out until the cluster has removed its id; then it can be
//! added again, as a learner (`raftlock members remove N`, then
//! `raftlock members add N`), which names it no more until it has caught
//! up. A voter no node has heard from yet (one of the bootstrap
//! membership's, `--init` with several `--peers`, that has not started)
//! is named by no one, and joins whatever membership changes it missed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tonic::metadata::MetadataMap;
use tonic::Status;

use super::log_store::LogStore;
use crate::throttle::Throttle;

/// Metadata key carrying the sender's cluster id (hex) on Raft RPCs.
pub const CLUSTER_ID_KEY: &str = "raftlock-cluster-id";

/// Metadata key on Raft RPCs: the voters of the sender's membership that
/// the sender knows have held data, as node ids separated by commas
/// (absent: none).
pub const VOTERS_WITH_DATA_KEY: &str = "raftlock-voters-with-data";

/// The most node ids a [`VOTERS_WITH_DATA_KEY`] list (or a
/// `RaftMessage.voters_with_data`) may name; a longer one is refused as
/// malformed (`INVALID_ARGUMENT`).
pub const MAX_VOTERS_NAMED: usize = 256;

/// Parses a [`VOTERS_WITH_DATA_KEY`] value.
fn parse_named(value: &str) -> Option<Vec<super::NodeId>> {
    let named: Vec<super::NodeId> = value
        .split(',')
        .map(|id| id.trim().parse().ok())
        .collect::<Option<_>>()?;
    (named.len() <= MAX_VOTERS_NAMED).then_some(named)
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
    /// Refusals as a lost voter ([`VOTERS_WITH_DATA_KEY`]), once a
    /// minute.
    lost_voter: Throttle<()>,
    /// The nodes known to have held data (kept in `store`).
    held: Arc<Held>,
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
            adopt: tokio::sync::Mutex::new(()),
            refusals: Throttle::new(REFUSAL_LOG_EVERY),
            lost_voter: Throttle::new(REFUSAL_LOG_EVERY),
            has_data: std::sync::atomic::AtomicBool::new(false),
            held: Arc::new(Held {
                known: std::sync::Mutex::new(store.held_data()?),
                writing: tokio::sync::Mutex::new(()),
            }),
            store,
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
    /// none (unless the sender names this empty node a voter that has
    /// held data: see [`VOTERS_WITH_DATA_KEY`]), refuses another. Once the
    /// RPC is found to come from this node's cluster, the voters it names
    /// are taken as known to have held data.
    pub async fn check(&self, metadata: &MetadataMap) -> Result<(), Status> {
        let named = match metadata.get(VOTERS_WITH_DATA_KEY) {
            None => Vec::new(),
            Some(v) => v.to_str().ok().and_then(parse_named).ok_or_else(|| {
                Status::invalid_argument(format!("malformed {VOTERS_WITH_DATA_KEY}"))
            })?,
        };
        // Before anything else, and for as long as the node is empty: an
        // id adopted from an RPC that did not name it (a sender that has
        // not heard of its data) lets nothing through.
        self.refuse_if_lost(&named)?;
        self.check_id(metadata).await?;
        self.learn(named);
        Ok(())
    }

    /// The voters named in a message of a replication stream
    /// (`RaftMessage.voters_with_data`; the stream's metadata was
    /// [`check`](Self::check)ed when it opened): refused as
    /// [`check`](Self::check) refuses, else taken as known to have held
    /// data.
    pub fn check_named(&self, named: &[super::NodeId]) -> Result<(), Status> {
        if named.len() > MAX_VOTERS_NAMED {
            return Err(Status::invalid_argument(format!(
                "voters_with_data names more than {MAX_VOTERS_NAMED} nodes"
            )));
        }
        self.refuse_if_lost(named)?;
        self.learn(named.iter().copied());
        Ok(())
    }

    async fn check_id(&self, metadata: &MetadataMap) -> Result<(), Status> {
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

    /// Records that `node` has held data: it answered this node with a
    /// log or a granted vote.
    pub fn saw_data(&self, node: super::NodeId) {
        self.learn([node]);
    }

    /// Takes the nodes in `nodes` as known to have held data; the ones
    /// not known before are recorded in the data directory (in the
    /// background: until then, a restart forgets them, and the next RPC
    /// that names them teaches them again).
    fn learn(&self, nodes: impl IntoIterator<Item = super::NodeId>) {
        let mut known = self.held.known.lock().expect("held lock poisoned");
        let before = known.len();
        known.extend(nodes);
        if known.len() == before {
            return;
        }
        drop(known);
        let (held, store) = (self.held.clone(), self.store.clone());
        tokio::spawn(async move {
            let _one = held.writing.lock().await;
            let known = held.known.lock().expect("held lock poisoned").clone();
            if let Err(e) = store.set_held_data(&known).await {
                tracing::warn!("cannot record which nodes have held data: {e}");
            }
        });
    }

    /// The voters of `membership` (this node's) that this node knows have
    /// held data, itself included when it is one: what its RPCs name (see
    /// [`VOTERS_WITH_DATA_KEY`]).
    pub fn voters_with_data(&self, membership: &super::StoredMembership) -> Vec<super::NodeId> {
        let known = self.held.known.lock().expect("held lock poisoned");
        membership
            .membership()
            .voter_ids()
            .filter(|v| *v == self.node || known.contains(v))
            .collect()
    }

    /// The [`VOTERS_WITH_DATA_KEY`] value naming `voters`, if any.
    pub fn named_header(
        voters: &[super::NodeId],
    ) -> Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>> {
        if voters.is_empty() {
            return None;
        }
        let list: Vec<String> = voters.iter().map(|v| v.to_string()).collect();
        list.join(",").parse().ok()
    }
}

/// The nodes a node knows to have held data.
struct Held {
    /// The nodes.
    known: std::sync::Mutex<std::collections::BTreeSet<super::NodeId>>,
    /// Serializes their recording.
    writing: tokio::sync::Mutex<()>,
}

impl ClusterIdentity {
    /// Refuses an RPC that names this node, found empty, a voter that has
    /// held data.
    fn refuse_if_lost(&self, named: &[super::NodeId]) -> Result<(), Status> {
        if !named.contains(&self.node) || self.has_data.load(Ordering::Relaxed) {
            return Ok(());
        }
        if !self.store.is_fresh() {
            // A node with a vote or a log keeps one: not asked again.
            self.has_data.store(true, Ordering::Relaxed);
            return Ok(());
        }
        Err(self.lost_voter_refusal())
    }

    /// The refusal of an RPC that names this empty node a voter that has
    /// held data; logged at most once a minute.
    fn lost_voter_refusal(&self) -> Status {
        let node = self.node;
        let why = format!(
            "this node's data directory is empty, but the cluster counts node {node} as a voter \
             that has held data (it answered with a log or a vote): a voter that lost its data \
             has forgotten the votes it granted and the entries it acknowledged, and must not \
             take part again under its old id; remove it first (raftlock members remove {node}), \
             then add it again (raftlock members add {node} ...)"
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

    fn rpc(named: Option<&str>) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert(CLUSTER_ID_KEY, format!("{THEIRS:016x}").parse().unwrap());
        if let Some(v) = named {
            m.insert(VOTERS_WITH_DATA_KEY, v.parse().unwrap());
        }
        m
    }

    fn node_2_on(disk: MemDisk) -> ClusterIdentity {
        let store = LogStore::in_memory(disk).expect("open");
        ClusterIdentity::open(2, store).expect("identity")
    }

    fn empty_node_2() -> ClusterIdentity {
        node_2_on(MemDisk::new())
    }

    /// Issue 45, item 4: an empty node the cluster names a voter that has
    /// held data refuses, adopts nothing, and says how to bring it back.
    #[tokio::test]
    async fn an_empty_node_named_a_voter_with_data_refuses() {
        let identity = empty_node_2();
        for _ in 0..2 {
            let refused = identity.check(&rpc(Some("1,2,3"))).await.unwrap_err();
            assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
            assert!(
                refused.message().contains("raftlock members remove 2"),
                "{refused:?}"
            );
            assert_eq!(identity.id(), 0, "nothing adopted");
            assert_eq!(identity.store.cluster_id().unwrap(), None);
            let refused = identity.check_named(&[2]).unwrap_err();
            assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        }
        // Removed, then added again: a learner, not named.
        identity
            .check(&rpc(Some("1,3")))
            .await
            .expect("a learner joins");
        assert_eq!(identity.id(), THEIRS);
    }

    /// Review of issue 45, item 4: the guard holds while the node is
    /// empty, not only until it has adopted a cluster id (an RPC that does
    /// not name it, from a sender that has not heard of its data, adopts
    /// it), and whether or not the RPC carries the cluster id.
    #[tokio::test]
    async fn the_guard_holds_while_the_node_is_empty_after_adopting() {
        let identity = empty_node_2();
        identity
            .check(&rpc(None))
            .await
            .expect("adopted, not named");
        assert_eq!(identity.id(), THEIRS);
        let refused = identity.check(&rpc(Some("2"))).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        let mut no_id = MetadataMap::new();
        no_id.insert(VOTERS_WITH_DATA_KEY, "2".parse().unwrap());
        let refused = identity.check(&no_id).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    }

    /// Seed 3403419: a voter no node has heard from (one of the bootstrap
    /// membership's, not started yet) is named by no one, and joins.
    #[tokio::test]
    async fn an_empty_node_not_named_joins() {
        for named in [None, Some("1"), Some("1,3"), Some(" 1 , 3 ")] {
            let identity = empty_node_2();
            identity
                .check(&rpc(named))
                .await
                .unwrap_or_else(|e| panic!("{named:?}: {e:?}"));
            assert_eq!(identity.id(), THEIRS, "{named:?}");
            assert_eq!(identity.store.cluster_id().unwrap(), Some(THEIRS));
        }
    }

    /// A malformed or overlong list is refused, and changes nothing.
    #[tokio::test]
    async fn a_malformed_list_is_refused() {
        let at_limit = (1..=MAX_VOTERS_NAMED as u64)
            .map(|i| (i + 10).to_string())
            .collect::<Vec<_>>()
            .join(",");
        let over = format!("{at_limit},9999");
        for bad in ["", "2@7", "junk", "1,,3", over.as_str()] {
            let identity = empty_node_2();
            let refused = identity.check(&rpc(Some(bad))).await.unwrap_err();
            assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{bad:?}");
            assert_eq!(identity.id(), 0, "{bad:?}");
        }
        let identity = empty_node_2();
        identity
            .check(&rpc(Some(&at_limit)))
            .await
            .expect("at the limit");
        let over: Vec<u64> = (0..=MAX_VOTERS_NAMED as u64).map(|i| i + 10).collect();
        let refused = identity.check_named(&over).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        identity
            .check_named(&over[..MAX_VOTERS_NAMED])
            .expect("at the limit");
    }

    /// A node that has voted or logged is not empty, whatever its cluster
    /// id (a data directory from before cluster ids).
    #[tokio::test]
    async fn a_node_with_a_vote_adopts_even_when_named() {
        let disk = MemDisk::new();
        let mut store = LogStore::in_memory(disk.clone()).expect("open");
        store.save_vote(&Vote::new(3, 1)).await.expect("vote");
        let identity = ClusterIdentity::open(2, store).expect("identity");
        identity.check(&rpc(Some("2"))).await.expect("adopted");
        assert_eq!(identity.id(), THEIRS);
        identity.check_named(&[2]).expect("not empty");
    }

    /// What a node names: the voters of its membership it has seen hold
    /// data or was told of (itself among them when a voter), learners
    /// and non-members never; what it learned survives a restart.
    #[tokio::test]
    async fn a_node_names_the_voters_it_knows_have_held_data() {
        use crate::raft::{NodeAddrs, StoredMembership};
        let nodes = |ids: &[u64]| -> std::collections::BTreeMap<u64, NodeAddrs> {
            ids.iter()
                .map(|id| (*id, NodeAddrs::shared(format!("n{id}:1"))))
                .collect()
        };
        let voters = |ids: &[u64]| {
            ids.iter()
                .copied()
                .collect::<std::collections::BTreeSet<_>>()
        };
        let membership = |v: &[u64], all: &[u64]| {
            let m = openraft::Membership::new(vec![voters(v)], nodes(all)).expect("membership");
            StoredMembership::new(Some(crate::raft::log_id(2, 1, 9)), m)
        };
        let disk = MemDisk::new();
        let identity = node_2_on(disk.clone());
        let m = membership(&[1, 2, 3], &[1, 2, 3, 4]);
        assert_eq!(identity.voters_with_data(&m), [2], "itself only");
        identity.saw_data(4);
        identity.saw_data(3);
        assert_eq!(identity.voters_with_data(&m), [2, 3], "4 is a learner");
        identity.check(&rpc(Some("1,4"))).await.expect("told");
        assert_eq!(identity.voters_with_data(&m), [1, 2, 3]);
        let promoted = membership(&[1, 2, 3, 4], &[1, 2, 3, 4]);
        assert_eq!(identity.voters_with_data(&promoted), [1, 2, 3, 4]);
        assert!(identity.voters_with_data(&membership(&[1], &[1])) == [1]);

        // Recorded in the background; a restart reads it back.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        let want: std::collections::BTreeSet<u64> = [1, 3, 4].into();
        loop {
            let store = LogStore::in_memory(disk.clone()).expect("open");
            if store.held_data().expect("read") == want {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "not recorded");
            tokio::task::yield_now().await;
        }
        let again = node_2_on(disk);
        assert_eq!(again.voters_with_data(&promoted), [1, 2, 3, 4]);
        assert_eq!(ClusterIdentity::named_header(&[]), None);
        assert_eq!(ClusterIdentity::named_header(&[1, 3]).unwrap(), "1,3");
    }
}
