//! One struct per state-machine command, each with the answer it gets.
//!
//! A command is built once, where a request is converted (`api/`, the
//! leader's timers), with its name already a [`LockName`]: a name is
//! checked when it is made, and a log entry whose name breaks the rules
//! does not decode. [`Command`](super::Command) wraps each struct in the
//! variant at the position the log has always used for it; the fields of
//! each struct are in the order the log has always held them, so the
//! encoding is byte for byte that of the positional variants these
//! replaced (`state/tests/golden.rs` decodes entries and snapshots written
//! before).
//!
//! The same words name the same thing in every layer: the `Cancel` RPC is
//! [`Cancel`], a wait's timeout ending it is [`TimeoutWait`].

use serde::{Deserialize, Serialize};

use super::command::{Acquired, AcquiredAll, Fence, LockName, Mode, Refusal, Reply, SessionId};
use super::limits::{
    MAX_CAPACITY, MAX_END_ON_DISCONNECT_MS, MAX_LOCK_DELAY_MS, MAX_NAMES_PER_REQUEST,
    MAX_OWNER_LEN, MAX_RESTORE_PART, MAX_SESSION_TTL_MS, MAX_VALUE_LEN, MIN_SESSION_TTL_MS,
};

/// Open a session. The new session's id is the command's log index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenSession {
    /// Lease length in milliseconds.
    pub ttl_ms: u64,
    /// Lock-delay applied to the session's locks if it expires.
    pub lock_delay_ms: u64,
    /// Client-chosen value that makes a retried open return the same
    /// session (0 = no de-duplication).
    pub nonce: u64,
    /// The identity the session belongs to (empty without access
    /// control). Only requests from the same identity may use it.
    pub owner: String,
    /// Grace after the session's last keep-alive stream on the leader
    /// ends before the leader expires it (0 = only its ttl ends it).
    pub end_on_disconnect_ms: u64,
}

/// The first encoding of [`OpenSession`], without `end_on_disconnect_ms`.
/// An open that does not end with its stream is still written this way, so
/// that a log read by an older node of the cluster (a rolling upgrade)
/// keeps decoding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenSessionV0 {
    /// As in [`OpenSession`].
    pub ttl_ms: u64,
    /// As in [`OpenSession`].
    pub lock_delay_ms: u64,
    /// As in [`OpenSession`].
    pub nonce: u64,
    /// As in [`OpenSession`].
    pub owner: String,
}

impl From<OpenSessionV0> for OpenSession {
    fn from(v0: OpenSessionV0) -> Self {
        OpenSession {
            ttl_ms: v0.ttl_ms,
            lock_delay_ms: v0.lock_delay_ms,
            nonce: v0.nonce,
            owner: v0.owner,
            end_on_disconnect_ms: 0,
        }
    }
}

/// Close a session, releasing all it holds and cancelling its waits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloseSession {
    /// The session to close.
    pub session: SessionId,
    /// Request sequence number.
    pub seq: u64,
    /// The identity the request came from; must be the session's owner.
    pub caller: String,
}

/// Acquire a lock or semaphore permits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acquire {
    /// The session that will hold the grant.
    pub session: SessionId,
    /// Request sequence number.
    pub seq: u64,
    /// Lock or semaphore name.
    pub name: LockName,
    /// Exclusive, shared or semaphore.
    pub mode: Mode,
    /// 0 = never queue; [`WAIT_FOREVER`](super::limits::WAIT_FOREVER) = no
    /// timeout; else the leader ends the wait after this long
    /// ([`TimeoutWait`]).
    pub timeout_ms: u64,
    /// Holder value (≤ [`MAX_VALUE_LEN`]).
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    /// The identity the request came from; must be the session's owner.
    pub caller: String,
}

/// Release the grant with `fence` on `name` held by `session`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Release {
    /// The holding session.
    pub session: SessionId,
    /// Request sequence number.
    pub seq: u64,
    /// Lock or semaphore name.
    pub name: LockName,
    /// The grant's fence.
    pub fence: Fence,
    /// The identity the request came from; must be the session's owner.
    pub caller: String,
}

/// Proposed by the leader when a session's lease ran out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpireSession {
    /// The session that expired.
    pub session: SessionId,
}

