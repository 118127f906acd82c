//! [`TestCluster`]: nodes in this process, on loopback ports the OS picked.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use raftlock_client::proto::cluster_client::ClusterClient;
use raftlock_client::proto::locks_client::LocksClient;
use raftlock_client::proto::{StatusRequest, StatusResponse};
use raftlock_client::{Client, ClientOptions};
use raftlock_node::node::{Node, NodeOptions, RaftTiming};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use crate::proxy::Net;
use raftlock_node::raft::WatchReceiver as _;

pub mod certs;

/// Default deadline for `wait_*` helpers.
pub const WAIT: Duration = Duration::from_secs(20);

/// Raft timing for tests: the production defaults, except snapshots are
/// taken often enough that tests exercise them.
pub fn test_timing() -> RaftTiming {
    RaftTiming {
        snapshot_every: 500,
        ..RaftTiming::default()
    }
}

/// A cluster of in-process nodes.
pub struct TestCluster {
    /// TLS of every node, if any.
    tls: Option<raftlock_node::tls::TlsOptions>,
    /// ACL file text of every node, if access control is on.
    acl: Option<String>,
    dir: tempfile::TempDir,
    nodes: BTreeMap<u64, Node>,
    addrs: BTreeMap<u64, String>,
    timing: RaftTiming,
    /// The proxies every node-to-node link goes through, if the cluster
    /// was started partitionable.
    net: Option<Net>,
    /// Each node's storage fault switch (kept across restarts).
    faults: std::sync::Mutex<BTreeMap<u64, raftlock_node::raft::log_store::StorageFaults>>,
    /// Each node's access control, as its last start got it (for
    /// [`reload_acl`](Self::reload_acl)).
    auths: std::sync::Mutex<BTreeMap<u64, std::sync::Arc<raftlock_node::auth::Auth>>>,
    /// Each node's metrics address (`GET /metrics`, `/livez`, `/readyz`),
    /// a new port at every start.
    metrics: BTreeMap<u64, String>,
}

/// A metrics listener on a loopback port the OS picks.
async fn metrics_listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback")
}

/// One HTTP/1.0 `method path` to `addr` (with `headers`): the status code
/// and the body; `None` if nothing answers.
pub async fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut conn = tokio::net::TcpStream::connect(addr).await.ok()?;
        let mut req = format!("{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: 0\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        conn.write_all(req.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        conn.read_to_end(&mut raw).await.ok()?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let code = text.split(' ').nth(1)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n")?.1.to_string();
        Some((code, body))
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

/// Polls `check` until it returns `Some`, or panics with `what` after
/// `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs a leadership transfer until the leader stops refusing it because it
/// "has not heard from" the target lately (its documented
/// FAILED_PRECONDITION): on a loaded machine a heartbeat can be late by more
/// than the second the leader allows. Gives up after 30 s and returns the
/// last answer; any other answer is returned at once.
pub async fn transfer_when_heard<T, E, F, Fut>(mut attempt: F) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match attempt().await {
            Err(e) if e.to_string().contains("has not heard from") && Instant::now() < deadline => {
                println!("transfer refused for now: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return other,
        }
    }
}

/// A channel to the node at `addr` (dialled lazily, so a stopped node only
/// fails the calls made on it).
pub fn channel(addr: &str) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("valid endpoint")
        .connect_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(10))
        .connect_lazy()
}

/// A raw `Locks` stub on the node at `addr`: no leader discovery, no
/// retries, so tests see exactly what that node answers.
pub fn locks_at(addr: &str) -> LocksClient<Channel> {
    LocksClient::new(channel(addr))
}

/// A raw `Cluster` stub on the node at `addr`.
pub fn cluster_at(addr: &str) -> ClusterClient<Channel> {
    ClusterClient::new(channel(addr))
}

/// The `Status` of the node at `addr` (its local view, no leader round).
pub async fn status_at(addr: &str) -> StatusResponse {
    cluster_at(addr)
        .status(StatusRequest {})
        .await
        .expect("status answers")
        .into_inner()
}

fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_test_writer()
        .try_init();
}

impl TestCluster {
    /// Starts `n` nodes (ids 1..=n), bootstraps them as one cluster and
    /// waits for a leader.
    pub async fn start(n: u64) -> TestCluster {
        Self::start_with(n, test_timing()).await
    }

    /// Like [`start`](Self::start) with the given timing.
    pub async fn start_with(n: u64, timing: RaftTiming) -> TestCluster {
        Self::start_full(n, timing, None).await
    }

    /// Like [`start`](Self::start), every node serving clients and peers
    /// over TLS.
    pub async fn start_tls(n: u64, tls: raftlock_node::tls::TlsOptions) -> TestCluster {
        Self::start_full(n, test_timing(), Some(tls)).await
    }

