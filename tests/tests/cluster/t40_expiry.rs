//! (d) Lease expiry: a session that stops sending keep-alives loses its
//! locks after its ttl and not before; lock-delay keeps an expired holder's
//! lock unavailable for the delay; a session kept alive keeps its locks for
//! many ttls.
//!
//! Silent sessions are opened over raw gRPC against the leader, so nothing
//! in the background keeps them alive.

use std::time::Duration;

use raftlock_client::proto::locks_client::LocksClient;
use raftlock_client::proto::{AcquireRequest, KeepAliveRequest, Mode, OpenSessionRequest};
use raftlock_client::{Client, Fence, Guard, SessionId};
use raftlock_testkit::{eventually, locks_at, TestCluster};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::Code;

async fn open_raw(locks: &mut LocksClient<Channel>, ttl: Duration, lock_delay: Duration) -> u64 {
    let resp = locks
        .open_session(OpenSessionRequest {
            ttl_ms: ttl.as_millis() as u64,
            lock_delay_ms: lock_delay.as_millis() as u64,
            nonce: 0,
            end_on_disconnect_ms: 0,
        })
        .await
        .expect("open session")
        .into_inner();
    assert_eq!(resp.ttl_ms, ttl.as_millis() as u64);
    assert_eq!(resp.lock_delay_ms, lock_delay.as_millis() as u64);
    resp.session_id
}

fn exclusive(session_id: u64, seq: u64, name: &str) -> AcquireRequest {
    AcquireRequest {
        session_id,
        seq,
        name: name.into(),
        mode: Mode::Exclusive as i32,
        timeout_ms: 0,
        ..Default::default()
    }
}

async fn lock_raw(
    locks: &mut LocksClient<Channel>,
    session_id: u64,
    seq: u64,
    name: &str,
) -> Fence {
    let resp = locks
        .acquire(exclusive(session_id, seq, name))
        .await
        .expect("acquire")
        .into_inner();
    assert!(resp.acquired, "{name} is free");
    Fence::new(resp.fence)
}

/// Queues a live session for `name` and waits until the queue shows it.
async fn queue_behind(client: &Client, name: &str) -> JoinHandle<raftlock_client::Result<Guard>> {
    let live = client
        .session(Duration::from_secs(30))
        .await
        .expect("live session");
    let waiter = tokio::spawn({
        let name = name.to_string();
        async move { live.lock(&name).await }
    });
    eventually(
        "the live session to be queued",
        Duration::from_secs(10),
        || {
            let client = client.clone();
            let name = name.to_string();
            async move {
                client
                    .describe(&name)
                    .await
                    .ok()
                    .flatten()
                    .filter(|i| i.waiters.len() == 1)
            }
        },
    )
    .await;
    waiter
}

