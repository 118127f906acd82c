//! The lock table and its `apply`.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::command::{
    Acquired, CancelCause, Command, EndCause, Event, Fence, LockName, Mode, Refusal, Reply,
    Response, SessionId,
};
use super::limits::*;

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
    /// Sessions closed by their clients, newest [`MAX_REMEMBERED_CLOSES`]
    /// by id, so a retried `CloseSession` is answered like the first.
    pub(super) closed: BTreeMap<SessionId, Closed>,
}

/// A restore under way.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct PendingRestore {
    /// The proposer's id for it.
    pub(super) restore: u64,
    /// The part expected next.
    pub(super) next: u32,
    /// How many parts there are.
    pub(super) parts: u32,
    /// The bytes so far.
    #[serde(with = "super::bytes")]
    pub(super) bytes: Vec<u8>,
}

/// One open session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Session {
    /// Lease length; the leader's timers use it.
    pub(super) ttl_ms: u64,
    /// Lock-delay applied to held names on expiry.
    pub(super) lock_delay_ms: u64,
    /// The nonce it was opened with (0 = none).
    pub(super) nonce: u64,
    /// The identity that opened it (empty without access control); only
    /// that identity may use it.
    pub(super) owner: String,
    /// Names held, with the grant's fence. One grant per name per session.
    pub(super) held: BTreeMap<LockName, Fence>,
    /// Names waited for, with the waiting request.
    pub(super) waiting: BTreeMap<LockName, WaitRef>,
    /// Remembered replies for exactly-once retries.
    pub(super) replies: Replies,
}

/// Where a session's wait sits in a queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct WaitRef {
    /// The acquire's sequence number.
    pub(super) seq: u64,
    /// The log index that queued it; queues are sorted by it.
    pub(super) index: u64,
}

/// A session's remembered replies: the newest [`MAX_REMEMBERED_REPLIES`]
/// by sequence number, plus every reply whose outcome is still pending (a
/// queued acquire: its client may need to ask again, however many requests
/// it sent meanwhile), and the highest sequence number forgotten.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Replies {
    pub(super) map: BTreeMap<u64, Remembered>,
    pub(super) floor: Option<u64>,
}

/// One remembered reply and a digest of the command it answered, so a seq
/// reused for another command is refused instead of answered with this.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Remembered {
    /// [`Command::digest`] of the request (0: unknown, for replies restored
    /// from a format that kept none; any request matches it).
    pub(super) digest: u64,
    /// The answer.
    pub(super) reply: Reply,
}

enum Lookup {
    New,
    Replay(Reply),
    TooOld(u64),
    Reused,
}

impl Replies {
    fn lookup(&self, seq: u64, digest: u64) -> Lookup {
        if let Some(r) = self.map.get(&seq) {
            if r.digest != 0 && r.digest != digest {
                return Lookup::Reused;
            }
            return Lookup::Replay(r.reply.clone());
        }
        match self.floor {
            Some(floor) if seq <= floor => Lookup::TooOld(floor),
            _ => Lookup::New,
        }
    }

    fn remember(&mut self, seq: u64, digest: u64, reply: &Reply) {
        self.map.insert(
            seq,
            Remembered {
                digest,
                reply: reply.clone(),
            },
        );
        while self.map.len() > MAX_REMEMBERED_REPLIES {
            // The oldest settled reply goes; pending ones (queued acquires)
            // stay until settled, so their retries still find them. A
            // session waits for at most MAX_LOCKS_PER_SESSION names, which
            // bounds them.
            let Some(old) = self
                .map
                .iter()
                .find(|(_, r)| r.reply != Reply::Acquire(Acquired::Queued))
                .map(|(seq, _)| *seq)
            else {
                break;
            };
            self.map.remove(&old);
            self.floor = Some(self.floor.map_or(old, |f| f.max(old)));
        }
    }

    /// True if `seq` was never answered (nor forgotten below the floor).
    fn is_unseen(&self, seq: u64) -> bool {
        !self.map.contains_key(&seq) && self.floor.is_none_or(|f| seq > f)
    }

    /// Rewrites a remembered reply whose outcome has since been decided (a
    /// queued acquire granted or cancelled).
    fn settle(&mut self, seq: u64, reply: Reply) {
        if let Some(slot) = self.map.get_mut(&seq) {
            slot.reply = reply;
        }
    }
}

/// A session closed by its client, remembered so a retried close is
/// answered like the first (see [`MAX_REMEMBERED_CLOSES`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Closed {
    /// The close's sequence number.
    pub(super) seq: u64,
    /// Grants it released.
    pub(super) released: u32,
    /// The identity that owned the session.
    pub(super) owner: String,
}

