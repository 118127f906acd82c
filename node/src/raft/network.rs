//! Outgoing Raft RPCs over gRPC, one reused HTTP/2 channel per peer.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use futures::{Stream, StreamExt};
use openraft::base::{BoxFuture, BoxStream};
use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{Backoff, RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult,
    TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use raftlock_proto::v1 as pb;
use raftlock_proto::v1::raft_client::RaftClient;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

use super::links::Links;
use super::WatchReceiver as _;
use super::{NodeAddrs, NodeId, Snapshot, SnapshotData, TypeConfig, Vote};
use crate::auth::Auth;
use crate::metrics::{Metrics, RaftRpc as Rpc};

mod streams;

/// How long to wait for a TCP connection to a peer.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// How often a connection to a peer is pinged (HTTP/2 PING), busy or idle.
pub const PEER_PING_INTERVAL: Duration = Duration::from_secs(2);

/// A connection to a peer whose ping goes unanswered this long is closed,
/// and every call on it fails. Pings are answered by the peer's HTTP/2
/// layer, whatever its Raft is doing, so only a dead link or a stopped
/// process trips this. It bounds how long a call with no deadline of its
/// own (a snapshot transfer) hangs on a link that dropped mid-call:
/// about 6 s, where hyper's default (a 20 s timeout after a 10 s
/// interval) stalled replication to a follower for 30 s after a partition
/// healed (simulator seed 34 with `--paths bound`: the joint
/// configuration of a replacement, which needed that follower, could not
/// commit, and nor could any write).
pub const PEER_PING_TIMEOUT: Duration = Duration::from_secs(4);

/// How long a peer may take to answer one request on a replication
/// stream before the leader gives the stream up and dials it again, at the
/// least (openraft's budget, the heartbeat interval, when that is longer).
/// It counts from when the request was sent or, when the answer before it
/// came later, from that answer: answers come in order, so a request
/// queued behind a slow one has not waited on the peer until that one is
/// answered. A follower answers entries only once they are on its disk;
/// with the heartbeat interval as the budget (50-100 ms), a follower whose
/// syncs took longer (a busy disk or machine) had its stream torn down at
/// every batch, and a node catching up under load took over 30 s instead
/// of under one (`removed_node.rs` in the test campaign). A peer that is
/// gone is found by [`PEER_PING_TIMEOUT`] or a failed connection whatever
/// this budget is; this one finds a peer whose process runs but whose Raft
/// does not answer.
pub const STREAM_ANSWER_BUDGET: Duration = Duration::from_secs(1);

/// How long a replication stream that [`ends_stale_stream`] goes on after
/// its stale request before it ends: openraft restarts the stream at once,
/// from the same payload until its core publishes the follower's next one
/// (when the snapshot it is being sent has been installed), and this keeps
/// those restarts from spinning meanwhile.
pub const STALE_STREAM_PAUSE: Duration = Duration::from_millis(50);

/// True for a request of a replication stream that openraft restarted from
/// a payload its core has already replaced by a snapshot (0.10.0-alpha.37:
/// the core switches a follower to a snapshot without telling the
/// follower's replication task): an entry-less request whose next index is
/// already purged here (`purged_next`: the first index not purged). The
/// log gave the stream nothing to send
/// ([`LogStore`](super::log_store::LogStore)'s `limited_get_log_entries`),
/// and the stream would send the same empty
/// request every 10 ms without end; ended, the task takes up the core's
/// current payload. A follower that matches the log exactly at the purge
/// point is not stale (its next index is there), nor is a request from an
/// empty follower (no previous log id: a probe the core waits on).
pub fn ends_stale_stream(rpc: &AppendEntriesRequest<TypeConfig>, purged_next: u64) -> bool {
    rpc.entries.is_empty()
        && rpc
            .prev_log_id
            .is_some_and(|prev| prev.index + 1 < purged_next)
}

/// Hands openraft a client per peer; channels are cached by address so a
/// replication stream that restarts reuses its connection.
#[derive(Clone, Default)]
pub struct Network {
    channels: Arc<Mutex<BTreeMap<String, Channel>>>,
    /// Addresses to dial instead of the membership's, per peer (used to
    /// route node-to-node links through a fault-injection proxy).
    dial: Arc<BTreeMap<NodeId, String>>,
    /// Where failed RPCs are counted.
    metrics: Arc<Metrics>,
    /// TLS towards peers, if enabled (reloadable: channels made before a
    /// reload are redialled with the new material).
    tls: Option<Arc<crate::tls::NodeTls>>,
    /// The TLS reload the cached channels were made with.
    tls_generation: Arc<std::sync::atomic::AtomicU64>,
    /// Access control: when on, every RPC carries the peer token.
    auth: Arc<Auth>,
    /// This node's cluster id, sent with every RPC.
    cluster: Option<Arc<crate::raft::identity::ClusterIdentity>>,
    /// Which peers are failing, and when each may be tried again.
    links: Arc<Links>,
    /// Dials peers over a custom transport instead of TCP (`None`: TCP).
    connector: Option<crate::transport::Connector>,
    /// Set while this node leads without word from a quorum (the owner of
    /// leadership keeps it); every AppendEntries it sends says so, so its
    /// followers stop calling themselves ready.
    quorum_lost: Arc<std::sync::atomic::AtomicBool>,
    /// The first index the log has not purged (see [`ends_stale_stream`]).
    purged: Arc<std::sync::atomic::AtomicU64>,
    /// This node's Raft metrics, once its Raft runs: every RPC names the
    /// voters of its membership that have held data (see
    /// [`VOTERS_WITH_DATA_KEY`](super::identity::VOTERS_WITH_DATA_KEY)).
    membership: Arc<std::sync::OnceLock<super::MetricsWatch>>,
}

impl Network {
    /// A network that dials peers at `dial[id]` where given, else at their
    /// membership address.
    pub fn new(
        dial: BTreeMap<NodeId, String>,
        metrics: Arc<Metrics>,
        tls: Option<Arc<crate::tls::NodeTls>>,
        auth: Arc<Auth>,
        cluster: Arc<crate::raft::identity::ClusterIdentity>,
        links: Arc<Links>,
    ) -> Self {
        Network {
            dial: Arc::new(dial),
            metrics,
            tls,
            auth,
            cluster: Some(cluster),
            links,
            ..Default::default()
        }
    }

    /// Dials peers with `connector` instead of over TCP (a simulator's
    /// network, say); everything above the byte stream stays the same.
    pub fn with_connector(mut self, connector: Option<crate::transport::Connector>) -> Self {
        self.connector = connector;
        self
    }

    /// Tells followers, on every AppendEntries, whether `quorum_lost` is
    /// set (see `RaftMessage.leader_quorum_lost`).
    pub fn with_quorum_flag(mut self, quorum_lost: Arc<std::sync::atomic::AtomicBool>) -> Self {
        self.quorum_lost = quorum_lost;
        self
    }

    /// Reads the log's purge point from `purged` (the store's
    /// `purged_marker`), to end stale replication streams
    /// ([`ends_stale_stream`]).
    pub fn with_purge_point(mut self, purged: Arc<std::sync::atomic::AtomicU64>) -> Self {
        self.purged = purged;
        self
    }

    /// From now on, every RPC names the voters of the membership in
    /// `metrics` (this node's Raft's) that have held data (see
    /// [`VOTERS_WITH_DATA_KEY`](super::identity::VOTERS_WITH_DATA_KEY)).
    /// Set once; later calls change nothing.
    pub fn watch_membership(&self, metrics: super::MetricsWatch) {
        let _ = self.membership.set(metrics);
    }

    /// What this node's RPCs name as voters that have held data (see
    /// [`VOTERS_WITH_DATA_KEY`](super::identity::VOTERS_WITH_DATA_KEY)).
    fn voters_with_data(&self) -> Vec<NodeId> {
        match (&self.cluster, self.membership.get()) {
            (Some(cluster), Some(m)) => {
                cluster.voters_with_data(&m.borrow_watched().membership_config)
            }
            _ => Vec::new(),
        }
    }

    /// Records that `peer` has held data (it answered with a log or a
    /// granted vote).
    async fn saw_data(&self, peer: NodeId) {
        if let Some(cluster) = &self.cluster {
            cluster.saw_data(peer).await;
        }
    }

    /// Whether this node, as leader, has lost its quorum now.
    fn quorum_lost(&self) -> bool {
        self.quorum_lost.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn channel(&self, addr: &str) -> Result<Channel, String> {
        let mut channels = self.channels.lock().expect("channels lock poisoned");
        let tls = self.tls.as_ref().map(|t| t.peer_client_config());
        if let Some((generation, _)) = &tls {
            use std::sync::atomic::Ordering;
            if self.tls_generation.swap(*generation, Ordering::SeqCst) != *generation {
                // Reloaded: new connections get the new certificate and CA.
                channels.clear();
            }
        }
        if let Some(c) = channels.get(addr) {
            return Ok(c.clone());
        }
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| format!("bad peer address {addr:?}: {e}"))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(PEER_PING_INTERVAL)
            .keep_alive_timeout(PEER_PING_TIMEOUT)
            .keep_alive_while_idle(true);
        if let Some((_, tls)) = tls {
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| format!("TLS towards {addr:?}: {e}"))?;
        }
        let channel = match &self.connector {
            None => endpoint.connect_lazy(),
            Some(connector) => connector.channel(&endpoint),
        };
        channels.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }

    /// A new connection to the client port of node `id` at `node` (not one
    /// of the cached peer connections: a follower forwarding clients'
    /// requests keeps its own, see `api::forward`), dialled as its peers
    /// are: over TLS with this node's peer credentials if TLS is on, over
    /// the custom transport if any, and through the dial address given for
    /// `id` when its client and peer addresses are one (so a link cut
    /// between two nodes cuts forwarding between them too).
    pub fn client_channel(&self, id: NodeId, node: &NodeAddrs) -> Result<Channel, String> {
        let addr = match self.dial.get(&id) {
            Some(dial) if node.peer_addr == node.addr => dial.as_str(),
            _ => node.addr.as_str(),
        };
        let tls = self.tls.as_ref().map(|t| t.peer_client_config().1);
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| format!("bad client address {addr:?}: {e}"))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(PEER_PING_INTERVAL)
            .keep_alive_timeout(PEER_PING_TIMEOUT)
            .keep_alive_while_idle(true);
        if let Some(tls) = tls {
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| format!("TLS towards {addr:?}: {e}"))?;
        }
        Ok(match &self.connector {
            None => endpoint.connect_lazy(),
            Some(connector) => connector.channel(&endpoint),
        })
    }

    /// Drops the connection to `addr`: the next RPC dials a new one. For a
    /// peer that stopped answering in time: its connection may be wedged
    /// (a segment lost for good, state a middlebox forgot) while the socket
    /// stays open, and HTTP/2 keep-alive would notice only after its
    /// interval and timeout (30 s), stalling replication to that peer (and
    /// every membership change, whose joint quorum needs it) meanwhile.
    /// RPCs already under way keep the old connection until they end.
    fn forget(&self, addr: &str) {
        self.channels
            .lock()
            .expect("channels lock poisoned")
            .remove(addr);
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
            channel: (self.clone(), addr),
            metrics: self.metrics.clone(),
            auth: self.auth.clone(),
            cluster: self.cluster.clone(),
            links: self.links.clone(),
        }
    }
}

