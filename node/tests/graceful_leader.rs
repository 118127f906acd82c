//! A leader stopped with SIGTERM hands its leadership over before it
//! exits, so planned maintenance costs grants only a brief pause.
//!
//! On 6bd3e3c a leader took 4.25 s from SIGTERM to exit and grants stalled
//! 0.96 s while the others waited out its lease and elected a new leader
//! (operator review 2026-11-25, §2). Here the leader of a three-node
//! cluster is stopped with SIGTERM, restarted, and the new leader stopped
//! in turn, as a rolling restart does.

mod procs;

use std::time::{Duration, Instant};

use procs::{Probe, Procs};

/// Longest time the cluster may go without a grant. Without the hand-over
/// a stopped leader stalled grants 0.65-0.98 s. With it, 0.14 s on a quiet
/// machine, but 0.33-0.44 s in most runs on a 2-core machine loaded with
/// other builds (load average 4.5; the probe alone, with no node stopped,
/// then pauses up to 0.21 s): a debug build, three processes and a probe
/// whose every cycle is three writes share two cores.
const MAX_STALL: Duration = Duration::from_millis(500);

/// Longest a leader may take from SIGTERM to exit.
const MAX_EXIT: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stopped_with_sigterm_hands_over_and_grants_barely_pause() {
    let mut procs = Procs::start(3, &[]);
    procs.leader().await;
    let mut probe = Probe::start(
        (1..=3).map(|id| procs.addr(id)).collect(),
        "probe",
        Duration::from_millis(20),
    );
    // Gaps count from the first grant to the end, so every hand-over
    // below falls inside the span the probe measures.
    probe.first_grant(Duration::from_secs(10)).await;
    let start = Instant::now();
    let mut logs = Vec::new();
    for round in 0..2 {
        let leader = procs.leader().await;
        // The probe grants at this leader for a while.
        tokio::time::sleep(Duration::from_secs(1)).await;
        procs.signal(leader, "TERM");
        let asked = Instant::now();
        eprintln!("{:?}: SIGTERM to leader {leader}", start.elapsed());
        let exited = procs
            .exited(leader, Duration::from_secs(10))
            .await
            .unwrap_or_else(|| {
                panic!("round {round}: leader {leader} still runs 10 s after SIGTERM")
            });
        let took = asked.elapsed();
        eprintln!(
            "{:?}: leader {leader} exited ({exited}) after {took:?}",
            start.elapsed()
        );
        assert!(exited.success(), "round {round}: {exited}");
        assert!(
            took <= MAX_EXIT,
            "round {round}: {took:?} from SIGTERM to exit"
        );
        logs.push(procs.read_log(leader));
        // Back, and caught up, before the next round.
        procs.spawn(leader, false);
        procs.leader().await;
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
    for log in logs {
        assert!(
            log.contains("leadership transferred"),
            "the leader says it handed over:\n{}",
            &log[log.len().saturating_sub(2000)..]
        );
    }
}

/// The probe the test above relies on sees a stall that lasts until it is
/// stopped: every node is paused (SIGSTOP) after its first grant and the
/// probe finished while they still are. (Before, it counted only gaps
/// between two grants, so grants that never resumed looked like no stall.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_counts_a_stall_that_lasts_until_it_stops() {
    let procs = Procs::start(3, &[]);
    procs.leader().await;
    let mut probe = Probe::start(
        (1..=3).map(|id| procs.addr(id)).collect(),
        "probe",
        Duration::from_millis(20),
    );
    probe.first_grant(Duration::from_secs(10)).await;
    for id in 1..=3 {
        procs.signal(id, "STOP");
    }
    let stalled = Duration::from_secs(1);
    tokio::time::sleep(stalled).await;
    let report = probe.finish().await;
    for id in 1..=3 {
        procs.signal(id, "CONT");
    }
    assert!(
        report.longest_gap >= stalled,
        "a stall of {stalled:?} until the end went unseen: {report:?}"
    );
}
