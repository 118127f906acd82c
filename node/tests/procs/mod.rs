//! A cluster of real `raftlockd run` processes on loopback ports, for tests
//! that need what an in-process node cannot give: `kill -9` and a restart
//! within milliseconds (the sled lock and the port go with the process),
//! a process exit status.

#![allow(dead_code)] // each test binary uses a part

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use raftlock_proto::v1 as pb;
use raftlock_proto::v1::cluster_client::ClusterClient;
use raftlock_proto::v1::locks_client::LocksClient;
use tokio::process::{Child, Command};
use tonic::transport::{Channel, Endpoint};

/// A free loopback port (bound, then released for the node to take).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// Polls until `check` gives a value, or panics after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A lazily dialled channel to `addr`.
pub fn channel(addr: &str) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(10))
        .connect_lazy()
}

/// A raw `Locks` stub on `addr`.
pub fn locks(addr: &str) -> LocksClient<Channel> {
    LocksClient::new(channel(addr))
}

/// `Status` of the node at `addr`, if it answers.
pub async fn status(addr: &str) -> Option<pb::StatusResponse> {
    let mut c = ClusterClient::new(channel(addr));
    Some(c.status(pb::StatusRequest {}).await.ok()?.into_inner())
}

/// Real `raftlockd run` processes.
pub struct Procs {
    dir: tempfile::TempDir,
    addrs: BTreeMap<u64, String>,
    peers: String,
    children: BTreeMap<u64, Child>,
    /// Extra arguments for every node.
    extra: Vec<String>,
    /// Data directories other than the default under `dir`.
    dirs: BTreeMap<u64, PathBuf>,
}

impl Procs {
    /// Starts `n` nodes (node 1 bootstraps) with `extra` arguments each.
    pub fn start(n: u64, extra: &[&str]) -> Procs {
        Self::start_with_dirs(n, extra, BTreeMap::new())
    }

    /// Like [`start`](Self::start), with the data of the nodes in `dirs`
    /// there instead of in the cluster's temporary directory.
    pub fn start_with_dirs(n: u64, extra: &[&str], dirs: BTreeMap<u64, PathBuf>) -> Procs {
        let addrs: BTreeMap<u64, String> = (1..=n)
            .map(|id| (id, format!("127.0.0.1:{}", free_port())))
            .collect();
        let peers = addrs
            .iter()
            .map(|(id, a)| format!("{id}={a}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut procs = Procs {
            dir: tempfile::tempdir().expect("dir"),
            addrs,
            peers,
            children: BTreeMap::new(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            dirs,
        };
        for id in 1..=n {
            procs.spawn(id, id == 1);
        }
        procs
    }

    /// The data directory of node `id`.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        match self.dirs.get(&id) {
            Some(dir) => dir.clone(),
            None => self.dir.path().join(format!("node-{id}")),
        }
    }

    /// Where node `id`'s standard error goes.
    pub fn log(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node-{id}.log"))
    }

    /// The client address of node `id`.
    pub fn addr(&self, id: u64) -> String {
        self.addrs[&id].clone()
    }

    /// Starts node `id` from its data directory.
    pub fn spawn(&mut self, id: u64, init: bool) {
        let data_dir = self.data_dir(id);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log(id))
            .expect("log file");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_raftlockd"));
        cmd.arg("run")
            .arg("--id")
            .arg(id.to_string())
            .arg("--listen")
            .arg(&self.addrs[&id])
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--peers")
            .arg(&self.peers)
            .args(["--heartbeat-ms", "50"]);
        // Fast elections, unless the test sets its own timing.
        if !self
            .extra
            .iter()
            .any(|a| a.starts_with("--election-timeout"))
        {
            cmd.args(["--election-timeout-min-ms", "300"])
                .args(["--election-timeout-max-ms", "500"]);
        }
        cmd
            // Loopback only; these tests are not about peer authentication.
            .arg("--insecure-peers")
            .args(&self.extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true);
        if init {
            cmd.arg("--init");
        }
        self.children
            .insert(id, cmd.spawn().expect("raftlockd starts"));
    }

    /// `kill -9` node `id` and reap it.
    pub async fn kill(&mut self, id: u64) {
        let mut child = self.children.remove(&id).expect("running");
        child.start_kill().expect("SIGKILL");
        child.wait().await.expect("reaped");
    }

    /// Waits (up to `timeout`) for node `id` to exit on its own; its exit
    /// status, or `None` if it still runs.
    pub async fn exited(&mut self, id: u64, timeout: Duration) -> Option<std::process::ExitStatus> {
        let child = self.children.get_mut(&id).expect("started");
        let status = tokio::time::timeout(timeout, child.wait()).await.ok()?;
        self.children.remove(&id);
        Some(status.expect("wait"))
    }

    /// Waits until every running node names the same leader and that
    /// leader calls itself leader; returns its id.
    pub async fn leader(&self) -> u64 {
        let ids: Vec<u64> = self.children.keys().copied().collect();
        eventually(
            "a leader every running node agrees on",
            Duration::from_secs(30),
            || {
                let ids = ids.clone();
                async move {
                    let mut leader = None;
                    for id in &ids {
                        let s = status(&self.addrs[id]).await?;
                        if s.leader_id == 0 || leader.is_some_and(|l| l != s.leader_id) {
                            return None;
                        }
                        leader = Some(s.leader_id);
                    }
                    let l = leader?;
                    let s = status(self.addrs.get(&l)?).await?;
                    (s.role == "leader").then_some(l)
                }
            },
        )
        .await
    }

    /// Node `id`'s standard error so far.
    pub fn read_log(&self, id: u64) -> String {
        std::fs::read_to_string(self.log(id)).unwrap_or_default()
    }
}