/// One name's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Lock {
    /// `Some(capacity)` for a semaphore, `None` for a lock.
    pub(super) capacity: Option<u32>,
    /// Current grants by fence, which is also grant order.
    pub(super) holders: Holders,
    /// Sum of holders' weights.
    pub(super) held_weight: u64,
    /// Waiting requests in arrival order (ascending `index`).
    pub(super) queue: VecDeque<Waiter>,
    /// Lock-delay in force, if any.
    pub(super) delay: Option<Delay>,
}

/// A name's grants in ascending fence order: a map from fence to holder,
/// kept as a sorted `Vec`.
///
/// A name nearly always has one holder, and with a million held names the
/// holder collection is most of the table's memory: a `BTreeMap`'s first
/// insert allocates a whole 11-slot leaf (~800 bytes), this one slot (72).
/// Grants get ever larger fences, so an insert is a push; lookups and
/// removals are binary searches. Serialized as a sequence of `(fence,
/// holder)` pairs, which bincode writes byte for byte like the
/// `BTreeMap<Fence, Holder>` it replaces, so snapshots are unchanged. A
/// decoded sequence out of order is caught by
/// [`check_invariants`](LockTable::check_invariants).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub(super) struct Holders(Vec<(Fence, Holder)>);

impl Holders {
    fn search(&self, fence: &Fence) -> Result<usize, usize> {
        self.0.binary_search_by_key(fence, |(f, _)| *f)
    }

    /// Adds a grant (replacing one with the same fence, which `apply`
    /// never makes).
    pub(super) fn insert(&mut self, fence: Fence, holder: Holder) {
        match self.search(&fence) {
            Ok(pos) => self.0[pos].1 = holder,
            Err(pos) => {
                if self.0.capacity() == 0 {
                    // `push` would allocate room for four; most names only
                    // ever have one holder.
                    self.0.reserve_exact(1);
                }
                self.0.insert(pos, (fence, holder));
            }
        }
    }

    /// Removes and returns the grant with `fence`.
    pub(super) fn remove(&mut self, fence: &Fence) -> Option<Holder> {
        let pos = self.search(fence).ok()?;
        Some(self.0.remove(pos).1)
    }

    /// The grant with `fence`.
    pub(super) fn get(&self, fence: &Fence) -> Option<&Holder> {
        self.search(fence).ok().map(|pos| &self.0[pos].1)
    }

    /// Whether a grant with `fence` is current.
    pub(super) fn contains_key(&self, fence: &Fence) -> bool {
        self.search(fence).is_ok()
    }

    /// Grants in fence order.
    pub(super) fn iter(&self) -> impl DoubleEndedIterator<Item = (&Fence, &Holder)> + '_ {
        self.0.iter().map(|(f, h)| (f, h))
    }

    /// Fences in ascending order.
    pub(super) fn keys(&self) -> impl DoubleEndedIterator<Item = &Fence> + '_ {
        self.0.iter().map(|(f, _)| f)
    }

    /// Holders in fence order, to change (tests corrupt tables with it).
    #[cfg(test)]
    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut Holder> + '_ {
        self.0.iter_mut().map(|(_, h)| h)
    }

    /// Holders in fence order.
    pub(super) fn values(&self) -> impl DoubleEndedIterator<Item = &Holder> + '_ {
        self.0.iter().map(|(_, h)| h)
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether fences strictly ascend (a decoded snapshot may not).
    pub(super) fn is_sorted(&self) -> bool {
        self.0.windows(2).all(|w| w[0].0 < w[1].0)
    }
}

impl<'a> IntoIterator for &'a Holders {
    type Item = (&'a Fence, &'a Holder);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (Fence, Holder)>,
        fn(&'a (Fence, Holder)) -> (&'a Fence, &'a Holder),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(f, h)| (f, h))
    }
}

/// A grant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Holder {
    pub(super) session: SessionId,
    pub(super) seq: u64,
    pub(super) mode: Mode,
    #[serde(with = "super::bytes")]
    pub(super) value: Vec<u8>,
    /// Log index of the grant.
    pub(super) index: u64,
}

/// A queued request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Waiter {
    pub(super) session: SessionId,
    pub(super) seq: u64,
    pub(super) mode: Mode,
    #[serde(with = "super::bytes")]
    pub(super) value: Vec<u8>,
    pub(super) timeout_ms: u64,
    /// Log index at which it was queued.
    pub(super) index: u64,
}

