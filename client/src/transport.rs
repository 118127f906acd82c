//! The transport: connections to the nodes, the client's credentials, the
//! guess of who leads, and `call`, which runs a request against the leader
//! with retries, backoff and a deadline. It knows nothing of sessions,
//! locks or keep-alives; everything else in the crate sends through it.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use raftlock_proto::v1::cluster_client::ClusterClient;
use raftlock_proto::v1::locks_client::LocksClient;
use raftlock_proto::{LEADER_ADDR_KEY, NOT_LEADER_KEY};
use rand::RngExt;
use tokio::time::Instant;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status};

use crate::error::{Error, Result};

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
    pub address_map: HashMap<String, String>,
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
            address_map: HashMap::new(),
        }
    }
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

/// Whether a request changes state. Every mutating request raftlock sends
/// carries a (session, seq) pair or a nonce, so it is safe to resend; the
/// difference is only in how a final timeout is reported.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Read,
    Write,
}

/// How many times in a row every endpoint must refuse the connection before
/// a call gives up without waiting for its deadline: nothing listens there
/// (a node being restarted is back within a round or two of backoff).
pub const REFUSED_ROUNDS: u32 = 3;

/// The nodes a call tried, each with its last error, in the order first
/// tried.
#[derive(Default)]
struct Tried {
    nodes: Vec<(String, String)>,
    /// Refused connections in a row, per address (reset by any other
    /// outcome anywhere).
    refused: HashMap<String, u32>,
}

impl Tried {
    fn note(&mut self, addr: &str, why: String, refused: bool) {
        match self.nodes.iter_mut().find(|(a, _)| a == addr) {
            Some((_, last)) => *last = why,
            None => self.nodes.push((addr.to_string(), why)),
        }
        if refused {
            *self.refused.entry(addr.to_string()).or_default() += 1;
        } else {
            self.refused.clear();
        }
    }

    fn refused_everywhere(&self, endpoints: &[String]) -> bool {
        endpoints
            .iter()
            .all(|e| self.refused.get(e).is_some_and(|n| *n >= REFUSED_ROUNDS))
    }

    fn summary(&self) -> String {
        if self.nodes.is_empty() {
            return "no attempt fitted in the deadline".into();
        }
        self.nodes
            .iter()
            .map(|(addr, why)| format!("{addr}: {why}"))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// The errors under `status`, innermost last.
fn sources(status: &Status) -> Vec<&(dyn std::error::Error + 'static)> {
    let mut out = Vec::new();
    let mut next = std::error::Error::source(status);
    while let Some(e) = next {
        out.push(e);
        next = e.source();
    }
    out
}

/// Whether `status` is a refused TCP connection (nothing listens there).
fn connection_refused(status: &Status) -> bool {
    sources(status).iter().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
    })
}

/// `status` in words a person can act on: a refused connection, the
/// innermost transport error (a TLS handshake's, say), or the message.
fn describe(status: &Status) -> String {
    if connection_refused(status) {
        return "connection refused".into();
    }
    match sources(status).last() {
        Some(inner) => inner.to_string(),
        None => format!("{:?}: {}", status.code(), status.message()),
    }
}

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
    channels: Mutex<HashMap<String, Conn>>,
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
                channels: Mutex::new(HashMap::new()),
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
        let channel = endpoint
            .connect_timeout(options.connect_timeout)
            .tcp_nodelay(true)
            // Notice a dead or cut-off node even while a wait is parked.
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true)
            .connect_lazy();
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
    {
        let opts = &self.state.options;
        let started = Instant::now();
        let mut backoff = opts.initial_backoff;
        let mut sent = false;
        let mut tried = Tried::default();
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
                    tried.note(&addr, format!("did not answer within {budget:?}"), false);
                    if !self.sleep(&mut backoff, deadline).await {
                        break;
                    }
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
                    // request left; a "not the leader" answer never does,
                    // and neither does a refused connection.
                    let not_leader = status.metadata().get(NOT_LEADER_KEY).is_some();
                    let refused = connection_refused(&status);
                    if !not_leader && !refused {
                        sent |= kind == Kind::Write;
                    }
                    let why = match (&hint, not_leader) {
                        (Some(leader), true) => format!("not the leader (the leader is {leader})"),
                        (None, true) => "not the leader, and knows no leader".into(),
                        _ => describe(&status),
                    };
                    tried.note(&addr, why, refused);
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
                    if tried.refused_everywhere(self.endpoints()) {
                        return Err(Error::Unavailable(format!(
                            "no node accepts connections ({} refused every attempt): {}",
                            if self.endpoints().len() == 1 {
                                "it"
                            } else {
                                "each"
                            },
                            tried.summary()
                        )));
                    }
                }
                Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
                    sent |= kind == Kind::Write;
                    self.forget_leader(&addr);
                    tried.note(&addr, describe(&status), false);
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
                        false,
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
        let jitter = rand::rng().random_range(0.5..1.5);
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
    {
        let opts = &self.state.options;
        let deadline = after(opts.retry_deadline);
        let mut f = f;
        self.call(kind, opts.request_timeout, deadline, move |c| {
            f(LocksClient::new(c))
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
    {
        let deadline = after(self.state.options.retry_deadline.max(timeout));
        let mut f = f;
        self.call(kind, timeout, deadline, move |c| f(ClusterClient::new(c)))
            .await
    }
}
