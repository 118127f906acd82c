//! `raftlock`: the command-line tool.
//!
//! Exit codes: the command's own code for `lock`, `sem` and `elect`
//! (128 + N if it died of signal N); 3 if the lock was not granted in time;
//! 4 if the lease was lost while the command ran (it is sent SIGTERM); 1 for
//! any other error; 2 for bad usage.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use raftlock_client::proto::{self as pb, EventKind, LockInfo};
use raftlock_client::{Client, Election, Error, Guard, Session, SessionOptions};
use serde_json::json;

const NOT_ACQUIRED: u8 = 3;
const LEASE_LOST: u8 = 4;

#[derive(Parser)]
#[command(name = "raftlock", version, about = "Command-line client for raftlock")]
struct Cli {
    /// Comma-separated node addresses.
    #[arg(
        long,
        global = true,
        env = "RAFTLOCK_ENDPOINTS",
        default_value = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"
    )]
    endpoints: String,
    /// PEM CA certificate of the cluster (enables TLS).
    #[arg(long, global = true, env = "RAFTLOCK_CA")]
    ca: Option<std::path::PathBuf>,
    /// PEM client certificate, for clusters that require one (mTLS).
    #[arg(long, global = true, env = "RAFTLOCK_CERT", requires = "key")]
    cert: Option<std::path::PathBuf>,
    /// PEM private key of --cert.
    #[arg(long, global = true, env = "RAFTLOCK_KEY", requires = "cert")]
    key: Option<std::path::PathBuf>,
    /// File holding the bearer token to send, for clusters with access
    /// control on (the first line is the token).
    #[arg(long, global = true, env = "RAFTLOCK_TOKEN_FILE")]
    token_file: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Args)]
struct HoldArgs {
    /// Session ttl in seconds.
    #[arg(long, default_value_t = 10.0)]
    ttl: f64,
    /// Give up if not granted within this many seconds (default: wait
    /// forever).
    #[arg(long)]
    timeout: Option<f64>,
    /// The command to run while holding, after `--`.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a command while holding a lock; the fence is in $RAFTLOCK_FENCE.
    Lock {
        /// Lock name.
        name: String,
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
    /// List, add or remove cluster members.
    Members {
        #[command(subcommand)]
        action: Option<MembersCmd>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum SnapshotCmd {
    /// Save a consistent copy of the lock table from the leader to FILE.
    Save {
        /// Output file.
        file: std::path::PathBuf,
    },
    /// Restore FILE into an empty cluster.
    Restore {
        /// A file written by `snapshot save`.
        file: std::path::PathBuf,
        /// Added to the backup's fence counter (default 2^32): more than
        /// the old cluster can have granted after the backup was taken.
        /// 0 only if FILE is the old cluster's final state.
        #[arg(long)]
        fence_bump: Option<u64>,
    },
}

#[derive(Subcommand)]
enum MembersCmd {
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
    },
    /// Remove node ID.
    Remove {
        /// Node id.
        id: u64,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    // Die quietly on a closed pipe (`raftlock list | head`), like other
    // command-line tools, instead of panicking in println!.
    // SAFETY: restoring the default disposition of SIGPIPE at start-up,
    // before any other thread exists that could rely on it.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let tls = match tls_options(&cli) {
        Ok(tls) => tls,
        Err(e) => {
            eprintln!("raftlock: {e}");
            return ExitCode::from(2);
        }
    };
    let token = match cli.token_file.as_deref().map(read_token).transpose() {
        Ok(token) => token,
        Err(e) => {
            eprintln!("raftlock: {e}");
            return ExitCode::from(2);
        }
    };
    let options = raftlock_client::ClientOptions {
        tls,
        token,
        ..Default::default()
    };
    let client = match Client::with_options(cli.endpoints.split(','), options) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("raftlock: {e}");
            return ExitCode::from(2);
        }
    };
    match run(client, cli.command).await {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("raftlock: {e}");
            ExitCode::from(1)
        }
    }
}

