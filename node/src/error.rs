//! The node's one error type and its one mapping to gRPC statuses.
//!
//! | variant | gRPC code |
//! |---|---|
//! | `InvalidArgument` | `INVALID_ARGUMENT` |
//! | `FailedPrecondition` | `FAILED_PRECONDITION` |
//! | `Deadlock` | `ABORTED` |
//! | `NotFound` | `NOT_FOUND` |
//! | `NotLeader` | `UNAVAILABLE` + metadata `raftlock-leader` (address), `raftlock-leader-id` |
//! | `ResourceExhausted` | `RESOURCE_EXHAUSTED` |
//! | `Timeout` | `DEADLINE_EXCEEDED` |
//! | `Unavailable` | `UNAVAILABLE` |
//! | `Internal` | `INTERNAL` |

use openraft::error::{ClientWriteError, ForwardToLeader, LinearizableReadError, RaftError};
use tonic::metadata::MetadataValue;
use tonic::Status;

use crate::raft::TypeConfig;
use crate::state::Refusal;

pub use raftlock_proto::{LEADER_ADDR_KEY, LEADER_ID_KEY, NOT_LEADER_KEY};

/// Everything a request can fail with.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    /// Malformed request: bad name, ttl, weight, capacity, value size.
    #[error("{0}")]
    InvalidArgument(String),
    /// Conflicts with current state: capacity or kind mismatch, other mode,
    /// sequence number too old.
    #[error("{0}")]
    FailedPrecondition(String),
    /// Waiting would deadlock; the message names the cycle.
    #[error("{0}")]
    Deadlock(String),
    /// Unknown, closed or expired session.
    #[error("{0}")]
    NotFound(String),
    /// This node is not the leader; the leader, if known.
    #[error("not the leader{}", .leader.as_ref().map(|(id, a)| format!("; leader is node {id} at {a}")).unwrap_or_else(|| "; no leader known".into()))]
    NotLeader {
        /// The leader's id and address, when known.
        leader: Option<(crate::raft::NodeId, String)>,
    },
    /// A limit was reached.
    #[error("{0}")]
    ResourceExhausted(String),
    /// Access control is on and the request carries no valid credentials
    /// (no or unknown bearer token, no usable client certificate).
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller is known but no rule allows this request, or the session
    /// belongs to another identity.
    #[error("{0}")]
    PermissionDenied(String),
    /// The server gave up waiting; the outcome is unknown.
    #[error("{0}")]
    Timeout(String),
    /// The node cannot serve right now (shutting down, no quorum).
    #[error("{0}")]
    Unavailable(String),
    /// A bug or storage failure.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<crate::auth::AuthError> for Error {
    fn from(e: crate::auth::AuthError) -> Self {
        match e {
            crate::auth::AuthError::Unauthenticated(m) => Error::Unauthenticated(m),
            crate::auth::AuthError::PermissionDenied(m) => Error::PermissionDenied(m),
        }
    }
}

impl From<crate::auth::AuthError> for Status {
    fn from(e: crate::auth::AuthError) -> Self {
        Error::from(e).into()
    }
}

