//! The lock table and its `apply`: [`LockTable`] and the dispatch of each
//! command to its handler, one concern per file:
//!
//! * `sessions`: open, close, and end (expiry or close) a session;
//! * `acquire`: grant, queue, and promote waiters as names free up;
//! * `release`: release, cancel an acquire, time a wait out, end a lock-delay;
//! * `restore`: a backup restored part by part into an empty table;
//! * `replies`: each session's reply window (exactly-once retries);
//! * `holders`: a name's grants in fence order;
//! * `records`: sessions, locks, holders, waiters and the rest.

mod acquire;
mod holders;
mod multi;
mod records;
mod release;
mod replies;
mod restore;
mod sessions;
mod upgrade;
mod usage;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub(in crate::state) use holders::Holders;
pub(in crate::state) use records::{
    Closed, Delay, Holder, Lock, PendingRestore, RestoreDone, Session, Upgrade, WaitRef, Waiter,
};
pub(in crate::state) use replies::{Remembered, Replies};
use sessions::Ending;
#[cfg(test)]
pub(in crate::state) use usage::Counts;
pub(in crate::state) use usage::Usage;

/// What every handler of a command is given besides the command: the
/// position it is applied at and where to tell what changed.
pub(super) struct Cx<'a> {
    /// The command's log index, lifted above a restored backup's.
    pub(super) index: u64,
    /// What changed, in order.
    pub(super) events: &'a mut Vec<Event>,
}

use crate::state::command::{
    Acquired, Command, Event, LockName, Refusal, Reply, Response, SessionId,
};

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
    /// Pending upgrades from shared to exclusive, by name (snapshot format
    /// 5 on).
    pub(super) upgrades: BTreeMap<LockName, Upgrade>,
    /// Queued atomic requests (`AcquireAll`), by (session, seq): the names
    /// whose queues each has a place in, in the request's order (snapshot
    /// format 5 on).
    pub(super) groups: BTreeMap<(SessionId, u64), Vec<LockName>>,
    /// The last restore installed into this table, with its answer, so
    /// that a retry of it is answered as it was (snapshot format 6 on).
    pub(super) restored: Option<RestoreDone>,
    /// Sessions and entries, in all and per identity, for the limits.
    /// Derived: not in the snapshot (see [`Usage`]).
    #[serde(skip)]
    pub(super) usage: Usage,
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
    pub fn apply(&mut self, index: u64, command: impl Into<Command>) -> Response {
        let command = command.into();
        // Every id and position comes from the command index, lifted above
        // whatever a restored backup holds (see `index_floor`).
        let index = self.index_floor.saturating_add(index);
        // Names were checked when they were made (or decoded); the other
        // stateless checks (sizes, ttl, capacity, weight) live in one
        // place, `Command::validate`; what follows checks state.
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
        // reply). Each handler answers `Err` for a refusal, which it
        // returns before changing anything.
        let mut events = Vec::new();
        let cx = &mut Cx {
            index,
            events: &mut events,
        };
        let restore = matches!(command, Command::RestorePart(_));
        let reply = match command {
            Command::OpenSessionV0(c) => self.open_session(cx, c.into()),
            Command::OpenSession(c) => self.open_session(cx, c),
            Command::Lock(c) => self.lock(cx, c),
            Command::SetTtl(c) => self.set_ttl(cx, c),
            Command::CloseSession(c) => self.close_session(cx, c),
            Command::Acquire(c) => self.acquire(cx, c),
            Command::Release(c) => self.release(cx, c),
            Command::ExpireSession(c) => Ok(Reply::Expired {
                existed: self
                    .end_session(c.session, Ending::Expired, index, cx.events)
                    .is_some(),
            }),
            Command::RevokeSession(c) => self.revoke_session(cx, c),
            Command::TimeoutWait(c) => self.timeout_wait(cx, c),
            Command::EndLockDelay(c) => self.end_lock_delay(cx, c),
            Command::RestorePart(c) => self.restore_part(cx, c),
            Command::Cancel(c) => self.cancel(cx, c),
            Command::Upgrade(c) => self.upgrade(cx, c),
            Command::Downgrade(c) => self.downgrade(cx, c),
            Command::AcquireAll(c) => self.acquire_all(cx, c),
        };
        if restore {
            self.usage = Usage::of(self);
        } else {
            self.usage.follow(&self.sessions, &events);
        }
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
        // An upgrade waits while its shared grant is held.
        if self.upgrade_of(name, session, None).is_some() {
            return Acquired::Queued;
        }
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
