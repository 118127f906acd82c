//! Control of real `raftlockd` processes on 127.0.0.1: start, SIGKILL,
//! SIGSTOP/SIGCONT, restart from the data directory, wipe, and (under
//! libfaketime) clock rates.
//!
//! Every process the harness starts is registered here and killed when the
//! [`Cluster`] is dropped, whatever way the run ends; the children also get
//! `PR_SET_PDEATHSIG`, so they die if the harness itself is killed.
//!
//! Each process has a reaper task that owns it, waits for it to end and
//! signals it on the cluster's behalf (so a signal never reaches a reused
//! pid). A process that ends without the harness having stopped it is
//! reported on [`Hooks::exits`] with its exit status and the last line of
//! its log: the run's supervisor records it and starts the node again, as
//! systemd's `Restart=on-failure` would.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use raftlock_client::{Client, ClientOptions};

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::proxy::{Link, Net};
pub use logs::{last_log_line, removal_line, REMOVED_TEXT};
use process::{NodeProc, Running};

mod faults;
mod logs;
mod process;
#[cfg(test)]
mod tests;

/// Where Debian's `libfaketime` package puts the library.
pub const LIBFAKETIME_PATHS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
];

/// Finds libfaketime, or says how to install it.
pub fn find_libfaketime() -> anyhow::Result<PathBuf> {
    let explicit = std::env::var("RAFTLOCK_JEPSEN_LIBFAKETIME")
        .ok()
        .filter(|p| !p.is_empty());
    let candidates: Vec<PathBuf> = match explicit {
        Some(p) => vec![PathBuf::from(p)],
        None => LIBFAKETIME_PATHS.iter().map(PathBuf::from).collect(),
    };
    candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        anyhow::anyhow!(
            "the clock nemesis needs libfaketime, which is not installed \
                 (looked in {LIBFAKETIME_PATHS:?} or $RAFTLOCK_JEPSEN_LIBFAKETIME). \
                 Install it with:\n\n    \
                 apt-get update && apt-get install -y faketime\n\n\
                 or set RAFTLOCK_JEPSEN_LIBFAKETIME to libfaketime.so.1, or run without `clock`."
        )
    })
}

/// Finds the `raftlockd` binary: `explicit` if given, else next to this
/// executable.
pub fn find_raftlockd(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => {
            let exe = std::env::current_exe().context("cannot locate the harness executable")?;
            exe.parent()
                .map(|d| d.join("raftlockd"))
                .context("the harness executable has no parent directory")?
        }
    };
    anyhow::ensure!(
        path.is_file(),
        "raftlockd not found at {}: build it with `cargo build -p raftlock-node --bin raftlockd` \
         (use the same profile as the harness, e.g. add --release for a release harness), \
         or pass --raftlockd PATH",
        path.display()
    );
    Ok(path)
}