/// Proposed by an administrator (the `RevokeSession` RPC) to end a
/// session now, as if its lease had run out: its grants end (lock-delay
/// applies), its waits are withdrawn, and the next waiters get new, larger
/// fences. `by` and `at_unix_ms` are information for the record only
/// (events, logs); nothing in the table depends on them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevokeSession {
    /// The session to end.
    pub session: SessionId,
    /// The identity that asked (empty without access control), at most
    /// [`MAX_OWNER_LEN`] bytes.
    pub by: String,
    /// The proposing node's wall-clock time, milliseconds since the Unix
    /// epoch: when the revoke was asked for, as that node's clock says.
    pub at_unix_ms: u64,
}

/// Proposed by the leader when a waiter's timeout ran out: the wait ends,
/// not acquired.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeoutWait {
    /// The waiting session.
    pub session: SessionId,
    /// The name waited for.
    pub name: LockName,
    /// The sequence number of the waiting acquire (a newer wait by the
    /// same session is left alone).
    pub seq: u64,
}

/// Proposed by the leader when a lock-delay ran out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndLockDelay {
    /// The delayed name.
    pub name: LockName,
    /// The log index that started the delay (a newer delay is left alone).
    pub since: u64,
}

/// One part of a backup being restored into an empty table. A backup can
/// be far larger than one log entry may reasonably be (followers must take
/// each append within a heartbeat), so it travels in parts of at most
/// [`MAX_RESTORE_PART`] bytes, in order. The last part installs the
/// backup: sessions, grants, queues, lock-delays and the fence counter, so
/// fences go on growing from where the backup left them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestorePart {
    /// Chosen by the proposer; parts of different restores never mix.
    pub restore: u64,
    /// This part's number, from 0.
    pub part: u32,
    /// How many parts the backup has.
    pub parts: u32,
    /// The next [`LockTable::to_snapshot`](super::LockTable::to_snapshot)
    /// bytes.
    #[serde(with = "serde_bytes")]
    pub bytes: Vec<u8>,
    /// Added to the backup's fence counter when the last part installs it,
    /// so that fences the backup's cluster handed out after the backup was
    /// taken are never handed out again (see
    /// [`DEFAULT_RESTORE_FENCE_BUMP`](super::limits::DEFAULT_RESTORE_FENCE_BUMP)).
    /// The last part's value counts.
    pub fence_bump: u64,
}

/// Cancel the acquire `seq` of `session` on `name`, whatever became of it:
/// a queued wait leaves the queue; a grant made to it and still held is
/// released; if the acquire has not been applied yet, it grants nothing
/// when it is (it is answered "not acquired"). Sent by a client that gave
/// up on an acquire whose outcome it does not know (a dropped future, a
/// timeout, a leader change). Idempotent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cancel {
    /// The session that sent the acquire.
    pub session: SessionId,
    /// The acquire's sequence number.
    pub seq: u64,
    /// The name it asked for.
    pub name: LockName,
    /// The identity the request came from; must be the session's owner.
    pub caller: String,
}

/// Open a session and acquire one name in it, in one command (the one-call
/// `Lock`). If the acquire is neither granted nor queued, no session is
/// left; if it is queued and the wait ends without a grant, the session
/// ends with it. A retry with the same nonce finds the session and the
/// acquire's outcome. The acquire has seq [`LOCK_SEQ`](super::LOCK_SEQ) in
/// its session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lock {
    /// The session to open.
    pub open: OpenSession,
    /// Lock or semaphore name.
    pub name: LockName,
    /// Exclusive, shared or semaphore.
    pub mode: Mode,
    /// As in [`Acquire`].
    pub timeout_ms: u64,
    /// Holder value.
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
}

/// Change a session's ttl: the leader restarts its lease at the new
/// length.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetTtl {
    /// The session.
    pub session: SessionId,
    /// Request sequence number.
    pub seq: u64,
    /// The new lease length in milliseconds.
    pub ttl_ms: u64,
    /// The identity the request came from; must be the session's owner.
    pub caller: String,
}

