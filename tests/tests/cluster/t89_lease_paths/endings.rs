//! Grants that end: a waiter gone around the hand-off, and revokes (waiting
//! for the holder's count, across a leadership round trip).

use std::time::Duration;

use raftlock_proto::v1 as pb;
use raftlock_testkit::{cluster_at, eventually, locks_at, TestCluster};
use tokio::time::Instant;

use super::{holding_session, holds, keep_alive_stream, renew_on, transfer};

/// One HTTP/1.1 request written on a fresh connection to `addr`, which is
/// returned unread.
async fn http_send(addr: &str, path: &str, body: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await.expect("send");
    conn
}

/// Kills the caller of a request sent on `conn` as a killed process's
/// socket is closed (a FIN), after reading whatever answer had arrived;
/// then reads what the node still writes. Whether an answer (a status
/// line) ever came, before or after the kill.
async fn kill_and_read(mut conn: tokio::net::TcpStream) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = conn.try_read(&mut buf) {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    let _ = conn.shutdown().await;
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    got.starts_with(b"HTTP/1.1")
}

/// A call that is safe to repeat (a `Lock` with its nonce, an `Unlock`),
/// retried while its outcome is unknown (`DeadlineExceeded` or
/// `Unavailable`: the leader lost its quorum, or changed, with the write
/// pending), as a client retries it, for up to 30 s. On a busy machine a
/// test cluster's leader can lose its quorum for a moment (an `Unlock`
/// answered "this leader lost its quorum while the write was pending" in
/// a `cluster` run with four tests at a time on 2 cores), which is not
/// what the tests that use this are about.
async fn until_known<T, F, Fut>(what: &str, mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match call().await {
            Ok(answer) => return answer.into_inner(),
            Err(s)
                if matches!(
                    s.code(),
                    tonic::Code::DeadlineExceeded | tonic::Code::Unavailable
                ) && Instant::now() < deadline =>
            {
                eprintln!("{what}: outcome unknown ({}), retrying", s.message());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(s) => panic!("{what}: {s:?}"),
        }
    }
}

/// A one-call `Lock` whose caller is killed around the hand-off (from
/// just before the holder's `Unlock` is sent to just after, when the
/// release's write grants it the lock while its connection is closing)
/// never keeps the lock it is then granted, unless the node had answered
/// it (a holder killed after its grant keeps it for its ttl): the next
/// waiter gets it in far less than the dead caller's ttl (review
/// 2026-11-29, the ghost grant: 4 of 9 rounds kept it for the session's
/// ttl; the harness's `ghost` path found it in 28 of 141 rounds on
/// d8827d8, killed 5-11 ms after the release was sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_gone_around_the_hand_off_does_not_keep_the_lock() {
    let cluster = TestCluster::start(3).await;
    let addr = cluster.leader_addr().await;
    let locks = locks_at(&addr);
    let mut judged = 0;
    for round in 0..24u64 {
        let name = format!("ghost/{round}");
        let holder = until_known("holder", || {
            let mut locks = locks.clone();
            let request = pb::LockRequest {
                name: name.clone(),
                ttl_ms: 30_000,
                nonce: 100 + round,
                ..Default::default()
            };
            async move { locks.lock(request).await }
        })
        .await;
        assert!(holder.acquired);
        // The doomed waiter: a Lock over HTTP that waits, with a 30 s ttl.
        let doomed = http_send(
            &addr,
            "/v1/locks/Lock",
            &format!(
                r#"{{"name": "{name}", "ttl_ms": 30000, "wait": true, "nonce": {}}}"#,
                200 + round
            ),
        )
        .await;
        eventually("the waiter to queue", Duration::from_secs(10), || {
            let mut locks = locks.clone();
            let name = name.clone();
            async move {
                let d = locks
                    .describe(pb::DescribeRequest { name, stale: false })
                    .await
                    .ok()?
                    .into_inner();
                (d.info?.waiters.len() == 1).then_some(())
            }
        })
        .await;
        // Killed from 4 ms before the holder's Unlock is sent to 12 ms
        // after.
        let kill_after_ms = (round % 17) as i64 - 4;
        let killer = tokio::spawn(async move {
            if kill_after_ms > 0 {
                tokio::time::sleep(Duration::from_millis(kill_after_ms as u64)).await;
            }
            kill_and_read(doomed).await
        });
        if kill_after_ms < 0 {
            tokio::time::sleep(Duration::from_millis(kill_after_ms.unsigned_abs())).await;
        }
        until_known("unlock", || {
            let mut locks = locks.clone();
            let request = pb::UnlockRequest {
                session_id: holder.session_id,
            };
            async move { locks.unlock(request).await }
        })
        .await;
        let answered = killer.await.expect("killer");
        if answered {
            // The node answered before it saw the end: its grant is the
            // dead process's, as a holder killed after its grant.
            continue;
        }
        judged += 1;
        // The next live caller gets the lock well before 30 s (in
        // milliseconds; 8 s is inside the test channel's own deadline, so
        // a kept lock fails the assertion below, not the call: on d8827d8
        // it failed as the call's deadline).
        let next = until_known("next", || {
            let mut locks = locks.clone();
            let request = pb::LockRequest {
                name: name.clone(),
                ttl_ms: 10_000,
                nonce: 300 + round,
                timeout_ms: 8_000,
                ..Default::default()
            };
            async move { locks.lock(request).await }
        })
        .await;
        assert!(
            next.acquired,
            "round {round}: killed {kill_after_ms} ms after the release was sent, the lock \
             stayed with the dead waiter's session"
        );
        until_known("unlock", || {
            let mut locks = locks.clone();
            let request = pb::UnlockRequest {
                session_id: next.session_id,
            };
            async move { locks.unlock(request).await }
        })
        .await;
    }
    eprintln!("t89: {judged} of 24 ghost rounds died unanswered and were judged");
    assert!(judged > 0, "every round was answered before its kill");
    cluster.shutdown().await;
}

