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
    let probe = Probe::start(
        (1..=3).map(|id| procs.addr(id)).collect(),
        "probe",
        Duration::from_millis(20),
    );
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
        "grants stalled for {:?}",
        report.longest_gap
    );
    assert!(report.grants > 20, "the probe granted: {report:?}");
    for log in logs {
        assert!(
            log.contains("leadership transferred"),
            "the leader says it handed over:\n{}",
            &log[log.len().saturating_sub(2000)..]
        );
    }
}
