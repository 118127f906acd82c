//! The byte streams a node talks over: TCP by default, or any transport a
//! caller plugs in (a deterministic simulator's simulated network, say).
//!
//! Two seams, both off unless set: [`Connector`] replaces the TCP dial
//! towards peers (`NodeOptions::connector`), and [`Listener::Custom`]
//! replaces an accepting TCP socket with a stream of connections. HTTP/2,
//! gRPC, timeouts and retries stay the same on either.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;

/// What a custom transport's connection must be: a byte stream both ways.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// A connection of a custom transport (no TCP or TLS connection info: a
/// request on it has no remote address and no peer certificates).
pub struct Conn(pub Box<dyn Io>);

impl Conn {
    /// Boxes `io`.
    pub fn new(io: impl Io) -> Self {
        Conn(Box::new(io))
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ();

    fn connect_info(&self) {}
}

/// Dials `host:port` over a custom transport. Cheap to clone.
#[derive(Clone)]
pub struct Connector(Arc<dyn Fn(String) -> BoxFuture<'static, io::Result<Conn>> + Send + Sync>);

impl Connector {
    /// A connector that dials with `dial` (given the `host:port` to reach).
    pub fn new<F, Fut>(dial: F) -> Self
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = io::Result<Conn>> + Send + 'static,
    {
        Connector(Arc::new(move |addr| Box::pin(dial(addr))))
    }

    /// Dials `addr` (`host:port`).
    pub fn dial(&self, addr: &str) -> BoxFuture<'static, io::Result<Conn>> {
        (self.0)(addr.to_string())
    }

    /// A lazily dialled channel to `endpoint` over this transport (tonic's
    /// endpoint settings, TLS and connect timeout included, apply as they
    /// do over TCP).
    pub fn channel(&self, endpoint: &tonic::transport::Endpoint) -> tonic::transport::Channel {
        let this = self.clone();
        endpoint.connect_with_connector_lazy(tower::service_fn(
            move |uri: tonic::codegen::http::Uri| {
                let addr = uri.authority().map_or_else(String::new, |a| a.to_string());
                let dial = this.dial(&addr);
                async move { dial.await.map(hyper_util::rt::TokioIo::new) }
            },
        ))
    }
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Connector(custom)")
    }
}

/// Where a node accepts connections: a TCP socket the caller bound, or
/// any stream of connections.
pub enum Listener {
    /// A bound TCP socket (Nagle's algorithm is turned off on each
    /// connection; TLS, if configured, is terminated on it).
    Tcp(TcpListener),
    /// Connections of a custom transport (plaintext only).
    Custom(BoxStream<'static, io::Result<Conn>>),
}

impl From<TcpListener> for Listener {
    fn from(listener: TcpListener) -> Self {
        Listener::Tcp(listener)
    }
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listener::Tcp(l) => write!(f, "Listener::Tcp({:?})", l.local_addr().ok()),
            Listener::Custom(_) => f.write_str("Listener::Custom"),
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A connector is called with the endpoint's `host:port`, and the
    /// channel speaks over the stream it returns: here an in-memory pipe
    /// served by a real tonic health server through `Listener::Custom`'s
    /// connection type. A dial that fails fails the call `UNAVAILABLE`.
    #[tokio::test]
    async fn channel_runs_over_the_connector() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<io::Result<Conn>>();
        let dialled = Arc::new(std::sync::Mutex::new(Vec::new()));
        let connector = {
            let dialled = dialled.clone();
            Connector::new(move |addr: String| {
                dialled.lock().expect("lock").push(addr.clone());
                let tx = tx.clone();
                async move {
                    if addr.starts_with("nowhere") {
                        return Err(io::Error::from(io::ErrorKind::ConnectionRefused));
                    }
                    let (client, server) = tokio::io::duplex(64 * 1024);
                    tx.send(Ok(Conn::new(server)))
                        .map_err(|_| io::Error::other("the server is gone"))?;
                    Ok(Conn::new(client))
                }
            })
        };
        let (reporter, health) = tonic_health::server::health_reporter();
        reporter
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
        let incoming = tokio_stream::wrappers::UnboundedReceiverStream::new(rx).boxed();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(health)
                .serve_with_incoming(incoming),
        );
        let endpoint = tonic::transport::Endpoint::from_static("http://node-1:7001");
        let mut client =
            tonic_health::pb::health_client::HealthClient::new(connector.channel(&endpoint));
        let status = client
            .check(tonic_health::pb::HealthCheckRequest::default())
            .await
            .expect("health over the connector")
            .into_inner()
            .status;
        assert_eq!(
            status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32
        );
        assert_eq!(
            *dialled.lock().expect("lock"),
            vec!["node-1:7001".to_string()]
        );

        let endpoint = tonic::transport::Endpoint::from_static("http://nowhere:1");
        let mut client =
            tonic_health::pb::health_client::HealthClient::new(connector.channel(&endpoint));
        let err = client
            .check(tonic_health::pb::HealthCheckRequest::default())
            .await
            .expect_err("a refused dial fails the call");
        assert_eq!(err.code(), tonic::Code::Unavailable);
    }

    /// `Conn` passes bytes through both ways.
    #[tokio::test]
    async fn conn_passes_bytes() {
        let (a, b) = tokio::io::duplex(16);
        let (mut a, mut b) = (Conn::new(a), Conn::new(b));
        a.write_all(b"ping").await.expect("write");
        let mut buf = [0u8; 4];
        b.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"ping");
    }
}
