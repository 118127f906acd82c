//! `raftlockd`: the raftlock server.
//!
//! * `raftlockd run --id N --listen ADDR --data-dir DIR [--peers ..] [--init]`
//!   runs one node of a cluster.
//! * `raftlockd dev` runs a whole local cluster in one process, for trying
//!   raftlock out and for development.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use raftlock_node::auth::Auth;
use raftlock_node::config::Config;
use raftlock_node::node::{Listeners, Node, NodeOptions, RaftTiming};
use raftlock_node::raft::NodeAddrs;
use tokio::net::TcpListener;

mod backup;
mod signals;

use backup::{export, force_new_cluster, restore};
use signals::{reload_on_sighup, wait_for_signal, Hangups, Reload};

#[derive(Parser)]
#[command(
    name = "raftlockd",
    version,
    about = "raftlock server: a Raft-replicated lock service"
)]
struct Cli {
    /// Log format: `text` or `json` (one JSON object per line). The level
    /// comes from RUST_LOG (default: info).
    #[arg(
        long,
        global = true,
        env = "RAFTLOCK_LOG_FORMAT",
        default_value = "text"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run one node of a cluster.
    Run(Box<RunArgs>),
    /// Run a local N-node cluster on 127.0.0.1 in this process.
    Dev(DevArgs),
    /// Seed a new cluster from a backup (`raftlock snapshot save`): checks
    /// FILE and leaves it in DATA_DIR; start that node with `run --init`
    /// and, once it leads the new cluster, it restores the backup.
    Restore {
        /// The backup file.
        file: PathBuf,
        /// The (empty) data directory of the node that will bootstrap.
        #[arg(long)]
        data_dir: PathBuf,
        /// Added to the backup's fence counter. Default: enough that new
        /// fences start 2^32 above the time the cluster applies it, in
        /// microseconds since 1970 (and above the backup's last fence),
        /// which no fence of an earlier cluster (restored or not) can have
        /// reached. 0 only if FILE is the old cluster's final state and is
        /// restored once.
        #[arg(long)]
        fence_bump: Option<u64>,
    },
    /// Make a backup offline from a stopped node's data directory, for a
    /// cluster that has lost its majority: everything the node has (its
    /// snapshot and every log entry after it), in the format of `raftlock
    /// snapshot save` (`raftlock snapshot inspect FILE` checks it; `raftlockd
    /// restore FILE` seeds a new cluster with it).
    Export {
        /// The stopped node's data directory.
        #[arg(long)]
        data_dir: PathBuf,
        /// The backup file to write (refused if it exists).
        #[arg(long)]
        out: PathBuf,
    },
    /// Say whether a stopped node's data directory is empty as `run`
    /// counts it: prints `empty` (no vote and no log entry: the node never
    /// took part in a cluster, and `run --init` would bootstrap it, even if
    /// an interrupted first start left files) or `used`; exits 0 for
    /// either, 1 on an error (a node running on it, say).
    DataState {
        /// The stopped node's data directory.
        #[arg(long)]
        data_dir: PathBuf,
    },
    /// Print the SHA-256 of a token read from stdin, for an ACL file's
    /// `sha256 = "..."` (so the file need not hold the token itself).
    HashToken,
    /// Ask a node's metrics port whether it is live or ready (for container
    /// health checks, which have no HTTP client): prints the answer, exits
    /// 0 for `200`, 1 otherwise.
    Probe {
        /// `livez` (the Raft core runs) or `readyz` (it can serve now).
        check: ProbeCheck,
        /// The node's metrics address (`--metrics-listen`).
        #[arg(default_value = "127.0.0.1:9101")]
        addr: String,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ProbeCheck {
    Livez,
    Readyz,
}

#[derive(Args)]
struct RunArgs {
    /// TOML file with any of the settings below (flags and env override it).
    #[arg(long, env = "RAFTLOCK_CONFIG")]
    config: Option<PathBuf>,
    /// After losing a majority: start this node from its own data as the
    /// only voter of a new cluster (a new cluster id), keeping everything
    /// it has, with fences continuing above every fence it knew; grow it
    /// again with `raftlock members add`. Its old data is kept aside in
    /// DATA_DIR/before-force-new-cluster-UNIX_SECS. Does nothing on a node
    /// that is already its cluster's only voter; remove the flag once the
    /// node runs (docs/operations/backup-and-recovery.md, "Losing a
    /// majority").
    #[arg(long)]
    force_new_cluster: bool,
    #[command(flatten)]
    settings: Config,
}

#[derive(Args)]
struct DevArgs {
    /// Number of nodes.
    #[arg(long, default_value_t = 3)]
    nodes: u64,
    /// Port of node 1; node N listens on base-port + N - 1.
    #[arg(long, default_value_t = 7101)]
    base_port: u16,
    /// Data directory; node N keeps its data in DATA_DIR/node-N.
    #[arg(long, default_value = "./raftlock-dev")]
    data_dir: PathBuf,
    /// Port of node 1's metrics endpoint; node N serves GET /metrics on
    /// metrics-base-port + N - 1 (0: no metrics).
    #[arg(long, default_value_t = 9101)]
    metrics_base_port: u16,
    /// Turn access control on with this ACL file, on every node (SIGHUP
    /// reloads it).
    #[arg(long)]
    acl_file: Option<PathBuf>,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=error,sled=warn"));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => fmt.init(),
        LogFormat::Json => fmt.json().init(),
    }
}

/// The allocator (see docs/performance/tuning.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let result = match cli.command {
        Command::Run(args) => run(*args).await,
        Command::Dev(args) => dev(args).await,
        Command::Restore {
            file,
            data_dir,
            fence_bump,
        } => restore(&file, &data_dir, fence_bump),
        Command::Export { data_dir, out } => export(&data_dir, &out).await,
        Command::DataState { data_dir } => {
            raftlock_node::export::is_empty(&data_dir).map(|empty| {
                println!("{}", if empty { "empty" } else { "used" });
            })
        }
        Command::HashToken => hash_token(),
        Command::Probe { check, addr } => probe(check, &addr).await,
    };
    if let Err(e) = result {
        eprintln!("raftlockd: {e:#}");
        std::process::exit(1);
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    // Before anything binds: from then on a SIGHUP is a reload, never the
    // signal's default action (the end of the process).
    let hangups = Hangups::install();
    let flags = args.settings;
    let file = match &args.config {
        Some(path) => Config::from_toml_file(path)?,
        None => Config::default(),
    };
    let merged = flags.or(file);
    let (mut opts, listen) = merged.validate()?;
    if args.force_new_cluster {
        force_new_cluster(&mut opts).await?;
    }
    // Under systemd (`Type=notify`): checked before anything else happens,
    // so a bad variable stops the node at once, named.
    #[cfg(unix)]
    let notifier = raftlock_node::systemd::Notifier::from_env()
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .map(Arc::new);
    let listener = TcpListener::bind(listen.client)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", listen.client))?;
    let peer_listener = match listen.peer {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {addr} for peers: {e}"))?,
        ),
        None => None,
    };
    let metrics_listen = merged.metrics_listen;
    let metrics = match metrics_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {addr} for metrics: {e}"))?,
        ),
        None => None,
    };
    warn_on_clear_tokens(&opts);
    if merged.acl_file.is_none() && !opts.tls.as_ref().is_some_and(|t| t.client_auth) {
        // Only with --insecure-peers (or a single-node cluster, which has
        // no peers yet); `raftlockd dev` stays quiet: it listens on
        // loopback only.
        let peer_port = listen.peer.unwrap_or(listen.client);
        tracing::warn!(
            peer_listen = %peer_port,
            "NO PEER AUTHENTICATION: anyone who can reach {peer_port} can call the internal \
             Raft service and rewrite the replicated log (and every lock in it). Set acl_file \
             (with a peer_token) on every node, or keep that port reachable from the cluster's \
             nodes only (--peer-listen gives peers a port of their own to firewall)"
        );
    }
    let auth = opts.auth.clone();
    let listeners = Listeners {
        client: listener.into(),
        peer: peer_listener.map(Into::into),
        metrics,
    };
    let node = Node::start_with(opts, listeners).await?;
    // SIGHUP re-reads the ACL file and the TLS files (never ends the node).
    tokio::spawn(reload_on_sighup(
        hangups,
        Reload {
            auth,
            acl_file: merged.acl_file.clone(),
            tls: node.tls(),
            settings: merged.clone(),
        },
    ));
    // READY=1 once it can serve, WATCHDOG=1 while its core runs.
    #[cfg(unix)]
    if let Some(notifier) = &notifier {
        tokio::spawn(raftlock_node::systemd::notify(
            node.leadership.clone(),
            notifier.clone(),
            raftlock_node::systemd::watchdog_from_env(),
        ));
    }
    tracing::info!(
        id = node.id,
        addr = %node.addr,
        peer_listen = ?listen.peer,
        metrics = ?metrics_listen,
        "raftlockd serving"
    );
    tokio::select! {
        // A leader hands its leadership over first, so that a planned stop
        // (a rolling restart) costs grants a pause of milliseconds instead
        // of a lease and an election.
        _ = wait_for_signal() => node.hand_over().await,
        cause = node.failed() => fail_stop(node.id, &cause),
        removed = node.removed() => {
            // Status 0: a supervisor must not start it again into a
            // cluster that removed it (systemd's Restart=on-failure and
            // Kubernetes' OnFailure leave it stopped).
            tracing::warn!(
                "{removed}; exiting. Delete its data directory; to bring the machine back, \
                 add it again as docs/operations/membership.md's \"Replace a dead node\" says \
                 (a new id; under Kubernetes, its own id)"
            );
        }
    }
    #[cfg(unix)]
    if let Some(notifier) = &notifier {
        let _ = notifier.send("STOPPING=1");
    }
    tracing::info!("shutting down");
    node.shutdown().await;
    Ok(())
}

