//! Upgrading a shared grant to exclusive, and downgrading an exclusive one
//! to shared.
//!
//! An upgrade that cannot be granted at once waits in
//! [`LockTable::upgrades`], ahead of everyone in the name's queue: while it
//! waits no new grant is made on the name (the queue's head waits behind
//! it), and it is granted as soon as its own shared grant is the lock's
//! only one. Its shared grant stays held while it waits. Two upgrades of
//! one lock would each wait for the other's shared grant forever, so the
//! second is refused as a deadlock.

use super::acquire::{hold, next_fence};
use super::{owned, Cx, LockTable, Upgrade};
use crate::state::cmd;
use crate::state::command::{
    Acquired, CancelCause, EndCause, Event, LockName, Mode, Refusal, Reply, SessionId, WaitEdge,
};
use crate::state::limits::MAX_FENCE;

impl LockTable {
    pub(super) fn upgrade(&mut self, cx: &mut Cx, c: cmd::Upgrade) -> Result<Reply, Refusal> {
        let digest = c.digest();
        let cmd::Upgrade {
            session,
            seq,
            name,
            fence,
            timeout_ms,
            caller,
        } = c;
        let index = cx.index;
        let s = owned(self.sessions.get(&session), session, &caller)?;
        match s.replies.check(session, seq, digest)? {
            None => {}
            Some(Reply::Acquire(Acquired::Queued)) => {
                return Ok(Reply::Acquire(self.upgrade_standing(session, seq, &name)));
            }
            Some(reply) => return Ok(reply),
        }
        let not_held = || Refusal::NotHeldInMode {
            session,
            name: name.clone(),
            fence,
            mode: "shared".into(),
        };
        if s.held.get(&name) != Some(&fence) {
            return Err(not_held());
        }
        let Some(lock) = self.locks.get(&name) else {
            return Err(Refusal::Inconsistent {
                reason: format!("{session} lists a grant on {name} the lock does not have"),
            });
        };
        if lock
            .holders
            .get(&fence)
            .is_none_or(|h| h.mode != Mode::Shared)
        {
            return Err(not_held());
        }
        if let Some(u) = self.upgrades.get(&name) {
            return Err(if u.session == session {
                Refusal::AlreadyWaiting {
                    session,
                    name,
                    seq: u.seq,
                }
            } else {
                // Each would wait for the other's shared grant forever.
                Refusal::Deadlock {
                    cycle: vec![
                        WaitEdge {
                            session,
                            name: name.clone(),
                            blocker: u.session,
                        },
                        WaitEdge {
                            session: u.session,
                            name,
                            blocker: session,
                        },
                    ],
                }
            });
        }
        if self.last_fence >= MAX_FENCE {
            return Err(Refusal::FencesExhausted);
        }
        // Alone, and no lock-delay of an expired reader in force.
        let alone = lock.holders.len() == 1 && lock.delay.is_none();
        if !alone && timeout_ms == 0 {
            let reply = Reply::Acquire(Acquired::NotAcquired);
            self.remember(session, seq, digest, &reply);
            return Ok(reply);
        }
        let upgrade = Upgrade {
            session,
            seq,
            fence,
            timeout_ms,
            index,
        };
        if alone {
            // Granted now: those queued on the name will need it.
            if let Some(cycle) = self.find_mode_change_cycle(session, &name) {
                return Err(Refusal::Deadlock { cycle });
            }
            self.upgrades.insert(name.clone(), upgrade);
        } else {
            // Pending, it waits for the other holders and everyone queued
            // on the name waits for it: look for a cycle with both in
            // place, and take it back if there is one.
            self.upgrades.insert(name.clone(), upgrade);
            let cycle = self
                .find_upgrade_cycle(session, &name)
                .or_else(|| self.find_mode_change_cycle(session, &name));
            if let Some(cycle) = cycle {
                self.upgrades.remove(&name);
                return Err(Refusal::Deadlock { cycle });
            }
        }
        let reply = if alone {
            match self.grant_upgrade(&name, index, cx.events) {
                Some(granted) => Reply::Acquire(granted),
                None => {
                    return Err(Refusal::Inconsistent {
                        reason: format!("the upgrade of {name} by {session} was not granted alone"),
                    })
                }
            }
        } else {
            cx.events.push(Event::Queued {
                name,
                session,
                seq,
                mode: Mode::Exclusive,
                timeout_ms,
            });
            Reply::Acquire(Acquired::Queued)
        };
        self.remember(session, seq, digest, &reply);
        Ok(reply)
    }