/// Whether `raftlockd run` takes `flag` (older builds lack some, e.g.
/// `--insecure-peers`, which the harness then leaves out).
pub fn raftlockd_has_flag(raftlockd: &Path, flag: &str) -> bool {
    std::process::Command::new(raftlockd)
        .args(["run", "--help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(flag))
        .unwrap_or(false)
}

/// Loopback ports for `n` nodes of one cluster, each held by a listener
/// until its node is about to start. Holding them all at once keeps the
/// proxies, which bind port 0 while the nodes are still down, off the
/// nodes' ports; taking them from `raftlock_testkit::ports` (below the
/// ephemeral range, reserved for this process) keeps the ports distinct
/// and keeps every other process's connections and servers off them
/// between a listener's release and its node's bind.
fn cluster_ports(n: usize) -> anyhow::Result<Vec<std::net::TcpListener>> {
    Ok((0..n)
        .map(|_| raftlock_testkit::ports::listener())
        .collect())
}

/// Settings for the whole cluster.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// The `raftlockd` binary.
    pub raftlockd: PathBuf,
    /// Run directory; node N keeps its data in `DIR/n{N}/data` and logs to
    /// `DIR/n{N}/raftlockd.log`.
    pub dir: PathBuf,
    /// Initial voters: ids `1..=nodes`.
    pub nodes: u64,
    /// Extra ids started empty (not members) for the membership nemesis.
    pub spares: u64,
    /// libfaketime, when the clock nemesis runs.
    pub libfaketime: Option<PathBuf>,
    /// Put each node's data directory on the disk-fault layer
    /// ([`crate::lazyfs`]), for the lose-unsynced, slow-disk and
    /// disk-error nemeses.
    pub disk_faults: bool,
    /// Peer authentication: the ACL file every node gets (with a
    /// `peer_token`) and the client token of the harness and its workers.
    /// Without it nodes run with `--insecure-peers` (when the binary has
    /// that flag).
    pub acl: Option<Acl>,
    /// The binary has `--insecure-peers` (builds before peer
    /// authentication by default do not).
    pub insecure_peers_flag: bool,
    /// Where the cluster reports on its processes.
    pub hooks: Hooks,
    /// Each node in a network namespace of its own, partitions as packet
    /// drops ([`crate::netns`]) instead of proxies.
    pub netns: bool,
}

/// Access control for a run with peer authentication.
#[derive(Clone, Debug)]
pub struct Acl {
    /// The ACL file (`peer_token`, a client token with every permission).
    pub file: PathBuf,
    /// The client token.
    pub token: String,
}

impl Acl {
    /// Writes an ACL file into `dir`: a random peer token, and `token`
    /// (random too) allowed everything.
    pub fn write(dir: &Path) -> anyhow::Result<Acl> {
        let peer: String = format!("{:032x}", rand::random::<u128>());
        let token: String = format!("jepsen-{:032x}", rand::random::<u128>());
        let file = dir.join("acl.toml");
        std::fs::write(
            &file,
            format!(
                "peer_token = \"{peer}\"\n\n[[token]]\nidentity = \"jepsen\"\ntoken = \"{token}\"\n\n\
                 [[rule]]\nidentity = \"jepsen\"\nallow = \"admin\"\n"
            ),
        )?;
        Ok(Acl { file, token })
    }
}

/// How a node process ended.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ExitReport {
    /// The run (or restored cluster) directory of its cluster.
    pub cluster_dir: PathBuf,
    /// The node.
    pub node: u64,
    /// Its pid.
    pub pid: u32,
    /// Exit status, if it exited.
    pub code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// The harness stopped it (a kill fault, a clock restart, the end of
    /// the run): not an exit of its own.
    pub by_harness: bool,
    /// The last line of its log, which for an exit of its own names the
    /// cause (`FATAL: ...`).
    pub last_log_line: String,
    /// For an exit with status 0: the line in which the node said it was
    /// removed from the cluster (see [`removal_line`]).
    pub removed: Option<String>,
}

/// A node as the samplers see it, without taking the cluster's lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RosterEntry {
    /// Node id.
    pub id: u64,
    /// Client address.
    pub addr: String,
    /// A process is running (possibly paused).
    pub alive: bool,
    /// Stopped with SIGSTOP.
    pub paused: bool,
}

/// Every node of the current cluster (changes when a restore replaces it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Roster {
    /// The cluster's directory (the run's, or a restored cluster's).
    pub dir: PathBuf,
    /// Its nodes.
    pub nodes: Vec<RosterEntry>,
}

/// Channels the cluster reports on, shared with a restored cluster that
/// replaces it.
#[derive(Clone, Debug)]
pub struct Hooks {
    /// Every process end, if someone listens.
    pub exits: Option<mpsc::UnboundedSender<ExitReport>>,
    /// The current roster.
    pub roster: Arc<watch::Sender<Roster>>,
}