/// Upgrade the shared grant `fence` on `name` held by `session` to
/// exclusive. Granted (a new grant, with a new fence, replacing the shared
/// one) once the session's grant is the lock's only one; until then it
/// waits ahead of everyone queued, and no new grant is made on the name.
/// While it waits the shared grant stays held. A second holder asking to
/// upgrade the same lock would wait for the first forever: it is refused
/// as a deadlock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Upgrade {
    /// The holding session.
    pub session: SessionId,
    /// Request sequence number.
    pub seq: u64,
    /// The lock's name.
    pub name: LockName,
    /// The shared grant to upgrade.
    pub fence: Fence,
    /// As in [`Acquire`]: 0 = only if it can be granted at once.
    pub timeout_ms: u64,
    /// The identity the request came from; must be the session's owner.
    pub caller: String,
}

/// Downgrade the exclusive grant `fence` on `name` held by `session` to
/// shared, at once, keeping its fence (it only weakens); shared requests
/// queued behind it are granted with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Downgrade {
    /// The holding session.
    pub session: SessionId,
    /// Request sequence number.
    pub seq: u64,
    /// The lock's name.
    pub name: LockName,
    /// The exclusive grant to downgrade.
    pub fence: Fence,
    /// The identity the request came from; must be the session's owner.
    pub caller: String,
}

/// Acquire several names at once: all are granted in one step (each grant
/// with its own fence, in the request's order) or none is. A request that
/// cannot be granted at once (and may wait) takes its place at the end of
/// every name's queue in the same step, and is granted when it is at the
/// head of each queue and fits each name: it never barges, and two atomic
/// requests never wait for each other (whichever came first is ahead of
/// the other in every queue they share).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcquireAll {
    /// The session that will hold the grants.
    pub session: SessionId,
    /// Request sequence number.
    pub seq: u64,
    /// The names and modes, 1..=[`MAX_NAMES_PER_REQUEST`], each name once.
    pub locks: Vec<(LockName, Mode)>,
    /// As in [`Acquire`].
    pub timeout_ms: u64,
    /// Holder value of every grant.
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    /// The identity the request came from; must be the session's owner.
    pub caller: String,
}

/// A session was opened (or found, for a retried nonce).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opened {
    /// The session id.
    pub session: SessionId,
    /// Its ttl.
    pub ttl_ms: u64,
    /// Its lock-delay.
    pub lock_delay_ms: u64,
}

/// The outcome of a one-call [`Lock`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Locked {
    /// The session the lock is (or waits to be) held by; 0 if it was not
    /// acquired (no session was left).
    pub session: SessionId,
    /// The session's ttl.
    pub ttl_ms: u64,
    /// The acquire's outcome.
    pub outcome: Acquired,
}

/// Where a restore stands after one [`RestorePart`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestoreProgress {
    /// The part was taken; this part number is expected next.
    Next(u32),
    /// The last part installed the backup.
    Restored {
        /// Sessions restored.
        sessions: u64,
        /// The fence counter restored.
        last_fence: u64,
    },
}

/// A command and the answer it gets when applied (a refusal aside).
pub trait Request: Into<super::Command> {
    /// What applying the command answers.
    type Answer;

    /// Takes this command's answer out of `reply`; `Err` gives back a reply
    /// this kind of command never gets (a bug, reported by the caller).
    fn answer(reply: Reply) -> Result<Self::Answer, Reply>;
}

macro_rules! request {
    ($cmd:ty, $answer:ty, $($pattern:pat => $value:expr),+ $(,)?) => {
        impl Request for $cmd {
            type Answer = $answer;

            fn answer(reply: Reply) -> Result<$answer, Reply> {
                match reply {
                    $($pattern => Ok($value),)+
                    #[allow(unreachable_patterns)]
                    other => Err(other),
                }
            }
        }
    };
}

request!(OpenSession, Opened,
    Reply::Opened { session, ttl_ms, lock_delay_ms } => Opened { session, ttl_ms, lock_delay_ms });
request!(CloseSession, u32, Reply::Closed { released } => released);
request!(Acquire, Acquired, Reply::Acquire(outcome) => outcome);
request!(Release, bool, Reply::Released { released } => released);
request!(ExpireSession, bool, Reply::Expired { existed } => existed);
request!(TimeoutWait, bool, Reply::WaitTimedOut { ended } => ended);
request!(EndLockDelay, bool, Reply::DelayEnded { ended } => ended);
request!(RestorePart, RestoreProgress,
    Reply::RestorePartTaken { next } => RestoreProgress::Next(next),
    Reply::Restored { sessions, last_fence } => RestoreProgress::Restored { sessions, last_fence });
