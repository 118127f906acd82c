//! Any node accepts any request: a follower forwards to the leader.
//!
//! On the client port, a request for a `Locks` or `Cluster` method (gRPC,
//! or HTTP/JSON at `/v1/locks/…`, `/v1/cluster/…`) that reaches a node
//! which knows another node as leader is sent on to that leader's client
//! port, as it came (headers, body, streams both ways), and the leader's
//! answer is passed back as it came, with the leader hints
//! (`raftlock-leader`, `raftlock-leader-id`) added, so a client may go to
//! the leader directly next time. Served where they arrive instead:
//!
//! * `Cluster.Status` (it describes the node asked);
//! * `Describe`, `List` and `CheckFence` with `stale` set (served from this
//!   node's state, the point of `stale`);
//! * a request that already passed through a node (header
//!   [`FORWARDED_KEY`]): one hop at most, never a loop;
//! * with access control on, a request without a bearer token: its
//!   identity is the client certificate of its connection to this node,
//!   which the leader cannot see, so it is answered here (`UNAVAILABLE`
//!   naming the leader, as before forwarding);
//! * anything while this node leads, or knows no leader.
//!
//! A stream forwarded lives as long as both connections: when the client's
//! connection to this node ends, so does the stream to the leader (a
//! session bound to its keep-alive stream, `end_on_disconnect`, starts its
//! grace then, as on a direct stream); when this node or its link to the
//! leader fails, the stream ends with `UNAVAILABLE` and the client's
//! keep-alive moves on as from any failed stream.
//!
//! A forward that fails (the leader unreachable, the link cut while the
//! answer was pending) is answered `UNAVAILABLE` with the leader hints but
//! without `raftlock-not-leader`: the request may have reached the leader,
//! so its outcome is unknown, and a client retries it with the same
//! `session_id` and `seq` (exactly once, as after any transport failure).
//!
//! The leader identifies a forwarded request by its bearer token only: the
//! forwarding node's certificate, which the leader sees on the connection,
//! is never taken for the client's identity ([`FORWARDED_KEY`] turns
//! certificate identities off for the request, see `auth`).

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::http::{header, HeaderName, HeaderValue, Request, Response, Version};
use futures::future::BoxFuture;
use tonic::body::Body;
use tonic::transport::Channel;
use tower::{Service as _, ServiceExt as _};

use crate::auth::Auth;
use crate::leader::Leadership;
use crate::raft::network::Network;
use crate::raft::{NodeAddrs, NodeId};

pub use raftlock_proto::FORWARDED_KEY;

/// Most requests and streams under way at once on one forwarding
/// connection to the leader; past it another connection is opened (the
/// leader's server takes at most `MAX_STREAMS_PER_CONNECTION` on each).
pub const MAX_FORWARDED_PER_CONNECTION: usize = 1000;

/// Largest body read to see whether a read asks for `stale`: the largest
/// message the node takes ([`crate::MAX_MESSAGE_BYTES`]) and gRPC's 5-byte
/// frame header. A larger one is refused `OUT_OF_RANGE`, as the service
/// itself refuses a message over the limit.
const MAX_PEEK_BYTES: usize = crate::MAX_MESSAGE_BYTES + 5;

/// Forwards requests to the leader (see the module's documentation); the
/// peer listener's server carries it switched off.
#[derive(Clone, Default)]
pub struct ForwardLayer(Option<Arc<Forwarder>>);

impl ForwardLayer {
    /// Forwarding on, for node `id`.
    pub fn new(id: NodeId, leadership: Arc<Leadership>, network: Network, auth: Arc<Auth>) -> Self {
        ForwardLayer(Some(Arc::new(Forwarder {
            id,
            leadership,
            network,
            auth,
            pool: Mutex::new(None),
        })))
    }

    /// Forwarding off.
    pub fn off() -> Self {
        ForwardLayer(None)
    }
}

