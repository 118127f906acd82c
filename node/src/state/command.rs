//! The nouns and verbs of the lock table: commands in, responses and events
//! out. All of them are plain data (serde) so they travel through the Raft
//! log unchanged.

use std::fmt;

use serde::{Deserialize, Serialize};

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
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LockName(String);

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

/// A state-machine command. Client commands carry `(session, seq)` for
/// exactly-once application; the leader's own commands (expiry, timeouts,
/// lock-delay) do not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Open a session. The new session's id is the command's log index.
    OpenSession {
        /// Lease length in milliseconds.
        ttl_ms: u64,
        /// Lock-delay applied to the session's locks if it expires.
        lock_delay_ms: u64,
        /// Client-chosen value that makes a retried open return the same
        /// session (0 = no de-duplication).
        nonce: u64,
        /// The identity the session belongs to (empty without access
        /// control). Only requests from the same identity may use it.
        owner: String,
    },
    /// Close a session, releasing all it holds and cancelling its waits.
    CloseSession {
        /// The session to close.
        session: SessionId,
        /// Request sequence number.
        seq: u64,
        /// The identity the request came from; must be the session's owner.
        caller: String,
    },
    /// Acquire a lock or semaphore permits.
    Acquire {
        /// The session that will hold the grant.
        session: SessionId,
        /// Request sequence number.
        seq: u64,
        /// Lock or semaphore name (validated in apply).
        name: String,
        /// Exclusive, shared or semaphore.
        mode: Mode,
        /// 0 = never queue; [`WAIT_FOREVER`](super::limits::WAIT_FOREVER) =
        /// no timeout; else the leader cancels the wait after this long.
        timeout_ms: u64,
        /// Holder value (≤ [`MAX_VALUE_LEN`](super::limits::MAX_VALUE_LEN)).
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
        /// The identity the request came from; must be the session's owner.
        caller: String,
    },
    /// Release the grant with `fence` on `name` held by `session`.
    Release {
        /// The holding session.
        session: SessionId,
        /// Request sequence number.
        seq: u64,
        /// Lock or semaphore name.
        name: String,
        /// The grant's fence.
        fence: Fence,
        /// The identity the request came from; must be the session's owner.
        caller: String,
    },
    /// Proposed by the leader when a session's lease ran out.
    ExpireSession {
        /// The session that expired.
        session: SessionId,
    },
    /// Proposed by the leader when a waiter's timeout ran out.
    CancelWait {
        /// The waiting session.
        session: SessionId,
        /// The name waited for.
        name: String,
        /// The sequence number of the waiting acquire (a newer wait by the
        /// same session is left alone).
        seq: u64,
    },
    /// Proposed by the leader when a lock-delay ran out.
    EndLockDelay {
        /// The delayed name.
        name: String,
        /// The log index that started the delay (a newer delay is left alone).
        since: u64,
    },
    /// One part of a backup being restored into an empty table. A backup
    /// can be far larger than one log entry may reasonably be (followers
    /// must take each append within a heartbeat), so it travels in parts of
    /// at most [`MAX_RESTORE_PART`](super::limits::MAX_RESTORE_PART) bytes,
    /// in order. The last part installs the backup: sessions, grants,
    /// queues, lock-delays and the fence counter, so fences go on growing
    /// from where the backup left them.
    RestorePart {
        /// Chosen by the proposer; parts of different restores never mix.
        restore: u64,
        /// This part's number, from 0.
        part: u32,
        /// How many parts the backup has.
        parts: u32,
        /// The next [`LockTable::to_snapshot`](super::LockTable::to_snapshot)
        /// bytes.
        #[serde(with = "serde_bytes")]
        bytes: Vec<u8>,
        /// Added to the backup's fence counter when the last part installs
        /// it, so that fences the backup's cluster handed out after the
        /// backup was taken are never handed out again (see
        /// [`DEFAULT_RESTORE_FENCE_BUMP`](super::limits::DEFAULT_RESTORE_FENCE_BUMP)).
        /// The last part's value counts.
        fence_bump: u64,
    },
    /// Withdraw the acquire `seq` of `session` on `name`, whatever became of
    /// it: a queued wait leaves the queue; a grant made to it and still held
    /// is released; if the acquire has not been applied yet, it grants
    /// nothing when it is (it is answered "not acquired"). Sent by a client
    /// that gave up on an acquire whose outcome it does not know (a dropped
    /// future, a timeout, a leader change). Idempotent.
    Withdraw {
        /// The session that sent the acquire.
        session: SessionId,
        /// The acquire's sequence number.
        seq: u64,
        /// The name it asked for.
        name: String,
        /// The identity the request came from; must be the session's owner.
        caller: String,
    },
    // New variants go at the end: the log holds commands in bincode, which
    // numbers variants by position.
    /// Open a session with the options `OpenSession` lacks (today: ending
    /// with its keep-alive stream). Otherwise as `OpenSession`.
    OpenSessionWith {
        /// Lease length in milliseconds.
        ttl_ms: u64,
        /// Lock-delay applied to the session's locks if it expires.
        lock_delay_ms: u64,
        /// De-duplicates a retried open (0 = none).
        nonce: u64,
        /// The identity the session belongs to.
        owner: String,
        /// Grace after the session's last keep-alive stream on the leader
        /// ends before the leader expires it (0 = only its ttl ends it).
        end_on_disconnect_ms: u64,
    },
    /// Open a session and acquire one name in it, in one command (the
    /// one-call `Lock`). If the acquire is neither granted nor queued, no
    /// session is left; if it is queued and the wait ends without a grant,
    /// the session ends with it. A retry with the same nonce finds the
    /// session and the acquire's outcome.
    Lock {
        /// Lease length in milliseconds.
        ttl_ms: u64,
        /// Lock-delay applied to the session's locks if it expires.
        lock_delay_ms: u64,
        /// De-duplicates a retried lock (0 = none).
        nonce: u64,
        /// The identity the session belongs to.
        owner: String,
        /// As in `OpenSessionWith`.
        end_on_disconnect_ms: u64,
        /// Lock or semaphore name (validated in apply).
        name: String,
        /// Exclusive, shared or semaphore.
        mode: Mode,
        /// As in `Acquire`.
        timeout_ms: u64,
        /// Holder value.
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
    },
    /// Change a session's ttl: the leader restarts its lease at the new
    /// length.
    SetTtl {
        /// The session.
        session: SessionId,
        /// Request sequence number.
        seq: u64,
        /// The new lease length in milliseconds.
        ttl_ms: u64,
        /// The identity the request came from; must be the session's owner.
        caller: String,
    },
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
    /// The outcome of a wait cancellation.
    Cancelled {
        /// True if a wait was cancelled.
        cancelled: bool,
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
    /// The outcome of a withdrawal: `true` if a wait left its queue or a
    /// grant was released.
    Withdrawn {
        /// True if something was withdrawn.
        withdrawn: bool,
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
}

/// Why a wait ended without a grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CancelCause {
    /// The leader's timer for it ran out.
    TimedOut,
    /// Its session was closed or expired.
    SessionEnded,
    /// Its client withdrew it (`Withdraw`).
    Withdrawn,
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
    /// A session ended (closed or expired).
    SessionEnded {
        /// The session.
        session: SessionId,
        /// True if by expiry.
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
}

impl Event {
    /// The lock name this event concerns, if any.
    pub fn name(&self) -> Option<&LockName> {
        match self {
            Event::SessionOpened { .. }
            | Event::SessionEnded { .. }
            | Event::SessionTtlChanged { .. } => None,
            Event::Granted { name, .. }
            | Event::Queued { name, .. }
            | Event::Ended { name, .. }
            | Event::Cancelled { name, .. }
            | Event::LockDelayStarted { name, .. }
            | Event::LockDelayEnded { name } => Some(name),
        }
    }
}

/// [`Command::digest`] of an `Acquire` of `name` in `mode`.
fn acquire_digest(name: &str, mode: Mode, timeout_ms: u64, value: &[u8]) -> u64 {
    let mut h = Fnv::new(1);
    h.string(name.as_bytes());
    let (m, weight, capacity) = match mode {
        Mode::Exclusive => (0, 0, 0),
        Mode::Shared => (1, 0, 0),
        Mode::Semaphore { weight, capacity } => (2, weight, capacity),
    };
    h.u64(m);
    h.u64(u64::from(weight));
    h.u64(u64::from(capacity));
    h.u64(timeout_ms);
    h.string(value);
    h.0.max(1)
}

/// The result of applying one command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// The answer for whoever proposed the command.
    pub reply: Reply,
    /// What changed, in order.
    pub events: Vec<Event>,
}