/// The connection to one peer.
pub struct Peer {
    target: NodeId,
    node: NodeAddrs,
    /// Where its channel comes from, and the address dialled: asked anew
    /// for every RPC, so a TLS reload reaches peers already connected.
    channel: (Network, String),
    metrics: Arc<Metrics>,
    auth: Arc<Auth>,
    cluster: Option<Arc<crate::raft::identity::ClusterIdentity>>,
    links: Arc<Links>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Msg(String);

/// An RPC's failure, as openraft takes it.
type RpcError = RPCError<TypeConfig>;

impl Peer {
    fn channel(&self) -> Result<Channel, RpcError> {
        let (network, addr) = &self.channel;
        network
            .channel(addr)
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&Msg(e))))
    }

    /// The peer did not answer in time: its next RPC dials anew (see
    /// [`Network::forget`]).
    fn redial(&self) {
        let (network, addr) = &self.channel;
        network.forget(addr);
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
        if let Some(named) =
            super::identity::ClusterIdentity::named_header(&self.channel.0.voters_with_data())
        {
            request
                .metadata_mut()
                .insert(crate::raft::identity::VOTERS_WITH_DATA_KEY, named);
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
        status_error(
            format!("rpc to node {} at {}", self.target, self.node.peer_addr),
            status,
        )
    }

    /// A refusal that says this node was removed (see
    /// [`REMOVED_KEY`](super::links::REMOVED_KEY)) is told to [`Links`].
    fn note_removal(&self, status: &tonic::Status) {
        if let Some(at) = status
            .metadata()
            .get(super::links::REMOVED_KEY)
            .and_then(|v| v.to_str().ok()?.parse().ok())
        {
            self.links.removed_by(self.target, at);
        }
    }

    /// Asks the peer whether this node, whose own latest membership is at
    /// log index `left_at`, has been removed: a pre-vote
    /// marked with [`LEFT_KEY`](super::links::LEFT_KEY), which the peer
    /// answers without openraft. A refusal with the removal marker is
    /// told to [`Links`]; any other outcome (no answer within `within`,
    /// an older peer's pre-vote answer) proves nothing and is dropped.
    /// Not counted in the link's health: this is no Raft traffic.
    pub async fn ask_if_removed(
        &self,
        rpc: &VoteRequest<TypeConfig>,
        left_at: u64,
        within: Duration,
    ) {
        let Ok(data) = crate::codec::encode(rpc) else {
            return;
        };
        let (Ok(mut client), Ok(mut request)) = (
            self.client(),
            self.request(pb::RaftMessage {
                data,
                error: Vec::new(),
                ..Default::default()
            }),
        ) else {
            return;
        };
        let Ok(left_at) = left_at.to_string().parse() else {
            return;
        };
        request
            .metadata_mut()
            .insert(super::links::LEFT_KEY, left_at);
        if let Ok(Err(status)) = tokio::time::timeout(within, client.pre_vote(request)).await {
            self.note_removal(&status);
        }
    }

    /// Sends one unary RPC, unless the peer is failing and not due for
    /// another attempt (see [`Links`]), and records the outcome.
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
        self.call_or(rpc, req, option, |_| None).await
    }

    /// Like [`call`](Self::call); a failure status for which `fallback`
    /// gives an answer is taken as that answer.
    async fn call_or<Req, Resp>(
        &mut self,
        rpc: Rpc,
        req: &Req,
        option: &RPCOption,
        fallback: impl FnOnce(&tonic::Status) -> Option<Resp>,
    ) -> Result<Resp, RpcError>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
    {
        self.admit()?;
        let result = self.call_inner(rpc, req, option, fallback).await;
        self.outcome(
            rpc,
            result.as_ref().err().map(|e| e as &dyn std::fmt::Display),
        );
        result
    }

    /// `Unreachable` at once, without a network round, if the peer is
    /// failing and its next attempt is not due yet.
    fn admit(&self) -> Result<(), RpcError> {
        self.links
            .admit(self.target)
            .map_err(|why| RPCError::Unreachable(Unreachable::new(&Msg(why))))
    }

    /// Records an RPC's outcome: the peer's link health, and the metrics.
    fn outcome(&self, rpc: Rpc, error: Option<&dyn std::fmt::Display>) {
        match error {
            None => self.links.succeeded(self.target),
            Some(e) => {
                self.metrics.raft_rpc_error(rpc, self.target);
                self.links.failed(self.target, &e.to_string());
            }
        }
    }

    async fn call_inner<Req, Resp>(
        &mut self,
        rpc: Rpc,
        req: &Req,
        option: &RPCOption,
        fallback: impl FnOnce(&tonic::Status) -> Option<Resp>,
    ) -> Result<Resp, RpcError>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
    {
        let data =
            crate::codec::encode(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut client = self.client()?;
        let request = self.request(pb::RaftMessage {
            data,
            error: Vec::new(),
            leader_quorum_lost: matches!(rpc, Rpc::AppendEntries) && self.channel.0.quorum_lost(),
            // (Named in the metadata: see `request`.)
            ..Default::default()
        })?;
        let fut = async {
            match rpc {
                Rpc::AppendEntries => client.append_entries(request).await,
                Rpc::Vote => client.vote(request).await,
                Rpc::PreVote => client.pre_vote(request).await,
                Rpc::TransferLeader => client.transfer_leader(request).await,
                Rpc::InstallSnapshot => Err(tonic::Status::internal("snapshots are streamed")),
            }
        };
        let resp = match tokio::time::timeout(option.hard_ttl(), fut).await {
            Err(_) => {
                self.redial();
                return Err(RPCError::Network(NetworkError::new(&Msg(format!(
                    "rpc to node {} timed out after {:?}",
                    self.target,
                    option.hard_ttl()
                )))));
            }
            Ok(Err(status)) => {
                self.note_removal(&status);
                return match fallback(&status) {
                    Some(answer) => Ok(answer),
                    None => Err(self.failed(&status)),
                };
            }
            Ok(Ok(resp)) => resp.into_inner(),
        };
        decode_reply(self.target, &resp)
    }
}

