//! The client's promises about grants and waits (review findings 4 and 5):
//! no two live guards ever share one grant, and a wait the client gives up
//! on is withdrawn through the log, never left queued.

use std::time::Duration;

use raftlock_client::{Client, Election};
use raftlock_testkit::{eventually, TestCluster};

/// Waits until `name`'s holders and waiters are the given sessions.
async fn eventually_state(client: &Client, name: &str, holders: Vec<u64>, waiters: Vec<u64>) {
    let what = format!("{name}: holders {holders:?}, waiters {waiters:?}");
    eventually(&what, Duration::from_secs(30), || {
        let client = client.clone();
        let (holders, waiters) = (holders.clone(), waiters.clone());
        async move {
            let info = client.describe(name).await.ok()?;
            let (h, w): (Vec<u64>, Vec<u64>) = match info {
                None => (Vec::new(), Vec::new()),
                Some(i) => (
                    i.holders.iter().map(|h| h.session.get()).collect(),
                    i.waiters.iter().map(|w| w.session.get()).collect(),
                ),
            };
            (h == holders && w == waiters).then_some(())
        }
    })
    .await;
}

/// Review finding 4: `drop(guard); session.lock(name)` must not be answered
/// with the grant whose release is still in flight.
#[tokio::test(flavor = "current_thread")]
async fn a_relock_after_a_drop_never_gets_the_released_grant() {
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let a = client.session(Duration::from_secs(20)).await.expect("a");
    let b = client.session(Duration::from_secs(20)).await.expect("b");
    let g = a.lock("alias/x").await.expect("lock");
    let f1 = g.fence();
    let b_task = tokio::spawn({
        let b = b.clone();
        async move { b.lock_timeout("alias/x", Duration::from_secs(30)).await }
    });
    eventually_state(&client, "alias/x", vec![a.id().get()], vec![b.id().get()]).await;
    // The drop's release is in flight (on this one thread it has not even
    // been sent) when a asks again: a must queue behind b, not be handed
    // the grant that is being released.
    drop(g);
    let again = tokio::time::timeout(
        Duration::from_secs(2),
        a.lock_timeout("alias/x", Duration::from_secs(30)),
    )
    .await;
    if let Ok(Ok(g2)) = &again {
        panic!(
            "a got a guard (fence {}) while b was queued first (a's released fence: {f1})",
            g2.fence()
        );
    }
    let gb = b_task.await.expect("join").expect("b gets x");
    assert!(gb.fence() > f1);
    // a gave up (the future was dropped): its wait is withdrawn too.
    eventually_state(&client, "alias/x", vec![b.id().get()], vec![]).await;
    gb.release().await.expect("release");
    let g2 = a.lock("alias/x").await.expect("a gets x again");
    assert!(
        g2.fence() > gb.fence(),
        "a fresh grant, not the released one"
    );
    cluster.shutdown().await;
}

/// Review finding 4: two tasks sharing one session must not both get a
/// guard on one grant.
#[tokio::test(flavor = "current_thread")]
async fn two_tasks_on_one_session_never_share_a_grant() {
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let s = client.session(Duration::from_secs(20)).await.expect("s");
    let (r1, r2) = tokio::join!(
        s.lock_timeout("alias/y", Duration::from_secs(2)),
        s.lock_timeout("alias/y", Duration::from_secs(2))
    );
    match (&r1, &r2) {
        (Ok(g1), Ok(g2)) => panic!(
            "two guards from one session on one name: fences {} and {}",
            g1.fence(),
            g2.fence()
        ),
        (Ok(_), Err(_)) | (Err(_), Ok(_)) => {}
        (Err(e1), Err(e2)) => panic!("neither task got the lock: {e1}, {e2}"),
    }
    cluster.shutdown().await;
}

/// Review finding 5a: a `lock()` future dropped while queued withdraws its
/// wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dropped_lock_future_leaves_no_waiter() {
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let a = client.session(Duration::from_secs(20)).await.expect("a");
    let b = client.session(Duration::from_secs(20)).await.expect("b");
    let g = a.lock("leak/x").await.expect("lock");
    let gave_up = tokio::time::timeout(Duration::from_millis(500), b.lock("leak/x")).await;
    assert!(gave_up.is_err(), "b cannot get x while a holds it");
    eventually_state(&client, "leak/x", vec![a.id().get()], vec![]).await;
    g.release().await.expect("release");
    // Nobody holds x now: b never got it behind its back.
    eventually_state(&client, "leak/x", vec![], vec![]).await;
    cluster.shutdown().await;
}

/// Review finding 5d: `acquire_all` that fails part way leaves no waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_acquire_all_leaves_no_waiter() {
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let a = client.session(Duration::from_secs(20)).await.expect("a");
    let b = client.session(Duration::from_secs(20)).await.expect("b");
    let g = a.lock("all/q2").await.expect("lock");
    let r = b
        .acquire_all(&["all/q1", "all/q2"], Duration::from_millis(500))
        .await;
    assert!(r.is_err(), "q2 is held");
    eventually_state(&client, "all/q2", vec![a.id().get()], vec![]).await;
    eventually_state(&client, "all/q1", vec![], vec![]).await;
    drop(g);
    cluster.shutdown().await;
}

