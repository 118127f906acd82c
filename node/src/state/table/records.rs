//! What the table is made of: sessions, locks, their holders and waiters,
//! lock-delays, closed sessions and a restore under way.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::{Holders, Replies};
use crate::state::command::{Fence, LockName, Mode, SessionId};

/// A restore under way.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(in crate::state) struct PendingRestore {
    /// The proposer's id for it.
    pub(in crate::state) restore: u64,
    /// The part expected next.
    pub(in crate::state) next: u32,
    /// How many parts there are.
    pub(in crate::state) parts: u32,
    /// The bytes so far.
    #[serde(with = "serde_bytes")]
    pub(in crate::state) bytes: Vec<u8>,
}

/// The last restore installed into a table, and its answer, so that the
/// same restore retried (its answer lost to a leader change) is answered
/// as it was rather than refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(in crate::state) struct RestoreDone {
    /// The proposer's id for it.
    pub(in crate::state) restore: u64,
    /// The sessions it installed.
    pub(in crate::state) sessions: u64,
    /// The fence counter it started from.
    pub(in crate::state) last_fence: u64,
}

/// One open session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(in crate::state) struct Session {
    /// Lease length; the leader's timers use it.
    pub(in crate::state) ttl_ms: u64,
    /// Lock-delay applied to held names on expiry.
    pub(in crate::state) lock_delay_ms: u64,
    /// The nonce it was opened with (0 = none).
    pub(in crate::state) nonce: u64,
    /// The identity that opened it (empty without access control); only
    /// that identity may use it.
    pub(in crate::state) owner: String,
    /// Names held, with the grant's fence. One grant per name per session.
    pub(in crate::state) held: BTreeMap<LockName, Fence>,
    /// Names waited for, with the waiting request.
    pub(in crate::state) waiting: BTreeMap<LockName, WaitRef>,
    /// Remembered replies for exactly-once retries.
    pub(in crate::state) replies: Replies,
    /// Grace after its last keep-alive stream on the leader ends before the
    /// leader expires it (0: only its ttl ends it). The leader's timers use
    /// it; the table only keeps it.
    pub(in crate::state) end_on_disconnect_ms: u64,
    /// Opened by a one-call `Lock` whose acquire is still queued: if that
    /// wait ends without a grant, the session (opened for nothing else)
    /// ends with it. Cleared when the acquire is granted.
    pub(in crate::state) lock_pending: bool,
}

/// Where a session's wait sits in a queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(in crate::state) struct WaitRef {
    /// The acquire's sequence number.
    pub(in crate::state) seq: u64,
    /// The log index that queued it; queues are sorted by it.
    pub(in crate::state) index: u64,
}

/// A session closed by its client, remembered so a retried close is
/// answered like the first (see [`MAX_REMEMBERED_CLOSES`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(in crate::state) struct Closed {
    /// The close's command index: the oldest close is forgotten first.
    pub(in crate::state) index: u64,
    /// The close's sequence number.
    pub(in crate::state) seq: u64,
    /// Grants it released.
    pub(in crate::state) released: u32,
    /// The identity that owned the session.
    pub(in crate::state) owner: String,
}

/// One name's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(in crate::state) struct Lock {
    /// `Some(capacity)` for a semaphore, `None` for a lock.
    pub(in crate::state) capacity: Option<u32>,
    /// Current grants by fence, which is also grant order.
    pub(in crate::state) holders: Holders,
    /// Sum of holders' weights.
    pub(in crate::state) held_weight: u64,
    /// Waiting requests in arrival order (ascending `index`).
    pub(in crate::state) queue: VecDeque<Waiter>,
    /// Lock-delay in force, if any.
    pub(in crate::state) delay: Option<Delay>,
}

/// A grant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(in crate::state) struct Holder {
    pub(in crate::state) session: SessionId,
    pub(in crate::state) seq: u64,
    pub(in crate::state) mode: Mode,
    #[serde(with = "serde_bytes")]
    pub(in crate::state) value: Vec<u8>,
    /// Log index of the grant.
    pub(in crate::state) index: u64,
}

/// A queued request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(in crate::state) struct Waiter {
    pub(in crate::state) session: SessionId,
    pub(in crate::state) seq: u64,
    pub(in crate::state) mode: Mode,
    #[serde(with = "serde_bytes")]
    pub(in crate::state) value: Vec<u8>,
    pub(in crate::state) timeout_ms: u64,
    /// Log index at which it was queued.
    pub(in crate::state) index: u64,
}

/// A shared holder's pending upgrade to exclusive. At most one per lock
/// (a second would wait for the first forever and is refused as a
/// deadlock); it goes ahead of everyone queued: no new grant is made on the
/// lock while it waits, and it is granted as soon as its own shared grant
/// is the lock's only one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(in crate::state) struct Upgrade {
    /// The holding session.
    pub(in crate::state) session: SessionId,
    /// The upgrade request's sequence number.
    pub(in crate::state) seq: u64,
    /// The shared grant being upgraded.
    pub(in crate::state) fence: Fence,
    /// How long it may wait, as an acquire's.
    pub(in crate::state) timeout_ms: u64,
    /// Log index at which it began waiting.
    pub(in crate::state) index: u64,
}

/// A lock-delay in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(in crate::state) struct Delay {
    /// Log index that started it.
    pub(in crate::state) since: u64,
    /// Its length (the leader's timer counts it).
    pub(in crate::state) delay_ms: u64,
}

impl Lock {
    pub(in crate::state) fn new(mode: Mode) -> Self {
        Lock {
            capacity: match mode {
                Mode::Semaphore { capacity, .. } => Some(capacity),
                _ => None,
            },
            holders: Holders::default(),
            held_weight: 0,
            queue: VecDeque::new(),
            delay: None,
        }
    }

    /// Whether a request in `mode` could be granted if it were at the head of
    /// the queue (ignores the queue itself).
    pub(in crate::state) fn compatible(&self, mode: Mode) -> bool {
        if self.delay.is_some() {
            return false;
        }
        match (self.capacity, mode) {
            (Some(cap), _) => self.held_weight + u64::from(mode.weight()) <= u64::from(cap),
            (None, Mode::Shared) => {
                // If any holder is exclusive it is the only one.
                self.holders
                    .values()
                    .next()
                    .is_none_or(|h| h.mode == Mode::Shared)
            }
            (None, _) => self.holders.is_empty(),
        }
    }

    pub(in crate::state) fn is_idle(&self) -> bool {
        self.holders.is_empty() && self.queue.is_empty() && self.delay.is_none()
    }

    pub(in crate::state) fn kind(&self) -> &'static str {
        if self.capacity.is_some() {
            "semaphore"
        } else {
            "lock"
        }
    }

    /// Position of the waiter queued at `index` (queues are sorted by it).
    pub(in crate::state) fn position(&self, index: u64) -> Option<usize> {
        self.queue.binary_search_by_key(&index, |w| w.index).ok()
    }
}

pub(super) fn kind_of(mode: Mode) -> &'static str {
    if mode.is_semaphore() {
        "semaphore"
    } else {
        "lock"
    }
}
