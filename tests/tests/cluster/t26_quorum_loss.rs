//! Writes during a quorum loss fail fast, saying whether the outcome is
//! known (black-box: they hung until the client's own deadline).
//!
//! "Fast" is told apart by who answers, not by a stopwatch: the node says
//! it cannot write (`UNAVAILABLE`, or `DEADLINE_EXCEEDED` for a write
//! pending when the quorum went), where a write that hung would end with
//! the client's own deadline (tonic's `CANCELLED`, "Timeout expired"). How
//! long the answer took is printed (it was bounded at 5 s before; about
//! the election timeout on an idle machine).

use std::time::Duration;

use raftlock_proto::v1 as pb;
use raftlock_proto::v1::locks_client::LocksClient;
use raftlock_testkit::TestCluster;
use tonic::Code;

/// The client's own deadline for each write: a deadline for a node that
/// never answers, far from the election timeout (300-500 ms) in which the
/// leader finds its quorum gone.
const CLIENT_DEADLINE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_fails_fast_when_the_leader_loses_its_quorum() {
    let mut cluster = TestCluster::start(3).await;
    let leader = cluster.leader().await;
    let addr = cluster.addr(leader);
    // The client's own deadline: long, so that only the node's answer can
    // end a write before it.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .timeout(CLIENT_DEADLINE)
        .connect_lazy();
    let mut locks = LocksClient::new(channel);
    let session = locks
        .open_session(pb::OpenSessionRequest {
            ttl_ms: 60_000,
            lock_delay_ms: 0,
            nonce: 5,
            end_on_disconnect_ms: 0,
        })
        .await
        .expect("open")
        .into_inner()
        .session_id;
    for id in cluster.running() {
        if id != leader {
            cluster.kill(id).await;
        }
    }
    // A write pending while the quorum is gone, and one sent after.
    for seq in [1, 2] {
        let started = tokio::time::Instant::now();
        let r = tokio::time::timeout(
            CLIENT_DEADLINE + Duration::from_secs(10),
            locks.acquire(pb::AcquireRequest {
                session_id: session,
                seq,
                name: format!("quorum/{seq}"),
                mode: pb::Mode::Exclusive as i32,
                timeout_ms: 0,
                ..Default::default()
            }),
        )
        .await;
        let status = match r {
            Err(_) => {
                panic!("write {seq} still pending past the client's deadline without a quorum")
            }
            Ok(Ok(resp)) => panic!("write {seq} acknowledged without a quorum: {resp:?}"),
            Ok(Err(status)) => status,
        };
        // The figure this test bounded at 5 s before.
        eprintln!(
            "t26: write {seq} refused {:?} after it was sent: {status:?}",
            started.elapsed()
        );
        assert!(
            matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded),
            "write {seq}: {status:?}"
        );
    }
    cluster.shutdown().await;
}

/// A leader that has lost its quorum exports no leader
/// (`raftlock_leader_id 0`, `raftlock_is_leader 0`), so the
/// `RaftlockNodeWithoutLeader` alert fires on it as on an isolated
/// follower; with its quorum back it exports itself again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_without_its_quorum_exports_no_leader() {
    let mut cluster = TestCluster::start(3).await;
    let leader = cluster.wait_for_leader().await;
    let metrics = cluster.metrics_addr(leader);
    let gauges = |text: &str| {
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        (value("raftlock_is_leader"), value("raftlock_leader_id"))
    };
    let scrape = || {
        let metrics = metrics.clone();
        async move {
            raftlock_testkit::http(&metrics, "GET", "/metrics", &[])
                .await
                .map(|(_, text)| text)
        }
    };
    let text = scrape().await.expect("metrics");
    assert_eq!(gauges(&text), (Some(1), Some(leader)), "{text}");
    let followers: Vec<u64> = cluster
        .running()
        .into_iter()
        .filter(|id| *id != leader)
        .collect();
    for id in &followers {
        cluster.kill(*id).await;
    }
    raftlock_testkit::eventually(
        "the leader without its quorum to export no leader",
        Duration::from_secs(30),
        || async {
            let text = scrape().await?;
            (gauges(&text) == (Some(0), Some(0))).then_some(())
        },
    )
    .await;
    for id in &followers {
        cluster.restart(*id).await;
    }
    raftlock_testkit::eventually(
        "a leader to be exported again",
        Duration::from_secs(60),
        || async {
            let text = scrape().await?;
            let (_, id) = gauges(&text);
            id.filter(|id| *id != 0).map(|_| ())
        },
    )
    .await;
    cluster.shutdown().await;
}
