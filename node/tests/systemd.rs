//! systemd (issue 31, item 10): `raftlockd run` speaks systemd's
//! notification protocol itself when `NOTIFY_SOCKET` is set (`READY=1`
//! once it can serve: a leader is known; `WATCHDOG=1` while its Raft core
//! runs; `STOPPING=1` on SIGTERM), and `deploy/systemd/raftlockd.service`
//! passes `systemd-analyze verify` and hands the secrets over with
//! `LoadCredential=` (the file can stay root's: the unit runs as a dynamic
//! user).

mod procs;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use procs::{free_port, status};

/// The datagrams a node sends to `socket` until `until` says stop (or
/// `deadline` passes), each with when it arrived.
fn receive(
    socket: &UnixDatagram,
    deadline: Duration,
    mut until: impl FnMut(&[(Instant, String)]) -> bool,
) -> Vec<(Instant, String)> {
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let end = Instant::now() + deadline;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < end && !until(&got) {
        if let Ok(n) = socket.recv(&mut buf) {
            got.push((
                Instant::now(),
                String::from_utf8_lossy(&buf[..n]).into_owned(),
            ));
        }
    }
    got
}

/// The watchdog interval the test gives the node (`WATCHDOG_USEC`).
const WATCHDOG_USEC: Duration = Duration::from_secs(2);

fn has(got: &[(Instant, String)], line: &str) -> usize {
    got.iter()
        .filter(|(_, m)| m.lines().any(|l| l == line))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raftlockd_tells_systemd_it_is_ready_and_feeds_the_watchdog() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&path).expect("bind the notify socket");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_raftlockd"))
        .args(["run", "--id", "1", "--init", "--listen", &addr])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("NOTIFY_SOCKET", &path)
        // Fed every half of it: about every second. Long enough that a
        // loaded machine's scheduling delays (tens of ms, a few hundred at
        // worst) stay far inside the half interval the node has to spare;
        // at 400 ms (fed every 200 ms) a pair 400 ms apart was a delay of
        // 200 ms, which a loaded machine reaches.
        .env("WATCHDOG_USEC", WATCHDOG_USEC.as_micros().to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("raftlockd starts");

    // READY=1 once it can serve: by then it knows its leader.
    let socket = tokio::task::spawn_blocking(move || {
        let got = receive(&socket, Duration::from_secs(20), |g| has(g, "READY=1") > 0);
        assert_eq!(has(&got, "READY=1"), 1, "no READY=1 within 20 s: {got:?}");
        socket
    })
    .await
    .expect("join");
    let now = status(&addr).await.expect("it answers once ready");
    assert_ne!(now.leader_id, 0, "ready without a leader: {now:?}");

    // WATCHDOG=1 at about half the interval while the core runs: never a
    // whole interval without one (systemd would restart the node).
    let (socket, got) = tokio::task::spawn_blocking(move || {
        let got = receive(&socket, Duration::from_secs(60), |g| {
            has(g, "WATCHDOG=1") >= 4
        });
        (socket, got)
    })
    .await
    .expect("join");
    assert!(has(&got, "WATCHDOG=1") >= 4, "watchdog not fed: {got:?}");
    let pings: Vec<Instant> = got
        .iter()
        .filter(|(_, m)| m.lines().any(|l| l == "WATCHDOG=1"))
        .map(|(at, _)| *at)
        .collect();
    let gaps: Vec<Duration> = pings.windows(2).map(|p| p[1] - p[0]).collect();
    eprintln!("systemd: watchdog pings {gaps:?} apart (WATCHDOG_USEC {WATCHDOG_USEC:?})");
    for gap in gaps {
        assert!(
            gap < WATCHDOG_USEC,
            "the watchdog went {gap:?} without a ping (WATCHDOG_USEC is {WATCHDOG_USEC:?})"
        );
    }

    // SIGTERM: it says it is stopping, then exits 0.
    let pid = child.id().expect("pid").to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill")
        .success());
    let got = tokio::task::spawn_blocking(move || {
        receive(&socket, Duration::from_secs(20), |g| {
            has(g, "STOPPING=1") > 0
        })
    })
    .await
    .expect("join");
    assert_eq!(has(&got, "STOPPING=1"), 1, "{got:?}");
    let exit = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("exits")
        .expect("wait");
    assert!(exit.success(), "{exit:?}");
}

