//! (a) A 3-node cluster: acquire, contention, FIFO hand-off, shared locks,
//! semaphores, watch events.

use std::time::Duration;

use futures::StreamExt;
use raftlock_client::{Error, EventKind};
use raftlock_testkit::TestCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acquire_release_and_contention() {
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let a = client
        .session(Duration::from_secs(10))
        .await
        .expect("session a");
    let b = client
        .session(Duration::from_secs(10))
        .await
        .expect("session b");

    let g1 = a.lock("job").await.expect("a locks");
    assert!(
        b.try_lock("job").await.expect("try").is_none(),
        "b must not get a held lock"
    );
    let err = b
        .lock_timeout("job", Duration::from_millis(300))
        .await
        .expect_err("times out");
    assert!(matches!(err, Error::NotAcquired(_)), "{err:?}");

    // b waits; a's release hands the lock to b with a larger fence.
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.lock("job").await }
    });
    let info = raftlock_testkit::eventually("b to be queued", Duration::from_secs(10), || {
        let client = client.clone();
        async move {
            client
                .describe("job")
                .await
                .ok()
                .flatten()
                .filter(|i| i.waiters.len() == 1)
        }
    })
    .await;
    assert_eq!(info.holders[0].fence, g1.fence());
    assert!(g1.release().await.expect("release"));
    assert!(!g1.release().await.expect("second release is harmless"));
    let g2 = waiter.await.expect("join").expect("b gets the lock");
    assert!(g2.fence() > g1.fence());
    assert!(client.check_fence("job", g2.fence()).await.expect("check"));
    assert!(!client.check_fence("job", g1.fence()).await.expect("check"));
    g2.release().await.expect("release");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shared_locks_semaphores_and_watch() {
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let mut events = client.watch("res/", true).await.expect("watch");
    let a = client.session(Duration::from_secs(10)).await.expect("a");
    let b = client.session(Duration::from_secs(10)).await.expect("b");
    let r1 = a.read_lock("res/x").await.expect("a shared");
    let r2 = b.read_lock("res/x").await.expect("b shared too");
    assert_ne!(r1.fence(), r2.fence());
    assert!(a.try_lock("res/y").await.expect("try").is_some());

    let sem_a = a.semaphore("res/pool", 3);
    let sem_b = b.semaphore("res/pool", 3);
    let p1 = sem_a.acquire(2).await.expect("2 of 3");
    assert!(
        sem_b.try_acquire(2).await.expect("try").is_none(),
        "only 1 left"
    );
    let p2 = sem_b.acquire(1).await.expect("1 of 3");
    let mismatch = b
        .semaphore("res/pool", 4)
        .try_acquire(1)
        .await
        .expect_err("capacity mismatch");
    assert!(
        matches!(mismatch, Error::FailedPrecondition(_)),
        "{mismatch:?}"
    );
    p1.release().await.expect("release");
    p2.release().await.expect("release");

    // The watch saw the grants in order, each tagged with its log index.
    let mut kinds = Vec::new();
    let mut last_index = 0;
    while kinds.len() < 4 {
        let e = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("event in time")
            .expect("stream open")
            .expect("stream ok");
        assert!(e.index >= last_index);
        last_index = e.index;
        kinds.push((e.kind, e.name));
    }
    assert_eq!(kinds[0], (EventKind::Granted, "res/x".to_string()));
    assert_eq!(kinds[1], (EventKind::Granted, "res/x".to_string()));
    assert_eq!(kinds[2], (EventKind::Granted, "res/y".to_string()));
    cluster.shutdown().await;
}
