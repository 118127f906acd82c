//! Unit tests for the lock table: one or more per rule, failure paths
//! included, and every limit of [`limits`](super::limits) at its edge (the
//! largest accepted value accepted, the first refused one refused, and the
//! table unchanged by the refusal).
//!
//! Every step a [`Harness`] applies is followed by
//! [`LockTable::check_invariants`], so each test also checks that the
//! situations it builds are legal. The few tests that build tables at the
//! limits insert thousands of entries directly (through the `pub(super)`
//! fields) and check the invariants once: applying them one by one, with a
//! full check after each, would be quadratic.

use std::collections::BTreeMap;

use super::limits::*;
use super::table::{Counts, PendingRestore, Session, Usage, WaitRef, Waiter};
use super::view::SNAPSHOT_VERSION;
use super::*;

mod acquire;
mod deadlock;
mod golden;
mod limits;
mod multi;
mod oneshot;
mod release;
mod replies;
mod restore;
mod revoke;
mod sessions;
mod snapshot;
mod upgrade;
mod views;

const X: Mode = Mode::Exclusive;
const SH: Mode = Mode::Shared;
/// `timeout_ms` of a try.
const TRY: u64 = 0;
/// `timeout_ms` of an ordinary blocking acquire.
const WAIT: u64 = 30_000;

fn sem(weight: u32, capacity: u32) -> Mode {
    Mode::Semaphore { weight, capacity }
}

fn name(s: &str) -> LockName {
    LockName::new(s).expect("valid test name")
}

fn open_cmd(ttl_ms: u64, lock_delay_ms: u64, nonce: u64) -> Command {
    Command::OpenSessionV0(cmd::OpenSessionV0 {
        ttl_ms,
        lock_delay_ms,
        nonce,
        owner: String::new(),
    })
}

fn acq(session: SessionId, seq: u64, name: &str, mode: Mode, timeout_ms: u64) -> Command {
    acq_value(session, seq, name, mode, timeout_ms, Vec::new())
}

fn acq_value(
    session: SessionId,
    seq: u64,
    name: &str,
    mode: Mode,
    timeout_ms: u64,
    value: Vec<u8>,
) -> Command {
    Command::Acquire(cmd::Acquire {
        session,
        seq,
        name: LockName::new(name).expect("valid name"),
        mode,
        timeout_ms,
        value,
        caller: String::new(),
    })
}

fn rel(session: SessionId, seq: u64, name: &str, fence: Fence) -> Command {
    Command::Release(cmd::Release {
        session,
        seq,
        name: LockName::new(name).expect("valid name"),
        fence,
        caller: String::new(),
    })
}

fn cancel(session: SessionId, name: &str, seq: u64) -> Command {
    Command::TimeoutWait(cmd::TimeoutWait {
        session,
        name: LockName::new(name).expect("valid name"),
        seq,
    })
}

fn end_delay(name: &str, since: u64) -> Command {
    Command::EndLockDelay(cmd::EndLockDelay {
        name: LockName::new(name).expect("valid name"),
        since,
    })
}

fn granted_reply(fence: Fence, mode: Mode, index: u64) -> Reply {
    Reply::Acquire(Acquired::Granted { fence, mode, index })
}

/// The fence of a `Granted` reply.
fn fence_of(r: &Response) -> Fence {
    match r.reply {
        Reply::Acquire(Acquired::Granted { fence, .. }) => fence,
        ref other => panic!("expected a grant, got {other:?}"),
    }
}

/// `(session, name, fence)` of every `Granted` event, in order.
fn grants(r: &Response) -> Vec<(SessionId, String, Fence)> {
    r.events
        .iter()
        .filter_map(|e| match e {
            Event::Granted {
                name,
                session,
                fence,
                ..
            } => Some((*session, name.as_str().to_string(), *fence)),
            _ => None,
        })
        .collect()
}

fn holders(t: &LockTable, n: &str) -> Vec<(SessionId, Mode)> {
    t.describe(&name(n))
        .map(|i| i.holders.iter().map(|h| (h.session, h.mode)).collect())
        .unwrap_or_default()
}

fn waiters(t: &LockTable, n: &str) -> Vec<(SessionId, Mode)> {
    t.describe(&name(n))
        .map(|i| i.waiters.iter().map(|w| (w.session, w.mode)).collect())
        .unwrap_or_default()
}

/// A table plus the next log index and a sequence-number counter (one
/// counter for all sessions keeps every session's numbers unique).
struct Harness {
    table: LockTable,
    index: u64,
    seq: u64,
}

impl Harness {
    fn new() -> Self {
        Harness {
            table: LockTable::new(),
            index: 0,
            seq: 0,
        }
    }

