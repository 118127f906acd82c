//! Opening, closing and ending sessions.

use std::collections::BTreeMap;

use super::{Closed, Delay, LockTable, Replies, Session};
use crate::state::command::{CancelCause, EndCause, Event, LockName, Refusal, Reply, SessionId};
use crate::state::limits::{MAX_REMEMBERED_CLOSES, MAX_SESSIONS};

impl LockTable {
    pub(super) fn open_session(
        &mut self,
        index: u64,
        ttl_ms: u64,
        lock_delay_ms: u64,
        nonce: u64,
        owner: String,
        events: &mut Vec<Event>,
    ) -> Result<Reply, Refusal> {
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
        if self.sessions.len() >= MAX_SESSIONS {
            return Err(Refusal::TooManySessions);
        }
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
            },
        );
        if nonce != 0 {
            self.nonces.insert(nonce, session);
        }
        events.push(Event::SessionOpened { session, ttl_ms });
        Ok(Reply::Opened {
            session,
            ttl_ms,
            lock_delay_ms,
        })
    }

    /// Removes a session: cancels its waits, ends its grants (starting
    /// lock-delay on expiry), then lets the affected queues move on. Returns
    /// the number of grants ended, or `None` if there was no such session.
    pub(super) fn end_session(
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

    /// Closes `session` for its owner, or answers a retried close like the
    /// first one.
    pub(super) fn close_session(
        &mut self,
        index: u64,
        (session, caller, digest): (SessionId, &str, u64),
        seq: u64,
        events: &mut Vec<Event>,
    ) -> Result<Reply, Refusal> {
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
        let Some(released) = self.end_session(session, false, index, events) else {
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