    /// Like [`start`](Self::start), with a backup placed in node 1's data
    /// directory first, as `raftlockd restore` does.
    pub async fn start_seeded(n: u64, backup: &[u8]) -> TestCluster {
        Self::start_inner(n, test_timing(), None, Some(backup), None, false).await
    }

    /// Like [`start_seeded`](Self::start_seeded), every link between two
    /// nodes going through a proxy as in
    /// [`start_partitionable`](Self::start_partitionable).
    pub async fn start_seeded_partitionable(n: u64, backup: &[u8]) -> TestCluster {
        Self::start_inner(n, test_timing(), None, Some(backup), None, true).await
    }

    /// Like [`start`](Self::start), with every link between two nodes
    /// going through a TCP proxy (one per direction), so the test can
    /// [`partition`](Self::partition), [`isolate`](Self::isolate) and
    /// [`heal`](Self::heal). (Links from the first nodes to one added later
    /// with [`spawn_new_node`](Self::spawn_new_node) are direct.)
    pub async fn start_partitionable(n: u64) -> TestCluster {
        Self::start_partitionable_with(n, test_timing()).await
    }

    /// Like [`start_partitionable`](Self::start_partitionable) with the
    /// given timing.
    pub async fn start_partitionable_with(n: u64, timing: RaftTiming) -> TestCluster {
        Self::start_inner(n, timing, None, None, None, true).await
    }

    /// Like [`start`](Self::start), every node with access control on
    /// (`acl` is the ACL file's text) and optionally TLS.
    pub async fn start_acl(
        n: u64,
        acl: &str,
        tls: Option<raftlock_node::tls::TlsOptions>,
    ) -> TestCluster {
        Self::start_inner(n, test_timing(), tls, None, Some(acl.to_string()), false).await
    }

    async fn start_full(
        n: u64,
        timing: RaftTiming,
        tls: Option<raftlock_node::tls::TlsOptions>,
    ) -> TestCluster {
        Self::start_inner(n, timing, tls, None, None, false).await
    }

    async fn start_inner(
        n: u64,
        timing: RaftTiming,
        tls: Option<raftlock_node::tls::TlsOptions>,
        seed: Option<&[u8]>,
        acl: Option<String>,
        partitionable: bool,
    ) -> TestCluster {
        init_logs();
        let dir = tempfile::tempdir().expect("temp dir");
        if let Some(bytes) = seed {
            let node1 = dir.path().join("node-1");
            std::fs::create_dir_all(&node1).expect("data dir");
            std::fs::write(node1.join(raftlock_node::node::RESTORE_FILE), bytes).expect("seed");
        }
        let mut listeners = Vec::new();
        let mut addrs = BTreeMap::new();
        for id in 1..=n {
            let l = TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind loopback");
            addrs.insert(id, l.local_addr().expect("addr").to_string());
            listeners.push((id, l));
        }
        let mut cluster = TestCluster {
            tls,
            acl,
            dir,
            nodes: BTreeMap::new(),
            addrs: addrs.clone(),
            timing,
            net: partitionable.then(Net::new),
            faults: Default::default(),
            auths: Default::default(),
            metrics: BTreeMap::new(),
        };
        cluster.add_proxies().await;
        // Node 1 bootstraps last, so its peers are listening when it
        // campaigns.
        for (id, listener) in listeners.into_iter().rev() {
            cluster
                .start_node(id, listener, id == 1, addrs.clone())
                .await;
        }
        cluster.wait_for_leader().await;
        cluster
    }

    /// Node `id`'s storage fault switch: turn it to make its log's syncs
    /// fail (as a failing disk would); it applies to the node as it runs
    /// and to every restart of it until healed.
    pub fn storage_faults(&self, id: u64) -> raftlock_node::raft::log_store::StorageFaults {
        self.faults
            .lock()
            .expect("faults lock poisoned")
            .entry(id)
            .or_default()
            .clone()
    }

