//! README's HTTP/JSON lock cycle, run as written: the `sh` block after the
//! "### HTTP/JSON" heading, with `curl` (installed from Debian when missing
//! and the test runs as root), against a live 3-node cluster, starting
//! from a follower's address so the leader lookup is exercised too; and
//! HTTP/JSON over mutual TLS, with curl.

use std::process::Command;

use raftlock_testkit::servers::{self, Unavailable};
use raftlock_testkit::TestCluster;

const README: &str = include_str!("../../../README.md");

/// The first ```sh block after `heading`.
fn block_after(heading: &str) -> String {
    let from = README.find(heading).expect("the heading is in README");
    let rest = &README[from..];
    let start = rest.find("```sh\n").expect("an sh block") + "```sh\n".len();
    let end = rest[start..].find("```").expect("the block ends");
    rest[start..start + end].to_string()
}

fn curl() -> Result<(), Unavailable> {
    let has = Command::new("curl").arg("--version").output().is_ok();
    if !has {
        servers::apt_install(&["curl"])?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readmes_curl_lock_cycle_runs_as_written() {
    let Some(()) = servers::require("curl", curl()) else {
        return;
    };
    let script = block_after("### HTTP/JSON");
    let cluster = TestCluster::start(3).await;
    let leader = cluster.leader().await;
    let follower = cluster
        .running()
        .into_iter()
        .find(|id| *id != leader)
        .expect("one");
    let dir = tempfile::tempdir().expect("dir");
    let out = tokio::process::Command::new("sh")
        .args(["-e", "-c", &script])
        .current_dir(dir.path())
        .env("NODE", cluster.addr(follower))
        .output()
        .await
        .expect("sh runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "the README block failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(r#""acquired":true"#), "{stdout}");
    assert!(
        stdout.contains("holding jobs/nightly with fence "),
        "{stdout}"
    );
    assert!(
        stdout.contains(r#""holders":[{"#),
        "Describe shows the holder: {stdout}"
    );
    assert!(stdout.trim_end().ends_with(r#"{"released":1}"#), "{stdout}");
    // Nothing is left: the lock and its session are gone.
    let client = cluster.client().await;
    assert!(client
        .describe("jobs/nightly")
        .await
        .expect("describe")
        .is_none());
    cluster.shutdown().await;
}

/// HTTP/JSON over TLS, as curl speaks it (HTTP/2 after ALPN), with mTLS:
/// a client certificate from the cluster's CA gets in, none does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn http_json_over_mutual_tls_with_curl() {
    use raftlock_testkit::certs::Ca;
    let Some(()) = servers::require("curl", curl()) else {
        return;
    };
    let ca = Ca::new("raftlock test CA");
    let node = ca.issue("raftlock node", &["127.0.0.1", "localhost"]);
    let cluster = TestCluster::start_tls(
        3,
        raftlock_node::tls::TlsOptions {
            cert_pem: node.cert_pem,
            key_pem: node.key_pem,
            ca_pem: ca.pem(),
            client_auth: true,
        },
    )
    .await;
    let dir = tempfile::tempdir().expect("dir");
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).expect("write");
        path
    };
    let app = ca.issue("app", &[]);
    let ca_file = write("ca.pem", &ca.pem());
    let cert = write("app.pem", &app.cert_pem);
    let key = write("app.key", &app.key_pem);
    let body = r#"{"name": "tls/x", "ttl_ms": 10000}"#;
    let run = |url: &str, with_cert: bool| {
        let mut c = Command::new("curl");
        c.args(["-s", "-S", "--max-time", "10", "-X", "POST"])
            .arg("--cacert")
            .arg(&ca_file)
            .args(["-H", "Content-Type: application/json", "-d", body]);
        if with_cert {
            c.arg("--cert").arg(&cert).arg("--key").arg(&key);
        }
        c.arg(url).output().expect("curl runs")
    };
    // On a busy machine the leadership can move between the lookup and the
    // request; the answer is then the documented 503 "not the leader", and
    // a README user asks the leader again.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let (url, text) = loop {
        let url = format!("https://{}/v1/locks/Lock", cluster.leader_addr().await);
        let ok = run(&url, true);
        let text = String::from_utf8_lossy(&ok.stdout).into_owned();
        assert!(
            ok.status.success(),
            "{}",
            String::from_utf8_lossy(&ok.stderr)
        );
        if !text.contains("not the leader") || std::time::Instant::now() > deadline {
            break (url, text);
        }
        eprintln!("asked again: {text}");
    };
    assert!(text.contains(r#""acquired":true"#), "{text}");
    let refused = run(&url, false);
    assert!(
        !String::from_utf8_lossy(&refused.stdout).contains("acquired"),
        "no client certificate, no lock"
    );
    cluster.shutdown().await;
}
