//! Acquiring: granting at once, queueing, and promoting waiters when a
//! name frees up.

use super::records::kind_of;
use super::{owned, Holder, Lock, LockTable, WaitRef, Waiter};
use crate::state::command::{
    Acquired, CancelCause, Event, Fence, LockName, Mode, Refusal, Reply, SessionId,
};
use crate::state::limits::{MAX_FENCE, MAX_LOCKS_PER_SESSION, MAX_WAITERS_PER_NAME};

impl LockTable {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn acquire(
        &mut self,
        index: u64,
        (session, caller, digest): (SessionId, &str, u64),
        seq: u64,
        name: String,
        mode: Mode,
        timeout_ms: u64,
        value: Vec<u8>,
        events: &mut Vec<Event>,
    ) -> Result<Reply, Refusal> {
        let name = LockName::new(name)?;
        let s = owned(self.sessions.get(&session), session, caller)?;
        match s.replies.check(session, seq, digest)? {
            None => {}
            Some(Reply::Acquire(Acquired::Queued)) => {
                // A retried blocking acquire (e.g. after a leader change):
                // answer with where it stands now, keeping its place.
                return Ok(Reply::Acquire(self.standing(session, &name)));
            }
            Some(reply) => return Ok(reply),
        }

        let lock = self.locks.get(&name);
        if let Some(lock) = lock {
            match (lock.capacity, mode) {
                (Some(_), Mode::Exclusive | Mode::Shared) | (None, Mode::Semaphore { .. }) => {
                    return Err(Refusal::KindMismatch {
                        name,
                        existing: lock.kind().to_string(),
                        requested: kind_of(mode).to_string(),
                    });
                }
                (Some(existing), Mode::Semaphore { capacity, .. }) if existing != capacity => {
                    return Err(Refusal::CapacityMismatch {
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
            return Err(if same {
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
            return Err(if same {
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
            return Err(Refusal::TooManyLocks { session });
        }
        // No fence left: neither a grant now nor one later is possible.
        if self.last_fence >= MAX_FENCE {
            return Err(Refusal::FencesExhausted);
        }

        let free = lock.is_none_or(|l| l.queue.is_empty() && l.compatible(mode));
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

    /// Grants from the head of `name`'s queue while the head is compatible
    /// (FIFO, head-of-line blocking), then drops the entry if it is idle.
    pub(super) fn promote(&mut self, name: &LockName, index: u64, events: &mut Vec<Event>) {
        let Some(lock) = self.locks.get_mut(name) else {
            return;
        };
        while lock.queue.front().is_some_and(|w| lock.compatible(w.mode)) {
            let Some(fence) = next_fence(&mut self.last_fence) else {
                // The counter is at its bound: nobody in this queue can
                // ever be granted, so every wait ends here.
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
        if lock.is_idle() {
            self.locks.remove(name);
        }
    }
}

/// The next fence, counted; `None`, changing nothing, once the counter is
/// at [`MAX_FENCE`].
fn next_fence(last_fence: &mut u64) -> Option<Fence> {
    let next = last_fence.checked_add(1).filter(|f| *f <= MAX_FENCE)?;
    *last_fence = next;
    Some(Fence(next))
}

/// Records a grant of `fence`.
fn hold(
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
