//! Outgoing Raft RPCs over gRPC, one reused HTTP/2 channel per peer.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{Backoff, RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use raftlock_proto::v1 as pb;
use raftlock_proto::v1::raft_client::RaftClient;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

use super::{NodeAddrs, NodeId, Snapshot, SnapshotData, TypeConfig, Vote};
use crate::auth::Auth;
use crate::metrics::{Metrics, RaftRpc as Rpc};

/// How long to wait for a TCP connection to a peer.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Hands openraft a client per peer; channels are cached by address so a
/// replication stream that restarts reuses its connection.
#[derive(Clone, Default)]
pub struct Network {
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// Addresses to dial instead of the membership's, per peer (used to
    /// route node-to-node links through a fault-injection proxy).
    dial: Arc<BTreeMap<NodeId, String>>,
    /// Where failed RPCs are counted.
    metrics: Arc<Metrics>,
    /// TLS towards peers, if enabled.
    tls: Option<tonic::transport::ClientTlsConfig>,
    /// Access control: when on, every RPC carries the peer token.
    auth: Arc<Auth>,
    /// This node's cluster id, sent with every RPC.
    cluster: Option<Arc<crate::raft::identity::ClusterIdentity>>,
}

impl Network {
    /// A network that dials peers at `dial[id]` where given, else at their
    /// membership address.
    pub fn new(
        dial: BTreeMap<NodeId, String>,
        metrics: Arc<Metrics>,
        tls: Option<tonic::transport::ClientTlsConfig>,
        auth: Arc<Auth>,
        cluster: Arc<crate::raft::identity::ClusterIdentity>,
    ) -> Self {
        Network {
            dial: Arc::new(dial),
            metrics,
            tls,
            auth,
            cluster: Some(cluster),
            ..Default::default()
        }
    }

    fn channel(&self, addr: &str) -> Result<Channel, String> {
        let mut channels = self.channels.lock().expect("channels lock poisoned");
        if let Some(c) = channels.get(addr) {
            return Ok(c.clone());
        }
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| format!("bad peer address {addr:?}: {e}"))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_while_idle(true);
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|e| format!("TLS towards {addr:?}: {e}"))?;
        }
        let channel = endpoint.connect_lazy();
        channels.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &NodeAddrs) -> Peer {
        // Peers are dialled at their peer address (their client address
        // unless they run a separate peer listener).
        let addr = self.dial.get(&target).unwrap_or(&node.peer_addr).clone();
        Peer {
            target,
            node: node.clone(),
            channel: self.channel(&addr),
            metrics: self.metrics.clone(),
            auth: self.auth.clone(),
            cluster: self.cluster.clone(),
        }
    }
}

