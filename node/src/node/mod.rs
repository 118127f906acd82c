//! One raftlock node: storage, Raft, the lease keeper and the gRPC server,
//! wired together. The caller owns the listening sockets (so tests bind port
//! 0) and decides when to stop.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use openraft::SnapshotPolicy;
use raftlock_proto::v1::cluster_server::ClusterServer;
use raftlock_proto::v1::locks_server::LocksServer;
use raftlock_proto::v1::raft_server::RaftServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::interceptor::InterceptedService;

use crate::api::raft_service::RaftService;
use crate::api::Api;
use crate::apply::snapshot_location::SnapshotLocation;
use crate::apply::state_machine::StateMachineStore;
use crate::apply::Raft;
use crate::apply::Shared;
use crate::leader::Leadership;
use crate::raft::identity::ClusterIdentity;
use crate::raft::log_store::{LogStore, Storage};
use crate::raft::network::Network;
use crate::raft::WatchReceiver as _;
use crate::raft::{LogId, NodeAddrs, NodeId, Vote};
use crate::transport::Listener;

mod gauges;
mod removal;
mod serve;
mod start;

pub use removal::ASK_AFTER_ELECTION_TIMEOUTS;
pub use serve::TLS_FAILURE_LOG_EVERY;

/// Most concurrent gRPC streams (requests, keep-alive and watch streams) on
/// one client connection; past it the client's HTTP/2 stack waits.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 1024;

/// Name of the backup file `raftlockd restore` leaves in a data directory;
/// the node that bootstraps the cluster proposes it once it leads.
pub const RESTORE_FILE: &str = "restore.bin";

/// Name of the file beside [`RESTORE_FILE`] holding the fence bump for that
/// restore, in decimal (absent: the default bump, counted when the backup
/// is applied).
pub const RESTORE_BUMP_FILE: &str = "restore.fence_bump";

