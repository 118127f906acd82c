//! Outgoing Raft RPCs over gRPC, one reused HTTP/2 channel per peer.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use raftlock_proto::v1 as pb;
use raftlock_proto::v1::raft_client::RaftClient;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

use super::{NodeAddrs, NodeId, TypeConfig};
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

impl Peer {
    /// Sends one RPC and counts it in the metrics if it fails.
    async fn call<Req, Resp, E>(
        &mut self,
        rpc: Rpc,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, NodeAddrs, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let result = self.call_inner(rpc, req, option).await;
        if result.is_err() {
            self.metrics.raft_rpc_error(rpc);
        }
        result
    }

    async fn call_inner<Req, Resp, E>(
        &mut self,
        rpc: Rpc,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, NodeAddrs, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let channel = self
            .channel
            .as_ref()
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&Msg(e.clone()))))?
            .clone();
        let data = bincode::serialize(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut client = RaftClient::new(channel)
            .max_decoding_message_size(super::MAX_RAFT_MESSAGE_BYTES)
            .max_encoding_message_size(super::MAX_RAFT_MESSAGE_BYTES);
        let mut request = tonic::Request::new(pb::RaftMessage {
            data,
            error: Vec::new(),
        });
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
        let fut = async {
            match rpc {
                Rpc::AppendEntries => client.append_entries(request).await,
                Rpc::InstallSnapshot => client.install_snapshot(request).await,
                Rpc::Vote => client.vote(request).await,
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
            Ok(Err(status)) => {
                let err = Msg(format!(
                    "rpc to node {} at {}: {status}",
                    self.target, self.node.addr
                ));
                return Err(if status.code() == tonic::Code::Unavailable {
                    RPCError::Unreachable(Unreachable::new(&err))
                } else {
                    RPCError::Network(NetworkError::new(&err))
                });
            }
            Ok(Ok(resp)) => resp.into_inner(),
        };
        if !resp.error.is_empty() {
            let e: RaftError<NodeId, E> = bincode::deserialize(&resp.error)
                .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
            return Err(RPCError::RemoteError(RemoteError::new_with_node(
                self.target,
                self.node.clone(),
                e,
            )));
        }
        bincode::deserialize(&resp.data).map_err(|e| RPCError::Network(NetworkError::new(&e)))
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, NodeAddrs, RaftError<NodeId>>> {
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

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, NodeAddrs, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call(Rpc::InstallSnapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, NodeAddrs, RaftError<NodeId>>> {
        self.call(Rpc::Vote, &rpc, &option).await
    }

    fn backoff(&self) -> openraft::network::Backoff {
        // A peer that is down is retried every 200 ms, so it rejoins quickly.
        openraft::network::Backoff::new(std::iter::repeat(Duration::from_millis(200)))
    }
}