/// A lock-delay in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Delay {
    /// Log index that started it.
    pub(super) since: u64,
    /// Its length (the leader's timer counts it).
    pub(super) delay_ms: u64,
}

impl Lock {
    fn new(mode: Mode) -> Self {
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
    fn compatible(&self, mode: Mode) -> bool {
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

    fn is_idle(&self) -> bool {
        self.holders.is_empty() && self.queue.is_empty() && self.delay.is_none()
    }

    pub(super) fn kind(&self) -> &'static str {
        if self.capacity.is_some() {
            "semaphore"
        } else {
            "lock"
        }
    }

    /// Position of the waiter queued at `index` (queues are sorted by it).
    pub(super) fn position(&self, index: u64) -> Option<usize> {
        self.queue.binary_search_by_key(&index, |w| w.index).ok()
    }
}

fn kind_of(mode: Mode) -> &'static str {
    if mode.is_semaphore() {
        "semaphore"
    } else {
        "lock"
    }
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
        let reply = match command {
            Command::OpenSession {
                ttl_ms,
                lock_delay_ms,
                nonce,
                owner,
            } => self.open_session(index, ttl_ms, lock_delay_ms, nonce, owner, &mut events),
            Command::CloseSession {
                session,
                seq,
                caller,
            } => self.close_session(index, (session, &caller), seq, &mut events),
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
            Command::ExpireSession { session } => Reply::Expired {
                existed: self
                    .end_session(session, true, index, &mut events)
                    .is_some(),
            },
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
        Response { reply, events }
    }

    fn restore_part(
        &mut self,
        (restore, part, parts): (u64, u32, u32),
        bytes: Vec<u8>,
        fence_bump: u64,
        events: &mut Vec<Event>,
    ) -> Reply {
        let empty = self.sessions.is_empty()
            && self.locks.is_empty()
            && self.nonces.is_empty()
            && self.last_fence == 0;
        if !empty {
            return Reply::Refused(Refusal::RestoreIntoNonEmpty);
        }
        let refuse = |reason: String| {
            Reply::Refused(Refusal::InvalidRestorePart {
                restore,
                part,
                parts,
                reason,
            })
        };
        // Part 0 starts a restore (replacing one that was abandoned); every
        // other part must continue the one under way, in order.
        let mut pending = if part == 0 {
            PendingRestore {
                restore,
                next: 0,
                parts,
                bytes: Vec::new(),
            }
        } else {
            match &self.restoring {
                Some(p) if p.restore == restore && p.parts == parts && p.next == part => {
                    self.restoring.take().expect("checked above")
                }
                Some(p) if p.restore == restore => {
                    return refuse(format!("expected part {} of {}", p.next, p.parts))
                }
                _ => return refuse("no such restore under way (part 0 starts one)".into()),
            }
        };
        if pending.bytes.len() + bytes.len() > MAX_RESTORE_BYTES {
            if part > 0 {
                self.restoring = Some(pending);
            }
            return refuse(format!("the backup exceeds {MAX_RESTORE_BYTES} bytes"));
        }
        let before = pending.bytes.len();
        pending.bytes.extend_from_slice(&bytes);
        pending.next += 1;
        if pending.next < parts {
            self.restoring = Some(pending);
            return Reply::RestorePartTaken { next: part + 1 };
        }
        let table = match LockTable::from_snapshot(&pending.bytes) {
            Ok(table) => table,
            Err(e) => {
                // Refused: leave the restore as it was before this part.
                pending.bytes.truncate(before);
                pending.next -= 1;
                if part > 0 {
                    self.restoring = Some(pending);
                }
                return Reply::Refused(Refusal::InvalidBackup {
                    reason: e.to_string(),
                });
            }
        };
        // New ids and queue positions start above everything the backup's
        // cluster used, and new fences above every fence it may have handed
        // out after the backup was taken (within `fence_bump`).
        let index_floor = table.max_index().saturating_add(RESTORE_INDEX_BUMP);
        let last_fence = table.last_fence.saturating_add(fence_bump);
        *self = LockTable {
            restoring: None,
            index_floor,
            last_fence,
            ..table
        };
        // Tell the leader's timers about everything that now needs one.
        for s in self.sessions() {
            events.push(Event::SessionOpened {
                session: s.session,
                ttl_ms: s.ttl_ms,
            });
        }
        for w in self.waits() {
            events.push(Event::Queued {
                name: w.name,
                session: w.session,
                seq: w.seq,
                mode: w.mode,
                timeout_ms: w.timeout_ms,
            });
        }
        let delays: Vec<Event> = self
            .delays()
            .map(|(name, since, delay_ms)| Event::LockDelayStarted {
                name: name.clone(),
                delay_ms,
                since,
            })
            .collect();
        events.extend(delays);
        Reply::Restored {
            sessions: self.sessions.len() as u64,
            last_fence: self.last_fence,
        }
    }

