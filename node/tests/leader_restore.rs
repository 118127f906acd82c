//! A leader killed with `kill -9` and started again at once. With openraft
//! 0.10's leader restore it came back in its old term without an election
//! (when back inside its followers' lease), which is unsafe (see the first
//! test); raftlock turns it off. Either way a restarted node must not
//! answer from a table that lags what the cluster committed: a keep-alive
//! of a session whose expiry had committed is answered `expired` (or
//! refused, to be retried at a working leader), never `renewed`; a session
//! whose open was acknowledged is never answered `expired`.
//!
//! The window is racy (the restored table lagged in some tries only: on
//! the code before the per-term barrier, 3 or 4 of every 10), so each test
//! repeats it.

mod procs;

use std::time::Duration;

use futures::StreamExt as _;
use procs::{eventually, locks, status, Procs};
use raftlock_proto::v1 as pb;

/// Tries per test, times [`rounds`]: each try restarts the leader into
/// the racy window once; `cargo test` runs a few (this was 10, about 80 s
/// of CI), `scripts/test-campaign.sh` many more (`RAFTLOCK_ROUNDS`).
const TRIES: usize = 3;

/// Tries of the acknowledged-open case (cheap, and rarer: the review saw it
/// in 2 of 28), times [`rounds`] (this was 40).
const OPEN_TRIES: usize = 12;