request!(Cancel, bool, Reply::Cancelled { cancelled } => cancelled);
request!(Lock, Locked,
    Reply::Locked { session, ttl_ms, outcome } => Locked { session, ttl_ms, outcome });
request!(SetTtl, u64, Reply::TtlSet { ttl_ms } => ttl_ms);
request!(Upgrade, Acquired, Reply::Acquire(outcome) => outcome);
request!(Downgrade, (), Reply::Downgraded => ());
request!(AcquireAll, AcquiredAll, Reply::AcquiredAll(outcome) => outcome);
request!(RevokeSession, u32, Reply::Revoked { released } => released);

/// The checks a session's options get, before any state is looked at.
fn check_session(
    ttl_ms: u64,
    lock_delay_ms: u64,
    owner: &str,
    end_on_disconnect_ms: u64,
) -> Result<(), Refusal> {
    if owner.len() > MAX_OWNER_LEN {
        return Err(Refusal::InvalidOwner { len: owner.len() });
    }
    check_ttl(ttl_ms)?;
    if lock_delay_ms > MAX_LOCK_DELAY_MS {
        return Err(Refusal::InvalidLockDelay { lock_delay_ms });
    }
    if end_on_disconnect_ms > MAX_END_ON_DISCONNECT_MS {
        return Err(Refusal::InvalidDisconnectGrace {
            end_on_disconnect_ms,
        });
    }
    Ok(())
}

fn check_ttl(ttl_ms: u64) -> Result<(), Refusal> {
    if !(MIN_SESSION_TTL_MS..=MAX_SESSION_TTL_MS).contains(&ttl_ms) {
        return Err(Refusal::InvalidTtl { ttl_ms });
    }
    Ok(())
}

/// The checks an acquire gets before any state is looked at (its name was
/// checked when it was made).
fn check_acquire(mode: Mode, value: &[u8]) -> Result<(), Refusal> {
    if value.len() > MAX_VALUE_LEN {
        return Err(Refusal::ValueTooLarge { len: value.len() });
    }
    if let Mode::Semaphore { weight, capacity } = mode {
        if !(1..=MAX_CAPACITY).contains(&capacity) {
            return Err(Refusal::InvalidCapacity { capacity });
        }
        if !(1..=capacity).contains(&weight) {
            return Err(Refusal::InvalidWeight { weight, capacity });
        }
    }
    Ok(())
}

impl OpenSession {
    /// Checks the session's options.
    pub fn validate(&self) -> Result<(), Refusal> {
        check_session(
            self.ttl_ms,
            self.lock_delay_ms,
            &self.owner,
            self.end_on_disconnect_ms,
        )
    }
}

impl OpenSessionV0 {
    /// Checks the session's options.
    pub fn validate(&self) -> Result<(), Refusal> {
        check_session(self.ttl_ms, self.lock_delay_ms, &self.owner, 0)
    }
}

impl Acquire {
    /// Checks the value's size and a semaphore's capacity and weight.
    pub fn validate(&self) -> Result<(), Refusal> {
        check_acquire(self.mode, &self.value)
    }

    /// What the reply window tells this acquire apart from another under
    /// the same seq by.
    pub fn digest(&self) -> u64 {
        acquire_digest(&self.name, self.mode, self.timeout_ms, &self.value)
    }
}

impl Lock {
    /// Checks the session's options and the acquire's.
    pub fn validate(&self) -> Result<(), Refusal> {
        self.open.validate()?;
        check_acquire(self.mode, &self.value)
    }

    /// A one-call lock's acquire is remembered under the digest of the
    /// equivalent [`Acquire`].
    pub fn digest(&self) -> u64 {
        acquire_digest(&self.name, self.mode, self.timeout_ms, &self.value)
    }
}

impl Release {
    /// As [`Acquire::digest`].
    pub fn digest(&self) -> u64 {
        let mut h = Fnv::new(2);
        h.string(self.name.as_str().as_bytes());
        h.u64(self.fence.0);
        h.finish()
    }
}

impl CloseSession {
    /// As [`Acquire::digest`].
    pub fn digest(&self) -> u64 {
        Fnv::new(3).finish()
    }
}

impl SetTtl {
    /// Checks the new ttl.
    pub fn validate(&self) -> Result<(), Refusal> {
        check_ttl(self.ttl_ms)
    }

