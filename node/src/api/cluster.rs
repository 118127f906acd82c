//! The `Cluster` service: status and membership.

use std::collections::BTreeSet;

use raftlock_proto::v1 as pb;
use raftlock_proto::v1::cluster_server::Cluster;
use tonic::{Request, Response, Status};

use super::Api;
use crate::auth::Permission;
use crate::error::Error;
use crate::raft::WatchReceiver as _;
use crate::raft::{valid_addr, NodeAddrs, NodeId, StoredMembership};

fn members(m: &StoredMembership) -> Vec<pb::Member> {
    let voters: BTreeSet<NodeId> = m.membership().voter_ids().collect();
    m.membership()
        .nodes()
        .map(|(id, node)| pb::Member {
            id: *id,
            addr: node.addr.clone(),
            voter: voters.contains(id),
            peer_addr: node.peer_addr.clone(),
        })
        .collect()
}

/// How often a revoke whose write's outcome is unknown looks whether its
/// leader has its quorum back, to propose it again.
const REVOKE_RETRY: std::time::Duration = std::time::Duration::from_millis(50);

/// How long `AddNode` waits for a new node to catch up before giving up
/// (the node then stays a learner).
pub const ADD_NODE_CATCH_UP: std::time::Duration = std::time::Duration::from_secs(30);

impl Api {
    /// The membership as this node sees it, and the leader it knows
    /// (`Members`; also the Raft service's, for a node joining by itself).
    pub(crate) fn membership(&self) -> pb::MembersResponse {
        let m = self.0.raft.metrics().borrow_watched().clone();
        pb::MembersResponse {
            members: members(&m.membership_config),
            leader_id: self.0.leadership.view().leader.unwrap_or(0),
        }
    }

    /// Adds a node (`AddNode`, the caller's rights already checked; also
    /// the Raft service's, for a node joining by itself).
    pub(crate) async fn add(&self, r: pb::AddNodeRequest) -> Result<pb::AddNodeResponse, Status> {
        if r.id == 0 {
            return Err(Error::InvalidArgument("node id must be non-zero".into()).into());
        }
        if !valid_addr(&r.addr) {
            return Err(Error::InvalidArgument(format!(
                "node address must be host:port, got {:?}",
                r.addr
            ))
            .into());
        }
        if !r.peer_addr.is_empty() && !valid_addr(&r.peer_addr) {
            return Err(Error::InvalidArgument(format!(
                "node peer address must be host:port (or empty), got {:?}",
                r.peer_addr
            ))
            .into());
        }
        let node = match r.peer_addr.as_str() {
            "" => NodeAddrs::shared(r.addr.clone()),
            peer => NodeAddrs::new(r.addr.clone(), peer),
        };
        let current = self
            .0
            .raft
            .metrics()
            .borrow_watched()
            .membership_config
            .clone();
        let already = match current.membership().get_node(&r.id) {
            Some(existing) if *existing != node => {
                return Err(Error::FailedPrecondition(format!(
                    "node {} is already a member at {existing}",
                    r.id
                ))
                .into());
            }
            Some(_) => current.log_id().as_ref().map(|l| l.index),
            None => None,
        };
        // Learner first, blocking until it has caught up; then promote. A
        // node that is already a member (a join asked again, a promotion
        // cut short) is not added again: each addition is a log entry.
        let added_at = match already {
            Some(index) if current.membership().get_joint_config().len() == 1 => index,
            _ => {
                self.0
                    .raft
                    .add_learner(r.id, node, false)
                    .await
                    .map_err(Error::from)?
                    .log_id
                    .index
            }
        };
        // openraft's own "blocking" add only waits while the learner lags by
        // more than its replication threshold, which a node that cannot be
        // reached at all does not on a young log. Wait for the learner to
        // have really replicated the log up to its own addition instead.
        let timeout = match r.catch_up_timeout_ms {
            0 => ADD_NODE_CATCH_UP,
            ms => std::time::Duration::from_millis(ms),
        };
        self.wait_caught_up(r.id, &r.addr, added_at, timeout)
            .await?;
        let mut latest = self
            .0
            .raft
            .metrics()
            .borrow_watched()
            .membership_config
            .clone();
        if !r.learner_only {
            // Added to the voters the leader has when it makes the change,
            // not to those this node saw: two nodes added at once would
            // otherwise each replace the voters with a set lacking the
            // other.
            let add: BTreeSet<NodeId> = [r.id].into();
            let resp = self
                .0
                .raft
                .change_membership(openraft::ChangeMembers::AddVoterIds(add), false)
                .await
                .map_err(Error::from)?;
            if let Some(m) = resp.membership {
                latest = std::sync::Arc::new(StoredMembership::new(Some(resp.log_id), m));
            }
        }
        Ok(pb::AddNodeResponse {
            members: members(&latest),
        })
    }

