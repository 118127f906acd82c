//! Raw gRPC access to one node, below the client library: how the harness
//! looks at a node (gRPC health, `Status`), and what the keep-alive prober
//! and the hostile peer speak. Channels are kept per address (tonic
//! reconnects a channel by itself after its node restarts).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use raftlock_proto::v1 as pb;
use raftlock_proto::v1::cluster_client::ClusterClient;
use raftlock_proto::v1::locks_client::LocksClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Channel, Endpoint};

/// How long a dial may take before the node counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// A lazily dialled channel to `addr` (`host:port`), shared by every
/// caller.
pub fn channel(addr: &str) -> Channel {
    static CHANNELS: OnceLock<Mutex<HashMap<String, Channel>>> = OnceLock::new();
    let mut channels = CHANNELS
        .get_or_init(Default::default)
        .lock()
        .expect("channels lock poisoned");
    channels
        .entry(addr.to_string())
        .or_insert_with(|| fresh_channel(addr))
        .clone()
}

/// A channel of its own to `addr` (a connection nobody else shares, for
/// streams whose fate must not depend on other callers). The harness's
/// own: with `--net netns` it leaves from the harness's address, which
/// cutting the clients off does not cut ([`crate::netns`]).
pub fn fresh_channel(addr: &str) -> Channel {
    let local = addr
        .parse::<std::net::SocketAddr>()
        .ok()
        .and_then(|a| crate::netns::local_address(a.ip()));
    endpoint(addr).local_address(local).connect_lazy()
}

/// A channel to `addr` for a client (the keep-alive probers): it leaves
/// from the clients' address, as the workers' do.
pub fn client_channel(addr: &str) -> Channel {
    endpoint(addr).connect_lazy()
}

fn endpoint(addr: &str) -> Endpoint {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("host:port is a valid URI")
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
}

/// Adds `authorization: Bearer TOKEN` when the cluster has access control.
#[derive(Clone, Default)]
pub struct Creds(Option<MetadataValue<Ascii>>);

impl Creds {
    /// Credentials with `token`, if any.
    pub fn new(token: Option<&str>) -> Creds {
        Creds(token.map(|t| format!("Bearer {t}").parse().expect("tokens are ASCII")))
    }
}

impl Interceptor for Creds {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// A channel with credentials.
pub type Conn = InterceptedService<Channel, Creds>;

/// A `Locks` stub on `channel`.
pub fn locks(channel: Channel, creds: &Creds) -> LocksClient<Conn> {
    LocksClient::with_interceptor(channel, creds.clone())
}

/// A `Cluster` stub on `channel`.
pub fn cluster(channel: Channel, creds: &Creds) -> ClusterClient<Conn> {
    ClusterClient::with_interceptor(channel, creds.clone())
}

/// What gRPC health (service `""`) says about the node at `addr`:
/// `Ok(true)` for `SERVING`, `Ok(false)` for anything else, `Err` if it did
/// not answer within `within`.
pub async fn serving(addr: &str, within: Duration) -> Result<bool, String> {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let mut health = HealthClient::new(channel(addr));
    let answer = tokio::time::timeout(
        within,
        health.check(HealthCheckRequest {
            service: String::new(),
        }),
    )
    .await
    .map_err(|_| format!("no health answer within {within:?}"))?
    .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
    Ok(answer.into_inner().status == ServingStatus::Serving as i32)
}

/// `Status` of the node at `addr`, within `within`.
pub async fn status(
    addr: &str,
    creds: &Creds,
    within: Duration,
) -> Result<pb::StatusResponse, String> {
    let mut c = cluster(channel(addr), creds);
    let answer = tokio::time::timeout(within, c.status(pb::StatusRequest {}))
        .await
        .map_err(|_| format!("no status answer within {within:?}"))?
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
    Ok(answer.into_inner())
}
