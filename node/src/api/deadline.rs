//! The client's deadline, answered as the .proto documents it.
//!
//! A gRPC call may carry its deadline (`grpc-timeout`). tonic's server
//! enforces it outside every service and answers a call that outlives it
//! with `CANCELLED` "Timeout expired", which a client cannot tell from its
//! own cancel (and so gives up on an outcome it should retry). This layer,
//! inside tonic's, ends such a call a millisecond sooner with
//! `DEADLINE_EXCEEDED`: the outcome of a mutating request is then unknown,
//! and the client retries it with the same session and seq. The call's
//! future is dropped either way, exactly as tonic would drop it.

use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;

/// How much sooner than tonic's own timer this layer answers, so that it
/// always answers first (tokio's timers tick in milliseconds, and tonic
/// polls the call before its timer).
const AHEAD: Duration = Duration::from_millis(1);

/// Answers `DEADLINE_EXCEEDED` when a call's `grpc-timeout` passes.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeadlineLayer;

impl<S> tower::Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline { inner }
    }
}

/// The service [`DeadlineLayer`] makes.
#[derive(Clone, Debug)]
pub struct Deadline<S> {
    inner: S,
}

impl<S, B, R> tower::Service<axum::http::Request<B>> for Deadline<S>
where
    S: tower::Service<axum::http::Request<B>, Response = axum::http::Response<R>>,
    S::Future: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = axum::http::Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<axum::http::Response<R>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: axum::http::Request<B>) -> Self::Future {
        let timeout = req
            .headers()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(grpc_timeout);
        let call = self.inner.call(req);
        Box::pin(async move {
            let Some(timeout) = timeout else {
                return call.await;
            };
            match tokio::time::timeout(timeout.saturating_sub(AHEAD), call).await {
                Ok(answer) => answer,
                Err(_) => Ok(tonic::Status::deadline_exceeded(
                    "the client's deadline (grpc-timeout) passed before the answer; the outcome \
                     of a write is unknown: retry it with the same session_id and seq",
                )
                .into_http()),
            }
        })
    }
}

/// A `grpc-timeout` value (at most 8 digits and a unit: `H`, `M`, `S`,
/// `m`, `u`, `n`), or `None` if it is not one (tonic then ignores it too).
fn grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_as_the_spec_writes_them() {
        assert_eq!(grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(grpc_timeout("5M"), Some(Duration::from_secs(300)));
        assert_eq!(grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(
            grpc_timeout("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        for bad in ["", "m", "100", "100x", "123456789m", "-1m", "1.5S"] {
            assert_eq!(grpc_timeout(bad), None, "{bad:?}");
        }
    }
}