    /// Waits until the leader has replicated up to `index` to node `id`.
    async fn wait_caught_up(
        &self,
        id: NodeId,
        addr: &str,
        index: u64,
        timeout: std::time::Duration,
    ) -> Result<(), Error> {
        // Progress from openraft's replication metrics; whether this node
        // still leads from the leadership owner.
        let mut metrics = self.0.raft.metrics();
        let leadership = &self.0.leadership;
        let leading = || leadership.view().role == crate::leader::Role::Leader;
        let caught_up = crate::raft::wait_metrics(&mut metrics, |m| {
            m.replication
                .as_ref()
                .and_then(|r| r.get(&id))
                .and_then(|matched| *matched)
                .is_some_and(|l| l.index >= index)
                || !leading()
        });
        let outcome = tokio::time::timeout(timeout, caught_up)
            .await
            .map(|r| r.is_some() && leading());
        match outcome {
            Ok(true) => Ok(()),
            Ok(false) => Err(self.not_leader()),
            Err(_) => {
                let matched = self
                    .0
                    .raft
                    .metrics()
                    .borrow_watched()
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(&id).copied().flatten())
                    .map(|l| l.index);
                Err(Error::FailedPrecondition(catch_up_refusal(
                    id, addr, timeout, matched, index,
                )))
            }
        }
    }
}

/// Why an added node was not promoted: it did not replicate the log up to
/// `index` (its own addition) within `timeout`. A node that replicated
/// nothing is likely down or unreachable; one that did is still catching
/// up and may only need longer.
fn catch_up_refusal(
    id: NodeId,
    addr: &str,
    timeout: std::time::Duration,
    matched: Option<u64>,
    index: u64,
) -> String {
    let waited = timeout.as_secs_f64();
    match matched {
        None | Some(0) => format!(
            "node {id} at {addr} did not catch up within {waited:.1} s and replicated nothing; \
             it stays a learner (not a voter): check that it runs and is reachable, then add it \
             again or remove it"
        ),
        Some(m) => format!(
            "node {id} at {addr} did not catch up within {waited:.1} s: it is still catching up \
             (it has the log up to index {m} of {index}); it stays a learner (not a voter) and \
             goes on catching up: add it again with a longer wait (`raftlock members add \
             --timeout SECS`) to promote it, or remove it"
        ),
    }
}

impl Api {
    /// Revokes `session` for `by` (an identity already checked for
    /// `admin`): the one implementation behind the RPC and the console.
    pub async fn revoke(&self, session: u64, by: String) -> Result<u32, Error> {
        use crate::leases::KeepAliveError;
        if session == 0 {
            return Err(Error::InvalidArgument(
                "session_id must be non-zero (session ids are log indexes)".into(),
            ));
        }
        let at_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let id = crate::state::SessionId(session);
        // The lease rule: the session's client may count its lease until
        // the deadline its last renewal earned. From now on nothing renews
        // it (its next keep-alive is answered `expired`), and it ends at
        // that deadline, not before.
        let leases = self.0.shared.leases.clone();
        let (deadline, term) = leases.begin_revoke(id).map_err(|e| match e {
            KeepAliveError::NotLeader => self.not_leader(),
            KeepAliveError::UnknownSession | KeepAliveError::Expiring => {
                Error::NotFound(format!("{id} is not open"))
            }
        })?;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        tracing::info!(session, by = %by, left_ms = left.as_millis() as u64, "revoke asked: no more renewals; it ends when its lease runs out");
        // In a task of its own, so that the revoke is carried out even if
        // its caller goes away meanwhile.
        let api = self.clone();
        let revoke = tokio::spawn(async move {
            struct Revoking(
                std::sync::Arc<crate::leases::Leases>,
                crate::state::SessionId,
            );
            impl Drop for Revoking {
                fn drop(&mut self) {
                    self.0.end_revoke(self.1);
                }
            }
            let _revoking = Revoking(leases.clone(), id);
            tokio::time::sleep_until(deadline).await;
            // The deadline was this term's: if the leadership left and came
            // back meanwhile, every lease restarted and may have been
            // renewed since.
            if !leases.still_revoking(id, term) {
                return Err(Error::Unavailable(format!(
                    "the leadership changed while the revoke of {id} waited for its lease; it \
                     was not applied: ask again"
                )));
            }
            // Renewals stay refused until the outcome is known: a write
            // whose outcome is unknown (the quorum went while it was
            // pending) may still commit, and a renewal acknowledged
            // meanwhile would let the client count a lease its session no
            // longer has (sim seed 705670). So it is proposed again once
            // the quorum is back, as long as this term lasts.
            let mut retry = false;
            loop {
                let written = api
                    .write(crate::state::cmd::RevokeSession {
                        session: id,
                        by: by.clone(),
                        at_unix_ms,
                    })
                    .await;
                match written {
                    Err(Error::Timeout(why)) => loop {
                        match leases.revoke_pending(id, term) {
                            None => return Err(Error::Timeout(why)),
                            Some(true) => tokio::time::sleep(REVOKE_RETRY).await,
                            Some(false) => break,
                        }
                    },
                    // An earlier attempt was applied after all.
                    Err(Error::NotFound(_)) if retry => return Ok(0),
                    other => return other,
                }
                retry = true;
            }
        });
        revoke
            .await
            .map_err(|e| Error::Internal(format!("the revoke stopped: {e}")))?
    }
}