/// The connection to one peer.
pub struct Peer {
    target: NodeId,
    node: NodeAddrs,
    channel: Result<Channel, String>,
    metrics: Arc<Metrics>,
    auth: Arc<Auth>,
    cluster: Option<Arc<crate::raft::identity::ClusterIdentity>>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Msg(String);

/// An RPC's failure, as openraft takes it.
type RpcError = RPCError<TypeConfig>;

impl Peer {
    fn channel(&self) -> Result<Channel, RpcError> {
        self.channel
            .as_ref()
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&Msg(e.clone()))))
            .cloned()
    }

    fn client(&self) -> Result<RaftClient<Channel>, RpcError> {
        Ok(RaftClient::new(self.channel()?)
            .max_decoding_message_size(super::MAX_RAFT_MESSAGE_BYTES)
            .max_encoding_message_size(super::MAX_RAFT_MESSAGE_BYTES))
    }

    /// A request carrying `message` and this node's credentials: the
    /// cluster id and, with access control on, the peer token.
    fn request<T>(&self, message: T) -> Result<tonic::Request<T>, RpcError> {
        let mut request = tonic::Request::new(message);
        if let Some(id) = self.cluster.as_ref().and_then(|c| c.header()) {
            request
                .metadata_mut()
                .insert(crate::raft::identity::CLUSTER_ID_KEY, id);
        }
        if let Some(acl) = self.auth.current() {
            let value = format!("Bearer {}", acl.peer_token())
                .parse()
                .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
            request
                .metadata_mut()
                .insert(crate::auth::AUTHORIZATION, value);
        }
        Ok(request)
    }

    /// What a failed gRPC call means to openraft: a peer that does not
    /// answer is unreachable (openraft backs off), anything else a network
    /// error (retried at once).
    fn failed(&self, status: &tonic::Status) -> RpcError {
        let err = Msg(format!(
            "rpc to node {} at {}: {status}",
            self.target, self.node.peer_addr
        ));
        if status.code() == tonic::Code::Unavailable {
            RPCError::Unreachable(Unreachable::new(&err))
        } else {
            RPCError::Network(NetworkError::new(&err))
        }
    }

    /// Sends one unary RPC and counts it in the metrics if it fails.
    async fn call<Req, Resp>(
        &mut self,
        rpc: Rpc,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RpcError>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
    {
        let result = self.call_inner(rpc, req, option).await;
        if result.is_err() {
            self.metrics.raft_rpc_error(rpc);
        }
        result
    }

    async fn call_inner<Req, Resp>(
        &mut self,
        rpc: Rpc,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RpcError>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
    {
        let data = bincode::serialize(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut client = self.client()?;
        let request = self.request(pb::RaftMessage {
            data,
            error: Vec::new(),
        })?;
        let fut = async {
            match rpc {
                Rpc::AppendEntries => client.append_entries(request).await,
                Rpc::Vote => client.vote(request).await,
                Rpc::InstallSnapshot => Err(tonic::Status::internal("snapshots are streamed")),
            }
        };
        let resp = match tokio::time::timeout(option.hard_ttl(), fut).await {
            Err(_) => {
                return Err(RPCError::Network(NetworkError::new(&Msg(format!(
                    "rpc to node {} timed out after {:?}",
                    self.target,
                    option.hard_ttl()
                )))))
            }
            Ok(Err(status)) => return Err(self.failed(&status)),
            Ok(Ok(resp)) => resp.into_inner(),
        };
        decode_reply(self.target, &resp)
    }
}

/// openraft's answer in a `RaftMessage`: the value in `data`, or, from a
/// node whose Raft has stopped, its error in `error` (then it cannot
/// answer: unreachable, as far as openraft is concerned).
fn decode_reply<Resp: DeserializeOwned>(
    target: NodeId,
    resp: &pb::RaftMessage,
) -> Result<Resp, RpcError> {
    if !resp.error.is_empty() {
        let e: openraft::error::RaftError<TypeConfig> = bincode::deserialize(&resp.error)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        return Err(RPCError::Unreachable(Unreachable::new(&Msg(format!(
            "node {target}: {e}"
        )))));
    }
    bincode::deserialize(&resp.data).map_err(|e| RPCError::Network(NetworkError::new(&e)))
}

impl RaftNetworkV2<TypeConfig> for Peer {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RpcError> {
        let carried = match (rpc.entries.first(), rpc.entries.last()) {
            (Some(first), Some(last)) => Some((first.log_id.index, last.log_id.index)),
            _ => None,
        };
        let metrics = self.metrics.clone();
        let stages = &metrics.stages;
        if let Some((first, last)) = carried {
            stages.sent(self.target, first, last, Instant::now());
        }
        let resp = self.call(Rpc::AppendEntries, &rpc, &option).await?;
        let upto = match (&resp, carried) {
            (AppendEntriesResponse::Success, Some((_, last))) => Some(last),
            (AppendEntriesResponse::PartialSuccess(Some(upto)), Some(_)) => Some(upto.index),
            _ => None,
        };
        if let (Some(upto), Some((first, _))) = (upto, carried) {
            stages.acked(self.target, first, upto, Instant::now());
        }
        Ok(resp)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RpcError> {
        self.call(Rpc::Vote, &rpc, &option).await
    }

    /// Streams the snapshot: a first message with the vote and the
    /// snapshot's meta, then the file's bytes in chunks of
    /// [`SNAPSHOT_CHUNK_BYTES`](super::SNAPSHOT_CHUNK_BYTES), each a
    /// message well under the peer's message limit.
    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + openraft::OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let _ = option;
        let result = self.send_snapshot(vote, snapshot, cancel).await;
        if result.is_err() {
            self.metrics.raft_rpc_error(Rpc::InstallSnapshot);
        }
        result
    }

    fn backoff(&self) -> Option<Backoff> {
        // A peer that is down is retried every 200 ms, so it rejoins quickly.
        Some(Backoff::new(std::iter::repeat(Duration::from_millis(200))))
    }
}

impl Peer {
    async fn send_snapshot(
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
        let head = bincode::serialize(&(&vote, &snapshot.meta)).map_err(|e| net(&e))?;
        let chunk = super::SNAPSHOT_CHUNK_BYTES as usize;
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
            });
        let mut client = self.client().map_err(|e| net(&e))?;
        let request = self
            .request(tokio_stream::iter(messages))
            .map_err(|e| net(&e))?;
        // No deadline for the whole transfer (a large table takes a while):
        // openraft cancels it when it gives up on it, and the channel's
        // HTTP/2 keep-alive ends it when the peer is gone.
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
