//! A peer's two streaming RPCs: the pipelined AppendEntries stream (with
//! its answer budget) and the chunked snapshot.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use futures::{Stream, StreamExt};
use openraft::base::BoxStream;
use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{AppendEntriesRequest, SnapshotResponse, StreamAppendResult};
use raftlock_proto::v1 as pb;

use super::{
    decode_reply, status_error, Msg, Peer, RpcError, CONNECT_TIMEOUT, STREAM_ANSWER_BUDGET,
};
use crate::metrics::{Metrics, RaftRpc as Rpc};
use crate::raft::links::Links;
use crate::raft::{Snapshot, TypeConfig, Vote};

/// Whether a replication stream's peer has stopped answering: its oldest
/// unanswered request, sent at `oldest_sent`, has waited `budget` for its
/// answer, counted from the later of its send and the last answer
/// (`last_answer`). Nothing in flight is never overdue.
pub(super) fn answer_overdue(
    oldest_sent: Option<Instant>,
    last_answer: Instant,
    now: Instant,
    budget: Duration,
) -> bool {
    oldest_sent.is_some_and(|sent| now.saturating_duration_since(sent.max(last_answer)) >= budget)
}

/// The budget for one answer on a replication stream whose openraft
/// budget is `ttl`: [`STREAM_ANSWER_BUDGET`], or `ttl` when longer.
pub(super) fn answer_budget(ttl: Duration) -> Duration {
    ttl.max(STREAM_ANSWER_BUDGET)
}

/// Requests sent on a replication stream and not yet answered, oldest
/// first: when each left and which entries it carried.
type InFlight = Arc<Mutex<VecDeque<(Instant, Option<(u64, u64)>)>>>;

