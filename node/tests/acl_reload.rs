//! `raftlockd dev --acl-file`: access control from a file, reloaded on
//! SIGHUP; a broken file leaves the rules in force.

use std::process::Stdio;
use std::time::{Duration, Instant};

use raftlock_proto::v1 as pb;
use raftlock_proto::v1::cluster_client::ClusterClient;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tonic::{Code, Request};

const PEER: &str = "reload-test-peer-token";

fn acl(tokens: &[(&str, &str)]) -> String {
    let mut text = format!("peer_token = \"{PEER}\"\n");
    for (identity, token) in tokens {
        text.push_str(&format!(
            "[[token]]\nidentity = \"{identity}\"\ntoken = \"{token}\"\n\
             [[rule]]\nidentity = \"{identity}\"\nallow = \"read\"\n"
        ));
    }
    text
}

async fn status_code(addr: &str, token: &str) -> Code {
    let Ok(mut c) = ClusterClient::connect(format!("http://{addr}")).await else {
        return Code::Unavailable;
    };
    let mut req = Request::new(pb::StatusRequest {});
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ascii"),
    );
    match c.status(req).await {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

async fn eventually_code(addr: &str, token: &str, want: Code, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = status_code(addr, token).await;
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: last answer {got:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn hangup(pid: u32) {
    let ok = std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .expect("kill runs")
        .success();
    assert!(ok, "kill -HUP {pid}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_acl_file() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("acl.toml");
    std::fs::write(&file, acl(&[("a", "tok-a")])).expect("write");
    // A free port for the one-node dev cluster.
    let port = raftlock_testkit::ports::free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_raftlockd"))
        .args(["dev", "--nodes", "1", "--metrics-base-port", "0"])
        .arg("--base-port")
        .arg(port.to_string())
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--acl-file")
        .arg(&file)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("raftlockd starts");
    let pid = child.id().expect("pid");
    let (log_tx, mut log) = tokio::sync::mpsc::unbounded_channel();
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr")).lines();
    tokio::spawn(async move {
        while let Ok(Some(line)) = stderr.next_line().await {
            let _ = log_tx.send(line);
        }
    });
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.expect("read") {
            if line == "ready" {
                return true;
            }
        }
        false
    })
    .await;
    assert!(matches!(ready, Ok(true)), "raftlockd dev did not get ready");

    assert_eq!(status_code(&addr, "tok-a").await, Code::Ok);
    assert_eq!(status_code(&addr, "tok-b").await, Code::Unauthenticated);

    // Add b, drop a, reload.
    std::fs::write(&file, acl(&[("b", "tok-b")])).expect("write");
    hangup(pid);
    eventually_code(&addr, "tok-b", Code::Ok, "b allowed after the reload").await;
    assert_eq!(status_code(&addr, "tok-a").await, Code::Unauthenticated);

    // A broken file is not applied: the node says so and b keeps working.
    std::fs::write(&file, "peer_token = \"short\"\n").expect("write");
    hangup(pid);
    tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = log.recv().await {
            if line.contains("ACL not reloaded") {
                return;
            }
        }
        panic!("raftlockd's log ended");
    })
    .await
    .expect("the refused reload is logged");
    assert_eq!(status_code(&addr, "tok-b").await, Code::Ok);
    assert_eq!(status_code(&addr, "tok-a").await, Code::Unauthenticated);

    child.kill().await.expect("kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_acl_file_stops_the_node_at_start() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("acl.toml");
    std::fs::write(&file, "peer_token = \"short\"\n").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_raftlockd"))
        .args(["run", "--id", "1", "--listen", "127.0.0.1:1", "--init"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--acl-file")
        .arg(&file)
        .output()
        .await
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("acl_file") && stderr.contains("peer_token"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_peers_refuses_to_start_without_peer_authentication() {
    let dir = tempfile::tempdir().expect("dir");
    let out = Command::new(env!("CARGO_BIN_EXE_raftlockd"))
        .args(["run", "--id", "1", "--listen", "127.0.0.1:1", "--init"])
        .args(["--peers", "1=127.0.0.1:1,2=127.0.0.1:2,3=127.0.0.1:3"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .output()
        .await
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("insecure_peers")
            && stderr.contains("--insecure-peers")
            && stderr.contains("peer_token"),
        "{stderr}"
    );
    assert!(
        !dir.path().join("data").exists(),
        "nothing was written before the refusal"
    );
}