impl From<Refusal> for Error {
    fn from(r: Refusal) -> Self {
        let msg = r.to_string();
        match r {
            Refusal::InvalidName { .. }
            | Refusal::ValueTooLarge { .. }
            | Refusal::InvalidTtl { .. }
            | Refusal::InvalidLockDelay { .. }
            | Refusal::InvalidCapacity { .. }
            | Refusal::InvalidWeight { .. }
            | Refusal::InvalidOwner { .. }
            | Refusal::InvalidDisconnectGrace { .. }
            | Refusal::InvalidLockCount { .. }
            | Refusal::DuplicateName { .. } => Error::InvalidArgument(msg),
            Refusal::NotOwner { .. } => Error::PermissionDenied(msg),
            Refusal::CapacityMismatch { .. }
            | Refusal::KindMismatch { .. }
            | Refusal::OtherMode { .. }
            | Refusal::AlreadyHeld { .. }
            | Refusal::SequenceReused { .. }
            | Refusal::AlreadyWaiting { .. }
            | Refusal::SequenceTooOld { .. }
            | Refusal::NotHeldInMode { .. } => Error::FailedPrecondition(msg),
            Refusal::Deadlock { .. } => Error::Deadlock(msg),
            Refusal::SessionNotFound { .. } => Error::NotFound(msg),
            Refusal::TooManyWaiters { .. }
            | Refusal::TooManyLocks { .. }
            | Refusal::TooManySessions
            | Refusal::TooManyEntries
            | Refusal::IdentityLimit { .. }
            | Refusal::FencesExhausted => Error::ResourceExhausted(msg),
            Refusal::RestoreIntoNonEmpty | Refusal::InvalidRestorePart { .. } => {
                Error::FailedPrecondition(msg)
            }
            Refusal::InvalidBackup { .. } | Refusal::FenceBumpTooLarge { .. } => {
                Error::InvalidArgument(msg)
            }
            Refusal::Inconsistent { .. } => Error::Internal(msg),
        }
    }
}

impl From<ForwardToLeader<TypeConfig>> for Error {
    fn from(f: ForwardToLeader<TypeConfig>) -> Self {
        Error::NotLeader {
            leader: f.leader_id.zip(f.leader_node.map(|n| n.addr)),
        }
    }
}