impl<S> tower::Layer<S> for ForwardLayer {
    type Service = Forward<S>;

    fn layer(&self, inner: S) -> Forward<S> {
        Forward {
            inner,
            forwarder: self.0.clone(),
        }
    }
}

/// The service [`ForwardLayer`] makes.
#[derive(Clone)]
pub struct Forward<S> {
    inner: S,
    forwarder: Option<Arc<Forwarder>>,
}

/// Connections to the leader for forwarded requests.
pub struct Forwarder {
    id: NodeId,
    leadership: Arc<Leadership>,
    network: Network,
    auth: Arc<Auth>,
    /// The connections to the current leader (dropped for new ones when
    /// the leader changes; requests under way keep theirs).
    pool: Mutex<Option<Pool>>,
}

struct Pool {
    leader: NodeId,
    addrs: NodeAddrs,
    links: Vec<(Channel, Arc<AtomicUsize>)>,
}

/// Where a request goes: the leader, over one of the pool's connections.
struct Target {
    leader: NodeId,
    addr: String,
    channel: Channel,
    in_flight: Arc<AtomicUsize>,
}

impl Forwarder {
    /// Where `req` is forwarded, if it is (see the module's documentation;
    /// a `stale` read is decided later, from its body).
    fn target(&self, req: &Request<Body>) -> Option<Target> {
        if !forwardable(req.uri().path()) || req.headers().contains_key(FORWARDED_KEY) {
            return None;
        }
        if self.auth.current().is_some() && !req.headers().contains_key(header::AUTHORIZATION) {
            return None;
        }
        // The published view first (cheap): a node that leads, or knows
        // no leader, serves the request itself.
        let view = self.leadership.view();
        if view.leader.is_none_or(|l| l == self.id) {
            return None;
        }
        let (leader, addrs) = self.leadership.leader_elsewhere()?;
        let mut pool = self.pool.lock().expect("forward pool lock poisoned");
        if !matches!(&*pool, Some(p) if p.leader == leader && p.addrs == addrs) {
            *pool = Some(Pool {
                leader,
                addrs: addrs.clone(),
                links: Vec::new(),
            });
        }
        let pool = pool.as_mut().expect("set above");
        let link = match pool
            .links
            .iter()
            .find(|(_, n)| n.load(Ordering::Relaxed) < MAX_FORWARDED_PER_CONNECTION)
        {
            Some(link) => link.clone(),
            None => {
                let channel = match self.network.client_channel(leader, &addrs) {
                    Ok(channel) => channel,
                    Err(e) => {
                        tracing::warn!(leader, "cannot forward to the leader: {e}");
                        return None;
                    }
                };
                let link = (channel, Arc::new(AtomicUsize::new(0)));
                pool.links.push(link.clone());
                link
            }
        };
        Some(Target {
            leader,
            addr: addrs.addr,
            channel: link.0,
            in_flight: link.1,
        })
    }