/// Whether an answer to an AppendEntries shows the peer holding a log:
/// it took the request's entries or matched its `prev_log_id`
/// (`matched_something`: the request had either).
fn holds_log(resp: &AppendEntriesResponse<TypeConfig>, matched_something: bool) -> bool {
    match resp {
        AppendEntriesResponse::Success => matched_something,
        AppendEntriesResponse::PartialSuccess(upto) => upto.is_some(),
        _ => false,
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
        let e: openraft::error::RaftError<TypeConfig> = crate::codec::decode(&resp.error)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        return Err(RPCError::Unreachable(Unreachable::new(&Msg(format!(
            "node {target}: {e}"
        )))));
    }
    crate::codec::decode(&resp.data).map_err(|e| RPCError::Network(NetworkError::new(&e)))
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
        if holds_log(&resp, rpc.prev_log_id.is_some() || carried.is_some()) {
            self.channel.0.saw_data(self.target).await;
        }
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

    /// Pipelined replication over one bidirectional gRPC stream
    /// (`Raft.StreamAppend`): each request goes out as soon as openraft
    /// makes it, without waiting for the answer to the one before, and the
    /// answers come back in order. The stream fails when an answer is
    /// `soft_ttl` late (a follower that stopped answering).
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<
        's,
        Result<BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RpcError>>, RpcError>,
    >
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
    {
        // A stale stream's request goes out (so a probe is answered), and
        // then, a moment later, the stream ends.
        let (purged, peer) = (self.channel.0.purged.clone(), self.target);
        let input = futures::stream::unfold((input, false), move |(mut input, stale)| {
            let purged = purged.clone();
            async move {
                if stale {
                    tokio::time::sleep(STALE_STREAM_PAUSE).await;
                    return None;
                }
                let rpc = input.next().await?;
                let stale =
                    ends_stale_stream(&rpc, purged.load(std::sync::atomic::Ordering::SeqCst));
                if stale {
                    tracing::debug!(
                        peer,
                        prev = ?rpc.prev_log_id,
                        "a replication stream restarted from a replaced payload; ending it"
                    );
                }
                Some((rpc, (input, stale)))
            }
        });
        Box::pin(async move {
            // Take the first request before dialling: openraft's
            // replication backoff sleeps in producing it, and a peer that
            // refuses the connection would otherwise be retried at once.
            let mut input = Box::pin(input);
            let Some(first) = input.next().await else {
                return Ok(Box::pin(futures::stream::empty()) as BoxStream<'s, _>);
            };
            self.admit()?;
            let input = futures::stream::once(async { first }).chain(input);
            let result = self.open_stream(Box::pin(input), option).await;
            self.outcome(
                Rpc::AppendEntries,
                result.as_ref().err().map(|e| e as &dyn std::fmt::Display),
            );
            result.map(|answers| answers as BoxStream<'s, _>)
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RpcError> {
        let resp: VoteResponse<TypeConfig> = self.call(Rpc::Vote, &rpc, &option).await?;
        if resp.vote_granted || resp.last_log_id.is_some() {
            self.channel.0.saw_data(self.target).await;
        }
        Ok(resp)
    }

    /// A peer of an older build has no `PreVote` (`UNIMPLEMENTED`): that
    /// counts as a grant, as openraft does for a network without pre-vote,
    /// so a cluster in the middle of a rolling upgrade can still elect.
    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RpcError> {
        let vote = rpc.vote;
        let resp: VoteResponse<TypeConfig> = self
            .call_or(Rpc::PreVote, &rpc, &option, |status| {
                (status.code() == tonic::Code::Unimplemented)
                    .then(|| VoteResponse::new(vote, None, true))
            })
            .await?;
        // A pre-vote is granted without being recorded: only a log says
        // the peer has held data.
        if resp.last_log_id.is_some() {
            self.channel.0.saw_data(self.target).await;
        }
        Ok(resp)
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RpcError> {
        self.call(Rpc::TransferLeader, &req, &option).await
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
        self.admit().map_err(|e| match e {
            RPCError::Unreachable(u) => StreamingError::Unreachable(u),
            other => StreamingError::Network(NetworkError::new(&other)),
        })?;
        let result = self.send_snapshot(vote, snapshot, cancel).await;
        if result.is_ok() {
            // The peer installed the snapshot: it holds data.
            self.channel.0.saw_data(self.target).await;
        }
        match &result {
            // Cancelled by openraft: says nothing about the peer.
            Err(StreamingError::Closed(_)) => {}
            Err(e) => self.outcome(Rpc::InstallSnapshot, Some(e)),
            Ok(_) => self.outcome(Rpc::InstallSnapshot, None),
        }
        result
    }

    /// The same schedule as the link's (see [`Links`]): exponential, capped
    /// at [`MAX_RETRY`](super::links::MAX_RETRY), jittered. A peer that
    /// answers again ends it at once (the node resets openraft's backoff).
    fn backoff(&self) -> Option<Backoff> {
        Some(Backoff::new(super::links::backoff_delays()))
    }
}

/// A failed call as openraft sees it: `UNAVAILABLE` means the peer could
/// not be reached, anything else is a network error. `what` names the call.
fn status_error(what: String, status: &tonic::Status) -> RpcError {
    let err = Msg(format!("{what}: {status}"));
    if status.code() == tonic::Code::Unavailable {
        RPCError::Unreachable(Unreachable::new(&err))
    } else {
        RPCError::Network(NetworkError::new(&err))
    }
}

#[cfg(test)]
mod tests;
