//! The transport: connections to the nodes, the client's credentials, the
//! guess of who leads, and `call`, which runs a request against the leader
//! with retries, backoff and a deadline. It knows nothing of sessions,
//! locks or keep-alives; everything else in the crate sends through it.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use raftlock_proto::v1::cluster_client::ClusterClient;
use raftlock_proto::v1::locks_client::LocksClient;
use raftlock_proto::{LEADER_ADDR_KEY, NOT_LEADER_KEY};
use tokio::time::Instant;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status};

use crate::error::{Error, Result};
use diagnose::{connection_refused, describe, name_unresolved, Hopeless, Tried};

mod diagnose;

/// The largest message the client sends or takes, either way: a node's own
/// limit for its largest answer, a backup (`MAX_BACKUP_BYTES` in
/// `raftlock-node`, 1 GiB). gRPC's default of 4 MiB would refuse a backup
/// of about 29,000 held locks, or a `List` page of many large values.
pub const MAX_MESSAGE_BYTES: usize = 1 << 30;

/// A `Locks` stub on `c` with the client's message limits.
pub(crate) fn locks_client(c: Conn) -> LocksClient<Conn> {
    LocksClient::new(c)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

/// A `Cluster` stub on `c` with the client's message limits.
pub(crate) fn cluster_client(c: Conn) -> ClusterClient<Conn> {
    ClusterClient::new(c)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

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
    /// Addresses to dial instead of the ones the cluster announces, for a
    /// client that reaches the nodes through NAT or proxies: a node's
    /// announced address (its `--advertise`, as leader hints and `Status`
    /// name it) maps to the address this client can reach it at. An
    /// address not in the map, endpoints included, is dialled as it is.
    #[allow(clippy::disallowed_types)]
    // public since 0.1; looked up (and printed by Debug), never walked to decide
    pub address_map: std::collections::HashMap<String, String>,
    /// Dial nodes over this transport instead of TCP (`None`: TCP). For
    /// simulators and tests; see [`Connector`](crate::Connector).
    pub connector: Option<crate::connector::Connector>,
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
            address_map: Default::default(),
            connector: None,
        }
    }
}

/// A connection to one node, with the client's credentials attached to
/// every request.
pub(crate) type Conn = InterceptedService<Channel, Credentials>;

/// The leader an answer names: a follower that forwarded the request to
/// the leader adds its address (metadata `raftlock-leader`).
pub(crate) trait LeaderHint {
    /// The leader's address, if the answer names one.
    fn leader_hint(&self) -> Option<String>;
}

impl<T> LeaderHint for tonic::Response<T> {
    fn leader_hint(&self) -> Option<String> {
        self.metadata()
            .get(LEADER_ADDR_KEY)
            .and_then(|v| v.to_str().ok())
            .filter(|a| !a.is_empty())
            .map(str::to_string)
    }
}

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

/// Whether a request changes state. Every mutating request raftlock sends
/// carries a (session, seq) pair or a nonce, so it is safe to resend; the
/// difference is only in how a final timeout is reported.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Read,
    Write,
}

/// How many times in a row every endpoint must refuse the connection (or
/// not resolve, or fail the TLS handshake, or turn out to speak TLS to a
/// plaintext client)
/// before a call gives up without waiting for its deadline: nothing that
/// can serve this client listens there (a node being restarted is back
/// within a round or two of backoff).
pub const REFUSED_ROUNDS: u32 = 3;

/// The instant `d` from now, or about a century from now if that is
/// further (or overflows the clock): "no deadline" without a panic.
pub(crate) fn after(d: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    let now = Instant::now();
    now.checked_add(d.min(FAR)).unwrap_or(now)
}

/// Connections and the leader guess, shared by every clone of a client and
/// everything it made. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Transport {
    state: Arc<State>,
}

/// A transport that does not keep the client alive (for background tasks
/// that must end when the client is dropped).
#[derive(Clone)]
pub(crate) struct WeakTransport(Weak<State>);

impl WeakTransport {
    /// The transport, if a client still holds it.
    pub(crate) fn upgrade(&self) -> Option<Transport> {
        self.0.upgrade().map(|state| Transport { state })
    }
}

struct State {
    endpoints: Vec<String>,
    options: ClientOptions,
    credentials: Credentials,
    channels: Mutex<BTreeMap<String, Conn>>,
    /// Best guess of the leader's address.
    leader: Mutex<Option<String>>,
    /// Next endpoint to try when the leader is unknown.
    next: Mutex<usize>,
}