/// The token in `path`: its first line, trimmed.
fn read_token(path: &std::path::Path) -> Result<String, Error> {
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

fn tls_options(cli: &Cli) -> Result<Option<raftlock_client::ClientTls>, Error> {
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

async fn run(client: Client, cmd: Cmd) -> Result<u8, Error> {
    match cmd {
        Cmd::Lock { name, shared, hold } => {
            let session = open(&client, &hold).await?;
            let guard = session
                .lock_with(&name, shared, timeout(&hold), Vec::new())
                .await;
            hold_and_run(session, guard, &name, &hold).await
        }
        Cmd::Sem {
            name,
            capacity,
            weight,
            hold,
        } => {
            let session = open(&client, &hold).await?;
            let sem = session.semaphore(&name, capacity);
            let guard = match timeout(&hold) {
                Some(t) => sem.acquire_timeout(weight, t).await,
                None => sem.acquire(weight).await,
            };
            hold_and_run(session, guard, &name, &hold).await
        }
        Cmd::Elect { name, value, hold } => {
            let session = open(&client, &hold).await?;
            let mut election = Election::new(session.clone(), &name);
            let campaign = election.campaign(value.into_bytes());
            let fence = match timeout(&hold) {
                Some(t) => tokio::time::timeout(t, campaign)
                    .await
                    .unwrap_or(Err(Error::NotAcquired(t))),
                None => campaign.await,
            };
            match fence {
                Ok(fence) => {
                    let code = run_child(&session, &name, fence, &hold.command).await;
                    if session.is_valid() {
                        election.resign().await.ok();
                    }
                    finish(&session, None).await;
                    code
                }
                Err(e) => not_acquired(e, &name, &session).await,
            }
        }
        Cmd::Describe { name, json } => {
            let info = client.describe(&name).await?;
            if json {
                println!("{}", info.as_ref().map_or(json!(null), info_json));
            } else {
                match info {
                    None => println!("{name}: free"),
                    Some(info) => print_info(&info),
                }
            }
            Ok(0)
        }
        Cmd::List { prefix, json } => {
            let all = client.list(&prefix).await?;
            if json {
                println!("{}", json!(all.iter().map(info_json).collect::<Vec<_>>()));
            } else if all.is_empty() {
                println!("(none)");
            } else {
                for info in &all {
                    print_info(info);
                }
            }
            Ok(0)
        }
        Cmd::Watch { prefix, json } => {
            let mut events = client.watch(&prefix, true).await?;
            loop {
                match events.message().await {
                    Ok(Some(e)) => print_event(&e, json),
                    Ok(None) => return Ok(0),
                    Err(status) => return Err(Error::Unavailable(status.message().to_string())),
                }
            }
        }
        Cmd::Status { json } => {
            let s = client.status().await?;
            if json {
                println!("{}", status_json(&s));
            } else {
                println!(
                    "node {} at {} is {} (term {})",
                    s.id, s.addr, s.role, s.term
                );
                println!("leader: {} {}", s.leader_id, s.leader_addr);
                println!(
                    "commit {} applied {} last log {}",
                    s.commit_index, s.applied_index, s.last_log_index
                );
                println!(
                    "sessions {} grants {} waiters {} last fence {}",
                    s.sessions, s.grants, s.waiters, s.last_fence
                );
                print_members(&s.members);
            }
            Ok(0)
        }
        Cmd::Snapshot {
            action: SnapshotCmd::Save { file },
        } => {
            let backup = client.backup().await?;
            std::fs::write(&file, &backup.snapshot)
                .map_err(|e| Error::Config(format!("cannot write {}: {e}", file.display())))?;
            println!(
                "saved {} bytes at index {} (last fence {}) to {}",
                backup.snapshot.len(),
                backup.index,
                backup.last_fence,
                file.display()
            );
            Ok(0)
        }
        Cmd::Snapshot {
            action: SnapshotCmd::Restore { file, fence_bump },
        } => {
            let bytes = std::fs::read(&file)
                .map_err(|e| Error::Config(format!("cannot read {}: {e}", file.display())))?;
            let r = client.restore_with(bytes, fence_bump).await?;
            println!(
                "restored {} sessions; fences continue after {}",
                r.sessions, r.last_fence
            );
            Ok(0)
        }
        Cmd::Members { action, json } => {
            let members = match action.unwrap_or(MembersCmd::List) {
                MembersCmd::List => client.members().await?.members,
                MembersCmd::Add {
                    id,
                    addr,
                    peer_addr,
                } => {
                    client
                        .add_node_with_peer_addr(id, &addr, peer_addr.as_deref(), false)
                        .await?
                }
                MembersCmd::Remove { id } => client.remove_node(id).await?,
            };
            if json {
                println!(
                    "{}",
                    json!(members.iter().map(member_json).collect::<Vec<_>>())
                );
            } else {
                print_members(&members);
            }
            Ok(0)
        }
    }
}

fn timeout(hold: &HoldArgs) -> Option<Duration> {
    hold.timeout.map(|t| Duration::from_secs_f64(t.max(0.0)))
}

async fn open(client: &Client, hold: &HoldArgs) -> Result<Session, Error> {
    if !(hold.ttl.is_finite() && hold.ttl > 0.0) {
        return Err(Error::InvalidArgument(format!(
            "--ttl must be positive, got {}",
            hold.ttl
        )));
    }
    client
        .session_with(SessionOptions {
            ttl: Duration::from_secs_f64(hold.ttl),
            ..SessionOptions::default()
        })
        .await
}

async fn not_acquired(e: Error, name: &str, session: &Session) -> Result<u8, Error> {
    session.close().await.ok();
    match e {
        Error::NotAcquired(t) => {
            eprintln!(
                "raftlock: {name} not acquired within {:.1} s",
                t.as_secs_f64()
            );
            Ok(NOT_ACQUIRED)
        }
        e => Err(e),
    }
}

async fn hold_and_run(
    session: Session,
    guard: Result<Guard, Error>,
    name: &str,
    hold: &HoldArgs,
) -> Result<u8, Error> {
    let guard = match guard {
        Ok(g) => g,
        Err(e) => return not_acquired(e, name, &session).await,
    };
    let code = run_child(&session, name, guard.fence(), &hold.command).await;
    finish(&session, Some(guard)).await;
    code
}

/// Gives back what was held, unless the lease is already gone (then the
/// cluster has released it, or will at expiry, and there may be nobody to
/// answer).
async fn finish(session: &Session, guard: Option<Guard>) {
    if !session.is_valid() {
        return;
    }
    if let Some(g) = guard {
        g.release().await.ok();
    }
    session.close().await.ok();
}

/// Runs the command with the fence in its environment. If the lease may
/// be lost meanwhile, says so and sends the command SIGTERM.
async fn run_child(
    session: &Session,
    name: &str,
    fence: u64,
    command: &[String],
) -> Result<u8, Error> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| Error::InvalidArgument("no command".into()))?;
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env("RAFTLOCK_FENCE", fence.to_string())
        .env("RAFTLOCK_NAME", name)
        .env("RAFTLOCK_SESSION", session.id().to_string());
    // If raftlock dies (SIGKILL, OOM), the command must not go on running
    // as if it held the lock: the kernel sends it SIGTERM. (The signal is
    // tied to the thread that forks; tokio forks on a runtime worker,
    // which lives as long as raftlock.)
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls (prctl, getppid, raise) between
    // fork and exec.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // raftlock died before the line above: act on it now.
            if libc::getppid() != parent {
                libc::raise(libc::SIGTERM);
            }
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .map_err(|e| Error::InvalidArgument(format!("cannot run {program}: {e}")))?;
    let mut lost = false;
    let status = tokio::select! {
        status = child.wait() => status,
        _ = session.lost() => {
            lost = true;
            eprintln!("raftlock: lease on {name} may be lost; sending SIGTERM to {program}");
            signal_child(&child, libc::SIGTERM);
            child.wait().await
        }
        _ = shutdown_signal() => {
            signal_child(&child, libc::SIGTERM);
            child.wait().await
        }
    }
    .map_err(|e| Error::Internal(format!("waiting for {program}: {e}")))?;
    if lost {
        return Ok(LEASE_LOST);
    }
    Ok(exit_code(status))
}

