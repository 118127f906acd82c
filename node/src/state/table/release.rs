//! Releasing grants, cancelling acquires, timing waits out and ending
//! lock-delays.

use super::{owned, Cx, LockTable};
use crate::state::cmd;
use crate::state::command::{Acquired, AcquiredAll, CancelCause, EndCause, Event, Refusal, Reply};

impl LockTable {
    pub(super) fn release(&mut self, cx: &mut Cx, c: cmd::Release) -> Result<Reply, Refusal> {
        let digest = c.digest();
        let cmd::Release {
            session,
            seq,
            name,
            fence,
            caller,
        } = c;
        let (index, events) = (cx.index, &mut *cx.events);
        let s = owned(self.sessions.get_mut(&session), session, &caller)?;
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
            // An upgrade of the released grant ends with it.
            if self.upgrade_of(&name, session, None).is_some() {
                self.end_upgrade(&name, CancelCause::Cancelled, events);
            }
            self.promote(&name, index, events);
            true
        } else {
            false
        };
        let reply = Reply::Released { released };
        self.remember(session, seq, digest, &reply);
        Ok(reply)
    }

    /// Ends a wait whose timeout ran out, not acquired.
    pub(super) fn timeout_wait(
        &mut self,
        cx: &mut Cx,
        c: cmd::TimeoutWait,
    ) -> Result<Reply, Refusal> {
        let cmd::TimeoutWait { session, name, seq } = c;
        let (index, events) = (cx.index, &mut *cx.events);
        if self.upgrade_of(&name, session, Some(seq)).is_some() {
            self.end_upgrade(&name, CancelCause::TimedOut, events);
            // Those queued behind it may be grantable now.
            self.promote(&name, index, events);
            return Ok(Reply::WaitTimedOut { ended: true });
        }
        // An atomic request leaves all its queues (each of its names has a
        // timer; the first to fire ends it).
        let mut moved = Vec::new();
        let member = self
            .groups
            .get(&(session, seq))
            .is_some_and(|g| g.contains(&name));
        if member && self.end_group((session, seq), CancelCause::TimedOut, events, &mut moved) {
            for n in &moved {
                self.promote(n, index, events);
            }
            return Ok(Reply::WaitTimedOut { ended: true });
        }
        let Some(s) = self.sessions.get_mut(&session) else {
            return Ok(Reply::WaitTimedOut { ended: false });
        };
        let Some(wait) = s.waiting.get(&name).copied().filter(|w| w.seq == seq) else {
            return Ok(Reply::WaitTimedOut { ended: false });
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
        Ok(Reply::WaitTimedOut { ended: true })
    }

    /// Cancels the acquire `seq` of `session` on `name`, whatever became
    /// of it: a queued wait leaves the queue, a grant made to it and still
    /// held is released, and an acquire not applied yet (the cancel
    /// overtook it) is answered "not acquired" when it comes, granting
    /// nothing. Idempotent: `false` when there is nothing (left) to cancel.
    pub(super) fn cancel(&mut self, cx: &mut Cx, c: cmd::Cancel) -> Result<Reply, Refusal> {
        let cmd::Cancel {
            session,
            seq,
            name,
            caller,
        } = c;
        let (index, events) = (cx.index, &mut *cx.events);
        match self.sessions.get(&session) {
            // The session ended, and its waits and grants with it.
            None => return Ok(Reply::Cancelled { cancelled: false }),
            Some(s) if s.owner != caller => return Err(Refusal::NotOwner { session }),
            Some(_) => {}
        }
        if self
            .upgrades
            .get(&name)
            .is_some_and(|u| u.session == session && u.seq == seq)
        {
            // A pending upgrade: it stops waiting; the shared grant it
            // would have replaced stays held.
            self.end_upgrade(&name, CancelCause::Cancelled, events);
            self.promote(&name, index, events);
            return Ok(Reply::Cancelled { cancelled: true });
        }
        let queued_group = self
            .groups
            .get(&(session, seq))
            .is_some_and(|g| g.contains(&name));
        let mut moved = Vec::new();
        if queued_group
            && self.end_group((session, seq), CancelCause::Cancelled, events, &mut moved)
        {
            for n in &moved {
                self.promote(n, index, events);
            }
            return Ok(Reply::Cancelled { cancelled: true });
        }
        let Some(s) = self.sessions.get_mut(&session) else {
            return Ok(Reply::Cancelled { cancelled: false });
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
                        cause: CancelCause::Cancelled,
                    });
                }
            }
            // Those behind it may be grantable now.
            self.promote(&name, index, events);
            self.end_if_lock_failed(session, index, events);
            return Ok(Reply::Cancelled { cancelled: true });
        }
        if s.replies.is_unseen(seq) {
            // The acquire has not arrived (yet): when it does, it finds
            // this answer and is not applied (digest 0 matches it).
            s.replies
                .remember(seq, 0, &Reply::Acquire(Acquired::NotAcquired));
            return Ok(Reply::Cancelled { cancelled: false });
        }
        // Granted: every grant made to it (one, or an atomic request's
        // several) is released, if this name is among them.
        let grants = self.grants_of(session, seq);
        if !grants.iter().any(|(n, _, _)| *n == name) {
            // Not held, or held through another acquire: not this one's to
            // give back.
            return Ok(Reply::Cancelled { cancelled: false });
        }
        let all = matches!(
            self.sessions.get(&session).and_then(|s| s.replies.get(seq)),
            Some(Reply::AcquiredAll(_))
        );
        for (n, fence, _) in &grants {
            let Some(h) = self
                .locks
                .get_mut(n)
                .and_then(|lock| lock.holders.remove(fence).map(|h| (lock, h)))
                .map(|(lock, h)| {
                    lock.held_weight = lock.held_weight.saturating_sub(u64::from(h.mode.weight()));
                    h
                })
            else {
                return Err(Refusal::Inconsistent {
                    reason: format!("{session} lists a grant on {n} the lock does not have"),
                });
            };
            if let Some(s) = self.sessions.get_mut(&session) {
                s.held.remove(n);
            }
            events.push(Event::Ended {
                name: n.clone(),
                session,
                fence: *fence,
                mode: h.mode,
                cause: EndCause::Released,
            });
            // An upgrade of the cancelled grant ends with it.
            if self.upgrade_of(n, session, None).is_some() {
                self.end_upgrade(n, CancelCause::Cancelled, events);
            }
        }
        let not_acquired = if all {
            Reply::AcquiredAll(AcquiredAll::NotAcquired)
        } else {
            Reply::Acquire(Acquired::NotAcquired)
        };
        if let Some(s) = self.sessions.get_mut(&session) {
            s.replies.settle(seq, not_acquired);
        }
        for (n, _, _) in &grants {
            self.promote(n, index, events);
        }
        Ok(Reply::Cancelled { cancelled: true })
    }

    pub(super) fn end_lock_delay(
        &mut self,
        cx: &mut Cx,
        c: cmd::EndLockDelay,
    ) -> Result<Reply, Refusal> {
        let cmd::EndLockDelay { name, since } = c;
        let (index, events) = (cx.index, &mut *cx.events);
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
