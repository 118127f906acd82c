//! The one-call `Lock` and `Unlock`, and `SetSessionTtl`: what a client
//! without a session library (a PHP request, a shell script, curl) needs to
//! take a lock in one write and give it back in another.

use std::time::Duration;

use raftlock_proto::v1 as pb;

use super::convert::mode_from_parts;
use super::Api;
use crate::auth::{Caller, Permission};
use crate::error::Error;
use crate::state::limits::WAIT_FOREVER;
use crate::state::{cmd, Acquired, LockName, SessionId, LOCK_SEQ, UNLOCK_SEQ};

/// Closes a `Lock`'s session if its call goes away while it waits (the
/// client closed the connection, its deadline passed): armed from the
/// moment the write queued the acquire (before the call learns of it) until
/// the wait ends, so a killed worker leaves nothing queued.
struct CloseIfAbandoned {
    api: Api,
    session: SessionId,
    caller: String,
    armed: bool,
}

impl Drop for CloseIfAbandoned {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (api, session, caller) = (self.api.clone(), self.session, self.caller.clone());
        tokio::spawn(async move {
            let close = cmd::CloseSession {
                session,
                seq: UNLOCK_SEQ,
                caller,
            };
            match api.write(close).await {
                Ok(_) | Err(Error::NotFound(_)) => {}
                // Not the leader any more, say: the session expires at the
                // end of its ttl instead, withdrawing the wait.
                Err(e) => {
                    tracing::info!(%session, error = %e, "could not close an abandoned lock's session; it expires with its ttl")
                }
            }
        });
    }
}

impl Api {
    /// `Lock`: see the .proto.
    ///
    /// The lease rule on this path: a client counts the session's lease
    /// from the send of the `Lock` it was answered for (the first send, or
    /// a retry with the same nonce). The leader's lease started when the
    /// open applied, after the first send; a grant that waited, or a retry
    /// answered from the session's remembered outcome, restarts it as it
    /// answers, after a quorum round, so the leader's count never ends
    /// before the client's. Until the answer is on its way, the session is
    /// closed if the call goes away (a caller killed just before its grant
    /// must not keep the lock for its ttl), and a session that ends with
    /// its process is carried by the call like a keep-alive stream: its
    /// grace starts when the call ends, and its client renews it on a
    /// stream before that grace is out.
    pub(super) async fn lock_call(
        &self,
        caller: Caller,
        r: pb::LockRequest,
    ) -> Result<pb::LockResponse, Error> {
        caller.require_name(Permission::Lock, &r.name)?;
        let mode = mode_from_parts(r.mode, r.weight, r.capacity)?;
        let name = LockName::new(r.name).map_err(Error::from)?;
        let timeout_ms = if r.wait { WAIT_FOREVER } else { r.timeout_ms };
        let command = cmd::Lock {
            open: cmd::OpenSession {
                ttl_ms: r.ttl_ms,
                lock_delay_ms: r.lock_delay_ms,
                nonce: r.nonce,
                owner: caller.identity.clone(),
                end_on_disconnect_ms: r.end_on_disconnect_ms,
            },
            name: name.clone(),
            mode,
            timeout_ms,
            value: r.value,
        };
        command.validate()?;
        // The write runs in a task of its own, which hands its outcome over
        // with the guard of the session already armed (granted by this
        // very entry, or queued): if this call goes away while the command
        // is being written (a worker killed right after sending), the
        // guard is dropped unread (with the channel, or when the send
        // fails) and closes the session, instead of leaving its wait
        // queued or its grant held for the whole ttl. A retry that finds a
        // grant made earlier gets no guard: its client may count a lease
        // from the earlier answer, and closing the session would end it
        // under that count. The carrier counts the call as a stream of a
        // session that ends with its process.
        let carrier = super::locks::Carrier::open(self);
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn({
            let api = self.clone();
            let caller = caller.identity.clone();
            async move {
                let written = api.write_indexed(command).await;
                let fresh = match &written {
                    Ok((cmd::Locked { outcome, .. }, entry)) => match outcome {
                        Acquired::Queued => true,
                        Acquired::Granted { index, .. } => {
                            crate::raft::log_index_of(*index) == *entry
                        }
                        Acquired::NotAcquired => false,
                    },
                    Err(_) => false,
                };
                let guard = match &written {
                    Ok((cmd::Locked { session, .. }, _)) if fresh => Some(CloseIfAbandoned {
                        api: api.clone(),
                        session: *session,
                        caller,
                        armed: true,
                    }),
                    _ => None,
                };
                let _ = tx.send((written, guard));
            }
        });
        let (written, guard) = rx
            .await
            .map_err(|_| Error::Internal("a lock's write ended without an answer".into()))?;
        let (
            cmd::Locked {
                session,
                ttl_ms,
                outcome,
            },
            _,
        ) = written?;
        if matches!(outcome, Acquired::NotAcquired) {
            // Not granted: the table left no session (or ended it with the
            // wait).
            return Ok(pb::LockResponse {
                ttl_ms,
                ..Default::default()
            });
        }
        carrier.carries(session);
        let (outcome, restart) = match outcome {
            Acquired::Queued => {
                let keeper = tokio::spawn(keep_alive_while_parked(
                    self.clone(),
                    session,
                    Duration::from_millis(ttl_ms),
                ));
                let parked = self.park(session, name, timeout_ms).await;
                keeper.abort();
                (parked?, true)
            }
            // Granted by this very entry: the lease started when it
            // applied, after this request was sent. Granted earlier: a
            // retry answered from what the session remembers.
            granted @ Acquired::Granted { .. } => (granted, guard.is_none()),
            Acquired::NotAcquired => (Acquired::NotAcquired, false),
        };
        let Acquired::Granted { fence, .. } = outcome else {
            // The wait ended without a grant, and the session with it.
            if let Some(mut guard) = guard {
                guard.armed = false;
            }
            return Ok(pb::LockResponse {
                ttl_ms,
                ..Default::default()
            });
        };
        if restart {
            // The client counts its lease from when it sent this request;
            // restart it now, after a quorum round, so the leader's count
            // ends no sooner. If that fails, the answer says the outcome is
            // unknown: a grant that waited in this call is closed by its
            // guard (its client never had an answer to count from), a
            // retry's is left to the lease its earlier answer started.
            let restarted = match self.0.leadership.confirm().await {
                Ok(()) => self.renew_session(session).map(|_| ()),
                Err(e) => Err(e),
            };
            if let Err(e) = restarted {
                return Err(Error::Unavailable(format!(
                    "the lock was granted but its lease could not be restarted ({e}); the \
                     outcome is unknown: retry with the same nonce"
                )));
            }
        } else {
            // Let the connection's task run once: a caller that went away
            // just before its grant is noticed here, and the guard closes
            // its session.
            tokio::task::yield_now().await;
        }
        if let Some(mut guard) = guard {
            guard.armed = false;
        }
        Ok(pb::LockResponse {
            acquired: true,
            fence: fence.0,
            session_id: session.0,
            ttl_ms,
            next_seq: LOCK_SEQ + 1,
        })
    }

