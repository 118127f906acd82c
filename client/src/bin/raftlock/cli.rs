//! The command line: global flags, subcommands, and the client options
//! they make.

use clap::{Args, Parser, Subcommand};
use raftlock_client::Error;

#[derive(Parser)]
#[command(name = "raftlock", version, about = "Command-line client for raftlock")]
pub struct Cli {
    /// Comma-separated node addresses.
    #[arg(
        long,
        global = true,
        env = "RAFTLOCK_ENDPOINTS",
        default_value = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"
    )]
    pub endpoints: String,
    /// PEM CA certificate of the cluster (enables TLS).
    #[arg(long, global = true, env = "RAFTLOCK_CA")]
    pub ca: Option<std::path::PathBuf>,
    /// PEM client certificate, for clusters that require one (mTLS).
    #[arg(long, global = true, env = "RAFTLOCK_CERT", requires = "key")]
    pub cert: Option<std::path::PathBuf>,
    /// PEM private key of --cert.
    #[arg(long, global = true, env = "RAFTLOCK_KEY", requires = "cert")]
    pub key: Option<std::path::PathBuf>,
    /// File holding the bearer token to send, for clusters with access
    /// control on (the first line is the token).
    #[arg(long, global = true, env = "RAFTLOCK_TOKEN_FILE")]
    pub token_file: Option<std::path::PathBuf>,
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Args)]
pub struct HoldArgs {
    /// Session ttl in seconds.
    #[arg(long, default_value_t = 10.0)]
    pub ttl: f64,
    /// Give up if not granted within this many seconds (default: wait
    /// forever).
    #[arg(long)]
    pub timeout: Option<f64>,
    /// If `raftlock` itself dies (SIGKILL, out of memory, a lost host
    /// connection), the cluster ends its session this many seconds after
    /// its keep-alive stream closes, instead of at the end of the ttl
    /// (0 turns this off). The lease is then counted, and renewed, by the
    /// smaller of the ttl and this grace: a `raftlock` paused longer than
    /// that sends CMD SIGTERM and exits 4. The default is the Rust
    /// client's (and the Go, Python and PHP clients').
    #[arg(long, default_value_t = raftlock_client::DEFAULT_END_ON_DISCONNECT.as_secs_f64())]
    pub end_on_disconnect: f64,
    /// The command to run while holding, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Run a command while holding a lock; the fence is in $RAFTLOCK_FENCE.
    /// Several names are taken atomically (all or none, in one request);
    /// $RAFTLOCK_FENCES then lists "FENCE NAME" per line.
    Lock {
        /// Lock name(s), 1 to 64.
        #[arg(required = true, num_args = 1..)]
        names: Vec<String>,
        /// Take a shared lock instead of an exclusive one.
        #[arg(long)]
        shared: bool,
        #[command(flatten)]
        hold: HoldArgs,
    },
    /// Run a command while holding semaphore permits.
    Sem {
        /// Semaphore name.
        name: String,
        /// The semaphore's capacity.
        #[arg(long)]
        capacity: u32,
        /// Permits to take.
        #[arg(long, default_value_t = 1)]
        weight: u32,
        #[command(flatten)]
        hold: HoldArgs,
    },
    /// Run a command while elected leader of NAME, announcing VALUE.
    Elect {
        /// Election name.
        name: String,
        /// The value followers see (e.g. this process's address).
        value: String,
        #[command(flatten)]
        hold: HoldArgs,
    },
    /// Show one lock or semaphore.
    Describe {
        /// Lock name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List locks and semaphores.
    List {
        /// Name prefix.
        #[arg(default_value = "")]
        prefix: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stream events for names starting with PREFIX.
    Watch {
        /// Name prefix.
        #[arg(default_value = "")]
        prefix: String,
        /// Print JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Show the leader's status.
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Back up the lock table, or restore a backup into an empty cluster.
    Snapshot {
        #[command(subcommand)]
        action: SnapshotCmd,
    },
    /// Act on sessions as an administrator.
    Session {
        #[command(subcommand)]
        action: SessionCmd,
    },
    /// List, add or remove cluster members, or move the leadership.
    Members {
        #[command(subcommand)]
        action: Option<MembersCmd>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum SnapshotCmd {
    /// Save a consistent copy of the lock table from the leader to FILE
    /// (mode 0600; checked before it is written).
    Save {
        /// Output file.
        file: std::path::PathBuf,
    },
    /// Restore FILE into an empty cluster.
    Restore {
        /// A file written by `snapshot save`.
        file: std::path::PathBuf,
        /// Added to the backup's fence counter. Default: enough that new
        /// fences start 2^32 above the time of the restore in microseconds
        /// since 1970 (and above the backup's last fence), which no earlier
        /// cluster's fence (restored or not) can have reached.
        /// 0 only if FILE is the old cluster's final state and is restored
        /// once. The backup's last fence plus the bump must not pass
        /// 2^63 - 1.
        #[arg(long)]
        fence_bump: Option<u64>,
    },
    /// Check FILE's checksum and print what it holds (cluster id, index,
    /// sessions, grants, last fence); exit 1 if it is damaged or not a
    /// backup. Needs no cluster.
    Inspect {
        /// A file written by `snapshot save`.
        file: std::path::PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum SessionCmd {
    /// End session ID now, as if its lease had run out (needs `admin`):
    /// its locks go to the next waiters with larger fences (after its
    /// lock-delay, if it has one); its client learns at its next
    /// keep-alive. Exit 1 if no such session is open.
    Revoke {
        /// The session id (as `describe` and `list` show it).
        id: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum MembersCmd {
    /// List members.
    List,
    /// Add node ID at ADDR (learner, catch-up, then voter).
    Add {
        /// Node id.
        id: u64,
        /// Node's client address host:port.
        addr: String,
        /// Its peer address host:port, if it runs with --peer-listen.
        #[arg(long)]
        peer_addr: Option<String>,
        /// How many seconds the leader waits for the new node to catch up
        /// (replicate the log up to its own addition) before promoting it
        /// (default 30; a node joining a large cluster may need more). If
        /// it has not caught up by then it stays a learner.
        #[arg(long, value_parser = catch_up_secs)]
        timeout: Option<std::time::Duration>,
    },
    /// Remove node ID.
    Remove {
        /// Node id.
        id: u64,
    },
    /// Hand the leadership to voter ID (default: the most up-to-date voter
    /// the leader hears from), before stopping the leader for maintenance.
    TransferLeader {
        /// Node id of the new leader.
        id: Option<u64>,
    },
}

/// The token in `path`: its first line, trimmed.
pub fn read_token(path: &std::path::Path) -> Result<String, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Config(format!("--token-file {}: {e}", path.display())))?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if token.is_empty() {
        return Err(Error::Config(format!(
            "--token-file {}: the file is empty",
            path.display()
        )));
    }
    Ok(token)
}

pub fn tls_options(cli: &Cli) -> Result<Option<raftlock_client::ClientTls>, Error> {
    let read = |flag: &str, p: &std::path::Path| {
        std::fs::read(p).map_err(|e| Error::Config(format!("{flag} {}: {e}", p.display())))
    };
    match (&cli.ca, &cli.cert, &cli.key) {
        (None, None, None) => Ok(None),
        (None, _, _) => Err(Error::Config("--cert/--key need --ca".into())),
        (Some(ca), cert, key) => {
            let identity = match (cert, key) {
                (Some(c), Some(k)) => Some((read("--cert", c)?, read("--key", k)?)),
                _ => None,
            };
            Ok(Some(raftlock_client::ClientTls {
                ca_pem: read("--ca", ca)?,
                identity,
            }))
        }
    }
}

/// The longest catch-up wait `members add --timeout` takes: a day.
pub const MAX_CATCH_UP_SECS: f64 = 86_400.0;

/// A catch-up wait in seconds: more than 0, at most [`MAX_CATCH_UP_SECS`].
fn catch_up_secs(s: &str) -> Result<std::time::Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(secs > 0.0 && secs <= MAX_CATCH_UP_SECS) {
        return Err(format!(
            "the catch-up wait must be more than 0 and at most {MAX_CATCH_UP_SECS} s, got {s}"
        ));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}
