//! Prometheus metrics: counters kept by the node, gauges read at scrape
//! time, served as text on a separate HTTP port (`GET /metrics`).
//!
//! A leaf module: the apply path and the network count into it through
//! enum keys ([`Counter`], [`RaftRpc`], [`Method`]), and whoever serves it
//! supplies the gauges ([`Gauges`]) at scrape time, so it knows nothing of
//! Raft or the lock table.

pub mod stages;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

pub mod process;

/// Buckets in every histogram.
const BUCKETS: usize = 12;

/// Upper bounds of the request-latency buckets, in seconds.
pub const LATENCY_BUCKETS: [f64; BUCKETS] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// Upper bounds of the log-append and fsync buckets, in seconds: from a
/// fast SSD's tens of microseconds to a stalled disk's second.
pub const DISK_BUCKETS: [f64; BUCKETS] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// Upper bounds of the lock wait and hold buckets, in seconds: from a
/// millisecond to an hour.
pub const LOCK_TIME_BUCKETS: [f64; BUCKETS] = [
    0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0,
];

/// Default depth of the `prefix` label of the lock wait and hold
/// histograms: the first `/`-separated segment of a name.
pub const DEFAULT_PREFIX_DEPTH: usize = 1;

/// Default cap on distinct `prefix` labels.
pub const DEFAULT_MAX_PREFIX_LABELS: usize = 100;

/// The largest cap a node may be configured with.
pub const MAX_PREFIX_LABELS: usize = 1000;

/// The `prefix` label of names whose prefix came after the cap was
/// reached.
pub const OVERFLOW_PREFIX: &str = "_other";

/// How lock names become the `prefix` label of the lock wait and hold
/// histograms, so that a million names cannot make a million series.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixLabels {
    /// How many `/`-separated segments of a name the label keeps (0: one
    /// label, "", for every name).
    pub depth: usize,
    /// Distinct labels at most (1..=[`MAX_PREFIX_LABELS`]); names past it
    /// are counted under [`OVERFLOW_PREFIX`].
    pub max: usize,
}

impl Default for PrefixLabels {
    fn default() -> Self {
        PrefixLabels {
            depth: DEFAULT_PREFIX_DEPTH,
            max: DEFAULT_MAX_PREFIX_LABELS,
        }
    }
}

impl PrefixLabels {
    /// The first `depth` segments of `name`, with the `/` after them if
    /// the name goes on ("jobs/nightly/7" at depth 1: "jobs/"; "demo":
    /// "demo").
    pub fn prefix_of(self, name: &str) -> &str {
        if self.depth == 0 {
            return "";
        }
        match name.match_indices('/').nth(self.depth - 1) {
            Some((i, _)) => &name[..=i],
            None => name,
        }
    }
}

/// A Prometheus label value: `\`, `"` and newlines escaped.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The lock wait and hold histograms, one pair per prefix label.
#[derive(Default)]
struct LockTimes {
    labels: Mutex<PrefixLabels>,
    /// prefix label → (wait, hold).
    by_prefix: Mutex<BTreeMap<String, Arc<(Histogram, Histogram)>>>,
}

impl LockTimes {
    fn pair(&self, name: &str) -> Arc<(Histogram, Histogram)> {
        let labels = *self.labels.lock().expect("metrics lock poisoned");
        let prefix = labels.prefix_of(name);
        let mut map = self.by_prefix.lock().expect("metrics lock poisoned");
        if let Some(p) = map.get(prefix) {
            return p.clone();
        }
        let counted = map.len() - usize::from(map.contains_key(OVERFLOW_PREFIX));
        let key = if counted < labels.max {
            prefix
        } else {
            OVERFLOW_PREFIX
        };
        map.entry(key.to_string()).or_default().clone()
    }
}

