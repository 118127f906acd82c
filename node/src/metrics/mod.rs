//! Prometheus metrics: counters kept by the node, gauges read at scrape
//! time, served as text on a separate HTTP port (`GET /metrics`).
//!
//! A leaf module: the apply path and the network count into it through
//! enum keys ([`Counter`], [`RaftRpc`], [`Method`]), and whoever serves it
//! supplies the gauges ([`Gauges`]) at scrape time, so it knows nothing of
//! Raft or the lock table.

pub mod stages;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

pub mod process;
mod render;

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
mod tests;
