//! README's HTTP/JSON lock cycle, run as written: the `sh` block after the
//! "### HTTP/JSON" heading, with `curl` (installed from Debian when missing
//! and the test runs as root), against a live 3-node cluster, starting
//! from a follower's address so the leader lookup is exercised too.

use std::process::Command;

use raftlock_testkit::servers::{self, Unavailable};
use raftlock_testkit::TestCluster;

const README: &str = include_str!("../../README.md");

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