/// The RPC methods whose latency is recorded: an enum, so a request cannot
/// be timed under a name that records nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// `Locks.OpenSession`.
    OpenSession,
    /// `Locks.KeepAlive` (a stream).
    KeepAlive,
    /// `Locks.CloseSession`.
    CloseSession,
    /// `Locks.Acquire` (includes the wait).
    Acquire,
    /// `Locks.Release`.
    Release,
    /// `Locks.Cancel`.
    Cancel,
    /// `Locks.Describe`.
    Describe,
    /// `Locks.List`.
    List,
    /// `Locks.CheckFence`.
    CheckFence,
    /// `Locks.Watch` (a stream).
    Watch,
    /// `Locks.Lock` (includes the wait).
    Lock,
    /// `Locks.Unlock`.
    Unlock,
    /// `Locks.SetSessionTtl`.
    SetSessionTtl,
    /// `Locks.Upgrade` (includes the wait).
    Upgrade,
    /// `Locks.Downgrade`.
    Downgrade,
    /// `Locks.AcquireAll` (includes the wait).
    AcquireAll,
    /// `Cluster.Status`.
    Status,
    /// `Cluster.Members`.
    Members,
    /// `Cluster.AddNode`.
    AddNode,
    /// `Cluster.RemoveNode`.
    RemoveNode,
    /// `Cluster.Backup`.
    Backup,
    /// `Cluster.Restore`.
    Restore,
    /// `Cluster.TransferLeader`.
    TransferLeader,
    /// `Cluster.RevokeSession`.
    RevokeSession,
}

impl Method {
    /// Every method, in the order of [`Metrics`]' histograms.
    pub const ALL: [Method; 24] = [
        Method::OpenSession,
        Method::KeepAlive,
        Method::CloseSession,
        Method::Acquire,
        Method::Release,
        Method::Cancel,
        Method::Describe,
        Method::List,
        Method::CheckFence,
        Method::Watch,
        Method::Lock,
        Method::Unlock,
        Method::SetSessionTtl,
        Method::Upgrade,
        Method::Downgrade,
        Method::AcquireAll,
        Method::Status,
        Method::Members,
        Method::AddNode,
        Method::RemoveNode,
        Method::Backup,
        Method::Restore,
        Method::TransferLeader,
        Method::RevokeSession,
    ];

    /// The gRPC method name, as the `method` label shows it.
    pub fn name(self) -> &'static str {
        match self {
            Method::OpenSession => "OpenSession",
            Method::KeepAlive => "KeepAlive",
            Method::CloseSession => "CloseSession",
            Method::Acquire => "Acquire",
            Method::Release => "Release",
            Method::Cancel => "Cancel",
            Method::Describe => "Describe",
            Method::List => "List",
            Method::CheckFence => "CheckFence",
            Method::Watch => "Watch",
            Method::Lock => "Lock",
            Method::Unlock => "Unlock",
            Method::SetSessionTtl => "SetSessionTtl",
            Method::Upgrade => "Upgrade",
            Method::Downgrade => "Downgrade",
            Method::AcquireAll => "AcquireAll",
            Method::Status => "Status",
            Method::Members => "Members",
            Method::AddNode => "AddNode",
            Method::RemoveNode => "RemoveNode",
            Method::Backup => "Backup",
            Method::Restore => "Restore",
            Method::TransferLeader => "TransferLeader",
            Method::RevokeSession => "RevokeSession",
        }
    }
}

/// The outgoing Raft RPCs, whose errors are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RaftRpc {
    /// `Raft.AppendEntries`.
    AppendEntries,
    /// `Raft.Vote`.
    Vote,
    /// `Raft.InstallSnapshot`.
    InstallSnapshot,
    /// `Raft.PreVote`.
    PreVote,
    /// `Raft.TransferLeader`.
    TransferLeader,
}

impl RaftRpc {
    /// Every RPC, in the order of [`Metrics`]' error counters.
    pub const ALL: [RaftRpc; 5] = [
        RaftRpc::AppendEntries,
        RaftRpc::Vote,
        RaftRpc::InstallSnapshot,
        RaftRpc::PreVote,
        RaftRpc::TransferLeader,
    ];

    /// The name the `rpc` label shows.
    pub fn name(self) -> &'static str {
        match self {
            RaftRpc::AppendEntries => "append_entries",
            RaftRpc::Vote => "vote",
            RaftRpc::InstallSnapshot => "install_snapshot",
            RaftRpc::PreVote => "pre_vote",
            RaftRpc::TransferLeader => "transfer_leader",
        }
    }
}

/// What the node counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// A grant applied.
    Grants,
    /// A release by its holder applied.
    Releases,
    /// A session expiry applied.
    Expiries,
    /// A queued acquire that timed out.
    WaitTimeouts,
    /// A `KeepAlive` stream opened.
    KeepAliveStreams,
    /// A `KeepAlive` stream ended (the client closed it, or it failed).
    KeepAliveStreamsEnded,
    /// A session's lease renewed by a keep-alive.
    KeepAlives,
    /// A session revoked by an administrator, applied.
    SessionsRevoked,
    /// This node learned of a new leader (another node than the last one
    /// it knew).
    LeaderChanges,
    /// The Raft core stopped on a fatal error (the process exits next).
    FatalErrors,
}

