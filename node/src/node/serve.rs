//! The node's listeners: TLS termination per connection, Nagle off,
//! and the interceptors that check credentials from the headers.

use super::*;

/// The hosts this node is dialled at: its client address and, if any, its
/// peer address (without ports or IPv6 brackets).
pub(super) fn advertised_hosts(opts: &NodeOptions) -> Vec<&str> {
    fn host(addr: &str) -> &str {
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        host.trim_start_matches('[').trim_end_matches(']')
    }
    let mut hosts = vec![host(&opts.advertise)];
    if let Some(peer) = &opts.peer_advertise {
        if !hosts.contains(&host(peer)) {
            hosts.push(host(peer));
        }
    }
    hosts
}

/// Serves `router` on the connections `listener` accepts, over TLS with
/// the configuration in force when each arrives if `tls` is given, until
/// `shutdown`.
///
/// A custom transport's connections ([`Listener::Custom`]) are served
/// as they come (plaintext: TLS needs a TCP listener, which `start_with`
/// checks before anything is opened).
/// What the node's servers are: tonic's router under [`DeadlineLayer`] and
/// [`ForwardLayer`] (off on the peer port).
///
/// [`ForwardLayer`]: crate::api::forward::ForwardLayer
/// [`DeadlineLayer`]: crate::api::deadline::DeadlineLayer
type Router = tonic::transport::server::Router<
    tower::layer::util::Stack<
        crate::api::forward::ForwardLayer,
        tower::layer::util::Stack<
            crate::api::deadline::DeadlineLayer,
            tower::layer::util::Identity,
        >,
    >,
>;

pub(super) fn serve(
    router: Router,
    listener: Listener,
    tls: Option<Arc<crate::tls::NodeTls>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> futures::future::BoxFuture<'static, Result<(), tonic::transport::Error>> {
    use futures::FutureExt as _;
    match (listener, tls) {
        (Listener::Tcp(listener), None) => router
            .serve_with_incoming_shutdown(incoming(listener), shutdown)
            .boxed(),
        (Listener::Tcp(listener), Some(tls)) => router
            .serve_with_incoming_shutdown(tls_incoming(listener, tls), shutdown)
            .boxed(),
        (Listener::Custom(conns), _) => {
            router.serve_with_incoming_shutdown(conns, shutdown).boxed()
        }
    }
}

/// Longest a client may take over its TLS handshake.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS connections `listener` accepts (Nagle's algorithm off), each
/// with the server configuration in force when it arrived. Handshakes run
/// side by side, so a slow one holds up no other; a failed one is logged
/// (at most one line every [`TLS_FAILURE_LOG_EVERY`], with a count).
pub(super) fn tls_incoming(
    listener: TcpListener,
    tls: Arc<crate::tls::NodeTls>,
) -> impl futures::Stream<Item = std::io::Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>>
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let failures = Arc::new(FailureLog::default());
    tokio::spawn(async move {
        loop {
            // Ends (and closes the listener) once the server is gone.
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = tx.closed() => return,
            };
            let (conn, from) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, say: pause instead of
                    // spinning.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = conn.set_nodelay(true);
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.server_config());
            let (tx, failures) = (tx.clone(), failures.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(conn)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => failures.note(from, &e.to_string()),
                    Err(_) => failures.note(from, "the handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// At most one log line about failed TLS handshakes this often.
pub const TLS_FAILURE_LOG_EVERY: Duration = Duration::from_secs(10);

/// Failed TLS handshakes, logged sparingly: a client with the wrong CA or
/// without TLS retries many times a second.
#[derive(Default)]
struct FailureLog {
    /// When the last line was written, and the failures since.
    state: std::sync::Mutex<(Option<tokio::time::Instant>, u64)>,
}

impl FailureLog {
    fn note(&self, from: std::net::SocketAddr, error: &str) {
        let mut state = self.state.lock().expect("failure log lock poisoned");
        let now = tokio::time::Instant::now();
        if state
            .0
            .is_some_and(|at| now.duration_since(at) < TLS_FAILURE_LOG_EVERY)
        {
            state.1 += 1;
            return;
        }
        let suppressed = std::mem::take(&mut state.1);
        state.0 = Some(now);
        tracing::warn!(
            %from,
            error,
            suppressed,
            "a TLS handshake failed (the client may lack the CA, dial a name the certificate \
             does not carry, or speak plaintext); `suppressed` more failed since the last line"
        );
    }
}

/// The connections `listener` accepts, with Nagle's algorithm off.
///
/// tonic's `tcp_nodelay` applies only to listeners it binds itself, not to
/// an incoming stream it is handed. With Nagle on, the second small frame
/// of a stream (a replication answer, a keep-alive answer) waits for the
/// ACK of the first, which the peer delays up to 40 ms.
pub(super) fn incoming(
    listener: TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use futures::StreamExt;
    TcpListenerStream::new(listener).map(|conn| {
        let conn = conn?;
        conn.set_nodelay(true)?;
        Ok(conn)
    })
}

/// An interceptor that lets through only requests with valid credentials
/// (any identity; without access control, everyone).
pub(super) fn authenticated(
    auth: Arc<crate::auth::Auth>,
) -> impl FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Clone {
    move |req| {
        auth.caller(&req)?;
        Ok(req)
    }
}

/// An interceptor that lets through only the cluster's peers (see
/// [`Auth::check_peer`](crate::auth::Auth::check_peer)).
pub(super) fn peers_only(
    auth: Arc<crate::auth::Auth>,
) -> impl FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Clone {
    move |req| {
        auth.check_peer(&req)?;
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    /// Accepted connections have Nagle's algorithm off (tonic sets it only
    /// on listeners it binds itself): with it on, every second frame of a
    /// stream waited for a delayed ACK, up to 40 ms.
    #[tokio::test]
    async fn accepted_connections_have_nagle_off() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut accepted = Box::pin(incoming(listener));
        let _client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let conn = accepted
            .next()
            .await
            .expect("a connection")
            .expect("accepted");
        assert!(conn.nodelay().expect("nodelay"));
    }
}
