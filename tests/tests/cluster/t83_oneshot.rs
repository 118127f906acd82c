//! The one-call `Lock` and `Unlock`, `SetSessionTtl`, and sessions that end
//! with their keep-alive stream, over gRPC against a real cluster.

use std::time::Duration;

use raftlock_proto::v1 as pb;
use raftlock_testkit::{eventually, locks_at, status_at, TestCluster};
use tonic::Code;

fn lock_req(name: &str, nonce: u64) -> pb::LockRequest {
    pb::LockRequest {
        name: name.into(),
        ttl_ms: 10_000,
        nonce,
        ..Default::default()
    }
}

/// Open sessions, as the leader counts them.
async fn sessions(cluster: &TestCluster) -> u64 {
    status_at(&cluster.leader_addr().await).await.sessions
}

/// Waits until `name` has exactly `holders` holders and `waiters` waiters.
async fn wait_for(cluster: &TestCluster, name: &str, holders: usize, waiters: usize) {
    wait_for_within(cluster, name, holders, waiters, Duration::from_secs(20)).await
}

/// [`wait_for`], for at most `deadline`.
async fn wait_for_within(
    cluster: &TestCluster,
    name: &str,
    holders: usize,
    waiters: usize,
    deadline: Duration,
) {
    let client = cluster.client().await;
    eventually(
        &format!("{name}: {holders} holders, {waiters} waiters"),
        deadline,
        || {
            let client = client.clone();
            async move {
                let (h, w) = match client.describe(name).await.ok()? {
                    None => (0, 0),
                    Some(i) => (i.holders.len(), i.waiters.len()),
                };
                (h == holders && w == waiters).then_some(())
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_and_unlock_take_one_write_each_and_leave_nothing() {
    let cluster = TestCluster::start(3).await;
    let mut locks = locks_at(&cluster.leader_addr().await);
    let before = sessions(&cluster).await;
    let index_before = cluster.max_applied();
    let held = locks
        .lock(lock_req("os/a", 1))
        .await
        .expect("lock")
        .into_inner();
    assert!(
        held.acquired && held.fence > 0 && held.session_id > 0,
        "{held:?}"
    );
    assert_eq!((held.ttl_ms, held.next_seq), (10_000, 2));
    assert_eq!(
        cluster.max_applied() - index_before,
        1,
        "one log entry for the open and the acquire"
    );
    // A retry with the same nonce: the same grant, no new session.
    let again = locks
        .lock(lock_req("os/a", 1))
        .await
        .expect("retry")
        .into_inner();
    assert_eq!(again, held);
    // Busy: a try of another caller is not granted and leaves no session.
    let busy = locks
        .lock(lock_req("os/a", 2))
        .await
        .expect("try")
        .into_inner();
    assert!(!busy.acquired && busy.session_id == 0, "{busy:?}");
    assert_eq!(sessions(&cluster).await, before + 1);
    // Unlock: released and closed in one write; a retry is answered alike.
    let unlock = pb::UnlockRequest {
        session_id: held.session_id,
    };
    let r = locks.unlock(unlock).await.expect("unlock").into_inner();
    assert_eq!(r.released, 1);
    let r = locks
        .unlock(unlock)
        .await
        .expect("retried unlock")
        .into_inner();
    assert_eq!(r.released, 1);
    wait_for(&cluster, "os/a", 0, 0).await;
    assert_eq!(sessions(&cluster).await, before);
    // Bad input changes nothing.
    let bad = locks
        .lock(pb::LockRequest {
            ttl_ms: 10,
            ..lock_req("os/b", 3)
        })
        .await
        .expect_err("ttl too short");
    assert_eq!(bad.code(), Code::InvalidArgument);
    let bad = locks
        .lock(pb::LockRequest {
            end_on_disconnect_ms: 60_001,
            ..lock_req("os/b", 4)
        })
        .await
        .expect_err("grace too long");
    assert_eq!(bad.code(), Code::InvalidArgument);
    let gone = locks.unlock(pb::UnlockRequest { session_id: 12345 }).await;
    assert_eq!(gone.expect_err("unknown").code(), Code::NotFound);
    assert_eq!(sessions(&cluster).await, before);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_lock_is_granted_on_release_and_a_timed_out_one_leaves_nothing() {
    let cluster = TestCluster::start(3).await;
    let leader = cluster.leader_addr().await;
    let mut locks = locks_at(&leader);
    let before = sessions(&cluster).await;
    let held = locks
        .lock(lock_req("os/w", 10))
        .await
        .expect("lock")
        .into_inner();
    // A bounded wait that runs out: no waiter, no session left behind.
    let timed_out = locks
        .lock(pb::LockRequest {
            timeout_ms: 300,
            ..lock_req("os/w", 11)
        })
        .await
        .expect("answered")
        .into_inner();
    assert!(!timed_out.acquired && timed_out.session_id == 0);
    wait_for(&cluster, "os/w", 1, 0).await;
    assert_eq!(sessions(&cluster).await, before + 1);
    // A wait without a timeout, longer than its ttl: the node keeps its
    // session alive, and it is granted on release with a larger fence.
    let waiter = tokio::spawn({
        let mut locks = locks_at(&leader);
        async move {
            locks
                .lock(pb::LockRequest {
                    wait: true,
                    ttl_ms: 1_000,
                    ..lock_req("os/w", 12)
                })
                .await
                .map(|r| r.into_inner())
        }
    });
    wait_for(&cluster, "os/w", 1, 1).await;
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        sessions(&cluster).await,
        before + 2,
        "the waiting lock's session lives on"
    );
    locks
        .unlock(pb::UnlockRequest {
            session_id: held.session_id,
        })
        .await
        .expect("unlock");
    let granted = waiter.await.expect("join").expect("granted");
    assert!(
        granted.acquired && granted.fence > held.fence,
        "{granted:?}"
    );
    wait_for(&cluster, "os/w", 1, 0).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lock_whose_caller_goes_away_while_waiting_leaves_nothing_queued() {
    let cluster = TestCluster::start(3).await;
    let leader = cluster.leader_addr().await;
    let mut locks = locks_at(&leader);
    let before = sessions(&cluster).await;
    let held = locks
        .lock(lock_req("os/g", 20))
        .await
        .expect("lock")
        .into_inner();
    let caller = tokio::spawn({
        let mut locks = locks_at(&leader);
        async move {
            locks
                .lock(pb::LockRequest {
                    wait: true,
                    ..lock_req("os/g", 21)
                })
                .await
        }
    });
    wait_for(&cluster, "os/g", 1, 1).await;
    // The caller goes away (its request is cancelled): the wait is
    // withdrawn and its session closed.
    caller.abort();
    wait_for(&cluster, "os/g", 1, 0).await;
    eventually(
        "the abandoned session to close",
        Duration::from_secs(10),
        || async { (sessions(&cluster).await == before + 1).then_some(()) },
    )
    .await;
    assert!(held.acquired);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn set_session_ttl_restarts_the_lease_at_the_new_length() {
    let cluster = TestCluster::start(3).await;
    let mut locks = locks_at(&cluster.leader_addr().await);
    // A 5 s lease, then a shorter ttl (3 s): the lease restarts at it, and
    // renewals are at the new length. (The three calls after the change,
    // each a write, fit in 3 s with room on a loaded machine.)
    let held = locks
        .lock(pb::LockRequest {
            ttl_ms: 5_000,
            ..lock_req("os/t", 30)
        })
        .await
        .expect("lock")
        .into_inner();
    let set = pb::SetSessionTtlRequest {
        session_id: held.session_id,
        seq: 2,
        ttl_ms: 3_000,
    };
    let r = locks.set_session_ttl(set).await.expect("set").into_inner();
    assert_eq!(r.ttl_ms, 3_000);
    // Exactly once: a retry is answered alike; the seq reused for another
    // ttl is refused; a bad ttl is refused.
    assert_eq!(
        locks
            .set_session_ttl(set)
            .await
            .expect("retry")
            .into_inner()
            .ttl_ms,
        3_000
    );
    // Were the reused seq applied, the session would live ten minutes.
    let reused = locks
        .set_session_ttl(pb::SetSessionTtlRequest {
            ttl_ms: 600_000,
            ..set
        })
        .await
        .expect_err("seq reused");
    assert_eq!(reused.code(), Code::FailedPrecondition);
    let bad = locks
        .set_session_ttl(pb::SetSessionTtlRequest {
            seq: 3,
            ttl_ms: 5,
            ..set
        })
        .await
        .expect_err("bad ttl");
    assert_eq!(bad.code(), Code::InvalidArgument);
    // Nobody keeps it alive: it expires when the 3 s lease (restarted by
    // the change and by its retry) runs out, not the ten minutes of the
    // refused request. The deadline is generous and far from those ten
    // minutes (it takes about 3 s on an idle machine).
    let started = std::time::Instant::now();
    wait_for_within(&cluster, "os/t", 0, 0, Duration::from_secs(120)).await;
    eprintln!(
        "t83: the session expired {:?} after the last call (lease 3 s)",
        started.elapsed()
    );
    cluster.shutdown().await;
}

/// The grace of the session that ends with its stream.
const GRACE: Duration = Duration::from_secs(2);

/// One keep-alive of `session` on a new stream, which stays open until the
/// returned sender is dropped.
async fn stream_for(
    addr: &str,
    session: u64,
) -> tokio::sync::mpsc::UnboundedSender<pb::KeepAliveRequest> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tx.send(pb::KeepAliveRequest {
        session_id: session,
        ask_id: 1,
    })
    .expect("queued");
    let mut answers = locks_at(addr)
        .keep_alive(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await
        .expect("stream")
        .into_inner();
    let answer = answers.message().await.expect("answer").expect("one");
    assert!(!answer.expired && answer.ask_id == 1, "{answer:?}");
    // Keep reading so the stream lives as long as the sender.
    tokio::spawn(async move { while let Ok(Some(_)) = answers.message().await {} });
    tx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_bound_to_its_stream_ends_a_grace_after_the_stream_does() {
    let cluster = TestCluster::start(3).await;
    let leader = cluster.leader_addr().await;
    let mut locks = locks_at(&leader);
    // The grace is long enough for a stream to be re-opened within it on
    // a loaded machine (it was 300 ms), and the ttl far beyond the
    // deadline below (it was 30 s).
    let open = |nonce| pb::OpenSessionRequest {
        ttl_ms: 600_000,
        nonce,
        end_on_disconnect_ms: GRACE.as_millis() as u64,
        ..Default::default()
    };
    let s = locks
        .open_session(open(40))
        .await
        .expect("open")
        .into_inner();
    let acquire = |session_id, name: &str| pb::AcquireRequest {
        session_id,
        seq: 1,
        name: name.into(),
        ..Default::default()
    };
    locks
        .acquire(acquire(s.session_id, "os/d"))
        .await
        .expect("acquire");
    // A stream cut and re-opened within the grace keeps the session.
    let first = stream_for(&leader, s.session_id).await;
    drop(first);
    let second = stream_for(&leader, s.session_id).await;
    // Past the grace the first stream's end would have ended it by.
    tokio::time::sleep(GRACE * 2).await;
    wait_for(&cluster, "os/d", 1, 0).await;
    // The last stream ends: the lock is free after the grace, not the
    // 10-minute ttl. The deadline is generous and far from the ttl (it
    // bounded this at 5 s before; it takes about the grace on an idle
    // machine).
    let started = std::time::Instant::now();
    drop(second);
    wait_for_within(&cluster, "os/d", 0, 0, Duration::from_secs(120)).await;
    eprintln!(
        "t83: the lock was free {:?} after the last stream ended (grace {GRACE:?})",
        started.elapsed()
    );
    let gone = locks
        .acquire(pb::AcquireRequest {
            seq: 2,
            ..acquire(s.session_id, "os/d")
        })
        .await;
    assert_eq!(gone.expect_err("expired").code(), Code::NotFound);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_change_ends_no_bound_session() {
    let mut cluster = TestCluster::start(3).await;
    let leader_id = cluster.leader().await;
    let leader = cluster.addr(leader_id);
    let mut locks = locks_at(&leader);
    let s = locks
        .open_session(pb::OpenSessionRequest {
            ttl_ms: 30_000,
            nonce: 50,
            end_on_disconnect_ms: 300,
            ..Default::default()
        })
        .await
        .expect("open")
        .into_inner();
    locks
        .acquire(pb::AcquireRequest {
            session_id: s.session_id,
            seq: 1,
            name: "os/l".into(),
            ..Default::default()
        })
        .await
        .expect("acquire");
    let stream = stream_for(&leader, s.session_id).await;
    // The leader dies, and the stream with it; the new leader never saw a
    // stream of this session, so only its ttl can end it.
    cluster.kill(leader_id).await;
    drop(stream);
    let new_leader = cluster.leader().await;
    assert_ne!(new_leader, leader_id);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    wait_for(&cluster, "os/l", 1, 0).await;
    cluster.shutdown().await;
}
