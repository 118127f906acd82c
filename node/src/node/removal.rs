//! How a node learns that it was removed from the cluster: told by a peer,
//! by asking its peers, or by removing itself as leader.

use super::*;

/// A node that holds a membership without itself asks its peers whether it
/// was removed after hearing from no leader for this many of its longest
/// election timeouts, and again as often while that lasts (see
/// `Node::ask_if_removed`).
pub const ASK_AFTER_ELECTION_TIMEOUTS: u32 = 4;

impl Node {
    /// Resolves once a peer has said that this node was removed from the
    /// cluster (it refused this node's vote: its committed membership does
    /// not have this node, and this node's log ends before that
    /// membership), with a line saying so. The process should exit with
    /// status 0 (see `raftlockd run`), so that its supervisor does not
    /// start it again into a cluster that removed it.
    ///
    /// A leader that removes itself knows by itself (it applies the
    /// membership it proposed without itself): it steps down and no longer
    /// campaigns, so no peer would ever refuse it a vote.
    pub async fn removed(&self) -> String {
        tokio::select! {
            (by, at) = self.links.removed() => format!(
                "node {} was removed from the cluster (node {by}'s membership at log index {at} \
                 does not have it)",
                self.id
            ),
            at = self.left_in_own_log() => format!(
                "node {} was removed from the cluster (the membership it applied at log index \
                 {at} does not have it)",
                self.id
            ),
            never = self.ask_if_removed() => match never {},
        }
    }

    /// Asks the peers, every [`ASK_AFTER_ELECTION_TIMEOUTS`] election
    /// timeouts, whether this node was removed, while it may have been
    /// removed without a peer ever telling it so:
    ///
    /// - it holds a membership without itself (after one with itself as a
    ///   voter) and hears from no leader. Such a node received the entry
    ///   that removed it but not the word that it committed (the leader
    ///   stops replicating to it): openraft makes it a learner, which never
    ///   campaigns, so no peer would refuse it a vote (seed 404727 of the
    ///   simulator). A node that still hears from a leader (one catching up
    ///   through an old removal after it was added back, say) does not ask.
    /// - it leads in openraft's eyes but no quorum has acknowledged it. A
    ///   leader handing over its leadership sends nothing (openraft stops
    ///   its heartbeats and refuses writes until a higher term reaches it);
    ///   if the leader elected next removes it before any message of the
    ///   new term reached it, none ever will, and it would neither
    ///   campaign nor step down (seed 703904).
    ///
    /// A peer whose committed membership leaves it out and is no older
    /// than this node's latest membership answers with the removal marker
    /// (see `removed_at` in the `Raft` service), which
    /// [`Links`](crate::raft::links::Links) passes on to
    /// [`removed`](Self::removed). Never resolves.
    async fn ask_if_removed(&self) -> std::convert::Infallible {
        use openraft::network::RaftNetworkFactory as _;
        let id = self.id;
        let quiet = self.election_timeout * ASK_AFTER_ELECTION_TIMEOUTS;
        // openraft's server metrics change with the vote, the role and the
        // membership only, not at every append, commit and apply.
        let mut metrics = self.raft.server_metrics();
        let mut was_voter = false;
        loop {
            loop {
                {
                    let m = metrics.borrow_and_update();
                    let members = m.membership_config.membership();
                    was_voter |= members.voter_ids().any(|v| v == id);
                    if (was_voter && members.get_node(&id).is_none())
                        || m.state == openraft::ServerState::Leader
                    {
                        break;
                    }
                }
                if metrics.changed().await.is_err() {
                    // Raft stopped: nothing to ask any more.
                    return std::future::pending().await;
                }
            }
            tokio::time::sleep(quiet).await;
            let m = metrics.borrow_watched().clone();
            let members = m.membership_config.membership();
            let Some(left) = *m.membership_config.log_id() else {
                continue;
            };
            let unheard = if members.get_node(&id).is_none() {
                self.leadership.no_leader_contact_for(quiet)
            } else if m.state == openraft::ServerState::Leader {
                let acked = self.raft.metrics().borrow_watched().last_quorum_acked;
                acked.is_none_or(|at| openraft::Instant::elapsed(&*at) >= quiet)
            } else {
                false
            };
            if !unheard {
                continue;
            }
            // Its last log id as far as it matters here: the membership's
            // (the metrics give only the last index).
            let rpc =
                openraft::raft::VoteRequest::new(Vote::new(m.vote.leader_id.term, id), Some(left));
            let asks = members
                .nodes()
                .filter(|(n, _)| **n != id)
                .map(|(n, addrs)| {
                    let mut network = self.network.clone();
                    let rpc = &rpc;
                    async move {
                        let peer = network.new_client(*n, addrs).await;
                        peer.ask_if_removed(rpc, left.index, quiet).await;
                    }
                });
            futures::future::join_all(asks).await;
        }
    }