/// Proposes the backup at `path` to the new cluster once this node leads it,
/// then renames the file so it is never applied twice.
///
/// It keeps at it for as long as a client would wait for a restore of that
/// size ([`restore_patience`](raftlock_proto::backup::restore_patience)),
/// with one `restore_id` for every attempt (an attempt whose answer was
/// lost after its last part was applied is answered as applied when tried
/// again): an attempt refused because this node is no longer the leader,
/// or cut short because it lost its quorum while parts were pending (a
/// briefly loaded machine), is tried again once it leads again. When
/// another node has taken the leadership meanwhile, this node campaigns for
/// it back ([`Leadership::campaign`](crate::leader::Leadership::campaign)):
/// only it has the file. Anything else the cluster answers (a damaged
/// backup, a cluster that is not empty) ends it as `restore.refused`; a
/// node that gives up leaves the file in place, logged as an error.
async fn seed_from_backup(api: Api, path: PathBuf) {
    // However it ends (applied, refused, given up), client writes are
    // taken from then on.
    struct Restoring(Api);
    impl Drop for Restoring {
        fn drop(&mut self) {
            self.0
                 .0
                .restoring
                .store(false, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let _restoring = Restoring(api.clone());
    let bump_path = path.with_file_name(RESTORE_BUMP_FILE);
    let fence_bump = match std::fs::read_to_string(&bump_path) {
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(bump) => Some(bump),
            Err(e) => {
                tracing::error!(path = %bump_path.display(), error = %e, "restore: bad fence bump; nothing restored");
                return;
            }
        },
        // The default, by the backup's age when it is applied.
        Err(_) => None,
    };
    let snapshot = match std::fs::read(&path) {
        Ok(snapshot) => snapshot,
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "restore: cannot read the backup");
            let _ = std::fs::rename(&path, path.with_extension("refused"));
            return;
        }
    };
    let patience = raftlock_proto::backup::restore_patience(snapshot.len());
    let deadline = tokio::time::Instant::now() + patience;
    let leadership = &api.0.leadership;
    // One id for every attempt.
    let restore_id = crate::random::next_u64() | 1;
    let mut view = leadership.watch();
    let outcome = loop {
        // A working leader: this node (elected or restored, and caught up),
        // or another one this node follows.
        let known = tokio::time::timeout_at(deadline, async {
            view.wait_for(|v| {
                v.working_leader()
                    || (v.role == crate::leader::Role::Follower && v.leader.is_some())
            })
            .await
            .map(|v| v.working_leader())
        })
        .await;
        match known {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => {
                // Another node leads: ask for the leadership back, then give
                // the election a moment before looking again.
                if let Err(e) = leadership.campaign().await {
                    tracing::debug!(error = %e, "restore: campaign failed");
                }
                let _ = tokio::time::timeout(
                    Duration::from_millis(500),
                    view.wait_for(|v| v.working_leader()),
                )
                .await;
                continue;
            }
            _ => {
                tracing::error!(
                    path = %path.display(),
                    ?patience,
                    "restore: this node did not lead the cluster long enough to restore the \
                     backup; restore with `raftlock snapshot restore FILE` instead"
                );
                return;
            }
        }
        match api
            .restore_backup(&snapshot, fence_bump, Some(restore_id))
            .await
        {
            // No longer the leader, or cut off from its quorum while parts
            // were pending: try again once this node leads, until the
            // deadline; then leave the file where it is (a restart tries
            // again).
            Err(e @ (crate::error::Error::NotLeader { .. } | crate::error::Error::Timeout(_))) => {
                if tokio::time::Instant::now() >= deadline {
                    tracing::error!(
                        path = %path.display(),
                        error = %e,
                        ?patience,
                        "restore: gave up; restore with `raftlock snapshot restore FILE` instead"
                    );
                    return;
                }
                tracing::warn!(error = %e, "restore: the attempt did not finish; trying again as leader");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            outcome => break outcome,
        }
    };
    let suffix = match &outcome {
        Ok((sessions, last_fence)) => {
            tracing::info!(sessions, last_fence, "restore: backup applied");
            "applied"
        }
        Err(e) => {
            tracing::error!(error = %e, "restore: backup refused");
            "refused"
        }
    };
    let _ = std::fs::rename(&path, path.with_extension(suffix));
}

/// Most log entries the leader sends a follower in one `AppendEntries`.
/// Each answer on a replication stream has `STREAM_ANSWER_BUDGET` (1 s) at
/// the least; an entry carries at most `MAX_BATCH` commands or one
/// `MAX_RESTORE_PART` of a backup, so this keeps a catching-up follower's
/// RPCs to a few MB that it can take within that time (openraft's default
/// of 300 entries could reach tens of MB and then time out every retry).
pub const MAX_PAYLOAD_ENTRIES: u64 = 32;

/// Largest backup `Backup` sends and `Restore` accepts.
pub const MAX_BACKUP_BYTES: usize = 1 << 30;

const _: () = assert!(
    (MAX_PAYLOAD_ENTRIES as usize)
        * (crate::api::batcher::MAX_BATCH_BYTES + 2 * crate::state::limits::MAX_RESTORE_PART)
        < crate::raft::MAX_RAFT_MESSAGE_BYTES
);

/// Timing and policy of the Raft layer.
#[derive(Clone, Debug)]
pub struct RaftTiming {
    /// Leader heartbeat interval.
    pub heartbeat: Duration,
    /// Election timeout range. openraft also keeps a leader lease of
    /// the upper bound: a follower that knew a leader campaigns only after
    /// `max + random(min..max)` without hearing from it (0.8–1.0 s with the
    /// defaults), and refuses other candidates' votes until `max` has
    /// passed. That lease is what keeps a slow heartbeat from deposing a
    /// healthy leader.
    pub election_timeout: (Duration, Duration),
    /// Build a snapshot (and purge the log behind it) every this many
    /// applied entries.
    pub snapshot_every: u64,
    /// Entries kept in the log behind a snapshot: a follower that lags by
    /// fewer catches up from the log, one further behind is sent the
    /// snapshot.
    pub logs_to_keep: u64,
}

impl Default for RaftTiming {
    fn default() -> Self {
        RaftTiming {
            heartbeat: Duration::from_millis(100),
            election_timeout: (Duration::from_millis(300), Duration::from_millis(500)),
            snapshot_every: 10_000,
            logs_to_keep: 1_000,
        }
    }
}

/// What a node needs to start.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// This node's id (non-zero).
    pub id: NodeId,
    /// The address clients (and peers, without `peer_advertise`) reach
    /// this node at.
    pub advertise: String,
    /// The address peers reach this node's separate peer listener at
    /// (`None`: no separate listener; the Raft service is served on the
    /// client listener). Given exactly when [`Listeners::peer`] is.
    pub peer_advertise: Option<String>,
    /// Where the node keeps its data.
    pub data_dir: PathBuf,
    /// Initial members (including this node) to bootstrap with, if `init`.
    pub peers: BTreeMap<NodeId, NodeAddrs>,
    /// Bootstrap a new cluster from `peers` if this node has no data yet.
    pub init: bool,
    /// Raft timing.
    pub timing: RaftTiming,
    /// Dial these addresses for these peers instead of their advertised
    /// ones (for fault-injection proxies; empty in production).
    pub dial: BTreeMap<NodeId, String>,
    /// TLS for clients and peers (`None`: plaintext).
    pub tls: Option<crate::tls::TlsOptions>,
    /// Access control (off by default; see [`crate::auth`]).
    pub auth: Arc<crate::auth::Auth>,
    /// Faults injected into the log's storage (tests only; none by
    /// default).
    pub storage_faults: crate::raft::log_store::StorageFaults,
    /// How lock names become the `prefix` label of the lock wait and hold
    /// histograms.
    pub prefix_labels: crate::metrics::PrefixLabels,
    /// Dial peers over this transport instead of TCP (a simulator's
    /// network; `None` in production).
    pub connector: Option<crate::transport::Connector>,
    /// Where the log is kept: sled in `data_dir` (the default), or a
    /// simulated disk (simulators).
    pub storage: crate::raft::log_store::Storage,
    /// Peer addresses of the cluster this node joins by itself (see
    /// [`crate::join`]); empty: it does not.
    pub join: Vec<String>,
}

