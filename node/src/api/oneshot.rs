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
        // with the guard of a queued session already armed: if this call
        // goes away while the command is being written (a worker killed
        // right after sending), the guard is dropped unread (with the
        // channel, or when the send fails) and closes the session, instead
        // of leaving its wait queued for the whole ttl.
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn({
            let api = self.clone();
            let caller = caller.identity.clone();
            async move {
                let written = api.write(command).await;
                let guard = match &written {
                    Ok(cmd::Locked {
                        session,
                        outcome: Acquired::Queued,
                        ..
                    }) => Some(CloseIfAbandoned {
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
        let cmd::Locked {
            session,
            ttl_ms,
            outcome,
        } = written?;
        let (outcome, waited) = match outcome {
            Acquired::Queued => {
                let mut guard = guard.unwrap_or_else(|| CloseIfAbandoned {
                    api: self.clone(),
                    session,
                    caller: caller.identity.clone(),
                    armed: true,
                });
                let keeper = tokio::spawn(keep_alive_while_parked(
                    self.clone(),
                    session,
                    Duration::from_millis(ttl_ms),
                ));
                let parked = self.park(session, name, timeout_ms).await;
                keeper.abort();
                let outcome = parked?;
                guard.armed = false;
                (outcome, true)
            }
            outcome => (outcome, false),
        };
        match outcome {
            Acquired::Granted { fence, .. } => {
                if waited {
                    // The client counts its lease from when it sent the
                    // request; restart it now, after a quorum round, so the
                    // leader's count ends no sooner.
                    self.0.leadership.confirm().await?;
                    self.renew_session(session)?;
                }
                Ok(pb::LockResponse {
                    acquired: true,
                    fence: fence.0,
                    session_id: session.0,
                    ttl_ms,
                    next_seq: LOCK_SEQ + 1,
                })
            }
            // Not granted: the table left no session (or ended it with the
            // wait).
            Acquired::NotAcquired | Acquired::Queued => Ok(pb::LockResponse {
                ttl_ms,
                ..Default::default()
            }),
        }
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
        let command = cmd::SetTtl {
            session: SessionId(r.session_id),
            seq: r.seq,
            ttl_ms: r.ttl_ms,
            caller: caller.identity,
        };
        command.validate()?;
        let ttl_ms = self.write(command).await?;
        Ok(pb::SetSessionTtlResponse { ttl_ms })
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
