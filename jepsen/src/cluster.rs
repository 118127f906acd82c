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
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use raftlock_client::{Client, ClientOptions};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::proxy::{Link, Net};

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

/// A running process and its reaper.
struct Running {
    pid: u32,
    /// Signals for the reaper to deliver.
    signals: mpsc::UnboundedSender<Signal>,
    /// Set once the process has ended.
    ended: watch::Receiver<bool>,
    /// The harness is stopping it (its end is not reported as a failure).
    by_harness: Arc<AtomicBool>,
    reaper: tokio::task::JoinHandle<()>,
}

impl Running {
    fn alive(&self) -> bool {
        !*self.ended.borrow()
    }

    /// Has the reaper signal the process (if it is still there).
    fn signal(&self, sig: Signal) {
        let _ = self.signals.send(sig);
    }

    /// Waits up to `within` for the process to end.
    async fn wait(&self, within: Duration) -> bool {
        let mut ended = self.ended.clone();
        let done = tokio::time::timeout(within, ended.wait_for(|e| *e))
            .await
            .is_ok();
        done
    }
}

/// The last non-empty line of `log`, without terminal colours.
pub fn last_log_line(log: &Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(log) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(16 * 1024)));
    let mut tail = Vec::new();
    let _ = f.read_to_end(&mut tail);
    let text = String::from_utf8_lossy(&tail);
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    strip_ansi(line)
}

/// What `raftlockd` says when it exits because the cluster removed it
/// (status 0, so that a supervisor leaves it stopped).
pub const REMOVED_TEXT: &str = "was removed from the cluster";

/// The line of `log` in which the node, since it last started, said it
/// was removed from the cluster and is exiting, if it did.
pub fn removal_line(log: &Path) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(log).ok()?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut tail = Vec::new();
    let _ = f.read_to_end(&mut tail);
    let text = String::from_utf8_lossy(&tail);
    text.lines()
        .rev()
        .take_while(|l| !l.contains("raftlockd serving"))
        .find(|l| l.contains(REMOVED_TEXT) && l.contains("exiting"))
        .map(strip_ansi)
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ ... final byte in @..~
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// Owns `child` until it ends: delivers the signals the cluster asks for,
/// and reports the end.
async fn reap(
    mut child: Child,
    mut signals: mpsc::UnboundedReceiver<Signal>,
    ended: watch::Sender<bool>,
    by_harness: Arc<AtomicBool>,
    report: Option<mpsc::UnboundedSender<ExitReport>>,
    (cluster_dir, node, log): (PathBuf, u64, PathBuf),
) {
    use std::os::unix::process::ExitStatusExt;
    let pid = child.id().unwrap_or(0);
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.ok(),
            Some(sig) = signals.recv() => {
                // Not reaped yet (only this task waits on it), so the pid
                // is still this process's.
                if let Some(pid) = child.id() {
                    kill(Pid::from_raw(pid as i32), sig).ok();
                }
            }
        }
    };
    ended.send_replace(true);
    if let Some(report) = report {
        let _ = report.send(ExitReport {
            cluster_dir,
            node,
            pid,
            code: status.and_then(|s| s.code()),
            signal: status.and_then(|s| s.signal()),
            by_harness: by_harness.load(Ordering::SeqCst),
            last_log_line: last_log_line(&log),
            removed: status
                .and_then(|s| s.code())
                .filter(|c| *c == 0)
                .and_then(|_| removal_line(&log)),
        });
    }
}

struct NodeProc {
    addr: String,
    /// Holds `addr` until the node first starts (see [`cluster_ports`]).
    reserved: Option<std::net::TcpListener>,
    dir: PathBuf,
    /// The process, if one was started and not stopped by the harness
    /// (it may have ended on its own since).
    proc: Option<Running>,
    /// Stopped with SIGSTOP.
    paused: bool,
    /// Stopped by the harness, to stay down until it restarts it (the
    /// supervisor starts only nodes that ended on their own).
    held_down: bool,
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