    /// Sends `req` to the leader and answers with the leader's answer.
    async fn forward(&self, target: Target, req: Request<Body>) -> Response<Body> {
        let grpc = is_grpc(&req);
        let (mut parts, body) = req.into_parts();
        // Hop-by-hop headers stay on this hop; HTTP/2 carries the rest
        // (an HTTP/1.1 request goes on as HTTP/2: the leader's port takes
        // both, and the body streams either way).
        for name in [
            header::CONNECTION,
            header::HOST,
            header::TRANSFER_ENCODING,
            header::UPGRADE,
            HeaderName::from_static("keep-alive"),
            HeaderName::from_static("proxy-connection"),
        ] {
            parts.headers.remove(name);
        }
        if parts
            .headers
            .get(header::TE)
            .is_some_and(|te| te.as_bytes() != b"trailers")
        {
            parts.headers.remove(header::TE);
        }
        parts.version = Version::HTTP_2;
        parts
            .headers
            .insert(FORWARDED_KEY, HeaderValue::from(self.id));
        let in_flight = InFlight::new(target.in_flight.clone());
        let answer = async {
            target
                .channel
                .clone()
                .ready()
                .await?
                .call(Request::from_parts(parts, body))
                .await
        };
        match answer.await {
            Ok(response) => {
                let (mut parts, body) = response.into_parts();
                add_hints(&mut parts.headers, target.leader, &target.addr);
                Response::from_parts(
                    parts,
                    Body::new(Counted {
                        body,
                        _in_flight: in_flight,
                    }),
                )
            }
            Err(e) => {
                tracing::debug!(leader = target.leader, "forwarding failed: {e}");
                let mut status = tonic::Status::unavailable(format!(
                    "forwarding to the leader (node {} at {}) failed: {e}; the request may have \
                     reached it, so its outcome is unknown: retry it (with the same session_id \
                     and seq)",
                    target.leader, target.addr
                ));
                if let Ok(addr) = target.addr.parse() {
                    status
                        .metadata_mut()
                        .insert(crate::error::LEADER_ADDR_KEY, addr);
                }
                status.metadata_mut().insert(
                    crate::error::LEADER_ID_KEY,
                    tonic::metadata::MetadataValue::from(target.leader),
                );
                if grpc {
                    status.into_http()
                } else {
                    super::http::status_response(&status).map(Body::new)
                }
            }
        }
    }
}

/// The leader hints on a forwarded answer.
fn add_hints(headers: &mut axum::http::HeaderMap, leader: NodeId, addr: &str) {
    if let Ok(value) = HeaderValue::from_str(addr) {
        headers.insert(crate::error::LEADER_ADDR_KEY, value);
    }
    headers.insert(crate::error::LEADER_ID_KEY, HeaderValue::from(leader));
}

/// Whether a request to `path` is one a follower forwards (unless it is
/// a `stale` read, which only its body says).
fn forwardable(path: &str) -> bool {
    let method = path
        .strip_prefix("/raftlock.v1.Locks/")
        .or_else(|| path.strip_prefix("/v1/locks/"))
        .map(|_| true)
        .or_else(|| {
            path.strip_prefix("/raftlock.v1.Cluster/")
                .or_else(|| path.strip_prefix("/v1/cluster/"))
                .map(|m| m != "Status")
        });
    method.unwrap_or(false)
}

/// Whether `path` is a read that a `stale` flag serves locally.
fn may_be_stale(path: &str) -> bool {
    let method = path
        .strip_prefix("/raftlock.v1.Locks/")
        .or_else(|| path.strip_prefix("/v1/locks/"));
    matches!(method, Some("Describe" | "List" | "CheckFence"))
}

fn is_grpc<B>(req: &Request<B>) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// Whether the body of a `Describe`, `List` or `CheckFence` request (one
/// gRPC message, or JSON) asks for `stale`.
fn asks_stale(path: &str, grpc: bool, body: &[u8]) -> bool {
    use prost::Message as _;
    use raftlock_proto::v1 as pb;
    if !grpc {
        return serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("stale").and_then(serde_json::Value::as_bool))
            .unwrap_or(false);
    }
    // One length-prefixed message, uncompressed: anything else is left
    // to the leader to refuse.
    let Some(message) = body.get(5..).filter(|_| body.first() == Some(&0)) else {
        return false;
    };
    match path.rsplit('/').next() {
        Some("Describe") => pb::DescribeRequest::decode(message).is_ok_and(|m| m.stale),
        Some("List") => pb::ListRequest::decode(message).is_ok_and(|m| m.stale),
        Some("CheckFence") => pb::CheckFenceRequest::decode(message).is_ok_and(|m| m.stale),
        _ => false,
    }
}

