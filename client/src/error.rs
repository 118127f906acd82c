//! The client's error type: gRPC statuses mapped back to what they mean.

use std::time::Duration;

use tonic::{Code, Status};

/// What a raftlock call can fail with.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// The request was malformed (bad name, ttl, weight, capacity, value);
    /// nothing changed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The request conflicts with existing state (capacity or kind
    /// mismatch, other mode); nothing changed.
    #[error("failed precondition: {0}")]
    FailedPrecondition(String),
    /// Waiting would have deadlocked; the message names the cycle.
    #[error("deadlock: {0}")]
    Deadlock(String),
    /// The session is unknown, closed or expired.
    #[error("session not found: {0}")]
    SessionNotFound(String),
    /// Access control is on and the request carried no valid credentials
    /// (no token or an unknown one, no client certificate).
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The identity is known, but no rule allows this request (or the
    /// session belongs to another identity).
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// A server limit was reached.
    #[error("resource exhausted: {0}")]
    ResourceExhausted(String),
    /// No node could serve the request before the deadline; the request was
    /// not applied.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// No node could be asked: every endpoint refused the connection, did
    /// not resolve, or failed the TLS handshake, [`REFUSED_ROUNDS`] times in
    /// a row. Nothing was sent, so nothing changed; the endpoints, the
    /// network or the cluster are down or wrong. (Nodes that answered but
    /// could not serve give [`Error::Unavailable`].)
    ///
    /// [`REFUSED_ROUNDS`]: crate::REFUSED_ROUNDS
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// The request may or may not have been applied (the deadline passed
    /// after it was sent). Retrying with the same session and sequence
    /// number is safe and tells which.
    #[error("outcome unknown: {0}")]
    Unknown(String),
    /// The session's lease is lost for good (or the session was closed):
    /// the cluster said it ended, or no keep-alive was answered for a ttl
    /// less the margin; what it held may be held by someone else now. Not
    /// returned in jeopardy: a request made then waits for the keep-alives
    /// to settle it.
    #[error("session lease lost")]
    LeaseLost,
    /// The lock was not granted within the timeout.
    #[error("not acquired within {0:?}")]
    NotAcquired(Duration),
    /// Bad client configuration (no endpoints, bad address).
    #[error("configuration: {0}")]
    Config(String),
    /// Something the server should never answer.
    #[error("internal: {0}")]
    Internal(String),
}

impl Error {
    /// True if trying again later may succeed (the cluster was unreachable
    /// or leaderless, or the outcome is unknown and the retry is
    /// idempotent).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Unavailable(_)
                | Error::Unreachable(_)
                | Error::Unknown(_)
                | Error::ResourceExhausted(_)
        )
    }

    /// True for [`Error::Unreachable`]: no node could be asked, nothing was
    /// sent.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Error::Unreachable(_))
    }

    /// Maps a status to an error. `sent` says whether a mutating request
    /// may have reached the server (then a timeout is `Unknown`).
    pub(crate) fn from_status(status: &Status, sent: bool) -> Error {
        let msg = status.message().to_string();
        match status.code() {
            Code::InvalidArgument | Code::OutOfRange => Error::InvalidArgument(msg),
            Code::FailedPrecondition => Error::FailedPrecondition(msg),
            // The node's message already says "deadlock: ..."; the
            // variant's display adds the word once.
            Code::Aborted => Error::Deadlock(
                msg.strip_prefix("deadlock: ")
                    .map(str::to_string)
                    .unwrap_or(msg),
            ),
            Code::NotFound => Error::SessionNotFound(msg),
            Code::ResourceExhausted => Error::ResourceExhausted(msg),
            Code::Unauthenticated => Error::Unauthenticated(msg),
            Code::PermissionDenied => Error::PermissionDenied(msg),
            Code::Unavailable => Error::Unavailable(msg),
            Code::DeadlineExceeded | Code::Cancelled | Code::Unknown if sent => Error::Unknown(msg),
            Code::DeadlineExceeded | Code::Cancelled => Error::Unavailable(msg),
            _ => Error::Internal(format!("{:?}: {msg}", status.code())),
        }
    }
}

/// The client's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the client's own "no node could be asked" is unreachable: a
    /// node's UNAVAILABLE answer (no leader, no quorum) is not, whatever
    /// it says.
    #[test]
    fn only_the_unsent_unavailable_is_unreachable() {
        for answered in [
            Error::from_status(&Status::unavailable("not the leader"), true),
            Error::from_status(&Status::unavailable("no node accepts connections"), false),
            Error::Unavailable("no leader within 15 s".into()),
        ] {
            assert!(!answered.is_unreachable(), "{answered:?}");
        }
    }

    #[test]
    fn statuses_map_to_meaningful_errors() {
        assert_eq!(
            Error::from_status(&Status::invalid_argument("x"), true),
            Error::InvalidArgument("x".into())
        );
        assert!(matches!(
            Error::from_status(&Status::aborted("cycle"), true),
            Error::Deadlock(_)
        ));
        assert!(matches!(
            Error::from_status(&Status::not_found("s"), true),
            Error::SessionNotFound(_)
        ));
        assert!(matches!(
            Error::from_status(&Status::deadline_exceeded("t"), true),
            Error::Unknown(_)
        ));
        assert!(matches!(
            Error::from_status(&Status::deadline_exceeded("t"), false),
            Error::Unavailable(_)
        ));
        assert_eq!(
            Error::from_status(&Status::unauthenticated("who"), true),
            Error::Unauthenticated("who".into())
        );
        assert_eq!(
            Error::from_status(&Status::permission_denied("no"), true),
            Error::PermissionDenied("no".into())
        );
        assert!(!Error::PermissionDenied("no".into()).is_retryable());
        assert!(!Error::Unauthenticated("who".into()).is_retryable());
    }

    #[test]
    fn only_transient_errors_are_retryable() {
        assert!(Error::Unavailable("x".into()).is_retryable());
        assert!(Error::Unknown("x".into()).is_retryable());
        assert!(!Error::InvalidArgument("x".into()).is_retryable());
        assert!(!Error::LeaseLost.is_retryable());
        assert!(!Error::Deadlock("x".into()).is_retryable());
        let e = Error::from_status(
            &Status::aborted("deadlock: session 7 waits for session 9"),
            true,
        );
        assert_eq!(e.to_string(), "deadlock: session 7 waits for session 9");
    }
}
