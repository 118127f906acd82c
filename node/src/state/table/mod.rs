//! The lock table and its `apply`: [`LockTable`] and the dispatch of each
//! command to its handler, one concern per file:
//!
//! * `sessions`: open, close, and end (expiry or close) a session;
//! * `acquire`: grant, queue, and promote waiters as names free up;
//! * `release`: release, withdraw, cancel a wait, end a lock-delay;
//! * `restore`: a backup restored part by part into an empty table;
//! * `replies`: each session's reply window (exactly-once retries);
//! * `holders`: a name's grants in fence order;
//! * `records`: sessions, locks, holders, waiters and the rest.

mod acquire;
mod holders;
mod records;
mod release;
mod replies;
mod restore;
mod sessions;

use sessions::OpenArgs;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub(in crate::state) use holders::Holders;
pub(in crate::state) use records::{
    Closed, Delay, Holder, Lock, PendingRestore, Session, WaitRef, Waiter,
};
pub(in crate::state) use replies::{Remembered, Replies};

use crate::state::command::{Acquired, Command, LockName, Refusal, Reply, Response, SessionId};

/// The replicated lock table. See the module docs of [`state`](super) for
/// the invariants it keeps and the determinism contract.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockTable {
    /// Open sessions by id.
    pub(super) sessions: BTreeMap<SessionId, Session>,
    /// Names that are held, waited for or in lock-delay. A name with none of
    /// these is removed, so memory follows live use.
    pub(super) locks: BTreeMap<LockName, Lock>,
    /// Open-session nonces, so a retried `OpenSession` finds its session.
    pub(super) nonces: BTreeMap<u64, SessionId>,
    /// The last fence handed out; the next grant gets `last_fence + 1`.
    pub(super) last_fence: u64,
    /// The parts of a backup received so far, while a restore is under way
    /// (only ever on an otherwise empty table).
    pub(super) restoring: Option<PendingRestore>,
    /// Added to every command index before the table uses it (session ids,
    /// queue positions, grant and lock-delay indexes). 0 until a restore;
    /// a restore sets it above every index in the backup plus
    /// [`RESTORE_INDEX_BUMP`], so the new cluster's log, which starts again
    /// near 0, never hands out an id or a queue position the backup's
    /// cluster used or may have used after the backup was taken.
    pub(super) index_floor: u64,
    /// Sessions closed by their clients, the newest
    /// [`MAX_REMEMBERED_CLOSES`] closes, so a retried `CloseSession` is
    /// answered like the first.
    pub(super) closed: BTreeMap<SessionId, Closed>,
    /// `closed` in close order (close index, then id), to forget the oldest
    /// close first. Derived from `closed`: not in the snapshot, rebuilt
    /// when one is decoded.
    #[serde(skip)]
    pub(super) closed_order: BTreeSet<(u64, SessionId)>,
}