impl Transport {
    /// A transport to the nodes at `endpoints` (`host:port`); nothing is
    /// dialled until the first request.
    pub(crate) fn new<I, S>(endpoints: I, options: ClientOptions) -> Result<Transport>
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
        Ok(Transport {
            state: Arc::new(State {
                endpoints,
                options,
                credentials,
                channels: Mutex::new(BTreeMap::new()),
                leader: Mutex::new(None),
                next: Mutex::new(0),
            }),
        })
    }

    /// A handle that does not keep the transport alive.
    pub(crate) fn downgrade(&self) -> WeakTransport {
        WeakTransport(Arc::downgrade(&self.state))
    }

    /// The endpoints given.
    pub(crate) fn endpoints(&self) -> &[String] {
        &self.state.endpoints
    }

    /// The options in force.
    pub(crate) fn options(&self) -> &ClientOptions {
        &self.state.options
    }

    /// The (cached, lazily dialled) connection to `addr`.
    pub(crate) fn channel(&self, addr: &str) -> Result<Conn> {
        let mut channels = self.state.channels.lock().expect("channels lock poisoned");
        if let Some(c) = channels.get(addr) {
            return Ok(c.clone());
        }
        let options = &self.state.options;
        let scheme = if options.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let dial = options.address_map.get(addr).map_or(addr, String::as_str);
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{dial}"))
            .map_err(|e| Error::Config(format!("bad endpoint {dial:?}: {e}")))?;
        if let Some(tls) = &options.tls {
            let mut config =
                ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
            if let Some((cert, key)) = &tls.identity {
                config = config.identity(Identity::from_pem(cert, key));
            }
            endpoint = endpoint
                .tls_config(config)
                .map_err(|e| Error::Config(format!("TLS towards {addr:?}: {e}")))?;
        }
        let endpoint = endpoint
            .connect_timeout(options.connect_timeout)
            .tcp_nodelay(true)
            // Notice a dead or cut-off node even while a wait is parked.
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        let channel = match &options.connector {
            None => endpoint.connect_lazy(),
            Some(connector) => connector.channel(&endpoint),
        };
        let channel = InterceptedService::new(channel, self.state.credentials.clone());
        channels.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }

    /// The address to try next: the known leader, else the next endpoint.
    fn target(&self) -> String {
        if let Some(l) = self
            .state
            .leader
            .lock()
            .expect("leader lock poisoned")
            .clone()
        {
            return l;
        }
        let mut next = self.state.next.lock().expect("next lock poisoned");
        let addr = self.state.endpoints[*next % self.state.endpoints.len()].clone();
        *next += 1;
        addr
    }

    fn forget_leader(&self, addr: &str) {
        let mut leader = self.state.leader.lock().expect("leader lock poisoned");
        if leader.as_deref() == Some(addr) {
            *leader = None;
        }
    }

    fn set_leader(&self, addr: String) {
        *self.state.leader.lock().expect("leader lock poisoned") = Some(addr);
    }

    /// A stream to the leader failed with `status`: follow its leader hint,
    /// else forget the leader.
    pub(crate) fn stream_failed(&self, status: &Status) {
        let hint = status
            .metadata()
            .get(LEADER_ADDR_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        *self.state.leader.lock().expect("leader lock poisoned") = hint;
    }

    /// Runs `f` against the leader, following leader hints and retrying
    /// transient failures with jittered exponential backoff until
    /// `deadline`. Never sleeps past the deadline: if the next delay would
    /// end after it, it gives up at once. When every endpoint has refused
    /// the connection [`REFUSED_ROUNDS`] times in a row (nothing listens
    /// there), it gives up without waiting for the deadline. A failure
    /// names every node tried and its last error.
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
        T: LeaderHint,
    {
        let opts = &self.state.options;
        let started = Instant::now();
        let mut backoff = opts.initial_backoff;
        let mut sent = false;
        let mut tried = Tried::default();
        let mut hops = 0;
        // Endpoints that answered UNIMPLEMENTED in this call.
        let mut unserved: Vec<String> = Vec::new();
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
                    // A follower forwards to the leader and names it in
                    // the answer: go there directly from now on.
                    self.set_leader(v.leader_hint().unwrap_or(addr));
                    return Ok(v);
                }
                Ok(Err(status)) => status,
                Err(_) => {
                    // Timed out after sending: for a write we cannot know
                    // whether it was applied.
                    sent |= kind == Kind::Write;
                    self.forget_leader(&addr);
                    tried.note(&addr, format!("did not answer within {budget:?}"), None);
                    if !self.sleep(&mut backoff, deadline).await {
                        break;
                    }
                    continue;
                }
            };
            // TLS in the way: a handshake that failed, or a node that
            // speaks TLS to this plaintext client. The request never left;
            // no retry can help until someone changes a certificate or a
            // setting, so these count like refused connections.
            if let Some(why) = self.tls_trouble(&status, &addr, &mut tried).await {
                self.forget_leader(&addr);
                tried.note(&addr, why, Some(Hopeless::Tls));
                if let Some(err) = self.give_up_if_hopeless(&tried) {
                    return Err(err);
                }
                if !self.sleep(&mut backoff, deadline).await {
                    break;
                }
                continue;
            }
            match status.code() {
                Code::Unavailable => {
                    let hint = status
                        .metadata()
                        .get(LEADER_ADDR_KEY)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    // A transport failure may have happened after the
                    // request left; a "not the leader" answer never does,
                    // and neither does a refused connection.
                    let not_leader = status.metadata().get(NOT_LEADER_KEY).is_some();
                    let refused = connection_refused(&status) || name_unresolved(&status);
                    if !not_leader && !refused {
                        sent |= kind == Kind::Write;
                    }
                    let why = match (&hint, not_leader) {
                        (Some(leader), true) => format!("not the leader (the leader is {leader})"),
                        (None, true) => "not the leader, and knows no leader".into(),
                        _ => describe(&status),
                    };
                    tried.note(&addr, why, refused.then_some(Hopeless::Refused));
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
                    if let Some(err) = self.give_up_if_hopeless(&tried) {
                        return Err(err);
                    }
                }
                Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
                    sent |= kind == Kind::Write;
                    self.forget_leader(&addr);
                    tried.note(&addr, describe(&status), None);
                }
                // Not a raftlock node, or one that does not serve this
                // call: another service on a dead node's port (a port taken
                // again), an older raftlock during an upgrade, an HTTP/2
                // server that is not gRPC (tonic maps its 404 here,
                // "grpc-status header missing"). Nothing was done there:
                // ask the others; once every endpoint has answered so, the
                // answer is theirs, at once.
                Code::Unimplemented => {
                    self.forget_leader(&addr);
                    tried.note(
                        &addr,
                        format!("does not serve this call: {}", describe(&status)),
                        None,
                    );
                    if !unserved.contains(&addr) {
                        unserved.push(addr.clone());
                    }
                    if self.endpoints().iter().all(|e| unserved.contains(e)) {
                        return Err(Error::from_status(&status, sent));
                    }
                    continue;
                }
                // A failure of this side's transport (an HTTP/2 protocol
                // error on a connection the node dropped, say) arrives as a
                // status with an error source; the node never answered, so
                // it is not the node's word: retry elsewhere, the request
                // may have been sent.
                _ if std::error::Error::source(&status).is_some() => {
                    sent |= kind == Kind::Write;
                    self.forget_leader(&addr);
                    tried.note(
                        &addr,
                        format!("transport failure: {}", describe(&status)),
                        None,
                    );
                }
                _ => return Err(Error::from_status(&status, sent)),
            }
            if !self.sleep(&mut backoff, deadline).await {
                break;
            }
        }
        let reason = format!(
            "no node could serve the request within {:.1?}: {}",
            started.elapsed(),
            tried.summary()
        );
        Err(if sent {
            Error::Unknown(reason)
        } else {
            Error::Unavailable(reason)
        })
    }

    /// Sleeps the next backoff delay; false, without sleeping, if that
    /// would end after `deadline`.
    async fn sleep(&self, backoff: &mut Duration, deadline: Instant) -> bool {
        let jitter = crate::random::in_range(0.5, 1.5);
        let delay =
            Duration::try_from_secs_f64(backoff.as_secs_f64() * jitter).unwrap_or(Duration::MAX);
        *backoff = backoff
            .saturating_mul(2)
            .min(self.state.options.max_backoff);
        if Instant::now()
            .checked_add(delay)
            .is_none_or(|end| end >= deadline)
        {
            return false;
        }
        tokio::time::sleep(delay).await;
        true
    }

    /// Runs a `Locks` call (read-only or idempotent) with the default
    /// attempt timeout and retry deadline.
    pub(crate) async fn locks_call<T, F, Fut>(&self, kind: Kind, f: F) -> Result<T>
    where
        F: FnMut(LocksClient<Conn>) -> Fut,
        Fut: Future<Output = std::result::Result<T, Status>>,
        T: LeaderHint,
    {
        let opts = &self.state.options;
        let deadline = after(opts.retry_deadline);
        let mut f = f;
        self.call(kind, opts.request_timeout, deadline, move |c| {
            f(locks_client(c))
        })
        .await
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
        T: LeaderHint,
    {
        let deadline = after(self.state.options.retry_deadline.max(timeout));
        let mut f = f;
        self.call(kind, timeout, deadline, move |c| f(cluster_client(c)))
            .await
    }
}
