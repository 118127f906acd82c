//! A waiting `Lock` a follower forwarded, whose follower then goes silent
//! and whose caller goes away, does not wait on for good: the leader finds
//! the forwarded call gone when its HTTP/2 keep-alive gives the connection
//! up (a ping after 5 s of silence, unanswered for 5 s), withdraws the
//! wait and closes the call's session (about 10 s after the follower
//! went silent; the test asserts only the behaviour, within 60 s, and
//! that it took at least 3 s).
//!
//! The `Lock` rpc's comment in locks.proto promises this ("the wait stays
//! queued until the leader finds the forwarded call gone"). Here the
//! follower is frozen (SIGSTOP), so nothing it would send reaches the
//! leader, and only the keep-alive can end the call. Without the
//! keep-alive (the two lines in `node::start`'s server builder removed) the
//! leader keeps the wait, and the session alive for it, and this test
//! fails.
//!
//! A grant made before the leader finds the call gone is answered into
//! the silent connection and stands, as for any caller whose host
//! vanished: its session keeps the name for its ttl. A first version of
//! this test unlocked the holder while the follower was frozen and waited
//! for the name to be freed; it was not within 60 s (the session's ttl
//! was 120 s), and locks.proto's comment was corrected.

mod procs;

use std::time::{Duration, Instant};

use procs::{describe, eventually, locks, Procs, BUSY_MACHINE_ELECTIONS};
use raftlock_proto::v1 as pb;
use raftlock_proto::v1::locks_client::LocksClient;
use tonic::transport::Endpoint;

/// The ttl of the caller that goes away: far longer than the deadline
/// below, so an end within it is not the lease running out.
const GONE_CALLER_TTL_MS: u64 = 120_000;

/// The holder's ttl: it must outlive the deadline below too (without a
/// keep-alive, a holder with a 60 s ttl expired, and its name went to the
/// waiter, as the deadline passed).
const HOLDER_TTL_MS: u64 = 300_000;

/// How long the leader may take to withdraw the wait (a deadline, not a
/// bound: the keep-alive's 10 s plus room for a busy machine).
const FREED_WITHIN: Duration = Duration::from_secs(60);

/// Whether process `pid` is stopped (state `T` in `/proc/<pid>/stat`):
/// `kill -STOP` returns before the kernel has stopped every thread.
fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
    })
}

/// The sessions holding and waiting for `name` at `addr`, if it answers.
async fn holders_and_waiters(addr: &str, name: &str) -> Option<(Vec<u64>, Vec<u64>)> {
    let info = describe(addr, name).await?;
    Some((
        info.holders.iter().map(|h| h.session_id).collect(),
        info.waiters.iter().map(|w| w.session_id).collect(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_wait_whose_follower_goes_silent_is_withdrawn_by_the_leaders_keep_alive() {
    // Long election timeouts: a new leader would leave the wait to the
    // session's ttl (the old leader's guard cannot write the close).
    let procs = Procs::start(3, BUSY_MACHINE_ELECTIONS);
    let leader = procs.leader().await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let (at_leader, at_follower) = (procs.addr(leader), procs.addr(follower));
    let name = "forwarded-wait";

    // A holder, on the leader.
    let held = locks(&at_leader)
        .lock(pb::LockRequest {
            name: name.into(),
            ttl_ms: HOLDER_TTL_MS,
            nonce: 11,
            ..Default::default()
        })
        .await
        .expect("the holder's Lock")
        .into_inner();
    assert!(held.acquired, "the holder got {name}");

    // A caller that waits for it on the follower, which forwards the call
    // to the leader. No deadline: a deadline would end the call (and its
    // session) by itself.
    let channel = Endpoint::from_shared(format!("http://{at_follower}"))
        .expect("endpoint")
        .connect_lazy();
    let waiting = tokio::spawn(async move {
        LocksClient::new(channel)
            .lock(pb::LockRequest {
                name: name.into(),
                ttl_ms: GONE_CALLER_TTL_MS,
                wait: true,
                nonce: 12,
                ..Default::default()
            })
            .await
    });
    let waiter = eventually(
        "the forwarded wait is queued on the leader",
        Duration::from_secs(30),
        || async {
            let (_, waiters) = holders_and_waiters(&at_leader, name).await?;
            waiters.first().copied()
        },
    )
    .await;
    assert_ne!(waiter, held.session_id);

    // The follower goes silent with the call in flight, and the caller
    // goes away: nothing tells the leader, but for its keep-alive.
    procs.signal(follower, "STOP");
    let silent = Instant::now();
    let pid = procs.pid(follower);
    eventually(
        "the follower is stopped",
        Duration::from_secs(10),
        || async { stopped(pid).then_some(()) },
    )
    .await;
    waiting.abort();
    eventually(
        "the leader withdraws the wait of the caller that went away",
        FREED_WITHIN,
        || async {
            let (_, waiters) = holders_and_waiters(&at_leader, name).await?;
            waiters.is_empty().then_some(())
        },
    )
    .await;
    let took = silent.elapsed();
    eprintln!("wait withdrawn {took:?} after node {follower} went silent");
    // Not the caller's going away (it could not reach the frozen
    // follower): the keep-alive's ping comes only after 5 s of silence.
    assert!(
        took >= Duration::from_secs(3),
        "the wait was withdrawn {took:?} after the follower went silent: \
         something other than the keep-alive ended it"
    );
    // Its session was closed with it.
    let closed = locks(&at_leader)
        .set_session_ttl(pb::SetSessionTtlRequest {
            session_id: waiter,
            seq: 2,
            ttl_ms: 1_000,
        })
        .await;
    assert_eq!(
        closed.as_ref().map_err(|s| s.code()).err(),
        Some(tonic::Code::NotFound),
        "the gone caller's session {waiter} is closed: {closed:?}"
    );
    let (holders, _) = holders_and_waiters(&at_leader, name)
        .await
        .expect("Describe on the leader");
    assert_eq!(holders, vec![held.session_id], "the holder still holds");
    // The holder lets go; nobody else waits.
    let released = locks(&at_leader)
        .unlock(pb::UnlockRequest {
            session_id: held.session_id,
        })
        .await
        .expect("the holder's Unlock")
        .into_inner();
    assert_eq!(released.released, 1);
    // The name is free for the next caller.
    let next = locks(&at_leader)
        .lock(pb::LockRequest {
            name: name.into(),
            ttl_ms: 10_000,
            nonce: 13,
            ..Default::default()
        })
        .await
        .expect("the next Lock")
        .into_inner();
    assert!(next.acquired, "the next caller got {name}");

    procs.signal(follower, "CONT");
}