#[tonic::async_trait]
impl Cluster for Api {
    async fn status(
        &self,
        req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let _timer = self.0.shared.metrics.timer(crate::metrics::Method::Status);
        self.caller(&req)?.require_any(Permission::Read)?;
        let m = self.0.raft.metrics().borrow_watched().clone();
        let view = self.0.leadership.view();
        let leader_addr = view
            .leader
            .and_then(|l| {
                m.membership_config
                    .membership()
                    .get_node(&l)
                    .map(|n| n.addr.clone())
            })
            .unwrap_or_default();
        // Counters and applied index from the same read of the table, so
        // they agree with each other.
        let (stats, applied_index) = self
            .0
            .shared
            .read(|applied| (applied.table.stats(), applied.index()));
        Ok(Response::new(pb::StatusResponse {
            id: self.0.id,
            addr: self.0.addr.clone(),
            role: view.status_role().to_string(),
            term: view.term,
            leader_id: view.leader.unwrap_or(0),
            leader_addr,
            commit_index: self
                .0
                .shared
                .committed
                .load(std::sync::atomic::Ordering::Relaxed),
            applied_index,
            last_log_index: m.last_log_index.unwrap_or(0),
            members: members(&m.membership_config),
            sessions: stats.sessions,
            grants: stats.grants,
            waiters: stats.waiters,
            last_fence: stats.last_fence,
        }))
    }

    async fn members(
        &self,
        req: Request<pb::MembersRequest>,
    ) -> Result<Response<pb::MembersResponse>, Status> {
        let _timer = self.0.shared.metrics.timer(crate::metrics::Method::Members);
        self.caller(&req)?.require_any(Permission::Read)?;
        Ok(Response::new(self.membership()))
    }

    #[tracing::instrument(skip_all, fields(node = req.get_ref().id, addr = %req.get_ref().addr))]
    async fn add_node(
        &self,
        req: Request<pb::AddNodeRequest>,
    ) -> Result<Response<pb::AddNodeResponse>, Status> {
        let _timer = self.0.shared.metrics.timer(crate::metrics::Method::AddNode);
        self.caller(&req)?.require_admin()?;
        Ok(Response::new(self.add(req.into_inner()).await?))
    }

    async fn backup(
        &self,
        req: Request<pb::BackupRequest>,
    ) -> Result<Response<pb::BackupResponse>, Status> {
        let _timer = self.0.shared.metrics.timer(crate::metrics::Method::Backup);
        self.caller(&req)?.require_admin()?;
        // Linearizable on the leader: the copy includes every write
        // acknowledged before the call.
        self.read_barrier(false).await?;
        // Encoding a large table takes a while (about half a second at 1M
        // held locks): on a blocking thread, behind the snapshot gate, so
        // applies wait as parked tasks instead of blocking runtime threads
        // (which would stall heartbeats and keep-alives).
        let gate = self.0.shared.snapshot_gate.clone().write_owned().await;
        let shared = self.0.shared.clone();
        let cluster_id = self.0.cluster.id();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let response = crate::blocking::spawn(move || {
            let _gate = gate;
            shared.read(|applied| pb::BackupResponse {
                snapshot: super::backup::write(&applied.table, applied.index(), cluster_id, now),
                index: applied.index(),
                last_fence: applied.table.last_fence().0,
            })
        })
        .await
        .map_err(|e| Error::Internal(format!("backup failed: {e}")))?;
        Ok(Response::new(response))
    }