    /// As [`Acquire::digest`].
    pub fn digest(&self) -> u64 {
        let mut h = Fnv::new(4);
        h.u64(self.ttl_ms);
        h.finish()
    }
}

impl AcquireAll {
    /// Checks the count of names, that none repeats, and each mode and the
    /// value as an acquire's.
    pub fn validate(&self) -> Result<(), Refusal> {
        let count = self.locks.len();
        if !(1..=MAX_NAMES_PER_REQUEST).contains(&count) {
            return Err(Refusal::InvalidLockCount { count });
        }
        let mut seen = std::collections::BTreeSet::new();
        for (name, mode) in &self.locks {
            if !seen.insert(name) {
                return Err(Refusal::DuplicateName { name: name.clone() });
            }
            check_acquire(*mode, &self.value)?;
        }
        Ok(())
    }

    /// As [`Acquire::digest`].
    pub fn digest(&self) -> u64 {
        let mut h = Fnv::new(7);
        h.u64(self.locks.len() as u64);
        for (name, mode) in &self.locks {
            h.string(name.as_str().as_bytes());
            let (m, weight, capacity) = mode_parts(*mode);
            h.u64(m);
            h.u64(u64::from(weight));
            h.u64(u64::from(capacity));
        }
        h.u64(self.timeout_ms);
        h.string(&self.value);
        h.finish()
    }
}

impl Upgrade {
    /// As [`Acquire::digest`].
    pub fn digest(&self) -> u64 {
        let mut h = Fnv::new(5);
        h.string(self.name.as_str().as_bytes());
        h.u64(self.fence.0);
        h.u64(self.timeout_ms);
        h.finish()
    }
}

impl Downgrade {
    /// As [`Acquire::digest`].
    pub fn digest(&self) -> u64 {
        let mut h = Fnv::new(6);
        h.string(self.name.as_str().as_bytes());
        h.u64(self.fence.0);
        h.finish()
    }
}

impl RevokeSession {
    /// Checks the session id (ids are log indexes, never 0) and the length
    /// of `by`.
    pub fn validate(&self) -> Result<(), Refusal> {
        if self.session.0 == 0 {
            return Err(Refusal::SessionNotFound {
                session: self.session,
            });
        }
        if self.by.len() > MAX_OWNER_LEN {
            return Err(Refusal::InvalidOwner { len: self.by.len() });
        }
        Ok(())
    }
}

impl RestorePart {
    /// Checks the part's numbering and size.
    pub fn validate(&self) -> Result<(), Refusal> {
        let bad = |reason: String| {
            Err(Refusal::InvalidRestorePart {
                restore: self.restore,
                part: self.part,
                parts: self.parts,
                reason,
            })
        };
        if self.parts == 0 || self.part >= self.parts {
            return bad("part numbers run from 0 to parts - 1".into());
        }
        if self.bytes.len() > MAX_RESTORE_PART {
            return bad(format!(
                "{} bytes, more than the {MAX_RESTORE_PART} a part may carry",
                self.bytes.len()
            ));
        }
        Ok(())
    }
}

fn acquire_digest(name: &LockName, mode: Mode, timeout_ms: u64, value: &[u8]) -> u64 {
    let mut h = Fnv::new(1);
    h.string(name.as_str().as_bytes());
    let (m, weight, capacity) = mode_parts(mode);
    h.u64(m);
    h.u64(u64::from(weight));
    h.u64(u64::from(capacity));
    h.u64(timeout_ms);
    h.string(value);
    h.finish()
}

/// A mode as the digests hash it.
fn mode_parts(mode: Mode) -> (u64, u32, u32) {
    match mode {
        Mode::Exclusive => (0, 0, 0),
        Mode::Shared => (1, 0, 0),
        Mode::Semaphore { weight, capacity } => (2, weight, capacity),
    }
}

/// FNV-1a over a kind byte and the fields that make a request what it is;
/// never 0 (0 is "no digest" in the reply window).
struct Fnv(u64);

impl Fnv {
    fn new(kind: u8) -> Self {
        let mut h = Fnv(0xcbf2_9ce4_8422_2325);
        h.bytes(&[kind]);
        h
    }

    fn bytes(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }

    fn string(&mut self, bytes: &[u8]) {
        self.u64(bytes.len() as u64);
        self.bytes(bytes);
    }

    fn finish(self) -> u64 {
        self.0.max(1)
    }
}
