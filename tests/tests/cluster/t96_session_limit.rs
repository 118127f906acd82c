//! A cluster holding `MAX_SESSIONS` open sessions refuses the next one with
//! `RESOURCE_EXHAUSTED`, changes nothing, and keeps serving; a freed slot
//! can be used again.

use std::time::Duration;

use raftlock_client::proto::{AcquireRequest, CloseSessionRequest, Mode};
use raftlock_client::{Error, Fence};
use raftlock_node::state::limits::MAX_SESSIONS;
use raftlock_testkit::{channel, locks_at, TestCluster};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_cluster_refuses_new_sessions_and_keeps_serving() {
    // Opening 250,000 sessions one request at a time would take minutes, so
    // the full table is built in process and restored through the API.
    let table = raftlock_tests::table_of_sessions(MAX_SESSIONS as u64);
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let backup = raftlock_node::api::backup::write(&table, 1, 1, 0);
    let bytes = backup.len();
    let started = std::time::Instant::now();
    let restored = client
        .restore(backup)
        .await
        .expect("restore the full table");
    // The figure, printed, not bounded: under load it takes many times longer.
    eprintln!(
        "restored {MAX_SESSIONS} sessions ({bytes} bytes) in {:?}",
        started.elapsed()
    );
    assert_eq!(restored.sessions, MAX_SESSIONS as u64);
    drop(table);

    // One more is refused, and nothing changes.
    let before = client.status().await.expect("status");
    match client.session(Duration::from_secs(10)).await {
        Err(Error::ResourceExhausted(msg)) => assert!(msg.contains("sessions"), "{msg}"),
        Err(e) => panic!("expected ResourceExhausted, got {e:?}"),
        Ok(_) => panic!("a session past MAX_SESSIONS was opened"),
    }
    let after = client.status().await.expect("status");
    assert_eq!(after.sessions, MAX_SESSIONS as u64);
    assert_eq!(after.last_fence, before.last_fence);

    // Every node still serves: health checks, and the existing sessions
    // take locks.
    for addr in cluster.addrs() {
        let health = HealthClient::new(channel(&addr))
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("health answers")
            .into_inner();
        assert_eq!(health.status, ServingStatus::Serving as i32, "{addr}");
    }
    let leader = cluster.leader_addr().await;
    let mut locks = locks_at(&leader);
    let granted = locks
        .acquire(AcquireRequest {
            session_id: 1,
            seq: 1,
            name: "full/x".into(),
            mode: Mode::Exclusive as i32,
            ..Default::default()
        })
        .await
        .expect("an existing session locks")
        .into_inner();
    assert!(granted.acquired && Some(Fence::new(granted.fence)) > before.last_fence);

    // Closing one frees a slot for exactly one new session.
    locks
        .close_session(CloseSessionRequest {
            session_id: 2,
            seq: 1,
        })
        .await
        .expect("close");
    let s = client
        .session(Duration::from_secs(10))
        .await
        .expect("the freed slot is usable");
    assert!(matches!(
        client.session(Duration::from_secs(10)).await,
        Err(Error::ResourceExhausted(_))
    ));
    s.close().await.expect("close");
    cluster.shutdown().await;
}