    /// Applies at the next index and checks the invariants.
    fn apply(&mut self, command: Command) -> Response {
        let r = self.apply_unchecked(command);
        if let Err(e) = self.table.check_invariants() {
            panic!(
                "invariant broken at index {}: {e}\n{:#?}",
                self.index, self.table
            );
        }
        r
    }

    /// Applies at the next index without the (linear) invariant check.
    fn apply_unchecked(&mut self, command: Command) -> Response {
        self.index += 1;
        self.table.apply(self.index, command)
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn open(&mut self) -> SessionId {
        self.open_with(10_000, 0)
    }

    fn open_with(&mut self, ttl_ms: u64, lock_delay_ms: u64) -> SessionId {
        match self.apply(open_cmd(ttl_ms, lock_delay_ms, 0)).reply {
            Reply::Opened { session, .. } => session,
            other => panic!("open failed: {other:?}"),
        }
    }

    /// An acquire with a fresh sequence number (readable in `self.seq`).
    fn acquire(&mut self, session: SessionId, n: &str, mode: Mode, timeout_ms: u64) -> Response {
        let seq = self.next_seq();
        self.apply(acq(session, seq, n, mode, timeout_ms))
    }

    /// Acquires and expects an immediate grant.
    fn grant(&mut self, session: SessionId, n: &str, mode: Mode) -> Fence {
        let r = self.acquire(session, n, mode, WAIT);
        let fence = fence_of(&r);
        let seq = self.seq;
        assert_eq!(
            r.events,
            vec![Event::Granted {
                name: name(n),
                session,
                seq,
                fence,
                mode
            }]
        );
        assert_eq!(fence, self.table.last_fence());
        fence
    }

    /// Acquires and expects to be queued; returns the acquire's seq.
    fn queue(&mut self, session: SessionId, n: &str, mode: Mode) -> u64 {
        let r = self.acquire(session, n, mode, WAIT);
        let seq = self.seq;
        assert_eq!(
            r.reply,
            Reply::Acquire(Acquired::Queued),
            "{session} on {n}"
        );
        assert_eq!(
            r.events,
            vec![Event::Queued {
                name: name(n),
                session,
                seq,
                mode,
                timeout_ms: WAIT
            }]
        );
        seq
    }

    /// A try that must find the name busy, and must not queue.
    fn try_fails(&mut self, session: SessionId, n: &str, mode: Mode) {
        let locks = self.table.locks.clone();
        let r = self.acquire(session, n, mode, TRY);
        assert_eq!(
            r.reply,
            Reply::Acquire(Acquired::NotAcquired),
            "{session} on {n}"
        );
        assert!(r.events.is_empty());
        assert_eq!(self.table.locks, locks, "a failed try changed a lock");
    }

    fn release(&mut self, session: SessionId, n: &str, fence: Fence) -> Response {
        let seq = self.next_seq();
        self.apply(rel(session, seq, n, fence))
    }

    /// Releases and expects the grant to end (and to be reported first).
    fn released(&mut self, session: SessionId, n: &str, fence: Fence) -> Response {
        let mode = self
            .table
            .describe(&name(n))
            .and_then(|i| i.holders.into_iter().find(|h| h.fence == fence))
            .map(|h| h.mode)
            .expect("a current grant");
        let r = self.release(session, n, fence);
        assert_eq!(r.reply, Reply::Released { released: true });
        assert_eq!(
            r.events[0],
            Event::Ended {
                name: name(n),
                session,
                fence,
                mode,
                cause: EndCause::Released
            }
        );
        r
    }

    fn close(&mut self, session: SessionId) -> Response {
        let seq = self.next_seq();
        self.apply(Command::CloseSession(cmd::CloseSession {
            session,
            seq,
            caller: String::new(),
        }))
    }

    /// Applies `command`, expects a refusal and no change at all.
    fn refuse(&mut self, command: Command) -> Refusal {
        let before = self.table.clone();
        let r = self.apply(command);
        self.assert_refusal(before, r)
    }

    fn refuse_unchecked(&mut self, command: Command) -> Refusal {
        let before = self.table.clone();
        let r = self.apply_unchecked(command);
        self.assert_refusal(before, r)
    }

    fn assert_refusal(&self, before: LockTable, r: Response) -> Refusal {
        assert!(r.events.is_empty(), "a refusal had events: {:?}", r.events);
        assert!(self.table == before, "a refusal changed the table");
        match r.reply {
            Reply::Refused(refusal) => refusal,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// Applies `command`, expects no events and no change; returns the reply.
    fn no_op(&mut self, command: Command) -> Reply {
        let before = self.table.clone();
        let r = self.apply(command);
        assert!(r.events.is_empty(), "unexpected events: {:?}", r.events);
        assert!(self.table == before, "the table changed");
        r.reply
    }
}
