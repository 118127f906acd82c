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

fn restore(
    file: &std::path::Path,
    data_dir: &std::path::Path,
    fence_bump: Option<u64>,
) -> anyhow::Result<()> {
    let bytes =
        std::fs::read(file).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
    let checked = raftlock_node::api::backup::check(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    if data_dir.join("sled").exists() {
        anyhow::bail!(
            "{} already holds a node's data; restore seeds a new cluster only",
            data_dir.display()
        );
    }
    // Without --fence-bump the bump is counted when the cluster applies the
    // backup (above the time it does so); checked here as of now.
    let bump_now = fence_bump.unwrap_or_else(|| checked.default_fence_bump_now());
    let first_fence = checked
        .table
        .fence_after_restore(bump_now)
        .map_err(|e| anyhow::anyhow!("--fence-bump {bump_now}: {e}"))?;
    std::fs::create_dir_all(data_dir)?;
    write_private(&data_dir.join(raftlock_node::node::RESTORE_FILE), &bytes)?;
    if let Some(bump) = fence_bump {
        write_private(
            &data_dir.join(raftlock_node::node::RESTORE_BUMP_FILE),
            bump.to_string().as_bytes(),
        )?;
    }
    let stats = checked.table.stats();
    let checksum = match &checked.header {
        Some(h) => format!(
            "checksum ok, cluster {:016x}, index {}",
            h.cluster_id, h.index
        ),
        None => "written before backup format 1: no checksum to check".into(),
    };
    let fences = if fence_bump.is_some() {
        format!("new fences start above {first_fence}")
    } else {
        format!(
            "by default, new fences start at least 2^32 above the time the cluster applies it, in \
             microseconds since 1970: above {first_fence} if it did so now"
        )
    };
    println!(
        "backup ({checksum}) with {} sessions, {} grants, last fence {} ({fences}) placed in {}; start this node with `raftlockd run --init ...`",
        stats.sessions,
        stats.grants,
        stats.last_fence,
        data_dir.display()
    );
    if first_fence == raftlock_node::state::limits::MAX_FENCE {
        eprintln!(
            "warning: the fence counter will be at the largest fence; the restored cluster can grant nothing (use a smaller --fence-bump)"
        );
    }
    Ok(())
}

/// `raftlockd export`: the backup of a stopped node's data directory.
async fn export(data_dir: &std::path::Path, out: &std::path::Path) -> anyhow::Result<()> {
    anyhow::ensure!(!out.exists(), "{} exists; not overwritten", out.display());
    let exported = raftlock_node::export::export(data_dir).await?;
    write_private(out, &exported.backup)?;
    sync_parent(out)?;
    let s = exported.stats;
    println!(
        "exported {} (cluster {:016x}, log index {}, of which committed as far as this node knew: {}) with {} sessions, {} grants, last fence {}: {} bytes",
        out.display(),
        exported.cluster_id,
        exported.index,
        exported
            .committed
            .map_or_else(|| "none".to_string(), |c| c.to_string()),
        s.sessions,
        s.grants,
        s.last_fence,
        exported.backup.len()
    );
    Ok(())
}

/// `run --force-new-cluster`: turns the data directory of a survivor of a
/// lost majority into the seed of a new cluster of this node alone (its
/// data exported, set aside, and placed as the backup `--init` restores).
async fn force_new_cluster(opts: &mut NodeOptions) -> anyhow::Result<()> {
    let dir = opts.data_dir.clone();
    let own = raftlock_node::raft::NodeAddrs::new(
        opts.advertise.clone(),
        opts.peer_advertise
            .clone()
            .unwrap_or_else(|| opts.advertise.clone()),
    );
    if dir.join(raftlock_node::node::RESTORE_FILE).exists() {
        // Stopped after setting the old data aside, before the new cluster
        // took the backup: this start finishes it.
        tracing::warn!(
            "--force-new-cluster: the new cluster's backup is still waiting in {}; bootstrapping \
             with it",
            dir.display()
        );
        opts.init = true;
        opts.peers = [(opts.id, own)].into_iter().collect();
        return Ok(());
    }
    let exported = raftlock_node::export::export(&dir).await?;
    anyhow::ensure!(
        !exported.voters.is_empty(),
        "--force-new-cluster: {} holds no membership (the node never joined a cluster); \
         nothing to start from",
        dir.display()
    );
    if exported.voters.keys().eq([&opts.id]) {
        tracing::warn!(
            "--force-new-cluster: node {} is already the only voter of its cluster; \
             starting as usual. Remove the flag",
            opts.id
        );
        return Ok(());
    }
    // A voter that still listens may be part of a majority that still
    // works (or the flag was left on after the cluster grew again): two
    // clusters would then grant the same locks. Refused.
    for (id, addrs) in exported.voters.iter().filter(|(id, _)| **id != opts.id) {
        let addr = &addrs.peer_addr;
        let connect = tokio::net::TcpStream::connect(addr.as_str());
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), connect).await {
            anyhow::bail!(
                "--force-new-cluster refused: node {id} of this node's cluster answers at {addr}, \
                 so its majority may still work and two clusters would grant the same locks. \
                 Stop every other node of the old cluster first (and remove the flag once this \
                 node runs a cluster again)"
            );
        }
    }
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let aside = dir.join(format!("{FORCED_ASIDE_PREFIX}{secs}"));
    std::fs::create_dir(&aside)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", aside.display()))?;
    for entry in std::fs::read_dir(&dir)? {
        let name = entry?.file_name();
        if name.to_string_lossy().starts_with(FORCED_ASIDE_PREFIX) {
            continue;
        }
        std::fs::rename(dir.join(&name), aside.join(&name))
            .map_err(|e| anyhow::anyhow!("cannot move {:?} aside: {e}", name))?;
    }
    std::fs::File::open(&aside)?.sync_all()?;
    write_private(
        &dir.join(raftlock_node::node::RESTORE_FILE),
        &exported.backup,
    )?;
    std::fs::File::open(&dir)?.sync_all()?;
    opts.init = true;
    opts.peers = [(opts.id, own)].into_iter().collect();
    let s = exported.stats;
    tracing::warn!(
        node = opts.id,
        old_cluster = format!("{:016x}", exported.cluster_id),
        old_voters = ?exported.voters.keys().collect::<Vec<_>>(),
        index = exported.index,
        committed = ?exported.committed,
        sessions = s.sessions,
        grants = s.grants,
        last_fence = s.last_fence,
        aside = %aside.display(),
        "--force-new-cluster: starting a new cluster of this node alone from its own data \
         (fences continue above the last one it knew); grow it with `raftlock members add`, \
         and remove the flag"
    );
    Ok(())
}

