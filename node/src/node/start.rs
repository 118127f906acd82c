//! Starting a node: the checks, the data directory, Raft, the servers
//! and the node's background tasks, in that order.

use super::gauges::{count_leader_changes, MetricsSource};
use super::serve::{advertised_hosts, authenticated, peers_only, serve};
use super::*;

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
    ///
    /// The start-up phases, in order: the checks, the storage, Raft and
    /// the owner of its leadership, the API, the servers, the background
    /// tasks.
    pub async fn start_with(opts: NodeOptions, listeners: Listeners) -> anyhow::Result<Node> {
        let tls = check_options(&opts, &listeners)?;
        let Listeners {
            client,
            peer,
            metrics,
        } = listeners;
        let storage = open_storage(&opts).await?;
        let (core, background) = start_raft(&opts, &tls, storage).await?;
        let api = build_api(&opts, &core);
        if background.seed.is_some() {
            // Before the client port serves (see `ApiInner::restoring`).
            api.0
                .restoring
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        let serving = serve_listeners(&opts, &tls, &core, &api, client, peer)?;
        let tasks = spawn_tasks(&opts, &core, &api, background, serving.health, metrics);
        Ok(Node {
            id: opts.id,
            tls,
            addr: opts.advertise,
            raft: core.raft,
            shared: core.shared,
            leadership: core.leadership,
            links: core.links,
            network: core.network,
            election_timeout: opts.timing.election_timeout.1,
            stop: core.stop,
            server: serving.server,
            tasks,
            log_closed: core.log_closed,
        })
    }
}

/// What [`open_storage`] opened: the stores Raft starts on, and what the
/// node keeps of them.
struct OpenedStorage {
    /// The log store, floored at the state machine's snapshot.
    log: LogStore,
    sm: StateMachineStore,
    /// Tells when every handle of the log store is gone.
    log_closed: crate::raft::log_store::StoreClosed,
    /// Whether the log store had no vote and no entry.
    fresh: bool,
    /// See [`OpenedLog::started_empty`].
    started_empty: bool,
    cluster: Arc<ClusterIdentity>,
    shared: Arc<Shared>,
    /// A failed sync of any write to the log.
    sync_failure: crate::raft::log_store::SyncFailure,
    /// The console's side table, already following the applied events.
    console_notes: Arc<crate::console::Notes>,
    console_follow: JoinHandle<()>,
}

/// Opens the log store and the state machine, and the node's shared state
/// with the console following it.
async fn open_storage(opts: &NodeOptions) -> anyhow::Result<OpenedStorage> {
    let OpenedLog {
        log: log_store,
        closed: log_closed,
        fresh,
        cluster,
        started_empty,
    } = open_log(opts).await?;
    let shared = Shared::new(log_store.committed_marker());
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
    Ok(OpenedStorage {
        log: log_store,
        sm,
        log_closed,
        fresh,
        started_empty,
        cluster,
        shared,
        sync_failure,
        console_notes,
        console_follow,
    })
}

/// The running node's handles, which every later phase shares and the
/// [`Node`] keeps.
struct Core {
    raft: Raft,
    network: Network,
    links: Arc<crate::raft::links::Links>,
    shared: Arc<Shared>,
    cluster: Arc<ClusterIdentity>,
    leadership: Arc<Leadership>,
    /// Tells the servers and tasks to stop.
    stop: watch::Sender<bool>,
    stop_rx: watch::Receiver<bool>,
    log_closed: crate::raft::log_store::StoreClosed,
}

impl Core {
    /// Resolves once the node is told to stop.
    fn stopped(&self) -> impl Future<Output = ()> {
        let mut stop_rx = self.stop_rx.clone();
        async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        }
    }
}

/// What the background tasks start from, besides the [`Core`].
struct Background {
    console_notes: Arc<crate::console::Notes>,
    console_follow: JoinHandle<()>,
    /// Peers that answer again after failing.
    peers_back: tokio::sync::mpsc::UnboundedReceiver<NodeId>,
    /// A backup waiting to be proposed (see [`seed_from_backup`]).
    seed: Option<PathBuf>,
    /// See [`OpenedLog::started_empty`].
    started_empty: bool,
}