impl<S, E> tower::Service<Request<Body>> for Forward<S>
where
    S: tower::Service<Request<Body>, Response = Response<Body>, Error = E> + Clone + Send + 'static,
    S::Future: Send + 'static,
    E: Send + 'static,
{
    type Response = Response<Body>;
    type Error = E;
    type Future = BoxFuture<'static, Result<Response<Body>, E>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let target = self.forwarder.as_ref().and_then(|f| f.target(&req));
        let (Some(target), Some(forwarder)) = (target, self.forwarder.clone()) else {
            return Box::pin(self.inner.call(req));
        };
        // The service made ready is the one that may serve it here.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let path = req.uri().path().to_string();
            let req = if may_be_stale(&path) {
                let grpc = is_grpc(&req);
                let (parts, body) = req.into_parts();
                let bytes =
                    match axum::body::to_bytes(axum::body::Body::new(body), MAX_PEEK_BYTES).await {
                        Ok(bytes) => bytes,
                        Err(e) => {
                            let status = tonic::Status::out_of_range(format!(
                                "cannot read the request (at most {} bytes): {e}",
                                crate::MAX_MESSAGE_BYTES
                            ));
                            return Ok(if grpc {
                                status.into_http()
                            } else {
                                super::http::status_response(&status).map(Body::new)
                            });
                        }
                    };
                let stale = asks_stale(&path, grpc, &bytes);
                let req = Request::from_parts(parts, Body::new(axum::body::Body::from(bytes)));
                if stale {
                    return inner.call(req).await;
                }
                req
            } else {
                req
            };
            Ok(forwarder.forward(target, req).await)
        })
    }
}

/// Counts a forwarded request against its connection until its answer
/// has been passed on (or dropped).
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(count: Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        InFlight(count)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The leader's answer body, counted while it streams.
struct Counted {
    body: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Counted {
    type Data = axum::body::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_and_cluster_methods_are_forwarded_except_status() {
        for path in [
            "/raftlock.v1.Locks/Acquire",
            "/raftlock.v1.Locks/KeepAlive",
            "/raftlock.v1.Cluster/Members",
            "/raftlock.v1.Cluster/Backup",
            "/v1/locks/Lock",
            "/v1/cluster/RevokeSession",
        ] {
            assert!(forwardable(path), "{path}");
        }
        for path in [
            "/raftlock.v1.Cluster/Status",
            "/v1/cluster/Status",
            "/raftlock.v1.Raft/AppendEntries",
            "/grpc.health.v1.Health/Check",
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            "/metrics",
            "/v1/other",
        ] {
            assert!(!forwardable(path), "{path}");
        }
    }

    #[test]
    fn stale_reads_are_read_from_their_body() {
        use prost::Message as _;
        use raftlock_proto::v1 as pb;
        let framed = |m: Vec<u8>| {
            let mut b = vec![0];
            b.extend_from_slice(&(m.len() as u32).to_be_bytes());
            b.extend_from_slice(&m);
            b
        };
        let stale = framed(
            pb::DescribeRequest {
                name: "a".into(),
                stale: true,
            }
            .encode_to_vec(),
        );
        let fresh = framed(
            pb::DescribeRequest {
                name: "a".into(),
                stale: false,
            }
            .encode_to_vec(),
        );
        assert!(asks_stale("/raftlock.v1.Locks/Describe", true, &stale));
        assert!(!asks_stale("/raftlock.v1.Locks/Describe", true, &fresh));
        // Compressed (flag 1): not looked into, forwarded.
        let mut compressed = stale.clone();
        compressed[0] = 1;
        assert!(!asks_stale(
            "/raftlock.v1.Locks/Describe",
            true,
            &compressed
        ));
        assert!(asks_stale(
            "/v1/locks/List",
            false,
            br#"{"prefix":"a","stale":true}"#
        ));
        assert!(!asks_stale("/v1/locks/List", false, br#"{"prefix":"a"}"#));
        assert!(!asks_stale("/v1/locks/List", false, b"not json"));
        assert!(may_be_stale("/v1/locks/CheckFence"));
        assert!(!may_be_stale("/v1/locks/Acquire"));
    }
}
