//! Atomic multi-lock on a real cluster: all names or none, in one request;
//! requests for the same names in opposite orders never deadlock; a free
//! name waited for by an atomic request is not taken past it.

use std::time::Duration;

use raftlock_client::{Error, Mode};
use raftlock_testkit::{eventually, TestCluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn atomic_requests_in_opposite_orders_are_granted_in_turn() {
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let ttl = Duration::from_secs(20);
    let (a, b, c, d) = (
        client.session(ttl).await.expect("a"),
        client.session(ttl).await.expect("b"),
        client.session(ttl).await.expect("c"),
        client.session(ttl).await.expect("d"),
    );
    let gx = a.lock("multi/x").await.expect("a holds x");
    let xb = tokio::spawn({
        let b = b.clone();
        async move {
            b.lock_all(
                &[("multi/x", Mode::Exclusive), ("multi/y", Mode::Exclusive)],
                None,
            )
            .await
        }
    });
    let yc = tokio::spawn({
        let c = c.clone();
        async move {
            c.lock_all(
                &[("multi/y", Mode::Exclusive), ("multi/x", Mode::Exclusive)],
                None,
            )
            .await
        }
    });
    // Both wait in both queues, b first (it was applied first) or c first.
    eventually("both queued for y", Duration::from_secs(30), || {
        let client = client.clone();
        async move {
            let y = client.describe("multi/y").await.ok()??;
            (y.waiters.len() == 2 && y.holders.is_empty()).then_some(())
        }
    })
    .await;
    // y is free but taken by nobody past the queued requests.
    match d.lock_timeout("multi/y", Duration::ZERO).await {
        Err(Error::NotAcquired(_)) => {}
        other => panic!("y was taken past the queue: {other:?}"),
    }
    let fx = gx.fence();
    gx.release().await.expect("release x");
    // One of them gets both, then the other: no deadlock.
    let (first, second) = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if xb.is_finished() {
                break (xb, yc);
            }
            if yc.is_finished() {
                break (yc, xb);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("one of them is granted");
    let guards = first.await.expect("join").expect("granted");
    assert_eq!(guards.len(), 2);
    assert!(guards.iter().all(|g| g.fence() > fx));
    assert_ne!(guards[0].fence(), guards[1].fence(), "a fence per grant");
    assert!(!second.is_finished(), "the other waits for both");
    for g in guards {
        g.release().await.expect("release");
    }
    let other = second.await.expect("join").expect("granted next");
    assert_eq!(other.len(), 2);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_atomic_request_that_times_out_takes_nothing_and_leaves_no_waiter() {
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let ttl = Duration::from_secs(20);
    let a = client.session(ttl).await.expect("a");
    let b = client.session(ttl).await.expect("b");
    let held = a.lock("multi/busy").await.expect("a holds busy");
    let r = b
        .lock_all(
            &[
                ("multi/free", Mode::Exclusive),
                ("multi/busy", Mode::Shared),
                (
                    "multi/sem",
                    Mode::Semaphore {
                        weight: 2,
                        capacity: 3,
                    },
                ),
            ],
            Some(Duration::from_millis(300)),
        )
        .await;
    assert!(matches!(r, Err(Error::NotAcquired(_))), "{r:?}");
    eventually("nothing left of b", Duration::from_secs(30), || {
        let client = client.clone();
        async move {
            let free = client.describe("multi/free").await.ok()?;
            let sem = client.describe("multi/sem").await.ok()?;
            let busy = client.describe("multi/busy").await.ok()??;
            (free.is_none() && sem.is_none() && busy.waiters.is_empty()).then_some(())
        }
    })
    .await;
    // Bad requests are refused before anything happens.
    match b
        .lock_all(
            &[("multi/d", Mode::Exclusive), ("multi/d", Mode::Shared)],
            None,
        )
        .await
    {
        Err(Error::InvalidArgument(msg)) => assert!(msg.contains("more than once"), "{msg}"),
        other => panic!("a duplicate name was taken: {other:?}"),
    }
    held.release().await.expect("release");
    cluster.shutdown().await;
}