/// The name of the directory `--force-new-cluster` moves a data
/// directory's old contents into (followed by the time in Unix seconds).
const FORCED_ASIDE_PREFIX: &str = "before-force-new-cluster-";

/// Syncs the directory `path` is in, so that a file just created there
/// stays after a crash.
fn sync_parent(path: &std::path::Path) -> anyhow::Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    std::fs::File::open(parent)
        .and_then(|d| d.sync_all())
        .map_err(|e| anyhow::anyhow!("cannot sync {}: {e}", parent.display()))
}

/// Writes `bytes` to `path`, readable and writable by this user only
/// (0600): a backup holds every session's owner and every holder's value.
fn write_private(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
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

/// What `SIGHUP` reloads.
struct Reload {
    /// The node's access control.
    auth: Arc<Auth>,
    /// The ACL file, if access control is on.
    acl_file: Option<PathBuf>,
    /// The node's TLS, if on.
    tls: Option<Arc<raftlock_node::tls::NodeTls>>,
    /// Where the TLS files are.
    settings: Config,
}

/// SIGHUPs, caught from the moment this is made: made before the node
/// binds its ports, so that a reload sent as soon as the port answers
/// (a service manager's, right after a start) does not end the process.
struct Hangups {
    #[cfg(unix)]
    signal: Option<tokio::signal::unix::Signal>,
}

impl Hangups {
    /// Catches SIGHUP from now on (the reloads wait until the node runs).
    fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let signal = signal(SignalKind::hangup())
                .map_err(|e| {
                    tracing::warn!(%e, "cannot install a SIGHUP handler; nothing will be reloaded")
                })
                .ok();
            Hangups { signal }
        }
        #[cfg(not(unix))]
        Hangups {}
    }
}

/// On every SIGHUP: reloads the ACL file (a file that does not parse is
/// logged and the ACL in force stays; streams whose credentials the new one
/// drops end at once) and the TLS certificate, key and CA (files the node
/// would refuse at start are logged and the TLS in force stays; the new
/// ones apply to connections made from then on).
async fn reload_on_sighup(hangups: Hangups, reload: Reload) {
    #[cfg(unix)]
    {
        let Some(mut hup) = hangups.signal else {
            return;
        };
        while hup.recv().await.is_some() {
            if let Some(path) = &reload.acl_file {
                match raftlock_node::auth::Acl::load(path) {
                    Ok(acl) => {
                        let rules = acl.rules().len();
                        match reload.auth.replace(acl) {
                            Ok(()) => tracing::info!(path = %path.display(), rules, "ACL reloaded"),
                            Err(e) => tracing::warn!(%e, "ACL not reloaded"),
                        }
                    }
                    Err(e) => {
                        tracing::error!(%e, "ACL not reloaded; the previous one stays in force")
                    }
                }
            }
            if let Some(tls) = &reload.tls {
                let loaded = match reload.settings.tls() {
                    Ok(Some(options)) => tls.reload(options),
                    Ok(None) => Err("the TLS settings are gone".into()),
                    Err(e) => Err(e.to_string()),
                };
                match loaded {
                    Ok(()) => tracing::info!(
                        "TLS reloaded: connections made from now on get the new certificate and CA"
                    ),
                    Err(e) => tracing::error!(
                        error = %e,
                        "TLS not reloaded; the certificate, key and CA in force stay"
                    ),
                }
            }
            if reload.acl_file.is_none() && reload.tls.is_none() {
                tracing::info!("SIGHUP: nothing to reload (no ACL file, no TLS)");
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (hangups, reload);
    }
}

/// Exit status of a node whose Raft core stopped on a fatal error.
const EXIT_FATAL: i32 = 70;

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