/// Ends the process after a fatal error of node `id`'s Raft core: health
/// already says `NOT_SERVING`; a node never runs on with a dead core. The
/// supervisor (systemd's `Restart=`, Kubernetes) starts it again and Raft
/// catches it up.
fn fail_stop(id: u64, cause: &str) -> ! {
    tracing::error!(
        node = id,
        "FATAL: {cause}; exiting so that the supervisor restarts this node"
    );
    eprintln!("raftlockd: node {id}: fatal: {cause}");
    std::process::exit(EXIT_FATAL)
}

async fn dev(args: DevArgs) -> anyhow::Result<()> {
    // As in `run`, before anything binds, when there is something to
    // reload (without an ACL file SIGHUP ends `raftlockd dev`, as it ends
    // a program whose terminal closes).
    let hangups = args.acl_file.is_some().then(Hangups::install);
    anyhow::ensure!((1..=9).contains(&args.nodes), "--nodes must be 1..=9");
    let addr = |i: u64| format!("127.0.0.1:{}", u64::from(args.base_port) + i - 1);
    let peers: BTreeMap<u64, NodeAddrs> = (1..=args.nodes)
        .map(|i| (i, NodeAddrs::shared(addr(i))))
        .collect();
    // Bind every port first, then start node 1 (the one that bootstraps)
    // last, so its first election finds its peers listening.
    let mut listeners = Vec::new();
    for i in 1..=args.nodes {
        let listener = TcpListener::bind(addr(i))
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", addr(i)))?;
        listeners.push((i, listener));
    }
    let acl = match &args.acl_file {
        None => None,
        Some(path) => Some(raftlock_node::auth::Acl::load(path)?),
    };
    let auth = Arc::new(Auth::new(acl));
    if let (Some(path), Some(hangups)) = (args.acl_file.clone(), hangups) {
        tokio::spawn(reload_on_sighup(
            hangups,
            Reload {
                auth: auth.clone(),
                acl_file: Some(path),
                tls: None,
                settings: Config::default(),
            },
        ));
    }
    let mut nodes = Vec::new();
    for (i, listener) in listeners.into_iter().rev() {
        let opts = NodeOptions {
            id: i,
            advertise: addr(i),
            peer_advertise: None,
            data_dir: args.data_dir.join(format!("node-{i}")),
            peers: peers.clone(),
            init: i == 1,
            timing: RaftTiming::default(),
            dial: BTreeMap::new(),
            tls: None,
            auth: auth.clone(),
            storage_faults: Default::default(),
            prefix_labels: Default::default(),
            connector: None,
            storage: Default::default(),
            join: Vec::new(),
        };
        let metrics = match args.metrics_base_port {
            0 => None,
            base => {
                let addr = format!("127.0.0.1:{}", u64::from(base) + i - 1);
                let l = TcpListener::bind(&addr)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot listen on {addr} for metrics: {e}"))?;
                tracing::info!(node = i, %addr, "metrics at http://{addr}/metrics");
                Some(l)
            }
        };
        nodes.push(Node::start_with_metrics(opts, listener, metrics).await?);
    }
    nodes.reverse();
    for node in &nodes {
        println!("node {} {}", node.id, node.addr);
    }
    let mut metrics = nodes[0].raft.metrics();
    let elected = tokio::time::timeout(Duration::from_secs(30), async {
        raftlock_node::raft::wait_metrics(&mut metrics, |m| m.current_leader.is_some())
            .await
            .is_some()
    });
    let stopped_early = tokio::select! {
        r = elected => {
            anyhow::ensure!(matches!(r, Ok(true)), "no leader elected within 30 s");
            println!("ready");
            false
        }
        _ = wait_for_signal() => true,
    };
    if !stopped_early {
        let failed = futures::future::select_all(
            nodes
                .iter()
                .map(|n| Box::pin(async move { (n.id, n.failed().await) })),
        );
        tokio::select! {
            _ = wait_for_signal() => {}
            ((id, cause), _, _) = failed => fail_stop(id, &cause),
        }
    }
    for node in nodes {
        node.shutdown().await;
    }
    Ok(())
}

