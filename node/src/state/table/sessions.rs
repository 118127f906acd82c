//! Opening, closing and ending sessions.

use std::collections::BTreeMap;

use super::{owned, Closed, Cx, Delay, LockTable, Replies, Session};
use crate::state::cmd;
use crate::state::command::{
    Acquired, CancelCause, EndCause, Event, LockName, Refusal, Reply, SessionId, LOCK_SEQ,
};
use crate::state::limits::MAX_REMEMBERED_CLOSES;

/// How a session ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ending {
    /// Its owner closed it: no lock-delay.
    Closed,
    /// Its lease ran out: lock-delay applies.
    Expired,
    /// An administrator revoked it: as an expiry, lock-delay included.
    Revoked,
}

impl LockTable {
    pub(super) fn open_session(
        &mut self,
        cx: &mut Cx,
        open: cmd::OpenSession,
    ) -> Result<Reply, Refusal> {
        let cmd::OpenSession {
            ttl_ms,
            lock_delay_ms,
            nonce,
            owner,
            end_on_disconnect_ms,
        } = open;
        let (index, events) = (cx.index, &mut *cx.events);
        if nonce != 0 {
            if let Some(&session) = self.nonces.get(&nonce) {
                let Some(s) = self.sessions.get(&session) else {
                    return Err(Refusal::Inconsistent {
                        reason: format!("nonce {nonce} names {session}, which is not open"),
                    });
                };
                // A retried open finds its session only for the same
                // identity.
                if s.owner != owner {
                    return Err(Refusal::NotOwner { session });
                }
                return Ok(Reply::Opened {
                    session,
                    ttl_ms: s.ttl_ms,
                    lock_delay_ms: s.lock_delay_ms,
                });
            }
        }
        self.usage.admit_session(&owner)?;
        let session = SessionId(index);
        if self.sessions.contains_key(&session) {
            // Ids come from command indexes, which only grow (and a restore
            // lifts them above the backup's), so this cannot happen; if a
            // bug ever made it happen, overwriting the session would hand
            // its grants to a stranger.
            return Err(Refusal::Inconsistent {
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
                end_on_disconnect_ms,
                lock_pending: false,
            },
        );
        if nonce != 0 {
            self.nonces.insert(nonce, session);
        }
        events.push(Event::SessionOpened {
            session,
            ttl_ms,
            end_on_disconnect_ms,
        });
        Ok(Reply::Opened {
            session,
            ttl_ms,
            lock_delay_ms,
        })
    }

    /// The one-call `Lock`: opens a session and acquires `name` in it, as
    /// one command. A retry (same nonce, same identity) finds the session
    /// and answers with where its acquire stands. If the acquire is
    /// refused or not acquired at once (a try, or a busy name without a
    /// wait), nothing is left behind; if it is queued, the session is
    /// marked so that it ends if the wait ends without a grant.
    pub(super) fn lock(&mut self, cx: &mut Cx, c: cmd::Lock) -> Result<Reply, Refusal> {
        let digest = c.digest();
        let cmd::Lock {
            open,
            name,
            mode,
            timeout_ms,
            value,
        } = c;
        let index = cx.index;
        if open.nonce != 0 {
            if let Some(&session) = self.nonces.get(&open.nonce) {
                let s = self.sessions.get(&session).ok_or(Refusal::Inconsistent {
                    reason: format!("nonce {} names {session}, which is not open", open.nonce),
                })?;
                if s.owner != open.owner {
                    return Err(Refusal::NotOwner { session });
                }
                let ttl_ms = s.ttl_ms;
                let outcome = match s.replies.check(session, LOCK_SEQ, digest)? {
                    Some(Reply::Acquire(Acquired::Queued)) | None => self.standing(session, &name),
                    Some(Reply::Acquire(outcome)) => outcome,
                    Some(other) => {
                        return Err(Refusal::Inconsistent {
                            reason: format!("{session}'s lock acquire was answered {other:?}"),
                        })
                    }
                };
                return Ok(Reply::Locked {
                    session,
                    ttl_ms,
                    outcome,
                });
            }
        }
        let owner = open.owner.clone();
        let ttl_ms = open.ttl_ms;
        // Into a scratch list: if the acquire fails, the open is undone and
        // nothing of it may be told.
        let mut opened = Vec::new();
        let session = match self.open_session(
            &mut Cx {
                index,
                events: &mut opened,
            },
            open,
        )? {
            Reply::Opened { session, .. } => session,
            other => {
                return Err(Refusal::Inconsistent {
                    reason: format!("open answered {other:?}"),
                })
            }
        };
        let mut acquired = Vec::new();
        let result = self.acquire(
            &mut Cx {
                index,
                events: &mut acquired,
            },
            cmd::Acquire {
                session,
                seq: LOCK_SEQ,
                name,
                mode,
                timeout_ms,
                value,
                caller: owner,
            },
        );
        let outcome = match result {
            Ok(Reply::Acquire(outcome)) => outcome,
            Ok(other) => {
                self.undo_open(session);
                return Err(Refusal::Inconsistent {
                    reason: format!("acquire answered {other:?}"),
                });
            }
            Err(refusal) => {
                self.undo_open(session);
                return Err(refusal);
            }
        };
        match outcome {
            Acquired::NotAcquired => {
                self.undo_open(session);
                return Ok(Reply::Locked {
                    session: SessionId(0),
                    ttl_ms,
                    outcome,
                });
            }
            Acquired::Queued => {
                if let Some(s) = self.sessions.get_mut(&session) {
                    s.lock_pending = true;
                }
            }
            Acquired::Granted { .. } => {}
        }
        cx.events.extend(opened);
        cx.events.extend(acquired);
        Ok(Reply::Locked {
            session,
            ttl_ms,
            outcome,
        })
    }

    /// Removes a session just opened by a `Lock` whose acquire did not
    /// stay (it holds and waits for nothing; no event told of it).
    fn undo_open(&mut self, session: SessionId) {
        if let Some(s) = self.sessions.remove(&session) {
            if s.nonce != 0 {
                self.nonces.remove(&s.nonce);
            }
        }
    }

    /// Ends `session` if a one-call `Lock`'s wait was its only business and
    /// that wait has ended without a grant (closed: no lock-delay).
    pub(super) fn end_if_lock_failed(
        &mut self,
        session: SessionId,
        index: u64,
        events: &mut Vec<Event>,
    ) {
        let failed = self
            .sessions
            .get(&session)
            .is_some_and(|s| s.lock_pending && s.held.is_empty() && s.waiting.is_empty());
        if failed {
            self.end_session(session, Ending::Closed, index, events);
        }
    }

    /// Changes `session`'s ttl (exactly once per seq).
    pub(super) fn set_ttl(&mut self, cx: &mut Cx, c: cmd::SetTtl) -> Result<Reply, Refusal> {
        let digest = c.digest();
        let cmd::SetTtl {
            session,
            seq,
            ttl_ms,
            caller,
        } = c;
        let events = &mut *cx.events;
        let s = owned(self.sessions.get_mut(&session), session, &caller)?;
        if let Some(reply) = s.replies.check(session, seq, digest)? {
            return Ok(reply);
        }
        s.ttl_ms = ttl_ms;
        let reply = Reply::TtlSet { ttl_ms };
        s.replies.remember(seq, digest, &reply);
        events.push(Event::SessionTtlChanged { session, ttl_ms });
        Ok(reply)
    }

    /// Removes a session: cancels its waits, ends its grants (starting
    /// lock-delay on expiry), then lets the affected queues move on. Returns
    /// the number of grants ended, or `None` if there was no such session.
    pub(super) fn end_session(
        &mut self,
        session: SessionId,
        ending: Ending,
        index: u64,
        events: &mut Vec<Event>,
    ) -> Option<u32> {
        let s = self.sessions.remove(&session)?;
        let expired = ending == Ending::Expired;
        // A revoke is an expiry an administrator decided: lock-delay too.
        let delayed = ending != Ending::Closed;
        if s.nonce != 0 {
            self.nonces.remove(&s.nonce);
        }
        // Its atomic requests' places are among its waits, removed below.
        self.groups.retain(|(owner, _), _| *owner != session);
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
        let cause = match ending {
            Ending::Closed => EndCause::SessionClosed,
            Ending::Expired => EndCause::SessionExpired,
            Ending::Revoked => EndCause::Revoked,
        };
        let released = s.held.len() as u32;
        for (name, fence) in s.held {
            if self.upgrade_of(&name, session, None).is_some() {
                self.end_upgrade(&name, CancelCause::SessionEnded, events);
            }
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
                if delayed && s.lock_delay_ms > 0 {
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

    /// Ends `session` for an administrator, as an expiry would. A session
    /// that is not open (never was, ended, or revoked already) is refused
    /// as not found and nothing changes.
    pub(super) fn revoke_session(
        &mut self,
        cx: &mut Cx,
        c: cmd::RevokeSession,
    ) -> Result<Reply, Refusal> {
        let cmd::RevokeSession {
            session,
            by,
            at_unix_ms,
        } = c;
        if !self.sessions.contains_key(&session) {
            return Err(Refusal::SessionNotFound { session });
        }
        let mut ended = vec![Event::SessionRevoked {
            session,
            by,
            at_unix_ms,
        }];
        let Some(released) = self.end_session(session, Ending::Revoked, cx.index, &mut ended)
        else {
            return Err(Refusal::SessionNotFound { session });
        };
        cx.events.extend(ended);
        Ok(Reply::Revoked { released })
    }

    /// Closes `session` for its owner, or answers a retried close like the
    /// first one.
    pub(super) fn close_session(
        &mut self,
        cx: &mut Cx,
        c: cmd::CloseSession,
    ) -> Result<Reply, Refusal> {
        let digest = c.digest();
        let cmd::CloseSession {
            session,
            seq,
            caller,
        } = c;
        let (index, events) = (cx.index, &mut *cx.events);
        match self.sessions.get(&session) {
            Some(s) if s.owner != caller => return Err(Refusal::NotOwner { session }),
            Some(s) => {
                // A seq the session used for another request (or forgot
                // already) is refused like anywhere else: a close is
                // applied only under a new seq.
                if s.replies.check(session, seq, digest)?.is_some() {
                    return Err(Refusal::SequenceReused { session, seq });
                }
            }
            None => {
                return match self.closed.get(&session) {
                    Some(c) if c.owner != caller => Err(Refusal::NotOwner { session }),
                    Some(c) if c.seq == seq => Ok(Reply::Closed {
                        released: c.released,
                    }),
                    // Expired, never opened, or closed by another request.
                    _ => Err(Refusal::SessionNotFound { session }),
                };
            }
        }
        let owner = caller.to_string();
        let Some(released) = self.end_session(session, Ending::Closed, index, events) else {
            return Err(Refusal::SessionNotFound { session });
        };
        self.closed.insert(
            session,
            Closed {
                index,
                seq,
                released,
                owner,
            },
        );
        self.closed_order.insert((index, session));
        while self.closed.len() > MAX_REMEMBERED_CLOSES {
            let Some((_, oldest)) = self.closed_order.pop_first() else {
                break;
            };
            self.closed.remove(&oldest);
        }
        Ok(Reply::Closed { released })
    }
}
