//! Checks of what a peer sends, made before openraft sees it.
//!
//! openraft trusts its peers: a message no protocol-following node would
//! send can trip one of its assertions (some hold in release builds too,
//! such as "a snapshot never contains a log id beyond its leader's vote")
//! and stop the node's Raft core. So the `Raft` service runs every `Vote`,
//! `AppendEntries` (and each message of `StreamAppend`) and
//! `InstallSnapshot` through these checks first and refuses what fails
//! them with `INVALID_ARGUMENT`, leaving openraft untouched.
//!
//! Each rule is something every message of a protocol-following cluster
//! satisfies:
//!
//! * terms and log indexes stay at most [`MAX_TERM`] and [`MAX_LOG_INDEX`]
//!   (no cluster gets near them; they keep openraft's `term + 1` and the
//!   lock table's command indexes far from overflowing);
//! * a leader's messages (`AppendEntries`, `InstallSnapshot`) carry a
//!   committed vote, a candidate's (`Vote`) an uncommitted one, and neither
//!   comes from this node's own id;
//! * nothing carries a log id beyond its sender's leadership;
//! * entries are consecutive, follow the previous log id, and their log ids
//!   only grow;
//! * a log id at or below this node's committed index is at most its
//!   committed log id (everything up to there is settled);
//! * a snapshot newer than what this node committed ends at a larger index;
//! * memberships name at least one voter in every configuration, and a
//!   node for every voter.
//!
//! These checks keep a node alive; they do not make a forged but
//! well-formed message harmless (one claiming a later term can still
//! disrupt leadership or replace entries not yet known to be committed).
//! That takes peer authentication, which `raftlockd run` requires by
//! default. The committed log id is read when the message arrives; a commit
//! that lands between the check and openraft's handling is always one the
//! real leader made, which only makes a protocol-following message more
//! consistent with it.

use openraft::raft::{AppendEntriesRequest, TransferLeaderRequest, VoteRequest};

use super::{EntryPayload, LogId, NodeId, SnapshotMeta, StoredMembership, TypeConfig, Vote};

/// Largest term a peer may name (2^62). No cluster gets near it (electing
/// a leader every millisecond takes 146 million years), and one pushed to
/// it by a forged vote still has 2^62 elections before openraft's
/// `term + 1` could overflow.
pub const MAX_TERM: u64 = 1 << 62;

/// Largest log index a peer may name (2^53): 285 years at a million
/// entries a second, and small enough that the lock table's command
/// indexes (`index × BATCH_SLOTS + position`) cannot overflow.
pub const MAX_LOG_INDEX: u64 = 1 << 53;

const _: () = assert!(MAX_LOG_INDEX.checked_mul(super::BATCH_SLOTS).is_some());

/// What the checks need to know of this node.
#[derive(Clone, Copy, Debug)]
pub struct Local {
    /// This node's id.
    pub id: NodeId,
    /// The last log id this node knows to be committed.
    pub committed: Option<LogId>,
}

/// Why a message was refused.
pub type Refused = String;

fn check_log_id(what: &str, id: &LogId) -> Result<(), Refused> {
    if id.leader_id.term > MAX_TERM {
        return Err(format!(
            "{what} {id} has a term past the largest accepted, {MAX_TERM}"
        ));
    }
    if id.index > MAX_LOG_INDEX {
        return Err(format!(
            "{what} {id} has an index past the largest accepted, {MAX_LOG_INDEX}"
        ));
    }
    Ok(())
}

fn check_vote(what: &str, vote: &Vote, committed: bool, local: &Local) -> Result<(), Refused> {
    let leader = &vote.leader_id;
    if leader.term > MAX_TERM {
        return Err(format!(
            "{what}'s vote {vote} has a term past the largest accepted, {MAX_TERM}"
        ));
    }
    if leader.node_id == 0 {
        return Err(format!("{what}'s vote {vote} names node 0"));
    }
    if leader.node_id == local.id {
        return Err(format!(
            "{what}'s vote {vote} names this node ({}) as its sender",
            local.id
        ));
    }
    if vote.committed != committed {
        return Err(if committed {
            format!("{what} must carry a leader's (committed) vote, not {vote}")
        } else {
            format!("{what} must carry a candidate's (uncommitted) vote, not {vote}")
        });
    }
    Ok(())
}

/// A log id at or below this node's committed index is at most its
/// committed log id.
fn check_settled(what: &str, id: &LogId, local: &Local) -> Result<(), Refused> {
    match &local.committed {
        Some(c) if id.index <= c.index && id > c => Err(format!(
            "{what} {id} contradicts this node's committed log id {c}"
        )),
        _ => Ok(()),
    }
}