/// Review finding 5e: a candidate that gives up (its campaign dropped,
/// then `resign`) leaves the election's queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resigned_campaign_leaves_the_queue() {
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let a = client.session(Duration::from_secs(20)).await.expect("a");
    let b = client.session(Duration::from_secs(20)).await.expect("b");
    let mut ea = Election::new(a.clone(), "elect/leader");
    ea.campaign(b"a".to_vec()).await.expect("a leads");
    let mut eb = Election::new(b.clone(), "elect/leader");
    let gave_up =
        tokio::time::timeout(Duration::from_millis(500), eb.campaign(b"b".to_vec())).await;
    assert!(gave_up.is_err(), "b cannot lead while a does");
    eb.resign().await.expect("resign");
    eventually_state(&client, "elect/leader", vec![a.id().get()], vec![]).await;
    ea.resign().await.expect("resign");
    eventually_state(&client, "elect/leader", vec![], vec![]).await;
    cluster.shutdown().await;
}

/// Review finding 16: extreme durations do not panic the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn extreme_timeouts_do_not_panic() {
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let a = client.session(Duration::from_secs(20)).await.expect("a");
    let g = a
        .lock_timeout("edge/x", Duration::MAX)
        .await
        .expect("free: granted");
    g.release().await.expect("release");
    let all = a
        .acquire_all(&["edge/y", "edge/z"], Duration::MAX)
        .await
        .expect("free: granted");
    for g in all {
        g.release().await.expect("release");
    }
    let sem = a.semaphore("edge/s", 2);
    let p = sem
        .acquire_timeout(1, Duration::MAX)
        .await
        .expect("free: granted");
    p.release().await.expect("release");
    cluster.shutdown().await;
}

/// Black-box 4.30: one unknown session on a KeepAlive stream gets its own
/// answer, and the stream goes on for the other sessions on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unknown_session_does_not_end_a_keep_alive_stream() {
    use raftlock_client::proto as pb;
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let a = client.session(Duration::from_secs(20)).await.expect("a");
    let leader = cluster.leader_addr().await;
    let mut locks = raftlock_testkit::locks_at(&leader);
    let ids = [a.id().get(), 999_999_999, a.id().get()];
    // Each ask has its own ask id, which its answer echoes.
    let outbound = tokio_stream::iter(
        ids.into_iter()
            .zip(1..)
            .map(|(session_id, ask_id)| pb::KeepAliveRequest { session_id, ask_id }),
    );
    let mut inbound = locks
        .keep_alive(outbound)
        .await
        .expect("stream")
        .into_inner();
    let mut answers = Vec::new();
    while let Ok(Some(r)) = inbound.message().await {
        answers.push((r.session_id, r.ttl_ms, r.ask_id));
        if answers.len() == ids.len() {
            break;
        }
    }
    assert_eq!(
        answers,
        vec![
            (a.id().get(), 20_000, 1),
            (999_999_999, 0, 2),
            (a.id().get(), 20_000, 3)
        ],
        "every session on the stream gets its own answer"
    );
    cluster.shutdown().await;
}

/// Review finding 5, across a leader change: a wait given up on while the
/// leader changes is withdrawn at the new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wait_given_up_across_a_leader_change_leaves_no_waiter() {
    let mut cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let a = client.session(Duration::from_secs(20)).await.expect("a");
    let b = client.session(Duration::from_secs(20)).await.expect("b");
    let g = a.lock("failover/x").await.expect("lock");
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.lock("failover/x").await }
    });
    eventually_state(
        &client,
        "failover/x",
        vec![a.id().get()],
        vec![b.id().get()],
    )
    .await;
    let leader = cluster.leader().await;
    cluster.kill(leader).await;
    // b gives up while the cluster elects a new leader.
    waiting.abort();
    let _ = waiting.await;
    eventually_state(&client, "failover/x", vec![a.id().get()], vec![]).await;
    g.release().await.expect("release");
    eventually_state(&client, "failover/x", vec![], vec![]).await;
    cluster.shutdown().await;
}

/// `AcquireRequest.wait` is "wait without a timeout" in a form every
/// language and proto3 JSON can write; `timeout_ms` is then ignored. The
/// wait outlasts the (ignored) 1 ms timeout and is granted on release.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wait_true_waits_without_a_timeout() {
    use raftlock_client::proto as pb;
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let holder = client
        .session(Duration::from_secs(20))
        .await
        .expect("holder");
    let guard = holder.lock("wait-flag").await.expect("lock");
    let waiter = client
        .session(Duration::from_secs(20))
        .await
        .expect("waiter");
    let waiter_id = waiter.id().get();
    let leader = cluster.leader_addr().await;
    let mut locks = raftlock_testkit::locks_at(&leader);
    let mut acquire = tokio::spawn(async move {
        locks
            .acquire(pb::AcquireRequest {
                session_id: waiter.id().get(),
                seq: 1_000,
                name: "wait-flag".into(),
                timeout_ms: 1,
                wait: true,
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner())
    });
    eventually_state(
        &client,
        "wait-flag",
        vec![holder.id().get()],
        vec![waiter_id],
    )
    .await;
    // Well past the ignored timeout, still queued.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut acquire)
            .await
            .is_err(),
        "the wait ended on the ignored timeout"
    );
    guard.release().await.expect("release");
    let granted = acquire.await.expect("join").expect("answered");
    assert!(granted.acquired && granted.fence > guard.fence().get());
    cluster.shutdown().await;
}