impl Default for Hooks {
    fn default() -> Self {
        Hooks {
            exits: None,
            roster: Arc::new(watch::channel(Roster::default()).0),
        }
    }
}

/// The nodes of one run and the proxies between them.
pub struct Cluster {
    opts: ClusterOptions,
    nodes: BTreeMap<u64, NodeProc>,
    /// Node-to-node proxies (none with network namespaces).
    net: Net,
    /// The nodes' network namespaces, with `--net netns`. Declared after
    /// `nodes`: the processes are killed (in `Drop`) before their
    /// namespaces go.
    netns: Option<crate::netns::Netns>,
    admin: Client,
}

impl Cluster {
    /// Creates directories and proxies and starts every node (initial
    /// voters and spares); node 1 bootstraps. Waits for a leader.
    pub async fn start(opts: ClusterOptions) -> anyhow::Result<Cluster> {
        let ids: Vec<u64> = (1..=opts.nodes + opts.spares).collect();
        let netns = if opts.netns {
            Some(crate::netns::Netns::create(&ids)?)
        } else {
            None
        };
        // Loopback ports are held until their node starts; a node in a
        // namespace has an address (and every port) of its own.
        let mut reserved = if netns.is_some() {
            Vec::new()
        } else {
            cluster_ports(ids.len())?
        }
        .into_iter();
        let mut nodes = BTreeMap::new();
        for &id in &ids {
            let dir = opts.dir.join(format!("n{id}"));
            std::fs::create_dir_all(&dir)?;
            let disk = if opts.disk_faults {
                Some(crate::lazyfs::mount(&dir.join("disk"), &dir.join("data"))?)
            } else {
                None
            };
            let (addr, reserved) = match &netns {
                Some(ns) => (ns.addr(id), None),
                None => {
                    let r = reserved.next().expect("one port per node");
                    (r.local_addr()?.to_string(), Some(r))
                }
            };
            nodes.insert(
                id,
                NodeProc {
                    addr,
                    reserved,
                    dir,
                    proc: None,
                    paused: false,
                    held_down: false,
                    started: false,
                    rate: 1.0,
                    disk,
                },
            );
        }
        let mut net = Net::new();
        if netns.is_none() {
            for &from in &ids {
                for &to in &ids {
                    if from != to {
                        net.add_proxy(from, to, nodes[&to].addr.clone()).await?;
                    }
                }
            }
        }
        let admin = Client::with_options(
            nodes.values().map(|n| n.addr.clone()).collect::<Vec<_>>(),
            ClientOptions {
                request_timeout: Duration::from_millis(800),
                retry_deadline: Duration::from_secs(3),
                token: opts.acl.as_ref().map(|a| a.token.clone()),
                ..ClientOptions::default()
            },
        )?;
        let mut cluster = Cluster {
            opts,
            nodes,
            net,
            netns,
            admin,
        };
        // Node 1 bootstraps last, so the others are listening when it
        // campaigns.
        for &id in ids.iter().rev() {
            cluster.spawn(id)?;
        }
        for &id in &ids {
            cluster.wait_serving(id, Duration::from_secs(30)).await?;
        }
        cluster
            .wait_for_leader(Duration::from_secs(30))
            .await
            .context("no leader elected after start")?;
        Ok(cluster)
    }