impl Counter {
    /// Every counter, in the order of [`Metrics`]' counters.
    pub const ALL: [Counter; 10] = [
        Counter::Grants,
        Counter::Releases,
        Counter::Expiries,
        Counter::WaitTimeouts,
        Counter::KeepAliveStreams,
        Counter::KeepAliveStreamsEnded,
        Counter::KeepAlives,
        Counter::SessionsRevoked,
        Counter::LeaderChanges,
        Counter::FatalErrors,
    ];

    /// The metric's name and help text.
    fn describe(self) -> (&'static str, &'static str) {
        match self {
            Counter::Grants => ("raftlock_grants_total", "Grants applied on this node."),
            Counter::Releases => (
                "raftlock_releases_total",
                "Releases by holders applied on this node.",
            ),
            Counter::Expiries => (
                "raftlock_expiries_total",
                "Session expiries (leases that ran out, not closes or revokes) applied on this node.",
            ),
            Counter::WaitTimeouts => (
                "raftlock_wait_timeouts_total",
                "Queued acquires that timed out.",
            ),
            Counter::KeepAliveStreams => (
                "raftlock_keepalive_streams_total",
                "KeepAlive streams opened on this node.",
            ),
            Counter::KeepAliveStreamsEnded => (
                "raftlock_keepalive_streams_ended_total",
                "KeepAlive streams ended on this node (opened minus ended is open now).",
            ),
            Counter::KeepAlives => (
                "raftlock_keepalives_total",
                "Session leases renewed by keep-alives on this node.",
            ),
            Counter::SessionsRevoked => (
                "raftlock_sessions_revoked_total",
                "Sessions revoked by an administrator (Cluster.RevokeSession), applied on this node.",
            ),
            Counter::LeaderChanges => (
                "raftlock_leader_changes_total",
                "Times this node learned of a leader other than the last one it knew.",
            ),
            Counter::FatalErrors => (
                "raftlock_fatal_errors_total",
                "Fatal errors of this node's Raft core (the process exits after one).",
            ),
        }
    }
}

/// The values read at scrape time, from Raft and the lock table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gauges {
    /// Current Raft term.
    pub term: u64,
    /// Whether this node is the leader.
    pub is_leader: bool,
    /// The leader this node knows (0: none).
    pub leader_id: u64,
    /// Highest log index known committed.
    pub commit_index: u64,
    /// Highest log index applied.
    pub applied_index: u64,
    /// Last log index.
    pub last_log_index: u64,
    /// Open sessions.
    pub sessions: u64,
    /// Held grants (locks and semaphore permits).
    pub held_locks: u64,
    /// Queued acquires.
    pub waiters: u64,
    /// Largest fence handed out.
    pub last_fence: u64,
    /// Blocking acquires parked on this node.
    pub parked_requests: u64,
    /// As leader: how each other member's replication stands.
    pub peers: Vec<PeerGauges>,
    /// The data directory's size and its file system's space, if they
    /// could be read.
    pub disk: Option<Disk>,
    /// `Watch` streams open on this node.
    pub watch_streams: u64,
    /// The most `Watch` streams this node serves at once.
    pub watch_streams_max: u64,
    /// Queued requests of the longest queue (one name).
    pub longest_queue: u64,
    /// How long the oldest live grant has been held (as this process saw
    /// it applied).
    pub oldest_grant: Duration,
    /// How long the oldest queued request has waited.
    pub oldest_wait: Duration,
}

/// What a leader knows of one other member.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerGauges {
    /// The member's id.
    pub id: u64,
    /// Log entries the leader has that the member is not known to have.
    pub lag_entries: u64,
    /// Since the member last acknowledged a heartbeat or an append of this
    /// leader (`None`: not since this node became leader).
    pub since_contact: Option<Duration>,
}

/// The data directory and the file system it is on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Disk {
    /// Bytes of the files under the data directory.
    pub data_bytes: u64,
    /// Bytes an unprivileged process may still write on its file system.
    pub free_bytes: u64,
    /// The file system's size in bytes.
    pub size_bytes: u64,
}