/// Starts Raft on `storage` (bootstrapping the cluster with `--init` on a
/// fresh store) and the owner of its leadership.
async fn start_raft(
    opts: &NodeOptions,
    tls: &Option<Arc<crate::tls::NodeTls>>,
    storage: OpenedStorage,
) -> anyhow::Result<(Core, Background)> {
    let OpenedStorage {
        log: log_store,
        sm,
        log_closed,
        fresh,
        started_empty,
        cluster,
        shared,
        sync_failure,
        console_notes,
        console_follow,
    } = storage;
    let config = raft_config(&opts.timing)?;
    // Peers that answer again after failing: openraft's replication
    // backoff for them is reset, so they catch up at once.
    // Set by the owner of leadership while this node leads without a
    // quorum; sent to followers with every AppendEntries.
    let quorum_flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (peer_back, peers_back) = tokio::sync::mpsc::unbounded_channel();
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
    let core = Core {
        raft,
        network,
        links,
        shared,
        cluster,
        leadership,
        stop,
        stop_rx,
        log_closed,
    };
    let background = Background {
        console_notes,
        console_follow,
        peers_back,
        seed,
        started_empty,
    };
    Ok((core, background))
}

/// The API the client port serves, over the node's core.
fn build_api(opts: &NodeOptions, core: &Core) -> Api {
    Api::new(
        opts.id,
        opts.advertise.clone(),
        core.raft.clone(),
        core.shared.clone(),
        core.leadership.clone(),
        opts.auth.clone(),
        core.cluster.clone(),
    )
}

/// What [`serve_listeners`] started.
struct Serving {
    /// Serves the client listener and, if any, the peer listener.
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    /// Sets the gRPC health the client port serves.
    health: tonic_health::server::HealthReporter,
}

/// Serves clients on `client` and peers on `peer` (or on `client` too,
/// without one), until the node is told to stop.
fn serve_listeners(
    opts: &NodeOptions,
    tls: &Option<Arc<crate::tls::NodeTls>>,
    core: &Core,
    api: &Api,
    listener: Listener,
    peer_listener: Option<Listener>,
) -> anyhow::Result<Serving> {
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
    // The client port forwards to the leader what a follower would
    // refuse (`api::forward`); the peer port serves Raft only.
    let forward = crate::api::forward::ForwardLayer::new(
        opts.id,
        core.leadership.clone(),
        core.network.clone(),
        opts.auth.clone(),
    );
    // The internal Raft service: peers only, checked from the headers
    // before a body (up to a 16 MiB Raft message) is read.
    let raft_service = || {
        InterceptedService::new(
            RaftServer::new(RaftService::new(
                core.raft.clone(),
                opts.auth.clone(),
                core.cluster.clone(),
                core.leadership.clone(),
                core.shared.metrics.clone(),
                core.stop_rx.clone(),
                api.clone(),
            ))
            .max_decoding_message_size(crate::raft::MAX_RAFT_MESSAGE_BYTES)
            .max_encoding_message_size(crate::raft::MAX_RAFT_MESSAGE_BYTES),
            peers_only(opts.auth.clone()),
        )
    };
    let peer_server = peer_listener.map(|listener| {
        serve(
            server_builder(crate::api::forward::ForwardLayer::off()).add_service(raft_service()),
            listener,
            tls.clone(),
            core.stopped(),
        )
    });
    let client_server = {
        let max = crate::MAX_MESSAGE_BYTES;
        // HTTP/JSON beside gRPC (see `api::http`): different paths,
        // and HTTP/1.1 accepted on the same port.
        let http = tonic::service::Routes::from(crate::api::http::router(api.clone()));
        let router = server_builder(forward)
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
        serve(router, listener, tls.clone(), core.stopped())
    };
    let server = tokio::spawn(async move {
        match peer_server {
            None => client_server.await,
            Some(peer_server) => tokio::try_join!(client_server, peer_server).map(|_| ()),
        }
    });
    Ok(Serving { server, health })
}

