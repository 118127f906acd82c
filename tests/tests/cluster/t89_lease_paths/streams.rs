//! `end_on_disconnect` streams: counted again after a leadership round
//! trip, two streams on one session, a session believed for its grace only.

use std::time::Duration;

use raftlock_testkit::{eventually, TestCluster};
use tokio::time::Instant;

use super::{holding_session, holds, keep_alive_stream, renew_on, still_holds_for, transfer};

/// A stream that renewed a session before the leadership left its node
/// and came back is counted again when it renews in the new term: its end
/// starts the grace (review 2026-11-29 #4: the session lived its ttl).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_counts_again_after_the_leadership_comes_back() {
    let cluster = TestCluster::start(3).await;
    let leader = cluster.leader().await;
    let other = cluster
        .running()
        .into_iter()
        .find(|&id| id != leader)
        .expect("a follower");
    let addr = cluster.addr(leader);
    let session = holding_session(&addr, "eod-term/a", 20_000, 1_000).await;
    let (tx, mut answers) = keep_alive_stream(&addr).await;
    renew_on(&tx, &mut answers, session, 1).await;
    transfer(&cluster, leader, other).await;
    transfer(&cluster, other, leader).await;
    renew_on(&tx, &mut answers, session, 2).await;
    let ended = Instant::now();
    drop(tx);
    drop(answers);
    // The grace (1 s), not the ttl (20 s).
    eventually(
        "the session to end a grace after its stream",
        Duration::from_secs(10),
        || async { (!holds(&addr, "eod-term/a", session).await).then_some(()) },
    )
    .await;
    assert!(ended.elapsed() >= Duration::from_millis(1_000));
    cluster.shutdown().await;
}

/// With two streams renewing one session, the end of one does not end
/// the session while the other is open, across a leadership round trip
/// too (review 2026-11-29 #4: it expired a grace after the first ended).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_on_two_streams_outlives_the_end_of_one() {
    let cluster = TestCluster::start(3).await;
    let leader = cluster.leader().await;
    let other = cluster
        .running()
        .into_iter()
        .find(|&id| id != leader)
        .expect("a follower");
    let addr = cluster.addr(leader);
    let session = holding_session(&addr, "eod-two/a", 20_000, 1_000).await;
    let (a, mut a_answers) = keep_alive_stream(&addr).await;
    renew_on(&a, &mut a_answers, session, 1).await;
    transfer(&cluster, leader, other).await;
    transfer(&cluster, other, leader).await;
    renew_on(&a, &mut a_answers, session, 2).await;
    let (b, mut b_answers) = keep_alive_stream(&addr).await;
    renew_on(&b, &mut b_answers, session, 1).await;
    drop(a);
    drop(a_answers);
    // Three graces: stream B still carries it.
    still_holds_for(&addr, "eod-two/a", session, Duration::from_secs(3)).await;
    // And B's end ends it after the grace.
    drop(b);
    drop(b_answers);
    eventually(
        "the session to end a grace after its last stream",
        Duration::from_secs(10),
        || async { (!holds(&addr, "eod-two/a", session).await).then_some(()) },
    )
    .await;
    cluster.shutdown().await;
}

/// A session that ends with its process is believed only as long as the
/// leader may keep it without a stream: the Rust client counts
/// min(ttl, grace) - margin from each answered send (review 2026-11-29
/// #3: it counted the ttl, 16 s past the leader's end).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_ending_with_its_process_is_believed_for_its_grace_only() {
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let session = client
        .session_with(raftlock_client::SessionOptions {
            ttl: Duration::from_secs(30),
            end_on_disconnect: Some(Duration::from_secs(1)),
            ..Default::default()
        })
        .await
        .expect("session");
    let _held = session.lock("eod-count/x").await.expect("lock");
    let until = Instant::now() + Duration::from_secs(3);
    let mut checks = 0;
    while Instant::now() < until {
        if let raftlock_client::LeaseState::Valid(end) = *session.lease().borrow() {
            let ahead = end.saturating_duration_since(Instant::now());
            assert!(
                ahead <= Duration::from_secs(1),
                "the client believes {ahead:?} ahead; the leader keeps a dead client's session \
                 only its 1 s grace after the stream ends"
            );
        }
        checks += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(checks > 10);
    // And it is not lost while healthy.
    assert!(session.is_valid(), "a healthy holder's lease lapsed");
    cluster.shutdown().await;
}