impl From<RaftError<TypeConfig, ClientWriteError<TypeConfig>>> for Error {
    fn from(e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> Self {
        match e {
            // Refused before its entry was appended: surely not applied.
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => f.into(),
            // Appended, then dropped from this node's log when it took
            // another leader's: the entry may still commit there.
            RaftError::APIError(ClientWriteError::LogEntryDiscarded(f)) => Error::Timeout(format!(
                "leadership changed while the write was pending (leader now: {}); the \
                     outcome is unknown (it may still commit): retry with the same session_id \
                     and seq",
                f.leader_id.map_or("unknown".into(), |id| id.to_string())
            )),
            RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => {
                Error::FailedPrecondition(c.to_string())
            }
            RaftError::APIError(ClientWriteError::PreconditionFailed(p)) => {
                Error::FailedPrecondition(p.to_string())
            }
            RaftError::Fatal(f) => Error::Unavailable(format!("raft stopped: {f}")),
        }
    }
}

impl From<RaftError<TypeConfig, LinearizableReadError<TypeConfig>>> for Error {
    fn from(e: RaftError<TypeConfig, LinearizableReadError<TypeConfig>>) -> Self {
        match e {
            RaftError::APIError(LinearizableReadError::ForwardToLeader(f)) => f.into(),
            RaftError::APIError(LinearizableReadError::QuorumNotEnough(q)) => {
                Error::Unavailable(format!("no quorum: {q}"))
            }
            RaftError::Fatal(f) => Error::Unavailable(format!("raft stopped: {f}")),
        }
    }
}

impl From<Refusal> for Status {
    fn from(r: Refusal) -> Self {
        Error::from(r).into()
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        let msg = e.to_string();
        match e {
            Error::InvalidArgument(_) => Status::invalid_argument(msg),
            Error::FailedPrecondition(_) => Status::failed_precondition(msg),
            Error::Deadlock(_) => Status::aborted(msg),
            Error::NotFound(_) => Status::not_found(msg),
            Error::NotLeader { leader } => {
                let mut status = Status::unavailable(msg);
                status
                    .metadata_mut()
                    .insert(NOT_LEADER_KEY, MetadataValue::from_static("1"));
                if let Some((id, addr)) = leader {
                    if let Ok(v) = MetadataValue::try_from(addr.as_str()) {
                        status.metadata_mut().insert(LEADER_ADDR_KEY, v);
                    }
                    if let Ok(v) = MetadataValue::try_from(id.to_string().as_str()) {
                        status.metadata_mut().insert(LEADER_ID_KEY, v);
                    }
                }
                status
            }
            Error::ResourceExhausted(_) => Status::resource_exhausted(msg),
            Error::Unauthenticated(_) => Status::unauthenticated(msg),
            Error::PermissionDenied(_) => Status::permission_denied(msg),
            Error::Timeout(_) => Status::deadline_exceeded(msg),
            Error::Unavailable(_) => Status::unavailable(msg),
            Error::Internal(_) => Status::internal(msg),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{LockName, SessionId, WaitEdge};

    #[test]
    fn refusals_map_to_documented_codes() {
        let name = LockName::new("a").expect("valid");
        let cases = [
            (
                Refusal::InvalidName { len: 0 },
                tonic::Code::InvalidArgument,
            ),
            (
                Refusal::InvalidCapacity { capacity: 0 },
                tonic::Code::InvalidArgument,
            ),
            (
                Refusal::CapacityMismatch {
                    name: name.clone(),
                    existing: 1,
                    requested: 2,
                },
                tonic::Code::FailedPrecondition,
            ),
            (
                Refusal::Deadlock {
                    cycle: vec![WaitEdge {
                        session: SessionId(1),
                        name: name.clone(),
                        blocker: SessionId(2),
                    }],
                },
                tonic::Code::Aborted,
            ),
            (
                Refusal::SessionNotFound {
                    session: SessionId(3),
                },
                tonic::Code::NotFound,
            ),
            (Refusal::TooManySessions, tonic::Code::ResourceExhausted),
            (Refusal::TooManyEntries, tonic::Code::ResourceExhausted),
            (
                Refusal::IdentityLimit {
                    identity: "app".into(),
                    what: "open sessions".into(),
                    max: 1,
                },
                tonic::Code::ResourceExhausted,
            ),
        ];
        for (refusal, code) in cases {
            let status: Status = Error::from(refusal.clone()).into();
            assert_eq!(status.code(), code, "{refusal:?}");
        }
    }

    /// A write refused before it was appended is "not the leader" (not
    /// applied); one appended and then dropped at a leader change may
    /// still commit: DEADLINE_EXCEEDED, outcome unknown.
    #[test]
    fn a_discarded_entry_is_an_unknown_outcome_not_a_refusal() {
        use openraft::error::{ClientWriteError, ForwardToLeader, RaftError};
        let forward =
            ForwardToLeader::<TypeConfig>::new(2, crate::raft::NodeAddrs::shared("127.0.0.1:7102"));
        let refused = Error::from(RaftError::APIError(ClientWriteError::ForwardToLeader(
            forward.clone(),
        )));
        assert!(
            matches!(&refused, Error::NotLeader { leader: Some((2, a)) } if a == "127.0.0.1:7102"),
            "{refused:?}"
        );
        let discarded = Error::from(RaftError::APIError(ClientWriteError::LogEntryDiscarded(
            forward,
        )));
        let status = Status::from(discarded);
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
        assert!(status.metadata().get(NOT_LEADER_KEY).is_none());
        assert!(
            status.message().contains("outcome is unknown"),
            "{status:?}"
        );
    }

    #[test]
    fn not_leader_carries_the_leader_in_metadata() {
        let status: Status = Error::NotLeader {
            leader: Some((2, "127.0.0.1:7102".into())),
        }
        .into();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert_eq!(
            status
                .metadata()
                .get(LEADER_ADDR_KEY)
                .and_then(|v| v.to_str().ok()),
            Some("127.0.0.1:7102")
        );
        assert_eq!(
            status
                .metadata()
                .get(LEADER_ID_KEY)
                .and_then(|v| v.to_str().ok()),
            Some("2")
        );
        let status: Status = Error::NotLeader { leader: None }.into();
        assert!(status.metadata().get(LEADER_ADDR_KEY).is_none());
    }
}