/// Spawns the node's background tasks: the console's, the lease keeper,
/// the owner of leadership, the leader-change count, the peers' backoff
/// resets, and as the options and the data directory ask, the restore of
/// a backup, the join and the metrics server.
fn spawn_tasks(
    opts: &NodeOptions,
    core: &Core,
    api: &Api,
    background: Background,
    health: tonic_health::server::HealthReporter,
    metrics: Option<TcpListener>,
) -> Vec<JoinHandle<()>> {
    let Background {
        console_notes,
        console_follow,
        mut peers_back,
        seed,
        started_empty,
    } = background;
    let Core {
        raft,
        shared,
        leadership,
        ..
    } = core;
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
            network: core.network.clone(),
            auth: opts.auth.clone(),
        };
        tasks.push(tokio::spawn(joiner.run(core.stop_rx.clone())));
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
            core.stopped(),
        );
        tasks.push(tokio::spawn(async move {
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "metrics server failed");
            }
        }));
    }
    tasks
}

/// The log store a node starts on, and what starting it found.
struct OpenedLog {
    log: LogStore,
    /// Tells when every handle of the store is gone.
    closed: crate::raft::log_store::StoreClosed,
    /// Whether the store had no vote and no entry.
    fresh: bool,
    cluster: Arc<ClusterIdentity>,
    /// Whether it started with no data and no cluster id (see
    /// `crate::join`): taken before anything is adopted or bootstrapped.
    started_empty: bool,
}

/// Opens the data directory's log store (or the simulator's), binds it to
/// this node's id, and with `--init` on a fresh store creates the cluster
/// id.
async fn open_log(opts: &NodeOptions) -> anyhow::Result<OpenedLog> {
    std::fs::create_dir_all(&opts.data_dir)?;
    let log = LogStore::of(&opts.storage, &opts.data_dir, opts.storage_faults.clone())?;
    let closed = log.closed();
    log.check_node_id(opts.id).await?;
    let fresh = log.is_fresh();
    let cluster = Arc::new(ClusterIdentity::open(opts.id, log.clone()).await?);
    let started_empty = fresh && cluster.id() == 0;
    if opts.init && fresh {
        cluster.create().await?;
    }
    Ok(OpenedLog {
        log,
        closed,
        fresh,
        cluster,
        started_empty,
    })
}

/// The checks of `opts` against `listeners` made before anything is
/// opened, and the node's TLS: a certificate peers would refuse stops the
/// node here, named, before anything touches the data directory.
fn check_options(
    opts: &NodeOptions,
    listeners: &Listeners,
) -> anyhow::Result<Option<Arc<crate::tls::NodeTls>>> {
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
    Ok(match &opts.tls {
        None => None,
        Some(t) => {
            let hosts = advertised_hosts(opts)
                .into_iter()
                .map(String::from)
                .collect();
            let tls = crate::tls::NodeTls::new(t.clone(), hosts)
                .map_err(|e| anyhow::anyhow!("TLS: {e}"))?;
            Some(Arc::new(tls))
        }
    })
}

/// openraft's configuration for these timings.
fn raft_config(timing: &RaftTiming) -> anyhow::Result<openraft::Config> {
    Ok(openraft::Config {
        cluster_name: "raftlock".into(),
        heartbeat_interval: timing.heartbeat.as_millis() as u64,
        election_timeout_min: timing.election_timeout.0.as_millis() as u64,
        election_timeout_max: timing.election_timeout.1.as_millis() as u64,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(timing.snapshot_every),
        max_in_snapshot_log_to_keep: timing.logs_to_keep,
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
    .validate()?)
}

/// The servers' stack, on the client port and the peer port alike:
/// tonic's router under [`DeadlineLayer`](crate::api::deadline::DeadlineLayer)
/// and `forward` (off on the peer port).
fn server_builder(
    forward: crate::api::forward::ForwardLayer,
) -> tonic::transport::Server<
    tower::layer::util::Stack<
        crate::api::forward::ForwardLayer,
        tower::layer::util::Stack<
            crate::api::deadline::DeadlineLayer,
            tower::layer::util::Identity,
        >,
    >,
> {
    // TLS is terminated by `serve` (per connection, so that a
    // reload applies to the next connection), not by tonic.
    tonic::transport::Server::builder()
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
        .layer(forward)
}
