//! Moving the leadership: handing it to another voter, and campaigning for
//! it from a follower.

use openraft::ServerState;

use super::{Leadership, Role, TRANSFER_MAX_SILENCE, TRANSFER_WAIT};
use crate::error::Error;
use crate::raft::NodeId;
use crate::raft::WatchReceiver as _;

impl Leadership {
    /// Hands the leadership to voter `to` (`None`: the voter with the most
    /// log among those this leader heard from within
    /// [`TRANSFER_MAX_SILENCE`]) and waits (up to [`TRANSFER_WAIT`]) until
    /// this node has stepped down. Returns the new leader, if this node has
    /// learned it by then (`to` itself is this node: nothing to do).
    ///
    /// Refused unless this node leads (`NotLeader`); `to` must be a voter
    /// (`InvalidArgument`) that this leader hears from (`FailedPrecondition`).
    pub async fn transfer(&self, to: Option<NodeId>) -> Result<Option<NodeId>, Error> {
        self.check_running()?;
        let v = self.view();
        if v.role != Role::Leader {
            return Err(self.not_leader());
        }
        if to == Some(self.id) {
            return Ok(Some(self.id));
        }
        let m = self.raft.metrics().borrow_watched().clone();
        let voters: Vec<NodeId> = m.membership_config.membership().voter_ids().collect();
        let heard = |id: &NodeId| {
            m.heartbeat
                .as_ref()
                .and_then(|h| h.get(id).cloned().flatten())
                .is_some_and(|at| openraft::Instant::elapsed(&*at) <= TRANSFER_MAX_SILENCE)
        };
        let matched = |id: &NodeId| {
            m.replication
                .as_ref()
                .and_then(|r| r.get(id).cloned().flatten())
                .map(|l| l.index)
        };
        let target = match to {
            Some(id) if !voters.contains(&id) => {
                return Err(Error::InvalidArgument(format!(
                    "node {id} is not a voter of this cluster (voters: {voters:?})"
                )))
            }
            Some(id) if !heard(&id) => {
                return Err(Error::FailedPrecondition(format!(
                    "the leader has not heard from node {id} for over {TRANSFER_MAX_SILENCE:?}; \
                     it would not take over"
                )))
            }
            Some(id) => id,
            None => voters
                .iter()
                .copied()
                .filter(|id| *id != self.id && heard(id))
                .max_by_key(|id| (matched(id), std::cmp::Reverse(*id)))
                .ok_or_else(|| {
                    Error::FailedPrecondition(format!(
                        "no other voter has answered the leader within {TRANSFER_MAX_SILENCE:?} \
                         (voters: {voters:?})"
                    ))
                })?,
        };
        let mut rx = self.view.subscribe();
        tracing::info!(to = target, term = v.term, "handing the leadership over");
        self.raft
            .trigger()
            .transfer_leader(target)
            .await
            .map_err(|e| Error::Unavailable(format!("raft stopped: {e}")))?;
        let (me, term) = (self.id, v.term);
        let stepped_down = tokio::time::timeout(TRANSFER_WAIT, async {
            // Down, and (as far as it can learn in time) who leads now.
            let _ = rx
                .wait_for(|now| now.role != Role::Leader || now.term > term)
                .await;
            let learned = tokio::time::timeout(
                TRANSFER_WAIT / 3,
                rx.wait_for(|v| v.leader.is_some_and(|l| l != me)),
            )
            .await;
            match learned {
                Ok(Ok(v)) => v.leader,
                _ => None,
            }
        })
        .await;
        stepped_down.map_err(|_| {
            Error::Unavailable(format!(
                "node {target} did not take over within {TRANSFER_WAIT:?}; the cluster elects a \
                 leader after the election timeout"
            ))
        })
    }

    /// Campaigns for the leadership another node holds, the way a node the
    /// leader hands it to does (openraft's leadership-transfer election:
    /// voters grant the vote although the leader's lease runs, provided
    /// this node's log is as up to date as theirs). For work only this node
    /// can do, and only as leader: a backup `raftlockd restore` placed in
    /// its data directory, when the leadership went elsewhere before the
    /// backup was in.
    ///
    /// As safe as any election (Raft's vote rules decide it; reads confirm
    /// the leadership with a quorum round, never a lease; a new leader
    /// restarts every session's lease at full length); it interrupts a
    /// working leader once. Only while this node follows a leader of the
    /// current term and has applied an entry of that term, so its log has
    /// been reconciled with the leader's (a candidate with a log behind the
    /// voters' would only depose the leader, for nothing). Returns whether
    /// it campaigned.
    pub async fn campaign(&self) -> Result<bool, Error> {
        self.check_running()?;
        let m = self.raft.metrics().borrow_watched().clone();
        let follows = m.state == ServerState::Follower
            && m.vote.is_committed()
            && m.current_leader.is_some_and(|l| l != self.id)
            && m.last_applied
                .is_some_and(|l| l.committed_leader_id().term == m.current_term);
        if !follows {
            return Ok(false);
        }
        tracing::info!(
            leader = ?m.current_leader,
            term = m.current_term,
            "campaigning for the leadership"
        );
        let request = openraft::raft::TransferLeaderRequest::new(m.vote, self.id, None);
        self.raft
            .handle_transfer_leader(request)
            .await
            .map_err(|e| Error::Unavailable(format!("raft stopped: {e}")))?
            .map_err(|e| Error::Unavailable(format!("campaign refused: {e}")))?;
        Ok(true)
    }
}
