//! (f) Snapshots: a node added after the log was purged catches up through
//! a snapshot, and nodes restarted after snapshots and purges come back with
//! the same state. The clusters here snapshot every 500 entries and keep
//! 100 entries behind a snapshot, so the first snapshot (> 500 entries)
//! already purges. (With the production's 1000 kept, a purge took > 1500
//! entries: more than 60 s of churn on a 2-core machine at load 14, where
//! the test's deadline failed both tests with a snapshot at 1000 and
//! nothing purged.)

use std::time::Duration;

use raftlock_client::proto::{ListRequest, LockInfo, StatusResponse, WatchRequest};
use raftlock_client::{Client, Guard, Session};
use raftlock_node::node::RaftTiming;
use raftlock_node::raft::WatchReceiver as _;
use raftlock_testkit::{eventually, locks_at, status_at, test_timing, TestCluster};
use tokio::task::JoinHandle;
use tonic::Code;

/// Writes about `entries` log entries: concurrent sessions locking and
/// releasing their own names (one entry each). The sessions are closed
/// afterwards, so they leave no state behind.
async fn churn(client: &Client, entries: usize) {
    const TASKS: usize = 8;
    let rounds = entries / TASKS / 2 + 1;
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let s = client
                .session(Duration::from_secs(30))
                .await
                .expect("churn session");
            for i in 0..rounds {
                let g = s
                    .lock(&format!("churn/{t}/{}", i % 4))
                    .await
                    .expect("churn lock");
                assert!(g.release().await.expect("churn release"));
            }
            s.close().await.expect("close");
        }));
    }
    for t in tasks {
        t.await.expect("churn task");
    }
}

/// State that has to travel inside snapshots.
struct Held {
    keeper: Session,
    lock: Guard,
    permits: Guard,
    waiter: JoinHandle<raftlock_client::Result<Guard>>,
}

async fn hold_some_state(client: &Client) -> Held {
    let keeper = client
        .session(Duration::from_secs(60))
        .await
        .expect("keeper");
    let lock = keeper
        .lock_with("sn/held", false, None, b"snap".to_vec())
        .await
        .expect("lock");
    let permits = keeper
        .semaphore("sn/pool", 4)
        .acquire(3)
        .await
        .expect("permits");
    let other = client
        .session(Duration::from_secs(60))
        .await
        .expect("other");
    let waiter = tokio::spawn(async move { other.lock("sn/held").await });
    eventually("the waiter to queue", Duration::from_secs(10), || {
        let client = client.clone();
        async move {
            client
                .describe("sn/held")
                .await
                .ok()
                .flatten()
                .filter(|i| i.waiters.len() == 1)
        }
    })
    .await;
    Held {
        keeper,
        lock,
        permits,
        waiter,
    }
}

/// What node `addr` itself has for `sn/` (a stale read: no leader round).
async fn local_listing(addr: &str) -> Vec<LockInfo> {
    locks_at(addr)
        .list(ListRequest {
            prefix: "sn/".into(),
            page_token: String::new(),
            limit: 0,
            stale: true,
        })
        .await
        .expect("list")
        .into_inner()
        .locks
}

fn table_counts(s: &StatusResponse) -> (u64, u64, u64, u64) {
    (s.last_fence, s.sessions, s.grants, s.waiters)
}

/// A cluster that snapshots every 500 entries and purges the log behind a
/// snapshot but for 100 entries.
async fn purging_cluster() -> TestCluster {
    TestCluster::start_with(
        3,
        RaftTiming {
            logs_to_keep: 100,
            ..test_timing()
        },
    )
    .await
}

