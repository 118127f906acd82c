//! Acquiring: granting at once, queueing, and promoting waiters when a
//! name frees up.

use super::records::kind_of;
use super::{owned, Cx, Holder, Lock, LockTable, WaitRef, Waiter};
use crate::state::cmd;
use crate::state::command::{
    Acquired, CancelCause, Event, Fence, LockName, Mode, Refusal, Reply, SessionId,
};
use crate::state::limits::{MAX_FENCE, MAX_LOCKS_PER_SESSION, MAX_WAITERS_PER_NAME};

impl LockTable {
    pub(super) fn acquire(&mut self, cx: &mut Cx, c: cmd::Acquire) -> Result<Reply, Refusal> {
        let digest = c.digest();
        let cmd::Acquire {
            session,
            seq,
            name,
            mode,
            timeout_ms,
            value,
            caller,
        } = c;
        let (index, events) = (cx.index, &mut *cx.events);
        let s = owned(self.sessions.get(&session), session, &caller)?;
        match s.replies.check(session, seq, digest)? {
            None => {}
            Some(Reply::Acquire(Acquired::Queued)) => {
                // A retried blocking acquire (e.g. after a leader change):
                // answer with where it stands now, keeping its place.
                return Ok(Reply::Acquire(self.standing(session, &name)));
            }
            Some(reply) => return Ok(reply),
        }

        self.check_new(session, &name, mode)?;
        let lock = self.locks.get(&name);
        if s.held.len() + s.waiting.len() >= MAX_LOCKS_PER_SESSION {
            return Err(Refusal::TooManyLocks { session });
        }
        // A new entry (held now or queued): the table's size limits.
        self.usage.admit_entries(&s.owner, 1)?;
        // No fence left: neither a grant now nor one later is possible.
        if self.last_fence >= MAX_FENCE {
            return Err(Refusal::FencesExhausted);
        }

        // A pending upgrade goes ahead of everyone: nothing is granted
        // past it.
        let free = lock.is_none_or(|l| l.queue.is_empty() && l.compatible(mode))
            && !self.upgrades.contains_key(&name);
        if free {
            let Some(fence) = next_fence(&mut self.last_fence) else {
                return Err(Refusal::FencesExhausted);
            };
            let lock = self
                .locks
                .entry(name.clone())
                .or_insert_with(|| Lock::new(mode));
            hold(lock, fence, session, seq, mode, value, index);
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
            return Ok(reply);
        }
        // Busy, so the lock exists.
        if timeout_ms == 0 {
            let reply = Reply::Acquire(Acquired::NotAcquired);
            self.remember(session, seq, digest, &reply);
            return Ok(reply);
        }
        if lock.is_some_and(|l| l.queue.len() >= MAX_WAITERS_PER_NAME) {
            return Err(Refusal::TooManyWaiters { name });
        }
        if let Some(cycle) = self.find_cycle(session, &name, mode) {
            return Err(Refusal::Deadlock { cycle });
        }
        let Some(lock) = self.locks.get_mut(&name) else {
            return Err(Refusal::Inconsistent {
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
        Ok(reply)
    }

    /// The checks of a new request (a new seq) by `session` for `name` in
    /// `mode`: the name's kind and capacity, and that the session neither
    /// holds nor waits for it.
    pub(super) fn check_new(
        &self,
        session: SessionId,
        name: &LockName,
        mode: Mode,
    ) -> Result<(), Refusal> {
        let lock = self.locks.get(name);
        if let Some(lock) = lock {
            match (lock.capacity, mode) {
                (Some(_), Mode::Exclusive | Mode::Shared) | (None, Mode::Semaphore { .. }) => {
                    return Err(Refusal::KindMismatch {
                        name: name.clone(),
                        existing: lock.kind().to_string(),
                        requested: kind_of(mode).to_string(),
                    });
                }
                (Some(existing), Mode::Semaphore { capacity, .. }) if existing != capacity => {
                    return Err(Refusal::CapacityMismatch {
                        name: name.clone(),
                        existing,
                        requested: capacity,
                    });
                }
                _ => {}
            }
        }
        let Some(s) = self.sessions.get(&session) else {
            return Err(Refusal::SessionNotFound { session });
        };
        // A session holds at most one grant and one wait per name, and a new
        // request (a new seq) for a name it already holds or waits for is
        // refused rather than answered with that grant or wait: two callers
        // sharing the session (or a re-acquire racing the release of the
        // old grant) would otherwise both believe they hold one grant, and
        // the release of one would leave the other holding nothing. The
        // same request retried (the same seq) was answered before this.
        if let Some(&fence) = s.held.get(name) {
            let same = lock
                .and_then(|l| l.holders.get(&fence))
                .is_some_and(|h| h.mode == mode);
            return Err(if same {
                Refusal::AlreadyHeld {
                    session,
                    name: name.clone(),
                    fence,
                }
            } else {
                Refusal::OtherMode {
                    session,
                    name: name.clone(),
                }
            });
        }
        if let Some(wait) = s.waiting.get(name) {
            let same = lock
                .and_then(|l| l.position(wait.index).map(|p| l.queue[p].mode))
                .is_some_and(|m| m == mode);
            return Err(if same {
                Refusal::AlreadyWaiting {
                    session,
                    name: name.clone(),
                    seq: wait.seq,
                }
            } else {
                Refusal::OtherMode {
                    session,
                    name: name.clone(),
                }
            });
        }
        Ok(())
    }

    /// Grants from the head of `name`'s queue while the head is compatible
    /// (FIFO, head-of-line blocking), then drops the entry if it is idle.
    pub(super) fn promote(&mut self, name: &LockName, index: u64, events: &mut Vec<Event>) {
        // Granting an atomic request moves the queues of all its names:
        // each is promoted in turn.
        let mut work = vec![name.clone()];
        while let Some(name) = work.pop() {
            self.promote_one(&name, index, events, &mut work);
        }
    }

    fn promote_one(
        &mut self,
        name: &LockName,
        index: u64,
        events: &mut Vec<Event>,
        work: &mut Vec<LockName>,
    ) {
        // A pending upgrade comes first; while it waits, so does everyone
        // queued.
        if self.upgrades.contains_key(name) {
            if self.last_fence >= MAX_FENCE {
                self.end_upgrade(name, CancelCause::FencesExhausted, events);
            } else if self.grant_upgrade(name, index, events).is_none() {
                return;
            }
        }
        loop {
            // An atomic request at the head: granted with all its names, or
            // it holds up this queue.
            if let Some(key) = self.head_group(name) {
                if !self.group_ready(key) {
                    break;
                }
                self.grant_group(key, index, events, work);
                continue;
            }
            let Some(lock) = self.locks.get_mut(name) else {
                return;
            };
            if !lock.queue.front().is_some_and(|w| lock.compatible(w.mode)) {
                break;
            }
            let Some(fence) = next_fence(&mut self.last_fence) else {
                // The counter is at its bound: nobody in this queue can
                // ever be granted, so every wait ends here (an atomic
                // request's in all its queues).
                let ended = std::mem::take(&mut lock.queue);
                for w in &ended {
                    if let Some(s) = self.sessions.get_mut(&w.session) {
                        s.waiting.remove(name);
                        s.replies
                            .settle(w.seq, Reply::Acquire(Acquired::NotAcquired));
                    }
                    events.push(Event::Cancelled {
                        name: name.clone(),
                        session: w.session,
                        seq: w.seq,
                        mode: w.mode,
                        cause: CancelCause::FencesExhausted,
                    });
                }
                if lock.is_idle() {
                    self.locks.remove(name);
                }
                for w in ended {
                    self.end_group(
                        (w.session, w.seq),
                        CancelCause::FencesExhausted,
                        events,
                        work,
                    );
                    self.end_if_lock_failed(w.session, index, events);
                }
                return;
            };
            let w = lock.queue.pop_front().expect("front exists");
            hold(lock, fence, w.session, w.seq, w.mode, w.value, index);
            if let Some(s) = self.sessions.get_mut(&w.session) {
                s.waiting.remove(name);
                s.held.insert(name.clone(), fence);
                s.lock_pending = false;
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
        if self.locks.get(name).is_some_and(|l| l.is_idle()) {
            self.locks.remove(name);
        }
    }
}

/// The next fence, counted; `None`, changing nothing, once the counter is
/// at [`MAX_FENCE`].
pub(super) fn next_fence(last_fence: &mut u64) -> Option<Fence> {
    let next = last_fence.checked_add(1).filter(|f| *f <= MAX_FENCE)?;
    *last_fence = next;
    Some(Fence(next))
}

/// Records a grant of `fence`.
pub(super) fn hold(
    lock: &mut Lock,
    fence: Fence,
    session: SessionId,
    seq: u64,
    mode: Mode,
    value: Vec<u8>,
    index: u64,
) {
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
}
