//! The nouns and verbs of the lock table: commands in, responses and events
//! out. All of them are plain data (serde) so they travel through the Raft
//! log unchanged.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::cmd;
use super::limits::MAX_NAME_LEN;

/// A session's id: the log index of the `OpenSession` that created it, so it
/// is unique for the life of the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SessionId(pub u64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "session {}", self.0)
    }
}

/// A fencing token: the value of the cluster-wide grant counter when the
/// grant was made. Strictly larger for every later grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Fence(pub u64);

/// A validated lock or semaphore name: UTF-8, 1..=[`MAX_NAME_LEN`] bytes.
/// Checked when it is made ([`LockName::new`]) and when it is decoded: a
/// log entry or snapshot holding a name that breaks the rules does not
/// decode. Encoded as the plain string.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String")]
pub struct LockName(String);

impl TryFrom<String> for LockName {
    type Error = Refusal;

    fn try_from(name: String) -> Result<Self, Refusal> {
        LockName::new(name)
    }
}

impl LockName {
    /// Checks `name` against the naming rules.
    pub fn new(name: impl Into<String>) -> Result<Self, Refusal> {
        let name = name.into();
        if name.is_empty() || name.len() > MAX_NAME_LEN {
            return Err(Refusal::InvalidName { len: name.len() });
        }
        Ok(LockName(name))
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for LockName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// What an acquire asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// An exclusive lock.
    Exclusive,
    /// A shared lock.
    Shared,
    /// `weight` permits of a semaphore of `capacity`.
    Semaphore {
        /// Permits wanted, 1..=capacity.
        weight: u32,
        /// The semaphore's capacity, 1..=[`MAX_CAPACITY`](super::limits::MAX_CAPACITY).
        capacity: u32,
    },
}

impl Mode {
    /// The weight this mode occupies (1 for locks).
    pub fn weight(self) -> u32 {
        match self {
            Mode::Exclusive | Mode::Shared => 1,
            Mode::Semaphore { weight, .. } => weight,
        }
    }

    /// True for semaphore permits.
    pub fn is_semaphore(self) -> bool {
        matches!(self, Mode::Semaphore { .. })
    }
}

/// A state-machine command: one struct per kind (see [`cmd`](super::cmd)).
/// Client commands carry `(session, seq)` for exactly-once application;
/// the leader's own commands (expiry, timeouts, lock-delay) do not.
///
/// The log holds commands in bincode, which numbers variants by position:
/// new variants go at the end, and none moves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// An open that does not end with its stream, in its first encoding.
    OpenSessionV0(cmd::OpenSessionV0),
    /// Close a session.
    CloseSession(cmd::CloseSession),
    /// Acquire a lock or semaphore permits.
    Acquire(cmd::Acquire),
    /// Release a grant.
    Release(cmd::Release),
    /// The leader saw a session's lease run out.
    ExpireSession(cmd::ExpireSession),
    /// The leader saw a wait's timeout run out.
    TimeoutWait(cmd::TimeoutWait),
    /// The leader saw a lock-delay run out.
    EndLockDelay(cmd::EndLockDelay),
    /// One part of a backup being restored.
    RestorePart(cmd::RestorePart),
    /// Cancel an acquire whatever became of it.
    Cancel(cmd::Cancel),
    /// Open a session.
    OpenSession(cmd::OpenSession),
    /// Open a session and acquire one name in it.
    Lock(cmd::Lock),
    /// Change a session's ttl.
    SetTtl(cmd::SetTtl),
    /// Upgrade a shared grant to exclusive.
    Upgrade(cmd::Upgrade),
    /// Downgrade an exclusive grant to shared.
    Downgrade(cmd::Downgrade),
    /// Acquire several names at once, all or none.
    AcquireAll(cmd::AcquireAll),
    /// An administrator ends a session, as an expiry would.
    RevokeSession(cmd::RevokeSession),
}

