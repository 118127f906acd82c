//! Probes that mean "can serve now", on the metrics port (plain HTTP even
//! when gRPC uses TLS): `/livez` while the Raft core runs, `/readyz` while
//! a leader is known and heard from, the core runs and the node has applied
//! what is committed; gRPC health (service `""`) says the same as `/readyz`,
//! service `liveness` the same as `/livez`.
//!
//! On 6bd3e3c the metrics port answered 404 to both, and followers stayed
//! `SERVING` through the second or so in which their leader was gone and
//! writes failed (operator review 2026-11-25, §3).

use std::time::{Duration, Instant};

use raftlock_node::node::RaftTiming;
use raftlock_testkit::{channel, eventually, http, TestCluster};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

async fn health(addr: &str, service: &str) -> Option<i32> {
    let r = tokio::time::timeout(
        Duration::from_secs(1),
        HealthClient::new(channel(addr)).check(HealthCheckRequest {
            service: service.into(),
        }),
    )
    .await
    .ok()?
    .ok()?;
    Some(r.into_inner().status)
}

const SERVING: Option<i32> = Some(ServingStatus::Serving as i32);
const NOT_SERVING: Option<i32> = Some(ServingStatus::NotServing as i32);

/// `/livez` and `/readyz` of node `id`: status codes and the `/readyz` body.
async fn probes(cluster: &TestCluster, id: u64) -> (u16, u16, String) {
    let m = cluster.metrics_addr(id);
    let live = http(&m, "GET", "/livez", &[]).await.expect("livez answers");
    let ready = http(&m, "GET", "/readyz", &[])
        .await
        .expect("readyz answers");
    (live.0, ready.0, ready.1)
}

async fn all_ready(cluster: &TestCluster) {
    for id in cluster.running() {
        let addr = &cluster.addr(id);
        eventually(
            &format!("node {id} live, ready and SERVING"),
            Duration::from_secs(60),
            || async move {
                let (live, ready, _) = probes(cluster, id).await;
                let serving = health(addr, "").await;
                (live == 200 && ready == 200 && serving == SERVING).then_some(())
            },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn probes_say_whether_a_node_can_serve_now() {
    // Heartbeats as usual (a follower is not ready after three missed
    // ones, 0.3 s), elections slow: the followers of a cut-off leader
    // campaign only after max + random(min..max) = 8-10 s, so the seconds
    // in which they have no leader to serve with are far more than a
    // loaded machine needs to see them. With the default timing that
    // window was 0.3-0.8 s and the test bounded it at 750 ms.
    let timing = RaftTiming {
        election_timeout: (Duration::from_secs(4), Duration::from_secs(5)),
        ..raftlock_testkit::test_timing()
    };
    let cluster = &TestCluster::start_partitionable_with(3, timing).await;
    all_ready(cluster).await;
    let (_, _, body) = probes(cluster, 1).await;
    assert_eq!(body.trim(), "ok");

    // The leader is cut off: its followers are not ready (nor SERVING)
    // before a new leader is elected (with no new term, they are seen in
    // the old one), and the old leader is not ready either.
    let leader = cluster.leader().await;
    let term = |id: u64| cluster.node(id).leadership.view().term;
    let old_term = term(leader);
    let followers: Vec<u64> = cluster
        .running()
        .into_iter()
        .filter(|id| *id != leader)
        .collect();
    let cut = Instant::now();
    cluster.isolate(leader);
    for id in &followers {
        let addr = &cluster.addr(*id);
        let (code, why, seen_in) = eventually(
            &format!("follower {id} not ready and NOT_SERVING without word from its leader"),
            Duration::from_secs(60),
            || async move {
                let (_, ready, body) = probes(cluster, *id).await;
                let serving = health(addr, "").await;
                (ready == 503 && serving == NOT_SERVING).then(|| (ready, body, term(*id)))
            },
        )
        .await;
        // The figure this test bounded at 750 ms before.
        let after = cut.elapsed();
        eprintln!(
            "t93: follower {id} not ready {after:?} after its leader was cut off \
             (term {seen_in}, was {old_term}): {why}"
        );
        assert_eq!(
            seen_in, old_term,
            "follower {id} was ready until a new term began ({after:?} after its leader was \
             cut off)"
        );
        assert_eq!(code, 503);
        assert!(why.contains("leader"), "{why}");
    }
    eventually(
        "the cut-off leader not ready",
        Duration::from_secs(60),
        || async {
            let (live, ready, body) = probes(cluster, leader).await;
            (live == 200 && ready == 503).then_some(body)
        },
    )
    .await;
    cluster.heal();
    all_ready(cluster).await;

    // No leader anywhere: every node is live but not ready.
    cluster.partition(&[&[1], &[2], &[3]]);
    for id in 1..=3 {
        let addr = &cluster.addr(id);
        eventually(
            &format!("node {id} live, not ready, NOT_SERVING, liveness SERVING"),
            Duration::from_secs(60),
            || async move {
                let (live, ready, _) = probes(cluster, id).await;
                let serving = health(addr, "").await;
                let alive = health(addr, "liveness").await;
                (live == 200 && ready == 503 && serving == NOT_SERVING && alive == SERVING)
                    .then_some(())
            },
        )
        .await;
    }
    cluster.heal();
    all_ready(cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_whose_core_stopped_is_neither_live_nor_ready() {
    let cluster = TestCluster::start(3).await;
    all_ready(&cluster).await;
    let leader = cluster.leader().await;
    let follower = cluster
        .running()
        .into_iter()
        .find(|id| *id != leader)
        .expect("a follower");
    cluster.storage_faults(follower).fail_syncs();
    // A write makes the follower append, and its sync fails.
    let client = cluster.client().await;
    let session = client
        .session(Duration::from_secs(10))
        .await
        .expect("session");
    session
        .lock("probes/x")
        .await
        .expect("granted by the others");
    tokio::time::timeout(Duration::from_secs(20), cluster.node(follower).failed())
        .await
        .expect("the follower's core stops");
    let addr = cluster.addr(follower);
    let (live, ready, body) = probes(&cluster, follower).await;
    assert_eq!((live, ready), (503, 503), "{body}");
    assert!(
        body.contains("has stopped") && body.contains("I/O error"),
        "{body}"
    );
    assert_eq!(health(&addr, "liveness").await, NOT_SERVING);
    assert_eq!(health(&addr, "").await, NOT_SERVING);
}