/// A Prometheus histogram of durations; its bucket bounds are given where
/// it is observed and rendered (one of [`LATENCY_BUCKETS`],
/// [`DISK_BUCKETS`]).
#[derive(Default)]
struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    fn observe(&self, bounds: &[f64; BUCKETS], d: Duration) {
        let secs = d.as_secs_f64();
        for (i, le) in bounds.iter().enumerate() {
            if secs <= *le {
                self.buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// The histogram's series, `labels` (`key="value",` pairs, each
    /// followed by a comma, or empty) on every one.
    fn render(&self, out: &mut String, name: &str, labels: &str, bounds: &[f64; BUCKETS]) {
        for (b, le) in bounds.iter().enumerate() {
            let v = self.buckets[b].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{le}\"}} {v}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {count}");
        let labels = match labels.trim_end_matches(',') {
            "" => String::new(),
            labels => format!("{{{labels}}}"),
        };
        let _ = writeln!(out, "{name}_sum{labels} {sum}");
        let _ = writeln!(out, "{name}_count{labels} {count}");
    }
}

/// One node's counters.
#[derive(Default)]
pub struct Metrics {
    counters: [AtomicU64; Counter::ALL.len()],
    requests: [Histogram; Method::ALL.len()],
    /// Failed outgoing Raft RPCs by peer and RPC (the RPC's slot in
    /// [`RaftRpc::ALL`]).
    raft_rpc_errors: Mutex<BTreeMap<(u64, usize), u64>>,
    /// Log appends, from the store taking the entries to their being on
    /// stable storage.
    log_append: Histogram,
    /// Syncs of the log to stable storage (sled's flush and the `fsync`s
    /// after it).
    fsync: Histogram,
    /// Where writes spend their time (`GET /debug/stages`).
    pub stages: stages::Stages,
    /// Keep-alive answers: from the ask's arrival to its answer.
    keepalive_answer: Histogram,
    /// Lock waits and holds by name prefix.
    lock_times: LockTimes,
}

/// Records a request's latency when dropped.
pub struct Timer<'a> {
    histogram: &'a Histogram,
    start: Instant,
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        self.histogram
            .observe(&LATENCY_BUCKETS, self.start.elapsed());
    }
}