/// The sockets a node serves on; the caller binds them.
pub struct Listeners {
    /// Clients: `Locks`, `Cluster`, health and reflection; also `Raft`
    /// unless `peer` is given.
    pub client: Listener,
    /// Peers: the internal `Raft` service only (`--peer-listen`).
    pub peer: Option<Listener>,
    /// Prometheus metrics (`GET /metrics`).
    pub metrics: Option<TcpListener>,
}

impl Listeners {
    /// One listener for clients and peers, no metrics.
    pub fn client(client: impl Into<Listener>) -> Self {
        Listeners {
            client: client.into(),
            peer: None,
            metrics: None,
        }
    }
}

/// A running node.
pub struct Node {
    /// Its id.
    pub id: NodeId,
    /// Its advertised client address.
    pub addr: String,
    /// The Raft handle.
    pub raft: Raft,
    /// Table and observers.
    pub shared: Arc<Shared>,
    /// The node's view of its own leadership (and of its Raft core).
    pub leadership: Arc<Leadership>,
    /// Its TLS in force, if any (see [`Node::reload_tls`]).
    tls: Option<Arc<crate::tls::NodeTls>>,
    /// The health of its links to its peers.
    links: Arc<crate::raft::links::Links>,
    /// Its connections to its peers (openraft's, shared).
    network: Network,
    /// The longest election timeout (see [`Node::ask_if_removed`]).
    election_timeout: Duration,
    stop: watch::Sender<bool>,
    /// Serves the client listener and, if any, the peer listener.
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    tasks: Vec<JoinHandle<()>>,
    /// Tells when the log store, and with it the data directory, is closed.
    log_closed: crate::raft::log_store::StoreClosed,
}