    fn spawn(&mut self, id: u64) -> anyhow::Result<()> {
        anyhow::ensure!(!self.is_up(id), "node {id} is already running");
        let ids = self.ids();
        let addrs: BTreeMap<u64, String> = self
            .nodes
            .iter()
            .map(|(i, n)| (*i, n.addr.clone()))
            .collect();
        let n = self.nodes.get_mut(&id).expect("known node");
        // Through the proxies; in namespaces, straight to the peers.
        let dial: Vec<String> = match &self.netns {
            Some(_) => Vec::new(),
            None => ids
                .iter()
                .filter(|&&j| j != id)
                .map(|&j| format!("{j}={}", self.net.proxy_addr(id, j).expect("proxy exists")))
                .collect(),
        };
        let log_path = n.dir.join("raftlockd.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        let mut cmd = Command::new(&self.opts.raftlockd);
        cmd.arg("run")
            .arg("--id")
            .arg(id.to_string())
            .arg("--listen")
            .arg(&n.addr)
            .arg("--data-dir")
            .arg(n.dir.join("data"))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            // Its own process group: a Ctrl-C in the terminal reaches the
            // harness, which then stops the nodes itself.
            .process_group(0);
        match &self.opts.acl {
            Some(acl) => {
                cmd.arg("--acl-file").arg(&acl.file);
            }
            // The harness's nodes talk through its proxies on loopback; a
            // hostile peer is one of its faults, not a thing to lock out.
            None if self.opts.insecure_peers_flag => {
                cmd.arg("--insecure-peers");
            }
            None => {}
        }
        if !dial.is_empty() {
            cmd.arg("--dial").arg(dial.join(","));
        }
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
        // The node's network namespace, entered between fork and exec.
        let netns_file = match &self.netns {
            Some(ns) => Some(
                std::fs::File::open(ns.ns_path(id))
                    .with_context(|| format!("cannot open {}", ns.ns_path(id).display()))?,
            ),
            None => None,
        };
        let netns_fd = netns_file.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
        // The node dies with the harness: a harness killed mid-run leaves
        // no cluster behind.
        // SAFETY: between fork and exec the closure makes async-signal-safe
        // system calls only (setns, prctl) and allocates nothing; the
        // namespace's descriptor stays open until the spawn has returned.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(move || {
                if let Some(fd) = netns_fd {
                    nix::sched::setns(
                        std::os::fd::BorrowedFd::borrow_raw(fd),
                        nix::sched::CloneFlags::CLONE_NEWNET,
                    )?;
                }
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
        drop(netns_file);
        let (signals, signals_rx) = mpsc::unbounded_channel();
        let (ended_tx, ended) = watch::channel(false);
        let by_harness = Arc::new(AtomicBool::new(false));
        let pid = child.id().unwrap_or(0);
        let reaper = tokio::spawn(reap(
            child,
            signals_rx,
            ended_tx,
            by_harness.clone(),
            self.opts.hooks.exits.clone(),
            (self.opts.dir.clone(), id, log_path),
        ));
        n.proc = Some(Running {
            pid,
            signals,
            ended,
            by_harness,
            reaper,
        });
        n.paused = false;
        n.held_down = false;
        n.started = true;
        self.publish();
        Ok(())
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

    fn running_proc(&self, id: u64) -> anyhow::Result<&Running> {
        self.nodes[&id]
            .proc
            .as_ref()
            .filter(|p| p.alive())
            .with_context(|| format!("node {id} is not running"))
    }

    /// SIGKILLs node `id` and waits for it to end; it stays down until
    /// [`restart`](Self::restart) (the supervisor leaves it alone).
    pub async fn kill(&mut self, id: u64) -> anyhow::Result<()> {
        let n = self.nodes.get_mut(&id).expect("known node");
        n.held_down = true;
        n.paused = false;
        if let Some(p) = n.proc.take() {
            if p.alive() {
                p.by_harness.store(true, Ordering::SeqCst);
                p.signal(Signal::SIGKILL);
                anyhow::ensure!(
                    p.wait(Duration::from_secs(5)).await,
                    "node {id} (pid {}) did not die within 5 s of SIGKILL",
                    p.pid
                );
            }
        }
        self.publish();
        Ok(())
    }

    /// Starts node `id` from its data directory without waiting for it
    /// (no-op if running).
    pub fn start_node(&mut self, id: u64) -> anyhow::Result<()> {
        if self.is_up(id) {
            return Ok(());
        }
        self.spawn(id)
    }

    /// Restarts node `id` from its data directory (no-op if running) and
    /// waits until it answers.
    pub async fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        if self.is_up(id) {
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

    fn disk(&self, id: u64) -> anyhow::Result<&crate::lazyfs::Mount> {
        self.nodes[&id]
            .disk
            .as_ref()
            .context("no disk-fault layer (the run was started without disk nemeses)")
    }

    /// Drops every write node `id`'s disk has not synced (kill it first):
    /// the files that lost something.
    pub fn lose_unsynced(&self, id: u64) -> anyhow::Result<usize> {
        Ok(self.disk(id)?.control.lose_unsynced()?)
    }

    /// Makes every sync on node `id`'s disk take `delay`.
    pub fn set_fsync_delay(&self, id: u64, delay: Duration) -> anyhow::Result<()> {
        self.disk(id)?.control.set_fsync_delay(delay);
        Ok(())
    }

    /// Makes node `id`'s disk fail (or work again, with `None`).
    pub fn set_disk_error(
        &self,
        id: u64,
        error: Option<crate::lazyfs::DiskError>,
    ) -> anyhow::Result<()> {
        self.disk(id)?.control.set_error(error);
        Ok(())
    }

    /// SIGSTOPs node `id`.
    pub fn pause(&mut self, id: u64) -> anyhow::Result<()> {
        self.running_proc(id)?.signal(Signal::SIGSTOP);
        self.nodes.get_mut(&id).expect("known node").paused = true;
        self.publish();
        Ok(())
    }

    /// SIGCONTs node `id` (no-op if it is not paused).
    pub fn resume(&mut self, id: u64) -> anyhow::Result<()> {
        if !self.nodes[&id].paused {
            return Ok(());
        }
        if let Ok(p) = self.running_proc(id) {
            p.signal(Signal::SIGCONT);
        }
        self.nodes.get_mut(&id).expect("known node").paused = false;
        self.publish();
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
        if let Some(p) = self.nodes.get_mut(&id).and_then(|n| n.proc.take()) {
            if p.alive() {
                p.by_harness.store(true, Ordering::SeqCst);
                p.signal(Signal::SIGCONT);
                p.signal(Signal::SIGTERM);
                if !p.wait(Duration::from_secs(5)).await {
                    p.signal(Signal::SIGKILL);
                    p.wait(Duration::from_secs(5)).await;
                }
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

    /// Resumes paused nodes, restarts dead ones, resets clock rates, disk
    /// faults and the network.
    pub async fn heal_all(&mut self) -> anyhow::Result<()> {
        self.heal_links()?;
        for id in self.ids() {
            self.resume(id)?;
            if let Some(d) = &self.nodes[&id].disk {
                d.control.set_fsync_delay(Duration::ZERO);
                d.control.set_error(None);
            }
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
    /// `fence_bump` (`None`: the server's default), and puts it in this
    /// one's place; the old
    /// cluster's nodes and proxies are stopped. Returns the restore's
    /// answer.
    pub async fn replace_by_restore(
        &mut self,
        backup: Vec<u8>,
        fence_bump: Option<u64>,
        dir: PathBuf,
    ) -> anyhow::Result<raftlock_client::Restored> {
        let opts = ClusterOptions {
            dir,
            ..self.opts.clone()
        };
        let mut fresh = Cluster::start(opts).await?;
        let restored = fresh
            .admin
            .restore_with(backup, fence_bump)
            .await
            .context("restore into the fresh cluster")?;
        std::mem::swap(self, &mut fresh);
        fresh.stop_all().await;
        self.publish();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Nodes of one cluster never share a port (while the kernel picked
    /// them, from the ephemeral range, ports found one at a time collided:
    /// a 7-node harness run hit one), and none is in the ephemeral range,
    /// where every outgoing connection's source port comes from.
    #[test]
    fn ports_of_one_cluster_are_distinct() {
        let held = cluster_ports(1_000).unwrap();
        let ports: Vec<u16> = held
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "a port was handed out twice");
        assert!(
            ports.iter().all(|p| *p < raftlock_testkit::ports::END),
            "a port from the ephemeral range"
        );
        // Held means taken: nobody else (a proxy, say) can listen there.
        let taken = std::net::TcpListener::bind(("127.0.0.1", ports[0]));
        assert!(taken.is_err(), "a held port could be bound again");
        // Held by this process: a listening socket of ours on every one.
        let ours = |ports: &[u16]| {
            let mine = own_socket_inodes();
            listening_inodes(ports)
                .into_iter()
                .filter(|inode| mine.contains(inode))
                .count()
        };
        assert_eq!(
            ours(&ports),
            ports.len(),
            "a held port has no socket of ours"
        );
        drop(held);
        // Released on drop: no socket of this process listens on any of
        // them (still reserved for this process: no other process that
        // asks `raftlock_testkit::ports` is given one).
        assert_eq!(ours(&ports), 0, "a dropped port is still held");
    }

    /// Inodes of the sockets listening on `ports` (127.0.0.1), from the
    /// kernel's table.
    fn listening_inodes(ports: &[u16]) -> std::collections::BTreeSet<u64> {
        let wanted: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
        table
            .lines()
            .skip(1)
            .filter_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                let (addr, port) = f.get(1)?.split_once(':')?;
                let port = u16::from_str_radix(port, 16).ok()?;
                // 0100007F is 127.0.0.1; state 0A is LISTEN.
                (addr == "0100007F" && *f.get(3)? == "0A" && wanted.contains(&port))
                    .then(|| f.get(9)?.parse().ok())
                    .flatten()
            })
            .collect()
    }

    /// Inodes of the sockets this process has open.
    fn own_socket_inodes() -> std::collections::BTreeSet<u64> {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| {
                let link = std::fs::read_link(e.ok()?.path()).ok()?;
                let link = link.to_str()?;
                link.strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .parse()
                    .ok()
            })
            .collect()
    }

    /// A removal counts only when the node said it after its last start:
    /// a node started again after an old removal (and added back) that
    /// then exits for another reason is not "removed".
    #[test]
    fn a_removal_line_counts_only_after_the_last_start() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("raftlockd.log");
        let removed = "2026-11-27T03:23:26Z  WARN raftlockd: node 3 was removed from the \
                       cluster (node 1's membership at log index 9 does not have it); exiting. \
                       Delete its data directory";
        let serving = "2026-11-27T03:23:20Z  INFO raftlockd: raftlockd serving id=3";
        let shutting = "2026-11-27T03:23:26Z  INFO raftlockd: shutting down";
        std::fs::write(&log, format!("{serving}\n{removed}\n{shutting}\n")).unwrap();
        assert_eq!(removal_line(&log).as_deref(), Some(removed));
        std::fs::write(
            &log,
            format!("{serving}\n{removed}\n{serving}\n{shutting}\n"),
        )
        .unwrap();
        assert_eq!(removal_line(&log), None);
        std::fs::write(&log, format!("{serving}\n{shutting}\n")).unwrap();
        assert_eq!(removal_line(&log), None);
        assert_eq!(removal_line(&dir.path().join("missing.log")), None);
    }
}