    /// Every node id, voters and spares.
    pub fn ids(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    /// The initial voters.
    pub fn initial_ids(&self) -> Vec<u64> {
        (1..=self.opts.nodes).collect()
    }

    /// Client addresses of the initial voters (clients follow leader hints
    /// to any other).
    pub fn client_endpoints(&self) -> Vec<String> {
        self.nodes.values().map(|n| n.addr.clone()).collect()
    }

    /// Cuts these directions between nodes: proxies hold (and with
    /// `reset`, reset) them; in namespaces their packets are dropped
    /// (`reset` does not apply: nothing is reset, TCP retransmits).
    pub fn cut(&self, links: &[Link], reset: bool) -> anyhow::Result<()> {
        match &self.netns {
            Some(ns) => ns.cut(links),
            None => {
                self.net.cut(links, reset);
                Ok(())
            }
        }
    }

    /// Heals every link between nodes (and, in namespaces, between the
    /// clients and the nodes).
    pub fn heal_links(&self) -> anyhow::Result<()> {
        match &self.netns {
            Some(ns) => ns.heal(),
            None => {
                self.net.heal();
                Ok(())
            }
        }
    }

    /// Cuts `nodes` off from the clients by dropping their packets (only
    /// with network namespaces).
    pub fn cut_clients(&self, nodes: &[u64]) -> anyhow::Result<()> {
        self.netns
            .as_ref()
            .context("cutting clients off by packet drops needs --net netns")?
            .cut_clients(nodes)
    }

    /// Whether the nodes run in network namespaces.
    pub fn in_netns(&self) -> bool {
        self.netns.is_some()
    }

    /// Every node's client address.
    pub fn addrs(&self) -> BTreeMap<u64, String> {
        self.nodes
            .iter()
            .map(|(&id, n)| (id, n.addr.clone()))
            .collect()
    }

    /// The address of node `id`.
    pub fn addr(&self, id: u64) -> String {
        self.nodes[&id].addr.clone()
    }

    /// The admin client (short timeouts).
    pub fn admin(&self) -> &Client {
        &self.admin
    }

    /// The client token, when the cluster runs with access control.
    pub fn token(&self) -> Option<String> {
        self.opts.acl.as_ref().map(|a| a.token.clone())
    }

    /// The log of node `id`.
    pub fn log_path(&self, id: u64) -> PathBuf {
        self.nodes[&id].dir.join("raftlockd.log")
    }

    /// True if node `id` has a live process (running or paused).
    pub fn is_up(&self, id: u64) -> bool {
        self.nodes[&id].proc.as_ref().is_some_and(Running::alive)
    }

    /// Node `id`'s data directory (its sled files are in `sled/`).
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.nodes[&id].dir.join("data")
    }

    /// True if node `id` is paused.
    pub fn is_paused(&self, id: u64) -> bool {
        self.nodes[&id].paused
    }

    /// Nodes with a running, unpaused process.
    pub fn running(&self) -> Vec<u64> {
        self.nodes
            .keys()
            .copied()
            .filter(|&id| self.is_up(id) && !self.nodes[&id].paused)
            .collect()
    }

    /// Publishes the roster (after every change to a process).
    fn publish(&self) {
        let roster = Roster {
            dir: self.opts.dir.clone(),
            nodes: self
                .nodes
                .iter()
                .map(|(&id, n)| RosterEntry {
                    id,
                    addr: n.addr.clone(),
                    alive: self.is_up(id),
                    paused: n.paused,
                })
                .collect(),
        };
        self.opts.hooks.roster.send_if_modified(|r| {
            let changed = *r != roster;
            *r = roster;
            changed
        });
    }

    /// Starts node `id` again if its process ended on its own (not if the
    /// harness stopped it, or it runs), and if this cluster is the one in
    /// `dir`: what the run's supervisor does, as systemd's
    /// `Restart=on-failure` would. Does not wait for it to serve. Returns
    /// whether it started it.
    pub fn revive(&mut self, dir: &Path, id: u64) -> anyhow::Result<bool> {
        if dir != self.opts.dir || !self.nodes.contains_key(&id) {
            return Ok(false);
        }
        if self.is_up(id) || self.nodes[&id].held_down {
            return Ok(false);
        }
        self.spawn(id)?;
        Ok(true)
    }

