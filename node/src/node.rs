//! One raftlock node: storage, Raft, the lease keeper and the gRPC server,
//! wired together. The caller owns the listening sockets (so tests bind port
//! 0) and decides when to stop.

use std::collections::BTreeMap;
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
use crate::apply::state_machine::StateMachineStore;
use crate::apply::Raft;
use crate::apply::Shared;
use crate::leader::Leadership;
use crate::raft::identity::ClusterIdentity;
use crate::raft::log_store::{open_db, LogStore};
use crate::raft::network::Network;
use crate::raft::WatchReceiver as _;
use crate::raft::{NodeAddrs, NodeId};

/// Most concurrent gRPC streams (requests, keep-alive and watch streams) on
/// one client connection; past it the client's HTTP/2 stack waits.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 1024;

/// Name of the backup file `raftlockd restore` leaves in a data directory;
/// the node that bootstraps the cluster proposes it once it leads.
pub const RESTORE_FILE: &str = "restore.bin";

/// Name of the file beside [`RESTORE_FILE`] holding the fence bump for that
/// restore, in decimal (absent: the default bump).
pub const RESTORE_BUMP_FILE: &str = "restore.fence_bump";

/// Proposes the backup at `path` to the new cluster once this node leads it,
/// then renames the file so it is never applied twice.
async fn seed_from_backup(api: Api, path: PathBuf) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let bump_path = path.with_file_name(RESTORE_BUMP_FILE);
    let fence_bump = match std::fs::read_to_string(&bump_path) {
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(bump) => bump,
            Err(e) => {
                tracing::error!(path = %bump_path.display(), error = %e, "restore: bad fence bump; nothing restored");
                return;
            }
        },
        Err(_) => crate::state::limits::DEFAULT_RESTORE_FENCE_BUMP,
    };
    let snapshot = match std::fs::read(&path) {
        Ok(snapshot) => snapshot,
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "restore: cannot read the backup");
            let _ = std::fs::rename(&path, path.with_extension("refused"));
            return;
        }
    };
    let outcome = loop {
        // A working leader: elected (or restored) and caught up.
        let mut view = api.0.leadership.watch();
        let led = tokio::time::timeout_at(deadline, async {
            view.wait_for(|v| v.working_leader()).await.is_ok()
        })
        .await;
        if led != Ok(true) {
            tracing::error!(
                path = %path.display(),
                "restore: this node did not become leader; restore with `raftlock snapshot restore FILE` instead"
            );
            return;
        }
        match api.restore_backup(&snapshot, fence_bump).await {
            // Not (or no longer) the leader: wait to lead again, or give up
            // at the deadline.
            Err(crate::error::Error::NotLeader { .. })
                if tokio::time::Instant::now() < deadline =>
            {
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
/// openraft gives every `AppendEntries` one heartbeat interval to
/// complete; an entry carries at most `MAX_BATCH` commands or one
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
}

impl Default for RaftTiming {
    fn default() -> Self {
        RaftTiming {
            heartbeat: Duration::from_millis(100),
            election_timeout: (Duration::from_millis(300), Duration::from_millis(500)),
            snapshot_every: 10_000,
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
}

/// The sockets a node serves on; the caller binds them.
pub struct Listeners {
    /// Clients: `Locks`, `Cluster`, health and reflection; also `Raft`
    /// unless `peer` is given.
    pub client: TcpListener,
    /// Peers: the internal `Raft` service only (`--peer-listen`).
    pub peer: Option<TcpListener>,
    /// Prometheus metrics (`GET /metrics`).
    pub metrics: Option<TcpListener>,
}

impl Listeners {
    /// One listener for clients and peers, no metrics.
    pub fn client(client: TcpListener) -> Self {
        Listeners {
            client,
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
    stop: watch::Sender<bool>,
    /// Serves the client listener and, if any, the peer listener.
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    tasks: Vec<JoinHandle<()>>,
    /// Tells when the log store, and with it the data directory, is closed.
    log_closed: crate::raft::log_store::StoreClosed,
}

impl Node {
    /// Opens the data directory, starts Raft and serves clients and peers
    /// on `listener`.
    pub async fn start(opts: NodeOptions, listener: TcpListener) -> anyhow::Result<Node> {
        Self::start_with(opts, Listeners::client(listener)).await
    }

    /// Like [`start`](Self::start), also serving Prometheus metrics on
    /// `metrics` (`GET /metrics`).
    pub async fn start_with_metrics(
        opts: NodeOptions,
        listener: TcpListener,
        metrics: Option<TcpListener>,
    ) -> anyhow::Result<Node> {
        Self::start_with(
            opts,
            Listeners {
                metrics,
                ..Listeners::client(listener)
            },
        )
        .await
    }

    /// Opens the data directory, starts Raft and serves on `listeners`.
    pub async fn start_with(opts: NodeOptions, listeners: Listeners) -> anyhow::Result<Node> {
        anyhow::ensure!(opts.id != 0, "node id must be non-zero");
        anyhow::ensure!(
            opts.peer_advertise.is_some() == listeners.peer.is_some(),
            "a separate peer listener needs a peer address to advertise, and the other way round"
        );
        let Listeners {
            client: listener,
            peer: peer_listener,
            metrics,
        } = listeners;
        std::fs::create_dir_all(&opts.data_dir)?;
        let sled_dir = opts.data_dir.join("sled");
        let db = open_db(&sled_dir)?;
        let log_store = LogStore::with_faults(db, &sled_dir, opts.storage_faults.clone())?;
        let log_closed = log_store.closed();
        log_store.check_node_id(opts.id).await?;
        let committed = log_store.committed_marker();
        let fresh = log_store.is_fresh();
        let cluster = Arc::new(ClusterIdentity::open(log_store.clone())?);
        if opts.init && fresh {
            cluster.create().await?;
        }
        let shared = Shared::new(committed);
        let sm = StateMachineStore::open(shared.clone(), Some(opts.data_dir.join("snapshot.bin")))?;
        let log_store = log_store
            .with_snapshot_floor(sm.persisted_snapshot())
            .with_metrics(shared.metrics.clone());

        let config = openraft::Config {
            cluster_name: "raftlock".into(),
            heartbeat_interval: opts.timing.heartbeat.as_millis() as u64,
            election_timeout_min: opts.timing.election_timeout.0.as_millis() as u64,
            election_timeout_max: opts.timing.election_timeout.1.as_millis() as u64,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(opts.timing.snapshot_every),
            max_in_snapshot_log_to_keep: 1_000,
            max_payload_entries: MAX_PAYLOAD_ENTRIES,
            install_snapshot_timeout: 10_000,
            ..Default::default()
        }
        .validate()?;
        let raft = Raft::new(
            opts.id,
            Arc::new(config),
            Network::new(
                opts.dial.clone(),
                shared.metrics.clone(),
                opts.tls.as_ref().map(|t| t.peer_client_config()),
                opts.auth.clone(),
                cluster.clone(),
            ),
            log_store,
            sm,
        )
        .await?;

        if opts.init && fresh {
            let members = opts.peers.clone();
            anyhow::ensure!(
                members.contains_key(&opts.id),
                "--init: the peer list must include this node ({})",
                opts.id
            );
            tracing::info!(?members, "bootstrapping a new cluster");
            raft.initialize(members).await?;
        }
        let seed = opts.data_dir.join(RESTORE_FILE);
        let seed = (opts.init && fresh && seed.exists()).then_some(seed);

        let (stop, stop_rx) = watch::channel(false);
        let leadership = Leadership::new(
            opts.id,
            raft.clone(),
            shared.clone(),
            opts.timing.election_timeout.1,
            opts.data_dir.clone(),
        );
        let api = Api::new(
            opts.id,
            opts.advertise.clone(),
            raft.clone(),
            shared.clone(),
            leadership.clone(),
            opts.auth.clone(),
        );
        // Standard gRPC health checking: SERVING while this node knows a
        // leader (see `Leadership::follow`); and server reflection so grpcurl
        // and friends need no .proto file.
        let (health, health_service) = tonic_health::server::health_reporter();
        // Both reflection versions: grpc.reflection.v1, and v1alpha for
        // stock Python, older grpcurl and GUI clients that speak only it.
        // grpc.health.v1 is registered too, so grpcurl can call health
        // checks without a .proto.
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(raftlock_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()?;
        let reflection_alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(raftlock_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1alpha()?;
        let shutdown = || {
            let mut stop_rx = stop_rx.clone();
            async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            }
        };
        let builder = || -> anyhow::Result<tonic::transport::Server> {
            let mut builder = tonic::transport::Server::builder();
            if let Some(tls) = &opts.tls {
                builder = builder.tls_config(tls.server_config())?;
            }
            Ok(builder
                .tcp_nodelay(true)
                .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION))
        };
        // The internal Raft service: peers only, checked from the headers
        // before a body (up to a 16 MiB Raft message) is read.
        let raft_service = || {
            InterceptedService::new(
                RaftServer::new(RaftService::new(
                    raft.clone(),
                    opts.auth.clone(),
                    cluster.clone(),
                    shared.metrics.clone(),
                    stop_rx.clone(),
                ))
                .max_decoding_message_size(crate::raft::MAX_RAFT_MESSAGE_BYTES)
                .max_encoding_message_size(crate::raft::MAX_RAFT_MESSAGE_BYTES),
                peers_only(opts.auth.clone()),
            )
        };
        let peer_server = match peer_listener {
            None => None,
            Some(listener) => Some(
                builder()?
                    .add_service(raft_service())
                    .serve_with_incoming_shutdown(incoming(listener), shutdown()),
            ),
        };
        let client_server = {
            let max = crate::MAX_MESSAGE_BYTES;
            let router = builder()?
                .add_service(health_service)
                .add_service(reflection)
                .add_service(reflection_alpha)
                .add_service(LocksServer::new(api.clone()).max_decoding_message_size(max))
                // Credentials are checked from the headers, before a body
                // (up to a 1 GiB backup) is read: without them nothing is
                // decoded.
                .add_service(InterceptedService::new(
                    ClusterServer::new(api.clone())
                        .max_decoding_message_size(MAX_BACKUP_BYTES)
                        .max_encoding_message_size(MAX_BACKUP_BYTES),
                    authenticated(opts.auth.clone()),
                ));
            // With a separate peer listener the client port has no Raft
            // service at all (`UNIMPLEMENTED`).
            let router = match peer_server {
                Some(_) => router,
                None => router.add_service(raft_service()),
            };
            router.serve_with_incoming_shutdown(incoming(listener), shutdown())
        };
        let server = tokio::spawn(async move {
            match peer_server {
                None => client_server.await,
                Some(peer_server) => tokio::try_join!(client_server, peer_server).map(|_| ()),
            }
        });

        let mut tasks = vec![
            tokio::spawn(shared.leases.clone().run({
                let raft = raft.clone();
                move |batch| {
                    let raft = raft.clone();
                    async move {
                        raft.client_write(batch)
                            .await
                            .map(drop)
                            .map_err(|e| e.to_string())
                    }
                }
            })),
            tokio::spawn(leadership.clone().follow(health)),
        ];
        if let Some(path) = seed {
            tasks.push(tokio::spawn(seed_from_backup(api.clone(), path)));
        }
        if let Some(listener) = metrics {
            let gauges = {
                let (raft, shared, leadership) = (raft.clone(), shared.clone(), leadership.clone());
                move || gauges(&raft, &shared, &leadership)
            };
            let serve = crate::metrics::serve(listener, shared.metrics.clone(), gauges, shutdown());
            tasks.push(tokio::spawn(async move {
                if let Err(e) = serve.await {
                    tracing::error!(error = %e, "metrics server failed");
                }
            }));
        }
        Ok(Node {
            id: opts.id,
            addr: opts.advertise,
            raft,
            shared,
            leadership,
            stop,
            server,
            tasks,
            log_closed,
        })
    }

    /// Resolves with the cause once this node's Raft core has stopped on
    /// its own (a storage error, a panic): health is `NOT_SERVING` by then
    /// and every request is refused. The process should exit non-zero so
    /// that its supervisor restarts it (see `raftlockd run`).
    pub async fn failed(&self) -> String {
        self.leadership.failed().await
    }

    /// Stops serving and shuts Raft down, flushing what it has. Returns
    /// once the data directory is closed (another node may open it then).
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        self.shared
            .stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.shared.waiters.fail_all();
        for t in &self.tasks {
            t.abort();
        }
        let _ = self.raft.shutdown().await;
        let mut server = self.server;
        if tokio::time::timeout(Duration::from_secs(5), &mut server)
            .await
            .is_err()
        {
            tracing::warn!("requests still open 5 s after shutdown; cutting them off");
            server.abort();
        }
        Self::closed(self.raft, self.log_closed).await;
    }

    /// Stops abruptly, as close to a crash as a node inside a process can
    /// get: the listener closes, Raft stops without a goodbye and parked
    /// requests are dropped. Connections already accepted are not torn
    /// down; requests on them fail with `UNAVAILABLE`. Used by tests.
    /// Returns once the data directory is closed.
    pub async fn kill(self) {
        let _ = self.stop.send(true);
        self.server.abort();
        self.shared
            .stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.shared.waiters.fail_all();
        for t in &self.tasks {
            t.abort();
        }
        let _ = self.raft.shutdown().await;
        Self::closed(self.raft, self.log_closed).await;
    }

    /// Drops this handle of `raft` and waits (a few seconds at most) until
    /// openraft's tasks have let go of the log store.
    async fn closed(raft: Raft, log: crate::raft::log_store::StoreClosed) {
        drop(raft);
        if !log.wait(Duration::from_secs(5)).await {
            tracing::warn!("the log store is still open 5 s after shutdown");
        }
    }
}

/// The connections `listener` accepts, with Nagle's algorithm off.
///
/// tonic's `tcp_nodelay` applies only to listeners it binds itself, not to
/// an incoming stream it is handed. With Nagle on, the second small frame
/// of a stream (a replication answer, a keep-alive answer) waits for the
/// ACK of the first, which the peer delays up to 40 ms.
fn incoming(
    listener: TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use futures::StreamExt;
    TcpListenerStream::new(listener).map(|conn| {
        let conn = conn?;
        conn.set_nodelay(true)?;
        Ok(conn)
    })
}

/// An interceptor that lets through only requests with valid credentials
/// (any identity; without access control, everyone).
fn authenticated(
    auth: Arc<crate::auth::Auth>,
) -> impl FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Clone {
    move |req| {
        auth.caller(&req)?;
        Ok(req)
    }
}

/// An interceptor that lets through only the cluster's peers (see
/// [`Auth::check_peer`](crate::auth::Auth::check_peer)).
fn peers_only(
    auth: Arc<crate::auth::Auth>,
) -> impl FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Clone {
    move |req| {
        auth.check_peer(&req)?;
        Ok(req)
    }
}

/// What `/metrics` shows of Raft and the lock table right now.
fn gauges(raft: &Raft, shared: &Shared, leadership: &Leadership) -> crate::metrics::Gauges {
    let m = raft.metrics().borrow_watched().clone();
    let view = leadership.view();
    let stats = shared.read(|applied| applied.table.stats());
    crate::metrics::Gauges {
        term: view.term,
        is_leader: view.working_leader(),
        leader_id: view.leader.unwrap_or(0),
        commit_index: shared.committed.load(std::sync::atomic::Ordering::Relaxed),
        applied_index: m.last_applied.map_or(0, |l| l.index),
        last_log_index: m.last_log_index.unwrap_or(0),
        sessions: stats.sessions,
        held_locks: stats.grants,
        waiters: stats.waiters,
        last_fence: stats.last_fence,
        parked_requests: shared.waiters.len() as u64,
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    /// Accepted connections have Nagle's algorithm off (tonic sets it only
    /// on listeners it binds itself): with it on, every second frame of a
    /// stream waited for a delayed ACK, up to 40 ms.
    #[tokio::test]
    async fn accepted_connections_have_nagle_off() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut accepted = Box::pin(incoming(listener));
        let _client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let conn = accepted
            .next()
            .await
            .expect("a connection")
            .expect("accepted");
        assert!(conn.nodelay().expect("nodelay"));
    }
}
