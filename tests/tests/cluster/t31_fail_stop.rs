//! Fail-stop on a failing disk, in process: when a node's log syncs start
//! failing (injected `EIO`), its Raft core stops, health turns
//! `NOT_SERVING` (and the `liveness` service too), and `Node::failed`
//! resolves with a cause an operator can act on; `raftlockd` exits non-zero
//! on it (node/tests/fail_stop.rs checks that with a real full disk). The
//! other nodes keep granting with growing fences, and the node, restarted
//! on a healthy disk, catches up.

use std::time::Duration;

use raftlock_testkit::{channel, eventually, TestCluster};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

async fn health(addr: &str, service: &str) -> Option<i32> {
    let r = HealthClient::new(channel(addr))
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .ok()?;
    Some(r.into_inner().status)
}

/// The first answer of the node at `addr` to a health check of `service`,
/// asking again while the call itself fails (a connection not made within
/// its timeout on a loaded machine: the campaign saw one, 2026-11-30) for
/// up to 30 s.
async fn health_answer(addr: &str, service: &str) -> i32 {
    eventually(
        &format!("an answer to a health check of {service:?} at {addr}"),
        Duration::from_secs(30),
        || health(addr, service),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_whose_syncs_fail_stops_and_the_others_go_on() {
    let mut cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let session = client
        .session(Duration::from_secs(30))
        .await
        .expect("session");
    let before = session.lock("fail-stop/a").await.expect("lock");
    let first = before.fence();
    before.release().await.expect("release");

    let leader = cluster.leader().await;
    let addr = cluster.addr(leader);
    assert_eq!(
        health_answer(&addr, "").await,
        ServingStatus::Serving as i32
    );
    cluster.storage_faults(leader).fail_syncs();
    // The next write makes the leader append, and its sync fails. (The
    // call itself may fail or be retried at the next leader.)
    let writer = tokio::spawn({
        let session = session.clone();
        async move { session.lock("fail-stop/b").await }
    });
    let cause = tokio::time::timeout(Duration::from_secs(20), cluster.node(leader).failed())
        .await
        .expect("the node reports its core stopped");
    assert!(
        cause.contains("I/O error")
            && cause.contains(&cluster.data_dir(leader).display().to_string()),
        "the cause names the error and the data directory: {cause}"
    );
    // Health was turned off before the failure was reported.
    for service in ["", "raftlock.v1.Locks", "liveness"] {
        assert_eq!(
            health_answer(&addr, service).await,
            ServingStatus::NotServing as i32,
            "health of {service:?} after a fatal error"
        );
    }

    // raftlockd exits here (status 70); in process, the node is stopped.
    cluster.kill(leader).await;

    // The other two elect a leader and keep granting, fences growing.
    let granted = tokio::time::timeout(Duration::from_secs(30), writer)
        .await
        .expect("the write is answered by the new leader")
        .expect("join")
        .expect("granted");
    assert!(
        granted.fence() > first,
        "{:?} after {first:?}",
        granted.fence()
    );
    let next_leader = cluster.leader().await;
    assert_ne!(next_leader, leader);
    granted.release().await.expect("release");
    let g = session
        .lock("fail-stop/c")
        .await
        .expect("lock after failover");
    assert!(g.fence() > granted.fence());
    g.release().await.expect("release");

    // Its supervisor restarts it on a disk that works again: it catches up.
    cluster.storage_faults(leader).heal();
    cluster.restart(leader).await;
    let target = cluster.max_applied();
    cluster.wait_applied(leader, target).await;
    eventually("the restarted node serves", Duration::from_secs(20), || {
        let addr = addr.clone();
        async move { (health(&addr, "").await? == ServingStatus::Serving as i32).then_some(()) }
    })
    .await;
    cluster.shutdown().await;
}

/// A sync that fails outside the core's own writes (here: a new node
/// records the cluster id of the leader's first message) leaves the core
/// running, yet the node must stop as when its core stops: health
/// `NOT_SERVING`, the liveness service too, before `failed` resolves. On
/// 4faffa8 `failed` resolved while both still said `SERVING` (CI failed on
/// the race in `a_leader_whose_syncs_fail_stops...`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_whose_sync_fails_outside_the_cores_writes_stops_serving_first() {
    let mut cluster = TestCluster::start(3).await;
    let admin = cluster.client().await;
    let (id, addr) = cluster.spawn_new_node().await;
    assert_eq!(
        health_answer(&addr, "liveness").await,
        ServingStatus::Serving as i32
    );
    cluster.storage_faults(id).fail_syncs();
    // The leader's first message makes the new node record the cluster id;
    // that sync fails. (AddNode itself cannot finish.)
    let adding = tokio::spawn(async move { admin.add_node(id, &addr, true).await });
    let cause = tokio::time::timeout(Duration::from_secs(20), cluster.node(id).failed())
        .await
        .expect("the node reports that it cannot write");
    assert!(
        cause.contains("I/O error") && cause.contains(&cluster.data_dir(id).display().to_string()),
        "the cause names the error and the data directory: {cause}"
    );
    let addr = cluster.addr(id);
    for service in ["", "raftlock.v1.Locks", "liveness"] {
        assert_eq!(
            health_answer(&addr, service).await,
            ServingStatus::NotServing as i32,
            "health of {service:?} once the node has failed"
        );
    }
    // It says it is stopping, as a node whose core stopped does.
    let status = raftlock_testkit::status_at(&addr).await;
    assert_eq!(status.role, "shutdown", "{status:?}");
    adding.abort();
    cluster.kill(id).await;
    // The others go on.
    let client = cluster.client().await;
    let session = client
        .session(Duration::from_secs(30))
        .await
        .expect("session");
    session
        .lock("fail-stop/outside")
        .await
        .expect("lock")
        .release()
        .await
        .expect("release");
    cluster.shutdown().await;
}

/// systemd's watchdog (issue 31, item 10): a node feeds it while its Raft
/// core runs and answers, and stops once the core has stopped, so that
/// systemd restarts a node whose core is gone even if the process would
/// not exit by itself. `STATUS=` names the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_watchdog_is_fed_while_the_core_runs_and_not_after() {
    use std::os::unix::net::UnixDatagram;
    use std::sync::Arc;
    let mut cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let session = client
        .session(Duration::from_secs(30))
        .await
        .expect("session");
    let leader = cluster.leader().await;
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&path).expect("bind");
    socket
        .set_read_timeout(Some(Duration::from_millis(50)))
        .expect("timeout");
    let notifier = raftlock_node::systemd::Notifier::new(path.to_str().expect("utf-8 path"))
        .expect("notifier");
    let interval = Duration::from_millis(400);
    let task = tokio::spawn(raftlock_node::systemd::notify(
        cluster.node(leader).leadership.clone(),
        Arc::new(notifier),
        Some(interval),
    ));
    // Messages that arrive within `window`.
    let receive = move |socket: UnixDatagram, window: Duration| {
        tokio::task::spawn_blocking(move || {
            let end = std::time::Instant::now() + window;
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while std::time::Instant::now() < end {
                if let Ok(n) = socket.recv(&mut buf) {
                    got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
                }
            }
            (socket, got)
        })
    };
    let (socket, got) = receive(socket, interval * 3).await.expect("join");
    assert!(got.iter().any(|m| m.contains("READY=1")), "{got:?}");
    assert!(
        got.iter().filter(|m| *m == "WATCHDOG=1").count() >= 3,
        "fed about every {:?}: {got:?}",
        interval / 2
    );

    cluster.storage_faults(leader).fail_syncs();
    let writer = tokio::spawn(async move { session.lock("fail-stop/watchdog").await });
    tokio::time::timeout(Duration::from_secs(20), cluster.node(leader).failed())
        .await
        .expect("the core stops");
    // What was sent up to now may include a last ping; then none for
    // three intervals (systemd gives up after one).
    let (socket, last) = receive(socket, interval).await.expect("join");
    let (_, got) = receive(socket, interval * 3).await.expect("join");
    assert!(
        !got.iter().any(|m| m == "WATCHDOG=1"),
        "fed with a stopped core: {got:?}"
    );
    assert!(
        last.iter()
            .chain(&got)
            .any(|m| m.starts_with("STATUS=Raft core stopped: ") && m.contains("I/O error")),
        "{last:?} {got:?}"
    );
    task.abort();
    writer.abort();
    cluster.kill(leader).await;
    cluster.shutdown().await;
}
