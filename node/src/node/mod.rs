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
use crate::raft::backend::{Log, Storage};
use crate::raft::identity::ClusterIdentity;
use crate::raft::log_store::{open_db, LogStore};
use crate::raft::mem_log::MemLogStore;
use crate::raft::network::Network;
use crate::raft::WatchReceiver as _;
use crate::raft::{LogId, NodeAddrs, NodeId, Vote};
use crate::transport::Listener;

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

/// A node that holds a membership without itself asks its peers whether it
/// was removed after hearing from no leader for this many of its longest
/// election timeouts, and again as often while that lasts (see
/// `Node::ask_if_removed`).
pub const ASK_AFTER_ELECTION_TIMEOUTS: u32 = 4;

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
    pub storage: crate::raft::backend::Storage,
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
        let custom = |l: &Listener| matches!(l, Listener::Custom(_));
        anyhow::ensure!(
            opts.tls.is_none()
                || !(custom(&listeners.client) || listeners.peer.as_ref().is_some_and(custom)),
            "TLS needs TCP listeners (a custom transport's connections are served in plaintext)"
        );
        // Before anything touches the data directory: a certificate peers
        // would refuse stops the node here, named.
        let tls = match &opts.tls {
            None => None,
            Some(t) => {
                let hosts = advertised_hosts(&opts)
                    .into_iter()
                    .map(String::from)
                    .collect();
                let tls = crate::tls::NodeTls::new(t.clone(), hosts)
                    .map_err(|e| anyhow::anyhow!("TLS: {e}"))?;
                Some(Arc::new(tls))
            }
        };
        let Listeners {
            client: listener,
            peer: peer_listener,
            metrics,
        } = listeners;
        std::fs::create_dir_all(&opts.data_dir)?;
        let log_store: Log = match &opts.storage {
            Storage::Sled => {
                let sled_dir = opts.data_dir.join("sled");
                let db = open_db(&sled_dir)?;
                LogStore::with_faults(db, &sled_dir, opts.storage_faults.clone())?.into()
            }
            Storage::Memory(disk) => MemLogStore::open(disk.clone())?.into(),
        };
        let log_closed = log_store.closed();
        log_store.check_node_id(opts.id).await?;
        let committed = log_store.committed_marker();
        let fresh = log_store.is_fresh();
        let cluster = Arc::new(ClusterIdentity::open(opts.id, log_store.clone())?);
        // Before anything is adopted or bootstrapped (see `crate::join`).
        let started_empty = fresh && cluster.id() == 0;
        if opts.init && fresh {
            cluster.create().await?;
        }
        let shared = Shared::new(committed);
        // The console's side table follows every applied event from the
        // first (subscribed before Raft starts applying).
        shared.metrics.set_prefix_labels(opts.prefix_labels);
        let console_notes = Arc::new(crate::console::Notes::with_metrics(shared.metrics.clone()));
        let console_follow = tokio::spawn(crate::console::follow(
            console_notes.clone(),
            shared.watch.subscribe(),
        ));
        let snapshot_location = match &opts.storage {
            Storage::Sled => SnapshotLocation::File(opts.data_dir.join("snapshot.bin")),
            Storage::Memory(disk) => SnapshotLocation::Simulated(disk.clone()),
        };
        let sm = StateMachineStore::open(shared.clone(), snapshot_location)?;
        let log_store = log_store
            .with_snapshot_floor(sm.persisted_snapshot())
            .with_metrics(shared.metrics.clone());
        // The owner of liveness sees a failed sync of any write (without a
        // handle of the store, which shutdown waits to see closed).
        let sync_failure = log_store.sync_failure();

        let config = openraft::Config {
            cluster_name: "raftlock".into(),
            heartbeat_interval: opts.timing.heartbeat.as_millis() as u64,
            election_timeout_min: opts.timing.election_timeout.0.as_millis() as u64,
            election_timeout_max: opts.timing.election_timeout.1.as_millis() as u64,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(opts.timing.snapshot_every),
            max_in_snapshot_log_to_keep: opts.timing.logs_to_keep,
            max_payload_entries: MAX_PAYLOAD_ENTRIES,
            install_snapshot_timeout: 10_000,
            // A node campaigns only after a quorum says it could win: one
            // that was paused or cut off cannot depose a working leader
            // (and raise the term) when it returns.
            enable_pre_vote: Some(true),
            // A leader restarted at once must not take up its old term
            // again (openraft's leader restore, on by default): its own
            // copy of the last entries it sent may not have reached its
            // disk while its followers have them, and it would give their
            // indexes to new commands, so that one log id names two
            // different entries. It comes back a follower; the next leader
            // (elected in a new term, with the longest log) brings it up
            // to date.
            enable_leader_restore: Some(false),
            ..Default::default()
        }
        .validate()?;
        // Peers that answer again after failing: openraft's replication
        // backoff for them is reset, so they catch up at once.
        // Set by the owner of leadership while this node leads without a
        // quorum; sent to followers with every AppendEntries.
        let quorum_flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (peer_back, mut peers_back) = tokio::sync::mpsc::unbounded_channel();
        let links = Arc::new(crate::raft::links::Links::new(peer_back));
        let network = Network::new(
            opts.dial.clone(),
            shared.metrics.clone(),
            tls.clone(),
            opts.auth.clone(),
            cluster.clone(),
            links.clone(),
        )
        .with_connector(opts.connector.clone())
        .with_quorum_flag(quorum_flag.clone())
        .with_purge_point(log_store.purged_marker());
        let raft = Raft::new(opts.id, Arc::new(config), network.clone(), log_store, sm).await?;
        network.watch_membership(raft.metrics());

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
        // A backup still waiting is proposed whether or not this start is
        // the first: a node stopped after it bootstrapped but before it
        // proposed the backup finishes the restore now. (The file is
        // renamed once the cluster took or refused it; a cluster that holds
        // anything refuses a restore.)
        let seed = opts.data_dir.join(RESTORE_FILE);
        let seed = seed.exists().then_some(seed);

        let (stop, stop_rx) = watch::channel(false);
        let leadership = Leadership::new(
            opts.id,
            raft.clone(),
            shared.clone(),
            opts.timing.election_timeout.1,
            opts.timing.heartbeat,
            opts.data_dir.clone(),
            sync_failure,
            quorum_flag,
        );
        let api = Api::new(
            opts.id,
            opts.advertise.clone(),
            raft.clone(),
            shared.clone(),
            leadership.clone(),
            opts.auth.clone(),
            cluster.clone(),
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
        // The client port forwards to the leader what a follower would
        // refuse (`api::forward`); the peer port serves Raft only.
        let forward = crate::api::forward::ForwardLayer::new(
            opts.id,
            leadership.clone(),
            network.clone(),
            opts.auth.clone(),
        );
        let builder = |forward: crate::api::forward::ForwardLayer| -> anyhow::Result<
            tonic::transport::Server<
                tower::layer::util::Stack<
                    crate::api::forward::ForwardLayer,
                    tower::layer::util::Stack<
                        crate::api::deadline::DeadlineLayer,
                        tower::layer::util::Identity,
                    >,
                >,
            >,
        > {
            // TLS is terminated by `serve` (per connection, so that a
            // reload applies to the next connection), not by tonic.
            let builder = tonic::transport::Server::builder();
            Ok(builder
                // A passing client deadline is answered DEADLINE_EXCEEDED
                // (see `api::deadline`), not tonic's CANCELLED.
                .layer(crate::api::deadline::DeadlineLayer)
                .tcp_nodelay(true)
                .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
                // A client whose host vanished without closing its
                // connection is noticed within about 10 s, ending its
                // streams (sessions bound to a keep-alive stream start
                // their grace then).
                .http2_keepalive_interval(Some(Duration::from_secs(5)))
                .http2_keepalive_timeout(Some(Duration::from_secs(5)))
                .layer(forward))
        };
        // The internal Raft service: peers only, checked from the headers
        // before a body (up to a 16 MiB Raft message) is read.
        let raft_service = || {
            InterceptedService::new(
                RaftServer::new(RaftService::new(
                    raft.clone(),
                    opts.auth.clone(),
                    cluster.clone(),
                    leadership.clone(),
                    shared.metrics.clone(),
                    stop_rx.clone(),
                    api.clone(),
                ))
                .max_decoding_message_size(crate::raft::MAX_RAFT_MESSAGE_BYTES)
                .max_encoding_message_size(crate::raft::MAX_RAFT_MESSAGE_BYTES),
                peers_only(opts.auth.clone()),
            )
        };
        let peer_server = match peer_listener {
            None => None,
            Some(listener) => Some(serve(
                builder(crate::api::forward::ForwardLayer::off())?.add_service(raft_service()),
                listener,
                tls.clone(),
                shutdown(),
            )),
        };
        let client_server = {
            let max = crate::MAX_MESSAGE_BYTES;
            // HTTP/JSON beside gRPC (see `api::http`): different paths,
            // and HTTP/1.1 accepted on the same port.
            let http = tonic::service::Routes::from(crate::api::http::router(api.clone()));
            let router = builder(forward)?
                .accept_http1(true)
                .add_routes(http)
                .add_service(health_service)
                .add_service(reflection)
                .add_service(reflection_alpha)
                // Credentials are checked from the headers before a
                // message is decoded here too (permissions, which need the
                // message, are checked in each method).
                .add_service(InterceptedService::new(
                    LocksServer::new(api.clone()).max_decoding_message_size(max),
                    authenticated(opts.auth.clone()),
                ))
                // Credentials are checked from the headers, before a body
                // (up to a 1 GiB backup) is read: without them nothing is
                // decoded. The peer credentials are not a client's (a node
                // joining by itself asks on the peer port).
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
            serve(router, listener, tls.clone(), shutdown())
        };
        let server = tokio::spawn(async move {
            match peer_server {
                None => client_server.await,
                Some(peer_server) => tokio::try_join!(client_server, peer_server).map(|_| ()),
            }
        });

        let mut tasks = vec![
            console_follow,
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
            tokio::spawn(count_leader_changes(
                leadership.watch(),
                shared.metrics.clone(),
            )),
            tokio::spawn({
                let raft = raft.clone();
                async move {
                    while let Some(peer) = peers_back.recv().await {
                        if raft.trigger().reset_backoff([peer]).await.is_err() {
                            return;
                        }
                    }
                }
            }),
        ];
        if let Some(path) = seed {
            tasks.push(tokio::spawn(seed_from_backup(api.clone(), path)));
        }
        if !opts.join.is_empty() {
            let joiner = crate::join::Joiner {
                id: opts.id,
                addrs: crate::raft::NodeAddrs::new(
                    opts.advertise.clone(),
                    opts.peer_advertise
                        .clone()
                        .unwrap_or_else(|| opts.advertise.clone()),
                ),
                endpoints: opts.join.clone(),
                started_empty,
                raft: raft.clone(),
                network: network.clone(),
                auth: opts.auth.clone(),
            };
            tasks.push(tokio::spawn(joiner.run(stop_rx.clone())));
        }
        if let Some(listener) = metrics {
            let source = Arc::new(MetricsSource {
                data_dir: opts.data_dir.clone(),
                raft: raft.clone(),
                shared: shared.clone(),
                leadership: leadership.clone(),
                auth: opts.auth.clone(),
                watches: api.0.watches.clone(),
                notes: console_notes.clone(),
            });
            let console = crate::console::router(api.clone(), console_notes.clone());
            let serve = crate::metrics::serve(
                listener,
                shared.metrics.clone(),
                source,
                console,
                shutdown(),
            );
            tasks.push(tokio::spawn(async move {
                if let Err(e) = serve.await {
                    tracing::error!(error = %e, "metrics server failed");
                }
            }));
        }
        Ok(Node {
            id: opts.id,
            tls,
            addr: opts.advertise,
            raft,
            shared,
            leadership,
            links,
            network,
            election_timeout: opts.timing.election_timeout.1,
            stop,
            server,
            tasks,
            log_closed,
        })
    }

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

    /// Resolves once a peer has said that this node was removed from the
    /// cluster (it refused this node's vote: its committed membership does
    /// not have this node, and this node's log ends before that
    /// membership), with a line saying so. The process should exit with
    /// status 0 (see `raftlockd run`), so that its supervisor does not
    /// start it again into a cluster that removed it.
    ///
    /// A leader that removes itself knows by itself (it applies the
    /// membership it proposed without itself): it steps down and no longer
    /// campaigns, so no peer would ever refuse it a vote.
    pub async fn removed(&self) -> String {
        tokio::select! {
            (by, at) = self.links.removed() => format!(
                "node {} was removed from the cluster (node {by}'s membership at log index {at} \
                 does not have it)",
                self.id
            ),
            at = self.left_in_own_log() => format!(
                "node {} was removed from the cluster (the membership it applied at log index \
                 {at} does not have it)",
                self.id
            ),
            never = self.ask_if_removed() => match never {},
        }
    }

    /// Asks the peers, every [`ASK_AFTER_ELECTION_TIMEOUTS`] election
    /// timeouts, whether this node was removed, while it may have been
    /// removed without a peer ever telling it so:
    ///
    /// - it holds a membership without itself (after one with itself as a
    ///   voter) and hears from no leader. Such a node received the entry
    ///   that removed it but not the word that it committed (the leader
    ///   stops replicating to it): openraft makes it a learner, which never
    ///   campaigns, so no peer would refuse it a vote (seed 404727 of the
    ///   simulator). A node that still hears from a leader (one catching up
    ///   through an old removal after it was added back, say) does not ask.
    /// - it leads in openraft's eyes but no quorum has acknowledged it. A
    ///   leader handing over its leadership sends nothing (openraft stops
    ///   its heartbeats and refuses writes until a higher term reaches it);
    ///   if the leader elected next removes it before any message of the
    ///   new term reached it, none ever will, and it would neither
    ///   campaign nor step down (seed 703904).
    ///
    /// A peer whose committed membership leaves it out and is no older
    /// than this node's latest membership answers with the removal marker
    /// (see `removed_at` in the `Raft` service), which
    /// [`Links`](crate::raft::links::Links) passes on to
    /// [`removed`](Self::removed). Never resolves.
    async fn ask_if_removed(&self) -> std::convert::Infallible {
        use openraft::network::RaftNetworkFactory as _;
        let id = self.id;
        let quiet = self.election_timeout * ASK_AFTER_ELECTION_TIMEOUTS;
        // openraft's server metrics change with the vote, the role and the
        // membership only, not at every append, commit and apply.
        let mut metrics = self.raft.server_metrics();
        let mut was_voter = false;
        loop {
            loop {
                {
                    let m = metrics.borrow_and_update();
                    let members = m.membership_config.membership();
                    was_voter |= members.voter_ids().any(|v| v == id);
                    if (was_voter && members.get_node(&id).is_none())
                        || m.state == openraft::ServerState::Leader
                    {
                        break;
                    }
                }
                if metrics.changed().await.is_err() {
                    // Raft stopped: nothing to ask any more.
                    return std::future::pending().await;
                }
            }
            tokio::time::sleep(quiet).await;
            let m = metrics.borrow_watched().clone();
            let members = m.membership_config.membership();
            let Some(left) = *m.membership_config.log_id() else {
                continue;
            };
            let unheard = if members.get_node(&id).is_none() {
                self.leadership.no_leader_contact_for(quiet)
            } else if m.state == openraft::ServerState::Leader {
                let acked = self.raft.metrics().borrow_watched().last_quorum_acked;
                acked.is_none_or(|at| openraft::Instant::elapsed(&*at) >= quiet)
            } else {
                false
            };
            if !unheard {
                continue;
            }
            // Its last log id as far as it matters here: the membership's
            // (the metrics give only the last index).
            let rpc =
                openraft::raft::VoteRequest::new(Vote::new(m.vote.leader_id.term, id), Some(left));
            let asks = members
                .nodes()
                .filter(|(n, _)| **n != id)
                .map(|(n, addrs)| {
                    let mut network = self.network.clone();
                    let rpc = &rpc;
                    async move {
                        let peer = network.new_client(*n, addrs).await;
                        peer.ask_if_removed(rpc, left.index, quiet).await;
                    }
                });
            futures::future::join_all(asks).await;
        }
    }

    /// Resolves with the log index of the membership by which this node,
    /// as leader, removed itself: it has applied, after one with itself, a
    /// membership without itself while it leads the current term (see
    /// [`removed_itself`]). Only that case: a node added back under its id
    /// (after its data was emptied) replays its old removal as it catches
    /// up and must not take it for a new one; a follower learns of its
    /// removal from the vote its peers refuse. Never, if Raft stops first.
    ///
    /// It looks again only when what it looks at changes: the applied
    /// membership, or openraft's server metrics (vote, role, effective
    /// membership), not at every append, commit and apply (this future is
    /// polled by `raftlockd`'s main thread, which each look would wake).
    async fn left_in_own_log(&self) -> u64 {
        let id = self.id;
        let mut was_member = false;
        let mut server = self.raft.server_metrics();
        let mut applied = self.shared.membership_changes();
        loop {
            applied.borrow_and_update();
            let (member, at) = self.shared.read(|a| {
                (
                    a.membership.membership().get_node(&id).is_some(),
                    *a.membership.log_id(),
                )
            });
            if member {
                was_member = true;
            } else if was_member {
                let m = server.borrow_and_update();
                let effective = m.membership_config.membership().get_node(&id).is_some();
                if let Some(at) = removed_itself(id, at, effective, &m.vote) {
                    return at;
                }
            }
            tokio::select! {
                changed = server.changed() => if changed.is_err() {
                    // Raft stopped.
                    return std::future::pending().await;
                },
                changed = applied.changed() => if changed.is_err() {
                    return std::future::pending().await;
                },
            }
        }
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
        self.shared
            .stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.shared.waiters.fail_all();
        for t in &self.tasks {
            t.abort();
        }
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

/// The hosts this node is dialled at: its client address and, if any, its
/// peer address (without ports or IPv6 brackets).
fn advertised_hosts(opts: &NodeOptions) -> Vec<&str> {
    fn host(addr: &str) -> &str {
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        host.trim_start_matches('[').trim_end_matches(']')
    }
    let mut hosts = vec![host(&opts.advertise)];
    if let Some(peer) = &opts.peer_advertise {
        if !hosts.contains(&host(peer)) {
            hosts.push(host(peer));
        }
    }
    hosts
}

/// Serves `router` on the connections `listener` accepts, over TLS with
/// the configuration in force when each arrives if `tls` is given, until
/// `shutdown`.
///
/// A custom transport's connections ([`Listener::Custom`]) are served
/// as they come (plaintext: TLS needs a TCP listener, which `start_with`
/// checks before anything is opened).
/// What the node's servers are: tonic's router under [`DeadlineLayer`] and
/// [`ForwardLayer`] (off on the peer port).
///
/// [`ForwardLayer`]: crate::api::forward::ForwardLayer
/// [`DeadlineLayer`]: crate::api::deadline::DeadlineLayer
type Router = tonic::transport::server::Router<
    tower::layer::util::Stack<
        crate::api::forward::ForwardLayer,
        tower::layer::util::Stack<
            crate::api::deadline::DeadlineLayer,
            tower::layer::util::Identity,
        >,
    >,
>;

fn serve(
    router: Router,
    listener: Listener,
    tls: Option<Arc<crate::tls::NodeTls>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> futures::future::BoxFuture<'static, Result<(), tonic::transport::Error>> {
    use futures::FutureExt as _;
    match (listener, tls) {
        (Listener::Tcp(listener), None) => router
            .serve_with_incoming_shutdown(incoming(listener), shutdown)
            .boxed(),
        (Listener::Tcp(listener), Some(tls)) => router
            .serve_with_incoming_shutdown(tls_incoming(listener, tls), shutdown)
            .boxed(),
        (Listener::Custom(conns), _) => {
            router.serve_with_incoming_shutdown(conns, shutdown).boxed()
        }
    }
}

/// Longest a client may take over its TLS handshake.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS connections `listener` accepts (Nagle's algorithm off), each
/// with the server configuration in force when it arrived. Handshakes run
/// side by side, so a slow one holds up no other; a failed one is logged
/// (at most one line every [`TLS_FAILURE_LOG_EVERY`], with a count).
fn tls_incoming(
    listener: TcpListener,
    tls: Arc<crate::tls::NodeTls>,
) -> impl futures::Stream<Item = std::io::Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>>
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let failures = Arc::new(FailureLog::default());
    tokio::spawn(async move {
        loop {
            // Ends (and closes the listener) once the server is gone.
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = tx.closed() => return,
            };
            let (conn, from) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, say: pause instead of
                    // spinning.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = conn.set_nodelay(true);
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.server_config());
            let (tx, failures) = (tx.clone(), failures.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(conn)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => failures.note(from, &e.to_string()),
                    Err(_) => failures.note(from, "the handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// At most one log line about failed TLS handshakes this often.
pub const TLS_FAILURE_LOG_EVERY: Duration = Duration::from_secs(10);

/// Failed TLS handshakes, logged sparingly: a client with the wrong CA or
/// without TLS retries many times a second.
#[derive(Default)]
struct FailureLog {
    /// When the last line was written, and the failures since.
    state: std::sync::Mutex<(Option<tokio::time::Instant>, u64)>,
}

impl FailureLog {
    fn note(&self, from: std::net::SocketAddr, error: &str) {
        let mut state = self.state.lock().expect("failure log lock poisoned");
        let now = tokio::time::Instant::now();
        if state
            .0
            .is_some_and(|at| now.duration_since(at) < TLS_FAILURE_LOG_EVERY)
        {
            state.1 += 1;
            return;
        }
        let suppressed = std::mem::take(&mut state.1);
        state.0 = Some(now);
        tracing::warn!(
            %from,
            error,
            suppressed,
            "a TLS handshake failed (the client may lack the CA, dial a name the certificate \
             does not carry, or speak plaintext); `suppressed` more failed since the last line"
        );
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

/// What the metrics port reads of the node: gauges, probes, and who may
/// reset what it shows.
struct MetricsSource {
    /// The node's data directory (its size and free space).
    data_dir: PathBuf,
    raft: Raft,
    shared: Arc<Shared>,
    leadership: Arc<Leadership>,
    auth: Arc<crate::auth::Auth>,
    /// Open `Watch` streams.
    watches: Arc<std::sync::atomic::AtomicUsize>,
    /// The console's side table (the oldest grant and wait).
    notes: Arc<crate::console::Notes>,
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
async fn count_leader_changes(
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

/// Whether node `id`, which was a member and has applied a membership
/// without itself (logged at `applied_at`), removed itself as leader; if
/// so, that membership's log index. `effective`: whether the membership it
/// uses (the latest in its log) has it; `vote`: its vote.
///
/// It did if it leads the current term (its own vote, granted by a
/// quorum) and the latest membership in its log leaves it out too: it
/// committed that membership, whichever of its terms proposed it (one it
/// proposed, lost the leadership before it committed, and committed once
/// elected again counts as well). Not a node added back under its id that
/// replays its old removal: it follows another leader while it catches
/// up, and if it leads before it has applied that far, its log already
/// has the membership that added it back.
fn removed_itself(
    id: NodeId,
    applied_at: Option<LogId>,
    effective: bool,
    vote: &Vote,
) -> Option<u64> {
    let leads = vote.is_committed() && vote.leader_id().node_id == id;
    (leads && !effective).then_some(applied_at?.index)
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    /// Node 1 removing itself as leader; the membership without it at
    /// index 40, logged in term `proposed` by node 1.
    fn removal(proposed: u64) -> Option<LogId> {
        Some(crate::raft::log_id(proposed, 1, 40))
    }

    #[test]
    fn a_leader_that_removed_itself_in_its_term_has_left() {
        let vote = Vote::new_committed(3, 1);
        assert_eq!(removed_itself(1, removal(3), false, &vote), Some(40));
    }

    /// Simulator seed 300213: node 1 proposed its removal in one term, lost
    /// the leadership (a far-future vote) before it committed, was elected
    /// again and committed it in the next term, with the blank entry of
    /// that term. It had removed itself all the same.
    #[test]
    fn a_leader_that_committed_its_removal_of_an_earlier_term_has_left() {
        let vote = Vote::new_committed(4, 1);
        assert_eq!(removed_itself(1, removal(3), false, &vote), Some(40));
    }

    /// A node added back under its id (data emptied) replays its old
    /// removal while it follows another leader: not a new removal.
    #[test]
    fn a_follower_replaying_its_old_removal_has_not_left() {
        let vote = Vote::new_committed(7, 2);
        assert_eq!(removed_itself(1, removal(3), false, &vote), None);
        // Nor while it campaigns (a vote for itself not granted yet).
        assert_eq!(removed_itself(1, removal(3), false, &Vote::new(8, 1)), None);
    }

    /// Added back, then elected while its state machine still applies the
    /// old removal: its log has the membership that added it back.
    #[test]
    fn a_leader_still_applying_its_old_removal_has_not_left() {
        let vote = Vote::new_committed(9, 1);
        assert_eq!(removed_itself(1, removal(3), true, &vote), None);
    }

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