/// A log id a leader with `vote` can send: within bounds, not beyond its
/// leadership, consistent with what this node committed.
fn check_sent_log_id(what: &str, id: &LogId, vote: &Vote, local: &Local) -> Result<(), Refused> {
    check_log_id(what, id)?;
    if id.leader_id > vote.leader_id {
        return Err(format!(
            "{what} {id} is beyond the sender's leadership {vote}"
        ));
    }
    check_settled(what, id, local)
}

fn check_membership(what: &str, m: &StoredMembership) -> Result<(), Refused> {
    if let Some(id) = m.log_id() {
        check_log_id(what, id)?;
    }
    let joint = m.get_joint_config();
    if joint.is_empty() || joint.iter().any(|c| c.is_empty()) {
        return Err(format!(
            "{what} has a configuration without voters: {joint:?}"
        ));
    }
    for voter in joint.iter().flatten() {
        if *voter == 0 {
            return Err(format!("{what} names node 0 as a voter"));
        }
        if m.get_node(voter).is_none() {
            return Err(format!("{what} has voter {voter} without an address"));
        }
    }
    Ok(())
}

/// A `Vote` request: a candidate's uncommitted vote and its last log id.
pub fn check_vote_request(req: &VoteRequest<TypeConfig>, local: &Local) -> Result<(), Refused> {
    check_vote("a vote request", &req.vote, false, local)?;
    if let Some(last) = &req.last_log_id {
        check_log_id("the candidate's last log id", last)?;
        // A candidate's log holds nothing of a later term than its own.
        if last.leader_id.term > req.vote.leader_id.term {
            return Err(format!(
                "the candidate's last log id {last} is of a later term than its vote {}",
                req.vote
            ));
        }
    }
    Ok(())
}

/// A `TransferLeader` request: a leader's committed vote, a node to hand
/// over to, and the leader's last log id.
pub fn check_transfer_leader(
    req: &TransferLeaderRequest<TypeConfig>,
    local: &Local,
) -> Result<(), Refused> {
    let vote = req.from_leader();
    check_vote("TransferLeader", vote, true, local)?;
    if *req.to_node_id() == 0 {
        return Err("TransferLeader names node 0 as the next leader".into());
    }
    if let Some(last) = req.last_log_id() {
        check_sent_log_id("the leader's last log id", last, vote, local)?;
    }
    Ok(())
}

/// An `AppendEntries` request (also each message of `StreamAppend`).
pub fn check_append(req: &AppendEntriesRequest<TypeConfig>, local: &Local) -> Result<(), Refused> {
    let vote = &req.vote;
    check_vote("AppendEntries", vote, true, local)?;
    if let Some(prev) = &req.prev_log_id {
        check_sent_log_id("the previous log id", prev, vote, local)?;
    }
    let mut last = req.prev_log_id;
    for entry in &req.entries {
        let id = &entry.log_id;
        let expected = last.map_or(0, |l| l.index + 1);
        if id.index != expected {
            return Err(format!(
                "entries must be consecutive: expected index {expected}, got {id}"
            ));
        }
        check_sent_log_id("entry", id, vote, local)?;
        if last.is_some_and(|l| l.leader_id > id.leader_id) {
            return Err(format!(
                "entry {id} is of an earlier leader than the one before it"
            ));
        }
        if let EntryPayload::Membership(m) = &entry.payload {
            check_membership(
                "a membership entry",
                &StoredMembership::new(Some(*id), m.clone()),
            )?;
        }
        last = Some(*id);
    }
    if let Some(commit) = &req.leader_commit {
        check_log_id("the leader's commit", commit)?;
        if commit.leader_id > vote.leader_id {
            return Err(format!(
                "the leader's commit {commit} is beyond its leadership {vote}"
            ));
        }
    }
    Ok(())
}

/// The head of an `InstallSnapshot` stream: the leader's vote and what the
/// snapshot covers. (The snapshot's bytes are checked separately, see
/// `apply::state_machine::check_snapshot`.)
pub fn check_snapshot(vote: &Vote, meta: &SnapshotMeta, local: &Local) -> Result<(), Refused> {
    check_vote("InstallSnapshot", vote, true, local)?;
    let Some(last) = &meta.last_log_id else {
        return Err("a snapshot must cover at least one entry".into());
    };
    check_log_id("the snapshot's last log id", last)?;
    if last.leader_id > vote.leader_id {
        return Err(format!(
            "the snapshot's last log id {last} is beyond the sender's leadership {vote}"
        ));
    }
    if let Some(c) = &local.committed {
        if last > c && last.index <= c.index {
            return Err(format!(
                "the snapshot's last log id {last} is newer than this node's committed {c} but \
                 not at a larger index"
            ));
        }
    }
    check_membership("the snapshot's membership", &meta.last_membership)?;
    if meta.last_membership.log_id().as_ref() > Some(last) {
        return Err(format!(
            "the snapshot's membership is of a later entry than the snapshot's last, {last}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
