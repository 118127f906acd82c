//! The internal `Raft` service: openraft's RPCs as bincode payloads.

use raftlock_proto::v1 as pb;
use raftlock_proto::v1::raft_server::Raft as RaftRpc;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Request, Response, Status, Streaming};

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use tokio::time::Instant;

use futures::{Stream, StreamExt};

use crate::apply::Raft;
use crate::auth::Auth;
use crate::leader::Leadership;
use crate::metrics::stages::{between, Stage};
use crate::metrics::Metrics;
use crate::raft::identity::ClusterIdentity;
use crate::raft::links::{LEFT_KEY, REMOVED_KEY};
use crate::raft::peer_input::{self, Local};
use crate::raft::WatchReceiver as _;
use crate::raft::{
    LogId, NodeId, Snapshot, SnapshotMeta, StoredMembership, TypeConfig, Vote, MAX_SNAPSHOT_BYTES,
};
use openraft::raft::{AppendEntriesResponse, StreamAppendError, VoteRequest};

/// Serves the node-to-node RPCs of one node.
#[derive(Clone)]
pub struct RaftService {
    raft: Raft,
    auth: Arc<Auth>,
    cluster: Arc<ClusterIdentity>,
    /// Told when a message of the leader is taken (for readiness).
    leadership: Arc<Leadership>,
    /// Where a follower's share of a write is timed.
    metrics: Arc<Metrics>,
    /// Set when the node stops: open replication streams end then.
    stopping: tokio::sync::watch::Receiver<bool>,
    /// The client API, whose Members and AddNode a node joining by
    /// itself calls here.
    api: crate::api::Api,
}

impl RaftService {
    /// The service over `raft`; with access control on, only peers (see
    /// [`Auth::check_peer`]) may call it, and only from this node's cluster
    /// (see [`ClusterIdentity`]).
    pub fn new(
        raft: Raft,
        auth: Arc<Auth>,
        cluster: Arc<ClusterIdentity>,
        leadership: Arc<Leadership>,
        metrics: Arc<Metrics>,
        stopping: tokio::sync::watch::Receiver<bool>,
        api: crate::api::Api,
    ) -> Self {
        RaftService {
            raft,
            auth,
            cluster,
            leadership,
            metrics,
            stopping,
            api,
        }
    }

    /// Records this follower's share of entries `first..=last`, received
    /// at `received` (see `metrics::stages`).
    fn time_follower_append(&self, received: Instant, first: u64, last: u64) {
        let answered = Instant::now();
        let stages = &self.metrics.stages;
        let mut appended = None;
        for index in first..=last {
            if let Some(e) = stages.take(index) {
                appended = appended.or(e.append_start.zip(e.append_done));
            }
        }
        if let Some((start, done)) = appended {
            stages.record(Stage::FollowerQueue, between(received, start), 1);
            stages.record(Stage::FollowerAppend, between(start, done), 1);
            stages.record(Stage::FollowerReply, between(done, answered), 1);
        }
    }

    async fn admit<T>(&self, req: &Request<T>) -> Result<(), Status> {
        self.auth.check_peer(req)?;
        self.cluster.check(req.metadata()).await
    }

    /// Refuses a (pre-)vote from a node that this node's committed
    /// membership shows removed (see [`removed_at`]); the refusal says so
    /// in [`REMOVED_KEY`], and the candidate exits. `left_at`: the
    /// [`LEFT_KEY`] a pre-vote was marked with.
    fn refuse_removed(
        &self,
        rpc: &VoteRequest<TypeConfig>,
        left_at: Option<u64>,
    ) -> Result<(), Status> {
        let metrics = self.raft.metrics();
        let committed = metrics.borrow_watched().committed_membership_config.clone();
        let candidate = rpc.vote.leader_id.node_id;
        let Some(at) = removed_at(&committed, candidate, rpc.last_log_id, left_at) else {
            return Ok(());
        };
        let mut status = Status::failed_precondition(format!(
            "node {candidate} is not a member of this cluster: it was removed (membership at log \
             index {at})"
        ));
        if let Ok(value) = at.to_string().parse() {
            status.metadata_mut().insert(REMOVED_KEY, value);
        }
        Err(status)
    }

    /// What the peer-input checks need of this node, as of now.
    fn local(&self) -> Local {
        local_of(&self.raft)
    }
}