impl Node {
    /// Its TLS in force (`None` without TLS), for reloads from another
    /// task.
    pub fn tls(&self) -> Option<Arc<crate::tls::NodeTls>> {
        self.tls.clone()
    }

    /// Replaces this node's certificate, key and CA for the connections
    /// made from now on (clients and peers, both ways), if `options` passes
    /// the checks a start makes; otherwise nothing changes. Connections
    /// already open keep what they have.
    pub fn reload_tls(&self, options: crate::tls::TlsOptions) -> Result<(), String> {
        match &self.tls {
            Some(tls) => tls.reload(options),
            None => Err("this node runs without TLS; restart it to turn TLS on".into()),
        }
    }

    /// Resolves with the cause once this node's Raft core has stopped on
    /// its own (a storage error, a panic) or a sync of its log has failed
    /// (even outside the core's writes): health is `NOT_SERVING` by then
    /// and every request is refused. The process should exit non-zero so
    /// that its supervisor restarts it (see `raftlockd run`).
    pub async fn failed(&self) -> String {
        self.leadership.failed().await
    }

    /// Before a planned stop: if this node is the working leader of a
    /// cluster with other voters, hands the leadership to the voter with
    /// the most log among those it hears from (see
    /// [`Leadership::transfer`]), so that the others need not wait out its
    /// lease and elect a leader; logs the outcome. A transfer that fails
    /// leaves the cluster to elect a leader as if this node had just
    /// stopped.
    pub async fn hand_over(&self) {
        let voters = self
            .raft
            .metrics()
            .borrow_watched()
            .membership_config
            .membership()
            .voter_ids()
            .count();
        if voters < 2 || !self.leadership.view().working_leader() {
            return;
        }
        let started = tokio::time::Instant::now();
        match self.leadership.transfer(None).await {
            Ok(to) => tracing::info!(
                to = ?to,
                took = ?started.elapsed(),
                "leadership transferred before stopping"
            ),
            Err(e) => tracing::warn!(
                error = %e,
                "could not hand the leadership over before stopping; the others elect a leader \
                 after the election timeout"
            ),
        }
    }

    /// What both ways of stopping do once the servers are told to stop:
    /// parked requests fail and the node's background tasks end.
    fn end_work(&self) {
        self.shared
            .stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.shared.waiters.fail_all();
        for t in &self.tasks {
            t.abort();
        }
    }

    /// Stops serving and shuts Raft down, flushing what it has. Returns
    /// once the data directory is closed (another node may open it then).
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        self.end_work();
        let _ = self.raft.shutdown().await;
        let mut server = self.server;
        if tokio::time::timeout(Duration::from_secs(5), &mut server)
            .await
            .is_err()
        {
            tracing::warn!("requests still open 5 s after shutdown; cutting them off");
            server.abort();
        }
        Self::closed(self.raft, self.network, self.log_closed).await;
    }

    /// Stops abruptly, as close to a crash as a node inside a process can
    /// get: the listener closes, Raft stops without a goodbye and parked
    /// requests are dropped. Connections already accepted are not torn
    /// down; requests on them fail with `UNAVAILABLE`. Used by tests.
    /// Returns once the data directory is closed.
    pub async fn kill(self) {
        let _ = self.stop.send(true);
        self.server.abort();
        self.end_work();
        let _ = self.raft.shutdown().await;
        Self::closed(self.raft, self.network, self.log_closed).await;
    }

    /// Drops this handle of `raft` and waits (a few seconds at most) until
    /// openraft's tasks have let go of the log store.
    /// `network` goes too: it holds the cluster identity, and with it the
    /// log store.
    async fn closed(raft: Raft, network: Network, log: crate::raft::log_store::StoreClosed) {
        drop(raft);
        drop(network);
        if !log.wait(Duration::from_secs(5)).await {
            tracing::warn!("the log store is still open 5 s after shutdown");
        }
    }
}
