//! Each rule of the peer-input checks: a message a protocol-following
//! cluster sends passes, and one that breaks just that rule is refused,
//! saying which.

use std::collections::{BTreeMap, BTreeSet};

use openraft::Membership;

use super::*;
use crate::raft::{log_id, Batch, Entry, NodeAddrs};

const ME: NodeId = 2;

fn local(committed: Option<LogId>) -> Local {
    Local { id: ME, committed }
}

/// A membership as a peer could send it: built through its wire form, so
/// it may break the rules `Membership::new` enforces.
fn members(voters: &[NodeId], nodes: &[NodeId]) -> Membership<NodeId, NodeAddrs> {
    #[derive(serde::Serialize)]
    struct Wire {
        configs: Vec<BTreeSet<NodeId>>,
        nodes: BTreeMap<NodeId, NodeAddrs>,
    }
    let wire = Wire {
        configs: vec![voters.iter().copied().collect()],
        nodes: nodes
            .iter()
            .map(|n| (*n, NodeAddrs::shared(format!("127.0.0.1:{}", 7100 + n))))
            .collect(),
    };
    crate::codec::decode(&crate::codec::encode(&wire).expect("encode")).expect("decode")
}

fn entry(term: u64, node: NodeId, index: u64) -> Entry {
    Entry {
        log_id: log_id(term, node, index),
        payload: EntryPayload::Normal(Batch(Vec::new())),
    }
}

fn append(
    vote: Vote,
    prev: Option<LogId>,
    entries: Vec<Entry>,
) -> AppendEntriesRequest<TypeConfig> {
    AppendEntriesRequest {
        vote,
        prev_log_id: prev,
        entries,
        leader_commit: prev,
    }
}

fn refused(r: Result<(), Refused>, says: &str) {
    match r {
        Ok(()) => panic!("accepted; expected a refusal saying {says:?}"),
        Err(e) => assert!(e.contains(says), "refusal {e:?} does not say {says:?}"),
    }
}

#[test]
fn a_leaders_append_passes_and_each_broken_rule_is_refused() {
    let leader = Vote::new_committed(5, 1);
    let ok = append(
        leader,
        Some(log_id(3, 3, 10)),
        vec![entry(3, 3, 11), entry(5, 1, 12), entry(5, 1, 13)],
    );
    check_append(&ok, &local(Some(log_id(3, 3, 10)))).expect("protocol-following");
    // A heartbeat from the start of the log.
    check_append(&append(leader, None, Vec::new()), &local(None)).expect("heartbeat");

    let mut gap = ok.clone();
    gap.entries[1].log_id.index = 13;
    refused(check_append(&gap, &local(None)), "consecutive");
    let mut first_gap = ok.clone();
    first_gap.entries.remove(0);
    refused(check_append(&first_gap, &local(None)), "consecutive");
    let mut down = ok.clone();
    down.entries[2].log_id = log_id(3, 3, 13);
    refused(check_append(&down, &local(None)), "earlier leader");
    let mut beyond = ok.clone();
    beyond.entries[2].log_id = log_id(6, 1, 13);
    refused(
        check_append(&beyond, &local(None)),
        "beyond the sender's leadership",
    );
    refused(
        check_append(&append(Vote::new(5, 1), None, Vec::new()), &local(None)),
        "committed",
    );
    refused(
        check_append(
            &append(Vote::new_committed(5, ME), None, Vec::new()),
            &local(None),
        ),
        "this node",
    );
    refused(
        check_append(
            &append(Vote::new_committed(MAX_TERM + 1, 1), None, Vec::new()),
            &local(None),
        ),
        "term past",
    );
    let mut far = append(
        Vote::new_committed(5, 1),
        Some(log_id(5, 1, MAX_LOG_INDEX + 1)),
        Vec::new(),
    );
    far.leader_commit = None;
    refused(check_append(&far, &local(None)), "index past");
    // A committed index holds a log id of a later term than the one this
    // node committed there.
    refused(
        check_append(
            &append(leader, Some(log_id(4, 1, 9)), Vec::new()),
            &local(Some(log_id(3, 3, 10))),
        ),
        "contradicts",
    );
    let mut commit = ok.clone();
    commit.leader_commit = Some(log_id(7, 1, 13));
    refused(check_append(&commit, &local(None)), "commit");
}

