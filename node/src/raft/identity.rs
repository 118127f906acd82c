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
//! node of its cluster named so (the names spread with every RPC,
//! replication streams carrying them in every message, and each node
//! records them in its data directory before it acts on them). A voter
//! named so and found empty lost its data directory, with the votes it
//! granted and the entries it acknowledged; taking part again could let a
//! leader be elected twice in one term or an acknowledged entry be lost.
//! It refuses the RPC (`FAILED_PRECONDITION`) and stays out until the
//! cluster has removed its id, as long as the RPCs it gets name it (one
//! from a node that has not heard of its data lets it in); then it can be
//! added again, as a learner (`raftlock members remove N`, then
//! `raftlock members add N`), which is named again once promoted (after
//! it has caught up). A voter no node has heard from yet (one of the
//! bootstrap membership's, `--init` with several `--peers`, that has not
//! started) is named by no one, and joins whatever membership changes it
//! missed.

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
    pub async fn open(node: super::NodeId, store: LogStore) -> anyhow::Result<Self> {
        let id = store.cluster_id()?.unwrap_or(0);
        // A data directory with a log or a vote but no record of who held
        // data comes from a build before the record: its first membership
        // seeds it (see `Known::upgraded`).
        let (nodes, upgraded) = match store.held_data()? {
            Some(nodes) => (nodes, false),
            None if store.is_fresh() => {
                store.set_held_data(&Default::default()).await?;
                (Default::default(), false)
            }
            None => (Default::default(), true),
        };
        Ok(ClusterIdentity {
            node,
            id: AtomicU64::new(id),
            adopt: tokio::sync::Mutex::new(()),
            refusals: Throttle::new(REFUSAL_LOG_EVERY),
            lost_voter: Throttle::new(REFUSAL_LOG_EVERY),
            has_data: std::sync::atomic::AtomicBool::new(false),
            held: Arc::new(Held {
                known: std::sync::Mutex::new(Known {
                    nodes,
                    dirty: false,
                    upgraded,
                }),
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
        self.learn(named).await;
        Ok(())
    }

    /// The voters named in a message of a replication stream
    /// (`RaftMessage.voters_with_data`; the stream's metadata was
    /// [`check`](Self::check)ed when it opened): refused as
    /// [`check`](Self::check) refuses, else taken as known to have held
    /// data.
    pub async fn check_named(&self, named: &[super::NodeId]) -> Result<(), Status> {
        if named.len() > MAX_VOTERS_NAMED {
            return Err(Status::invalid_argument(format!(
                "voters_with_data names more than {MAX_VOTERS_NAMED} nodes"
            )));
        }
        self.refuse_if_lost(named)?;
        self.learn(named.iter().copied()).await;
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
    pub async fn saw_data(&self, node: super::NodeId) {
        self.learn([node]).await;
    }

    /// Takes the nodes in `nodes` as known to have held data; any not
    /// recorded yet in the data directory are recorded (durably) before
    /// this returns. A failed recording is tried again at the next call.
    async fn learn(&self, nodes: impl IntoIterator<Item = super::NodeId>) {
        let dirty = {
            let mut known = self.held.known.lock().expect("held lock poisoned");
            let before = known.nodes.len();
            known.nodes.extend(nodes);
            known.dirty |= known.nodes.len() != before;
            known.dirty
        };
        if !dirty {
            return;
        }
        let _one = self.held.writing.lock().await;
        let nodes = {
            let mut known = self.held.known.lock().expect("held lock poisoned");
            if !known.dirty {
                return;
            }
            known.dirty = false;
            known.nodes.clone()
        };
        if let Err(e) = self.store.set_held_data(&nodes).await {
            tracing::warn!("cannot record which nodes have held data (tried again later): {e}");
            self.held.known.lock().expect("held lock poisoned").dirty = true;
        }
    }

    /// The voters of `membership` (this node's) that this node knows have
    /// held data, itself included when it is one (at most
    /// [`MAX_VOTERS_NAMED`]): what its RPCs name (see
    /// [`VOTERS_WITH_DATA_KEY`]).
    pub fn voters_with_data(&self, membership: &super::StoredMembership) -> Vec<super::NodeId> {
        let mut known = self.held.known.lock().expect("held lock poisoned");
        if known.upgraded {
            if let Some(at) = membership.log_id() {
                // The first membership read from an upgraded data
                // directory: the voters the builds before named (those of
                // a membership after the bootstrap one) held data as far
                // as they could tell. Recorded with the next name learned.
                known.upgraded = false;
                if at.index > 0 {
                    known.nodes.extend(membership.membership().voter_ids());
                    known.dirty = true;
                }
            }
        }
        membership
            .membership()
            .voter_ids()
            .filter(|v| *v == self.node || known.nodes.contains(v))
            .take(MAX_VOTERS_NAMED)
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
    /// The nodes, and whether the data directory has them all.
    known: std::sync::Mutex<Known>,
    /// Serializes their recording.
    writing: tokio::sync::Mutex<()>,
}

struct Known {
    /// The nodes.
    nodes: std::collections::BTreeSet<super::NodeId>,
    /// Some are not recorded in the data directory yet.
    dirty: bool,
    /// The data directory comes from a build that kept no record (it had
    /// a log or a vote, and no record, when this process started), and
    /// no membership has been seen yet.
    upgraded: bool,
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

    async fn node_2_on(disk: MemDisk) -> ClusterIdentity {
        let store = LogStore::in_memory(disk).expect("open");
        ClusterIdentity::open(2, store).await.expect("identity")
    }

    async fn empty_node_2() -> ClusterIdentity {
        node_2_on(MemDisk::new()).await
    }

    /// Issue 45, item 4: an empty node the cluster names a voter that has
    /// held data refuses, adopts nothing, and says how to bring it back.
    #[tokio::test]
    async fn an_empty_node_named_a_voter_with_data_refuses() {
        let identity = empty_node_2().await;
        for _ in 0..2 {
            let refused = identity.check(&rpc(Some("1,2,3"))).await.unwrap_err();
            assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
            assert!(
                refused.message().contains("raftlock members remove 2"),
                "{refused:?}"
            );
            assert_eq!(identity.id(), 0, "nothing adopted");
            assert_eq!(identity.store.cluster_id().unwrap(), None);
            let refused = identity.check_named(&[2]).await.unwrap_err();
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
        let identity = empty_node_2().await;
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
            let identity = empty_node_2().await;
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
            let identity = empty_node_2().await;
            let refused = identity.check(&rpc(Some(bad))).await.unwrap_err();
            assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{bad:?}");
            assert_eq!(identity.id(), 0, "{bad:?}");
        }
        let identity = empty_node_2().await;
        identity
            .check(&rpc(Some(&at_limit)))
            .await
            .expect("at the limit");
        let over: Vec<u64> = (0..=MAX_VOTERS_NAMED as u64).map(|i| i + 10).collect();
        let refused = identity.check_named(&over).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        identity
            .check_named(&over[..MAX_VOTERS_NAMED])
            .await
            .expect("at the limit");
    }

    /// A node that has voted or logged is not empty, whatever its cluster
    /// id (a data directory from before cluster ids).
    #[tokio::test]
    async fn a_node_with_a_vote_adopts_even_when_named() {
        let disk = MemDisk::new();
        let mut store = LogStore::in_memory(disk.clone()).expect("open");
        store.save_vote(&Vote::new(3, 1)).await.expect("vote");
        let identity = ClusterIdentity::open(2, store).await.expect("identity");
        identity.check(&rpc(Some("2"))).await.expect("adopted");
        assert_eq!(identity.id(), THEIRS);
        identity.check_named(&[2]).await.expect("not empty");
    }

    fn membership(index: u64, voters: &[u64], all: &[u64]) -> crate::raft::StoredMembership {
        use crate::raft::NodeAddrs;
        let nodes = all
            .iter()
            .map(|id| (*id, NodeAddrs::shared(format!("n{id}:1"))))
            .collect::<std::collections::BTreeMap<_, _>>();
        let voters = voters.iter().copied().collect();
        let m = openraft::Membership::new(vec![voters], nodes).expect("membership");
        crate::raft::StoredMembership::new(Some(crate::raft::log_id(2, 1, index)), m)
    }

    /// What a node names: the voters of its membership it has seen hold
    /// data or was told of (itself among them when a voter), learners
    /// and non-members never; what it learned is recorded before it acts
    /// on it, and survives a restart.
    #[tokio::test]
    async fn a_node_names_the_voters_it_knows_have_held_data() {
        let disk = MemDisk::new();
        let identity = node_2_on(disk.clone()).await;
        let m = membership(9, &[1, 2, 3], &[1, 2, 3, 4]);
        assert_eq!(identity.voters_with_data(&m), [2], "itself only");
        identity.saw_data(4).await;
        identity.saw_data(3).await;
        assert_eq!(identity.voters_with_data(&m), [2, 3], "4 is a learner");
        identity.check(&rpc(Some("1,4"))).await.expect("told");
        assert_eq!(identity.voters_with_data(&m), [1, 2, 3]);
        let promoted = membership(12, &[1, 2, 3, 4], &[1, 2, 3, 4]);
        assert_eq!(identity.voters_with_data(&promoted), [1, 2, 3, 4]);
        assert_eq!(identity.voters_with_data(&membership(14, &[1], &[1])), [1]);
        let store = LogStore::in_memory(disk.clone()).expect("open");
        assert_eq!(store.held_data().expect("read"), Some([1, 3, 4].into()));
        let again = node_2_on(disk).await;
        assert_eq!(again.voters_with_data(&promoted), [1, 2, 3, 4]);
        assert_eq!(ClusterIdentity::named_header(&[]), None);
        assert_eq!(ClusterIdentity::named_header(&[1, 3]).unwrap(), "1,3");
    }

    /// A recording that failed (a full disk) is made at the next name
    /// learned, known or not.
    #[tokio::test]
    async fn a_failed_recording_is_made_again() {
        let disk = MemDisk::new();
        let identity = node_2_on(disk.clone()).await;
        disk.fill();
        identity.saw_data(3).await;
        let read = || LogStore::in_memory(disk.clone()).expect("open").held_data();
        assert_eq!(read().expect("read"), Some([].into()), "not recorded");
        disk.heal();
        identity.saw_data(3).await;
        assert_eq!(read().expect("read"), Some([3].into()));
    }

    /// A data directory of a build before the record (a log or a vote, no
    /// record): the voters the builds before named, those of its first
    /// membership after the bootstrap one, are taken as having held data;
    /// with the bootstrap membership, none are (as before).
    #[tokio::test]
    async fn an_upgraded_data_directory_names_what_the_builds_before_did() {
        for (index, named) in [(7, vec![1, 2, 3]), (0, vec![2])] {
            let disk = MemDisk::new();
            let mut store = LogStore::in_memory(disk.clone()).expect("open");
            store.save_vote(&Vote::new(3, 1)).await.expect("vote");
            let identity = ClusterIdentity::open(2, store).await.expect("identity");
            let m = membership(index, &[1, 2, 3], &[1, 2, 3]);
            assert_eq!(identity.voters_with_data(&m), named, "index {index}");
            identity.saw_data(2).await;
            let held = LogStore::in_memory(disk).expect("open").held_data();
            let mut want: std::collections::BTreeSet<u64> = named.into_iter().collect();
            want.insert(2);
            assert_eq!(held.expect("read"), Some(want), "index {index}");
        }
        // A new data directory is recorded as such from the start: a
        // restart before anything was learned seeds nothing.
        let disk = MemDisk::new();
        let identity = node_2_on(disk.clone()).await;
        drop(identity);
        let mut store = LogStore::in_memory(disk.clone()).expect("open");
        store.save_vote(&Vote::new(3, 1)).await.expect("vote");
        let identity = ClusterIdentity::open(2, store).await.expect("identity");
        assert_eq!(
            identity.voters_with_data(&membership(7, &[1, 2, 3], &[1, 2, 3])),
            [2]
        );
    }
}
