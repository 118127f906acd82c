//! Upgrading a read lock to a write lock and back, through the client, on
//! a real cluster: no writer gets in between, the exclusive grant has a
//! new fence, two upgraders are refused at once, a downgrade keeps its
//! fence and lets the readers in.

use std::time::Duration;

use raftlock_client::{Client, Error, Mode};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upgrade_goes_ahead_of_a_queued_writer_and_gets_a_new_fence() {
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let ttl = Duration::from_secs(20);
    let (a, b, w, r) = (
        client.session(ttl).await.expect("a"),
        client.session(ttl).await.expect("b"),
        client.session(ttl).await.expect("w"),
        client.session(ttl).await.expect("r"),
    );
    let ga = a.read_lock("up/doc").await.expect("a reads");
    let gb = b.read_lock("up/doc").await.expect("b reads");
    let writer = tokio::spawn({
        let w = w.clone();
        async move { w.lock("up/doc").await }
    });
    eventually_state(
        &client,
        "up/doc",
        vec![a.id().get(), b.id().get()],
        vec![w.id().get()],
    )
    .await;
    let upgrade = tokio::spawn({
        let ga = ga.clone();
        async move { ga.upgrade().await }
    });
    // The upgrade waits first in line, ahead of the writer queued before it.
    eventually_state(
        &client,
        "up/doc",
        vec![a.id().get(), b.id().get()],
        vec![a.id().get(), w.id().get()],
    )
    .await;
    // No reader gets in while it waits.
    match r
        .lock_with("up/doc", true, Some(Duration::ZERO), Vec::new())
        .await
    {
        Err(Error::NotAcquired(_)) => {}
        other => panic!("a reader got past the pending upgrade: {other:?}"),
    }
    // A second upgrader would wait for the first forever: refused at once.
    match gb.upgrade().await {
        Err(e @ Error::Deadlock(_)) => {
            // Said once: "deadlock: session … waits for …".
            let text = e.to_string();
            assert!(text.starts_with("deadlock: session "), "{text}");
            assert_eq!(text.matches("deadlock").count(), 1, "{text}");
        }
        other => panic!("expected a deadlock refusal, got {other:?}"),
    }
    assert!(gb.is_held(), "the refused upgrader still reads");
    // b leaves: a is granted, not the writer.
    gb.release().await.expect("b releases");
    let gx = upgrade.await.expect("join").expect("a upgrades");
    assert_eq!(gx.mode(), Mode::Exclusive);
    assert!(gx.fence() > gb.fence() && gx.fence() > ga.fence());
    assert!(!ga.is_held(), "the read guard is spent");
    eventually_state(&client, "up/doc", vec![a.id().get()], vec![w.id().get()]).await;
    assert!(!writer.is_finished());
    // Downgrade: the fence stays; the writer at the head of the queue
    // still waits (it needs the lock to itself).
    let gs = gx.downgrade().await.expect("downgrade");
    assert_eq!(gs.mode(), Mode::Shared);
    assert_eq!(gs.fence(), gx.fence());
    assert!(!gx.is_held());
    eventually_state(&client, "up/doc", vec![a.id().get()], vec![w.id().get()]).await;
    gs.release().await.expect("release");
    let gw = writer.await.expect("join").expect("the writer");
    assert!(gw.fence() > gs.fence());
    // Downgrading what is not exclusive, or upgrading what is not shared,
    // is refused by the client before anything is sent.
    assert!(matches!(gw.upgrade().await, Err(Error::InvalidArgument(_))));
    let gr = gw.downgrade().await.expect("downgrade");
    assert!(matches!(
        gr.downgrade().await,
        Err(Error::InvalidArgument(_))
    ));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bounded_upgrade_runs_out_and_the_read_stays_held() {
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let ttl = Duration::from_secs(20);
    let a = client.session(ttl).await.expect("a");
    let b = client.session(ttl).await.expect("b");
    let ga = a.read_lock("up/bounded").await.expect("a reads");
    let _gb = b.read_lock("up/bounded").await.expect("b reads");
    match ga.upgrade_timeout(Duration::ZERO).await {
        Err(Error::NotAcquired(_)) => {}
        other => panic!("expected not acquired, got {other:?}"),
    }
    match ga.upgrade_timeout(Duration::from_millis(300)).await {
        Err(Error::NotAcquired(_)) => {}
        other => panic!("expected not acquired, got {other:?}"),
    }
    assert!(ga.is_held());
    eventually_state(
        &client,
        "up/bounded",
        vec![a.id().get(), b.id().get()],
        vec![],
    )
    .await;
    cluster.shutdown().await;
}
