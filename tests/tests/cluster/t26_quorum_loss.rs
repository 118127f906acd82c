//! Writes during a quorum loss fail fast, saying whether the outcome is
//! known (black-box: they hung until the client's own deadline).

use std::time::Duration;

use raftlock_proto::v1 as pb;
use raftlock_testkit::{locks_at, TestCluster};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_fails_fast_when_the_leader_loses_its_quorum() {
    let mut cluster = TestCluster::start(3).await;
    let leader = cluster.leader().await;
    let addr = cluster.addr(leader);
    let mut locks = locks_at(&addr);
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
            Duration::from_secs(10),
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
            Err(_) => panic!("write {seq} still pending after 10 s without a quorum"),
            Ok(Ok(resp)) => panic!("write {seq} acknowledged without a quorum: {resp:?}"),
            Ok(Err(status)) => status,
        };
        assert!(
            matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded),
            "write {seq}: {status:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "write {seq} took {:?}",
            started.elapsed()
        );
    }
    cluster.shutdown().await;
}