impl Peer {
    pub(super) async fn open_stream<S>(
        &self,
        input: S,
        option: RPCOption,
    ) -> Result<BoxStream<'static, Result<StreamAppendResult<TypeConfig>, RpcError>>, RpcError>
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
    {
        let in_flight: InFlight = Arc::default();
        let target = self.target;
        let outbound = {
            let (in_flight, metrics) = (in_flight.clone(), self.metrics.clone());
            let network = self.channel.0.clone();
            input.map(move |rpc| {
                let carried = match (rpc.entries.first(), rpc.entries.last()) {
                    (Some(first), Some(last)) => Some((first.log_id.index, last.log_id.index)),
                    _ => None,
                };
                let now = Instant::now();
                if let Some((first, last)) = carried {
                    metrics.stages.sent(target, first, last, now);
                }
                in_flight
                    .lock()
                    .expect("in-flight lock poisoned")
                    .push_back((now, carried));
                // Serializing openraft's own types cannot fail; an empty
                // message would be refused by the peer as malformed.
                pb::RaftMessage {
                    data: crate::codec::encode(&rpc).unwrap_or_default(),
                    error: Vec::new(),
                    leader_quorum_lost: network.quorum_lost(),
                    voters_with_data: network.voters_with_data(),
                }
            })
        };
        let mut client = self.client()?;
        let request = self.request(outbound)?;
        // openraft's budget for one request and its answer (the heartbeat
        // interval): for opening the stream; each answer then has
        // `answer_budget` (STREAM_ANSWER_BUDGET at the least). Opening the
        // stream may first have to connect, which may take CONNECT_TIMEOUT:
        // with only the heartbeat interval for both, a peer whose new
        // connection took longer on a busy machine was dialled anew at
        // every attempt, each time from scratch, and never replicated to
        // again (a node added back under load did not catch up in 30 s:
        // node/tests/removed_node.rs, 3 of 10 runs of the test campaign).
        let ttl = option.hard_ttl();
        let open_within = ttl + CONNECT_TIMEOUT;
        let opened = tokio::time::timeout(open_within, client.stream_append(request)).await;
        let inbound = match opened {
            Err(_) => {
                self.redial();
                return Err(RPCError::Unreachable(Unreachable::new(&Msg(format!(
                    "replication stream to node {target}: not opened within {open_within:?}"
                )))));
            }
            Ok(Err(status)) => return Err(self.failed(&status)),
            Ok(Ok(resp)) => resp.into_inner(),
        };
        let metrics = self.metrics.clone();
        let links = self.links.clone();
        let node = self.node.peer_addr.clone();
        let channel = self.channel.clone();
        // A failure in the middle of the stream counts as a failed RPC, as
        // one at its start does.
        let failure = move |links: &Links, metrics: &Metrics, e: RpcError| {
            metrics.raft_rpc_error(Rpc::AppendEntries, target);
            links.failed(target, &e.to_string());
            Some((Err(e), None))
        };
        let budget = answer_budget(ttl);
        let opened_at = Instant::now();
        let state = Some((inbound, in_flight, metrics, opened_at));
        let answers = futures::stream::unfold(state, move |state| {
            let node = node.clone();
            let links = links.clone();
            let channel = channel.clone();
            async move {
                let (mut inbound, in_flight, metrics, last_answer) = state?;
                let next = loop {
                    match tokio::time::timeout(ttl, inbound.message()).await {
                        Ok(next) => break next,
                        Err(_) => {
                            let oldest = in_flight
                                .lock()
                                .expect("in-flight lock poisoned")
                                .front()
                                .map(|(at, _)| *at);
                            if answer_overdue(oldest, last_answer, Instant::now(), budget) {
                                channel.0.forget(&channel.1);
                                let e = Unreachable::new(&Msg(format!(
                                    "replication stream to node {target}: no answer within {budget:?}"
                                )));
                                return failure(&links, &metrics, RPCError::Unreachable(e));
                            }
                        }
                    }
                };
                let item = match next {
                    Ok(None) => return None,
                    Err(status) => {
                        let what = format!("replication stream to node {target} at {node}");
                        return failure(&links, &metrics, status_error(what, &status));
                    }
                    Ok(Some(msg)) => msg,
                };
                let sent = in_flight
                    .lock()
                    .expect("in-flight lock poisoned")
                    .pop_front();
                let result: Result<StreamAppendResult<TypeConfig>, RpcError> =
                    decode_reply(target, &item);
                if let Ok(Ok(Some(_))) = &result {
                    channel.0.saw_data(target).await;
                }
                if let (Ok(Ok(Some(matched))), Some((_, Some((first, last))))) = (&result, sent) {
                    let upto = matched.index.min(last);
                    if upto >= first {
                        metrics.stages.acked(target, first, upto, Instant::now());
                    }
                }
                let go_on = matches!(result, Ok(Ok(_)));
                let state = (inbound, in_flight, metrics, Instant::now());
                Some((result, go_on.then_some(state)))
            }
        });
        Ok(Box::pin(answers))
    }

    pub(super) async fn send_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let net = |e: &dyn std::fmt::Display| {
            StreamingError::Network(NetworkError::new(&Msg(format!(
                "snapshot to node {}: {e}",
                self.target
            ))))
        };
        let head = crate::codec::encode(&(&vote, &snapshot.meta)).map_err(|e| net(&e))?;
        let chunk = crate::raft::SNAPSHOT_CHUNK_BYTES as usize;
        let data = snapshot.snapshot;
        let messages = std::iter::once(head)
            .chain(
                (0..data.len())
                    .step_by(chunk)
                    .map(move |at| data[at..(at + chunk).min(data.len())].to_vec()),
            )
            .map(|data| pb::RaftMessage {
                data,
                error: Vec::new(),
                ..Default::default()
            });
        let mut client = self.client().map_err(|e| net(&e))?;
        let request = self
            .request(tokio_stream::iter(messages))
            .map_err(|e| net(&e))?;
        // No deadline for the whole transfer (a large table takes a while):
        // openraft cancels it when it gives up on it, and the channel's
        // HTTP/2 keep-alive ends it when the peer is gone (see
        // PEER_PING_TIMEOUT).
        let send = client.install_snapshot(request);
        let resp = tokio::select! {
            closed = cancel => return Err(StreamingError::Closed(closed)),
            resp = send => resp,
        };
        let resp = match resp {
            Err(status) => {
                return Err(match self.failed(&status) {
                    RPCError::Unreachable(u) => StreamingError::Unreachable(u),
                    other => net(&other),
                })
            }
            Ok(resp) => resp.into_inner(),
        };
        decode_reply(self.target, &resp).map_err(|e| net(&e))
    }
}