    /// Resolves with the log index of the membership by which this node,
    /// as leader, removed itself: it has applied, after one with itself, a
    /// membership without itself while it leads the current term (see
    /// [`removed_itself`]). Only that case: a node added back under its id
    /// (after its data was emptied) replays its old removal as it catches
    /// up and must not take it for a new one; a follower learns of its
    /// removal from the vote its peers refuse. Never, if Raft stops first.
    ///
    /// It looks again only when what it looks at changes: the applied
    /// membership, or openraft's server metrics (vote, role, effective
    /// membership), not at every append, commit and apply (this future is
    /// polled by `raftlockd`'s main thread, which each look would wake).
    async fn left_in_own_log(&self) -> u64 {
        let id = self.id;
        let mut was_member = false;
        let mut server = self.raft.server_metrics();
        let mut applied = self.shared.membership_changes();
        loop {
            applied.borrow_and_update();
            let (member, at) = self.shared.read(|a| {
                (
                    a.membership.membership().get_node(&id).is_some(),
                    *a.membership.log_id(),
                )
            });
            if member {
                was_member = true;
            } else if was_member {
                let m = server.borrow_and_update();
                let effective = m.membership_config.membership().get_node(&id).is_some();
                if let Some(at) = removed_itself(id, at, effective, &m.vote) {
                    return at;
                }
            }
            tokio::select! {
                changed = server.changed() => if changed.is_err() {
                    // Raft stopped.
                    return std::future::pending().await;
                },
                changed = applied.changed() => if changed.is_err() {
                    return std::future::pending().await;
                },
            }
        }
    }
}

/// Whether node `id`, which was a member and has applied a membership
/// without itself (logged at `applied_at`), removed itself as leader; if
/// so, that membership's log index. `effective`: whether the membership it
/// uses (the latest in its log) has it; `vote`: its vote.
///
/// It did if it leads the current term (its own vote, granted by a
/// quorum) and the latest membership in its log leaves it out too: it
/// committed that membership, whichever of its terms proposed it (one it
/// proposed, lost the leadership before it committed, and committed once
/// elected again counts as well). Not a node added back under its id that
/// replays its old removal: it follows another leader while it catches
/// up, and if it leads before it has applied that far, its log already
/// has the membership that added it back.
fn removed_itself(
    id: NodeId,
    applied_at: Option<LogId>,
    effective: bool,
    vote: &Vote,
) -> Option<u64> {
    (crate::leader::leads_term(id, vote) && !effective).then_some(applied_at?.index)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Node 1 removing itself as leader; the membership without it at
    /// index 40, logged in term `proposed` by node 1.
    fn removal(proposed: u64) -> Option<LogId> {
        Some(crate::raft::log_id(proposed, 1, 40))
    }

    #[test]
    fn a_leader_that_removed_itself_in_its_term_has_left() {
        let vote = Vote::new_committed(3, 1);
        assert_eq!(removed_itself(1, removal(3), false, &vote), Some(40));
    }

    /// Simulator seed 300213: node 1 proposed its removal in one term, lost
    /// the leadership (a far-future vote) before it committed, was elected
    /// again and committed it in the next term, with the blank entry of
    /// that term. It had removed itself all the same.
    #[test]
    fn a_leader_that_committed_its_removal_of_an_earlier_term_has_left() {
        let vote = Vote::new_committed(4, 1);
        assert_eq!(removed_itself(1, removal(3), false, &vote), Some(40));
    }

    /// A node added back under its id (data emptied) replays its old
    /// removal while it follows another leader: not a new removal.
    #[test]
    fn a_follower_replaying_its_old_removal_has_not_left() {
        let vote = Vote::new_committed(7, 2);
        assert_eq!(removed_itself(1, removal(3), false, &vote), None);
        // Nor while it campaigns (a vote for itself not granted yet).
        assert_eq!(removed_itself(1, removal(3), false, &Vote::new(8, 1)), None);
    }

    /// Added back, then elected while its state machine still applies the
    /// old removal: its log has the membership that added it back.
    #[test]
    fn a_leader_still_applying_its_old_removal_has_not_left() {
        let vote = Vote::new_committed(9, 1);
        assert_eq!(removed_itself(1, removal(3), true, &vote), None);
    }
}