/// A `NOTIFY_SOCKET` that cannot be used is named at start, and the node
/// does not start (systemd would wait for a READY=1 that never comes).
#[tokio::test]
async fn an_unusable_notify_socket_stops_the_node_at_start() {
    let dir = tempfile::tempdir().expect("dir");
    let addr = format!("127.0.0.1:{}", free_port());
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_raftlockd"))
        .args(["run", "--id", "1", "--init", "--listen", &addr])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("NOTIFY_SOCKET", "relative/not-a-socket")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("the node stops at start instead of running on")
        .expect("raftlockd runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("NOTIFY_SOCKET"), "{stderr}");
    assert!(
        !dir.path().join("data").exists(),
        "it touched the data directory"
    );
}

/// `systemd-analyze`, installing Debian's `systemd` as root if missing.
fn systemd_analyze() -> Option<PathBuf> {
    let find = || {
        ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
    };
    if find().is_none() && nix_is_root() {
        let _ = std::process::Command::new("apt-get")
            .arg("update")
            .stdout(Stdio::null())
            .status();
        let _ = std::process::Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends", "systemd"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status();
    }
    let found = find();
    if found.is_none() {
        let required = std::env::var("RAFTLOCK_REQUIRE_SERVERS").is_ok_and(|v| v == "1")
            || std::env::var("CI").is_ok_and(|v| v == "true");
        assert!(
            !required,
            "systemd-analyze is required here: install Debian's systemd"
        );
        eprintln!("SKIPPED: no systemd-analyze (install Debian's systemd, or run as root)");
    }
    found
}

fn nix_is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

fn unit_text() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd/raftlockd.service");
    std::fs::read_to_string(path).expect("the unit")
}

/// Runs `systemd-analyze verify` on `unit` (named raftlockd.service, with
/// ExecStart pointed at the raftlockd just built); its output.
fn verify(analyze: &Path, unit: &str) -> std::process::Output {
    let dir = tempfile::tempdir().expect("dir");
    let unit = unit.replace("/usr/local/bin/raftlockd", env!("CARGO_BIN_EXE_raftlockd"));
    let path = dir.path().join("raftlockd.service");
    std::fs::write(&path, unit).expect("write");
    std::process::Command::new(analyze)
        .arg("verify")
        .arg(&path)
        .env("SYSTEMD_LOG_COLOR", "0")
        .output()
        .expect("systemd-analyze runs")
}

/// What `systemd-analyze verify` said about our unit (it also reads the
/// system's units; those lines are left out), and whether it succeeded.
fn complaints(out: &std::process::Output) -> (bool, Vec<String>) {
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let ours = said
        .lines()
        .filter(|l| l.contains("raftlockd.service"))
        .map(String::from)
        .collect();
    (out.status.success(), ours)
}

#[test]
fn the_unit_passes_systemd_analyze_verify() {
    let Some(analyze) = systemd_analyze() else {
        return;
    };
    let (ok, ours) = complaints(&verify(&analyze, &unit_text()));
    assert!(ok && ours.is_empty(), "systemd-analyze verify: {ours:#?}");
    // The checker itself catches a broken unit.
    let (_, ours) = complaints(&verify(
        &analyze,
        &unit_text().replace("[Service]", "[Service]\nType=sometimes"),
    ));
    assert!(!ours.is_empty(), "a bad Type= went unnoticed");
}

/// What the unit must say for the node's own protocol and the secrets.
#[test]
fn the_unit_is_notify_with_a_watchdog_and_loads_secrets_as_credentials() {
    let unit = unit_text();
    let settings: Vec<(&str, &str)> = unit
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .collect();
    let value = |key: &str| {
        settings
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, v)| *v)
            .collect::<Vec<_>>()
    };
    assert_eq!(value("Type"), ["notify"]);
    assert_eq!(value("NotifyAccess"), ["main"]);
    assert_eq!(value("WatchdogSec").len(), 1, "a watchdog");
    assert!(
        value("Restart") == ["on-failure"] || value("Restart") == ["on-watchdog"],
        "a watchdog timeout restarts the node"
    );
    // The ACL file reaches the dynamic user as a credential, not by
    // ownership.
    assert_eq!(value("DynamicUser"), ["yes"]);
    assert!(
        value("LoadCredential")
            .iter()
            .any(|v| v.starts_with("acl.toml:")),
        "{:?}",
        value("LoadCredential")
    );
    assert!(value("Environment")
        .iter()
        .any(|v| v.contains("RAFTLOCK_ACL_FILE=%d/acl.toml")));
}
