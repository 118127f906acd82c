//! Control of real `raftlockd` processes on 127.0.0.1: start, SIGKILL,
//! SIGSTOP/SIGCONT, restart from the data directory, wipe, and (under
//! libfaketime) clock rates.
//!
//! Every process the harness starts is registered here and killed when the
//! [`Cluster`] is dropped, whatever way the run ends; the children also get
//! `PR_SET_PDEATHSIG`, so they die if the harness itself is killed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use raftlock_client::{Client, ClientOptions};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::proxy::Net;

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

/// Loopback ports for `n` nodes of one cluster, each held by a listener
/// until its node is about to start. Holding them all at once is what
/// makes them distinct (the kernel picks port 0 at random, so ports found
/// one at a time can repeat) and keeps the proxies, which bind port 0
/// while the nodes are still down, off the nodes' ports.
fn cluster_ports(n: usize) -> anyhow::Result<Vec<std::net::TcpListener>> {
    (0..n)
        .map(|_| Ok(std::net::TcpListener::bind("127.0.0.1:0")?))
        .collect()
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
    /// ([`crate::lazyfs`]), for the lose-unsynced and slow-disk nemeses.
    pub disk_faults: bool,
}

struct NodeProc {
    addr: String,
    /// Holds `addr` until the node first starts (see [`cluster_ports`]).
    reserved: Option<std::net::TcpListener>,
    dir: PathBuf,
    /// The running process, if any.
    child: Option<Child>,
    /// Stopped with SIGSTOP.
    paused: bool,
    /// Started at least once since its data was last wiped: never pass
    /// `--init` again (a wiped node must not bootstrap a second cluster).
    started: bool,
    /// Clock rate under libfaketime (1.0 = real time).
    rate: f64,
    /// The disk-fault layer under its data directory, if any.
    disk: Option<crate::lazyfs::Mount>,
}

/// The nodes of one run and the proxies between them.
pub struct Cluster {
    opts: ClusterOptions,
    nodes: BTreeMap<u64, NodeProc>,
    /// Node-to-node proxies.
    pub net: Net,
    admin: Client,
}

