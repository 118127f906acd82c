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

/// A free loopback port for a node to listen on, reserved for this test
/// process: see `raftlock_testkit::ports` (below the ephemeral range, and
/// never given to two processes at once).
pub fn free_port() -> u16 {
    raftlock_testkit::ports::free_port()
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

/// Election timeouts (ms) long enough that a node that hears from its
/// leader does not time out on a busy machine: for tests about something
/// other than an election.
pub const BUSY_MACHINE_ELECTIONS: &[&str] = &[
    "--election-timeout-min-ms",
    "1000",
    "--election-timeout-max-ms",
    "1500",
];

/// A linearizable `Describe` of `name` at `addr`: its state (empty when
/// nobody holds, waits for or delays it), if the node answers.
pub async fn describe(addr: &str, name: &str) -> Option<pb::LockInfo> {
    let r = locks(addr)
        .describe(pb::DescribeRequest {
            name: name.into(),
            stale: false,
        })
        .await
        .ok()?
        .into_inner();
    Some(r.info.unwrap_or_default())
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
    /// Each node's metrics address (`--metrics-listen`).
    metrics: BTreeMap<u64, String>,
    /// The nodes' `RUST_LOG`.
    rust_log: String,
    /// The `raftlockd` each node runs, if not this build's.
    binaries: BTreeMap<u64, PathBuf>,
}

impl Procs {
    /// Starts `n` nodes (node 1 bootstraps) with `extra` arguments each.
    pub fn start(n: u64, extra: &[&str]) -> Procs {
        Self::start_with_dirs(n, extra, BTreeMap::new())
    }

    /// Like [`start`](Self::start), with the data of the nodes in `dirs`
    /// there instead of in the cluster's temporary directory.
    pub fn start_with_dirs(n: u64, extra: &[&str], dirs: BTreeMap<u64, PathBuf>) -> Procs {
        Self::start_full(n, extra, dirs, "info")
    }

    /// Like [`start`](Self::start), with the nodes' log filter `rust_log`
    /// (`RUST_LOG`; the empty string: none, so raftlockd's default).
    pub fn start_logging(n: u64, extra: &[&str], rust_log: &str) -> Procs {
        Self::start_full(n, extra, BTreeMap::new(), rust_log)
    }

    /// Like [`start`](Self::start), every node running the `raftlockd`
    /// at `binary` (another build: a rolling upgrade's old version).
    pub fn start_binary(n: u64, extra: &[&str], binary: &std::path::Path) -> Procs {
        let binaries = (1..=n).map(|id| (id, binary.to_path_buf())).collect();
        Self::start_full_with(n, extra, BTreeMap::new(), "info", binaries)
    }

    /// Node `id` runs `binary` from its next start on (`None`: this
    /// build's `raftlockd`).
    pub fn set_binary(&mut self, id: u64, binary: Option<&std::path::Path>) {
        match binary {
            Some(b) => self.binaries.insert(id, b.to_path_buf()),
            None => self.binaries.remove(&id),
        };
    }

    /// Like [`start`](Self::start), but only the nodes in `running` are
    /// started: the others are in every node's `--peers` (voters of the
    /// bootstrap membership) and start later with [`spawn`](Self::spawn).
    pub fn start_some(n: u64, extra: &[&str], running: &[u64]) -> Procs {
        let mut procs = Self::configure(n, extra, BTreeMap::new(), "info", BTreeMap::new());
        for &id in running {
            procs.spawn(id, id == 1);
        }
        procs
    }

    fn start_full(n: u64, extra: &[&str], dirs: BTreeMap<u64, PathBuf>, rust_log: &str) -> Procs {
        Self::start_full_with(n, extra, dirs, rust_log, BTreeMap::new())
    }

    fn start_full_with(
        n: u64,
        extra: &[&str],
        dirs: BTreeMap<u64, PathBuf>,
        rust_log: &str,
        binaries: BTreeMap<u64, PathBuf>,
    ) -> Procs {
        let mut procs = Self::configure(n, extra, dirs, rust_log, binaries);
        for id in 1..=n {
            procs.spawn(id, id == 1);
        }
        procs
    }

    /// The processes of an `n`-node cluster, none started yet.
    fn configure(
        n: u64,
        extra: &[&str],
        dirs: BTreeMap<u64, PathBuf>,
        rust_log: &str,
        binaries: BTreeMap<u64, PathBuf>,
    ) -> Procs {
        let addrs: BTreeMap<u64, String> = (1..=n)
            .map(|id| (id, format!("127.0.0.1:{}", free_port())))
            .collect();
        let peers = addrs
            .iter()
            .map(|(id, a)| format!("{id}={a}"))
            .collect::<Vec<_>>()
            .join(",");
        Procs {
            dir: tempfile::tempdir().expect("dir"),
            addrs,
            peers,
            children: BTreeMap::new(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            dirs,
            metrics: (1..=n)
                .map(|id| (id, format!("127.0.0.1:{}", free_port())))
                .collect(),
            rust_log: rust_log.to_string(),
            binaries,
        }
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

    /// The metrics address (`GET /metrics`) of node `id`.
    pub fn metrics_addr(&self, id: u64) -> String {
        self.metrics[&id].clone()
    }

    /// The process id of node `id`, while it runs.
    pub fn pid(&self, id: u64) -> u32 {
        self.children[&id].id().expect("running")
    }

    /// Sends `signal` (a `kill -SIGNAL` name: `STOP`, `CONT`, `TERM`) to
    /// node `id`.
    pub fn signal(&self, id: u64, signal: &str) {
        let ok = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid(id).to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{signal} node {id}");
    }

    /// Starts node `id` from its data directory.
    pub fn spawn(&mut self, id: u64, init: bool) {
        self.spawn_with(id, init, &[]);
    }

    /// Gives the cluster's processes a node `id` more (its own ports and
    /// data directory; not a member until it is added) and starts it.
    pub fn add(&mut self, id: u64) {
        self.add_with(id, &[]);
    }

    /// [`add`](Self::add), with `more` arguments for its first start.
    pub fn add_with(&mut self, id: u64, more: &[&str]) {
        self.addrs.insert(id, format!("127.0.0.1:{}", free_port()));
        self.metrics
            .insert(id, format!("127.0.0.1:{}", free_port()));
        self.spawn_with(id, false, more);
    }

    /// [`spawn`](Self::spawn), with `more` arguments for this start only.
    pub fn spawn_with(&mut self, id: u64, init: bool, more: &[&str]) {
        let data_dir = self.data_dir(id);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log(id))
            .expect("log file");
        let mut cmd = match self.binaries.get(&id) {
            Some(binary) => Command::new(binary),
            None => Command::new(env!("CARGO_BIN_EXE_raftlockd")),
        };
        cmd.arg("run")
            .arg("--id")
            .arg(id.to_string())
            .arg("--listen")
            .arg(&self.addrs[&id])
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--peers")
            .arg(&self.peers)
            .args(["--heartbeat-ms", "50"])
            .arg("--metrics-listen")
            .arg(&self.metrics[&id]);
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
            .args(more)
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true);
        if self.rust_log.is_empty() {
            cmd.env_remove("RUST_LOG");
        } else {
            cmd.env("RUST_LOG", &self.rust_log);
        }
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
    /// leader calls itself leader; returns its id. On a timeout the panic
    /// says what each node answered last.
    pub async fn leader(&self) -> u64 {
        let ids: Vec<u64> = self.children.keys().copied().collect();
        self.leader_among(&ids).await
    }

    /// As [`leader`](Self::leader), asking only nodes `ids` (for a test
    /// in which another node is about to exit); the leader may be any
    /// node, and must call itself leader.
    pub async fn leader_among(&self, ids: &[u64]) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut said = Vec::new();
            for id in ids {
                said.push(match status(&self.addrs[id]).await {
                    Some(s) => (*id, Some((s.leader_id, s.role, s.term))),
                    None => (*id, None),
                });
            }
            let last = said
                .iter()
                .map(|(id, s)| match s {
                    Some((l, role, term)) => format!("node {id}: {role}, term {term}, leader {l}"),
                    None => format!("node {id}: no answer"),
                })
                .collect::<Vec<_>>()
                .join("; ");
            let leaders: std::collections::BTreeSet<Option<u64>> = said
                .iter()
                .map(|(_, s)| s.as_ref().map(|(l, _, _)| *l).filter(|l| *l != 0))
                .collect();
            if let [Some(l)] = leaders.into_iter().collect::<Vec<_>>()[..] {
                let leads = match said.iter().find(|(id, _)| *id == l) {
                    Some((_, s)) => s.as_ref().is_some_and(|(_, role, _)| role == "leader"),
                    None => match self.addrs.get(&l) {
                        Some(addr) => status(addr).await.is_some_and(|s| s.role == "leader"),
                        None => false,
                    },
                };
                if leads {
                    return l;
                }
            }
            if Instant::now() >= deadline {
                // The end of the log of each node that did not answer (a
                // crash, a hang: the test's directory goes with the panic).
                let silent: String = said
                    .iter()
                    .filter(|(_, s)| s.is_none())
                    .map(|(id, _)| {
                        let log = self.read_log(*id);
                        let from = log.len().saturating_sub(3000);
                        let from = (from..log.len())
                            .find(|i| log.is_char_boundary(*i))
                            .unwrap_or(log.len());
                        format!("\n--- the end of node {id}'s log:\n{}", &log[from..])
                    })
                    .collect();
                panic!(
                    "timed out after 30s: a leader every running node agrees on (last answers: \
                     {last}){silent}"
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Node `id`'s `GET /metrics` text, if it answers.
    pub async fn scrape(&self, id: u64) -> Option<String> {
        let (code, body) = http(&self.metrics[&id], "GET", "/metrics", &[]).await?;
        (code == 200).then_some(body)
    }

    /// Node `id`'s standard error so far.
    pub fn read_log(&self, id: u64) -> String {
        std::fs::read_to_string(self.log(id)).unwrap_or_default()
    }
}

/// One HTTP/1.1 request to `addr` (`method path`, with `headers`); the
/// status code and body, or `None` if the node does not answer.
pub async fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut conn = tokio::net::TcpStream::connect(addr).await.ok()?;
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: 0\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        conn.write_all(req.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        conn.read_to_end(&mut raw).await.ok()?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let code = text.split(' ').nth(1)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
        Some((code, body))
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

/// The value of the sample `series` (a metric name with its labels, as the
/// text shows it) in `text`.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The sum of every sample of metric `name` (any labels) in `text`.
pub fn sum_samples(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// CPU time (user + system) process `pid` has used so far.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // Fields after the command name (which may hold spaces), from field 3.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    let hz: u64 = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100);
    Duration::from_millis(ticks * 1000 / hz)
}

/// How long a single [`lock_cycle`] may take: a deadline for a cycle that
/// hangs, not a latency bound (three writes take milliseconds on an idle
/// machine, and can take seconds on a loaded one).
pub const CYCLE_DEADLINE: Duration = Duration::from_secs(30);

/// How long one of a [`Probe`]'s cycles may take before it gives up and
/// looks for the leader again (it retries at once, so this only decides
/// how soon a cycle at a node that stopped answering is abandoned).
const PROBE_CYCLE_DEADLINE: Duration = Duration::from_secs(2);

/// Opens a session at `addr`, takes lock `name` and closes the session
/// (which releases it); the fence, if all three went through within
/// [`CYCLE_DEADLINE`].
pub async fn lock_cycle(addr: &str, name: &str, nonce: u64) -> Option<u64> {
    lock_cycle_with(&mut locks(addr), name, nonce).await
}

/// [`lock_cycle`] on the connection `c`.
pub async fn lock_cycle_with(c: &mut LocksClient<Channel>, name: &str, nonce: u64) -> Option<u64> {
    lock_cycle_leaving(c, name, nonce, CYCLE_DEADLINE).await.0
}

/// [`lock_cycle_with`], which also returns the session it opened if it
/// could not close it (e.g. the node stepped down in between): it may
/// still hold the lock, until it is closed elsewhere or expires.
async fn lock_cycle_leaving(
    c: &mut LocksClient<Channel>,
    name: &str,
    nonce: u64,
    deadline: Duration,
) -> (Option<u64>, Option<u64>) {
    let mut opened = None;
    let cycle = async {
        let session = c
            .open_session(pb::OpenSessionRequest {
                ttl_ms: 10_000,
                nonce,
                ..Default::default()
            })
            .await
            .ok()?
            .into_inner()
            .session_id;
        opened = Some(session);
        let grant = c
            .acquire(pb::AcquireRequest {
                session_id: session,
                seq: 1,
                name: name.into(),
                mode: pb::Mode::Exclusive as i32,
                ..Default::default()
            })
            .await
            .ok()?
            .into_inner();
        close_session(c, session).await.then_some(())?;
        opened = None;
        grant.acquired.then_some(grant.fence)
    };
    let fence = tokio::time::timeout(deadline, cycle).await.ok().flatten();
    (fence, opened)
}

/// Closes `session` (as the second request of a [`lock_cycle`]'s session,
/// so closing it again is harmless): true once it is closed or gone.
async fn close_session(c: &mut LocksClient<Channel>, session: u64) -> bool {
    let closed = c
        .close_session(pb::CloseSessionRequest {
            session_id: session,
            seq: 2,
        })
        .await;
    match closed {
        Ok(_) => true,
        // Not the leader, or not reachable: try again elsewhere.
        Err(s) if s.code() == tonic::Code::Unavailable => false,
        // Expired or closed already.
        Err(_) => true,
    }
}

/// Grants in a loop against whichever node leads, until stopped: measures
/// how long the cluster goes without granting.
pub struct Probe {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<ProbeReport>,
    /// The grants so far.
    granted: tokio::sync::watch::Receiver<u64>,
}

/// What a [`Probe`] saw.
#[derive(Debug)]
pub struct ProbeReport {
    /// Lock cycles that went through.
    pub grants: u64,
    /// The longest time between two grants, or from the last grant to
    /// the probe's end.
    pub longest_gap: Duration,
    /// When the longest gap ended.
    pub gap_ended: Option<Instant>,
    /// Every gap over 100 ms: when it ended, and how long it was.
    pub long_gaps: Vec<(Instant, Duration)>,
}

impl ProbeReport {
    /// Counts `gap`, which ended at `now`.
    fn gap(&mut self, now: Instant, gap: Duration) {
        if gap > Duration::from_millis(100) {
            self.long_gaps.push((now, gap));
        }
        if gap > self.longest_gap {
            self.longest_gap = gap;
            self.gap_ended = Some(now);
        }
    }
}

impl Probe {
    /// Starts granting `name` on the cluster whose client addresses are
    /// `addrs`, one cycle at a time, `pace` apart.
    pub fn start(addrs: Vec<String>, name: &str, pace: Duration) -> Probe {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let (grants, granted) = tokio::sync::watch::channel(0);
        let name = name.to_string();
        let task = tokio::spawn(async move {
            let mut last: Option<Instant> = None;
            let mut report = ProbeReport {
                grants: 0,
                longest_gap: Duration::ZERO,
                gap_ended: None,
                long_gaps: Vec::new(),
            };
            let mut leader: Option<String> = None;
            let mut nonce = 1_000_000;
            let mut clients = std::collections::HashMap::new();
            let mut unclosed: Vec<u64> = Vec::new();
            while !*stopped.borrow() {
                let target = match &leader {
                    Some(l) => l.clone(),
                    None => match find_leader(&addrs).await {
                        Some(l) => l,
                        None => {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    },
                };
                nonce += 1;
                let client = clients
                    .entry(target.clone())
                    .or_insert_with(|| locks(&target));
                // A session a cycle could not close (its node stepped down
                // between the acquire and the close) may hold the lock: a
                // client closes it at the next leader, as a real one would,
                // rather than let every later cycle find the lock taken
                // until it expires.
                let mut still_open = Vec::new();
                for session in unclosed.drain(..) {
                    if !close_session(client, session).await {
                        still_open.push(session);
                    }
                }
                unclosed = still_open;
                let (fence, left) =
                    lock_cycle_leaving(client, &name, nonce, PROBE_CYCLE_DEADLINE).await;
                unclosed.extend(left);
                match fence {
                    Some(_) => {
                        let now = Instant::now();
                        report.gap(now, now - last.unwrap_or(now));
                        last = Some(now);
                        report.grants += 1;
                        grants.send_replace(report.grants);
                        leader = Some(target);
                    }
                    None => leader = None,
                }
                tokio::select! {
                    _ = tokio::time::sleep(pace) => {}
                    _ = stopped.changed() => {}
                }
            }
            // The time since the last grant is a gap too: a probe that
            // stopped granting for good must not look like one that never
            // paused.
            if let Some(last) = last {
                let now = Instant::now();
                report.gap(now, now - last);
            }
            report
        });
        Probe {
            stop,
            task,
            granted,
        }
    }

    /// Waits until the probe has had its first grant, or panics after
    /// `deadline`. Gaps count from the first grant to [`finish`](Self::finish):
    /// a test waits for it before the fault it measures.
    pub async fn first_grant(&mut self, deadline: Duration) {
        let first = tokio::time::timeout(deadline, self.granted.wait_for(|n| *n > 0)).await;
        assert!(
            matches!(first, Ok(Ok(_))),
            "the probe had no grant within {deadline:?}"
        );
    }

    /// The grants so far.
    pub fn grants(&self) -> u64 {
        *self.granted.borrow()
    }

    /// Waits until the probe has had more than `n` grants, or panics after
    /// `deadline` saying `what`: the cluster grants again (or still), with
    /// no bound on how soon beyond the deadline.
    pub async fn more_than(&mut self, n: u64, deadline: Duration, what: &str) {
        let more = tokio::time::timeout(deadline, self.granted.wait_for(|g| *g > n)).await;
        assert!(
            matches!(more, Ok(Ok(_))),
            "no grant after the first {n} within {deadline:?}: {what}"
        );
    }

    /// Stops the probe and returns what it saw.
    pub async fn finish(self) -> ProbeReport {
        let _ = self.stop.send(true);
        self.task.await.expect("probe task")
    }
}

/// The client address of the node that calls itself leader, asking every
/// node in `addrs` (each with a short deadline, as some may be paused).
pub async fn find_leader(addrs: &[String]) -> Option<String> {
    let asks = addrs.iter().map(|a| async move {
        let s = tokio::time::timeout(Duration::from_millis(300), status(a))
            .await
            .ok()
            .flatten()?;
        (s.role == "leader").then(|| a.clone())
    });
    futures::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
        .next()
}

/// This build's `raftlock` CLI (the client package's binary), for tests
/// that run the operations guide's commands: `RAFTLOCK_CLI` if set, else
/// the `raftlock` beside this build's `raftlockd`, which `cargo test
/// --workspace` (README's test command) builds in the same run; if there
/// is none (`cargo test -p raftlock-node` on a fresh target directory),
/// cargo builds it once.
pub fn raftlock_cli() -> PathBuf {
    raftlock_testkit::bins::workspace_bin(
        "raftlock-client",
        "raftlock",
        std::path::Path::new(env!("CARGO_BIN_EXE_raftlockd")),
        "RAFTLOCK_CLI",
        false,
    )
}