    fn open_session(
        &mut self,
        index: u64,
        ttl_ms: u64,
        lock_delay_ms: u64,
        nonce: u64,
        owner: String,
        events: &mut Vec<Event>,
    ) -> Reply {
        if nonce != 0 {
            if let Some(&session) = self.nonces.get(&nonce) {
                let Some(s) = self.sessions.get(&session) else {
                    return Reply::Refused(Refusal::Inconsistent {
                        reason: format!("nonce {nonce} names {session}, which is not open"),
                    });
                };
                // A retried open finds its session only for the same
                // identity.
                if s.owner != owner {
                    return Reply::Refused(Refusal::NotOwner { session });
                }
                return Reply::Opened {
                    session,
                    ttl_ms: s.ttl_ms,
                    lock_delay_ms: s.lock_delay_ms,
                };
            }
        }
        if self.sessions.len() >= MAX_SESSIONS {
            return Reply::Refused(Refusal::TooManySessions);
        }
        let session = SessionId(index);
        if self.sessions.contains_key(&session) {
            // Ids come from command indexes, which only grow (and a restore
            // lifts them above the backup's), so this cannot happen; if a
            // bug ever made it happen, overwriting the session would hand
            // its grants to a stranger.
            return Reply::Refused(Refusal::Inconsistent {
                reason: format!("{session} exists already"),
            });
        }
        self.sessions.insert(
            session,
            Session {
                ttl_ms,
                lock_delay_ms,
                nonce,
                owner,
                held: BTreeMap::new(),
                waiting: BTreeMap::new(),
                replies: Replies::default(),
            },
        );
        if nonce != 0 {
            self.nonces.insert(nonce, session);
        }
        events.push(Event::SessionOpened { session, ttl_ms });
        Reply::Opened {
            session,
            ttl_ms,
            lock_delay_ms,
        }
    }

    /// Removes a session: cancels its waits, ends its grants (starting
    /// lock-delay on expiry), then lets the affected queues move on. Returns
    /// the number of grants ended, or `None` if there was no such session.
    fn end_session(
        &mut self,
        session: SessionId,
        expired: bool,
        index: u64,
        events: &mut Vec<Event>,
    ) -> Option<u32> {
        let s = self.sessions.remove(&session)?;
        if s.nonce != 0 {
            self.nonces.remove(&s.nonce);
        }
        let mut touched: Vec<LockName> = Vec::with_capacity(s.held.len() + s.waiting.len());
        // Waits go first so that ending the grants cannot hand a name to this
        // same, dying session.
        for (name, wait) in s.waiting {
            if let Some(lock) = self.locks.get_mut(&name) {
                if let Some(pos) = lock.position(wait.index) {
                    if let Some(w) = lock.queue.remove(pos) {
                        events.push(Event::Cancelled {
                            name: name.clone(),
                            session,
                            seq: w.seq,
                            mode: w.mode,
                            cause: CancelCause::SessionEnded,
                        });
                    }
                }
            }
            touched.push(name);
        }
        let cause = if expired {
            EndCause::SessionExpired
        } else {
            EndCause::SessionClosed
        };
        let released = s.held.len() as u32;
        for (name, fence) in s.held {
            if let Some(lock) = self.locks.get_mut(&name) {
                if let Some(h) = lock.holders.remove(&fence) {
                    lock.held_weight = lock.held_weight.saturating_sub(u64::from(h.mode.weight()));
                    events.push(Event::Ended {
                        name: name.clone(),
                        session,
                        fence,
                        mode: h.mode,
                        cause,
                    });
                }
                if expired && s.lock_delay_ms > 0 {
                    // One delay per name: if another expired holder's delay
                    // is still in force (shared locks, semaphores), the new
                    // one must last at least as long, or this shorter one
                    // would end it early. Without a clock, "as long as both"
                    // is the longer length counted from now.
                    let delay_ms = lock
                        .delay
                        .map_or(s.lock_delay_ms, |d| d.delay_ms.max(s.lock_delay_ms));
                    lock.delay = Some(Delay {
                        since: index,
                        delay_ms,
                    });
                    events.push(Event::LockDelayStarted {
                        name: name.clone(),
                        delay_ms,
                        since: index,
                    });
                }
            }
            touched.push(name);
        }
        events.push(Event::SessionEnded { session, expired });
        touched.sort_unstable();
        touched.dedup();
        for name in &touched {
            self.promote(name, index, events);
        }
        Some(released)
    }