fn signal_child(child: &tokio::process::Child, signal: libc::c_int) {
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) with a pid we spawned and have not reaped yet.
        unsafe {
            libc::kill(pid as libc::pid_t, signal);
        }
    }
}

fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(s)) => 128u8.wrapping_add(s as u8),
        _ => 1,
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

fn mode_name(mode: i32) -> &'static str {
    match pb::Mode::try_from(mode) {
        Ok(pb::Mode::Exclusive) => "exclusive",
        Ok(pb::Mode::Shared) => "shared",
        Ok(pb::Mode::Semaphore) => "semaphore",
        Err(_) => "unknown",
    }
}

fn info_json(i: &LockInfo) -> serde_json::Value {
    json!({
        "name": i.name,
        "semaphore": i.semaphore,
        "capacity": i.capacity,
        "lock_delayed": i.lock_delayed,
        "holders": i.holders.iter().map(|h| json!({
            "session": h.session_id, "fence": h.fence, "mode": mode_name(h.mode),
            "weight": h.weight, "value": String::from_utf8_lossy(&h.value), "index": h.granted_index,
        })).collect::<Vec<_>>(),
        "waiters": i.waiters.iter().map(|w| json!({
            "session": w.session_id, "seq": w.seq, "mode": mode_name(w.mode),
            "weight": w.weight, "index": w.queued_index,
        })).collect::<Vec<_>>(),
    })
}

