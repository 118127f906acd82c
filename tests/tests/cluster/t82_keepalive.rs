//! Keep-alives at scale: a client's sessions share one `KeepAlive` stream
//! (a stream per keep-alive cost so much that at 100,000 sessions most
//! leases lapsed), and that stream moves to the new leader when the old
//! one is cut off.

use std::time::Duration;

use raftlock_client::Session;
use raftlock_node::metrics::Counter;
use raftlock_node::raft::WatchReceiver as _;
use raftlock_testkit::{eventually, TestCluster};

/// Sessions on one client.
const SESSIONS: usize = 40;

/// Their ttl: a keep-alive each ~1 s. (It was 1 s, a keep-alive each
/// ~330 ms: on a busy machine an answer late by half a second made a
/// client count a lease as lapsed, a figure of the machine rather than of
/// the shared stream this test is about.)
const TTL: Duration = Duration::from_secs(3);

fn counter(cluster: &TestCluster, id: u64, c: Counter) -> u64 {
    cluster.node(id).shared.metrics.get(c)
}

/// Sessions only their ttl ends (no end-on-disconnect grace): with the
/// client's default grace (0.75 s) the count is 0.675 s from each answered
/// keep-alive, and whether every one of 40 sessions says held at a given
/// moment on a busy machine is again a figure of the machine (a failed CI
/// run: "a lease lapsed across the leader change"). Jeopardy across a
/// leader change with the default grace is the jeopardy test's subject below.
async fn open_many(cluster: &TestCluster, ttl: Duration) -> Vec<Session> {
    let client = cluster.client().await;
    let options = raftlock_client::SessionOptions {
        ttl,
        end_on_disconnect: None,
        ..Default::default()
    };
    let opened =
        futures::future::join_all((0..SESSIONS).map(|_| client.session_with(options.clone())))
            .await;
    opened.into_iter().map(|s| s.expect("session")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_clients_sessions_share_one_keep_alive_stream() {
    let cluster = TestCluster::start(3).await;
    let leader = cluster.leader().await;
    let sessions = open_many(&cluster, TTL).await;
    let streams = counter(&cluster, leader, Counter::KeepAliveStreams);
    let renewed = counter(&cluster, leader, Counter::KeepAlives);
    // Every session renewed at least four more times.
    let want = renewed + 4 * SESSIONS as u64;
    eventually("keep-alives to flow", Duration::from_secs(60), || async {
        (counter(&cluster, leader, Counter::KeepAlives) >= want).then_some(())
    })
    .await;
    let opened = counter(&cluster, leader, Counter::KeepAliveStreams) - streams;
    assert!(
        opened <= 1,
        "{opened} KeepAlive streams opened for {} keep-alives of {SESSIONS} sessions on one client",
        4 * SESSIONS
    );
    assert!(sessions.iter().all(Session::is_valid), "a lease lapsed");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_shared_stream_moves_to_a_new_leader_and_no_lease_lapses() {
    let cluster = TestCluster::start_partitionable(3).await;
    let old = cluster.leader().await;
    // Long enough to outlive an election; short enough that a stream stuck
    // on the isolated leader would lose them.
    let sessions = open_many(&cluster, Duration::from_secs(6)).await;
    cluster.isolate(old);
    let new = eventually("a new leader", Duration::from_secs(20), || async {
        cluster
            .running()
            .into_iter()
            .filter(|&id| id != old)
            .find(|&id| {
                let node = cluster.node(id);
                node.raft.metrics().borrow_watched().current_leader == Some(id)
                    && node.shared.leases.is_active()
            })
    })
    .await;
    let renewed = counter(&cluster, new, Counter::KeepAlives);
    let want = renewed + 2 * SESSIONS as u64;
    eventually(
        "keep-alives at the new leader",
        Duration::from_secs(30),
        || async { (counter(&cluster, new, Counter::KeepAlives) >= want).then_some(()) },
    )
    .await;
    assert!(
        sessions.iter().all(Session::is_valid),
        "a lease lapsed across the leader change"
    );
    cluster.heal();
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropping_a_client_closes_its_keep_alive_stream() {
    let cluster = TestCluster::start(3).await;
    let leader = cluster.leader().await;
    let sessions = open_many(&cluster, TTL).await;
    let opened = |c: &TestCluster| counter(c, leader, Counter::KeepAliveStreams);
    let ended = |c: &TestCluster| counter(c, leader, Counter::KeepAliveStreamsEnded);
    eventually("a keep-alive stream", Duration::from_secs(20), || async {
        (opened(&cluster) > ended(&cluster)).then_some(())
    })
    .await;
    // The sessions hold the last handles of their client.
    drop(sessions);
    eventually(
        "the client's stream to end on the node",
        Duration::from_secs(20),
        || async { (opened(&cluster) == ended(&cluster)).then_some(()) },
    )
    .await;
    cluster.shutdown().await;
}

/// Renewals cut off longer than the grace but shorter than the ttl (the
/// leader cut off from both followers: it can confirm nothing, and the
/// followers elect a new leader, in a new term, which restarts every lease
/// at full length) put a session that ends with its process in jeopardy:
/// its view says not held, so the holder stops acting, but nothing is
/// reported lost, keep-alives go on, and the first one the new leader
/// answers makes it held again. The cluster kept the grant all along.
/// (No node is stopped: a stopped node's port could be taken by another
/// test's new node, which the restarted peers would then reach, and a new
/// node adopts the first cluster id it hears.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renewals_cut_off_past_the_grace_are_jeopardy_not_loss() {
    use raftlock_client::{LeaseState, SessionOptions};

    let cluster = TestCluster::start_partitionable(3).await;
    let client = cluster.client().await;
    let session = client
        .session_with(SessionOptions {
            ttl: Duration::from_secs(30),
            end_on_disconnect: Some(Duration::from_millis(750)),
            ..SessionOptions::default()
        })
        .await
        .expect("session");
    let guard = session.lock("jeopardy/job").await.expect("lock");
    let old_leader = cluster.leader().await;
    cluster.isolate(old_leader);
    let s = &session;
    eventually(
        "the view to stop saying held",
        Duration::from_secs(20),
        move || async move { (!s.is_valid()).then_some(()) },
    )
    .await;
    assert!(!guard.is_held(), "a guard is not held in jeopardy");
    // A lock asked for in jeopardy is not refused: it is granted (at the
    // new leader) and handed out once the session is held again.
    let asked = tokio::spawn({
        let session = session.clone();
        async move { session.lock("jeopardy/asked").await }
    });
    eventually(
        "the session to be held again once keep-alives get through",
        Duration::from_secs(25),
        move || async move { s.is_valid().then_some(()) },
    )
    .await;
    assert!(
        matches!(*session.lease().borrow(), LeaseState::Valid(_)),
        "the lease was reported lost in jeopardy"
    );
    assert!(guard.is_held(), "the guard is held again");
    let asked = tokio::time::timeout(Duration::from_secs(30), asked)
        .await
        .expect("the lock asked for in jeopardy settles")
        .expect("join")
        .expect("a lock asked for in jeopardy is granted, not refused");
    assert!(asked.is_held(), "handed out only once held");
    assert!(
        client
            .check_fence("jeopardy/asked", asked.fence())
            .await
            .expect("check"),
        "the cluster has the grant made in jeopardy"
    );
    assert!(
        client
            .check_fence("jeopardy/job", guard.fence())
            .await
            .expect("check"),
        "the cluster kept the grant"
    );
    cluster.heal();
    cluster.shutdown().await;
}
