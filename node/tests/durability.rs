//! "Durable" means `fsync`/`fdatasync`, not a library's word "flush": a node
//! runs under `strace`, and every write a client sees acknowledged must have
//! been preceded, after it was sent, by an `fdatasync`/`fsync` of the file
//! the Raft log lives in (sled's `db`) and of the mark beside it
//! (`raftlock-mark`, which names the newest entry the log made durable).
//!
//! sled 0.34's own flush is `sync_file_range`, which neither flushes the
//! device cache nor the file's size: this test fails on a node that only
//! calls it.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use raftlock_proto::v1 as pb;
use raftlock_proto::v1::locks_client::LocksClient;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// Seconds since the epoch, as strace's `-ttt` prints them.
fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
}

/// Makes sure `strace` runs here: installs Debian's package when it is
/// missing and this process may (root), else fails saying what to do.
fn ensure_strace() {
    let works = || {
        std::process::Command::new("strace")
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if works() {
        return;
    }
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0"));
    if root {
        let _ = std::process::Command::new("apt-get")
            .arg("update")
            .stdout(Stdio::null())
            .status();
        let _ = std::process::Command::new("apt-get")
            .args(["install", "-y", "strace"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status();
    }
    assert!(
        works(),
        "this test needs strace: install it (`apt-get install strace`)"
    );
}

/// Times of `fsync`/`fdatasync` calls on a file whose path ends with
/// `suffix`, from an `strace -f -ttt -y` log.
fn syncs_of(trace: &str, suffix: &str) -> Vec<f64> {
    trace
        .lines()
        .filter_map(|line| {
            // "PID SECS.MICROS fdatasync(7</path/to/db>) = 0"
            let mut words = line.split_whitespace();
            let _pid = words.next()?;
            let time: f64 = words.next()?.parse().ok()?;
            let call = words.next()?;
            let synced = (call.starts_with("fdatasync(") || call.starts_with("fsync("))
                && call.contains(&format!("{suffix}>)"))
                && line.trim_end().ends_with("= 0");
            synced.then_some(time)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_was_fdatasynced_first() {
    ensure_strace();
    let dir = tempfile::tempdir().expect("dir");
    let trace_path = dir.path().join("strace.log");
    let port = raftlock_testkit::ports::free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = Command::new("strace")
        .args(["-f", "-ttt", "-y", "-e", "trace=fsync,fdatasync", "-o"])
        .arg(&trace_path)
        .arg(env!("CARGO_BIN_EXE_raftlockd"))
        .args(["dev", "--nodes", "1", "--metrics-base-port", "0"])
        .arg("--base-port")
        .arg(port.to_string())
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("strace raftlockd starts");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let ready = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line == "ready" {
                return true;
            }
        }
        false
    })
    .await;
    assert!(matches!(ready, Ok(true)), "raftlockd dev did not get ready");

    let mut locks = LocksClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    // Each write is sent alone and awaited, so each is its own log append.
    let mut writes: Vec<(&str, f64, f64)> = Vec::new();
    let sent = now();
    let session = locks
        .open_session(pb::OpenSessionRequest {
            ttl_ms: 30_000,
            lock_delay_ms: 0,
            nonce: 7,
            ..Default::default()
        })
        .await
        .expect("open")
        .into_inner()
        .session_id;
    writes.push(("open", sent, now()));
    let mut seq = 0;
    for _ in 0..10 {
        seq += 1;
        let sent = now();
        let grant = locks
            .acquire(pb::AcquireRequest {
                session_id: session,
                seq,
                name: "durable".into(),
                mode: pb::Mode::Exclusive as i32,
                timeout_ms: 0,
                ..Default::default()
            })
            .await
            .expect("acquire")
            .into_inner();
        assert!(grant.acquired);
        writes.push(("acquire", sent, now()));
        seq += 1;
        let sent = now();
        let released = locks
            .release(pb::ReleaseRequest {
                session_id: session,
                seq,
                name: "durable".into(),
                fence: grant.fence,
            })
            .await
            .expect("release")
            .into_inner();
        assert!(released.released);
        writes.push(("release", sent, now()));
    }
    // Stop the node (strace's child, not strace: strace would detach and
    // leave it running), so strace's log is complete before it is read.
    let strace_pid = child.id().expect("pid");
    let children =
        std::fs::read_to_string(format!("/proc/{strace_pid}/task/{strace_pid}/children"))
            .unwrap_or_default();
    for pid in children.split_whitespace() {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", pid])
            .status();
    }
    let stopped = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
    assert!(stopped.is_ok(), "raftlockd did not stop on SIGTERM");

    let trace = std::fs::read_to_string(&trace_path).expect("strace log");
    // The log's file, and the mark that names what it made durable (which
    // a node checks its log against at start: it refuses a log that lost
    // what it had made durable).
    for file in ["db", "raftlock-mark"] {
        let path = Path::new("sled").join(file);
        let syncs = syncs_of(&trace, &path.to_string_lossy());
        for (what, sent, acked) in &writes {
            assert!(
                syncs.iter().any(|t| t >= sent && t <= acked),
                "{what} sent at {sent:.6} was acknowledged at {acked:.6} without an \
                 fsync/fdatasync of sled/{file} in between ({} such syncs in the whole run)",
                syncs.len()
            );
        }
    }
}

#[test]
fn strace_lines_are_parsed() {
    let log = "\
12 1700000000.100000 fdatasync(7</tmp/x/data/node1/sled/db>) = 0
12 1700000000.200000 fsync(9</tmp/x/data/node1/snapshot.tmp>) = 0
13 1700000000.300000 fsync(7</tmp/x/data/node1/sled/db>) = -1 EIO (Input/output error)
13 1700000000.400000 fsync(7</tmp/x/data/node1/sled/db>) = 0";
    assert_eq!(syncs_of(log, "sled/db"), vec![1700000000.1, 1700000000.4]);
}
