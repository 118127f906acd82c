//! Atomic requests for several names (`AcquireAll`): all granted in one
//! step, or none.
//!
//! The waiting rule: a request that cannot be granted at once (and may
//! wait) takes a place at the end of every name's queue, in one step, and
//! is recorded in [`LockTable::groups`]. It is granted when it is at the
//! head of every one of its queues and fits every name; until then it holds
//! up those behind it in each queue (FIFO without barging, as any waiter).
//! Two atomic requests never wait for each other: whichever was applied
//! first is ahead of the other in every queue they share. A request that
//! already holds something and then waits can still close a wait-for cycle
//! with others; that is refused as for a single acquire.

use super::acquire::{hold, next_fence};
use super::{owned, Cx, Lock, LockTable, WaitRef, Waiter};
use crate::state::cmd;
use crate::state::command::{
    Acquired, AcquiredAll, CancelCause, Event, Fence, LockName, Mode, Refusal, Reply, SessionId,
};
use crate::state::limits::{MAX_FENCE, MAX_LOCKS_PER_SESSION, MAX_WAITERS_PER_NAME};

impl LockTable {
    pub(super) fn acquire_all(
        &mut self,
        cx: &mut Cx,
        c: cmd::AcquireAll,
    ) -> Result<Reply, Refusal> {
        let digest = c.digest();
        let cmd::AcquireAll {
            session,
            seq,
            locks,
            timeout_ms,
            value,
            caller,
        } = c;
        let index = cx.index;
        let s = owned(self.sessions.get(&session), session, &caller)?;
        match s.replies.check(session, seq, digest)? {
            None => {}
            Some(Reply::AcquiredAll(AcquiredAll::Queued)) => {
                let names: Vec<&LockName> = locks.iter().map(|(n, _)| n).collect();
                return Ok(Reply::AcquiredAll(self.standing_all(session, seq, &names)));
            }
            // A Cancel that came first (see `cancel`) left this answer.
            Some(Reply::Acquire(Acquired::NotAcquired)) => {
                return Ok(Reply::AcquiredAll(AcquiredAll::NotAcquired));
            }
            Some(reply) => return Ok(reply),
        }
        for (name, mode) in &locks {
            self.check_new(session, name, *mode)?;
        }
        let s = owned(self.sessions.get(&session), session, &caller)?;
        if s.held.len() + s.waiting.len() + locks.len() > MAX_LOCKS_PER_SESSION {
            return Err(Refusal::TooManyLocks { session });
        }
        self.usage.admit_entries(&s.owner, locks.len() as u64)?;
        // Every grant needs a fence of its own.
        if self.last_fence > MAX_FENCE - locks.len() as u64 {
            return Err(Refusal::FencesExhausted);
        }
        let free = locks.iter().all(|(name, mode)| {
            !self.upgrades.contains_key(name)
                && self
                    .locks
                    .get(name)
                    .is_none_or(|l| l.queue.is_empty() && l.compatible(*mode))
        });
        if free {
            let mut grants = Vec::with_capacity(locks.len());
            for (name, mode) in locks {
                let fence = next_fence(&mut self.last_fence).ok_or(Refusal::FencesExhausted)?;
                let lock = self
                    .locks
                    .entry(name.clone())
                    .or_insert_with(|| Lock::new(mode));
                hold(lock, fence, session, seq, mode, value.clone(), index);
                if let Some(s) = self.sessions.get_mut(&session) {
                    s.held.insert(name.clone(), fence);
                }
                cx.events.push(Event::Granted {
                    name,
                    session,
                    seq,
                    fence,
                    mode,
                });
                grants.push((fence, mode));
            }
            let reply = Reply::AcquiredAll(AcquiredAll::Granted { grants, index });
            self.remember(session, seq, digest, &reply);
            return Ok(reply);
        }
        if timeout_ms == 0 {
            let reply = Reply::AcquiredAll(AcquiredAll::NotAcquired);
            self.remember(session, seq, digest, &reply);
            return Ok(reply);
        }
        for (name, mode) in &locks {
            if self
                .locks
                .get(name)
                .is_some_and(|l| l.queue.len() >= MAX_WAITERS_PER_NAME)
            {
                return Err(Refusal::TooManyWaiters { name: name.clone() });
            }
            // A simple cycle through the requester leaves it by one of its
            // new edges, so checking each edge alone finds them all.
            if let Some(cycle) = self.find_cycle(session, name, *mode) {
                return Err(Refusal::Deadlock { cycle });
            }
        }
        let mut names = Vec::with_capacity(locks.len());
        for (name, mode) in locks {
            let lock = self
                .locks
                .entry(name.clone())
                .or_insert_with(|| Lock::new(mode));
            lock.queue.push_back(Waiter {
                session,
                seq,
                mode,
                value: value.clone(),
                timeout_ms,
                index,
            });
            if let Some(s) = self.sessions.get_mut(&session) {
                s.waiting.insert(name.clone(), WaitRef { seq, index });
            }
            cx.events.push(Event::Queued {
                name: name.clone(),
                session,
                seq,
                mode,
                timeout_ms,
            });
            names.push(name);
        }
        self.groups.insert((session, seq), names);
        let reply = Reply::AcquiredAll(AcquiredAll::Queued);
        self.remember(session, seq, digest, &reply);
        Ok(reply)
    }

