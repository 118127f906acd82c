//! Tests of the outgoing RPCs: stale replication streams and the answer budget.

use super::streams::{answer_budget, answer_overdue};
use super::*;

const MS: Duration = Duration::from_millis(1);

/// Only an entry-less request whose next index is purged ends a
/// stream (openraft 0.10.0-alpha.37's stale stream, seed 713724 on
/// 4d345ff: prev 1046 with the log purged through 1047).
#[test]
fn only_a_stream_whose_next_index_is_purged_is_stale() {
    let vote = Vote::new_committed(3, 1);
    let at = |prev: Option<u64>, entries: &[u64]| AppendEntriesRequest::<TypeConfig> {
        vote,
        prev_log_id: prev.map(|i| crate::raft::log_id(3, 1, i)),
        entries: entries
            .iter()
            .map(|i| crate::raft::Entry {
                log_id: crate::raft::log_id(3, 1, *i),
                payload: crate::raft::EntryPayload::Blank,
            })
            .collect(),
        leader_commit: None,
    };
    // Purged through 1047: the next index not purged is 1048.
    assert!(ends_stale_stream(&at(Some(1046), &[]), 1048));
    // Matched at the purge point: its next entry is there.
    assert!(!ends_stale_stream(&at(Some(1047), &[]), 1048));
    // Entries to send, or an empty follower's probe: never.
    assert!(!ends_stale_stream(&at(Some(1046), &[1047]), 1048));
    assert!(!ends_stale_stream(&at(None, &[]), 1048));
    // Nothing purged.
    assert!(!ends_stale_stream(&at(Some(5), &[]), 0));
}

/// A follower whose syncs take three heartbeats (a busy disk) answers
/// every batch late by openraft's measure, yet it answers: its stream
/// is kept.
#[test]
fn a_follower_slower_than_the_heartbeat_keeps_its_stream() {
    let ttl = 50 * MS;
    let budget = answer_budget(ttl);
    assert!(budget >= STREAM_ANSWER_BUDGET, "{budget:?}");
    let t0 = Instant::now();
    assert!(!answer_overdue(Some(t0), t0, t0 + 150 * MS, budget));
    // Silent for the whole budget: given up.
    assert!(answer_overdue(Some(t0), t0, t0 + budget, budget));
    // openraft's budget wins when it is the longer one.
    assert_eq!(
        answer_budget(10 * STREAM_ANSWER_BUDGET),
        10 * STREAM_ANSWER_BUDGET
    );
}

/// Answers come in order: a request sent right behind a slow one waits
/// on the peer only from that one's answer.
#[test]
fn a_request_queued_behind_a_slow_answer_counts_from_that_answer() {
    let budget = STREAM_ANSWER_BUDGET;
    let t0 = Instant::now();
    // Sent at t0 behind a request answered at t0 + 0.9 budget.
    let answered = t0 + budget * 9 / 10;
    assert!(!answer_overdue(
        Some(t0),
        answered,
        t0 + budget * 3 / 2,
        budget
    ));
    assert!(answer_overdue(
        Some(t0),
        answered,
        answered + budget,
        budget
    ));
    // Nothing in flight is never overdue.
    assert!(!answer_overdue(None, t0, t0 + 100 * budget, budget));
}