    #[allow(clippy::too_many_arguments)]
    fn acquire(
        &mut self,
        index: u64,
        (session, caller, digest): (SessionId, &str, u64),
        seq: u64,
        name: String,
        mode: Mode,
        timeout_ms: u64,
        value: Vec<u8>,
        events: &mut Vec<Event>,
    ) -> Reply {
        let name = match LockName::new(name) {
            Ok(name) => name,
            Err(refusal) => return Reply::Refused(refusal),
        };
        let s = match self.sessions.get(&session) {
            None => return Reply::Refused(Refusal::SessionNotFound { session }),
            Some(s) if s.owner != caller => return Reply::Refused(Refusal::NotOwner { session }),
            Some(s) => s,
        };
        match s.replies.lookup(seq, digest) {
            Lookup::New => {}
            Lookup::Reused => return Reply::Refused(Refusal::SequenceReused { session, seq }),
            Lookup::TooOld(floor) => {
                return Reply::Refused(Refusal::SequenceTooOld {
                    session,
                    seq,
                    floor,
                })
            }
            Lookup::Replay(Reply::Acquire(Acquired::Queued)) => {
                // A retried blocking acquire (e.g. after a leader change):
                // answer with where it stands now, keeping its place.
                return Reply::Acquire(self.standing(session, &name));
            }
            Lookup::Replay(reply) => return reply,
        }

        let lock = self.locks.get(&name);
        if let Some(lock) = lock {
            match (lock.capacity, mode) {
                (Some(_), Mode::Exclusive | Mode::Shared) | (None, Mode::Semaphore { .. }) => {
                    return Reply::Refused(Refusal::KindMismatch {
                        name,
                        existing: lock.kind().to_string(),
                        requested: kind_of(mode).to_string(),
                    });
                }
                (Some(existing), Mode::Semaphore { capacity, .. }) if existing != capacity => {
                    return Reply::Refused(Refusal::CapacityMismatch {
                        name,
                        existing,
                        requested: capacity,
                    });
                }
                _ => {}
            }
        }

        // A session holds at most one grant and one wait per name, and a new
        // request (a new seq) for a name it already holds or waits for is
        // refused rather than answered with that grant or wait: two callers
        // sharing the session (or a re-acquire racing the release of the
        // old grant) would otherwise both believe they hold one grant, and
        // the release of one would leave the other holding nothing. The
        // same request retried (the same seq) was answered above.
        if let Some(&fence) = s.held.get(&name) {
            let same = lock
                .and_then(|l| l.holders.get(&fence))
                .is_some_and(|h| h.mode == mode);
            return Reply::Refused(if same {
                Refusal::AlreadyHeld {
                    session,
                    name,
                    fence,
                }
            } else {
                Refusal::OtherMode { session, name }
            });
        }
        if let Some(wait) = s.waiting.get(&name) {
            let same = lock
                .and_then(|l| l.position(wait.index).map(|p| l.queue[p].mode))
                .is_some_and(|m| m == mode);
            return Reply::Refused(if same {
                Refusal::AlreadyWaiting {
                    session,
                    name,
                    seq: wait.seq,
                }
            } else {
                Refusal::OtherMode { session, name }
            });
        }
        if s.held.len() + s.waiting.len() >= MAX_LOCKS_PER_SESSION {
            return Reply::Refused(Refusal::TooManyLocks { session });
        }

        let free = lock.is_none_or(|l| l.queue.is_empty() && l.compatible(mode));
        if free {
            let lock = self
                .locks
                .entry(name.clone())
                .or_insert_with(|| Lock::new(mode));
            let fence = grant(&mut self.last_fence, lock, session, seq, mode, value, index);
            if let Some(s) = self.sessions.get_mut(&session) {
                s.held.insert(name.clone(), fence);
            }
            events.push(Event::Granted {
                name,
                session,
                seq,
                fence,
                mode,
            });
            let reply = Reply::Acquire(Acquired::Granted { fence, mode, index });
            self.remember(session, seq, digest, &reply);
            return reply;
        }
        // Busy, so the lock exists.
        if timeout_ms == 0 {
            let reply = Reply::Acquire(Acquired::NotAcquired);
            self.remember(session, seq, digest, &reply);
            return reply;
        }
        if lock.is_some_and(|l| l.queue.len() >= MAX_WAITERS_PER_NAME) {
            return Reply::Refused(Refusal::TooManyWaiters { name });
        }
        if let Some(cycle) = self.find_cycle(session, &name, mode) {
            return Reply::Refused(Refusal::Deadlock { cycle });
        }
        let Some(lock) = self.locks.get_mut(&name) else {
            return Reply::Refused(Refusal::Inconsistent {
                reason: format!("{name} is busy but has no entry"),
            });
        };
        lock.queue.push_back(Waiter {
            session,
            seq,
            mode,
            value,
            timeout_ms,
            index,
        });
        if let Some(s) = self.sessions.get_mut(&session) {
            s.waiting.insert(name.clone(), WaitRef { seq, index });
        }
        events.push(Event::Queued {
            name,
            session,
            seq,
            mode,
            timeout_ms,
        });
        let reply = Reply::Acquire(Acquired::Queued);
        self.remember(session, seq, digest, &reply);
        reply
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

    /// Closes `session` for its owner, or answers a retried close like the
    /// first one.
    fn close_session(
        &mut self,
        index: u64,
        (session, caller): (SessionId, &str),
        seq: u64,
        events: &mut Vec<Event>,
    ) -> Reply {
        match self.sessions.get(&session) {
            Some(s) if s.owner != caller => return Reply::Refused(Refusal::NotOwner { session }),
            Some(_) => {}
            None => {
                return match self.closed.get(&session) {
                    Some(c) if c.owner != caller => Reply::Refused(Refusal::NotOwner { session }),
                    Some(c) if c.seq == seq => Reply::Closed {
                        released: c.released,
                    },
                    // Expired, never opened, or closed by another request.
                    _ => Reply::Refused(Refusal::SessionNotFound { session }),
                };
            }
        }
        let owner = caller.to_string();
        let Some(released) = self.end_session(session, false, index, events) else {
            return Reply::Refused(Refusal::SessionNotFound { session });
        };
        self.closed.insert(
            session,
            Closed {
                seq,
                released,
                owner,
            },
        );
        while self.closed.len() > MAX_REMEMBERED_CLOSES {
            self.closed.pop_first();
        }
        Reply::Closed { released }
    }

    fn release(
        &mut self,
        index: u64,
        (session, caller, digest): (SessionId, &str, u64),
        seq: u64,
        name: String,
        fence: Fence,
        events: &mut Vec<Event>,
    ) -> Reply {
        let name = match LockName::new(name) {
            Ok(name) => name,
            Err(refusal) => return Reply::Refused(refusal),
        };
        let s = match self.sessions.get_mut(&session) {
            None => return Reply::Refused(Refusal::SessionNotFound { session }),
            Some(s) if s.owner != caller => return Reply::Refused(Refusal::NotOwner { session }),
            Some(s) => s,
        };
        match s.replies.lookup(seq, digest) {
            Lookup::New => {}
            Lookup::Reused => return Reply::Refused(Refusal::SequenceReused { session, seq }),
            Lookup::TooOld(floor) => {
                return Reply::Refused(Refusal::SequenceTooOld {
                    session,
                    seq,
                    floor,
                })
            }
            Lookup::Replay(reply) => return reply,
        }
        // Owner check: the session must hold this very grant.
        let released = if s.held.get(&name) == Some(&fence) {
            // The session lists the grant, so the lock has it; a table where
            // it does not (a bug, a bad backup) is refused, not a panic that
            // every node would repeat at this entry forever.
            let Some(h) = self
                .locks
                .get_mut(&name)
                .and_then(|lock| lock.holders.remove(&fence).map(|h| (lock, h)))
                .map(|(lock, h)| {
                    lock.held_weight = lock.held_weight.saturating_sub(u64::from(h.mode.weight()));
                    h
                })
            else {
                return Reply::Refused(Refusal::Inconsistent {
                    reason: format!("{session} lists a grant on {name} the lock does not have"),
                });
            };
            s.held.remove(&name);
            events.push(Event::Ended {
                name: name.clone(),
                session,
                fence,
                mode: h.mode,
                cause: EndCause::Released,
            });
            self.promote(&name, index, events);
            true
        } else {
            false
        };
        let reply = Reply::Released { released };
        self.remember(session, seq, digest, &reply);
        reply
    }

    fn cancel_wait(
        &mut self,
        index: u64,
        session: SessionId,
        name: String,
        seq: u64,
        events: &mut Vec<Event>,
    ) -> Reply {
        let name = match LockName::new(name) {
            Ok(name) => name,
            Err(refusal) => return Reply::Refused(refusal),
        };
        let Some(s) = self.sessions.get_mut(&session) else {
            return Reply::Cancelled { cancelled: false };
        };
        let Some(wait) = s.waiting.get(&name).copied().filter(|w| w.seq == seq) else {
            return Reply::Cancelled { cancelled: false };
        };
        s.waiting.remove(&name);
        s.replies.settle(seq, Reply::Acquire(Acquired::NotAcquired));
        if let Some(lock) = self.locks.get_mut(&name) {
            if let Some(w) = lock.position(wait.index).and_then(|p| lock.queue.remove(p)) {
                events.push(Event::Cancelled {
                    name: name.clone(),
                    session,
                    seq,
                    mode: w.mode,
                    cause: CancelCause::TimedOut,
                });
            }
        }
        // The cancelled wait may have been holding up those behind it.
        self.promote(&name, index, events);
        Reply::Cancelled { cancelled: true }
    }

    /// Withdraws the acquire `seq` of `session` on `name`, whatever became
    /// of it: a queued wait leaves the queue, a grant made to it and still
    /// held is released, and an acquire not applied yet (the withdraw
    /// overtook it) is answered "not acquired" when it comes, granting
    /// nothing. Idempotent: `withdrawn: false` when there is nothing (left)
    /// to withdraw.
    fn withdraw(
        &mut self,
        index: u64,
        (session, caller): (SessionId, &str),
        seq: u64,
        name: String,
        events: &mut Vec<Event>,
    ) -> Reply {
        let name = match LockName::new(name) {
            Ok(name) => name,
            Err(refusal) => return Reply::Refused(refusal),
        };
        let s = match self.sessions.get_mut(&session) {
            // The session ended, and its waits and grants with it.
            None => return Reply::Withdrawn { withdrawn: false },
            Some(s) if s.owner != caller => return Reply::Refused(Refusal::NotOwner { session }),
            Some(s) => s,
        };
        if let Some(wait) = s.waiting.get(&name).copied().filter(|w| w.seq == seq) {
            s.waiting.remove(&name);
            s.replies.settle(seq, Reply::Acquire(Acquired::NotAcquired));
            if let Some(lock) = self.locks.get_mut(&name) {
                if let Some(w) = lock.position(wait.index).and_then(|p| lock.queue.remove(p)) {
                    events.push(Event::Cancelled {
                        name: name.clone(),
                        session,
                        seq,
                        mode: w.mode,
                        cause: CancelCause::Withdrawn,
                    });
                }
            }
            // Those behind it may be grantable now.
            self.promote(&name, index, events);
            return Reply::Withdrawn { withdrawn: true };
        }
        if s.replies.is_unseen(seq) {
            // The acquire has not arrived (yet): when it does, it finds
            // this answer and is not applied (digest 0 matches it).
            s.replies
                .remember(seq, 0, &Reply::Acquire(Acquired::NotAcquired));
            return Reply::Withdrawn { withdrawn: false };
        }
        let Some(&fence) = s.held.get(&name) else {
            return Reply::Withdrawn { withdrawn: false };
        };
        let Some(lock) = self.locks.get_mut(&name) else {
            return Reply::Refused(Refusal::Inconsistent {
                reason: format!("{session} lists a grant on {name} the lock does not have"),
            });
        };
        if lock.holders.get(&fence).is_none_or(|h| h.seq != seq) {
            // Held through another acquire: not this one's to give back.
            return Reply::Withdrawn { withdrawn: false };
        }
        let Some(h) = lock.holders.remove(&fence) else {
            return Reply::Withdrawn { withdrawn: false };
        };
        lock.held_weight = lock.held_weight.saturating_sub(u64::from(h.mode.weight()));
        s.held.remove(&name);
        s.replies.settle(seq, Reply::Acquire(Acquired::NotAcquired));
        events.push(Event::Ended {
            name: name.clone(),
            session,
            fence,
            mode: h.mode,
            cause: EndCause::Released,
        });
        self.promote(&name, index, events);
        Reply::Withdrawn { withdrawn: true }
    }

    fn end_lock_delay(
        &mut self,
        index: u64,
        name: String,
        since: u64,
        events: &mut Vec<Event>,
    ) -> Reply {
        let name = match LockName::new(name) {
            Ok(name) => name,
            Err(refusal) => return Reply::Refused(refusal),
        };
        let Some(lock) = self.locks.get_mut(&name) else {
            return Reply::DelayEnded { ended: false };
        };
        if lock.delay.map(|d| d.since) != Some(since) {
            return Reply::DelayEnded { ended: false };
        }
        lock.delay = None;
        events.push(Event::LockDelayEnded { name: name.clone() });
        self.promote(&name, index, events);
        Reply::DelayEnded { ended: true }
    }

    /// Grants from the head of `name`'s queue while the head is compatible
    /// (FIFO, head-of-line blocking), then drops the entry if it is idle.
    fn promote(&mut self, name: &LockName, index: u64, events: &mut Vec<Event>) {
        let Some(lock) = self.locks.get_mut(name) else {
            return;
        };
        while lock.queue.front().is_some_and(|w| lock.compatible(w.mode)) {
            let w = lock.queue.pop_front().expect("front exists");
            let fence = grant(
                &mut self.last_fence,
                lock,
                w.session,
                w.seq,
                w.mode,
                w.value,
                index,
            );
            if let Some(s) = self.sessions.get_mut(&w.session) {
                s.waiting.remove(name);
                s.held.insert(name.clone(), fence);
                s.replies.settle(
                    w.seq,
                    Reply::Acquire(Acquired::Granted {
                        fence,
                        mode: w.mode,
                        index,
                    }),
                );
            }
            events.push(Event::Granted {
                name: name.clone(),
                session: w.session,
                seq: w.seq,
                fence,
                mode: w.mode,
            });
        }
        if lock.is_idle() {
            self.locks.remove(name);
        }
    }
}

/// Hands out the next fence and records the holder.
fn grant(
    last_fence: &mut u64,
    lock: &mut Lock,
    session: SessionId,
    seq: u64,
    mode: Mode,
    value: Vec<u8>,
    index: u64,
) -> Fence {
    *last_fence += 1;
    let fence = Fence(*last_fence);
    lock.held_weight += u64::from(mode.weight());
    lock.holders.insert(
        fence,
        Holder {
            session,
            seq,
            mode,
            value,
            index,
        },
    );
    fence
}

#[cfg(test)]
mod holders_tests {
    use super::*;