    /// Where the atomic request `seq` of `session` for `names` stands now:
    /// queued, granted (every name still held under it), or neither.
    pub fn standing_all(&self, session: SessionId, seq: u64, names: &[&LockName]) -> AcquiredAll {
        if self.groups.contains_key(&(session, seq)) {
            return AcquiredAll::Queued;
        }
        let Some(s) = self.sessions.get(&session) else {
            return AcquiredAll::NotAcquired;
        };
        let mut grants = Vec::with_capacity(names.len());
        let mut index = 0;
        for name in names {
            let held = s.held.get(*name).and_then(|fence| {
                let h = self.locks.get(*name)?.holders.get(fence)?;
                (h.seq == seq).then_some((*fence, h.mode, h.index))
            });
            let Some((fence, mode, at)) = held else {
                return AcquiredAll::NotAcquired;
            };
            grants.push((fence, mode));
            index = at;
        }
        AcquiredAll::Granted { grants, index }
    }

    /// The queued atomic request the head of `name`'s queue belongs to, if
    /// the head is one.
    pub(super) fn head_group(&self, name: &LockName) -> Option<(SessionId, u64)> {
        let w = self.locks.get(name)?.queue.front()?;
        let key = (w.session, w.seq);
        self.groups.contains_key(&key).then_some(key)
    }

    /// Whether the queued atomic request `key` can be granted now: at the
    /// head of each of its queues, fitting each name, no upgrade pending on
    /// any.
    pub(in crate::state) fn group_ready(&self, key: (SessionId, u64)) -> bool {
        let Some(names) = self.groups.get(&key) else {
            return false;
        };
        names.iter().all(|name| {
            !self.upgrades.contains_key(name)
                && self.locks.get(name).is_some_and(|l| {
                    l.queue
                        .front()
                        .is_some_and(|w| (w.session, w.seq) == key && l.compatible(w.mode))
                })
        })
    }

    /// Grants the queued atomic request `key` (which must be
    /// [`group_ready`](Self::group_ready)): each name's head is granted with
    /// its own fence, in the request's order. The names whose queues moved
    /// are added to `moved`. At the fence bound the request's wait ends
    /// instead.
    pub(super) fn grant_group(
        &mut self,
        key: (SessionId, u64),
        index: u64,
        events: &mut Vec<Event>,
        moved: &mut Vec<LockName>,
    ) {
        let Some(names) = self.groups.get(&key) else {
            return;
        };
        if self.last_fence > MAX_FENCE - names.len() as u64 {
            self.end_group(key, CancelCause::FencesExhausted, events, moved);
            return;
        }
        let Some(names) = self.groups.remove(&key) else {
            return;
        };
        let (session, seq) = key;
        let mut grants = Vec::with_capacity(names.len());
        for name in &names {
            let Some(lock) = self.locks.get_mut(name) else {
                continue;
            };
            let Some(w) = lock.queue.pop_front() else {
                continue;
            };
            let Some(fence) = next_fence(&mut self.last_fence) else {
                continue;
            };
            hold(lock, fence, session, seq, w.mode, w.value, index);
            if let Some(s) = self.sessions.get_mut(&session) {
                s.waiting.remove(name);
                s.held.insert(name.clone(), fence);
            }
            events.push(Event::Granted {
                name: name.clone(),
                session,
                seq,
                fence,
                mode: w.mode,
            });
            grants.push((fence, w.mode));
        }
        if let Some(s) = self.sessions.get_mut(&session) {
            s.replies.settle(
                seq,
                Reply::AcquiredAll(AcquiredAll::Granted { grants, index }),
            );
        }
        moved.extend(names);
    }

    /// Ends the queued atomic request `key` not acquired: it leaves every
    /// queue. The names whose queues it left are added to `moved` (those
    /// behind it may be grantable now). Returns whether it was queued.
    pub(super) fn end_group(
        &mut self,
        key: (SessionId, u64),
        cause: CancelCause,
        events: &mut Vec<Event>,
        moved: &mut Vec<LockName>,
    ) -> bool {
        let Some(names) = self.groups.remove(&key) else {
            return false;
        };
        let (session, seq) = key;
        for name in names {
            let wait = self
                .sessions
                .get_mut(&session)
                .and_then(|s| s.waiting.remove(&name));
            let removed = self.locks.get_mut(&name).and_then(|lock| {
                let pos = match wait {
                    Some(w) => lock.position(w.index),
                    None => lock.queue.iter().position(|w| (w.session, w.seq) == key),
                }?;
                lock.queue.remove(pos)
            });
            if let Some(w) = removed {
                events.push(Event::Cancelled {
                    name: name.clone(),
                    session,
                    seq,
                    mode: w.mode,
                    cause,
                });
            }
            moved.push(name);
        }
        if let Some(s) = self.sessions.get_mut(&session) {
            s.replies
                .settle(seq, Reply::AcquiredAll(AcquiredAll::NotAcquired));
        }
        true
    }

    /// The grants `session` holds under `seq` (one, or an atomic
    /// request's several), as `(name, fence, mode)`.
    pub(super) fn grants_of(&self, session: SessionId, seq: u64) -> Vec<(LockName, Fence, Mode)> {
        let Some(s) = self.sessions.get(&session) else {
            return Vec::new();
        };
        s.held
            .iter()
            .filter_map(|(name, fence)| {
                let h = self.locks.get(name)?.holders.get(fence)?;
                (h.seq == seq).then(|| (name.clone(), *fence, h.mode))
            })
            .collect()
    }
}
