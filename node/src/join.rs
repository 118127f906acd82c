//! Joining a cluster by itself (`raftlockd run --join HOST:PORT,...`).
//!
//! A node started with `--join` asks the cluster's nodes, every
//! [`JOIN_RETRY`], until it is a voter in its own eyes, to add it (a
//! learner first, promoted once it has caught up). It asks on their peer
//! ports (the Raft service's `Members` and `AddNode`), as it talks to its
//! peers: with the ACL's peer_token, TLS as towards its peers. The peer
//! credentials are no client identity: the client port refuses them. It
//! asks only while it may join:
//!
//! - a node that started with an empty data directory is a new member;
//! - a node the cluster counts as a learner finishes a join that was cut
//!   short (the node or the leader restarted before the promotion);
//! - a node that kept its data but is no member was removed: it is not
//!   added again (the operator's removal stands; empty its data directory
//!   to join as a new member);
//! - a node the cluster counts as a voter is one, or is catching up to its
//!   promotion; an empty one that the cluster knows to have held data
//!   lost it, and its cluster identity refuses to take part (see
//!   [`VOTERS_WITH_DATA_KEY`](crate::raft::identity::VOTERS_WITH_DATA_KEY))
//!   until the operator removes its id, after which it is added again
//!   here.
//!
//! This is what lets every pod of a StatefulSet but the first start the
//! same way, whether the set is new or a pod lost its volume.

use std::sync::Arc;
use std::time::Duration;

use raftlock_proto::v1 as pb;
use raftlock_proto::v1::raft_client::RaftClient;
use tokio::sync::watch;

use crate::apply::Raft;
use crate::auth::Auth;
use crate::raft::network::Network;
use crate::raft::{NodeAddrs, NodeId, WatchReceiver as _};
use crate::throttle::Throttle;

/// How long a node that is not yet a voter waits between two rounds of
/// asking.
pub const JOIN_RETRY: Duration = Duration::from_secs(2);

/// How long one question (the membership) may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the same complaint is logged.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// What a node needs to join by itself.
pub struct Joiner {
    /// Its id.
    pub id: NodeId,
    /// Its addresses, as it asks to be added with.
    pub addrs: NodeAddrs,
    /// The peer addresses to ask (`--peer-advertise`, or the client
    /// address of a node without a separate peer listener).
    pub endpoints: Vec<String>,
    /// Whether its data directory was empty when it started.
    pub started_empty: bool,
    /// Its Raft (for its own view of the membership).
    pub raft: Raft,
    /// Dials the endpoints as it dials its peers.
    pub network: Network,
    /// The peer_token, if access control is on.
    pub auth: Arc<Auth>,
}

/// The cluster's membership as one of its nodes that knows a leader
/// sees it.
struct Seen {
    endpoint: String,
    members: Vec<pb::Member>,
    leader_id: NodeId,
}

impl Seen {
    /// Where to ask to be added: the leader's peer address, as the
    /// membership gives it; else the node that answered.
    fn leader_peer_addr(&self) -> &str {
        self.members
            .iter()
            .find(|m| m.id == self.leader_id)
            .map(|m| match m.peer_addr.as_str() {
                "" => m.addr.as_str(),
                peer => peer,
            })
            .unwrap_or(&self.endpoint)
    }
}

/// What a round does, from this node's own view and the cluster's.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// A voter in its own eyes: nothing more to do.
    Done,
    /// Ask to be added (or promoted).
    Add,
    /// Wait for the next round (a promotion on its way, or a voter that
    /// lost its data waiting for its removal).
    Wait,
    /// Removed while it kept its data: stop asking.
    Removed,
}

/// The step for a node whose own membership makes it a voter (`voter`),
/// which the cluster counts as `theirs` (`Some(true)` a voter,
/// `Some(false)` a learner, `None` no member).
fn step(voter: bool, theirs: Option<bool>, started_empty: bool) -> Step {
    match (voter, theirs) {
        (true, _) => Step::Done,
        (false, Some(true)) => Step::Wait,
        (false, Some(false)) => Step::Add,
        (false, None) if started_empty => Step::Add,
        (false, None) => Step::Removed,
    }
}

