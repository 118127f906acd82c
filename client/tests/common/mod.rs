//! A small in-process 3-node cluster for the client's own tests (the full
//! `TestCluster` lives in the `raftlock-tests` crate).

use std::collections::BTreeMap;
use std::time::Duration;

use raftlock_node::node::{Node, NodeOptions, RaftTiming};
use tokio::net::TcpListener;

pub struct Cluster {
    _dir: tempfile::TempDir,
    pub nodes: Vec<Node>,
    pub addrs: Vec<String>,
}

impl Cluster {
    pub async fn start() -> Cluster {
        Self::start_with_acl(None).await
    }

    /// Like `start`, with access control on (`acl`: the ACL file's text).
    pub async fn start_with_acl(acl: Option<&str>) -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut listeners = Vec::new();
        let mut peers = BTreeMap::new();
        for id in 1..=3u64 {
            let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            peers.insert(id, l.local_addr().expect("addr").to_string());
            listeners.push((id, l));
        }
        let mut nodes = Vec::new();
        for (id, l) in listeners.into_iter().rev() {
            let opts = NodeOptions {
                id,
                advertise: peers[&id].clone(),
                peer_advertise: None,
                data_dir: dir.path().join(format!("node-{id}")),
                peers: peers
                    .iter()
                    .map(|(id, addr)| (*id, raftlock_node::raft::NodeAddrs::shared(addr.clone())))
                    .collect(),
                init: id == 1,
                timing: RaftTiming::default(),
                dial: BTreeMap::new(),
                tls: None,
                auth: std::sync::Arc::new(raftlock_node::auth::Auth::new(
                    acl.map(|text| raftlock_node::auth::Acl::parse(text).expect("valid ACL")),
                )),
            };
            nodes.push(Node::start(opts, l).await.expect("node starts"));
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let leader = nodes[0].raft.metrics().borrow().current_leader;
            if let Some(l) = leader {
                let n = nodes.iter().find(|n| n.id == l).expect("leader is a node");
                if n.shared.leases.is_active() {
                    break;
                }
            }
            assert!(tokio::time::Instant::now() < deadline, "no leader");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Cluster {
            _dir: dir,
            nodes,
            addrs: peers.into_values().collect(),
        }
    }

    pub fn endpoints(&self) -> String {
        self.addrs.join(",")
    }

    pub async fn shutdown(self) {
        for n in self.nodes {
            n.shutdown().await;
        }
    }
}