impl Metrics {
    /// A timer for `method`.
    pub fn timer(&self, method: Method) -> Timer<'_> {
        // `ALL` lists every variant in declaration order.
        Timer {
            histogram: &self.requests[method as usize],
            start: Instant::now(),
        }
    }

    /// Adds one to `counter`.
    pub fn count(&self, counter: Counter) {
        self.counters[counter as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The value of `counter`.
    pub fn get(&self, counter: Counter) -> u64 {
        self.counters[counter as usize].load(Ordering::Relaxed)
    }

    /// Records a log append that took `d` from the store taking its
    /// entries to their being durable.
    pub fn log_append(&self, d: Duration) {
        self.log_append.observe(&DISK_BUCKETS, d);
    }

    /// Sets how names become `prefix` labels (at start, before any is
    /// observed).
    pub fn set_prefix_labels(&self, labels: PrefixLabels) {
        *self
            .lock_times
            .labels
            .lock()
            .expect("metrics lock poisoned") = labels;
    }

    /// Records that a queued acquire of `name` waited `d` for its grant.
    pub fn lock_wait(&self, name: &str, d: Duration) {
        self.lock_times.pair(name).0.observe(&LOCK_TIME_BUCKETS, d);
    }

    /// Records that a grant of `name` was held `d`.
    pub fn lock_hold(&self, name: &str, d: Duration) {
        self.lock_times.pair(name).1.observe(&LOCK_TIME_BUCKETS, d);
    }

    fn render_lock_times(&self, out: &mut String) {
        let map = self
            .lock_times
            .by_prefix
            .lock()
            .expect("metrics lock poisoned");
        for (name, help, wait) in [
            (
                "raftlock_lock_wait_seconds",
                "How long queued acquires waited for their grant, by name prefix (as this node \
                 applied them; acquires granted at once are not counted).",
                true,
            ),
            (
                "raftlock_lock_hold_seconds",
                "How long grants were held until they ended (release, close, expiry, revoke), \
                 by name prefix (as this node applied them).",
                false,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (prefix, pair) in map.iter() {
                let labels = format!("prefix=\"{}\",", escape_label(prefix));
                let h = if wait { &pair.0 } else { &pair.1 };
                h.render(out, name, &labels, &LOCK_TIME_BUCKETS);
            }
        }
    }

    /// Records a keep-alive answered `d` after the ask arrived.
    pub fn keepalive_answer(&self, d: Duration) {
        self.keepalive_answer.observe(&LATENCY_BUCKETS, d);
    }

    /// Records a sync of the log that took `d`.
    pub fn fsync(&self, d: Duration) {
        self.fsync.observe(&DISK_BUCKETS, d);
    }

    /// Counts a failed outgoing Raft RPC to `peer`.
    pub fn raft_rpc_error(&self, rpc: RaftRpc, peer: u64) {
        let mut errors = self.raft_rpc_errors.lock().expect("metrics lock poisoned");
        *errors.entry((peer, rpc as usize)).or_default() += 1;
    }

    /// The Prometheus text exposition of this node, with `gauges` read by
    /// the caller.
    pub fn render(&self, gauges: &Gauges) -> String {
        let g = gauges;
        let mut out = String::new();
        let mut gauge = |name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge("raftlock_term", "Current Raft term.", g.term);
        gauge(
            "raftlock_is_leader",
            "1 if this node is the leader.",
            u64::from(g.is_leader),
        );
        gauge(
            "raftlock_leader_id",
            "Id of the leader this node knows (0: none, or one without its quorum).",
            g.leader_id,
        );
        gauge(
            "raftlock_commit_index",
            "Highest log index known committed.",
            g.commit_index,
        );
        gauge(
            "raftlock_applied_index",
            "Highest log index applied.",
            g.applied_index,
        );
        gauge(
            "raftlock_last_log_index",
            "Last log index.",
            g.last_log_index,
        );
        gauge("raftlock_sessions", "Open sessions.", g.sessions);
        gauge(
            "raftlock_held_locks",
            "Held grants (locks and semaphore permits).",
            g.held_locks,
        );
        gauge("raftlock_waiters", "Queued acquires.", g.waiters);
        gauge(
            "raftlock_last_fence",
            "Largest fence handed out.",
            g.last_fence,
        );
        gauge(
            "raftlock_parked_requests",
            "Blocking acquires parked on this node.",
            g.parked_requests,
        );
        gauge(
            "raftlock_watch_streams",
            "Watch streams open on this node.",
            g.watch_streams,
        );
        gauge(
            "raftlock_watch_streams_max",
            "The most Watch streams this node serves at once (more get RESOURCE_EXHAUSTED).",
            g.watch_streams_max,
        );
        gauge(
            "raftlock_longest_queue",
            "Queued requests of the longest queue (one name) in this node's table.",
            g.longest_queue,
        );
        for (name, help, d) in [
            (
                "raftlock_oldest_grant_seconds",
                "How long the longest-held live grant has been held, since this node applied it \
                 (0: none; after a restart, since it re-applied it from its log; grants from a snapshot are not counted).",
                g.oldest_grant,
            ),
            (
                "raftlock_oldest_wait_seconds",
                "How long the longest-waiting queued request has waited, since this node applied \
                 it (0: none; as for raftlock_oldest_grant_seconds).",
                g.oldest_wait,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}",
                d.as_secs_f64()
            );
        }
        for counter in Counter::ALL {
            let (name, help) = counter.describe();
            let v = self.counters[counter as usize].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP raftlock_raft_rpc_errors_total Failed outgoing Raft RPCs, by peer.\n# TYPE raftlock_raft_rpc_errors_total counter"
        );
        let errors = self
            .raft_rpc_errors
            .lock()
            .expect("metrics lock poisoned")
            .clone();
        for ((peer, rpc), v) in errors {
            let rpc = RaftRpc::ALL[rpc].name();
            let _ = writeln!(
                out,
                "raftlock_raft_rpc_errors_total{{peer=\"{peer}\",rpc=\"{rpc}\"}} {v}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP raftlock_request_duration_seconds gRPC request latency by method.\n# TYPE raftlock_request_duration_seconds histogram"
        );
        for (i, method) in Method::ALL.iter().enumerate() {
            let labels = format!("method=\"{}\",", method.name());
            self.requests[i].render(
                &mut out,
                "raftlock_request_duration_seconds",
                &labels,
                &LATENCY_BUCKETS,
            );
        }
        for (name, help, h) in [
            (
                "raftlock_log_append_duration_seconds",
                "Log appends, from the store taking the entries until they are on stable storage.",
                &self.log_append,
            ),
            (
                "raftlock_fsync_duration_seconds",
                "Syncs of the log to stable storage (flush and fsync).",
                &self.fsync,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            h.render(&mut out, name, "", &DISK_BUCKETS);
        }
        let name = "raftlock_keepalive_answer_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Keep-alive answers on this node (the leader), from the ask's arrival \
             to its answer (includes the quorum check).\n# TYPE {name} histogram"
        );
        self.keepalive_answer
            .render(&mut out, name, "", &LATENCY_BUCKETS);
        self.render_lock_times(&mut out);
        render_peers(&mut out, &g.peers);
        if let Some(disk) = &g.disk {
            let mut gauge = |name: &str, help: &str, v: u64| {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
            };
            gauge(
                "raftlock_data_size_bytes",
                "Bytes of the files under the data directory.",
                disk.data_bytes,
            );
            gauge(
                "raftlock_disk_free_bytes",
                "Bytes still free for raftlockd on the data directory's file system.",
                disk.free_bytes,
            );
            gauge(
                "raftlock_disk_size_bytes",
                "Size of the data directory's file system in bytes.",
                disk.size_bytes,
            );
        }
        let _ = writeln!(
            out,
            "# HELP raftlock_build_info The running build (always 1).\n# TYPE raftlock_build_info gauge\nraftlock_build_info{{version=\"{}\",profile=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION"),
            if cfg!(debug_assertions) { "debug" } else { "release" }
        );
        if let Some(p) = process::Process::read() {
            p.render(&mut out);
        }
        out
    }
}

/// A leader's per-peer series: replication lag and time since contact.
fn render_peers(out: &mut String, peers: &[PeerGauges]) {
    let _ = writeln!(
        out,
        "# HELP raftlock_peer_replication_lag_entries As leader: log entries a member is not known to have yet.\n# TYPE raftlock_peer_replication_lag_entries gauge"
    );
    for p in peers {
        let _ = writeln!(
            out,
            "raftlock_peer_replication_lag_entries{{peer=\"{}\"}} {}",
            p.id, p.lag_entries
        );
    }
    let _ = writeln!(
        out,
        "# HELP raftlock_peer_last_contact_seconds As leader: seconds since a member last acknowledged it (+Inf: not since it became leader).\n# TYPE raftlock_peer_last_contact_seconds gauge"
    );
    for p in peers {
        let since = p
            .since_contact
            .map_or("+Inf".to_string(), |d| d.as_secs_f64().to_string());
        let _ = writeln!(
            out,
            "raftlock_peer_last_contact_seconds{{peer=\"{}\"}} {since}",
            p.id
        );
    }
}

/// What the metrics port asks of the node, at request time.
pub trait Source: Send + Sync + 'static {
    /// The gauges, read once per scrape.
    fn gauges(&self) -> Gauges;
    /// `Ok` while the process works (its Raft core runs); else why not.
    fn live(&self) -> Result<(), String>;
    /// `Ok` while the node can serve now; else why not.
    fn ready(&self) -> Result<(), String>;
    /// `Ok` if a request whose `Authorization` header is `authorization`
    /// may change what the port shows (reset the stage breakdown): anyone
    /// without access control, an admin with it. Else why not.
    fn may_change(&self, authorization: Option<&str>) -> Result<(), Refused>;
}

