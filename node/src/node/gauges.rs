//! What the metrics port reads of a running node: gauges of Raft, the
//! lock table and the peers, and the liveness and readiness probes.

use super::*;

/// What the metrics port reads of the node: gauges, probes, and who may
/// reset what it shows.
pub(super) struct MetricsSource {
    /// The node's data directory (its size and free space).
    pub(super) data_dir: PathBuf,
    pub(super) raft: Raft,
    pub(super) shared: Arc<Shared>,
    pub(super) leadership: Arc<Leadership>,
    pub(super) auth: Arc<crate::auth::Auth>,
    /// Open `Watch` streams.
    pub(super) watches: Arc<std::sync::atomic::AtomicUsize>,
    /// The console's side table (the oldest grant and wait).
    pub(super) notes: Arc<crate::console::Notes>,
}

impl crate::metrics::Source for MetricsSource {
    fn gauges(&self) -> crate::metrics::Gauges {
        let oldest = self.notes.oldest();
        crate::metrics::Gauges {
            disk: crate::metrics::process::disk(&self.data_dir),
            watch_streams: self.watches.load(std::sync::atomic::Ordering::Relaxed) as u64,
            oldest_grant: oldest.0,
            oldest_wait: oldest.1,
            ..gauges(&self.raft, &self.shared, &self.leadership)
        }
    }

    fn live(&self) -> Result<(), String> {
        self.leadership.live()
    }

    fn ready(&self) -> Result<(), String> {
        self.leadership.ready()
    }

    fn may_change(&self, authorization: Option<&str>) -> Result<(), crate::metrics::Refused> {
        use crate::auth::AuthError;
        use crate::metrics::Refused;
        let mut req = tonic::Request::new(());
        if let Some(value) = authorization {
            let value = value
                .parse()
                .map_err(|_| Refused::Unauthenticated("malformed Authorization header".into()))?;
            req.metadata_mut().insert(crate::auth::AUTHORIZATION, value);
        }
        let refused = |e: AuthError| match e {
            AuthError::PermissionDenied(m) => Refused::PermissionDenied(m),
            other => Refused::Unauthenticated(other.to_string()),
        };
        self.auth
            .caller(&req)
            .map_err(refused)?
            .require_admin()
            .map_err(refused)
    }
}

/// Counts, for `/metrics`, each leader this node learns of that is not the
/// last one it knew, and a fatal stop of the core.
pub(super) async fn count_leader_changes(
    mut view: tokio::sync::watch::Receiver<crate::leader::View>,
    metrics: Arc<crate::metrics::Metrics>,
) {
    let mut last_leader = None;
    let mut fatal = false;
    loop {
        {
            let v = view.borrow_and_update();
            if let Some(l) = v.leader {
                if last_leader != Some(l) {
                    last_leader = Some(l);
                    metrics.count(crate::metrics::Counter::LeaderChanges);
                }
            }
            if v.fatal.is_some() && !fatal {
                fatal = true;
                metrics.count(crate::metrics::Counter::FatalErrors);
            }
        }
        if view.changed().await.is_err() {
            return;
        }
    }
}

/// What `/metrics` shows of Raft and the lock table right now.
fn gauges(raft: &Raft, shared: &Shared, leadership: &Leadership) -> crate::metrics::Gauges {
    let m = raft.metrics().borrow_watched().clone();
    let view = leadership.view();
    let (stats, longest_queue) =
        shared.read(|applied| (applied.table.stats(), applied.table.longest_queue()));
    crate::metrics::Gauges {
        term: view.term,
        is_leader: view.working_leader(),
        leader_id: leadership.exported_leader(&view),
        commit_index: shared.committed.load(std::sync::atomic::Ordering::Relaxed),
        applied_index: m.last_applied.map_or(0, |l| l.index),
        last_log_index: m.last_log_index.unwrap_or(0),
        sessions: stats.sessions,
        held_locks: stats.grants,
        waiters: stats.waiters,
        last_fence: stats.last_fence,
        parked_requests: shared.waiters.len() as u64,
        peers: peer_gauges(&m),
        disk: None,
        watch_streams: 0,
        watch_streams_max: crate::api::locks::MAX_WATCHES as u64,
        longest_queue,
        oldest_grant: Duration::ZERO,
        oldest_wait: Duration::ZERO,
    }
}

/// As leader, each other member's replication lag and time since it last
/// answered, from openraft's replication and heartbeat records (which it
/// keeps only on a leader: elsewhere, none).
fn peer_gauges(m: &crate::raft::RaftMetrics) -> Vec<crate::metrics::PeerGauges> {
    let Some(matched) = &m.replication else {
        return Vec::new();
    };
    let last = m.last_log_index.unwrap_or(0);
    matched
        .iter()
        .filter(|(id, _)| **id != m.id)
        .map(|(id, at)| crate::metrics::PeerGauges {
            id: *id,
            lag_entries: last.saturating_sub(at.as_ref().map_or(0, |l| l.index)),
            since_contact: m
                .heartbeat
                .as_ref()
                .and_then(|h| h.get(id).cloned().flatten())
                .map(|at| openraft::Instant::elapsed(&*at)),
        })
        .collect()
}
