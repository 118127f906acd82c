//! `raftlockd probe livez|readyz ADDR`: what a container health check runs
//! (the image has no HTTP client). Exit 0 and `ok` while the node answers
//! 200, exit 1 and the reason otherwise.

mod procs;

use std::time::Duration;

use procs::{eventually, Procs};

async fn probe(check: &str, addr: &str) -> (bool, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_raftlockd"))
        .args(["probe", check, addr])
        .output()
        .await
        .expect("raftlockd probe runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_exits_0_while_the_node_answers_200_and_1_with_the_reason_otherwise() {
    let mut procs = Procs::start(3, &[]);
    procs.leader().await;
    let m = procs.metrics_addr(1);
    let ready = eventually("node 1 ready", Duration::from_secs(10), || {
        let m = m.clone();
        async move {
            let r = probe("readyz", &m).await;
            r.0.then_some(r)
        }
    })
    .await;
    assert_eq!(ready.1, "ok");
    assert_eq!(probe("livez", &m).await, (true, "ok".into(), String::new()));

    // Alone, node 1 has no leader: live, not ready, and says why.
    procs.kill(2).await;
    procs.kill(3).await;
    let (ok, _, why) = eventually("node 1 not ready", Duration::from_secs(10), || {
        let m = m.clone();
        async move {
            let r = probe("readyz", &m).await;
            (!r.0).then_some(r)
        }
    })
    .await;
    assert!(!ok);
    assert!(why.contains("/readyz") && why.contains("503"), "{why}");
    assert!(why.contains("leader"), "{why}");
    assert!(probe("livez", &m).await.0, "still live");

    // Nothing there.
    procs.kill(1).await;
    let (ok, _, why) = probe("livez", &m).await;
    assert!(!ok);
    assert!(why.contains("cannot reach"), "{why}");
}