impl From<cmd::OpenSession> for Command {
    /// An open that does not end with its stream keeps its first encoding,
    /// so that a log read by an older node of the cluster (a rolling
    /// upgrade) keeps decoding.
    fn from(open: cmd::OpenSession) -> Self {
        if open.end_on_disconnect_ms == 0 {
            Command::OpenSessionV0(cmd::OpenSessionV0 {
                ttl_ms: open.ttl_ms,
                lock_delay_ms: open.lock_delay_ms,
                nonce: open.nonce,
                owner: open.owner,
            })
        } else {
            Command::OpenSession(open)
        }
    }
}

macro_rules! into_command {
    ($($kind:ident),+) => {
        $(impl From<cmd::$kind> for Command {
            fn from(c: cmd::$kind) -> Self {
                Command::$kind(c)
            }
        })+
    };
}

into_command!(
    CloseSession,
    Acquire,
    Release,
    ExpireSession,
    TimeoutWait,
    EndLockDelay,
    RestorePart,
    Cancel,
    Lock,
    SetTtl,
    Upgrade,
    Downgrade,
    AcquireAll,
    RevokeSession
);

impl Command {
    /// The checks that need no state: value size, ttl, lock-delay,
    /// capacity, weight, restore part numbers (names were checked when they
    /// were made). `apply` makes them too; handlers call this first so bad
    /// input never reaches the log.
    pub fn validate(&self) -> Result<(), Refusal> {
        match self {
            Command::OpenSessionV0(c) => c.validate(),
            Command::OpenSession(c) => c.validate(),
            Command::Lock(c) => c.validate(),
            Command::SetTtl(c) => c.validate(),
            Command::Acquire(c) => c.validate(),
            Command::RestorePart(c) => c.validate(),
            Command::AcquireAll(c) => c.validate(),
            Command::RevokeSession(c) => c.validate(),
            Command::CloseSession(_)
            | Command::Release(_)
            | Command::ExpireSession(_)
            | Command::TimeoutWait(_)
            | Command::EndLockDelay(_)
            | Command::Cancel(_)
            | Command::Upgrade(_)
            | Command::Downgrade(_) => Ok(()),
        }
    }
}

/// The sequence number the acquire of a one-call `Lock` has in its
/// session's reply window.
pub const LOCK_SEQ: u64 = 1;

/// The sequence number an `Unlock` closes a session under (a retried
/// `Unlock` is answered like the first).
pub const UNLOCK_SEQ: u64 = u64::MAX;

/// The outcome of an acquire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Acquired {
    /// Held now.
    Granted {
        /// The grant's fence.
        fence: Fence,
        /// The mode held.
        mode: Mode,
        /// The log index that made the grant.
        index: u64,
    },
    /// Queued; a `Granted` or `Cancelled` event for this session and name
    /// follows later.
    Queued,
    /// Not granted: a try that found the name busy, or a wait that was
    /// cancelled (timeout, session end).
    NotAcquired,
}

/// The reply to a command. Refusals are values: they change nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// A session was opened (or found, for a retried nonce).
    Opened {
        /// The session id.
        session: SessionId,
        /// Its ttl.
        ttl_ms: u64,
        /// Its lock-delay.
        lock_delay_ms: u64,
    },
    /// A session was closed; `released` grants were released.
    Closed {
        /// Number of grants released.
        released: u32,
    },
    /// The outcome of an acquire.
    Acquire(Acquired),
    /// The outcome of a release: `false` means nothing was held under that
    /// fence (not an error).
    Released {
        /// True if this command released the grant.
        released: bool,
    },
    /// The outcome of an expiry: `false` if the session was already gone.
    Expired {
        /// True if the session existed.
        existed: bool,
    },
    /// The outcome of a [`TimeoutWait`](super::cmd::TimeoutWait).
    WaitTimedOut {
        /// True if a wait ended.
        ended: bool,
    },
    /// The outcome of ending a lock-delay.
    DelayEnded {
        /// True if a delay ended.
        ended: bool,
    },
    /// A restore part was taken; `next` is the part expected next.
    RestorePartTaken {
        /// The next part's number.
        next: u32,
    },
    /// A backup was restored.
    Restored {
        /// Sessions restored.
        sessions: u64,
        /// The fence counter restored.
        last_fence: u64,
    },
    /// The command was refused and changed nothing.
    Refused(Refusal),
    /// The outcome of a [`Cancel`](super::cmd::Cancel): `true` if a wait
    /// left its queue or a grant was released.
    Cancelled {
        /// True if something was cancelled.
        cancelled: bool,
    },
    /// The outcome of a one-call `Lock`.
    Locked {
        /// The session the lock is (or waits to be) held by; 0 if it was
        /// not acquired (no session was left).
        session: SessionId,
        /// The session's ttl.
        ttl_ms: u64,
        /// The acquire's outcome.
        outcome: Acquired,
    },
    /// A session's ttl was changed.
    TtlSet {
        /// The new ttl.
        ttl_ms: u64,
    },
    /// An exclusive grant became shared.
    Downgraded,
    /// The outcome of an [`AcquireAll`](super::cmd::AcquireAll).
    AcquiredAll(AcquiredAll),
    /// A session was revoked; `released` grants ended.
    Revoked {
        /// Number of grants ended.
        released: u32,
    },
}