/// How long `raftlockd probe` waits for the answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

async fn probe(check: ProbeCheck, addr: &str) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let path = match check {
        ProbeCheck::Livez => "/livez",
        ProbeCheck::Readyz => "/readyz",
    };
    let exchange = async {
        let mut conn = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot reach {addr}: {e}"))?;
        conn.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut raw = Vec::new();
        conn.read_to_end(&mut raw).await?;
        anyhow::Ok(String::from_utf8_lossy(&raw).into_owned())
    };
    let answer = tokio::time::timeout(PROBE_TIMEOUT, exchange)
        .await
        .map_err(|_| anyhow::anyhow!("no answer from {addr} within {PROBE_TIMEOUT:?}"))??;
    let code = answer.split(' ').nth(1).unwrap_or("");
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b).trim();
    anyhow::ensure!(code == "200", "{path} at {addr}: {code} {body}");
    println!("{body}");
    Ok(())
}

fn hash_token() -> anyhow::Result<()> {
    let mut token = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut token)?;
    let token = token.trim_end_matches(['\r', '\n']);
    anyhow::ensure!(!token.is_empty(), "no token on stdin");
    println!("{}", raftlock_node::auth::token_sha256_hex(token));
    Ok(())
}

/// Bearer tokens over plaintext can be read by anyone on the path.
fn warn_on_clear_tokens(opts: &NodeOptions) {
    if opts.auth.current().is_some() && opts.tls.is_none() {
        tracing::warn!(
            "access control is on without TLS: tokens (client and peer) cross the network \
             in clear text; set tls_cert, tls_key and tls_ca"
        );
    }
}

/// Exit status of a node whose Raft core stopped on a fatal error.
const EXIT_FATAL: i32 = 70;