    /// `Unlock`: a close under [`UNLOCK_SEQ`].
    pub(super) async fn unlock_call(
        &self,
        caller: Caller,
        r: pb::UnlockRequest,
    ) -> Result<pb::UnlockResponse, Error> {
        caller.require_any(Permission::Lock)?;
        let released = self
            .write(cmd::CloseSession {
                session: SessionId(r.session_id),
                seq: UNLOCK_SEQ,
                caller: caller.identity,
            })
            .await?;
        Ok(pb::UnlockResponse { released })
    }

    /// `SetSessionTtl`.
    pub(super) async fn set_session_ttl_call(
        &self,
        caller: Caller,
        r: pb::SetSessionTtlRequest,
    ) -> Result<pb::SetSessionTtlResponse, Error> {
        caller.require_any(Permission::Lock)?;
        let session = SessionId(r.session_id);
        let command = cmd::SetTtl {
            session,
            seq: r.seq,
            ttl_ms: r.ttl_ms,
            caller: caller.identity,
        };
        command.validate()?;
        // The lease rule on this path: the client counts the new lease from
        // the send of the change it was answered for. So no expiry of the
        // session is decided while the change is in flight (one decided
        // meanwhile would undo the lease the answer promises), a session
        // whose end is under way is refused, and once the change applied
        // (or was found applied: a retry) the lease restarts after a quorum
        // round, as a keep-alive's does.
        let leases = &self.0.shared.leases;
        leases
            .begin_ttl_change(session)
            .map_err(|_| Error::NotFound(format!("{session} expired")))?;
        struct Changing<'a>(&'a crate::leases::Leases, SessionId);
        impl Drop for Changing<'_> {
            fn drop(&mut self) {
                self.0.end_ttl_change(self.1);
            }
        }
        let _changing = Changing(leases, session);
        let ttl_ms = self.write(command).await?;
        let restarted = match self.0.leadership.confirm().await {
            Ok(()) => self.renew_session(session).map(|_| ()),
            Err(e) => Err(e),
        };
        match restarted {
            Ok(()) => Ok(pb::SetSessionTtlResponse { ttl_ms }),
            Err(e @ Error::NotFound(_)) => Err(e),
            Err(e) => Err(Error::Unavailable(format!(
                "the ttl change applied but the lease could not be restarted ({e}); retry with \
                 the same seq"
            ))),
        }
    }
}

/// Keeps a `Lock`'s session alive while its call waits in the queue: the
/// caller is there, waiting, and cannot send keep-alives of a session whose
/// id it does not know yet. Nobody is told of these renewals, so no quorum
/// round is needed (a deposed leader's renewals count for nothing).
async fn keep_alive_while_parked(api: Api, session: SessionId, ttl: Duration) {
    let every = (ttl / 3).max(Duration::from_millis(100));
    loop {
        tokio::time::sleep(every).await;
        if api.0.shared.leases.keep_alive(session).is_err() {
            return;
        }
    }
}