/// Whether `id` is a voter of `membership` and the membership is not a
/// joint one: a change cut short between its two steps (the leader lost)
/// leaves a joint config, which an AddNode for the same node finishes.
fn is_settled_voter(membership: &openraft::Membership<NodeId, NodeAddrs>, id: NodeId) -> bool {
    membership.get_joint_config().len() == 1 && membership.voter_ids().any(|v| v == id)
}

/// Whether `id` is a voter of the target config of a joint `membership`
/// (a change to make it a voter that was cut short).
fn is_unfinished_voter(membership: &openraft::Membership<NodeId, NodeAddrs>, id: NodeId) -> bool {
    let configs = membership.get_joint_config();
    configs.len() > 1 && configs.last().is_some_and(|c| c.contains(&id))
}

impl Joiner {
    /// Asks until this node is a voter, it was removed, or `stop` is set.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let complaints: Throttle<&'static str> = Throttle::new(LOG_EVERY);
        loop {
            let (voter, unfinished) = {
                let metrics = self.raft.metrics();
                let m = metrics.borrow_watched();
                let m = m.membership_config.membership();
                (
                    is_settled_voter(m, self.id),
                    is_unfinished_voter(m, self.id),
                )
            };
            let seen = if voter {
                Err(String::new())
            } else {
                self.ask().await
            };
            // A change that made it a voter but was cut short is finished
            // by asking again, as a learner's promotion is.
            let theirs = seen
                .as_ref()
                .ok()
                .and_then(|s| s.members.iter().find(|m| m.id == self.id).map(|m| m.voter))
                .map(|v| v && !unfinished);
            match (step(voter, theirs, self.started_empty), &seen) {
                (Step::Done, _) => {
                    tracing::info!(node = self.id, "a voter of the cluster; --join is done");
                    return;
                }
                (Step::Removed, Ok(seen)) => {
                    tracing::warn!(
                        node = self.id,
                        asked = %seen.endpoint,
                        "--join: this node is not a member of the cluster, and its data directory \
                         was not empty: it was removed, and is not added again. To join as a new \
                         member, empty its data directory"
                    );
                    return;
                }
                (_, Err(answers)) => {
                    if complaints.pass("nobody").is_some() {
                        tracing::warn!(
                            node = self.id,
                            "--join: no node answered with a cluster that has a leader ({answers}); \
                             asking again every {JOIN_RETRY:?}"
                        );
                    }
                }
                (Step::Add, Ok(seen)) => self.add(seen, &complaints).await,
                (_, Ok(_)) => {}
            }
            tokio::select! {
                _ = tokio::time::sleep(JOIN_RETRY) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// A client of the Raft service at peer address `endpoint`, dialled
    /// as this node dials its peers.
    fn client(&self, endpoint: &str) -> Option<RaftClient<tonic::transport::Channel>> {
        let channel = self
            .network
            .client_channel(0, &NodeAddrs::shared(endpoint))
            .ok()?;
        Some(RaftClient::new(channel))
    }

    /// `message` with the peer_token, if access control is on.
    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(acl) = self.auth.current() {
            if let Ok(value) = format!("Bearer {}", acl.peer_token()).parse() {
                request
                    .metadata_mut()
                    .insert(crate::auth::AUTHORIZATION, value);
            }
        }
        request
    }

    /// The membership as the first endpoint that knows a leader sees it;
    /// else what each endpoint answered.
    async fn ask(&self) -> Result<Seen, String> {
        let mut answers = Vec::new();
        for endpoint in &self.endpoints {
            let Some(mut client) = self.client(endpoint) else {
                answers.push(format!("{endpoint}: not an address"));
                continue;
            };
            let call = client.members(self.request(pb::MembersRequest {}));
            let answer = match tokio::time::timeout(ASK_TIMEOUT, call).await {
                Err(_) => {
                    answers.push(format!("{endpoint}: no answer in {ASK_TIMEOUT:?}"));
                    continue;
                }
                Ok(Err(e)) => {
                    answers.push(format!("{endpoint}: {:?} {}", e.code(), e.message()));
                    continue;
                }
                Ok(Ok(answer)) => answer.into_inner(),
            };
            if answer.leader_id != 0 && !answer.members.is_empty() {
                return Ok(Seen {
                    endpoint: endpoint.clone(),
                    members: answer.members,
                    leader_id: answer.leader_id,
                });
            }
            answers.push(format!("{endpoint}: no cluster with a leader yet"));
        }
        Err(answers.join("; "))
    }

    /// Asks the leader `seen` names to add this node.
    async fn add(&self, seen: &Seen, complaints: &Throttle<&'static str>) {
        let leader = seen.leader_peer_addr();
        let Some(mut client) = self.client(leader) else {
            return;
        };
        let peer_addr = if self.addrs.peer_addr == self.addrs.addr {
            String::new()
        } else {
            self.addrs.peer_addr.clone()
        };
        // Once a minute at INFO: a node catching up asks every round.
        if complaints.pass("asking").is_some() {
            tracing::info!(node = self.id, asked = %leader, "--join: asking to be added");
        } else {
            tracing::debug!(node = self.id, asked = %leader, "--join: asking to be added");
        }
        let request = self.request(pb::AddNodeRequest {
            id: self.id,
            addr: self.addrs.addr.clone(),
            peer_addr,
            ..Default::default()
        });
        match client.add_node(request).await {
            Ok(_) => tracing::info!(node = self.id, "--join: added to the cluster"),
            Err(e) => {
                if complaints.pass("add").is_some() {
                    tracing::warn!(
                        node = self.id,
                        asked = %leader,
                        code = ?e.code(),
                        "--join: could not be added yet ({}); asking again every {JOIN_RETRY:?}",
                        e.message()
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn a_node_asks_to_be_added_only_while_it_may_join() {
        // A voter in its own eyes is done, whatever it was asked.
        for theirs in [None, Some(false), Some(true)] {
            for empty in [false, true] {
                assert_eq!(step(true, theirs, empty), Step::Done);
            }
        }
        // A new node, and a learner whose join was cut short.
        assert_eq!(step(false, None, true), Step::Add);
        assert_eq!(step(false, Some(false), false), Step::Add);
        assert_eq!(step(false, Some(false), true), Step::Add);
        // Counted a voter: a promotion on its way, or a voter that lost its
        // data and waits for its removal.
        assert_eq!(step(false, Some(true), false), Step::Wait);
        assert_eq!(step(false, Some(true), true), Step::Wait);
        // Removed while it kept its data: not added again.
        assert_eq!(step(false, None, false), Step::Removed);
    }

    #[test]
    fn a_joint_config_is_not_yet_a_settled_voter() {
        let node = |i: u64| NodeAddrs::shared(format!("127.0.0.1:{}", 7100 + i));
        let nodes = |ids: &[u64]| -> BTreeMap<NodeId, NodeAddrs> {
            ids.iter().map(|&i| (i, node(i))).collect()
        };
        let m = openraft::Membership::new(vec![[1, 2].into(), [1, 2, 4].into()], nodes(&[1, 2, 4]))
            .expect("a joint membership");
        assert!(!is_settled_voter(&m, 4), "joint: the change is unfinished");
        assert!(is_unfinished_voter(&m, 4));
        assert!(!is_unfinished_voter(&m, 3));
        let m = openraft::Membership::new(vec![[1, 2, 4].into()], nodes(&[1, 2, 4]))
            .expect("a uniform membership");
        assert!(is_settled_voter(&m, 4));
        assert!(!is_settled_voter(&m, 3));
        assert!(!is_unfinished_voter(&m, 4));
    }
}