/// How long after the ttl an expiry (or the grant it hands on) may take: a
/// deadline for a session that never expires, not a latency bound (it
/// takes well under a second beyond the ttl on an idle machine).
const EXPIRY_SLACK: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_session_loses_its_locks_after_its_ttl_and_not_before() {
    // Long enough that the checks "still held" run well before it ends
    // (see MARGIN) with the set-up (an open, two acquires, a queued
    // waiter) done first, on a loaded machine too: at 2 s, with the checks
    // 0.5 s before the end, the set-up and the checks overran it there.
    const TTL: Duration = Duration::from_secs(10);
    // How long before the ttl the "still held" checks start.
    const MARGIN: Duration = Duration::from_secs(3);
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let mut raw = locks_at(&cluster.leader_addr().await);

    // The lease starts when the leader applies the open, so after this.
    let opened_at = Instant::now();
    let silent = open_raw(&mut raw, TTL, Duration::ZERO).await;
    let fx = lock_raw(&mut raw, silent, 1, "ex/x").await;
    let fy = lock_raw(&mut raw, silent, 2, "ex/y").await;
    let waiter = queue_behind(&client, "ex/x").await;

    // Still held a margin before the ttl.
    tokio::time::sleep_until(opened_at + TTL - MARGIN).await;
    for (name, fence) in [("ex/x", fx), ("ex/y", fy)] {
        let info = client
            .describe(name)
            .await
            .expect("describe")
            .expect("still held");
        assert_eq!(info.holders.len(), 1, "{name}");
        assert_eq!(
            (info.holders[0].session, info.holders[0].fence),
            (SessionId::new(silent), fence),
            "{name}"
        );
        assert!(client.check_fence(name, fence).await.expect("check"));
    }
    assert!(
        Instant::now() < opened_at + TTL,
        "the checks above ran too late to mean anything"
    );
    assert!(
        !waiter.is_finished(),
        "the waiter must not be granted before the ttl"
    );

    // Released some time after the ttl: the waiter gets ex/x, ex/y is free.
    let granted = tokio::time::timeout(TTL + EXPIRY_SLACK, waiter)
        .await
        .expect("the waiter is granted once the ttl has run out")
        .expect("join")
        .expect("the waiter gets ex/x");
    let granted_at = Instant::now();
    // The figure this test bounded at ttl + 3 s before.
    eprintln!(
        "t40: the waiter was granted {:?} after the open (ttl {TTL:?})",
        granted_at - opened_at
    );
    assert!(
        granted_at >= opened_at + TTL,
        "expired after only {:?}",
        granted_at - opened_at
    );
    assert!(granted.fence() > fx.max(fy));
    let info = client
        .describe("ex/x")
        .await
        .expect("describe")
        .expect("held by the waiter");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].session, granted.session().id());
    eventually("ex/y to be free", Duration::from_secs(30), || {
        let client = client.clone();
        async move {
            client
                .describe("ex/y")
                .await
                .expect("describe")
                .is_none()
                .then_some(())
        }
    })
    .await;
    assert!(!client.check_fence("ex/y", fy).await.expect("check"));

    // The session is gone for good.
    let err = raw
        .acquire(exclusive(silent, 3, "ex/z"))
        .await
        .expect_err("expired session");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let mut ka = raw
        .keep_alive(futures::stream::iter([KeepAliveRequest {
            session_id: silent,
            ask_id: 1,
        }]))
        .await
        .expect("keep-alive stream")
        .into_inner();
    // The expired session gets its own answer on the stream.
    let answer = ka
        .message()
        .await
        .expect("an answer")
        .expect("not the end of the stream");
    assert_eq!(
        (answer.session_id, answer.ttl_ms, answer.expired),
        (silent, 0, true)
    );

    granted.release().await.expect("release");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_delay_keeps_an_expired_lock_unavailable() {
    // Long enough for the set-up (an acquire after the open, a waiter
    // queued behind it) to fit in the ttl, and for the check during the
    // delay to run, on a loaded machine too (it ran at 1 s and 1.5 s).
    const TTL: Duration = Duration::from_secs(3);
    const DELAY: Duration = Duration::from_secs(5);
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let mut raw = locks_at(&cluster.leader_addr().await);
    let opened_at = Instant::now();
    let silent = open_raw(&mut raw, TTL, DELAY).await;
    let fence = lock_raw(&mut raw, silent, 1, "ld/x").await;
    let waiter = queue_behind(&client, "ld/x").await;

    // Poll until the expiry shows; remember when the holder was last seen.
    let deadline = Instant::now() + TTL + EXPIRY_SLACK;
    let mut last_held = opened_at;
    let delayed = loop {
        let sent = Instant::now();
        let info = client
            .describe("ld/x")
            .await
            .expect("describe")
            .expect("ld/x exists throughout");
        if info.lock_delayed {
            break info;
        }
        assert_eq!(info.holders.len(), 1, "{info:?}");
        assert_eq!(
            (info.holders[0].session, info.holders[0].fence),
            (SessionId::new(silent), fence)
        );
        last_held = sent;
        assert!(
            Instant::now() < deadline,
            "the silent session never expired"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let delay_seen = Instant::now();
    assert!(
        delay_seen >= opened_at + TTL,
        "expired after only {:?}",
        delay_seen - opened_at
    );
    assert!(
        delayed.holders.is_empty(),
        "the expired holder is gone: {delayed:?}"
    );
    assert_eq!(
        delayed.waiters.len(),
        1,
        "the waiter still waits: {delayed:?}"
    );
    assert!(!client.check_fence("ld/x", fence).await.expect("check"));

    // Nobody gets in during the delay, not even a try.
    let other = client
        .session(Duration::from_secs(30))
        .await
        .expect("session");
    if Instant::now() < last_held + DELAY - Duration::from_millis(200) {
        assert!(
            other.try_lock("ld/x").await.expect("try").is_none(),
            "granted during lock-delay"
        );
    }
    let granted = tokio::time::timeout(DELAY + EXPIRY_SLACK, waiter)
        .await
        .expect("the waiter is granted after the delay")
        .expect("join")
        .expect("the waiter gets ld/x");
    let granted_at = Instant::now();
    // The figure this test bounded at delay + 4 s before.
    eprintln!(
        "t40: the waiter was granted {:?} after the holder was last seen (delay {DELAY:?})",
        granted_at - last_held
    );
    // The delay started after the holder was last seen and lasts DELAY.
    assert!(
        granted_at >= last_held + DELAY,
        "granted {:?} after the holder was last seen",
        granted_at - last_held
    );
    assert!(granted.fence() > fence);
    let info = client
        .describe("ld/x")
        .await
        .expect("describe")
        .expect("held");
    assert!(!info.lock_delayed, "{info:?}");
    assert_eq!(info.holders[0].session, granted.session().id());
    granted.release().await.expect("release");
    other.close().await.expect("close");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keep_alives_keep_locks_for_many_ttls() {
    // Three times the recommended minimum ttl (three election timeouts),
    // so that a renewal has seconds to get through on a loaded machine.
    const TTL: Duration = Duration::from_secs(3);
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;

    // Through the client, which keeps the session alive in the background
    // (a session only its ttl ends: the view is checked at every answer,
    // and the default grace's 0.675 s count would make that a figure of
    // the machine).
    let session = client
        .session_with(raftlock_client::SessionOptions {
            ttl: TTL,
            end_on_disconnect: None,
            ..Default::default()
        })
        .await
        .expect("session");
    let guard = session.lock("ka/client").await.expect("lock");

    // Over raw gRPC, with explicit keep-alives on one stream.
    let mut raw = locks_at(&cluster.leader_addr().await);
    let silent_ttl = Duration::from_secs(3);
    let raw_session = open_raw(&mut raw, silent_ttl, Duration::ZERO).await;
    let raw_fence = lock_raw(&mut raw, raw_session, 1, "ka/raw").await;
    let (tx, rx) = futures::channel::mpsc::unbounded();
    tx.unbounded_send(KeepAliveRequest {
        session_id: raw_session,
        ask_id: 1,
    })
    .expect("send");
    let mut answers = raw
        .keep_alive(rx)
        .await
        .expect("keep-alive stream")
        .into_inner();

    let start = Instant::now();
    let mut acked = 0;
    // Three ttls, and at least six renewals of the raw session (a count,
    // not a rate: it ran for a fixed time and wanted six in it before).
    while start.elapsed() < TTL * 3 || acked < 6 {
        // A late answer is caught below: the session would have expired.
        let a = tokio::time::timeout(Duration::from_secs(30), answers.message())
            .await
            .expect("keep-alive answered")
            .expect("keep-alive ok")
            .expect("stream open");
        assert_eq!(
            (a.session_id, a.ttl_ms),
            (raw_session, silent_ttl.as_millis() as u64),
            "{a:?}"
        );
        acked += 1;
        assert!(
            guard.is_held(),
            "the client's lease lapsed after {:?}",
            start.elapsed()
        );
        tokio::time::sleep(silent_ttl / 4).await;
        tx.unbounded_send(KeepAliveRequest {
            session_id: raw_session,
            ask_id: 2,
        })
        .expect("send");
    }
    eprintln!("t40: {acked} keep-alives answered in {:?}", start.elapsed());
    assert!(guard.is_held());
    assert!(client
        .check_fence("ka/client", guard.fence())
        .await
        .expect("check"));
    assert!(client
        .check_fence("ka/raw", raw_fence)
        .await
        .expect("check"));
    let info = eventually("describe", Duration::from_secs(5), || {
        let client = client.clone();
        async move { client.describe("ka/raw").await.ok().flatten() }
    })
    .await;
    assert_eq!(info.holders[0].session, SessionId::new(raw_session));
    guard.release().await.expect("release");
    session.close().await.expect("close");
    cluster.shutdown().await;
}
