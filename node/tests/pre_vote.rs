//! A paused follower rejoins without deposing the leader (pre-vote).
//!
//! On 6bd3e3c a follower SIGSTOPped for 30 s campaigned the moment it
//! resumed: the term went 18 → 20 and grants stalled 0.51 s (operator
//! review 2026-11-25, §5). With pre-vote, a node first asks whether it
//! could win; its peers, which hear from a working leader, say no, so it
//! never raises the term. Here a follower is paused well past the election
//! timeout, three times: the term never moves and grants never stall.

mod procs;

use std::time::Duration;

use procs::{status, Probe, Procs};

/// How long the follower stays paused each time (the election timeout is
/// 300-500 ms).
const PAUSE: Duration = Duration::from_secs(3);

/// Longest time the cluster may go without a grant meanwhile (the probe
/// grants about every 30 ms).
const MAX_STALL: Duration = Duration::from_millis(250);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_paused_past_the_election_timeout_returns_without_raising_the_term() {
    let procs = Procs::start(3, &[]);
    let leader = procs.leader().await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let term = status(&procs.addr(leader)).await.expect("status").term;
    let mut probe = Probe::start(
        (1..=3).map(|id| procs.addr(id)).collect(),
        "probe",
        Duration::from_millis(20),
    );
    // Gaps count from the first grant to the end (see graceful_leader.rs).
    probe.first_grant(Duration::from_secs(10)).await;
    let start = std::time::Instant::now();
    for round in 0..3 {
        procs.signal(follower, "STOP");
        eprintln!("{:?}: node {follower} stopped", start.elapsed());
        tokio::time::sleep(PAUSE).await;
        procs.signal(follower, "CONT");
        eprintln!("{:?}: node {follower} resumed", start.elapsed());
        // Long enough for the resumed node to time out and campaign.
        tokio::time::sleep(Duration::from_secs(2)).await;
        for id in 1..=3 {
            let s = status(&procs.addr(id)).await.expect("status");
            assert_eq!(
                (s.term, s.leader_id),
                (term, leader),
                "round {round}: node {id} after node {follower} resumed: {s:?}"
            );
        }
    }
    let report = probe.finish().await;
    for (at, gap) in &report.long_gaps {
        eprintln!("{:?}: grants resumed after {gap:?}", *at - start);
    }
    assert!(
        report.longest_gap <= MAX_STALL,
        "grants stalled for {:?}: {report:?}",
        report.longest_gap
    );
}