    #[tracing::instrument(skip_all, fields(bytes = req.get_ref().snapshot.len()))]
    async fn restore(
        &self,
        req: Request<pb::RestoreRequest>,
    ) -> Result<Response<pb::RestoreResponse>, Status> {
        let _timer = self.0.shared.metrics.timer(crate::metrics::Method::Restore);
        self.caller(&req)?.require_admin()?;
        let r = req.into_inner();
        let (sessions, last_fence) = self
            .restore_backup(&r.snapshot, r.fence_bump, r.restore_id)
            .await?;
        Ok(Response::new(pb::RestoreResponse {
            sessions,
            last_fence,
        }))
    }

    #[tracing::instrument(skip_all, fields(session = req.get_ref().session_id))]
    async fn revoke_session(
        &self,
        req: Request<pb::RevokeSessionRequest>,
    ) -> Result<Response<pb::RevokeSessionResponse>, Status> {
        let _timer = self
            .0
            .shared
            .metrics
            .timer(crate::metrics::Method::RevokeSession);
        let caller = self.caller(&req)?;
        caller.require_admin()?;
        let session = req.into_inner().session_id;
        let released = self.revoke(session, caller.identity).await?;
        Ok(Response::new(pb::RevokeSessionResponse { released }))
    }

    #[tracing::instrument(skip_all, fields(to = req.get_ref().to))]
    async fn transfer_leader(
        &self,
        req: Request<pb::TransferLeaderRequest>,
    ) -> Result<Response<pb::TransferLeaderResponse>, Status> {
        let _timer = self
            .0
            .shared
            .metrics
            .timer(crate::metrics::Method::TransferLeader);
        self.caller(&req)?.require_admin()?;
        let to = match req.into_inner().to {
            0 => None,
            id => Some(id),
        };
        let leader = self.0.leadership.transfer(to).await?;
        let leader_addr = leader
            .and_then(|l| {
                self.0
                    .raft
                    .metrics()
                    .borrow_watched()
                    .membership_config
                    .membership()
                    .get_node(&l)
                    .map(|n| n.addr.clone())
            })
            .unwrap_or_default();
        Ok(Response::new(pb::TransferLeaderResponse {
            leader_id: leader.unwrap_or(0),
            leader_addr,
        }))
    }

    #[tracing::instrument(skip_all, fields(node = req.get_ref().id))]
    async fn remove_node(
        &self,
        req: Request<pb::RemoveNodeRequest>,
    ) -> Result<Response<pb::RemoveNodeResponse>, Status> {
        let _timer = self
            .0
            .shared
            .metrics
            .timer(crate::metrics::Method::RemoveNode);
        self.caller(&req)?.require_admin()?;
        let r = req.into_inner();
        let current = self
            .0
            .raft
            .metrics()
            .borrow_watched()
            .membership_config
            .clone();
        if current.membership().get_node(&r.id).is_none() {
            return Err(Error::NotFound(format!("node {} is not a member", r.id)).into());
        }
        let voters: BTreeSet<NodeId> = current
            .membership()
            .voter_ids()
            .filter(|v| *v != r.id)
            .collect();
        if voters.is_empty() {
            return Err(Error::FailedPrecondition("cannot remove the last voter".into()).into());
        }
        let is_voter = current.membership().voter_ids().any(|v| v == r.id);
        let changed = if is_voter {
            // Removed from the voters the leader has when it makes the
            // change (a node added meanwhile stays).
            let remove: BTreeSet<NodeId> = [r.id].into();
            self.0
                .raft
                .change_membership(openraft::ChangeMembers::RemoveVoters(remove), false)
                .await
        } else {
            let remove: BTreeSet<NodeId> = [r.id].into();
            self.0
                .raft
                .change_membership(openraft::ChangeMembers::RemoveNodes(remove), false)
                .await
        };
        let resp = match changed {
            Ok(resp) => resp,
            Err(openraft::error::RaftError::Fatal(f)) => {
                // Seen under load when a leader removes itself (about 1
                // run in 10 of node/tests/removed_node.rs): openraft
                // answers "stopped" when a change's responder goes away
                // without an answer, and a node that removed itself exits
                // once its removal has committed, which can stop its Raft
                // before the answer goes out. If the removal commits (or
                // has), it is done: say so.
                let mut metrics = self.0.raft.metrics();
                let committed = tokio::time::timeout(REMOVAL_SETTLES, async {
                    loop {
                        let m = metrics.borrow_watched().committed_membership_config.clone();
                        if removal_committed(&current, &m, r.id) {
                            return Some(m);
                        }
                        if metrics.changed().await.is_err() {
                            return None;
                        }
                    }
                })
                .await;
                return match committed {
                    Ok(Some(m)) => Ok(Response::new(pb::RemoveNodeResponse {
                        members: members(&m),
                    })),
                    _ => Err(Error::Unavailable(format!("raft stopped: {f}")).into()),
                };
            }
            Err(e) => return Err(Error::from(e).into()),
        };
        let latest = match resp.membership {
            Some(m) => StoredMembership::new(Some(resp.log_id), m),
            None => (*self.0.raft.metrics().borrow_watched().membership_config).clone(),
        };
        Ok(Response::new(pb::RemoveNodeResponse {
            members: members(&latest),
        }))
    }
}