/// The outcome of an atomic acquire of several names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AcquiredAll {
    /// All held now: each name's fence and mode, in the request's order.
    Granted {
        /// One grant per name requested, in order.
        grants: Vec<(Fence, Mode)>,
        /// The log index that made the grants.
        index: u64,
    },
    /// Queued for every name; the grants (or the end of the wait) follow.
    Queued,
    /// Not granted: a try that found a name busy, or a wait that ended.
    NotAcquired,
}

/// Why a command was refused. Each maps to one gRPC status in `api/`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    /// Name empty or longer than `MAX_NAME_LEN` bytes.
    #[error("lock name must be 1..={max} bytes of UTF-8, got {len}", max = MAX_NAME_LEN)]
    InvalidName {
        /// The length given.
        len: usize,
    },
    /// Holder value longer than `MAX_VALUE_LEN`.
    #[error("holder value of {len} bytes exceeds the limit of {max}", max = super::limits::MAX_VALUE_LEN)]
    ValueTooLarge {
        /// The length given.
        len: usize,
    },
    /// Session ttl outside `MIN_SESSION_TTL_MS..=MAX_SESSION_TTL_MS`.
    #[error("session ttl must be {min}..={max} ms, got {ttl_ms}", min = super::limits::MIN_SESSION_TTL_MS, max = super::limits::MAX_SESSION_TTL_MS)]
    InvalidTtl {
        /// The ttl given.
        ttl_ms: u64,
    },
    /// Lock-delay above `MAX_LOCK_DELAY_MS`.
    #[error("lock-delay must be at most {max} ms, got {lock_delay_ms}", max = super::limits::MAX_LOCK_DELAY_MS)]
    InvalidLockDelay {
        /// The delay given.
        lock_delay_ms: u64,
    },
    /// Semaphore capacity outside `1..=MAX_CAPACITY`.
    #[error("semaphore capacity must be 1..={max}, got {capacity}", max = super::limits::MAX_CAPACITY)]
    InvalidCapacity {
        /// The capacity given.
        capacity: u32,
    },
    /// Semaphore weight outside `1..=capacity`.
    #[error("semaphore weight must be 1..={capacity}, got {weight}")]
    InvalidWeight {
        /// The weight given.
        weight: u32,
        /// The capacity it must fit.
        capacity: u32,
    },
    /// The semaphore exists with another capacity.
    #[error("semaphore {name} has capacity {existing}, not {requested}")]
    CapacityMismatch {
        /// The semaphore.
        name: LockName,
        /// Its capacity.
        existing: u32,
        /// The capacity asked for.
        requested: u32,
    },
    /// The name is a lock and a semaphore was asked for, or the reverse.
    #[error("{name} is a {existing}, not a {requested}")]
    KindMismatch {
        /// The name.
        name: LockName,
        /// "lock" or "semaphore".
        existing: String,
        /// "lock" or "semaphore".
        requested: String,
    },
    /// The session already holds or waits for the name in another mode
    /// (upgrades and downgrades are not supported).
    #[error("{session} already holds or waits for {name} in another mode")]
    OtherMode {
        /// The session.
        session: SessionId,
        /// The name.
        name: LockName,
    },
    /// The session is unknown, closed or expired.
    #[error("{session} not found (closed or expired)")]
    SessionNotFound {
        /// The session.
        session: SessionId,
    },
    /// The sequence number is older than the replies the session remembers.
    #[error("sequence number {seq} of {session} is older than the remembered window (oldest kept: {floor})")]
    SequenceTooOld {
        /// The session.
        session: SessionId,
        /// The sequence number given.
        seq: u64,
        /// Replies for sequence numbers at or below this are forgotten.
        floor: u64,
    },
    /// Waiting would close a wait-for cycle between sessions.
    #[error("deadlock: {}", describe_cycle(.cycle))]
    Deadlock {
        /// The cycle: each session waits for `name` held by (or queued ahead
        /// by) the next; the last waits for the first.
        cycle: Vec<WaitEdge>,
    },
    /// The name's queue is full (`MAX_WAITERS_PER_NAME`).
    #[error("queue of {name} is full ({max} waiters)", max = super::limits::MAX_WAITERS_PER_NAME)]
    TooManyWaiters {
        /// The name.
        name: LockName,
    },
    /// The session holds or waits for `MAX_LOCKS_PER_SESSION` names.
    #[error("{session} holds or waits for the maximum of {max} names", max = super::limits::MAX_LOCKS_PER_SESSION)]
    TooManyLocks {
        /// The session.
        session: SessionId,
    },
    /// The request came from an identity other than the session's owner
    /// (access control binds every session to the identity that opened it).
    #[error("{session} belongs to another identity")]
    NotOwner {
        /// The session.
        session: SessionId,
    },
    /// An owner identity longer than `MAX_OWNER_LEN` bytes.
    #[error("identity of {len} bytes exceeds the limit of {max}", max = super::limits::MAX_OWNER_LEN)]
    InvalidOwner {
        /// The length given.
        len: usize,
    },
    /// The cluster has `MAX_SESSIONS` open sessions.
    #[error("the cluster has the maximum of {max} open sessions", max = super::limits::MAX_SESSIONS)]
    TooManySessions,
    /// A restore was proposed to a table that is not empty.
    #[error("a backup can only be restored into an empty cluster")]
    RestoreIntoNonEmpty,
    /// A restore part that does not continue the restore under way, or
    /// whose size or numbering is out of bounds.
    #[error("restore part {part} of {parts} (restore {restore}) is out of order or out of bounds: {reason}")]
    InvalidRestorePart {
        /// The restore it claims to belong to.
        restore: u64,
        /// Its number.
        part: u32,
        /// The number of parts it claims.
        parts: u32,
        /// What is wrong.
        reason: String,
    },
    /// A restore carried bytes that are not a valid table.
    #[error("invalid backup: {reason}")]
    InvalidBackup {
        /// What is wrong with it.
        reason: String,
    },
    /// The table is not consistent with itself (a bug, or a backup that
    /// passed validation but should not have). The command is refused and
    /// changes nothing, instead of panicking every node at this entry.
    #[error("internal inconsistency in the lock table: {reason}")]
    Inconsistent {
        /// What was found.
        reason: String,
    },
    /// The session already holds the name in the mode asked for, through an
    /// earlier acquire. One session holds one grant per name: release it
    /// first (a repeat of that earlier acquire, with its seq, is answered
    /// with the grant).
    #[error("{session} already holds {name} (fence {}); release it before acquiring it again", fence.0)]
    AlreadyHeld {
        /// The session.
        session: SessionId,
        /// The name.
        name: LockName,
        /// The grant it holds.
        fence: Fence,
    },
    /// The sequence number was used by the session for another request
    /// (the remembered request differs): exactly-once needs a new seq per
    /// request.
    #[error("sequence number {seq} of {session} was used for another request; use a new seq for every request")]
    SequenceReused {
        /// The session.
        session: SessionId,
        /// The sequence number given.
        seq: u64,
    },
    /// The session already waits for the name in the mode asked for,
    /// through the acquire `seq`. Retry that acquire (same seq) to keep
    /// waiting, or withdraw it.
    #[error("{session} already waits for {name} (acquire seq {seq})")]
    AlreadyWaiting {
        /// The session.
        session: SessionId,
        /// The name.
        name: LockName,
        /// The waiting acquire's sequence number.
        seq: u64,
    },
    /// A restore's fence bump would take the backup's fence counter past
    /// [`MAX_FENCE`](super::limits::MAX_FENCE).
    #[error("a fence bump of {fence_bump} over the backup's fence counter {last_fence} would pass the largest fence, {max}; use a smaller bump", max = super::limits::MAX_FENCE)]
    FenceBumpTooLarge {
        /// The backup's fence counter.
        last_fence: u64,
        /// The bump asked for.
        fence_bump: u64,
    },
    /// The fence counter has reached [`MAX_FENCE`](super::limits::MAX_FENCE):
    /// no grant can get a new fence.
    #[error("the fence counter has reached the largest fence, {max}: nothing more can be granted (restore a backup with a smaller fence bump into a new cluster)", max = super::limits::MAX_FENCE)]
    FencesExhausted,
    /// A disconnect grace above `MAX_END_ON_DISCONNECT_MS`.
    #[error("end_on_disconnect_ms must be at most {max}, got {end_on_disconnect_ms}", max = super::limits::MAX_END_ON_DISCONNECT_MS)]
    InvalidDisconnectGrace {
        /// The grace given.
        end_on_disconnect_ms: u64,
    },
    /// An atomic request names no lock or too many.
    #[error("an atomic request takes 1..={max} locks, got {count}", max = super::limits::MAX_NAMES_PER_REQUEST)]
    InvalidLockCount {
        /// The number given.
        count: usize,
    },
    /// An atomic request names one lock twice.
    #[error("{name} appears more than once in one request")]
    DuplicateName {
        /// The name.
        name: LockName,
    },
    /// An upgrade or downgrade names a grant the session does not hold in
    /// the mode it changes from.
    #[error("{session} does not hold {name} with fence {} in {mode} mode", fence.0)]
    NotHeldInMode {
        /// The session.
        session: SessionId,
        /// The name.
        name: LockName,
        /// The fence named.
        fence: Fence,
        /// The mode it must be held in: "shared" to upgrade, "exclusive"
        /// to downgrade.
        mode: String,
    },
    /// The table holds `MAX_ENTRIES` grants and queued requests.
    #[error("the cluster holds the maximum of {max} grants and queued requests", max = super::limits::MAX_ENTRIES)]
    TooManyEntries,
    /// An identity reached one of its limits: `MAX_SESSIONS_PER_IDENTITY`
    /// open sessions, or `MAX_ENTRIES_PER_IDENTITY` grants and queued
    /// requests.
    #[error("identity {identity:?} has the maximum of {max} {what}")]
    IdentityLimit {
        /// The identity.
        identity: String,
        /// What it has the most of: "open sessions", or "grants and
        /// queued requests".
        what: String,
        /// The limit.
        max: usize,
    },
}