    /// Node `id`'s data directory.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node-{id}"))
    }

    /// Replaces node `id`'s ACL with the file text `acl`, as `SIGHUP` does
    /// for `raftlockd run`; later restarts of any node start with it too.
    pub fn reload_acl(&mut self, id: u64, acl: &str) {
        let parsed = raftlock_node::auth::Acl::parse(acl).expect("a valid test ACL");
        self.auths.lock().expect("auths lock poisoned")[&id]
            .replace(parsed)
            .expect("access control is on");
        self.acl = Some(acl.to_string());
    }

    fn options(&self, id: u64, init: bool, peers: BTreeMap<u64, String>) -> NodeOptions {
        let auth =
            std::sync::Arc::new(raftlock_node::auth::Auth::new(self.acl.as_deref().map(
                |text| raftlock_node::auth::Acl::parse(text).expect("a valid test ACL"),
            )));
        self.auths
            .lock()
            .expect("auths lock poisoned")
            .insert(id, auth.clone());
        NodeOptions {
            id,
            advertise: self.addrs[&id].clone(),
            peer_advertise: None,
            data_dir: self.data_dir(id),
            peers: peers
                .into_iter()
                .map(|(id, addr)| (id, raftlock_node::raft::NodeAddrs::shared(addr)))
                .collect(),
            init,
            timing: self.timing.clone(),
            // Through the proxies, if any.
            dial: self
                .addrs
                .keys()
                .filter_map(|&to| {
                    let proxy = self.net.as_ref()?.proxy_addr(id, to)?;
                    Some((to, proxy.to_string()))
                })
                .collect(),
            tls: self.tls.clone(),
            auth,
            storage_faults: self.storage_faults(id),
            prefix_labels: Default::default(),
            connector: None,
            storage: Default::default(),
            join: Vec::new(),
        }
    }

    async fn start_node(
        &mut self,
        id: u64,
        listener: TcpListener,
        init: bool,
        peers: BTreeMap<u64, String>,
    ) {
        let metrics = metrics_listener().await;
        self.metrics
            .insert(id, metrics.local_addr().expect("addr").to_string());
        let node = Node::start_with_metrics(self.options(id, init, peers), listener, Some(metrics))
            .await
            .expect("node starts");
        self.nodes.insert(id, node);
    }

    /// The metrics address of node `id` (its latest start): `GET /metrics`,
    /// `/livez`, `/readyz`.
    pub fn metrics_addr(&self, id: u64) -> String {
        self.metrics[&id].clone()
    }

    /// Addresses of all nodes, running or not.
    pub fn addrs(&self) -> Vec<String> {
        self.addrs.values().cloned().collect()
    }

    /// The address of node `id`.
    pub fn addr(&self, id: u64) -> String {
        self.addrs[&id].clone()
    }

    /// Ids of running nodes.
    pub fn running(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    /// The running node `id`.
    pub fn node(&self, id: u64) -> &Node {
        &self.nodes[&id]
    }

    /// A client that knows every node's address.
    pub async fn client(&self) -> Client {
        Client::with_options(
            self.addrs(),
            ClientOptions {
                retry_deadline: Duration::from_secs(20),
                ..ClientOptions::default()
            },
        )
        .expect("client")
    }

    /// Waits until the running nodes agree on a running leader that is a
    /// working leader (caught up, counting leases); returns it.
    pub async fn wait_for_leader(&self) -> u64 {
        eventually("a leader all running nodes agree on", WAIT, || async {
            let mut leader = None;
            for node in self.nodes.values() {
                let l = node.leadership.view().leader?;
                if leader.is_some_and(|x| x != l) || !self.nodes.contains_key(&l) {
                    return None;
                }
                leader = Some(l);
            }
            let l = leader?;
            self.nodes[&l]
                .leadership
                .view()
                .working_leader()
                .then_some(l)
        })
        .await
    }

    /// The current leader (waits for one).
    pub async fn leader(&self) -> u64 {
        self.wait_for_leader().await
    }

    /// The current leader and a running node that is not it (waits for a
    /// leader; panics if no other node runs).
    pub async fn leader_and_follower(&self) -> (u64, u64) {
        let leader = self.wait_for_leader().await;
        let follower = self
            .running()
            .into_iter()
            .find(|id| *id != leader)
            .expect("a running node other than the leader");
        (leader, follower)
    }

    /// The address of the current leader (waits for one).
    pub async fn leader_addr(&self) -> String {
        let id = self.wait_for_leader().await;
        self.addr(id)
    }

    /// The applied index of running node `id`.
    pub fn applied(&self, id: u64) -> u64 {
        self.nodes[&id]
            .raft
            .metrics()
            .borrow_watched()
            .last_applied
            .map_or(0, |l| l.index)
    }

    /// Kills node `id` abruptly: its connections drop mid-flight.
    pub async fn kill(&mut self, id: u64) {
        let node = self.nodes.remove(&id).expect("node is running");
        node.kill().await;
    }

    /// Stops node `id` cleanly.
    pub async fn stop(&mut self, id: u64) {
        let node = self.nodes.remove(&id).expect("node is running");
        node.shutdown().await;
    }

    /// Restarts a stopped or killed node from its data directory, on its
    /// old address.
    pub async fn restart(&mut self, id: u64) {
        assert!(!self.nodes.contains_key(&id), "node {id} is running");
        let addr = self.addrs[&id].clone();
        let opts = self.options(id, false, BTreeMap::new());
        // The old socket may linger briefly, and so may the old incarnation's
        // lock on its sled database: `kill`/`shutdown` return before every
        // background task holding it has ended (openraft, for one, detaches
        // its replication tasks, which keep a log reader). Retry until both
        // are free; any other start-up error fails at once.
        let node = eventually(
            &format!("node {id} to start again on its port and data"),
            WAIT,
            || {
                let (addr, opts) = (addr.clone(), opts.clone());
                async move {
                    let listener = TcpListener::bind(&addr).await.ok()?;
                    let metrics = metrics_listener().await;
                    let metrics_addr = metrics.local_addr().expect("addr").to_string();
                    match Node::start_with_metrics(opts, listener, Some(metrics)).await {
                        Ok(node) => Some((node, metrics_addr)),
                        // The old incarnation's lock outlived the wait
                        // open_db allows (a busy machine): try again.
                        Err(e)
                            if format!("{e:#}").contains("could not acquire lock")
                                || format!("{e:#}").contains("in use by another process") =>
                        {
                            None
                        }
                        Err(e) => panic!("node {id} fails to restart: {e:#}"),
                    }
                }
            },
        )
        .await;
        let (node, metrics_addr) = node;
        self.metrics.insert(id, metrics_addr);
        self.nodes.insert(id, node);
    }

    /// Starts a new, empty node (not yet a member) and returns its id and
    /// address; add it with the client's `add_node`.
    pub async fn spawn_new_node(&mut self) -> (u64, String) {
        let id = self.addrs.keys().max().copied().unwrap_or(0) + 1;
        let l = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = l.local_addr().expect("addr").to_string();
        self.addrs.insert(id, addr.clone());
        self.add_proxies().await;
        self.start_node(id, l, false, BTreeMap::new()).await;
        (id, addr)
    }

    /// Starts the proxies of links between known nodes that have none yet
    /// (a partitionable cluster only).
    async fn add_proxies(&mut self) {
        let Some(net) = self.net.as_mut() else {
            return;
        };
        for &from in self.addrs.keys() {
            for (&to, target) in &self.addrs {
                if from != to && net.proxy_addr(from, to).is_none() {
                    net.add_proxy(from, to, target.clone())
                        .await
                        .expect("start a link proxy");
                }
            }
        }
    }

    fn net(&self) -> &Net {
        self.net
            .as_ref()
            .expect("partitions need TestCluster::start_partitionable")
    }

    /// Splits the nodes into `groups`: nothing passes between two groups,
    /// in either direction, until [`heal`](Self::heal). A node in no group
    /// is cut off from every group. Held-back bytes are delivered on heal,
    /// as TCP would retransmit them.
    pub fn partition(&self, groups: &[&[u64]]) {
        let group_of = |id: u64| groups.iter().position(|g| g.contains(&id));
        let mut links = Vec::new();
        for &from in self.addrs.keys() {
            for &to in self.addrs.keys() {
                let apart = match (group_of(from), group_of(to)) {
                    (Some(a), Some(b)) => a != b,
                    _ => true,
                };
                if from != to && apart {
                    links.push((from, to));
                }
            }
        }
        self.net().cut(&links, false);
    }

    /// Cuts these directions only (bytes node `.0` sends to node `.1`),
    /// until [`heal`](Self::heal): one-way partitions.
    pub fn cut(&self, links: &[(u64, u64)]) {
        self.net().cut(links, false);
    }

    /// Cuts node `id` off from every other node (both directions).
    pub fn isolate(&self, id: u64) {
        let rest: Vec<u64> = self.addrs.keys().copied().filter(|&n| n != id).collect();
        self.partition(&[&[id], &rest]);
    }

    /// Ends every partition.
    pub fn heal(&self) {
        self.net().heal();
    }

    /// Waits until node `id` has applied at least `index`.
    pub async fn wait_applied(&self, id: u64, index: u64) {
        let raft = self.nodes[&id].raft.clone();
        eventually(&format!("node {id} to apply index {index}"), WAIT, || {
            let raft = raft.clone();
            async move {
                (raft
                    .metrics()
                    .borrow_watched()
                    .last_applied
                    .map_or(0, |l| l.index)
                    >= index)
                    .then_some(())
            }
        })
        .await;
    }

    /// The highest applied index among running nodes.
    pub fn max_applied(&self) -> u64 {
        self.nodes
            .values()
            .map(|n| {
                n.raft
                    .metrics()
                    .borrow_watched()
                    .last_applied
                    .map_or(0, |l| l.index)
            })
            .max()
            .unwrap_or(0)
    }

    /// Stops every node cleanly.
    pub async fn shutdown(mut self) {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        for id in ids {
            self.stop(id).await;
        }
    }
}