/// How many times the tries to run: `RAFTLOCK_ROUNDS` (default 1; the
/// campaign script sets 4).
fn rounds() -> u64 {
    std::env::var("RAFTLOCK_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n >= 1)
        .unwrap_or(1)
}

/// Election timeouts several times the default, so the followers' lease
/// (about the upper bound) outlasts a restart of a debug build on a busy
/// machine: the restored leader must come back inside it for the scenario
/// to happen at all.
const SLOW_ELECTIONS: &[&str] = &[
    "--election-timeout-min-ms",
    "1500",
    "--election-timeout-max-ms",
    "2000",
];

/// A set-up write's answer, or `None` when a busy machine interrupted it:
/// the leader lost its quorum while it was pending (`DEADLINE_EXCEEDED`,
/// outcome unknown) or is no longer the leader (`UNAVAILABLE`), both
/// documented answers. The try is then left and another one made, since
/// the scenario needs its set-up to have happened at a known leader.
fn settled<T>(what: &str, answer: Result<tonic::Response<T>, tonic::Status>) -> Option<T> {
    match answer {
        Ok(answer) => Some(answer.into_inner()),
        Err(status)
            if matches!(
                status.code(),
                tonic::Code::DeadlineExceeded | tonic::Code::Unavailable
            ) =>
        {
            println!("leader_restore: {what} interrupted, another try: {status:?}");
            None
        }
        Err(status) => panic!("{what}: {status:?}"),
    }
}

async fn open(addr: &str, ttl_ms: u64, nonce: u64) -> Option<u64> {
    let answer = locks(addr)
        .open_session(pb::OpenSessionRequest {
            ttl_ms,
            nonce,
            ..Default::default()
        })
        .await;
    settled("open session", answer).map(|o| o.session_id)
}

/// Numbers the tries of a test: `wanted` tries must get through their
/// set-up, in at most five times as many attempts.
struct Tries {
    wanted: u64,
    done: u64,
    attempt: u64,
}

impl Tries {
    fn new(wanted: u64) -> Self {
        Tries {
            wanted,
            done: 0,
            attempt: 0,
        }
    }

    /// The next attempt's number, or `None` once enough tries ran.
    fn next(&mut self) -> Option<u64> {
        if self.done >= self.wanted {
            return None;
        }
        assert!(
            self.attempt < 5 * self.wanted,
            "only {} of {} tries got through their set-up in {} attempts",
            self.done,
            self.wanted,
            self.attempt
        );
        self.attempt += 1;
        Some(self.attempt - 1)
    }
}

/// How long a keep-alive may go unanswered: a deadline for a node that
/// hangs, not a latency bound (a restarted node answers, or refuses, in
/// milliseconds on an idle machine; the test bounded it at 5 s before,
/// and a debug build just restarted on a loaded machine can take seconds).
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

/// One keep-alive of `session` at `addr`: its answer, or the status that
/// ended the stream.
async fn keep_alive(addr: &str, session: u64) -> Result<pb::KeepAliveResponse, tonic::Status> {
    let started = std::time::Instant::now();
    let ask = futures::stream::iter([pb::KeepAliveRequest {
        session_id: session,
        ask_id: 1,
    }])
    .chain(futures::stream::pending());
    let mut answers = locks(addr).keep_alive(ask).await?.into_inner();
    let answer = match tokio::time::timeout(ANSWER_WITHIN, answers.message()).await {
        Ok(Ok(Some(answer))) => Ok(answer),
        Ok(Ok(None)) => Err(tonic::Status::unavailable("stream ended")),
        Ok(Err(status)) => Err(status),
        Err(_) => Err(tonic::Status::deadline_exceeded(format!(
            "no answer in {ANSWER_WITHIN:?}"
        ))),
    };
    eprintln!(
        "leader_restore: keep-alive answered in {:?}: {}",
        started.elapsed(),
        match &answer {
            Ok(a) => format!("{a:?}"),
            Err(s) => format!("{:?}", s.code()),
        }
    );
    answer
}

/// `kill -9` the leader and start it again at once; returns once it
/// answers, and whether it came back leading the term it led before.
async fn restart_fast(procs: &mut Procs, leader: u64) -> bool {
    let addr = procs.addr(leader);
    let term = status(&addr).await.expect("leader answers").term;
    procs.kill(leader).await;
    procs.spawn(leader, false);
    let back = eventually(
        "the restarted node answers",
        Duration::from_secs(20),
        || status(&addr),
    )
    .await;
    back.term == term && back.leader_id == leader
}

/// A leader killed before its own copy of an entry reached its disk (the
/// followers had it) and restarted at once must not lead the same term
/// again: it would hand the lost entry's index to a new command, and the
/// replicas would hold two different entries under one log id (the
/// harness found exactly that, seed 24104:
/// `docs/history/2026-11-25-testing-harness-issue-24.md`). It comes
/// back as a follower, and a leader is elected in a new term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_leader_never_leads_its_old_term_again() {
    let mut procs = Procs::start(3, SLOW_ELECTIONS);
    let mut tries = Tries::new(TRIES as u64 * rounds());
    while let Some(i) = tries.next() {
        let leader = procs.leader().await;
        let addr = procs.addr(leader);
        if open(&addr, 60_000, 1_000 + i).await.is_none() {
            continue;
        }
        tries.done += 1;
        assert!(
            !restart_fast(&mut procs, leader).await,
            "try {i}: node {leader} came back leading the term it led before its restart"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_leader_never_renews_a_session_whose_expiry_committed() {
    let mut procs = Procs::start(3, SLOW_ELECTIONS);
    let mut tries = Tries::new(TRIES as u64 * rounds());
    while let Some(i) = tries.next() {
        let leader = procs.leader().await;
        let addr = procs.addr(leader);
        let name = format!("x{i}");
        // S's lease must outlast its own acquire on a busy machine (at
        // load 13 a 1 s lease ran out first), and then run out.
        let Some(s) = open(&addr, 3_000, 2 * i + 1).await else {
            continue;
        };
        let acquire = |session, timeout_ms| pb::AcquireRequest {
            session_id: session,
            seq: 1,
            name: name.clone(),
            mode: pb::Mode::Exclusive as i32,
            timeout_ms,
            ..Default::default()
        };
        let Some(held) = settled("s acquires", locks(&addr).acquire(acquire(s, 0)).await) else {
            continue;
        };
        assert!(held.acquired);
        let Some(w) = open(&addr, 60_000, 2 * i + 2).await else {
            continue;
        };
        // W waits behind S; S is never kept alive, so it expires and W is
        // granted: the expiry has committed by the time W is answered.
        let Some(granted) = settled("w acquires", locks(&addr).acquire(acquire(w, 30_000)).await)
        else {
            continue;
        };
        assert!(granted.acquired, "w was granted once s expired");
        tries.done += 1;

        restart_fast(&mut procs, leader).await;
        match keep_alive(&addr, s).await {
            Ok(answer) => assert!(
                answer.expired,
                "try {i}: the restarted leader renewed session {s} ({answer:?}), whose expiry \
                 had committed and whose lock {name} was granted to session {w} with fence {}",
                granted.fence
            ),
            // Not (yet) a working leader: the client retries elsewhere.
            Err(status) => assert_eq!(
                status.code(),
                tonic::Code::Unavailable,
                "try {i}: {status:?}"
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_leader_never_calls_an_acknowledged_session_expired() {
    let mut procs = Procs::start(3, SLOW_ELECTIONS);
    let mut tries = Tries::new(OPEN_TRIES as u64 * rounds());
    while let Some(i) = tries.next() {
        let leader = procs.leader().await;
        let addr = procs.addr(leader);
        let Some(s) = open(&addr, 60_000, i + 1).await else {
            continue;
        };
        tries.done += 1;
        restart_fast(&mut procs, leader).await;
        match keep_alive(&addr, s).await {
            Ok(answer) => assert!(
                !answer.expired && answer.ttl_ms == 60_000,
                "try {i}: session {s}, opened and acknowledged before the restart, was \
                 answered {answer:?} by the restarted leader"
            ),
            Err(status) => assert_eq!(
                status.code(),
                tonic::Code::Unavailable,
                "try {i}: {status:?}"
            ),
        }
    }
}
