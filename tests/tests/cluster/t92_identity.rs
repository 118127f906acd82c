//! Node and cluster identity on disk (review finding 12): a data directory
//! knows which node it belongs to and which cluster; another node id, or a
//! peer from another cluster, is refused.

use std::collections::BTreeMap;
use std::sync::Arc;

use raftlock_node::auth::Auth;
use raftlock_node::node::{Node, NodeOptions};
use raftlock_proto::v1 as pb;
use raftlock_proto::v1::raft_client::RaftClient;
use raftlock_testkit::{channel, test_timing, TestCluster};
use tokio::net::TcpListener;
use tonic::{Code, Request};

fn options(id: u64, addr: &str, dir: &std::path::Path, init: bool) -> NodeOptions {
    NodeOptions {
        id,
        advertise: addr.to_string(),
        peer_advertise: None,
        data_dir: dir.to_path_buf(),
        peers: BTreeMap::from([(id, raftlock_node::raft::NodeAddrs::shared(addr))]),
        init,
        timing: test_timing(),
        dial: BTreeMap::new(),
        tls: None,
        auth: Arc::new(Auth::new(None)),
        storage_faults: Default::default(),
        prefix_labels: Default::default(),
        connector: None,
        storage: Default::default(),
        join: Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_refuses_another_node_id() {
    let dir = tempfile::tempdir().expect("dir");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let node = Node::start(options(1, &addr, dir.path(), true), listener)
        .await
        .expect("node 1 starts");
    node.shutdown().await;

    let listener = TcpListener::bind(&addr).await.expect("bind again");
    let err = match Node::start(options(2, &addr, dir.path(), false), listener).await {
        Ok(node) => {
            node.shutdown().await;
            panic!("node 2 started on node 1's data directory");
        }
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("node 1") && err.contains("--id 2"),
        "the refusal names both ids: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_peer_from_another_cluster_is_refused() {
    let cluster = TestCluster::start(3).await;
    let leader = cluster.leader_addr().await;
    let mut raft = RaftClient::new(channel(&leader));
    let mut req = Request::new(pb::RaftMessage {
        data: vec![0; 64],
        error: Vec::new(),
        ..Default::default()
    });
    req.metadata_mut().insert(
        "raftlock-cluster-id",
        "0123456789abcdef".parse().expect("ascii"),
    );
    let status = raft.append_entries(req).await.expect_err("refused");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("cluster"), "{status:?}");
    // The cluster goes on.
    let client = cluster.client().await;
    let s = client
        .session(std::time::Duration::from_secs(10))
        .await
        .expect("session");
    s.lock("identity/x").await.expect("lock");
    cluster.shutdown().await;
}

/// A stopped node's directory opens again at once (openraft's tasks and
/// sled's threads let go of it; opening waits for sled's lock a moment).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_opens_again_as_soon_as_its_node_has_stopped() {
    let dir = tempfile::tempdir().expect("dir");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let node = Node::start(options(1, &addr, dir.path(), true), listener)
        .await
        .expect("node 1 starts");
    node.shutdown().await;
    for i in 0..10 {
        let listener = TcpListener::bind(&addr).await.expect("bind again");
        match Node::start(options(1, &addr, dir.path(), false), listener).await {
            Ok(node) => node.shutdown().await,
            Err(e) => panic!("round {i}: {e:#}"),
        }
    }
}