impl Cluster {
    /// Creates directories and proxies and starts every node (initial
    /// voters and spares); node 1 bootstraps. Waits for a leader.
    pub async fn start(opts: ClusterOptions) -> anyhow::Result<Cluster> {
        let ids: Vec<u64> = (1..=opts.nodes + opts.spares).collect();
        let mut reserved = cluster_ports(ids.len())?.into_iter();
        let mut nodes = BTreeMap::new();
        for &id in &ids {
            let dir = opts.dir.join(format!("n{id}"));
            std::fs::create_dir_all(&dir)?;
            let disk = if opts.disk_faults {
                Some(crate::lazyfs::mount(&dir.join("disk"), &dir.join("data"))?)
            } else {
                None
            };
            let reserved = reserved.next().expect("one port per node");
            nodes.insert(
                id,
                NodeProc {
                    addr: reserved.local_addr()?.to_string(),
                    reserved: Some(reserved),
                    dir,
                    child: None,
                    paused: false,
                    started: false,
                    rate: 1.0,
                    disk,
                },
            );
        }
        let mut net = Net::new();
        for &from in &ids {
            for &to in &ids {
                if from != to {
                    net.add_proxy(from, to, nodes[&to].addr.clone()).await?;
                }
            }
        }
        let admin = Client::with_options(
            nodes.values().map(|n| n.addr.clone()).collect::<Vec<_>>(),
            ClientOptions {
                request_timeout: Duration::from_millis(800),
                retry_deadline: Duration::from_secs(3),
                ..ClientOptions::default()
            },
        )?;
        let mut cluster = Cluster {
            opts,
            nodes,
            net,
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

    /// The address of node `id`.
    pub fn addr(&self, id: u64) -> String {
        self.nodes[&id].addr.clone()
    }

    /// The admin client (short timeouts).
    pub fn admin(&self) -> &Client {
        &self.admin
    }

    /// True if node `id` has a live process (running or paused).
    pub fn is_up(&self, id: u64) -> bool {
        self.nodes[&id].child.is_some()
    }

    /// True if node `id` is paused.
    pub fn is_paused(&self, id: u64) -> bool {
        self.nodes[&id].paused
    }

    /// Nodes with a running, unpaused process.
    pub fn running(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.child.is_some() && !n.paused)
            .map(|(id, _)| *id)
            .collect()
    }

    fn spawn(&mut self, id: u64) -> anyhow::Result<()> {
        let ids = self.ids();
        let addrs: BTreeMap<u64, String> = self
            .nodes
            .iter()
            .map(|(i, n)| (*i, n.addr.clone()))
            .collect();
        let n = self.nodes.get_mut(&id).expect("known node");
        anyhow::ensure!(n.child.is_none(), "node {id} is already running");
        let dial: Vec<String> = ids
            .iter()
            .filter(|&&j| j != id)
            .map(|&j| format!("{j}={}", self.net.proxy_addr(id, j).expect("proxy exists")))
            .collect();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(n.dir.join("raftlockd.log"))?;
        let mut cmd = Command::new(&self.opts.raftlockd);
        cmd.arg("run")
            .arg("--id")
            .arg(id.to_string())
            .arg("--listen")
            .arg(&n.addr)
            .arg("--data-dir")
            .arg(n.dir.join("data"))
            .arg("--dial")
            .arg(dial.join(","))
            // The harness's nodes talk through its proxies on loopback; a
            // hostile peer is one of its faults, not a thing to lock out.
            .arg("--insecure-peers")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            // Its own process group: a Ctrl-C in the terminal reaches the
            // harness, which then stops the nodes itself.
            .process_group(0);
        if id == 1 && !n.started {
            let peers: Vec<String> = (1..=self.opts.nodes)
                .map(|p| format!("{p}={}", addrs[&p]))
                .collect();
            cmd.arg("--init").arg("--peers").arg(peers.join(","));
        }
        if let Some(lib) = &self.opts.libfaketime {
            // The rate is fixed for the life of the process: libfaketime's
            // run-time rate changes (FAKETIME_TIMESTAMP_FILE) make the
            // monotonic clock jump, backwards with FAKETIME_XRESET, so a
            // new rate means a restart. Every clock runs from the
            // process's start at this rate, with no jump.
            cmd.env("LD_PRELOAD", lib)
                .env("FAKETIME", format!("+0 x{:.3}", n.rate))
                .env_remove("FAKETIME_TIMESTAMP_FILE");
        }
        // The node dies with the harness: a harness killed mid-run leaves
        // no cluster behind.
        // SAFETY: between fork and exec the closure makes one
        // async-signal-safe system call (prctl) and allocates nothing.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                Ok(())
            });
        }
        // Hand the port over: from here until the node binds it, another
        // process could take it, which `wait_serving` reports.
        n.reserved = None;
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", self.opts.raftlockd.display()))?;
        n.child = Some(child);
        n.paused = false;
        n.started = true;
        Ok(())
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
            tokio::time::sleep(Duration::from_millis(50)).await;
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

    fn signal(&self, id: u64, sig: Signal) -> anyhow::Result<()> {
        let pid = self.nodes[&id]
            .child
            .as_ref()
            .and_then(Child::id)
            .with_context(|| format!("node {id} is not running"))?;
        kill(Pid::from_raw(pid as i32), sig).with_context(|| format!("kill({pid}, {sig})"))
    }

    /// SIGKILLs node `id` and reaps it.
    pub async fn kill(&mut self, id: u64) -> anyhow::Result<()> {
        if self.nodes[&id].child.is_none() {
            return Ok(());
        }
        self.signal(id, Signal::SIGKILL)?;
        let n = self.nodes.get_mut(&id).expect("known node");
        if let Some(mut child) = n.child.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
        }
        n.paused = false;
        Ok(())
    }

    /// Restarts node `id` from its data directory (no-op if running).
    pub async fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        if self.nodes[&id].child.is_some() {
            return Ok(());
        }
        self.spawn(id)?;
        self.wait_serving(id, Duration::from_secs(30)).await
    }

    /// Kills node `id`, deletes its data and starts it empty (a new machine
    /// under the old id; only for nodes that left the cluster).
    pub async fn wipe(&mut self, id: u64) -> anyhow::Result<()> {
        self.kill(id).await?;
        let n = self.nodes.get_mut(&id).expect("known node");
        let data = n.dir.join("data");
        if n.disk.is_some() {
            // The directory is a mount point: empty it.
            for e in std::fs::read_dir(&data)? {
                let p = e?.path();
                if p.is_dir() {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_file(&p)
                }
                .with_context(|| format!("cannot wipe {}", p.display()))?;
            }
        } else if data.exists() {
            std::fs::remove_dir_all(&data)
                .with_context(|| format!("cannot wipe {}", data.display()))?;
        }
        n.started = true;
        self.restart(id).await
    }

    /// Drops every write node `id`'s disk has not synced (kill it first):
    /// the files that lost something.
    pub fn lose_unsynced(&self, id: u64) -> anyhow::Result<usize> {
        let disk = self.nodes[&id]
            .disk
            .as_ref()
            .context("no disk-fault layer (the run was started without disk nemeses)")?;
        Ok(disk.control.lose_unsynced()?)
    }

    /// Makes every sync on node `id`'s disk take `delay`.
    pub fn set_fsync_delay(&self, id: u64, delay: Duration) -> anyhow::Result<()> {
        let disk = self.nodes[&id]
            .disk
            .as_ref()
            .context("no disk-fault layer (the run was started without disk nemeses)")?;
        disk.control.set_fsync_delay(delay);
        Ok(())
    }

    /// SIGSTOPs node `id`.
    pub fn pause(&mut self, id: u64) -> anyhow::Result<()> {
        self.signal(id, Signal::SIGSTOP)?;
        self.nodes.get_mut(&id).expect("known node").paused = true;
        Ok(())
    }

    /// SIGCONTs node `id` (no-op if it is not paused).
    pub fn resume(&mut self, id: u64) -> anyhow::Result<()> {
        if !self.nodes[&id].paused || self.nodes[&id].child.is_none() {
            return Ok(());
        }
        self.signal(id, Signal::SIGCONT)?;
        self.nodes.get_mut(&id).expect("known node").paused = false;
        Ok(())
    }

    /// Restarts node `id` (gracefully: SIGTERM, then SIGKILL after 5 s)
    /// with its clocks running at `rate` under libfaketime. Errors if the
    /// cluster does not run under libfaketime.
    pub async fn set_rate(&mut self, id: u64, rate: f64) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.opts.libfaketime.is_some(),
            "nodes do not run under libfaketime"
        );
        if let Some(mut child) = self.nodes.get_mut(&id).and_then(|n| n.child.take()) {
            if let Some(pid) = child.id() {
                let pid = Pid::from_raw(pid as i32);
                kill(pid, Signal::SIGCONT).ok();
                kill(pid, Signal::SIGTERM).ok();
            }
            if tokio::time::timeout(Duration::from_secs(5), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
        let n = self.nodes.get_mut(&id).expect("known node");
        n.paused = false;
        n.rate = rate;
        self.restart(id).await
    }

    /// The current clock rate of node `id`.
    pub fn rate(&self, id: u64) -> f64 {
        self.nodes[&id].rate
    }

    /// Resumes paused nodes, restarts dead ones, resets clock rates and
    /// heals the network.
    pub async fn heal_all(&mut self) -> anyhow::Result<()> {
        self.net.heal();
        for id in self.ids() {
            self.resume(id)?;
        }
        for id in self.ids() {
            if self.opts.libfaketime.is_some() && self.rate(id) != 1.0 {
                self.set_rate(id, 1.0).await?;
            }
            self.restart(id).await?;
        }
        Ok(())
    }

    /// Disaster recovery: starts a fresh cluster of the same shape in
    /// `dir` (new ports, empty data), restores `backup` into it with
    /// `fence_bump`, and puts it in this one's place; the old
    /// cluster's nodes and proxies are stopped. Returns the restore's
    /// answer.
    pub async fn replace_by_restore(
        &mut self,
        backup: Vec<u8>,
        fence_bump: u64,
        dir: PathBuf,
    ) -> anyhow::Result<raftlock_client::Restored> {
        let opts = ClusterOptions {
            dir,
            ..self.opts.clone()
        };
        let mut fresh = Cluster::start(opts).await?;
        let restored = fresh
            .admin
            .restore_with(backup, Some(fence_bump))
            .await
            .context("restore into the fresh cluster")?;
        std::mem::swap(self, &mut fresh);
        fresh.stop_all().await;
        Ok(restored)
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
            if let Some(child) = n.child.as_mut() {
                if let Some(pid) = child.id() {
                    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).ok();
                }
                let _ = child.start_kill();
                let _ = child.try_wait();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Nodes of one cluster never share a port. The kernel picks each free
    /// port at random from the ephemeral range (~28k ports here), so
    /// ports found one at a time collide: among 1,000 the birthday bound
    /// gives a repeat all but always (a 7-node harness run hit one).
    #[test]
    fn ports_of_one_cluster_are_distinct() {
        let held = cluster_ports(1_000).unwrap();
        let ports: Vec<u16> = held
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "a port was handed out twice");
        // Held means taken: nobody else (a proxy, say) can listen there.
        let taken = std::net::TcpListener::bind(("127.0.0.1", ports[0]));
        assert!(taken.is_err(), "a held port could be bound again");
        drop(held);
        std::net::TcpListener::bind(("127.0.0.1", ports[0])).expect("released on drop");
    }
}