fn local_of(raft: &Raft) -> Local {
    let m = raft.metrics();
    let m = m.borrow_watched();
    Local {
        id: m.id,
        committed: m.local_committed,
    }
}

/// The log index of `committed` (this node's committed membership) if it
/// shows that `candidate` has been removed: it leaves the candidate out,
/// and either
///
/// - the candidate's log cannot hold the entry that removed it (`last`:
///   the id of its last entry): it ends before that index, or its last
///   entry's term is older than that entry's (a leader without a quorum
///   may have appended past the index, in an older term: seed 3802546 of
///   the simulator). The leader stops replicating to a node once it
///   removes it, so such a candidate would never see it; or
/// - the candidate asks (a pre-vote marked [`LEFT_KEY`]), its own latest
///   membership (at log index `left_at`) no newer than `committed`: the
///   candidate holds its removal but not the word that it committed, and
///   so (a learner in its own eyes) never campaigns; or it still leads in
///   its own eyes, a leader that handed its leadership over and was
///   removed by the next before hearing from it.
///
/// Else `None`: a candidate whose log may hold the membership is left to
/// openraft (it knows the membership; a newer one may have added it back),
/// and one whose own latest membership is newer than this node's committed
/// one is not shown removed here.
fn removed_at(
    committed: &StoredMembership,
    candidate: NodeId,
    last: Option<LogId>,
    left_at: Option<u64>,
) -> Option<u64> {
    let removal = (*committed.log_id())?;
    if committed.membership().get_node(&candidate).is_some() {
        return None;
    }
    let shown = match left_at {
        Some(left_at) => left_at <= removal.index,
        // A log holding the entry at `removal` ends at or after it, in
        // its term or a later one: log ids grow along a log.
        None => last.is_none_or(|last| last.index < removal.index || last < removal),
    };
    shown.then_some(removal.index)
}

/// A message refused by the peer-input checks (see [`peer_input`]).
fn refuse(why: String) -> Status {
    Status::invalid_argument(format!("refused raft message: {why}"))
}

/// Whether `more` bytes of snapshot still fit after `have`.
fn snapshot_fits(have: usize, more: usize) -> bool {
    have.checked_add(more)
        .is_some_and(|total| total <= MAX_SNAPSHOT_BYTES)
}

fn decode<T: DeserializeOwned>(msg: &pb::RaftMessage) -> Result<T, Status> {
    crate::codec::decode(&msg.data)
        .map_err(|e| Status::invalid_argument(format!("malformed raft message: {e}")))
}

/// Packs openraft's answer: the value in `data`, or its error in `error`.
fn reply<T: Serialize, E: Serialize>(
    result: Result<T, E>,
) -> Result<Response<pb::RaftMessage>, Status> {
    let msg = match result {
        Ok(v) => pb::RaftMessage {
            data: crate::codec::encode(&v).map_err(internal)?,
            error: Vec::new(),
            ..Default::default()
        },
        Err(e) => pb::RaftMessage {
            data: Vec::new(),
            error: crate::codec::encode(&e).map_err(internal)?,
            ..Default::default()
        },
    };
    Ok(Response::new(msg))
}

fn internal(e: crate::codec::Error) -> Status {
    Status::internal(format!("cannot encode raft reply: {e}"))
}

