//! Connections, leader discovery and retries.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use raftlock_proto::v1 as pb;
use raftlock_proto::v1::cluster_client::ClusterClient;
use raftlock_proto::v1::locks_client::LocksClient;
use rand::RngExt;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status};

use crate::error::{Error, Result};
use crate::keepalive;
use crate::session::{Session, SessionOptions};
use crate::types::{
    members, Backup, Fence, LockInfo, Member, NodeStatus, Restored, Role, WatchEvent, WatchStream,
};

/// Metadata key in which a follower names the leader's address.
pub use raftlock_proto::LEADER_ADDR_KEY;
use raftlock_proto::NOT_LEADER_KEY;

/// Tuning for a [`Client`].
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// How long one attempt of a request may take (blocking acquires get
    /// their own timeout on top).
    pub request_timeout: Duration,
    /// How long a request keeps retrying across leader changes and
    /// unreachable nodes before it gives up.
    pub retry_deadline: Duration,
    /// First retry delay; doubles up to `max_backoff`, with jitter.
    pub initial_backoff: Duration,
    /// Longest retry delay.
    pub max_backoff: Duration,
    /// TCP connect timeout per node.
    pub connect_timeout: Duration,
    /// TLS towards the nodes (`None`: plaintext).
    pub tls: Option<ClientTls>,
    /// Bearer token sent with every request, for clusters with access
    /// control on (`None`: no token; with mTLS the certificate's CN is the
    /// identity then).
    pub token: Option<String>,
}

/// TLS settings of a client, PEM-encoded.
#[derive(Clone, Debug)]
pub struct ClientTls {
    /// The CA that signed the nodes' certificates.
    pub ca_pem: Vec<u8>,
    /// This client's certificate and key, for clusters that require client
    /// certificates (mTLS).
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            request_timeout: Duration::from_secs(5),
            retry_deadline: Duration::from_secs(15),
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(200),
            connect_timeout: Duration::from_millis(500),
            tls: None,
            token: None,
        }
    }
}

/// A handle to a raftlock cluster. Cheap to clone; clones share
/// connections and the leader guess.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

/// A connection to one node, with the client's credentials attached to
/// every request.
pub(crate) type Conn = InterceptedService<Channel, Credentials>;

/// Adds `authorization: Bearer TOKEN` to every request, if there is a token.
#[derive(Clone)]
pub(crate) struct Credentials(Option<MetadataValue<Ascii>>);

impl Interceptor for Credentials {
    fn call(
        &mut self,
        mut req: tonic::Request<()>,
    ) -> std::result::Result<tonic::Request<()>, Status> {
        if let Some(value) = &self.0 {
            req.metadata_mut().insert("authorization", value.clone());
        }
        Ok(req)
    }
}

pub(crate) struct Inner {
    endpoints: Vec<String>,
    pub(crate) options: ClientOptions,
    credentials: Credentials,
    channels: Mutex<HashMap<String, Conn>>,
    /// Best guess of the leader's address.
    leader: Mutex<Option<String>>,
    /// Next endpoint to try when the leader is unknown.
    next: Mutex<usize>,
    /// The keep-alive multiplexer, started with the first keep-alive.
    keep_alives: OnceLock<mpsc::UnboundedSender<keepalive::Ask>>,
}

/// Whether a request changes state. Every mutating request raftlock sends
/// carries a (session, seq) pair or a nonce, so it is safe to resend; the
/// difference is only in how a final timeout is reported.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Read,
    Write,
}