impl LockTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one committed command at log `index`.
    ///
    /// Deterministic: the same table, index and command always give the same
    /// new table and the same response. Refusals change nothing.
    pub fn apply(&mut self, index: u64, command: Command) -> Response {
        // Every id and position comes from the command index, lifted above
        // whatever a restored backup holds (see `index_floor`).
        let index = self.index_floor.saturating_add(index);
        // The stateless checks (names, sizes, ttl, capacity, weight) live in
        // one place, `Command::validate`; what follows checks state.
        if let Err(refusal) = command.validate() {
            return Response {
                reply: Reply::Refused(refusal),
                events: Vec::new(),
            };
        }
        // Sessions are bound to the identity that opened them: a request
        // naming another identity's session (`caller` is not its `owner`) is
        // refused where the session is looked up, before anything else, so
        // it changes nothing and learns nothing (not even a remembered
        // reply).
        let mut events = Vec::new();
        let digest = command.digest();
        // Each handler answers `Err` for a refusal, which it returns before
        // changing anything.
        let reply = match command {
            Command::OpenSession {
                ttl_ms,
                lock_delay_ms,
                nonce,
                owner,
            } => self.open_session(
                index,
                OpenArgs {
                    ttl_ms,
                    lock_delay_ms,
                    nonce,
                    owner,
                    end_on_disconnect_ms: 0,
                },
                &mut events,
            ),
            Command::OpenSessionWith {
                ttl_ms,
                lock_delay_ms,
                nonce,
                owner,
                end_on_disconnect_ms,
            } => self.open_session(
                index,
                OpenArgs {
                    ttl_ms,
                    lock_delay_ms,
                    nonce,
                    owner,
                    end_on_disconnect_ms,
                },
                &mut events,
            ),
            Command::Lock {
                ttl_ms,
                lock_delay_ms,
                nonce,
                owner,
                end_on_disconnect_ms,
                name,
                mode,
                timeout_ms,
                value,
            } => self.lock(
                index,
                OpenArgs {
                    ttl_ms,
                    lock_delay_ms,
                    nonce,
                    owner,
                    end_on_disconnect_ms,
                },
                (name, mode, timeout_ms, value),
                digest,
                &mut events,
            ),
            Command::SetTtl {
                session,
                seq,
                ttl_ms,
                caller,
            } => self.set_ttl((session, &caller, digest), seq, ttl_ms, &mut events),
            Command::CloseSession {
                session,
                seq,
                caller,
            } => self.close_session(index, (session, &caller, digest), seq, &mut events),
            Command::Acquire {
                session,
                seq,
                name,
                mode,
                timeout_ms,
                value,
                caller,
            } => self.acquire(
                index,
                (session, &caller, digest),
                seq,
                name,
                mode,
                timeout_ms,
                value,
                &mut events,
            ),
            Command::Release {
                session,
                seq,
                name,
                fence,
                caller,
            } => self.release(
                index,
                (session, &caller, digest),
                seq,
                name,
                fence,
                &mut events,
            ),
            Command::ExpireSession { session } => Ok(Reply::Expired {
                existed: self
                    .end_session(session, true, index, &mut events)
                    .is_some(),
            }),
            Command::CancelWait { session, name, seq } => {
                self.cancel_wait(index, session, name, seq, &mut events)
            }
            Command::EndLockDelay { name, since } => {
                self.end_lock_delay(index, name, since, &mut events)
            }
            Command::RestorePart {
                restore,
                part,
                parts,
                bytes,
                fence_bump,
            } => self.restore_part((restore, part, parts), bytes, fence_bump, &mut events),
            Command::Withdraw {
                session,
                seq,
                name,
                caller,
            } => self.withdraw(index, (session, &caller), seq, name, &mut events),
        };
        Response {
            reply: reply.unwrap_or_else(Reply::Refused),
            events,
        }
    }

    /// Where `session` stands on `name` right now.
    pub fn standing(&self, session: SessionId, name: &LockName) -> Acquired {
        let Some(s) = self.sessions.get(&session) else {
            return Acquired::NotAcquired;
        };
        if let Some(fence) = s.held.get(name) {
            if let Some(h) = self.locks.get(name).and_then(|l| l.holders.get(fence)) {
                return Acquired::Granted {
                    fence: *fence,
                    mode: h.mode,
                    index: h.index,
                };
            }
        }
        if s.waiting.contains_key(name) {
            return Acquired::Queued;
        }
        Acquired::NotAcquired
    }

    fn remember(&mut self, session: SessionId, seq: u64, digest: u64, reply: &Reply) {
        if let Some(s) = self.sessions.get_mut(&session) {
            s.replies.remember(seq, digest, reply);
        }
    }
}

/// `found`, the session looked up as `session`, if it is open and `caller`
/// opened it. (A function of the lookup rather than a method, so a caller
/// can hold the session mutably beside the table's other fields.)
fn owned<S: std::ops::Deref<Target = Session>>(
    found: Option<S>,
    session: SessionId,
    caller: &str,
) -> Result<S, Refusal> {
    match found {
        None => Err(Refusal::SessionNotFound { session }),
        Some(s) if s.owner != caller => Err(Refusal::NotOwner { session }),
        Some(s) => Ok(s),
    }
}