    fn holder(session: u64) -> Holder {
        Holder {
            session: SessionId(session),
            seq: 1,
            mode: Mode::Shared,
            value: Vec::new(),
            index: session,
        }
    }

    #[test]
    fn holders_keep_fence_order_and_one_slot_for_one_holder() {
        let mut h = Holders::default();
        h.insert(Fence(5), holder(5));
        assert_eq!(h.0.capacity(), 1, "a lone holder takes one slot");
        h.insert(Fence(9), holder(9));
        h.insert(Fence(2), holder(2));
        assert!(h.is_sorted());
        assert_eq!(
            h.keys().copied().collect::<Vec<_>>(),
            [Fence(2), Fence(5), Fence(9)]
        );
        assert_eq!(h.get(&Fence(5)).map(|x| x.session), Some(SessionId(5)));
        assert!(h.contains_key(&Fence(9)) && !h.contains_key(&Fence(6)));
        assert_eq!(h.remove(&Fence(5)).map(|x| x.session), Some(SessionId(5)));
        assert_eq!(h.remove(&Fence(5)), None);
        assert_eq!(h.len(), 2);
        assert_eq!(h.keys().next_back(), Some(&Fence(9)));
    }

    #[test]
    fn holders_encode_like_the_map_they_replace() {
        let mut h = Holders::default();
        let mut map = BTreeMap::new();
        for f in [3, 4, 17] {
            h.insert(Fence(f), holder(f));
            map.insert(Fence(f), holder(f));
        }
        let bytes = bincode::serialize(&h).expect("encodes");
        assert_eq!(bytes, bincode::serialize(&map).expect("encodes"));
        assert_eq!(bincode::deserialize::<Holders>(&bytes).expect("decodes"), h);
    }

    #[test]
    fn snapshot_with_holders_out_of_order_is_refused() {
        let mut t = LockTable::new();
        for (index, nonce) in [(1, 11), (2, 12)] {
            t.apply(
                index,
                Command::OpenSession {
                    ttl_ms: 10_000,
                    lock_delay_ms: 0,
                    nonce,
                    owner: String::new(),
                },
            );
        }
        for (index, session) in [(3, 1), (4, 2)] {
            t.apply(
                index,
                Command::Acquire {
                    session: SessionId(session),
                    seq: 1,
                    name: "x".into(),
                    mode: Mode::Shared,
                    timeout_ms: 0,
                    value: Vec::new(),
                    caller: String::new(),
                },
            );
        }
        let x = LockName::new("x").expect("valid");
        assert_eq!(t.locks[&x].holders.len(), 2);
        assert!(LockTable::from_snapshot(&t.to_snapshot()).is_ok());
        t.locks.get_mut(&x).expect("held").holders.0.reverse();
        let err = LockTable::from_snapshot(&t.to_snapshot()).expect_err("refused");
        assert!(err.to_string().contains("out of fence order"), "{err}");
    }
}
