//! A custom transport under the client: dial nodes over any byte stream
//! instead of TCP (a deterministic simulator's network, say). Off unless
//! [`ClientOptions::connector`](crate::ClientOptions::connector) is set.

use std::fmt;
use std::future::Future;
use std::io;
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite};

/// What a custom transport's connection must be: a byte stream both ways.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

type Dial = dyn Fn(String) -> BoxFuture<'static, io::Result<Box<dyn Io>>> + Send + Sync;

/// Dials a node's `host:port` over a custom transport. Cheap to clone.
///
/// With a connector the client makes no TLS probes of its own (they need
/// TCP): a failed connection is reported as it failed.
#[derive(Clone)]
pub struct Connector(Arc<Dial>);

impl Connector {
    /// A connector that dials with `dial` (given the `host:port` to reach).
    pub fn new<F, Fut, C>(dial: F) -> Self
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = io::Result<C>> + Send + 'static,
        C: Io,
    {
        Connector(Arc::new(move |addr| {
            let fut = dial(addr);
            Box::pin(async move { fut.await.map(|c| Box::new(c) as Box<dyn Io>) })
        }))
    }

    /// A lazily dialled channel to `endpoint` over this transport (the
    /// endpoint's settings, TLS and connect timeout included, apply as
    /// they do over TCP).
    pub(crate) fn channel(
        &self,
        endpoint: &tonic::transport::Endpoint,
    ) -> tonic::transport::Channel {
        let dial = self.0.clone();
        endpoint.connect_with_connector_lazy(tower::service_fn(
            move |uri: tonic::codegen::http::Uri| {
                let addr = uri.authority().map_or_else(String::new, |a| a.to_string());
                let conn = dial(addr);
                async move { conn.await.map(hyper_util::rt::TokioIo::new) }
            },
        ))
    }
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Connector(custom)")
    }
}
