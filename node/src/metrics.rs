//! Prometheus metrics: counters kept by the node, gauges read at scrape
//! time, served as text on a separate HTTP port (`GET /metrics`).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::ServerState;

use crate::raft::Raft;
use crate::shared::Shared;
use crate::state::{EndCause, Event};

/// Upper bounds of the request-latency buckets, in seconds.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

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
}

impl Method {
    /// Every method, in the order of [`Metrics`]' histograms.
    pub const ALL: [Method; 16] = [
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
        Method::Status,
        Method::Members,
        Method::AddNode,
        Method::RemoveNode,
        Method::Backup,
        Method::Restore,
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
            Method::Status => "Status",
            Method::Members => "Members",
            Method::AddNode => "AddNode",
            Method::RemoveNode => "RemoveNode",
            Method::Backup => "Backup",
            Method::Restore => "Restore",
        }
    }
}

/// The outgoing Raft RPCs whose errors are counted.
pub const RAFT_RPCS: [&str; 3] = ["append_entries", "vote", "install_snapshot"];

#[derive(Default)]
struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (i, le) in LATENCY_BUCKETS.iter().enumerate() {
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
    grants: AtomicU64,
    releases: AtomicU64,
    expiries: AtomicU64,
    timeouts: AtomicU64,
    requests: [Histogram; Method::ALL.len()],
    raft_rpc_errors: [AtomicU64; RAFT_RPCS.len()],
}

/// Records a request's latency when dropped.
pub struct Timer<'a> {
    histogram: &'a Histogram,
    start: Instant,
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        self.histogram.observe(self.start.elapsed());
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

    /// Counts the grants, releases and expiries in applied events.
    pub fn on_events(&self, events: &[Event]) {
        for e in events {
            match e {
                Event::Granted { .. } => {
                    self.grants.fetch_add(1, Ordering::Relaxed);
                }
                Event::Ended {
                    cause: EndCause::Released,
                    ..
                } => {
                    self.releases.fetch_add(1, Ordering::Relaxed);
                }
                Event::SessionEnded { expired: true, .. } => {
                    self.expiries.fetch_add(1, Ordering::Relaxed);
                }
                Event::Cancelled {
                    cause: crate::state::CancelCause::TimedOut,
                    ..
                } => {
                    self.timeouts.fetch_add(1, Ordering::Relaxed);
                }
                _ => {}
            }
        }
    }

    /// Counts a failed outgoing Raft RPC (`rpc` one of [`RAFT_RPCS`]).
    pub fn raft_rpc_error(&self, rpc: &str) {
        if let Some(i) = RAFT_RPCS.iter().position(|r| *r == rpc) {
            self.raft_rpc_errors[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The Prometheus text exposition of this node.
    pub fn render(&self, raft: &Raft, shared: &Shared, committed: u64) -> String {
        let m = raft.metrics().borrow().clone();
        let stats = shared
            .applied
            .read()
            .expect("applied lock poisoned")
            .table
            .stats();
        let mut out = String::new();
        let mut gauge = |name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge("raftlock_term", "Current Raft term.", m.current_term);
        gauge(
            "raftlock_is_leader",
            "1 if this node is the leader.",
            u64::from(m.state == ServerState::Leader),
        );
        gauge(
            "raftlock_leader_id",
            "Id of the leader this node knows (0: none).",
            m.current_leader.unwrap_or(0),
        );
        gauge(
            "raftlock_commit_index",
            "Highest log index known committed.",
            committed,
        );
        gauge(
            "raftlock_applied_index",
            "Highest log index applied.",
            m.last_applied.map_or(0, |l| l.index),
        );
        gauge(
            "raftlock_last_log_index",
            "Last log index.",
            m.last_log_index.unwrap_or(0),
        );
        gauge("raftlock_sessions", "Open sessions.", stats.sessions);
        gauge(
            "raftlock_held_locks",
            "Held grants (locks and semaphore permits).",
            stats.grants,
        );
        gauge("raftlock_waiters", "Queued acquires.", stats.waiters);
        gauge(
            "raftlock_last_fence",
            "Largest fence handed out.",
            stats.last_fence,
        );
        gauge(
            "raftlock_parked_requests",
            "Blocking acquires parked on this node.",
            shared.waiters.len() as u64,
        );
        let mut counter = |name: &str, help: &str, v: &AtomicU64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        };
        counter(
            "raftlock_grants_total",
            "Grants applied on this node.",
            &self.grants,
        );
        counter(
            "raftlock_releases_total",
            "Releases by holders applied on this node.",
            &self.releases,
        );
        counter(
            "raftlock_expiries_total",
            "Session expiries applied on this node.",
            &self.expiries,
        );
        counter(
            "raftlock_wait_timeouts_total",
            "Queued acquires that timed out.",
            &self.timeouts,
        );
        let _ = writeln!(
            out,
            "# HELP raftlock_raft_rpc_errors_total Failed outgoing Raft RPCs.\n# TYPE raftlock_raft_rpc_errors_total counter"
        );
        for (i, rpc) in RAFT_RPCS.iter().enumerate() {
            let v = self.raft_rpc_errors[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "raftlock_raft_rpc_errors_total{{rpc=\"{rpc}\"}} {v}");
        }
        let _ = writeln!(
            out,
            "# HELP raftlock_request_duration_seconds gRPC request latency by method.\n# TYPE raftlock_request_duration_seconds histogram"
        );
        for (i, method) in Method::ALL.iter().enumerate() {
            let method = method.name();
            let h = &self.requests[i];
            for (b, le) in LATENCY_BUCKETS.iter().enumerate() {
                let v = h.buckets[b].load(Ordering::Relaxed);
                let _ = writeln!(out, "raftlock_request_duration_seconds_bucket{{method=\"{method}\",le=\"{le}\"}} {v}");
            }
            let count = h.count.load(Ordering::Relaxed);
            let sum = h.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
            let _ = writeln!(out, "raftlock_request_duration_seconds_bucket{{method=\"{method}\",le=\"+Inf\"}} {count}");
            let _ = writeln!(
                out,
                "raftlock_request_duration_seconds_sum{{method=\"{method}\"}} {sum}"
            );
            let _ = writeln!(
                out,
                "raftlock_request_duration_seconds_count{{method=\"{method}\"}} {count}"
            );
        }
        out
    }
}

/// Serves `GET /metrics` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    raft: Raft,
    shared: Arc<Shared>,
    committed: Arc<AtomicU64>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let body = metrics.render(&raft, &shared, committed.load(Ordering::Relaxed));
            async move { ([("content-type", "text/plain; version=0.0.4")], body) }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(300));
        h.observe(Duration::from_millis(30));
        assert_eq!(h.buckets[0].load(Ordering::Relaxed), 1, "le 0.5 ms");
        assert_eq!(h.buckets[6].load(Ordering::Relaxed), 2, "le 50 ms");
        assert_eq!(h.count.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn unknown_rpcs_are_ignored_and_every_method_has_its_histogram() {
        let m = Metrics::default();
        m.raft_rpc_error("nope");
        for (i, method) in Method::ALL.iter().enumerate() {
            assert_eq!(*method as usize, i, "{method:?} out of order in ALL");
            drop(m.timer(*method));
            assert_eq!(m.requests[i].count.load(Ordering::Relaxed), 1);
        }
    }
}