/// FNV-1a, 64-bit: a digest of fixed-width fields, the same on every node
/// and platform.
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

    /// A length-prefixed byte string.
    fn string(&mut self, bytes: &[u8]) {
        self.u64(bytes.len() as u64);
        self.bytes(bytes);
    }
}

impl Command {
    /// A digest of what the request asks (not who sends it: the session and
    /// seq are the key it is remembered under), so a seq reused for another
    /// request can be told from a retry. Never 0 (0 means "unknown" in the
    /// reply window).
    pub fn digest(&self) -> u64 {
        let h = match self {
            Command::Acquire {
                name,
                mode,
                timeout_ms,
                value,
                ..
            } => return acquire_digest(name, *mode, *timeout_ms, value),
            Command::Release { name, fence, .. } => {
                let mut h = Fnv::new(2);
                h.string(name.as_bytes());
                h.u64(fence.0);
                h
            }
            Command::CloseSession { .. } => Fnv::new(3),
            Command::SetTtl { ttl_ms, .. } => {
                let mut h = Fnv::new(4);
                h.u64(*ttl_ms);
                h
            }
            // A one-call lock's acquire is remembered under the digest of
            // the equivalent `Acquire`.
            Command::Lock {
                name,
                mode,
                timeout_ms,
                value,
                ..
            } => return acquire_digest(name, *mode, *timeout_ms, value),
            _ => Fnv::new(0),
        };
        h.0.max(1)
    }