/// How long a `RemoveNode` whose change openraft answered "stopped" waits
/// for the removal to show committed (see `remove_node`).
const REMOVAL_SETTLES: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether `committed` (a committed membership) shows node `id` removed
/// since `before` (the membership a removal started from, which had it):
/// it leaves the node out and is no older.
fn removal_committed(before: &StoredMembership, committed: &StoredMembership, id: NodeId) -> bool {
    committed.log_id() >= before.log_id() && committed.membership().get_node(&id).is_none()
}

#[cfg(test)]
mod tests {
    use super::{catch_up_refusal, removal_committed, valid_addr};
    use crate::raft::{log_id, NodeAddrs, StoredMembership};

    /// The refusal says whether the node replicated anything: nothing
    /// points at a dead or unreachable node, some at a slow catch-up that a
    /// longer wait (`members add --timeout`) would finish.
    #[test]
    fn a_catch_up_refusal_tells_a_silent_node_from_a_slow_one() {
        let wait = std::time::Duration::from_millis(2_500);
        for silent in [None, Some(0)] {
            let m = catch_up_refusal(4, "10.0.0.4:7101", wait, silent, 90);
            assert!(m.contains("within 2.5 s and replicated nothing"), "{m}");
            assert!(m.contains("check that it runs and is reachable"), "{m}");
        }
        let m = catch_up_refusal(4, "10.0.0.4:7101", wait, Some(40), 90);
        assert!(
            m.contains("still catching up (it has the log up to index 40 of 90)"),
            "{m}"
        );
        assert!(m.contains("--timeout"), "{m}");
        assert!(!m.contains("reachable"), "{m}");
    }

    fn membership(index: u64, voters: &[u64]) -> StoredMembership {
        let nodes = voters
            .iter()
            .map(|id| (*id, NodeAddrs::shared(format!("127.0.0.1:{}", 7100 + id))));
        let voters: std::collections::BTreeSet<u64> = voters.iter().copied().collect();
        let m = openraft::Membership::new(
            vec![voters],
            nodes.collect::<std::collections::BTreeMap<_, _>>(),
        )
        .expect("membership");
        StoredMembership::new(Some(log_id(2, 1, index)), m)
    }

    /// A leader that removed itself may be stopped before its answer: the
    /// removal is done if a committed membership no older than the one it
    /// started from leaves it out, and only then.
    #[test]
    fn a_removal_is_done_once_a_membership_without_the_node_committed() {
        let before = membership(10, &[1, 4]);
        assert!(removal_committed(&before, &membership(12, &[4]), 1));
        assert!(
            !removal_committed(&before, &membership(10, &[1, 4]), 1),
            "not yet"
        );
        assert!(
            !removal_committed(&before, &membership(12, &[1, 4]), 1),
            "still a member"
        );
        assert!(
            !removal_committed(&before, &membership(8, &[4]), 1),
            "an older one"
        );
    }

    #[test]
    fn addresses_need_a_host_and_a_port() {
        assert!(valid_addr("127.0.0.1:7101"));
        assert!(valid_addr("node-3.raftlock:7101"));
        assert!(!valid_addr("127.0.0.1"));
        assert!(!valid_addr(":7101"));
        assert!(!valid_addr("127.0.0.1:0"));
        assert!(!valid_addr("127.0.0.1:99999"));
        assert!(!valid_addr("a:1/b:2"));
        assert!(!valid_addr("a b:2"));
    }
}