    pub(super) fn downgrade(&mut self, cx: &mut Cx, c: cmd::Downgrade) -> Result<Reply, Refusal> {
        let digest = c.digest();
        let cmd::Downgrade {
            session,
            seq,
            name,
            fence,
            caller,
        } = c;
        let s = owned(self.sessions.get(&session), session, &caller)?;
        if let Some(reply) = s.replies.check(session, seq, digest)? {
            return Ok(reply);
        }
        let holds = s.held.get(&name) == Some(&fence);
        let Some(h) = self
            .locks
            .get_mut(&name)
            .and_then(|lock| lock.holders.get_mut(&fence))
            .filter(|h| holds && h.mode == Mode::Exclusive)
        else {
            return Err(Refusal::NotHeldInMode {
                session,
                name,
                fence,
                mode: "exclusive".into(),
            });
        };
        h.mode = Mode::Shared;
        cx.events.push(Event::Downgraded {
            name: name.clone(),
            session,
            fence,
        });
        // Shared requests at the head of the queue come in with it.
        self.promote(&name, cx.index, cx.events);
        let reply = Reply::Downgraded;
        self.remember(session, seq, digest, &reply);
        Ok(reply)
    }

    /// Grants `name`'s pending upgrade if its shared grant is the lock's
    /// only one and no lock-delay is in force: that grant ends and an exclusive one with a new fence
    /// replaces it. Returns the grant, or `None` if none was made (no
    /// upgrade pends, or it must go on waiting). At the fence bound the
    /// upgrade's wait ends, not acquired.
    pub(super) fn grant_upgrade(
        &mut self,
        name: &LockName,
        index: u64,
        events: &mut Vec<Event>,
    ) -> Option<Acquired> {
        let u = self.upgrades.get(name)?;
        let ready = self.locks.get(name).is_some_and(|l| {
            l.delay.is_none() && l.holders.len() == 1 && l.holders.contains_key(&u.fence)
        });
        if !ready {
            return None;
        }
        let Some(fence) = next_fence(&mut self.last_fence) else {
            self.end_upgrade(name, CancelCause::FencesExhausted, events);
            return None;
        };
        let u = self.upgrades.remove(name)?;
        let lock = self.locks.get_mut(name)?;
        let old = lock.holders.remove(&u.fence)?;
        lock.held_weight = lock
            .held_weight
            .saturating_sub(u64::from(old.mode.weight()));
        events.push(Event::Ended {
            name: name.clone(),
            session: u.session,
            fence: u.fence,
            mode: old.mode,
            cause: EndCause::Upgraded,
        });
        hold(
            lock,
            fence,
            u.session,
            u.seq,
            Mode::Exclusive,
            old.value,
            index,
        );
        let granted = Acquired::Granted {
            fence,
            mode: Mode::Exclusive,
            index,
        };
        if let Some(s) = self.sessions.get_mut(&u.session) {
            s.held.insert(name.clone(), fence);
            s.replies.settle(u.seq, Reply::Acquire(granted));
        }
        events.push(Event::Granted {
            name: name.clone(),
            session: u.session,
            seq: u.seq,
            fence,
            mode: Mode::Exclusive,
        });
        Some(granted)
    }

    /// Ends `name`'s pending upgrade, not acquired (its shared grant stays
    /// held). Returns whether one was pending.
    pub(super) fn end_upgrade(
        &mut self,
        name: &LockName,
        cause: CancelCause,
        events: &mut Vec<Event>,
    ) -> bool {
        let Some(u) = self.upgrades.remove(name) else {
            return false;
        };
        if let Some(s) = self.sessions.get_mut(&u.session) {
            s.replies
                .settle(u.seq, Reply::Acquire(Acquired::NotAcquired));
        }
        events.push(Event::Cancelled {
            name: name.clone(),
            session: u.session,
            seq: u.seq,
            mode: Mode::Exclusive,
            cause,
        });
        true
    }

    /// The pending upgrade of `name` by `session` (with `seq`, if given).
    pub(super) fn upgrade_of(
        &self,
        name: &LockName,
        session: SessionId,
        seq: Option<u64>,
    ) -> Option<&Upgrade> {
        self.upgrades
            .get(name)
            .filter(|u| u.session == session && seq.is_none_or(|q| u.seq == q))
    }

    /// Where the upgrade `seq` of `session` on `name` stands now: waiting,
    /// granted (and still held), or neither.
    fn upgrade_standing(&self, session: SessionId, seq: u64, name: &LockName) -> Acquired {
        if self.upgrade_of(name, session, Some(seq)).is_some() {
            return Acquired::Queued;
        }
        let held = self.sessions.get(&session).and_then(|s| s.held.get(name));
        let lock = self.locks.get(name);
        match (held, lock) {
            (Some(&fence), Some(lock)) => match lock.holders.get(&fence) {
                Some(h) if h.seq == seq => Acquired::Granted {
                    fence,
                    mode: h.mode,
                    index: h.index,
                },
                _ => Acquired::NotAcquired,
            },
            _ => Acquired::NotAcquired,
        }
    }
}