/// One edge of a wait-for cycle: `session` waits for `name`, which `blocker`
/// holds or is queued for ahead of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitEdge {
    /// The waiting session.
    pub session: SessionId,
    /// The name it waits for.
    pub name: LockName,
    /// The session in its way.
    pub blocker: SessionId,
}

fn describe_cycle(cycle: &[WaitEdge]) -> String {
    let mut out = String::new();
    for (i, e) in cycle.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&format!(
            "{} waits for {} held by or queued for by {}",
            e.session, e.name, e.blocker
        ));
    }
    out
}

/// Why a grant ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EndCause {
    /// Its holder released it.
    Released,
    /// Its session was closed.
    SessionClosed,
    /// Its session expired.
    SessionExpired,
    /// Its holder upgraded it: an exclusive grant with a new fence
    /// replaced it.
    Upgraded,
    /// Its session was revoked by an administrator
    /// ([`RevokeSession`](super::cmd::RevokeSession)).
    Revoked,
}

/// Why a wait ended without a grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CancelCause {
    /// The leader's timer for it ran out.
    TimedOut,
    /// Its session was closed or expired.
    SessionEnded,
    /// Its client cancelled it ([`Cancel`](super::cmd::Cancel)).
    Cancelled,
    /// The fence counter reached [`MAX_FENCE`](super::limits::MAX_FENCE):
    /// it can never be granted.
    FencesExhausted,
}