/// Why [`Source::may_change`] refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// No valid credentials (answered 401).
    Unauthenticated(String),
    /// Valid credentials without the permission (answered 403).
    PermissionDenied(String),
}

/// `200 ok` or `503` with the reason, for a probe.
fn probe(result: Result<(), String>) -> (axum::http::StatusCode, String) {
    match result {
        Ok(()) => (axum::http::StatusCode::OK, "ok\n".into()),
        Err(why) => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            format!("{why}\n"),
        ),
    }
}

/// Serves the metrics port on `listener` until `shutdown` resolves:
///
/// * `GET /metrics`: Prometheus text (the gauges read from `source` once
///   per scrape);
/// * `GET /livez`: `200 ok` while the process works (its Raft core runs),
///   else `503` and why;
/// * `GET /readyz`: `200 ok` while the node can serve now, else `503` and
///   why;
/// * `GET /debug/stages`: the write-stage breakdown (see [`stages`]) as
///   JSON, and `POST /debug/stages/reset` to empty it (with access control
///   on, only for an admin's bearer token: `401`/`403` otherwise);
/// * and whatever `extra` routes (the operator's console, `/ui`).
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    source: Arc<dyn Source>,
    extra: axum::Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::http::{HeaderMap, StatusCode};
    let (m1, m2, m3) = (metrics.clone(), metrics.clone(), metrics);
    let (s1, s2, s3, s4) = (source.clone(), source.clone(), source.clone(), source);
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let body = m1.render(&s1.gauges());
                async move { ([("content-type", "text/plain; version=0.0.4")], body) }
            }),
        )
        .route(
            "/livez",
            axum::routing::get(move || {
                let answer = probe(s2.live());
                async move { answer }
            }),
        )
        .route(
            "/readyz",
            axum::routing::get(move || {
                let answer = probe(s3.ready());
                async move { answer }
            }),
        )
        .route(
            "/debug/stages",
            axum::routing::get(move || {
                let body = serde_json::to_string(&m2.stages.report())
                    .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
                async move { ([("content-type", "application/json")], body) }
            }),
        )
        .route(
            "/debug/stages/reset",
            axum::routing::post(move |headers: HeaderMap| {
                let authorization = headers
                    .get(axum::http::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok());
                let answer = match s4.may_change(authorization) {
                    Ok(()) => {
                        m3.stages.reset();
                        (StatusCode::OK, "reset\n".to_string())
                    }
                    Err(Refused::Unauthenticated(why)) => {
                        (StatusCode::UNAUTHORIZED, format!("{why}\n"))
                    }
                    Err(Refused::PermissionDenied(why)) => {
                        (StatusCode::FORBIDDEN, format!("{why}\n"))
                    }
                };
                async move { answer }
            }),
        )
        .merge(extra);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_labels_keep_the_first_segments() {
        let at = |depth| PrefixLabels { depth, max: 10 };
        assert_eq!(at(1).prefix_of("jobs/nightly/7"), "jobs/");
        assert_eq!(at(2).prefix_of("jobs/nightly/7"), "jobs/nightly/");
        assert_eq!(at(3).prefix_of("jobs/nightly/7"), "jobs/nightly/7");
        assert_eq!(at(1).prefix_of("demo"), "demo");
        assert_eq!(at(1).prefix_of("/x"), "/");
        assert_eq!(at(0).prefix_of("jobs/nightly"), "");
        // Multi-byte names cut at a '/' only, so always on a char boundary.
        assert_eq!(at(1).prefix_of("zürich/é"), "zürich/");
    }

    #[test]
    fn the_prefix_label_cap_holds_at_its_edge() {
        let m = Metrics::default();
        m.set_prefix_labels(PrefixLabels { depth: 1, max: 3 });
        // Three distinct prefixes fill the cap exactly.
        for name in ["a/1", "b/1", "c/1", "a/2"] {
            m.lock_hold(name, Duration::from_millis(5));
        }
        let text = m.render(&Gauges::default());
        for p in ["a/", "b/", "c/"] {
            assert!(
                text.contains(&format!(
                    "raftlock_lock_hold_seconds_count{{prefix=\"{p}\"}}"
                )),
                "{p}: {text}"
            );
        }
        assert!(text.contains("raftlock_lock_hold_seconds_count{prefix=\"a/\"} 2"));
        assert!(!text.contains(OVERFLOW_PREFIX), "{text}");
        // The fourth, and every one after, goes to the overflow label;
        // known prefixes keep their own.
        for name in ["d/1", "e/1", "f/\"quoted\"/1", "b/2"] {
            m.lock_wait(name, Duration::from_millis(5));
        }
        let text = m.render(&Gauges::default());
        assert!(
            text.contains("raftlock_lock_wait_seconds_count{prefix=\"_other\"} 3"),
            "{text}"
        );
        assert!(text.contains("raftlock_lock_wait_seconds_count{prefix=\"b/\"} 1"));
        let labels: std::collections::BTreeSet<&str> = text
            .lines()
            .filter(|l| l.starts_with("raftlock_lock_wait_seconds_count"))
            .collect();
        assert_eq!(
            labels.len(),
            4,
            "three prefixes and the overflow: {labels:?}"
        );
        assert!(text.contains("# HELP raftlock_lock_wait_seconds "));
        assert!(text.contains("# HELP raftlock_lock_hold_seconds "));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn every_metric_has_help() {
        let m = Metrics::default();
        m.lock_wait("x/1", Duration::from_millis(1));
        let text = m.render(&Gauges::default());
        let mut helped = std::collections::BTreeSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                helped.insert(rest.split(' ').next().unwrap_or("").to_string());
            }
        }
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let series = line.split(['{', ' ']).next().unwrap_or("");
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| series.strip_suffix(s).filter(|f| helped.contains(*f)))
                .unwrap_or(series);
            assert!(helped.contains(family), "{series} has no # HELP");
        }
        for name in [
            "raftlock_sessions_revoked_total",
            "raftlock_leader_changes_total",
            "raftlock_fatal_errors_total",
            "raftlock_keepalive_answer_seconds",
            "raftlock_watch_streams",
            "raftlock_watch_streams_max",
            "raftlock_longest_queue",
            "raftlock_expiries_total",
        ] {
            assert!(helped.contains(name), "{name} missing");
        }
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.observe(&LATENCY_BUCKETS, Duration::from_micros(300));
        h.observe(&LATENCY_BUCKETS, Duration::from_millis(30));
        assert_eq!(h.buckets[0].load(Ordering::Relaxed), 1, "le 0.5 ms");
        assert_eq!(h.buckets[6].load(Ordering::Relaxed), 2, "le 50 ms");
        assert_eq!(h.count.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn disk_peer_process_and_build_series_show_in_the_text() {
        let m = Metrics::default();
        m.fsync(Duration::from_micros(80));
        m.fsync(Duration::from_millis(2));
        m.log_append(Duration::from_millis(3));
        let text = m.render(&Gauges {
            peers: vec![
                PeerGauges {
                    id: 2,
                    lag_entries: 0,
                    since_contact: Some(Duration::from_millis(40)),
                },
                PeerGauges {
                    id: 3,
                    lag_entries: 17,
                    since_contact: None,
                },
            ],
            disk: Some(Disk {
                data_bytes: 1234,
                free_bytes: 5000,
                size_bytes: 9000,
            }),
            ..Gauges::default()
        });
        for series in [
            "\nraftlock_fsync_duration_seconds_bucket{le=\"0.0001\"} 1\n",
            "\nraftlock_fsync_duration_seconds_bucket{le=\"0.0025\"} 2\n",
            "\nraftlock_fsync_duration_seconds_bucket{le=\"+Inf\"} 2\n",
            "\nraftlock_fsync_duration_seconds_count 2\n",
            "\nraftlock_log_append_duration_seconds_bucket{le=\"0.0025\"} 0\n",
            "\nraftlock_log_append_duration_seconds_bucket{le=\"0.005\"} 1\n",
            "\nraftlock_log_append_duration_seconds_sum 0.003\n",
            "\nraftlock_peer_replication_lag_entries{peer=\"3\"} 17\n",
            "\nraftlock_peer_last_contact_seconds{peer=\"2\"} 0.04\n",
            "\nraftlock_peer_last_contact_seconds{peer=\"3\"} +Inf\n",
            "\nraftlock_data_size_bytes 1234\n",
            "\nraftlock_disk_free_bytes 5000\n",
            "\nraftlock_disk_size_bytes 9000\n",
            "\nprocess_cpu_seconds_total ",
            "\nprocess_resident_memory_bytes ",
            "\nprocess_open_fds ",
            "\nprocess_start_time_seconds ",
        ] {
            assert!(text.contains(series), "missing {series:?} in:\n{text}");
        }
        let build = format!(
            "\nraftlock_build_info{{version=\"{}\",profile=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION"),
            if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            }
        );
        assert!(text.contains(&build), "{text}");
        let without = m.render(&Gauges::default());
        assert!(
            !without.contains("raftlock_disk_free_bytes ")
                && !without.contains("raftlock_peer_last_contact_seconds{"),
            "no disk or peer series where they are unknown:\n{without}"
        );
    }

    #[test]
    fn every_key_has_its_slot_and_shows_in_the_text() {
        let m = Metrics::default();
        for (i, rpc) in RaftRpc::ALL.iter().enumerate() {
            assert_eq!(*rpc as usize, i, "{rpc:?} out of order in ALL");
            m.raft_rpc_error(*rpc, 2);
        }
        for (i, counter) in Counter::ALL.iter().enumerate() {
            assert_eq!(*counter as usize, i, "{counter:?} out of order in ALL");
            m.count(*counter);
        }
        let text = m.render(&Gauges {
            term: 7,
            ..Gauges::default()
        });
        assert!(text.contains("\nraftlock_term 7\n"), "{text}");
        assert!(
            text.contains("raftlock_raft_rpc_errors_total{peer=\"2\",rpc=\"vote\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("\nraftlock_wait_timeouts_total 1\n"),
            "{text}"
        );
        assert!(text.contains("\nraftlock_grants_total 1\n"), "{text}");
        for (i, method) in Method::ALL.iter().enumerate() {
            assert_eq!(*method as usize, i, "{method:?} out of order in ALL");
            drop(m.timer(*method));
            assert_eq!(m.requests[i].count.load(Ordering::Relaxed), 1);
        }
    }
}
