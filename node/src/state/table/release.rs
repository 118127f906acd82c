//! Releasing grants, withdrawing acquires, cancelling waits and ending
//! lock-delays.

use super::{owned, LockTable};
use crate::state::command::{
    Acquired, CancelCause, EndCause, Event, Fence, LockName, Refusal, Reply, SessionId,
};

impl LockTable {
    pub(super) fn release(
        &mut self,
        index: u64,
        (session, caller, digest): (SessionId, &str, u64),
        seq: u64,
        name: String,
        fence: Fence,
        events: &mut Vec<Event>,
    ) -> Result<Reply, Refusal> {
        let name = LockName::new(name)?;
        let s = owned(self.sessions.get_mut(&session), session, caller)?;
        if let Some(reply) = s.replies.check(session, seq, digest)? {
            return Ok(reply);
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
                return Err(Refusal::Inconsistent {
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
        Ok(reply)
    }

    pub(super) fn cancel_wait(
        &mut self,
        index: u64,
        session: SessionId,
        name: String,
        seq: u64,
        events: &mut Vec<Event>,
    ) -> Result<Reply, Refusal> {
        let name = LockName::new(name)?;
        let Some(s) = self.sessions.get_mut(&session) else {
            return Ok(Reply::Cancelled { cancelled: false });
        };
        let Some(wait) = s.waiting.get(&name).copied().filter(|w| w.seq == seq) else {
            return Ok(Reply::Cancelled { cancelled: false });
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
        self.end_if_lock_failed(session, index, events);
        Ok(Reply::Cancelled { cancelled: true })
    }

    /// Withdraws the acquire `seq` of `session` on `name`, whatever became
    /// of it: a queued wait leaves the queue, a grant made to it and still
    /// held is released, and an acquire not applied yet (the withdraw
    /// overtook it) is answered "not acquired" when it comes, granting
    /// nothing. Idempotent: `withdrawn: false` when there is nothing (left)
    /// to withdraw.
    pub(super) fn withdraw(
        &mut self,
        index: u64,
        (session, caller): (SessionId, &str),
        seq: u64,
        name: String,
        events: &mut Vec<Event>,
    ) -> Result<Reply, Refusal> {
        let name = LockName::new(name)?;
        let s = match self.sessions.get_mut(&session) {
            // The session ended, and its waits and grants with it.
            None => return Ok(Reply::Withdrawn { withdrawn: false }),
            Some(s) if s.owner != caller => return Err(Refusal::NotOwner { session }),
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
            self.end_if_lock_failed(session, index, events);
            return Ok(Reply::Withdrawn { withdrawn: true });
        }
        if s.replies.is_unseen(seq) {
            // The acquire has not arrived (yet): when it does, it finds
            // this answer and is not applied (digest 0 matches it).
            s.replies
                .remember(seq, 0, &Reply::Acquire(Acquired::NotAcquired));
            return Ok(Reply::Withdrawn { withdrawn: false });
        }
        let Some(&fence) = s.held.get(&name) else {
            return Ok(Reply::Withdrawn { withdrawn: false });
        };
        let Some(lock) = self.locks.get_mut(&name) else {
            return Err(Refusal::Inconsistent {
                reason: format!("{session} lists a grant on {name} the lock does not have"),
            });
        };
        if lock.holders.get(&fence).is_none_or(|h| h.seq != seq) {
            // Held through another acquire: not this one's to give back.
            return Ok(Reply::Withdrawn { withdrawn: false });
        }
        let Some(h) = lock.holders.remove(&fence) else {
            return Ok(Reply::Withdrawn { withdrawn: false });
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
        Ok(Reply::Withdrawn { withdrawn: true })
    }

    pub(super) fn end_lock_delay(
        &mut self,
        index: u64,
        name: String,
        since: u64,
        events: &mut Vec<Event>,
    ) -> Result<Reply, Refusal> {
        let name = LockName::new(name)?;
        let Some(lock) = self.locks.get_mut(&name) else {
            return Ok(Reply::DelayEnded { ended: false });
        };
        if lock.delay.map(|d| d.since) != Some(since) {
            return Ok(Reply::DelayEnded { ended: false });
        }
        lock.delay = None;
        events.push(Event::LockDelayEnded { name: name.clone() });
        self.promote(&name, index, events);
        Ok(Reply::DelayEnded { ended: true })
    }
}