/// Churns until node `id` has taken a snapshot and purged the log behind
/// it; returns the purged index. (Concurrent writes share log entries, so
/// the number of commands it takes is not fixed.)
async fn churn_until_purged(cluster: &TestCluster, client: &Client, id: u64) -> u64 {
    let raft = cluster.node(id).raft.clone();
    // How long it takes is a figure of the machine (printed); the deadline
    // is far above it.
    let started = tokio::time::Instant::now();
    let deadline = started + Duration::from_secs(300);
    loop {
        let m = raft.metrics().borrow_watched().clone();
        if let Some(purged) = m.snapshot.and(m.purged).map(|p| p.index).filter(|p| *p > 0) {
            println!(
                "node {id} snapshotted and purged to {purged} after {:.1} s of churn",
                started.elapsed().as_secs_f64()
            );
            return purged;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "node {id} never snapshotted and purged: {m:?}"
        );
        churn(client, 200).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_node_catches_up_through_a_snapshot() {
    let mut cluster = purging_cluster().await;
    let client = cluster.client().await;
    let held = hold_some_state(&client).await;
    let leader = cluster.leader().await;
    let purged = churn_until_purged(&cluster, &client, leader).await;

    // A watch on the new node sees the snapshot replace its (empty) table.
    let (id, addr) = cluster.spawn_new_node().await;
    let mut watch = locks_at(&addr)
        .watch(WatchRequest {
            name: String::new(),
            prefix: String::new(),
        })
        .await
        .expect("watch on the new node")
        .into_inner();
    let admin = cluster.client().await;
    let members = admin.add_node(id, &addr, false).await.expect("add node");
    assert!(members.iter().any(|m| m.id == id && m.voter), "{members:?}");

    let leader = cluster.leader().await;
    cluster.wait_applied(id, cluster.applied(leader)).await;
    let installed = cluster.node(id).raft.metrics().borrow_watched().snapshot;
    let installed = installed.expect("the new node has a snapshot").index;
    assert!(
        installed >= purged,
        "snapshot at {installed} cannot cover the purged log up to {purged}"
    );
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match watch.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("watch ended without a reset"),
                Err(status) => return status,
            }
        }
    })
    .await
    .expect("the watch on the new node is reset");
    assert_eq!(end.code(), Code::Aborted, "{end:?}");
    assert!(end.message().contains("snapshot"), "{end:?}");

    let (l, n) = (
        status_at(&cluster.addr(leader)).await,
        status_at(&addr).await,
    );
    assert_eq!(
        table_counts(&n),
        table_counts(&l),
        "new node's table matches the leader's"
    );
    assert_eq!(n.applied_index, l.applied_index);
    assert_eq!(
        local_listing(&addr).await,
        local_listing(&cluster.addr(leader)).await
    );
    assert_eq!(local_listing(&addr).await.len(), 2, "sn/held and sn/pool");

    // And it follows what happens next.
    assert!(held.lock.release().await.expect("release"));
    let next = held.waiter.await.expect("join").expect("waiter granted");
    assert!(next.fence().get() > l.last_fence);
    let next_fence = next.fence();
    eventually(
        "the new node to see the hand-off",
        Duration::from_secs(10),
        || {
            let addr = addr.clone();
            async move {
                let info = local_listing(&addr)
                    .await
                    .into_iter()
                    .find(|i| i.name == "sn/held")?;
                (info.holders.first()?.fence == next_fence.get() && info.waiters.is_empty())
                    .then_some(())
            }
        },
    )
    .await;
    held.permits.release().await.expect("release");
    held.keeper.close().await.expect("close");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_restart_with_the_same_state_after_snapshots_and_purges() {
    let mut cluster = purging_cluster().await;
    let client = cluster.client().await;
    let held = hold_some_state(&client).await;
    let leader = cluster.leader().await;
    let follower = cluster
        .running()
        .into_iter()
        .find(|id| *id != leader)
        .expect("follower");
    churn_until_purged(&cluster, &client, follower).await;
    cluster
        .wait_applied(follower, cluster.applied(leader))
        .await;

    // One follower: stop, restart with nothing new, then catch up.
    let faddr = cluster.addr(follower);
    let before = status_at(&faddr).await;
    let listing = local_listing(&faddr).await;
    assert_eq!(listing.len(), 2);
    cluster.stop(follower).await;
    cluster.restart(follower).await;
    let raft = cluster.node(follower).raft.clone();
    eventually(
        "the restarted node to report its snapshot",
        Duration::from_secs(10),
        || {
            let snapshot = raft.metrics().borrow_watched().snapshot;
            async move { snapshot.map(|_| ()) }
        },
    )
    .await;
    cluster.wait_applied(follower, before.applied_index).await;
    assert_eq!(
        table_counts(&status_at(&faddr).await),
        table_counts(&before)
    );
    assert_eq!(local_listing(&faddr).await, listing);

    // Everyone: kill all, restart all from snapshot + log.
    let leader = cluster.wait_for_leader().await;
    let before = status_at(&cluster.addr(leader)).await;
    for id in cluster.running() {
        cluster.kill(id).await;
    }
    for id in [1, 2, 3] {
        cluster.restart(id).await;
    }
    let leader = cluster.wait_for_leader().await;
    for id in cluster.running() {
        cluster.wait_applied(id, cluster.applied(leader)).await;
        let s = status_at(&cluster.addr(id)).await;
        assert_eq!(
            table_counts(&s),
            table_counts(&before),
            "node {id} after restarting all"
        );
        assert_eq!(
            local_listing(&cluster.addr(id)).await,
            listing,
            "node {id} after restarting all"
        );
    }

    // The next grant's fence is above all before. (The waiter's own
    // request was parked on a killed node; its client retries it, same seq,
    // at the new leader and keeps its place. Aborting it would withdraw
    // the wait.)
    assert!(held.lock.release().await.expect("release"));
    let granted = held
        .waiter
        .await
        .expect("join")
        .expect("the waiter gets it");
    let info = eventually("the waiter to be granted", Duration::from_secs(10), || {
        let client = client.clone();
        async move {
            client
                .describe("sn/held")
                .await
                .ok()
                .flatten()
                .filter(|i| i.waiters.is_empty())
        }
    })
    .await;
    assert_eq!(info.holders.len(), 1);
    assert_ne!(info.holders[0].session, held.keeper.id());
    assert!(info.holders[0].fence.get() > before.last_fence);
    assert_eq!(granted.fence(), info.holders[0].fence);
    held.permits.release().await.expect("release");
    held.keeper.close().await.expect("close");
    cluster.shutdown().await;
}