impl Client {
    /// Connects to a cluster given some of its nodes' addresses
    /// (`host:port`). Nothing is dialled until the first request.
    pub async fn connect<I, S>(endpoints: I) -> Result<Client>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_options(endpoints, ClientOptions::default())
    }

    /// Like [`connect`](Self::connect), with options.
    pub fn with_options<I, S>(endpoints: I, options: ClientOptions) -> Result<Client>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let endpoints: Vec<String> = endpoints
            .into_iter()
            .map(Into::into)
            .map(|e| e.trim().trim_start_matches("http://").to_string())
            .filter(|e| !e.is_empty())
            .collect();
        if endpoints.is_empty() {
            return Err(Error::Config("no endpoints given".into()));
        }
        let credentials = match &options.token {
            None => Credentials(None),
            Some(token) => {
                let token = token.trim();
                if token.is_empty() || token.contains(char::is_whitespace) {
                    return Err(Error::Config(
                        "the token must be non-empty and contain no spaces".into(),
                    ));
                }
                let value = format!("Bearer {token}")
                    .parse()
                    .map_err(|_| Error::Config("the token must be printable ASCII".into()))?;
                Credentials(Some(value))
            }
        };
        Ok(Client {
            inner: Arc::new(Inner {
                endpoints,
                options,
                credentials,
                channels: Mutex::new(HashMap::new()),
                leader: Mutex::new(None),
                next: Mutex::new(0),
                keep_alives: OnceLock::new(),
            }),
        })
    }

    /// The endpoints this client was given.
    pub fn endpoints(&self) -> &[String] {
        &self.inner.endpoints
    }

    /// The options in force.
    pub fn options(&self) -> &ClientOptions {
        &self.inner.options
    }

    fn channel(&self, addr: &str) -> Result<Conn> {
        let mut channels = self.inner.channels.lock().expect("channels lock poisoned");
        if let Some(c) = channels.get(addr) {
            return Ok(c.clone());
        }
        let scheme = if self.inner.options.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| Error::Config(format!("bad endpoint {addr:?}: {e}")))?;
        if let Some(tls) = &self.inner.options.tls {
            let mut config =
                ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
            if let Some((cert, key)) = &tls.identity {
                config = config.identity(Identity::from_pem(cert, key));
            }
            endpoint = endpoint
                .tls_config(config)
                .map_err(|e| Error::Config(format!("TLS towards {addr:?}: {e}")))?;
        }
        let channel = endpoint
            .connect_timeout(self.inner.options.connect_timeout)
            .tcp_nodelay(true)
            // Notice a dead or cut-off node even while a wait is parked.
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true)
            .connect_lazy();
        let channel = InterceptedService::new(channel, self.inner.credentials.clone());
        channels.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }

    /// The address to try next: the known leader, else the next endpoint.
    fn target(&self) -> String {
        if let Some(l) = self
            .inner
            .leader
            .lock()
            .expect("leader lock poisoned")
            .clone()
        {
            return l;
        }
        let mut next = self.inner.next.lock().expect("next lock poisoned");
        let addr = self.inner.endpoints[*next % self.inner.endpoints.len()].clone();
        *next += 1;
        addr
    }

    fn forget_leader(&self, addr: &str) {
        let mut leader = self.inner.leader.lock().expect("leader lock poisoned");
        if leader.as_deref() == Some(addr) {
            *leader = None;
        }
    }

    fn set_leader(&self, addr: String) {
        *self.inner.leader.lock().expect("leader lock poisoned") = Some(addr);
    }

    /// A stream to the leader failed with `status`: follow its leader hint,
    /// else forget the leader.
    pub(crate) fn stream_failed(&self, status: &Status) {
        let hint = status
            .metadata()
            .get(LEADER_ADDR_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        *self.inner.leader.lock().expect("leader lock poisoned") = hint;
    }

    /// Renews `session`'s lease through the client's one keep-alive stream;
    /// gives up at `deadline`.
    pub(crate) async fn keep_alive(
        &self,
        session: u64,
        deadline: Instant,
    ) -> Result<pb::KeepAliveResponse> {
        let asks = self
            .inner
            .keep_alives
            .get_or_init(|| keepalive::start(Arc::downgrade(&self.inner)));
        let (reply, answer) = oneshot::channel();
        asks.send(keepalive::Ask {
            session,
            deadline,
            reply,
        })
        .map_err(|_| Error::Internal("the keep-alive multiplexer stopped".into()))?;
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(Error::Internal(
                "the keep-alive multiplexer dropped an ask".into(),
            )),
            Err(_) => Err(Error::Unavailable(format!(
                "no keep-alive answer for session {session} in time"
            ))),
        }
    }

    /// Runs `f` against the leader, following leader hints and retrying
    /// transient failures with jittered exponential backoff until
    /// `deadline`. Never sleeps past the deadline: if the next delay would
    /// end after it, it gives up at once.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        kind: Kind,
        attempt_timeout: Duration,
        deadline: Instant,
        mut f: F,
    ) -> Result<T>
    where
        F: FnMut(Conn) -> Fut,
        Fut: Future<Output = std::result::Result<T, Status>>,
    {
        let opts = &self.inner.options;
        let mut backoff = opts.initial_backoff;
        let mut sent = false;
        let mut last: Option<Error> = None;
        let mut hops = 0;
        loop {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let addr = self.target();
            let channel = self.channel(&addr)?;
            let budget = attempt_timeout.min(deadline - now);
            let outcome = tokio::time::timeout(budget, f(channel)).await;
            let status = match outcome {
                Ok(Ok(v)) => {
                    self.set_leader(addr);
                    return Ok(v);
                }
                Ok(Err(status)) => status,
                Err(_) => {
                    // Timed out after sending: for a write we cannot know
                    // whether it was applied.
                    sent |= kind == Kind::Write;
                    self.forget_leader(&addr);
                    last = Some(Error::Unavailable(format!(
                        "{addr} did not answer within {budget:?}"
                    )));
                    self.sleep_or_give_up(&mut backoff, deadline).await?;
                    continue;
                }
            };
            match status.code() {
                Code::Unavailable => {
                    let hint = status
                        .metadata()
                        .get(LEADER_ADDR_KEY)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    // A transport failure may have happened after the
                    // request left; a "not the leader" answer never does.
                    let not_leader = status.metadata().get(NOT_LEADER_KEY).is_some();
                    if !not_leader {
                        sent |= kind == Kind::Write;
                    }
                    last = Some(Error::from_status(&status, false));
                    match hint {
                        Some(leader) if leader != addr && hops < 3 => {
                            hops += 1;
                            self.set_leader(leader);
                            continue;
                        }
                        _ => {
                            hops = 0;
                            self.forget_leader(&addr);
                        }
                    }
                }
                Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
                    sent |= kind == Kind::Write;
                    self.forget_leader(&addr);
                    last = Some(Error::from_status(&status, sent));
                }
                // A failure of this side's transport (an HTTP/2 protocol
                // error on a connection the node dropped, say) arrives as a
                // status with an error source; the node never answered, so
                // it is not the node's word: retry elsewhere, the request
                // may have been sent.
                _ if std::error::Error::source(&status).is_some() => {
                    sent |= kind == Kind::Write;
                    self.forget_leader(&addr);
                    last = Some(Error::Unavailable(format!(
                        "{addr}: transport failure: {status}"
                    )));
                }
                _ => return Err(Error::from_status(&status, sent)),
            }
            self.sleep_or_give_up(&mut backoff, deadline).await?;
        }
        let reason = last
            .map(|e| e.to_string())
            .unwrap_or_else(|| "deadline reached".into());
        Err(if sent {
            Error::Unknown(reason)
        } else {
            Error::Unavailable(reason)
        })
    }

    async fn sleep_or_give_up(&self, backoff: &mut Duration, deadline: Instant) -> Result<()> {
        let jitter = rand::rng().random_range(0.5..1.5);
        let delay =
            Duration::try_from_secs_f64(backoff.as_secs_f64() * jitter).unwrap_or(Duration::MAX);
        *backoff = backoff
            .saturating_mul(2)
            .min(self.inner.options.max_backoff);
        if Instant::now()
            .checked_add(delay)
            .is_none_or(|end| end >= deadline)
        {
            // Sleeping would only end after the deadline: give up now.
            return Err(Error::Unavailable("retry deadline reached".into()));
        }
        tokio::time::sleep(delay).await;
        Ok(())
    }

    /// A `Locks` stub on a channel.
    pub(crate) fn locks(channel: Conn) -> LocksClient<Conn> {
        LocksClient::new(channel)
    }

    /// Runs a read-only or idempotent `Locks` call with the default
    /// deadline.
    pub(crate) async fn locks_call<T, F, Fut>(&self, kind: Kind, f: F) -> Result<T>
    where
        F: FnMut(LocksClient<Conn>) -> Fut,
        Fut: Future<Output = std::result::Result<T, Status>>,
    {
        let opts = &self.inner.options;
        let deadline = crate::session::after(opts.retry_deadline);
        let mut f = f;
        self.call(kind, opts.request_timeout, deadline, move |c| {
            f(Self::locks(c))
        })
        .await
    }

    /// Opens a session with `ttl` (and no lock-delay).
    pub async fn session(&self, ttl: Duration) -> Result<Session> {
        Session::open(
            self.clone(),
            SessionOptions {
                ttl,
                ..SessionOptions::default()
            },
        )
        .await
    }

    /// Opens a session with options.
    pub async fn session_with(&self, options: SessionOptions) -> Result<Session> {
        Session::open(self.clone(), options).await
    }

    /// Asks the cluster whether `fence` belongs to a current holder of
    /// `name` (linearizable).
    pub async fn check_fence(&self, name: &str, fence: Fence) -> Result<bool> {
        let req = pb::CheckFenceRequest {
            name: name.to_string(),
            fence: fence.get(),
            stale: false,
        };
        let resp = self
            .locks_call(Kind::Read, |mut c| {
                let req = req.clone();
                async move { c.check_fence(req).await }
            })
            .await?;
        Ok(resp.into_inner().current)
    }

    /// Describes `name` (linearizable); `None` if nobody holds, waits for or
    /// delays it.
    pub async fn describe(&self, name: &str) -> Result<Option<LockInfo>> {
        let req = pb::DescribeRequest {
            name: name.to_string(),
            stale: false,
        };
        let resp = self
            .locks_call(Kind::Read, |mut c| {
                let req = req.clone();
                async move { c.describe(req).await }
            })
            .await?
            .into_inner();
        resp.info
            .filter(|_| resp.exists)
            .map(LockInfo::try_from)
            .transpose()
    }

    /// Lists names with `prefix`, following pages to the end.
    pub async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let mut out = Vec::new();
        let mut token = String::new();
        loop {
            let req = pb::ListRequest {
                prefix: prefix.to_string(),
                page_token: token.clone(),
                limit: 0,
                stale: false,
            };
            let page = self
                .locks_call(Kind::Read, |mut c| {
                    let req = req.clone();
                    async move { c.list(req).await }
                })
                .await?
                .into_inner();
            for info in page.locks {
                out.push(LockInfo::try_from(info)?);
            }
            if page.next_page_token.is_empty() {
                return Ok(out);
            }
            token = page.next_page_token;
        }
    }

    /// Streams events for `name` (exact) or, if `prefix` is true, for every
    /// name starting with it. Served by whichever node answers; events carry
    /// the log index that caused them. The stream ends with an error when
    /// the node serving it stops (watch again to resume).
    pub async fn watch(&self, name: &str, prefix: bool) -> Result<WatchStream> {
        let req = if prefix {
            pb::WatchRequest {
                name: String::new(),
                prefix: name.to_string(),
            }
        } else {
            pb::WatchRequest {
                name: name.to_string(),
                prefix: String::new(),
            }
        };
        let resp = self
            .locks_call(Kind::Read, |mut c| {
                let req = req.clone();
                async move { c.watch(req).await }
            })
            .await?;
        Ok(resp
            .into_inner()
            .map(|e| match e {
                Ok(e) => WatchEvent::try_from(e),
                Err(status) => Err(Error::from_status(&status, false)),
            })
            .boxed())
    }

    /// The status of the node at `addr` (not necessarily the leader).
    pub async fn node_status(&self, addr: &str) -> Result<NodeStatus> {
        let mut c = ClusterClient::new(self.channel(addr)?);
        let resp = tokio::time::timeout(
            self.inner.options.request_timeout,
            c.status(pb::StatusRequest {}),
        )
        .await
        .map_err(|_| Error::Unavailable(format!("{addr} did not answer")))?
        .map_err(|s| Error::from_status(&s, false))?;
        Ok(resp.into_inner().into())
    }

    /// Runs a `Cluster` call against the leader.
    pub(crate) async fn cluster_call<T, F, Fut>(
        &self,
        kind: Kind,
        timeout: Duration,
        f: F,
    ) -> Result<T>
    where
        F: FnMut(ClusterClient<Conn>) -> Fut,
        Fut: Future<Output = std::result::Result<T, Status>>,
    {
        let deadline = crate::session::after(self.inner.options.retry_deadline.max(timeout));
        let mut f = f;
        self.call(kind, timeout, deadline, move |c| f(ClusterClient::new(c)))
            .await
    }

    /// The status of the leader.
    pub async fn status(&self) -> Result<NodeStatus> {
        // Status answers on any node; ask until one that knows a leader
        // answers, then ask the leader itself.
        let any = self
            .cluster_call(
                Kind::Read,
                self.inner.options.request_timeout,
                |mut c| async move { c.status(pb::StatusRequest {}).await },
            )
            .await?
            .into_inner();
        if any.leader_addr.is_empty() || any.leader_addr == any.addr {
            return Ok(any.into());
        }
        let leader = any.leader_addr.clone();
        self.node_status(&leader).await.or(Ok(any.into()))
    }

    /// The current members, as the leader sees them (a follower, or a node
    /// that was removed, may know an older membership).
    pub async fn members(&self) -> Result<Vec<Member>> {
        let status = self.status().await?;
        if status.role != Role::Leader {
            return Err(Error::Unavailable(
                "no leader to ask for the membership".into(),
            ));
        }
        Ok(status.members)
    }

    /// Adds node `id` at `addr` (learner, catch-up, then voter unless
    /// `learner_only`). Waits until done.
    pub async fn add_node(&self, id: u64, addr: &str, learner_only: bool) -> Result<Vec<Member>> {
        self.add_node_with_peer_addr(id, addr, None, learner_only)
            .await
    }

    /// Like [`add_node`](Self::add_node), for a node that serves peers on a
    /// separate `peer_addr` (`raftlockd run --peer-listen`).
    pub async fn add_node_with_peer_addr(
        &self,
        id: u64,
        addr: &str,
        peer_addr: Option<&str>,
        learner_only: bool,
    ) -> Result<Vec<Member>> {
        let req = pb::AddNodeRequest {
            id,
            addr: addr.to_string(),
            peer_addr: peer_addr.unwrap_or_default().to_string(),
            learner_only,
            catch_up_timeout_ms: 0,
        };
        let timeout = Duration::from_secs(60);
        let resp = self
            .cluster_call(Kind::Write, timeout, |mut c| {
                let req = req.clone();
                async move { c.add_node(req).await }
            })
            .await?;
        Ok(members(resp.into_inner().members))
    }

    /// A consistent backup of the lock table, read on the leader.
    pub async fn backup(&self) -> Result<Backup> {
        let timeout = Duration::from_secs(60);
        let resp = self
            .cluster_call(Kind::Read, timeout, |mut c| async move {
                c.backup(pb::BackupRequest {}).await
            })
            .await?;
        Ok(resp.into_inner().into())
    }

    /// Restores a backup into an empty cluster, raising its fence counter
    /// by the default bump (2^32; see [`restore_with`](Self::restore_with)).
    pub async fn restore(&self, snapshot: Vec<u8>) -> Result<Restored> {
        self.restore_with(snapshot, None).await
    }

    /// Restores a backup into an empty cluster, raising its fence counter
    /// by `fence_bump` (`None`: the server's default, 2^32). The bump must
    /// exceed the number of grants the backup's cluster made after the
    /// backup was taken, or stores may see a fence twice.
    pub async fn restore_with(
        &self,
        snapshot: Vec<u8>,
        fence_bump: Option<u64>,
    ) -> Result<Restored> {
        let timeout = Duration::from_secs(60);
        let req = pb::RestoreRequest {
            snapshot,
            fence_bump,
        };
        let resp = self
            .cluster_call(Kind::Write, timeout, |mut c| {
                let req = req.clone();
                async move { c.restore(req).await }
            })
            .await?;
        Ok(resp.into_inner().into())
    }

    /// Removes node `id`.
    pub async fn remove_node(&self, id: u64) -> Result<Vec<Member>> {
        let timeout = Duration::from_secs(30);
        let resp = self
            .cluster_call(Kind::Write, timeout, |mut c| async move {
                c.remove_node(pb::RemoveNodeRequest { id }).await
            })
            .await?;
        Ok(members(resp.into_inner().members))
    }
}