/// The answers of a replication stream.
type Answers = Pin<Box<dyn Stream<Item = Result<pb::RaftMessage, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl RaftRpc for RaftService {
    type StreamAppendStream = Answers;

    /// Pipelined replication: every request is handed to openraft as it
    /// arrives, and its answer (in order) goes back as soon as openraft
    /// has it, without waiting for later requests. A malformed request ends
    /// the stream with `INVALID_ARGUMENT` after the answers before it; the
    /// stream also ends when this node stops.
    async fn stream_append(
        &self,
        req: Request<Streaming<pb::RaftMessage>>,
    ) -> Result<Response<Answers>, Status> {
        let acl_changes = self.auth.changes();
        self.admit(&req).await?;
        // A reload that stops accepting what this stream authenticated
        // with ends it at once, like a new stream would be refused.
        let credential = self.auth.peer_credential(&req);
        let inbound = req.into_inner();
        // Which entries each request carried and when it arrived, oldest
        // first, to time this follower's share of them.
        let received: Arc<Mutex<VecDeque<(Instant, Option<(u64, u64)>, bool)>>> = Arc::default();
        let refused: Arc<Mutex<Option<Status>>> = Arc::default();
        let requests = {
            let (received, refused) = (received.clone(), refused.clone());
            let stopping = self.stopping.clone();
            let raft = self.raft.clone();
            let auth = self.auth.clone();
            let cluster = self.cluster.clone();
            let credential = Arc::new(credential);
            futures::stream::unfold(
                (Some(inbound), acl_changes),
                move |(inbound, mut changes)| {
                    let (received, refused) = (received.clone(), refused.clone());
                    let mut stopping = stopping.clone();
                    let raft = raft.clone();
                    let (auth, credential) = (auth.clone(), credential.clone());
                    let cluster = cluster.clone();
                    async move {
                        let mut inbound = inbound?;
                        let next = loop {
                            tokio::select! {
                                next = inbound.message() => break next,
                                _ = stopping.wait_for(|s| *s) => return None,
                                Ok(()) = changes.changed() => {
                                    if !auth.still_peer(credential.as_ref().as_ref()) {
                                        tracing::info!(
                                            "ended a replication stream: the ACL was reloaded and no \
                                             longer accepts the peer credentials it was opened with"
                                        );
                                        *refused.lock().expect("refused lock poisoned") =
                                            Some(Status::unauthenticated(
                                                "the peer credentials of this stream are no longer \
                                                 accepted (ACL reloaded)",
                                            ));
                                        return None;
                                    }
                                }
                            }
                        };
                        let msg = match next {
                            Ok(Some(msg)) => msg,
                            Ok(None) => return None,
                            Err(status) => {
                                *refused.lock().expect("refused lock poisoned") = Some(status);
                                return None;
                            }
                        };
                        let at = Instant::now();
                        if let Err(status) = cluster.check_named(&msg.voters_with_data).await {
                            *refused.lock().expect("refused lock poisoned") = Some(status);
                            return None;
                        }
                        let checked = decode::<
                            openraft::raft::AppendEntriesRequest<crate::raft::TypeConfig>,
                        >(&msg)
                        .and_then(|rpc| {
                            peer_input::check_append(&rpc, &local_of(&raft))
                                .map(|()| rpc)
                                .map_err(refuse)
                        });
                        match checked {
                            Ok(rpc) => {
                                let carried = match (rpc.entries.first(), rpc.entries.last()) {
                                    (Some(f), Some(l)) => Some((f.log_id.index, l.log_id.index)),
                                    _ => None,
                                };
                                received.lock().expect("received lock poisoned").push_back((
                                    at,
                                    carried,
                                    msg.leader_quorum_lost,
                                ));
                                Some((rpc, (Some(inbound), changes)))
                            }
                            Err(status) => {
                                *refused.lock().expect("refused lock poisoned") = Some(status);
                                None
                            }
                        }
                    }
                },
            )
        };
        let this = self.clone();
        let answers = self
            .raft
            .stream_append(Box::pin(requests))
            .map(move |result| {
                let arrived = received.lock().expect("received lock poisoned").pop_front();
                if let (Ok(Ok(_)), Some((at, Some((first, last)), _))) = (&result, arrived) {
                    this.time_follower_append(at, first, last);
                }
                if matches!(result, Ok(Ok(_) | Err(StreamAppendError::Conflict(_)))) {
                    let quorum_lost = arrived.is_some_and(|(_, _, lost)| lost);
                    this.leadership.heard_from_leader(quorum_lost);
                }
                let msg = match result {
                    Ok(answer) => crate::codec::encode(&answer).map(|data| pb::RaftMessage {
                        data,
                        error: Vec::new(),
                        ..Default::default()
                    }),
                    Err(fatal) => crate::codec::encode(&openraft::error::RaftError::<
                        crate::raft::TypeConfig,
                    >::Fatal(fatal))
                    .map(|error| pb::RaftMessage {
                        data: Vec::new(),
                        error,
                        ..Default::default()
                    }),
                };
                msg.map_err(internal)
            });
        let refusal =
            futures::stream::once(
                async move { refused.lock().expect("refused lock poisoned").take() },
            )
            .filter_map(|r| async move { r.map(Err) });
        Ok(Response::new(Box::pin(answers.chain(refusal))))
    }

    async fn append_entries(
        &self,
        req: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let received = Instant::now();
        self.admit(&req).await?;
        let quorum_lost = req.get_ref().leader_quorum_lost;
        let rpc: openraft::raft::AppendEntriesRequest<crate::raft::TypeConfig> =
            decode(req.get_ref())?;
        peer_input::check_append(&rpc, &self.local()).map_err(refuse)?;
        let carried = match (rpc.entries.first(), rpc.entries.last()) {
            (Some(first), Some(last)) => Some((first.log_id.index, last.log_id.index)),
            _ => None,
        };
        let result = self.raft.append_entries(rpc).await;
        if let Some((first, last)) = carried {
            self.time_follower_append(received, first, last);
        }
        if matches!(&result, Ok(r) if !matches!(r, AppendEntriesResponse::HigherVote(_))) {
            self.leadership.heard_from_leader(quorum_lost);
        }
        reply(result)
    }

    async fn vote(
        &self,
        req: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        self.admit(&req).await?;
        let rpc = decode(req.get_ref())?;
        peer_input::check_vote_request(&rpc, &self.local()).map_err(refuse)?;
        self.refuse_removed(&rpc, None)?;
        reply(self.raft.vote(rpc).await)
    }

    async fn pre_vote(
        &self,
        req: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        self.admit(&req).await?;
        let rpc = decode(req.get_ref())?;
        peer_input::check_vote_request(&rpc, &self.local()).map_err(refuse)?;
        // A node asking whether it was removed gets its answer here and
        // nothing reaches openraft: it is no candidate.
        let left_at = req
            .metadata()
            .get(LEFT_KEY)
            .map(|v| v.to_str().ok().and_then(|v| v.parse().ok()))
            .map(|v| v.ok_or_else(|| refuse(format!("{LEFT_KEY} is not a log index"))))
            .transpose()?;
        self.refuse_removed(&rpc, left_at)?;
        if left_at.is_some() {
            return Err(Status::failed_precondition(format!(
                "node {} is not shown removed by this node's committed membership",
                rpc.vote.leader_id.node_id
            )));
        }
        reply(self.raft.pre_vote(rpc).await)
    }

    async fn members(
        &self,
        req: Request<pb::MembersRequest>,
    ) -> Result<Response<pb::MembersResponse>, Status> {
        self.admit(&req).await?;
        Ok(Response::new(self.api.membership()))
    }

    #[tracing::instrument(skip_all, fields(node = req.get_ref().id, addr = %req.get_ref().addr))]
    async fn add_node(
        &self,
        req: Request<pb::AddNodeRequest>,
    ) -> Result<Response<pb::AddNodeResponse>, Status> {
        self.admit(&req).await?;
        Ok(Response::new(self.api.add(req.into_inner()).await?))
    }

    async fn transfer_leader(
        &self,
        req: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        self.admit(&req).await?;
        let rpc = decode(req.get_ref())?;
        peer_input::check_transfer_leader(&rpc, &self.local()).map_err(refuse)?;
        let result = self.raft.handle_transfer_leader(rpc).await;
        reply(result.map_err(openraft::error::RaftError::<TypeConfig>::Fatal))
    }

    async fn install_snapshot(
        &self,
        req: Request<Streaming<pb::RaftMessage>>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        self.admit(&req).await?;
        let mut stream = req.into_inner();
        let head = stream
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("an empty snapshot stream"))?;
        let (vote, meta): (Vote, SnapshotMeta) = decode(&head)?;
        // The head is checked before any data is taken.
        peer_input::check_snapshot(&vote, &meta, &self.local()).map_err(refuse)?;
        let mut data = Vec::new();
        while let Some(chunk) = stream.message().await? {
            if !snapshot_fits(data.len(), chunk.data.len()) {
                return Err(Status::out_of_range(format!(
                    "a snapshot may be at most {MAX_SNAPSHOT_BYTES} bytes"
                )));
            }
            data.extend_from_slice(&chunk.data);
        }
        let (meta, data) = crate::blocking::spawn(move || {
            crate::apply::state_machine::check_snapshot(&meta, &data).map(|()| (meta, data))
        })
        .await
        .map_err(|e| Status::internal(format!("snapshot check failed: {e}")))?
        .map_err(refuse)?;
        let snapshot = Snapshot {
            meta,
            snapshot: data,
        };
        let result = self.raft.install_full_snapshot(vote, snapshot).await;
        if result.is_ok() {
            // A snapshot says nothing of the leader's quorum; the next
            // append does.
            self.leadership.heard_from_leader(false);
        }
        reply(result.map_err(openraft::error::RaftError::<crate::raft::TypeConfig>::Fatal))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed membership at log index 40 (term 3): voters 1, 3
    /// and 4, node 2 removed.
    fn without_two() -> StoredMembership {
        let voters: std::collections::BTreeSet<NodeId> = [1, 3, 4].into();
        let nodes = voters
            .iter()
            .map(|&n| {
                (
                    n,
                    crate::raft::NodeAddrs::shared(format!("127.0.0.1:{}", 7100 + n)),
                )
            })
            .collect::<std::collections::BTreeMap<_, _>>();
        let m = openraft::Membership::new(vec![voters], nodes).expect("membership");
        StoredMembership::new(Some(crate::raft::log_id(3, 1, 40)), m)
    }

    /// A candidate whose log ends before the membership that left it out
    /// was removed; one whose log reaches it is left to openraft (a newer
    /// membership may have added it back), and a member never is.
    #[test]
    fn a_candidate_short_of_its_removal_is_refused() {
        let c = without_two();
        let at = |term, index| Some(crate::raft::log_id(term, 1, index));
        assert_eq!(removed_at(&c, 2, at(3, 39), None), Some(40));
        assert_eq!(removed_at(&c, 2, None, None), Some(40));
        assert_eq!(removed_at(&c, 2, at(3, 40), None), None);
        assert_eq!(removed_at(&c, 2, at(3, 41), None), None);
        assert_eq!(removed_at(&c, 2, at(4, 41), None), None);
        assert_eq!(removed_at(&c, 3, at(3, 10), None), None, "a member");
        let none = StoredMembership::default();
        assert_eq!(removed_at(&none, 2, None, None), None, "no membership yet");
    }

    /// A candidate whose log runs past its removal's index in an older
    /// term (a leader without a quorum appended there) cannot hold the
    /// removal either (seed 3802546: node 3, leader of term 12 cut off,
    /// was removed in term 13 below its last index, and its pre-votes
    /// were refused without the marker, so it never exited).
    #[test]
    fn a_candidate_past_its_removal_in_an_older_term_is_refused() {
        let c = without_two();
        let at = |term, index| Some(crate::raft::log_id(term, 1, index));
        assert_eq!(removed_at(&c, 2, at(2, 40), None), Some(40));
        assert_eq!(removed_at(&c, 2, at(2, 45), None), Some(40));
        assert_eq!(removed_at(&c, 2, at(2, 1_000), None), Some(40));
        assert_eq!(removed_at(&c, 3, at(2, 45), None), None, "a member");
    }

    /// A node that asks, holding a membership without itself, is shown
    /// removed when that membership is no newer than the committed one
    /// without it (404727: it holds the removal at 40 but not its
    /// commit); not when its own is newer (this node may lag behind a
    /// membership that added it back), nor when the committed one has it.
    #[test]
    fn a_node_that_holds_its_removal_and_asks_is_refused() {
        let c = without_two();
        let last = Some(crate::raft::log_id(3, 1, 45));
        assert_eq!(removed_at(&c, 2, last, Some(40)), Some(40));
        assert_eq!(removed_at(&c, 2, last, Some(30)), Some(40));
        assert_eq!(removed_at(&c, 2, last, Some(41)), None);
        assert_eq!(removed_at(&c, 3, last, Some(40)), None, "a member");
    }

    #[test]
    fn a_snapshot_may_be_exactly_the_limit_and_not_a_byte_more() {
        assert!(snapshot_fits(0, MAX_SNAPSHOT_BYTES));
        assert!(snapshot_fits(MAX_SNAPSHOT_BYTES - 10, 10));
        assert!(!snapshot_fits(MAX_SNAPSHOT_BYTES - 10, 11));
        assert!(!snapshot_fits(usize::MAX, 1), "no overflow");
    }
}