fn print_info(i: &LockInfo) {
    let kind = if i.semaphore {
        format!("semaphore (capacity {})", i.capacity)
    } else {
        "lock".into()
    };
    let delayed = if i.lock_delayed {
        ", lock-delay in force"
    } else {
        ""
    };
    println!("{} — {kind}{delayed}", printable(&i.name));
    for h in &i.holders {
        let value = if h.value.is_empty() {
            String::new()
        } else {
            format!(" value {:?}", String::from_utf8_lossy(&h.value))
        };
        println!(
            "  held by session {} fence {} {} weight {}{value}",
            h.session_id,
            h.fence,
            mode_name(h.mode),
            h.weight
        );
    }
    for (n, w) in i.waiters.iter().enumerate() {
        println!(
            "  #{} waiting: session {} {} weight {}",
            n + 1,
            w.session_id,
            mode_name(w.mode),
            w.weight
        );
    }
}

/// A name as printed on a terminal: control characters (newlines, escape
/// sequences, NUL) escaped, so a lock name cannot rewrite the screen or
/// forge output lines. JSON output escapes them already.
fn printable(name: &str) -> std::borrow::Cow<'_, str> {
    if name.chars().any(char::is_control) {
        std::borrow::Cow::Owned(name.chars().flat_map(char::escape_default).collect())
    } else {
        std::borrow::Cow::Borrowed(name)
    }
}

fn print_event(e: &pb::WatchEvent, json: bool) {
    let kind = match EventKind::try_from(e.kind) {
        Ok(EventKind::Granted) => "granted",
        Ok(EventKind::Queued) => "queued",
        Ok(EventKind::Released) => "released",
        Ok(EventKind::Expired) => "expired",
        Ok(EventKind::Cancelled) => "cancelled",
        Ok(EventKind::LockDelayStarted) => "lock-delay-started",
        Ok(EventKind::LockDelayEnded) => "lock-delay-ended",
        _ => "unknown",
    };
    if json {
        println!(
            "{}",
            json!({"index": e.index, "kind": kind, "name": e.name, "session": e.session_id,
                   "fence": e.fence, "mode": mode_name(e.mode), "weight": e.weight})
        );
    } else {
        println!(
            "{} {kind} {} session {} fence {}",
            e.index,
            printable(&e.name),
            e.session_id,
            e.fence
        );
    }
}

fn member_json(m: &pb::Member) -> serde_json::Value {
    json!({"id": m.id, "addr": m.addr, "peer_addr": m.peer_addr, "voter": m.voter})
}

fn print_members(members: &[pb::Member]) {
    for m in members {
        let peer = if m.peer_addr.is_empty() || m.peer_addr == m.addr {
            String::new()
        } else {
            format!(" (peers: {})", m.peer_addr)
        };
        println!(
            "  {} {}{peer} {}",
            m.id,
            m.addr,
            if m.voter { "voter" } else { "learner" }
        );
    }
}

fn status_json(s: &pb::StatusResponse) -> serde_json::Value {
    json!({
        "id": s.id, "addr": s.addr, "role": s.role, "term": s.term,
        "leader_id": s.leader_id, "leader_addr": s.leader_addr,
        "commit_index": s.commit_index, "applied_index": s.applied_index,
        "last_log_index": s.last_log_index, "sessions": s.sessions, "grants": s.grants,
        "waiters": s.waiters, "last_fence": s.last_fence,
        "members": s.members.iter().map(member_json).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn names_with_control_characters_are_escaped() {
        assert_eq!(printable("jobs/nightly"), "jobs/nightly");
        assert_eq!(printable("a\nb\u{1b}[2J\0"), "a\\nb\\u{1b}[2J\\u{0}");
        assert!(!printable("x\ry").contains('\r'));
    }
}
