//! Messages no protocol-following peer sends, to a cluster without peer
//! authentication (`--insecure-peers`): each is refused with
//! `INVALID_ARGUMENT` before openraft sees it, and no node's Raft core
//! stops (review finding 5: one 56-byte `InstallSnapshot` whose snapshot
//! is beyond its vote tripped an openraft assertion and left a zombie).

use std::time::Duration;

use raftlock_node::raft::{log_id, SnapshotMeta, StoredMembership, Vote};
use raftlock_proto::v1 as pb;
use raftlock_proto::v1::raft_client::RaftClient;
use raftlock_testkit::{channel, eventually, TestCluster};
use tonic::Code;

/// Sends one `InstallSnapshot` stream: the head message, then `data`.
async fn install_snapshot(addr: &str, head: Vec<u8>, data: Vec<u8>) -> Result<(), tonic::Status> {
    let mut msgs = vec![pb::RaftMessage {
        data: head,
        error: Vec::new(),
    }];
    if !data.is_empty() {
        msgs.push(pb::RaftMessage {
            data,
            error: Vec::new(),
        });
    }
    RaftClient::new(channel(addr))
        .install_snapshot(futures::stream::iter(msgs))
        .await
        .map(drop)
}

/// Every node still replicates: a write commits and every node applies
/// it, and none reports a stopped core.
pub async fn still_replicates(cluster: &TestCluster, name: &str) {
    for id in cluster.running() {
        assert_eq!(
            cluster.node(id).leadership.view().fatal,
            None,
            "node {id}'s Raft core stopped"
        );
    }
    let client = cluster.client().await;
    let session = client
        .session(Duration::from_secs(30))
        .await
        .expect("session");
    let guard = session.lock(name).await.expect("a write commits");
    guard.release().await.expect("release");
    let index = cluster.max_applied();
    for id in cluster.running() {
        cluster.wait_applied(id, index).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snapshot_beyond_its_vote_is_refused_and_the_node_lives() {
    let cluster = TestCluster::start(3).await;
    let leader = cluster.leader().await;
    let target = cluster
        .running()
        .into_iter()
        .find(|id| *id != leader)
        .expect("a follower");
    // The review's message: a committed vote of term 1000 for node 1, and a
    // snapshot whose last log id is of term 2000.
    let vote = Vote::new_committed(1000, 1);
    let meta = SnapshotMeta {
        last_log_id: Some(log_id(2000, 1, 5)),
        last_membership: StoredMembership::default(),
    };
    let head = bincode::serialize(&(vote, meta)).expect("encode");
    let refused = install_snapshot(&cluster.addr(target), head, Vec::new())
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    eventually("the cluster to settle", Duration::from_secs(20), || async {
        Some(cluster.leader().await)
    })
    .await;
    still_replicates(&cluster, "hostile/after-snapshot").await;
    cluster.shutdown().await;
}