/// A revoke stops a session's renewals at once but ends it only when the
/// lease its client may still count has run out: the next waiter is
/// granted no earlier than the holder's own count.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revoke_waits_for_the_holders_count() {
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let holder = client
        .session(Duration::from_secs(4))
        .await
        .expect("holder session");
    let held = holder.lock("rv-lease/x").await.expect("holder locks");
    // The holder's belief: the latest end its lease view ever showed.
    let mut view = holder.lease();
    let believed = std::sync::Arc::new(std::sync::Mutex::new(Instant::now()));
    let watcher = tokio::spawn({
        let believed = believed.clone();
        async move {
            loop {
                if let raftlock_client::LeaseState::Valid(until) = *view.borrow_and_update() {
                    let mut b = believed.lock().expect("lock");
                    *b = (*b).max(until);
                }
                if view.changed().await.is_err() {
                    return;
                }
            }
        }
    });
    let waiter_client = cluster.client().await;
    let waiter = waiter_client
        .session(Duration::from_secs(10))
        .await
        .expect("waiter session");
    let waiting = tokio::spawn(async move {
        let got = waiter.lock("rv-lease/x").await;
        let at = Instant::now();
        (waiter, got, at)
    });
    // Let the holder renew a few times first.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let revoked = client
        .revoke_session(holder.id().get())
        .await
        .expect("revoke");
    assert_eq!(revoked, 1);
    let (_waiter, got, granted_at) = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the waiter is granted")
        .expect("task");
    let got = got.expect("the waiter's lock");
    assert!(got.fence() > held.fence());
    // The holder learned it (at its next keep-alive, or its count ran out).
    tokio::time::timeout(Duration::from_secs(10), holder.lost())
        .await
        .expect("the holder learns its lease is gone");
    let believed = *believed.lock().expect("lock");
    assert!(
        granted_at >= believed,
        "the waiter was granted {:?} before the revoked holder's count ended",
        believed - granted_at
    );
    watcher.abort();
    cluster.shutdown().await;
}

/// A revoke waits for the deadline its session's lease had in the term
/// it began in; if the leadership leaves and comes back meanwhile, every
/// lease restarted at full length and may have been renewed since: the
/// revoke answers UNAVAILABLE, not applied, and the session lives on
/// (found by the simulator's belief oracle, seed 1 of its first belief
/// workload).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revoke_across_a_leadership_round_trip_is_not_applied() {
    let cluster = TestCluster::start(3).await;
    let leader = cluster.leader().await;
    let other = cluster
        .running()
        .into_iter()
        .find(|&id| id != leader)
        .expect("a follower");
    let addr = cluster.addr(leader);
    let session = holding_session(&addr, "rv-trip/a", 4_000, 0).await;
    let revoking = tokio::spawn({
        let addr = addr.clone();
        async move {
            cluster_at(&addr)
                .revoke_session(pb::RevokeSessionRequest {
                    session_id: session,
                })
                .await
        }
    });
    eventually("the revoke to begin", Duration::from_secs(5), || {
        let addr = addr.clone();
        async move {
            let (tx, mut answers) = keep_alive_stream(&addr).await;
            tx.send(pb::KeepAliveRequest {
                session_id: session,
                ask_id: 1,
            })
            .await
            .ok()?;
            let a = answers.message().await.ok()??;
            a.expired.then_some(())
        }
    })
    .await;
    transfer(&cluster, leader, other).await;
    transfer(&cluster, other, leader).await;
    // The new term counts the session afresh, and its client renews it.
    let (tx, mut answers) = keep_alive_stream(&addr).await;
    renew_on(&tx, &mut answers, session, 2).await;
    let answer = revoking.await.expect("task");
    let status = answer.expect_err("the revoke of an earlier term is not applied");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    renew_on(&tx, &mut answers, session, 3).await;
    assert!(holds(&addr, "rv-trip/a", session).await);
    cluster.shutdown().await;
}