    /// The checks that need no state: name, value size, ttl, lock-delay,
    /// capacity and weight. `apply` makes them too; handlers call this first
    /// so bad input never reaches the log.
    pub fn validate(&self) -> Result<(), Refusal> {
        use super::limits::*;
        let session = |ttl_ms: u64, lock_delay_ms: u64, owner: &str, grace: u64| {
            if owner.len() > MAX_OWNER_LEN {
                return Err(Refusal::InvalidOwner { len: owner.len() });
            }
            if !(MIN_SESSION_TTL_MS..=MAX_SESSION_TTL_MS).contains(&ttl_ms) {
                return Err(Refusal::InvalidTtl { ttl_ms });
            }
            if lock_delay_ms > MAX_LOCK_DELAY_MS {
                return Err(Refusal::InvalidLockDelay { lock_delay_ms });
            }
            if grace > MAX_END_ON_DISCONNECT_MS {
                return Err(Refusal::InvalidDisconnectGrace {
                    end_on_disconnect_ms: grace,
                });
            }
            Ok(())
        };
        let acquire = |name: &str, mode: Mode, value: &[u8]| {
            LockName::new(name)?;
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
        };
        match self {
            Command::OpenSession {
                ttl_ms,
                lock_delay_ms,
                owner,
                ..
            } => session(*ttl_ms, *lock_delay_ms, owner, 0)?,
            Command::OpenSessionWith {
                ttl_ms,
                lock_delay_ms,
                owner,
                end_on_disconnect_ms,
                ..
            } => session(*ttl_ms, *lock_delay_ms, owner, *end_on_disconnect_ms)?,
            Command::Lock {
                ttl_ms,
                lock_delay_ms,
                owner,
                end_on_disconnect_ms,
                name,
                mode,
                value,
                ..
            } => {
                session(*ttl_ms, *lock_delay_ms, owner, *end_on_disconnect_ms)?;
                acquire(name, *mode, value)?;
            }
            Command::SetTtl { ttl_ms, .. } => {
                if !(MIN_SESSION_TTL_MS..=MAX_SESSION_TTL_MS).contains(ttl_ms) {
                    return Err(Refusal::InvalidTtl { ttl_ms: *ttl_ms });
                }
            }
            Command::Acquire {
                name, mode, value, ..
            } => acquire(name, *mode, value)?,
            Command::Release { name, .. }
            | Command::Withdraw { name, .. }
            | Command::CancelWait { name, .. }
            | Command::EndLockDelay { name, .. } => {
                LockName::new(name.as_str())?;
            }
            Command::RestorePart {
                restore,
                part,
                parts,
                bytes,
                ..
            } => {
                let bad = |reason: String| {
                    Err(Refusal::InvalidRestorePart {
                        restore: *restore,
                        part: *part,
                        parts: *parts,
                        reason,
                    })
                };
                if *parts == 0 || part >= parts {
                    return bad("part numbers run from 0 to parts - 1".into());
                }
                if bytes.len() > MAX_RESTORE_PART {
                    return bad(format!(
                        "{} bytes, more than the {MAX_RESTORE_PART} a part may carry",
                        bytes.len()
                    ));
                }
            }
            Command::CloseSession { .. } | Command::ExpireSession { .. } => {}
        }
        Ok(())
    }
}