    /// Decommissions node `id` of the cluster in `dir` after it exited
    /// because the cluster removed it (as its log tells an operator to do):
    /// wipes its data and starts it empty, a spare for a later add. False
    /// if the cluster was replaced, the node is running again (the
    /// membership nemesis wiped it itself), or it is held down.
    pub async fn decommission(&mut self, dir: &Path, id: u64) -> anyhow::Result<bool> {
        if dir != self.opts.dir || !self.nodes.contains_key(&id) {
            return Ok(false);
        }
        if self.is_up(id) || self.nodes[&id].held_down {
            return Ok(false);
        }
        self.wipe(id).await?;
        Ok(true)
    }

    /// Waits until node `id` answers `Status`.
    pub async fn wait_serving(&self, id: u64, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let addr = self.addr(id);
        loop {
            // Our node, not whatever else may have taken the port: free
            // ports are found by binding and releasing, and another process
            // on the machine can take one in between.
            if let Ok(s) = self.admin.node_status(&addr).await {
                anyhow::ensure!(
                    s.id == id,
                    "{addr} is answered by node {}, not node {id}: another process took \
                     the port (see {})",
                    s.id,
                    self.nodes[&id].dir.join("raftlockd.log").display()
                );
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "node {id} did not answer within {timeout:?} (see {})",
                self.nodes[&id].dir.join("raftlockd.log").display()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The leader, asking every running node in parallel and believing the
    /// one that says it leads in the highest term.
    pub async fn leader(&self) -> Option<u64> {
        let running = self.running();
        let answers = futures::future::join_all(running.iter().map(|&id| {
            let addr = self.addr(id);
            let admin = self.admin.clone();
            async move { admin.node_status(&addr).await.ok() }
        }))
        .await;
        answers
            .into_iter()
            .flatten()
            .filter(|s| s.role == raftlock_client::Role::Leader)
            .max_by_key(|s| s.term)
            .map(|s| s.id)
    }

    /// Polls for a leader.
    pub async fn wait_for_leader(&self, timeout: Duration) -> anyhow::Result<u64> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.leader().await {
                return Ok(l);
            }
            anyhow::ensure!(Instant::now() < deadline, "no leader within {timeout:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The leader's membership: `(id, voter)` (None without a leader).
    /// Asked of the leader itself: any other node, and above all a wiped
    /// one, may answer with an old or empty membership.
    async fn membership(&self) -> Option<Vec<(u64, bool)>> {
        let leader = self.leader().await?;
        let status = self.admin.node_status(&self.addr(leader)).await.ok()?;
        Some(status.members.iter().map(|m| (m.id, m.voter)).collect())
    }

    /// Current voters as the leader reports them (None without a leader).
    pub async fn voters(&self) -> Option<Vec<u64>> {
        let m = self.membership().await?;
        Some(
            m.into_iter()
                .filter(|(_, v)| *v)
                .map(|(id, _)| id)
                .collect(),
        )
    }

    /// Every member (voters and learners) as the leader reports them.
    pub async fn members(&self) -> Option<Vec<u64>> {
        let m = self.membership().await?;
        Some(m.into_iter().map(|(id, _)| id).collect())
    }

    /// The run directory.
    pub fn dir(&self) -> &Path {
        &self.opts.dir
    }

    /// Kills every process now (also done on drop).
    pub async fn stop_all(&mut self) {
        for id in self.ids() {
            let _ = self.kill(id).await;
        }
        self.net.shutdown();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in self.nodes.values_mut() {
            if let Some(p) = n.proc.take() {
                p.by_harness.store(true, Ordering::SeqCst);
                if p.alive() {
                    kill(Pid::from_raw(p.pid as i32), Signal::SIGKILL).ok();
                }
                // Dropping the reaper drops the child (kill_on_drop).
                p.reaper.abort();
            }
            if n.disk.is_some() {
                // A killed node may not have exited yet, and an unmount of
                // a busy mount fails: detach it now, it goes when the
                // process does.
                let data = n.dir.join("data");
                nix::mount::umount2(&data, nix::mount::MntFlags::MNT_DETACH).ok();
            }
        }
        self.net.shutdown();
    }
}