/// Something that happened while applying a command. The node uses events to
/// wake parked acquires, arm the leader's timers and feed watches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// A session opened.
    SessionOpened {
        /// The session.
        session: SessionId,
        /// Its ttl.
        ttl_ms: u64,
        /// Its grace after its last keep-alive stream ends (0: none).
        end_on_disconnect_ms: u64,
    },
    /// A session's ttl changed.
    SessionTtlChanged {
        /// The session.
        session: SessionId,
        /// The new ttl.
        ttl_ms: u64,
    },
    /// A session ended (closed, expired or revoked; a revoke is told by
    /// a [`SessionRevoked`](Event::SessionRevoked) just before).
    SessionEnded {
        /// The session.
        session: SessionId,
        /// True if by expiry (false for a close or a revoke).
        expired: bool,
    },
    /// A grant was made.
    Granted {
        /// The name.
        name: LockName,
        /// The holder.
        session: SessionId,
        /// The acquire's sequence number.
        seq: u64,
        /// The fence.
        fence: Fence,
        /// The mode.
        mode: Mode,
    },
    /// A request was queued.
    Queued {
        /// The name.
        name: LockName,
        /// The waiter.
        session: SessionId,
        /// The acquire's sequence number.
        seq: u64,
        /// The mode.
        mode: Mode,
        /// How long the leader lets it wait.
        timeout_ms: u64,
    },
    /// A grant ended.
    Ended {
        /// The name.
        name: LockName,
        /// The former holder.
        session: SessionId,
        /// The grant's fence.
        fence: Fence,
        /// The grant's mode.
        mode: Mode,
        /// Why.
        cause: EndCause,
    },
    /// A queued request was dropped without a grant.
    Cancelled {
        /// The name.
        name: LockName,
        /// The waiter.
        session: SessionId,
        /// The acquire's sequence number.
        seq: u64,
        /// The mode.
        mode: Mode,
        /// Why.
        cause: CancelCause,
    },
    /// A lock-delay began.
    LockDelayStarted {
        /// The name.
        name: LockName,
        /// The delay.
        delay_ms: u64,
        /// The log index that started it (pass to `EndLockDelay`).
        since: u64,
    },
    /// A lock-delay ended.
    LockDelayEnded {
        /// The name.
        name: LockName,
    },
    /// An exclusive grant became shared, keeping its fence.
    Downgraded {
        /// The name.
        name: LockName,
        /// The holding session.
        session: SessionId,
        /// The grant's fence.
        fence: Fence,
    },
    /// An administrator revoked a session: its grants end (with cause
    /// [`EndCause::Revoked`]) and its waits are cancelled, in the events
    /// that follow.
    SessionRevoked {
        /// The session.
        session: SessionId,
        /// Who asked (the command's `by`).
        by: String,
        /// When, by the proposing node's wall clock (ms since the epoch).
        at_unix_ms: u64,
    },
}

impl Event {
    /// The lock name this event concerns, if any.
    pub fn name(&self) -> Option<&LockName> {
        match self {
            Event::SessionOpened { .. }
            | Event::SessionEnded { .. }
            | Event::SessionTtlChanged { .. }
            | Event::SessionRevoked { .. } => None,
            Event::Granted { name, .. }
            | Event::Queued { name, .. }
            | Event::Ended { name, .. }
            | Event::Cancelled { name, .. }
            | Event::LockDelayStarted { name, .. }
            | Event::LockDelayEnded { name }
            | Event::Downgraded { name, .. } => Some(name),
        }
    }
}

/// The result of applying one command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// The answer for whoever proposed the command.
    pub reply: Reply,
    /// What changed, in order.
    pub events: Vec<Event>,
}