#[test]
fn membership_entries_need_voters_with_addresses() {
    let leader = Vote::new_committed(5, 1);
    let with = |m| {
        append(
            leader,
            Some(log_id(5, 1, 1)),
            vec![Entry {
                log_id: log_id(5, 1, 2),
                payload: EntryPayload::Membership(m),
            }],
        )
    };
    check_append(&with(members(&[1, 2, 3], &[1, 2, 3])), &local(None)).expect("valid");
    refused(
        check_append(&with(members(&[], &[1])), &local(None)),
        "without voters",
    );
    refused(
        check_append(&with(members(&[1, 4], &[1])), &local(None)),
        "without an address",
    );
    refused(
        check_append(&with(members(&[0], &[0])), &local(None)),
        "node 0",
    );
}

#[test]
fn a_candidates_vote_passes_and_a_leaders_or_a_later_log_is_refused() {
    let req = |vote, last| VoteRequest {
        vote,
        last_log_id: last,
        leadership_transfer: false,
    };
    check_vote_request(&req(Vote::new(6, 3), Some(log_id(5, 1, 20))), &local(None)).expect("ok");
    refused(
        check_vote_request(&req(Vote::new_committed(6, 3), None), &local(None)),
        "uncommitted",
    );
    refused(
        check_vote_request(&req(Vote::new(6, ME), None), &local(None)),
        "this node",
    );
    refused(
        check_vote_request(&req(Vote::new(6, 3), Some(log_id(7, 3, 20))), &local(None)),
        "later term",
    );
    refused(
        check_vote_request(&req(Vote::new(u64::MAX, 3), None), &local(None)),
        "term past",
    );
    refused(
        check_vote_request(&req(Vote::new(6, 0), None), &local(None)),
        "node 0",
    );
}

#[test]
fn a_snapshot_within_its_leaders_vote_passes_and_the_reviews_forgery_is_refused() {
    let meta = |last, membership_at| SnapshotMeta {
        last_log_id: last,
        last_membership: StoredMembership::new(membership_at, members(&[1, 2, 3], &[1, 2, 3])),
    };
    let committed = Some(log_id(3, 1, 40));
    check_snapshot(
        &Vote::new_committed(5, 1),
        &meta(Some(log_id(5, 1, 90)), Some(log_id(1, 1, 0))),
        &local(committed),
    )
    .expect("a leader's snapshot");
    // Review finding 5: a committed vote of term 1000, a snapshot of 2000.
    refused(
        check_snapshot(
            &Vote::new_committed(1000, 1),
            &SnapshotMeta {
                last_log_id: Some(log_id(2000, 1, 5)),
                last_membership: StoredMembership::default(),
            },
            &local(None),
        ),
        "beyond the sender's leadership",
    );
    // Newer than what this node committed, but at a smaller index.
    refused(
        check_snapshot(
            &Vote::new_committed(5, 1),
            &meta(Some(log_id(4, 1, 30)), None),
            &local(committed),
        ),
        "not at a larger index",
    );
    refused(
        check_snapshot(&Vote::new_committed(5, 1), &meta(None, None), &local(None)),
        "at least one entry",
    );
    refused(
        check_snapshot(
            &Vote::new_committed(5, 1),
            &meta(Some(log_id(5, 1, 9)), Some(log_id(5, 1, 10))),
            &local(None),
        ),
        "later entry",
    );
    refused(
        check_snapshot(
            &Vote::new_committed(5, 1),
            &SnapshotMeta {
                last_log_id: Some(log_id(5, 1, 9)),
                last_membership: StoredMembership::default(),
            },
            &local(None),
        ),
        "without voters",
    );
    refused(
        check_snapshot(
            &Vote::new(5, 1),
            &meta(Some(log_id(5, 1, 9)), None),
            &local(None),
        ),
        "committed",
    );
}
