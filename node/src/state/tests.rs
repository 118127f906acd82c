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
use super::table::{PendingRestore, Session, WaitRef, Waiter};
use super::view::SNAPSHOT_VERSION;
use super::*;

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
    Command::OpenSession {
        ttl_ms,
        lock_delay_ms,
        nonce,
        owner: String::new(),
    }
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
    Command::Acquire {
        session,
        seq,
        name: name.to_string(),
        mode,
        timeout_ms,
        value,
        caller: String::new(),
    }
}

fn rel(session: SessionId, seq: u64, name: &str, fence: Fence) -> Command {
    Command::Release {
        session,
        seq,
        name: name.to_string(),
        fence,
        caller: String::new(),
    }
}

fn cancel(session: SessionId, name: &str, seq: u64) -> Command {
    Command::CancelWait {
        session,
        name: name.to_string(),
        seq,
    }
}

fn end_delay(name: &str, since: u64) -> Command {
    Command::EndLockDelay {
        name: name.to_string(),
        since,
    }
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
        self.apply(Command::CloseSession {
            session,
            seq,
            caller: String::new(),
        })
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

// ---------------------------------------------------------------- sessions

#[test]
fn open_session_id_is_the_log_index() {
    let mut t = LockTable::new();
    let r = t.apply(7, open_cmd(5_000, 250, 0));
    assert_eq!(
        r.reply,
        Reply::Opened {
            session: SessionId(7),
            ttl_ms: 5_000,
            lock_delay_ms: 250
        }
    );
    assert_eq!(
        r.events,
        vec![Event::SessionOpened {
            session: SessionId(7),
            ttl_ms: 5_000
        }]
    );
    assert_eq!(
        t.session(SessionId(7)),
        Some(SessionInfo {
            session: SessionId(7),
            ttl_ms: 5_000,
            lock_delay_ms: 250
        })
    );
    let r = t.apply(9, open_cmd(1_000, 0, 0));
    assert_eq!(
        r.reply,
        Reply::Opened {
            session: SessionId(9),
            ttl_ms: 1_000,
            lock_delay_ms: 0
        }
    );
    let ids: Vec<_> = t.sessions().map(|s| s.session).collect();
    assert_eq!(ids, vec![SessionId(7), SessionId(9)]);
    assert_eq!(t.session(SessionId(8)), None);
    t.check_invariants().unwrap();
}

#[test]
fn open_session_with_a_known_nonce_returns_the_same_session() {
    let mut h = Harness::new();
    let r = h.apply(open_cmd(5_000, 100, 42));
    let first = Reply::Opened {
        session: SessionId(1),
        ttl_ms: 5_000,
        lock_delay_ms: 100,
    };
    assert_eq!(r.reply, first);

    // A retry (even with other settings) finds the session and changes nothing.
    assert_eq!(h.no_op(open_cmd(9_000, 0, 42)), first);
    assert_eq!(h.table.stats().sessions, 1);

    // Another nonce, and nonce 0, open new sessions every time.
    let r = h.apply(open_cmd(5_000, 0, 43));
    assert_eq!(
        r.reply,
        Reply::Opened {
            session: SessionId(3),
            ttl_ms: 5_000,
            lock_delay_ms: 0
        }
    );
    let a = h.open();
    let b = h.open();
    assert_ne!(a, b);
    assert_eq!(h.table.stats().sessions, 4);

    // Once its session ended, a nonce opens a fresh session.
    h.close(SessionId(1));
    let r = h.apply(open_cmd(5_000, 0, 42));
    let index = h.index;
    assert_eq!(
        r.reply,
        Reply::Opened {
            session: SessionId(index),
            ttl_ms: 5_000,
            lock_delay_ms: 0
        }
    );
    assert_eq!(
        r.events,
        vec![Event::SessionOpened {
            session: SessionId(index),
            ttl_ms: 5_000
        }]
    );
}

#[test]
fn close_session_releases_everything_and_cancels_waits() {
    let mut h = Harness::new();
    // A lock-delay, which a close (unlike an expiry) must not start.
    let a = h.open_with(10_000, 5_000);
    let b = h.open();
    let fx = h.grant(a, "x", X);
    let fy = h.grant(a, "y", SH);
    let fz = h.grant(a, "z", sem(2, 3));
    h.grant(b, "w", X);
    let wseq = h.queue(a, "w", X);

    let r = h.close(a);
    assert_eq!(r.reply, Reply::Closed { released: 3 });
    assert_eq!(
        r.events,
        vec![
            Event::Cancelled {
                name: name("w"),
                session: a,
                seq: wseq,
                mode: X,
                cause: CancelCause::SessionEnded
            },
            Event::Ended {
                name: name("x"),
                session: a,
                fence: fx,
                mode: X,
                cause: EndCause::SessionClosed
            },
            Event::Ended {
                name: name("y"),
                session: a,
                fence: fy,
                mode: SH,
                cause: EndCause::SessionClosed
            },
            Event::Ended {
                name: name("z"),
                session: a,
                fence: fz,
                mode: sem(2, 3),
                cause: EndCause::SessionClosed
            },
            Event::SessionEnded {
                session: a,
                expired: false
            },
        ]
    );
    assert_eq!(h.table.session(a), None);
    for n in ["x", "y", "z"] {
        assert_eq!(h.table.describe(&name(n)), None, "{n} kept an entry");
    }
    assert_eq!(holders(&h.table, "w"), vec![(b, X)]);
    assert_eq!(waiters(&h.table, "w"), vec![]);
    assert_eq!(h.table.delays().count(), 0);

    // Closing again, or using the closed session, is refused.
    let seq = h.next_seq();
    assert_eq!(
        h.refuse(Command::CloseSession {
            session: a,
            seq,
            caller: String::new()
        }),
        Refusal::SessionNotFound { session: a }
    );
    let seq = h.next_seq();
    assert_eq!(
        h.refuse(acq(a, seq, "x", X, WAIT)),
        Refusal::SessionNotFound { session: a }
    );
}

#[test]
fn close_session_hands_its_names_to_waiters_without_lock_delay() {
    let mut h = Harness::new();
    let a = h.open_with(10_000, 60_000);
    let b = h.open();
    let fa = h.grant(a, "x", X);
    let bseq = h.queue(b, "x", X);
    let r = h.close(a);
    let fb = h.table.last_fence();
    assert!(fb > fa);
    assert_eq!(
        r.events,
        vec![
            Event::Ended {
                name: name("x"),
                session: a,
                fence: fa,
                mode: X,
                cause: EndCause::SessionClosed
            },
            Event::SessionEnded {
                session: a,
                expired: false
            },
            Event::Granted {
                name: name("x"),
                session: b,
                seq: bseq,
                fence: fb,
                mode: X
            },
        ]
    );
    assert_eq!(holders(&h.table, "x"), vec![(b, X)]);
    assert!(!h.table.describe(&name("x")).unwrap().lock_delayed);
}

#[test]
fn unknown_session_is_refused_or_ignored_everywhere() {
    let mut h = Harness::new();
    let a = h.open();
    let fa = h.grant(a, "x", X);
    let ghost = SessionId(999);
    let seq = h.next_seq();
    assert_eq!(
        h.refuse(acq(ghost, seq, "x", X, WAIT)),
        Refusal::SessionNotFound { session: ghost }
    );
    let seq = h.next_seq();
    assert_eq!(
        h.refuse(rel(ghost, seq, "x", fa)),
        Refusal::SessionNotFound { session: ghost }
    );
    let seq = h.next_seq();
    assert_eq!(
        h.refuse(Command::CloseSession {
            session: ghost,
            seq,
            caller: String::new(),
        }),
        Refusal::SessionNotFound { session: ghost }
    );
    // The leader's own commands about a gone session are harmless no-ops.
    assert_eq!(
        h.no_op(Command::ExpireSession { session: ghost }),
        Reply::Expired { existed: false }
    );
    assert_eq!(
        h.no_op(cancel(ghost, "x", 1)),
        Reply::Cancelled { cancelled: false }
    );
}

#[test]
fn expire_session_releases_drops_waits_and_grants_the_next_waiter() {
    let mut h = Harness::new();
    let a = h.open(); // no lock-delay
    let b = h.open();
    let c = h.open();
    let fx = h.grant(a, "x", X);
    h.grant(c, "y", X);
    let aseq = h.queue(a, "y", X);
    let bseq = h.queue(b, "x", X);

    let r = h.apply(Command::ExpireSession { session: a });
    assert_eq!(r.reply, Reply::Expired { existed: true });
    let fb = h.table.last_fence();
    assert!(fb > fx);
    assert_eq!(
        r.events,
        vec![
            Event::Cancelled {
                name: name("y"),
                session: a,
                seq: aseq,
                mode: X,
                cause: CancelCause::SessionEnded
            },
            Event::Ended {
                name: name("x"),
                session: a,
                fence: fx,
                mode: X,
                cause: EndCause::SessionExpired
            },
            Event::SessionEnded {
                session: a,
                expired: true
            },
            Event::Granted {
                name: name("x"),
                session: b,
                seq: bseq,
                fence: fb,
                mode: X
            },
        ]
    );
    assert_eq!(h.table.session(a), None);
    assert_eq!(holders(&h.table, "x"), vec![(b, X)]);
    assert_eq!(waiters(&h.table, "y"), vec![]);
    assert_eq!(h.table.delays().count(), 0);

    // A second expiry of the same session finds nothing.
    assert_eq!(
        h.no_op(Command::ExpireSession { session: a }),
        Reply::Expired { existed: false }
    );
}

#[test]
fn expiry_with_lock_delay_blocks_grants_until_the_delay_ends() {
    let mut h = Harness::new();
    let a = h.open_with(10_000, 5_000);
    let b = h.open();
    let c = h.open();
    let d = h.open();
    let fa = h.grant(a, "x", X);
    let bseq = h.queue(b, "x", X);

    let r = h.apply(Command::ExpireSession { session: a });
    let since = h.index;
    assert_eq!(
        r.events,
        vec![
            Event::Ended {
                name: name("x"),
                session: a,
                fence: fa,
                mode: X,
                cause: EndCause::SessionExpired
            },
            Event::LockDelayStarted {
                name: name("x"),
                delay_ms: 5_000,
                since
            },
            Event::SessionEnded {
                session: a,
                expired: true
            },
        ]
    );
    let info = h.table.describe(&name("x")).unwrap();
    assert!(info.lock_delayed);
    assert!(info.holders.is_empty());
    assert_eq!(waiters(&h.table, "x"), vec![(b, X)]);
    let delays: Vec<_> = h
        .table
        .delays()
        .map(|(n, s, d)| (n.clone(), s, d))
        .collect();
    assert_eq!(delays, vec![(name("x"), since, 5_000)]);

    // Nothing is granted during the delay: not to a try, not past the queue.
    h.try_fails(c, "x", X);
    h.queue(d, "x", SH);

    // An EndLockDelay for another delay (wrong `since`) is ignored.
    for wrong in [since - 1, since + 1, 0] {
        assert_eq!(
            h.no_op(end_delay("x", wrong)),
            Reply::DelayEnded { ended: false }
        );
    }
    assert!(h.table.describe(&name("x")).unwrap().lock_delayed);

    // The right one ends it and grants the queue.
    let r = h.apply(end_delay("x", since));
    assert_eq!(r.reply, Reply::DelayEnded { ended: true });
    let fb = h.table.last_fence();
    assert_eq!(
        r.events,
        vec![
            Event::LockDelayEnded { name: name("x") },
            Event::Granted {
                name: name("x"),
                session: b,
                seq: bseq,
                fence: fb,
                mode: X
            },
        ]
    );
    assert_eq!(waiters(&h.table, "x"), vec![(d, SH)]);
    assert_eq!(h.table.delays().count(), 0);
    assert_eq!(
        h.no_op(end_delay("x", since)),
        Reply::DelayEnded { ended: false }
    );

    h.released(b, "x", fb);
    assert_eq!(holders(&h.table, "x"), vec![(d, SH)]);
}

#[test]
fn lock_delay_keeps_an_otherwise_idle_name_until_it_ends() {
    let mut h = Harness::new();
    let a = h.open_with(10_000, 1);
    let b = h.open();
    h.grant(a, "y", sem(2, 3));
    h.apply(Command::ExpireSession { session: a });
    let since = h.index;
    let info = h.table.describe(&name("y")).unwrap();
    assert!(info.lock_delayed && info.holders.is_empty() && info.waiters.is_empty());
    // The semaphore still exists (its capacity is still fixed) but grants nothing.
    let seq = h.next_seq();
    assert!(matches!(
        h.refuse(acq(b, seq, "y", sem(1, 4), TRY)),
        Refusal::CapacityMismatch {
            existing: 3,
            requested: 4,
            ..
        }
    ));
    h.try_fails(b, "y", sem(1, 3));
    let r = h.apply(end_delay("y", since));
    assert_eq!(r.events, vec![Event::LockDelayEnded { name: name("y") }]);
    assert_eq!(h.table.describe(&name("y")), None);
    assert_eq!(h.table.stats().names, 0);
    // Ending a delay on a name that has none is a no-op.
    assert_eq!(
        h.no_op(end_delay("y", since)),
        Reply::DelayEnded { ended: false }
    );
    h.grant(b, "z", X);
    assert_eq!(
        h.no_op(end_delay("z", since)),
        Reply::DelayEnded { ended: false }
    );
}

#[test]
fn lock_delay_blocks_even_requests_compatible_with_the_remaining_holders() {
    let mut h = Harness::new();
    let a = h.open_with(10_000, 2_000);
    let b = h.open();
    let c = h.open();
    h.grant(a, "x", SH);
    let fb = h.grant(b, "x", SH);
    h.apply(Command::ExpireSession { session: a });
    let since = h.index;
    assert_eq!(holders(&h.table, "x"), vec![(b, SH)]);
    h.try_fails(c, "x", SH);
    let cseq = h.queue(c, "x", SH);
    // The last holder leaving does not end the delay.
    h.released(b, "x", fb);
    assert!(h.table.describe(&name("x")).unwrap().lock_delayed);
    assert_eq!(waiters(&h.table, "x"), vec![(c, SH)]);
    let r = h.apply(end_delay("x", since));
    let fc = h.table.last_fence();
    assert_eq!(
        r.events,
        vec![
            Event::LockDelayEnded { name: name("x") },
            Event::Granted {
                name: name("x"),
                session: c,
                seq: cseq,
                fence: fc,
                mode: SH
            },
        ]
    );
}

#[test]
fn a_shorter_lock_delay_does_not_cut_a_longer_one_short() {
    // Two shared holders with different lock-delays expire one after the
    // other. Only one delay per name is kept, so the one in force must be
    // at least as long as what is left of each: the leader's timer for the
    // second delay must not end the first one early.
    let mut h = Harness::new();
    let long = h.open_with(10_000, MAX_LOCK_DELAY_MS);
    let short = h.open_with(10_000, 1);
    h.grant(long, "x", SH);
    h.grant(short, "x", SH);
    h.apply(Command::ExpireSession { session: long });
    let r = h.apply(Command::ExpireSession { session: short });
    let since = h.index;
    let started: Vec<_> = r
        .events
        .iter()
        .filter_map(|e| match e {
            Event::LockDelayStarted {
                delay_ms, since, ..
            } => Some((*delay_ms, *since)),
            _ => None,
        })
        .collect();
    assert_eq!(started, vec![(MAX_LOCK_DELAY_MS, since)]);
    let delays: Vec<_> = h
        .table
        .delays()
        .map(|(n, s, d)| (n.clone(), s, d))
        .collect();
    assert_eq!(delays, vec![(name("x"), since, MAX_LOCK_DELAY_MS)]);
}

#[test]
fn expiry_without_lock_delay_or_by_close_starts_no_delay() {
    let mut h = Harness::new();
    let zero = h.open_with(10_000, 0);
    let delayed = h.open_with(10_000, 1_000);
    let b = h.open();
    h.grant(zero, "x", X);
    h.grant(delayed, "y", X);
    let r = h.apply(Command::ExpireSession { session: zero });
    assert!(!r
        .events
        .iter()
        .any(|e| matches!(e, Event::LockDelayStarted { .. })));
    assert_eq!(h.table.describe(&name("x")), None);
    let r = h.close(delayed);
    assert!(!r
        .events
        .iter()
        .any(|e| matches!(e, Event::LockDelayStarted { .. })));
    assert_eq!(h.table.describe(&name("y")), None);
    h.grant(b, "x", X);
    h.grant(b, "y", X);
}

// ---------------------------------------------------- exclusive and shared

#[test]
fn exclusive_excludes_every_other_holder() {
    let mut h = Harness::new();
    let a = h.open();
    let b = h.open();
    h.grant(a, "x", X);
    h.try_fails(b, "x", X);
    h.try_fails(b, "x", SH);
    assert_eq!(holders(&h.table, "x"), vec![(a, X)]);
    // And an exclusive request waits for shared holders.
    h.grant(a, "y", SH);
    h.try_fails(b, "y", X);
    assert_eq!(holders(&h.table, "y"), vec![(a, SH)]);
}

#[test]
fn shared_holders_coexist() {
    let mut h = Harness::new();
    let s: Vec<_> = (0..4).map(|_| h.open()).collect();
    for &session in &s[..3] {
        h.grant(session, "x", SH);
    }
    assert_eq!(
        holders(&h.table, "x"),
        vec![(s[0], SH), (s[1], SH), (s[2], SH)]
    );
    h.try_fails(s[3], "x", X);
}

#[test]
fn queue_is_fifo() {
    let mut h = Harness::new();
    let a = h.open();
    let q: Vec<_> = (0..3).map(|_| h.open()).collect();
    let mut fence = h.grant(a, "x", X);
    let mut holder = a;
    let seqs: Vec<_> = q.iter().map(|&s| h.queue(s, "x", X)).collect();
    for (i, &next) in q.iter().enumerate() {
        let r = h.released(holder, "x", fence);
        let new_fence = h.table.last_fence();
        assert_eq!(grants(&r), vec![(next, "x".to_string(), new_fence)]);
        assert!(r.events.contains(&Event::Granted {
            name: name("x"),
            session: next,
            seq: seqs[i],
            fence: new_fence,
            mode: X
        }));
        let rest: Vec<_> = q[i + 1..].iter().map(|&s| (s, X)).collect();
        assert_eq!(waiters(&h.table, "x"), rest);
        holder = next;
        fence = new_fence;
    }
    h.released(holder, "x", fence);
    assert_eq!(h.table.describe(&name("x")), None);
}

#[test]
fn no_barging_past_a_queued_request() {
    let mut h = Harness::new();
    let a = h.open();
    let b = h.open();
    let c = h.open();
    let d = h.open();
    let fa = h.grant(a, "x", SH);
    h.queue(b, "x", X);
    // c's shared request is compatible with the shared holder, but waits
    // behind b; a try fails rather than jumping the queue.
    h.queue(c, "x", SH);
    h.try_fails(d, "x", SH);
    assert_eq!(waiters(&h.table, "x"), vec![(b, X), (c, SH)]);
    let r = h.released(a, "x", fa);
    let fb = h.table.last_fence();
    assert_eq!(grants(&r), vec![(b, "x".to_string(), fb)]);
    let r = h.released(b, "x", fb);
    assert_eq!(grants(&r), vec![(c, "x".to_string(), h.table.last_fence())]);
}

#[test]
fn consecutive_shared_waiters_at_the_head_are_granted_together() {
    let mut h = Harness::new();
    let a = h.open();
    let [b, c, d, e, f] = [(); 5].map(|_| h.open());
    let fa = h.grant(a, "x", X);
    let bseq = h.queue(b, "x", SH);
    let cseq = h.queue(c, "x", SH);
    h.queue(d, "x", X);
    h.queue(e, "x", SH);
    h.queue(f, "x", SH);
    let r = h.released(a, "x", fa);
    let last = h.table.last_fence().0;
    assert_eq!(
        r.events[1..],
        [
            Event::Granted {
                name: name("x"),
                session: b,
                seq: bseq,
                fence: Fence(last - 1),
                mode: SH
            },
            Event::Granted {
                name: name("x"),
                session: c,
                seq: cseq,
                fence: Fence(last),
                mode: SH
            },
        ]
    );
    assert_eq!(holders(&h.table, "x"), vec![(b, SH), (c, SH)]);
    assert_eq!(waiters(&h.table, "x"), vec![(d, X), (e, SH), (f, SH)]);
    // d is not granted until both shared holders left; then e and f
    // together after d.
    let r = h.released(b, "x", Fence(last - 1));
    assert!(grants(&r).is_empty());
    let r = h.released(c, "x", Fence(last));
    assert_eq!(grants(&r), vec![(d, "x".to_string(), Fence(last + 1))]);
    let r = h.released(d, "x", Fence(last + 1));
    assert_eq!(
        grants(&r),
        vec![
            (e, "x".to_string(), Fence(last + 2)),
            (f, "x".to_string(), Fence(last + 3))
        ]
    );
}

#[test]
fn a_try_never_queues() {
    let mut h = Harness::new();
    let a = h.open();
    let b = h.open();
    // On a free name a try is granted like any acquire.
    let r = h.acquire(a, "x", X, TRY);
    let fa = fence_of(&r);
    // On a busy name it fails at once and leaves no waiter.
    h.try_fails(b, "x", X);
    assert!(h.table.describe(&name("x")).unwrap().waiters.is_empty());
    assert_eq!(h.table.waits().count(), 0);
    assert_eq!(h.table.stats().waiters, 0);
    // ... including on a semaphore, and once the name frees, it does not
    // come back as a grant.
    h.grant(a, "s", sem(2, 2));
    h.try_fails(b, "s", sem(1, 2));
    let r = h.released(a, "x", fa);
    assert!(grants(&r).is_empty());
    assert_eq!(h.table.describe(&name("x")), None);
}

// -------------------------------------------------------------- semaphores

#[test]
fn semaphore_grants_up_to_capacity() {
    let mut h = Harness::new();
    let [a, b, c] = [(); 3].map(|_| h.open());
    h.grant(a, "s", sem(2, 3));
    h.grant(b, "s", sem(1, 3));
    h.try_fails(c, "s", sem(1, 3));
    let info = h.table.describe(&name("s")).unwrap();
    assert_eq!(info.capacity, Some(3));
    assert_eq!(holders(&h.table, "s"), vec![(a, sem(2, 3)), (b, sem(1, 3))]);
}

#[test]
fn semaphore_capacity_mismatch_is_refused() {
    let mut h = Harness::new();
    let a = h.open();
    let b = h.open();
    h.grant(a, "s", sem(1, 3));
    for (cap, weight) in [(4, 1), (2, 1), (1, 1)] {
        let seq = h.next_seq();
        assert_eq!(
            h.refuse(acq(b, seq, "s", sem(weight, cap), WAIT)),
            Refusal::CapacityMismatch {
                name: name("s"),
                existing: 3,
                requested: cap
            }
        );
    }
}

#[test]
fn locks_and_semaphores_do_not_mix() {
    let mut h = Harness::new();
    let a = h.open();
    let b = h.open();
    h.grant(a, "l", X);
    h.grant(a, "s", sem(1, 2));
    let seq = h.next_seq();
    assert_eq!(
        h.refuse(acq(b, seq, "l", sem(1, 2), WAIT)),
        Refusal::KindMismatch {
            name: name("l"),
            existing: "lock".into(),
            requested: "semaphore".into()
        }
    );
    for mode in [X, SH] {
        let seq = h.next_seq();
        assert_eq!(
            h.refuse(acq(b, seq, "s", mode, TRY)),
            Refusal::KindMismatch {
                name: name("s"),
                existing: "semaphore".into(),
                requested: "lock".into()
            }
        );
    }
}

#[test]
fn semaphore_weight_must_be_one_to_capacity() {
    let mut h = Harness::new();
    let a = h.open();
    for (weight, capacity) in [(0, 3), (4, 3), (2, 1), (u32::MAX, 3)] {
        let seq = h.next_seq();
        assert_eq!(
            h.refuse(acq(a, seq, "s", sem(weight, capacity), WAIT)),
            Refusal::InvalidWeight { weight, capacity }
        );
    }
    h.grant(a, "s", sem(3, 3));
    h.grant(a, "t", sem(1, 1));
}

#[test]
fn semaphore_head_of_line_blocking() {
    let mut h = Harness::new();
    let [a, b, c, d, e] = [(); 5].map(|_| h.open());
    let fa = h.grant(a, "s", sem(2, 4));
    let fe = h.grant(e, "s", sem(1, 4));
    // b's three permits do not fit; c's one would, but it queues behind b
    // so that heavy requests are not starved.
    let bseq = h.queue(b, "s", sem(3, 4));
    let cseq = h.queue(c, "s", sem(1, 4));
    h.try_fails(d, "s", sem(1, 4));
    // e leaving makes room for c but not for b: still nothing is granted.
    let r = h.released(e, "s", fe);
    assert_eq!(grants(&r), vec![]);
    assert_eq!(waiters(&h.table, "s"), vec![(b, sem(3, 4)), (c, sem(1, 4))]);
    let r = h.released(a, "s", fa);
    let last = h.table.last_fence().0;
    assert_eq!(
        r.events[1..],
        [
            Event::Granted {
                name: name("s"),
                session: b,
                seq: bseq,
                fence: Fence(last - 1),
                mode: sem(3, 4)
            },
            Event::Granted {
                name: name("s"),
                session: c,
                seq: cseq,
                fence: Fence(last),
                mode: sem(1, 4)
            },
        ]
    );
    h.try_fails(d, "s", sem(1, 4));
}

#[test]
fn semaphore_capacity_is_fixed_only_while_it_exists() {
    let mut h = Harness::new();
    let a = h.open();
    let f = h.grant(a, "s", sem(1, 3));
    h.released(a, "s", f);
    assert_eq!(h.table.describe(&name("s")), None);
    let f = h.grant(a, "s", sem(5, 5));
    h.released(a, "s", f);
    h.grant(a, "s", X);
}

// ------------------------------------------------------------------ fences

#[test]
fn every_grant_gets_a_larger_fence_cluster_wide() {
    let mut h = Harness::new();
    let [a, b, c] = [(); 3].map(|_| h.open());
    let fences = [
        h.grant(a, "x", X),
        h.grant(b, "y", SH),
        h.grant(c, "y", SH),
        h.grant(a, "s", sem(1, 2)),
        h.grant(b, "s", sem(1, 2)),
        h.grant(c, "z", X),
    ];
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    assert_eq!(h.table.last_fence(), fences[5]);
    assert_eq!(h.table.stats().last_fence, fences[5].0);
    // A refused re-acquire of a held grant does not use up a fence.
    let seq = h.next_seq();
    h.refuse(acq(a, seq, "x", X, WAIT));
    assert_eq!(h.table.last_fence(), fences[5]);
    // Fences never go back, even once everything is released.
    h.close(a);
    h.close(b);
    h.close(c);
    let d = h.open();
    assert_eq!(h.grant(d, "x", X), Fence(fences[5].0 + 1));
}

#[test]
fn hand_off_gives_a_larger_fence() {
    let mut h = Harness::new();
    let [a, b, c] = [(); 3].map(|_| h.open());
    let fa = h.grant(a, "x", X);
    h.queue(b, "x", X);
    let fc = h.grant(c, "y", X);
    let r = h.released(a, "x", fa);
    let [(who, _, fb)] = grants(&r).try_into().unwrap();
    assert_eq!(who, b);
    assert!(fb > fc && fc > fa);
    assert_eq!(h.table.check_fence(&name("x"), fb), (true, Some(fb)));
    assert_eq!(h.table.check_fence(&name("x"), fa), (false, Some(fb)));
}

// ----------------------------------------------------------------- release

#[test]
fn release_ends_the_grant() {
    let mut h = Harness::new();
    let a = h.open();
    let fa = h.grant(a, "x", SH);
    let r = h.release(a, "x", fa);
    assert_eq!(r.reply, Reply::Released { released: true });
    assert_eq!(
        r.events,
        vec![Event::Ended {
            name: name("x"),
            session: a,
            fence: fa,
            mode: SH,
            cause: EndCause::Released
        }]
    );
    assert_eq!(h.table.describe(&name("x")), None);
}

#[test]
fn release_is_owner_checked() {
    let mut h = Harness::new();
    let a = h.open();
    let b = h.open();
    let fa = h.grant(a, "x", X);
    h.grant(b, "y", X);
    let locks = h.table.locks.clone();
    let r = h.release(b, "x", fa);
    assert_eq!(r.reply, Reply::Released { released: false });
    assert!(r.events.is_empty());
    assert_eq!(h.table.locks, locks);
    assert_eq!(holders(&h.table, "x"), vec![(a, X)]);
    assert_eq!(h.table.check_fence(&name("x"), fa), (true, Some(fa)));
}

#[test]
fn release_with_a_wrong_fence_releases_nothing() {
    let mut h = Harness::new();
    let a = h.open();
    let fa = h.grant(a, "x", X);
    let fy = h.grant(a, "y", X);
    let locks = h.table.locks.clone();
    // Another grant's fence, an unused one, an old one.
    for wrong in [fy, Fence(fa.0 + 100), Fence(0)] {
        let r = h.release(a, "x", wrong);
        assert_eq!(r.reply, Reply::Released { released: false });
        assert!(r.events.is_empty());
    }
    assert_eq!(h.table.locks, locks);
}

#[test]
fn double_release_releases_once() {
    let mut h = Harness::new();
    let a = h.open();
    let b = h.open();
    let fa = h.grant(a, "x", X);
    h.released(a, "x", fa);
    let fb = h.grant(b, "x", X);
    let locks = h.table.locks.clone();
    let r = h.release(a, "x", fa);
    assert_eq!(r.reply, Reply::Released { released: false });
    assert!(r.events.is_empty());
    assert_eq!(h.table.locks, locks);
    assert_eq!(h.table.check_fence(&name("x"), fb), (true, Some(fb)));
}

#[test]
fn release_of_an_unknown_name_releases_nothing() {
    let mut h = Harness::new();
    let a = h.open();
    let fa = h.grant(a, "x", X);
    let r = h.release(a, "nope", fa);
    assert_eq!(r.reply, Reply::Released { released: false });
    assert!(r.events.is_empty());
    assert_eq!(h.table.describe(&name("nope")), None);
    assert_eq!(holders(&h.table, "x"), vec![(a, X)]);
}

// -------------------------------------------------------------- re-acquire

#[test]
fn reacquire_in_the_same_mode_is_refused_naming_the_grant() {
    // Review finding 4: answering a new acquire with the grant the session
    // already holds gave two callers one grant.
    let mut h = Harness::new();
    let a = h.open();
    let fx = h.grant(a, "x", X);
    let x_seq = h.seq;
    let fs = h.grant(a, "s", sem(2, 3));
    let locks = h.table.locks.clone();
    for timeout in [TRY, WAIT] {
        let seq = h.next_seq();
        assert_eq!(
            h.refuse(acq(a, seq, "x", X, timeout)),
            Refusal::AlreadyHeld {
                session: a,
                name: name("x"),
                fence: fx
            }
        );
        let seq = h.next_seq();
        assert_eq!(
            h.refuse(acq(a, seq, "s", sem(2, 3), timeout)),
            Refusal::AlreadyHeld {
                session: a,
                name: name("s"),
                fence: fs
            }
        );
    }
    // The acquire that made the grant, retried, is still answered with it.
    assert!(matches!(
        h.no_op(acq(a, x_seq, "x", X, WAIT)),
        Reply::Acquire(Acquired::Granted { fence, .. }) if fence == fx
    ));
    assert_eq!(h.table.locks, locks);
}

#[test]
fn reacquire_in_another_mode_is_refused() {
    let mut h = Harness::new();
    let a = h.open();
    h.grant(a, "x", X);
    h.grant(a, "y", SH);
    h.grant(a, "s", sem(2, 3));
    for (n, mode) in [("x", SH), ("y", X), ("s", sem(1, 3)), ("s", sem(3, 3))] {
        let seq = h.next_seq();
        assert_eq!(
            h.refuse(acq(a, seq, n, mode, WAIT)),
            Refusal::OtherMode {
                session: a,
                name: name(n)
            },
            "{n} in {mode:?}"
        );
    }
}

#[test]
fn reacquire_while_queued_is_refused_naming_the_wait() {
    let mut h = Harness::new();
    let a = h.open();
    let b = h.open();
    h.grant(a, "x", X);
    h.queue(b, "x", SH);
    let wait_seq = h.seq;
    let locks = h.table.locks.clone();
    let seq = h.next_seq();
    assert_eq!(
        h.refuse(acq(b, seq, "x", SH, WAIT)),
        Refusal::AlreadyWaiting {
            session: b,
            name: name("x"),
            seq: wait_seq
        }
    );
    assert_eq!(h.table.locks, locks);
    assert_eq!(waiters(&h.table, "x"), vec![(b, SH)]);
    // The waiting acquire itself, retried, keeps its place.
    assert_eq!(
        h.no_op(acq(b, wait_seq, "x", SH, WAIT)),
        Reply::Acquire(Acquired::Queued)
    );
    let seq = h.next_seq();
    assert_eq!(
        h.refuse(acq(b, seq, "x", X, WAIT)),
        Refusal::OtherMode {
            session: b,
            name: name("x")
        }
    );
}

// ---------------------------------------------------------------- deadlock

#[test]
fn two_session_deadlock_is_refused_with_its_cycle() {
    let mut h = Harness::new();
    let a = h.open();
    let b = h.open();
    h.grant(a, "x", X);
    h.grant(b, "y", X);
    h.queue(a, "y", X);
    let seq = h.next_seq();
    assert_eq!(
        h.refuse(acq(b, seq, "x", X, WAIT)),
        Refusal::Deadlock {
            cycle: vec![
                WaitEdge {
                    session: b,
                    name: name("x"),
                    blocker: a
                },
                WaitEdge {
                    session: a,
                    name: name("y"),
                    blocker: b
                },
            ]
        }
    );
    // A shared request conflicts with a's exclusive hold just the same.
    let seq = h.next_seq();
    assert!(matches!(
        h.refuse(acq(b, seq, "x", SH, WAIT)),
        Refusal::Deadlock { .. }
    ));
    // A try never waits, so it cannot deadlock: it just fails.
    h.try_fails(b, "x", X);
}

#[test]
fn three_session_deadlock_is_refused() {
    let mut h = Harness::new();
    let [a, b, c] = [(); 3].map(|_| h.open());
    h.grant(a, "p", X);
    h.grant(b, "q", X);
    h.grant(c, "r", X);
    h.queue(a, "q", X);
    h.queue(b, "r", X);
    let seq = h.next_seq();
    assert_eq!(
        h.refuse(acq(c, seq, "p", X, WAIT)),
        Refusal::Deadlock {
            cycle: vec![
                WaitEdge {
                    session: c,
                    name: name("p"),
                    blocker: a
                },
                WaitEdge {
                    session: a,
                    name: name("q"),
                    blocker: b
                },
                WaitEdge {
                    session: b,
                    name: name("r"),
                    blocker: c
                },
            ]
        }
    );
}

#[test]
fn deadlock_through_a_waiter_queued_ahead_is_refused() {
    // b and c both wait for p (b first); c holds r. b asking for r would
    // wait for c, and c cannot get p before b does: a cycle through the
    // queue, not through a holder.
    let mut h = Harness::new();
    let [a, b, c] = [(); 3].map(|_| h.open());
    h.grant(a, "p", X);
    h.grant(c, "r", X);
    h.queue(b, "p", X);
    h.queue(c, "p", X);
    let seq = h.next_seq();
    assert_eq!(
        h.refuse(acq(b, seq, "r", X, WAIT)),
        Refusal::Deadlock {
            cycle: vec![
                WaitEdge {
                    session: b,
                    name: name("r"),
                    blocker: c
                },
                WaitEdge {
                    session: c,
                    name: name("p"),
                    blocker: b
                },
            ]
        }
    );
}

#[test]
fn a_chain_of_waits_without_a_cycle_is_not_refused() {
    let mut h = Harness::new();
    let [a, b, c, d, e] = [(); 5].map(|_| h.open());
    h.grant(a, "p", X);
    h.grant(b, "q", X);
    h.grant(c, "r", X);
    h.grant(d, "t", X);
    // a waits on b, b on c, c on d; d waits on nothing.
    h.queue(a, "q", X);
    h.queue(b, "r", X);
    h.queue(c, "t", X);
    h.queue(e, "q", X);
    h.grant(c, "u", X);
    h.grant(d, "v", X);
    assert_eq!(h.table.stats().waiters, 4);
}

#[test]
fn shared_holders_that_do_not_conflict_are_not_a_deadlock() {
    let mut h = Harness::new();
    let a = h.open();
    let d = h.open_with(10_000, 1_000);
    let b = h.open();
    h.grant(a, "x", SH);
    h.grant(d, "x", SH);
    h.grant(b, "y", X);
    h.queue(a, "y", X);
    // d expires: x is in lock-delay, a still holds it shared.
    h.apply(Command::ExpireSession { session: d });
    let since = h.index;
    // b asking for x exclusively would wait for a, which waits for b.
    let seq = h.next_seq();
    assert_eq!(
        h.refuse(acq(b, seq, "x", X, WAIT)),
        Refusal::Deadlock {
            cycle: vec![
                WaitEdge {
                    session: b,
                    name: name("x"),
                    blocker: a
                },
                WaitEdge {
                    session: a,
                    name: name("y"),
                    blocker: b
                },
            ]
        }
    );
    // A shared request waits only for the delay: a's shared hold is no
    // obstacle, so there is no cycle.
    let bseq = h.queue(b, "x", SH);
    let r = h.apply(end_delay("x", since));
    assert_eq!(
        r.events[1..],
        [Event::Granted {
            name: name("x"),
            session: b,
            seq: bseq,
            fence: h.table.last_fence(),
            mode: SH
        }]
    );
    assert_eq!(holders(&h.table, "x"), vec![(a, SH), (b, SH)]);
}

#[test]
fn semaphore_room_left_for_the_waiter_is_not_a_deadlock() {
    let mut h = Harness::new();
    let [a, b, c] = [(); 3].map(|_| h.open());
    h.grant(a, "s", sem(1, 3));
    let fc = h.grant(c, "s", sem(2, 3));
    h.grant(b, "y", X);
    h.queue(a, "y", X);
    // Three permits need a's too, and a waits for b.
    let seq = h.next_seq();
    assert_eq!(
        h.refuse(acq(b, seq, "s", sem(3, 3), WAIT)),
        Refusal::Deadlock {
            cycle: vec![
                WaitEdge {
                    session: b,
                    name: name("s"),
                    blocker: a
                },
                WaitEdge {
                    session: a,
                    name: name("y"),
                    blocker: b
                },
            ]
        }
    );
    // Two permits fit beside a's one as soon as c (who waits for nothing)
    // releases: no deadlock.
    let bseq = h.queue(b, "s", sem(2, 3));
    let r = h.released(c, "s", fc);
    assert!(r.events.contains(&Event::Granted {
        name: name("s"),
        session: b,
        seq: bseq,
        fence: h.table.last_fence(),
        mode: sem(2, 3)
    }));
}

/// Queues `session` for `n` straight into a copy of `h`'s table, without
/// the deadlock check `apply` makes, and says whether the invariant checker
/// (which also guards snapshot restores) then reports a wait-for cycle.
fn cycle_if_queued(h: &Harness, session: SessionId, n: &str, mode: Mode) -> bool {
    let mut t = h.table.clone();
    let index = h.index + 1;
    let lock = t.locks.get_mut(&name(n)).expect("a busy name");
    lock.queue.push_back(Waiter {
        session,
        seq: index,
        mode,
        value: Vec::new(),
        timeout_ms: WAIT,
        index,
    });
    let waits = &mut t.sessions.get_mut(&session).unwrap().waiting;
    waits.insert(name(n), WaitRef { seq: index, index });
    match t.check_invariants() {
        Ok(()) => false,
        Err(e) => {
            assert!(e.contains("cycle"), "{e}");
            assert!(LockTable::from_snapshot(&t.to_snapshot()).is_err());
            true
        }
    }
}

#[test]
fn invariant_checker_finds_wait_for_cycles() {
    // Through holders: a waits for b's y, b would wait for a's x.
    let mut h = Harness::new();
    let [a, b, c] = [(); 3].map(|_| h.open());
    h.grant(a, "x", X);
    h.grant(b, "y", X);
    h.queue(a, "y", X);
    assert!(cycle_if_queued(&h, b, "x", X));
    assert!(cycle_if_queued(&h, b, "x", SH));
    assert!(!cycle_if_queued(&h, c, "x", X));

    // Through a waiter queued ahead: b and c wait for p (b first), c holds r.
    let mut h = Harness::new();
    let [a, b, c, d, e] = [(); 5].map(|_| h.open());
    h.grant(a, "p", X);
    h.grant(c, "r", X);
    h.queue(b, "p", X);
    h.queue(d, "p", SH);
    h.queue(c, "p", SH);
    assert!(cycle_if_queued(&h, b, "r", X));
    assert!(cycle_if_queued(&h, d, "r", X));
    // a holds p, which c waits for: a real cycle too. e is in no one's way.
    assert!(cycle_if_queued(&h, a, "r", X));
    assert!(!cycle_if_queued(&h, e, "r", X));

    // Three sessions round.
    let mut h = Harness::new();
    let [a, b, c] = [(); 3].map(|_| h.open());
    h.grant(a, "p", X);
    h.grant(b, "q", X);
    h.grant(c, "r", X);
    h.queue(a, "q", X);
    h.queue(b, "r", X);
    assert!(cycle_if_queued(&h, c, "p", X));

    // Shared holders only block exclusive waiters, or shared ones queued
    // behind an exclusive one.
    let mut h = Harness::new();
    let [a, b, c, d] = [(); 4].map(|_| h.open_with(10_000, 1_000));
    h.grant(a, "x", SH);
    h.grant(d, "x", SH);
    h.grant(b, "y", X);
    h.queue(a, "y", X);
    h.apply(Command::ExpireSession { session: d });
    assert!(!cycle_if_queued(&h, b, "x", SH));
    assert!(cycle_if_queued(&h, b, "x", X));
    h.queue(c, "x", X);
    assert!(cycle_if_queued(&h, b, "x", SH));

    // Semaphores: a holder blocks a waiter only if the waiter cannot fit
    // even once every other holder has left.
    let mut h = Harness::new();
    let [a, b, c] = [(); 3].map(|_| h.open());
    h.grant(a, "s", sem(1, 3));
    h.grant(c, "s", sem(2, 3));
    h.grant(b, "y", X);
    h.queue(a, "y", X);
    assert!(!cycle_if_queued(&h, b, "s", sem(2, 3)));
    assert!(cycle_if_queued(&h, b, "s", sem(3, 3)));
}

// ----------------------------------------------------------- exactly-once

#[test]
fn repeated_acquire_returns_the_first_reply_and_changes_nothing() {
    let mut h = Harness::new();
    let a = h.open();
    let b = h.open();
    let cmd = acq(a, 100, "x", X, WAIT);
    let first = h.apply(cmd.clone());
    let fa = fence_of(&first);
    assert_eq!(h.no_op(cmd.clone()), first.reply);
    // Still the first reply after the grant ended and another took over.
    h.released(a, "x", fa);
    h.grant(b, "x", X);
    assert_eq!(h.no_op(cmd), first.reply);
    assert_eq!(holders(&h.table, "x"), vec![(b, X)]);
}

#[test]
fn repeated_try_stays_not_acquired_after_the_name_frees() {
    let mut h = Harness::new();
    let a = h.open();
    let b = h.open();
    let fa = h.grant(a, "x", X);
    let cmd = acq(b, 100, "x", X, TRY);
    assert_eq!(
        h.apply(cmd.clone()).reply,
        Reply::Acquire(Acquired::NotAcquired)
    );
    h.released(a, "x", fa);
    assert_eq!(h.no_op(cmd), Reply::Acquire(Acquired::NotAcquired));
    assert_eq!(h.table.describe(&name("x")), None);
}

#[test]
fn repeated_release_returns_the_first_reply_and_changes_nothing() {
    let mut h = Harness::new();
    let a = h.open();
    let b = h.open();
    let fa = h.grant(a, "x", X);
    h.queue(b, "x", X);
    let cmd = rel(a, 100, "x", fa);
    let r = h.apply(cmd.clone());
    assert_eq!(r.reply, Reply::Released { released: true });
    assert_eq!(grants(&r).len(), 1);
    assert_eq!(h.no_op(cmd), Reply::Released { released: true });
    assert_eq!(holders(&h.table, "x"), vec![(b, X)]);
    // A release that released nothing stays that way.
    let cmd = rel(b, 101, "x", fa);
    assert_eq!(
        h.apply(cmd.clone()).reply,
        Reply::Released { released: false }
    );
    assert_eq!(h.no_op(cmd), Reply::Released { released: false });
    assert_eq!(holders(&h.table, "x"), vec![(b, X)]);
}

#[test]
fn retried_queued_acquire_answers_where_it_stands() {
    let mut h = Harness::new();
    let a = h.open();
    let b = h.open();
    let fa = h.grant(a, "x", X);
    let cmd = acq(b, 100, "x", X, WAIT);
    assert_eq!(h.apply(cmd.clone()).reply, Reply::Acquire(Acquired::Queued));
    // Still queued: Queued, and its place is kept.
    assert_eq!(h.no_op(cmd.clone()), Reply::Acquire(Acquired::Queued));
    assert_eq!(waiters(&h.table, "x"), vec![(b, X)]);
    // Granted since: the grant, with its fence and index.
    let r = h.released(a, "x", fa);
    let [(_, _, fb)] = grants(&r).try_into().unwrap();
    let grant = granted_reply(fb, X, h.index);
    assert_eq!(h.no_op(cmd.clone()), grant);
    // That stays the answer after the grant ended.
    h.released(b, "x", fb);
    assert_eq!(h.no_op(cmd), grant);
}

#[test]
fn retried_cancelled_acquire_is_not_acquired_and_does_not_queue_again() {
    let mut h = Harness::new();
    let a = h.open();
    let b = h.open();
    let fa = h.grant(a, "x", X);
    let cmd = acq(b, 100, "x", X, WAIT);
    h.apply(cmd.clone());
    h.apply(cancel(b, "x", 100));
    assert_eq!(h.no_op(cmd.clone()), Reply::Acquire(Acquired::NotAcquired));
    assert_eq!(waiters(&h.table, "x"), vec![]);
    h.released(a, "x", fa);
    assert_eq!(h.no_op(cmd), Reply::Acquire(Acquired::NotAcquired));
    assert_eq!(h.table.describe(&name("x")), None);
}

#[test]
fn replies_are_remembered_for_max_remembered_replies_sequence_numbers() {
    let mut h = Harness::new();
    let a = h.open();
    let first = h.apply(acq(a, 1, "x", X, WAIT));
    let fa = fence_of(&first);
    let window = MAX_REMEMBERED_REPLIES as u64;
    let second = h.apply(acq(a, 2, "y", X, WAIT));
    for seq in 3..=window {
        h.apply(rel(a, seq, "nothing-held", Fence(1)));
    }
    // Exactly MAX_REMEMBERED_REPLIES remembered: the oldest still replays.
    assert_eq!(h.no_op(acq(a, 1, "x", X, WAIT)), first.reply);
    // One more and it is forgotten; retrying it is refused, not re-applied.
    h.apply(rel(a, window + 1, "nothing-held", Fence(1)));
    assert_eq!(
        h.refuse(acq(a, 1, "x", X, WAIT)),
        Refusal::SequenceTooOld {
            session: a,
            seq: 1,
            floor: 1
        }
    );
    assert_eq!(
        h.refuse(rel(a, 1, "x", fa)),
        Refusal::SequenceTooOld {
            session: a,
            seq: 1,
            floor: 1
        }
    );
    assert_eq!(
        h.refuse(rel(a, 0, "x", fa)),
        Refusal::SequenceTooOld {
            session: a,
            seq: 0,
            floor: 1
        }
    );
    assert_eq!(h.no_op(acq(a, 2, "y", X, WAIT)), second.reply);
    assert_eq!(holders(&h.table, "x"), vec![(a, X)]);
}

#[test]
fn refusals_are_not_remembered() {
    let mut h = Harness::new();
    let a = h.open();
    let fa = h.grant(a, "x", X);
    assert_eq!(
        h.refuse(acq(a, 100, "x", SH, WAIT)),
        Refusal::OtherMode {
            session: a,
            name: name("x")
        }
    );
    h.released(a, "x", fa);
    // The retry is a fresh attempt, which now succeeds.
    let r = h.apply(acq(a, 100, "x", SH, WAIT));
    assert_eq!(grants(&r), vec![(a, "x".to_string(), fence_of(&r))]);
}

// -------------------------------------------------------------- CancelWait

#[test]
fn cancel_wait_cancels_only_the_matching_seq() {
    let mut h = Harness::new();
    let a = h.open();
    let b = h.open();
    h.grant(a, "x", X);
    let bseq = h.queue(b, "x", X);
    for wrong in [
        cancel(b, "x", bseq + 1),
        cancel(b, "x", bseq - 1),
        cancel(b, "y", bseq),
        cancel(a, "x", bseq),
    ] {
        assert_eq!(h.no_op(wrong), Reply::Cancelled { cancelled: false });
    }
    let r = h.apply(cancel(b, "x", bseq));
    assert_eq!(r.reply, Reply::Cancelled { cancelled: true });
    assert_eq!(
        r.events,
        vec![Event::Cancelled {
            name: name("x"),
            session: b,
            seq: bseq,
            mode: X,
            cause: CancelCause::TimedOut
        }]
    );
    assert_eq!(waiters(&h.table, "x"), vec![]);
    assert_eq!(
        h.no_op(cancel(b, "x", bseq)),
        Reply::Cancelled { cancelled: false }
    );

    // A timer for an old wait leaves the session's newer wait alone.
    let newer = h.queue(b, "x", X);
    assert_eq!(
        h.no_op(cancel(b, "x", bseq)),
        Reply::Cancelled { cancelled: false }
    );
    assert_eq!(waiters(&h.table, "x"), vec![(b, X)]);
    let r = h.apply(cancel(b, "x", newer));
    assert_eq!(r.reply, Reply::Cancelled { cancelled: true });
}

#[test]
fn cancelling_the_head_grants_compatible_waiters_behind_it() {
    let mut h = Harness::new();
    let [a, b, c, d, e] = [(); 5].map(|_| h.open());
    h.grant(a, "x", SH);
    let bseq = h.queue(b, "x", X);
    let cseq = h.queue(c, "x", SH);
    let dseq = h.queue(d, "x", SH);
    h.queue(e, "x", X);
    let r = h.apply(cancel(b, "x", bseq));
    let last = h.table.last_fence().0;
    assert_eq!(
        r.events,
        vec![
            Event::Cancelled {
                name: name("x"),
                session: b,
                seq: bseq,
                mode: X,
                cause: CancelCause::TimedOut
            },
            Event::Granted {
                name: name("x"),
                session: c,
                seq: cseq,
                fence: Fence(last - 1),
                mode: SH
            },
            Event::Granted {
                name: name("x"),
                session: d,
                seq: dseq,
                fence: Fence(last),
                mode: SH
            },
        ]
    );
    assert_eq!(holders(&h.table, "x"), vec![(a, SH), (c, SH), (d, SH)]);
    assert_eq!(waiters(&h.table, "x"), vec![(e, X)]);
}

#[test]
fn cancelling_a_heavy_semaphore_head_grants_lighter_waiters() {
    let mut h = Harness::new();
    let [a, b, c] = [(); 3].map(|_| h.open());
    h.grant(a, "s", sem(3, 4));
    let bseq = h.queue(b, "s", sem(3, 4));
    let cseq = h.queue(c, "s", sem(1, 4));
    let r = h.apply(cancel(b, "s", bseq));
    assert_eq!(grants(&r), vec![(c, "s".to_string(), h.table.last_fence())]);
    assert!(r.events.contains(&Event::Granted {
        name: name("s"),
        session: c,
        seq: cseq,
        fence: h.table.last_fence(),
        mode: sem(1, 4)
    }));
}

#[test]
fn cancelling_a_wait_that_was_granted_meanwhile_does_nothing() {
    let mut h = Harness::new();
    let a = h.open();
    let b = h.open();
    let fa = h.grant(a, "x", X);
    let bseq = h.queue(b, "x", X);
    h.released(a, "x", fa);
    assert_eq!(
        h.no_op(cancel(b, "x", bseq)),
        Reply::Cancelled { cancelled: false }
    );
    assert_eq!(holders(&h.table, "x"), vec![(b, X)]);
}

// ------------------------------------------------------------------ events

#[test]
fn events_carry_the_right_fields() {
    let mut t = LockTable::new();
    let r = t.apply(10, open_cmd(2_000, 700, 0));
    assert_eq!(
        r.events,
        vec![Event::SessionOpened {
            session: SessionId(10),
            ttl_ms: 2_000
        }]
    );
    let a = SessionId(10);
    t.apply(11, open_cmd(3_000, 0, 0));
    let b = SessionId(11);
    let r = t.apply(12, acq_value(a, 5, "x", X, WAIT, b"leader-a".to_vec()));
    assert_eq!(r.reply, granted_reply(Fence(1), X, 12));
    assert_eq!(
        r.events,
        vec![Event::Granted {
            name: name("x"),
            session: a,
            seq: 5,
            fence: Fence(1),
            mode: X
        }]
    );
    assert_eq!(r.events[0].name(), Some(&name("x")));
    let r = t.apply(13, acq(b, 6, "x", SH, 1_234));
    assert_eq!(
        r.events,
        vec![Event::Queued {
            name: name("x"),
            session: b,
            seq: 6,
            mode: SH,
            timeout_ms: 1_234
        }]
    );
    let r = t.apply(14, acq(b, 7, "y", X, WAIT_FOREVER));
    assert_eq!(r.reply, granted_reply(Fence(2), X, 14));
    let r = t.apply(15, Command::ExpireSession { session: a });
    assert_eq!(
        r.events,
        vec![
            Event::Ended {
                name: name("x"),
                session: a,
                fence: Fence(1),
                mode: X,
                cause: EndCause::SessionExpired
            },
            Event::LockDelayStarted {
                name: name("x"),
                delay_ms: 700,
                since: 15
            },
            Event::SessionEnded {
                session: a,
                expired: true
            },
        ]
    );
    assert_eq!(r.events[2].name(), None);
    let r = t.apply(16, end_delay("x", 15));
    assert_eq!(
        r.events,
        vec![
            Event::LockDelayEnded { name: name("x") },
            Event::Granted {
                name: name("x"),
                session: b,
                seq: 6,
                fence: Fence(3),
                mode: SH
            },
        ]
    );
    // The settled grant carries the index that made it.
    assert_eq!(
        t.apply(17, acq(b, 6, "x", SH, 1_234)).reply,
        granted_reply(Fence(3), SH, 16)
    );
    t.apply(18, open_cmd(2_000, 0, 0));
    let c = SessionId(18);
    let r = t.apply(19, acq(c, 1, "y", X, WAIT_FOREVER));
    assert_eq!(
        r.events,
        vec![Event::Queued {
            name: name("y"),
            session: c,
            seq: 1,
            mode: X,
            timeout_ms: WAIT_FOREVER
        }]
    );
    let r = t.apply(20, rel(b, 8, "y", Fence(2)));
    assert_eq!(
        r.events,
        vec![
            Event::Ended {
                name: name("y"),
                session: b,
                fence: Fence(2),
                mode: X,
                cause: EndCause::Released
            },
            Event::Granted {
                name: name("y"),
                session: c,
                seq: 1,
                fence: Fence(4),
                mode: X
            },
        ]
    );
    let r = t.apply(21, acq(c, 2, "x", X, 50));
    assert_eq!(r.reply, Reply::Acquire(Acquired::Queued));
    let r = t.apply(22, cancel(c, "x", 2));
    assert_eq!(
        r.events,
        vec![Event::Cancelled {
            name: name("x"),
            session: c,
            seq: 2,
            mode: X,
            cause: CancelCause::TimedOut
        }]
    );
    t.check_invariants().unwrap();
}

// ------------------------------------------------------------------ limits

#[test]
fn name_length_edges() {
    let mut h = Harness::new();
    let a = h.open();
    let longest = "n".repeat(MAX_NAME_LEN);
    let f = h.grant(a, &longest, X);
    assert!(h.table.describe(&name(&longest)).is_some());
    // Bytes count, not characters: 256 two-byte characters fit, 257 do not.
    let wide = "é".repeat(MAX_NAME_LEN / 2);
    assert_eq!(wide.len(), MAX_NAME_LEN);
    h.grant(a, &wide, X);

    let too_long = "n".repeat(MAX_NAME_LEN + 1);
    let too_wide = "é".repeat(MAX_NAME_LEN / 2 + 1);
    for (bad, len) in [
        (too_long.as_str(), MAX_NAME_LEN + 1),
        (too_wide.as_str(), MAX_NAME_LEN + 2),
        ("", 0),
    ] {
        assert_eq!(LockName::new(bad), Err(Refusal::InvalidName { len }));
        let invalid = Refusal::InvalidName { len };
        let seq = h.next_seq();
        assert_eq!(h.refuse(acq(a, seq, bad, X, WAIT)), invalid);
        let seq = h.next_seq();
        assert_eq!(h.refuse(rel(a, seq, bad, f)), invalid);
        assert_eq!(h.refuse(cancel(a, bad, 1)), invalid);
        assert_eq!(h.refuse(end_delay(bad, 1)), invalid);
    }
    assert_eq!(
        LockName::new("n".repeat(MAX_NAME_LEN)).unwrap().as_str(),
        longest
    );
    h.released(a, &longest, f);
}

#[test]
fn value_length_edges() {
    let mut h = Harness::new();
    let a = h.open();
    let seq = h.next_seq();
    let r = h.apply(acq_value(a, seq, "x", X, WAIT, vec![7; MAX_VALUE_LEN]));
    fence_of(&r);
    assert_eq!(
        h.table.describe(&name("x")).unwrap().holders[0].value,
        vec![7; MAX_VALUE_LEN]
    );
    let seq = h.next_seq();
    assert_eq!(
        h.refuse(acq_value(a, seq, "y", X, WAIT, vec![7; MAX_VALUE_LEN + 1])),
        Refusal::ValueTooLarge {
            len: MAX_VALUE_LEN + 1
        }
    );
}

#[test]
fn session_ttl_edges() {
    let mut h = Harness::new();
    for ttl_ms in [MIN_SESSION_TTL_MS, MAX_SESSION_TTL_MS] {
        let r = h.apply(open_cmd(ttl_ms, 0, 0));
        assert_eq!(
            r.reply,
            Reply::Opened {
                session: SessionId(h.index),
                ttl_ms,
                lock_delay_ms: 0
            }
        );
    }
    for ttl_ms in [0, MIN_SESSION_TTL_MS - 1, MAX_SESSION_TTL_MS + 1, u64::MAX] {
        assert_eq!(
            h.refuse(open_cmd(ttl_ms, 0, 0)),
            Refusal::InvalidTtl { ttl_ms }
        );
        // A bad ttl is refused before a nonce is looked up or recorded.
        assert_eq!(
            h.refuse(open_cmd(ttl_ms, 0, 9)),
            Refusal::InvalidTtl { ttl_ms }
        );
    }
}

#[test]
fn lock_delay_edges() {
    let mut h = Harness::new();
    let a = h.open_with(10_000, MAX_LOCK_DELAY_MS);
    h.open_with(10_000, 0);
    for lock_delay_ms in [MAX_LOCK_DELAY_MS + 1, u64::MAX] {
        assert_eq!(
            h.refuse(open_cmd(10_000, lock_delay_ms, 0)),
            Refusal::InvalidLockDelay { lock_delay_ms }
        );
    }
    h.grant(a, "x", X);
    let r = h.apply(Command::ExpireSession { session: a });
    assert!(r.events.contains(&Event::LockDelayStarted {
        name: name("x"),
        delay_ms: MAX_LOCK_DELAY_MS,
        since: h.index
    }));
}

#[test]
fn capacity_edges() {
    let mut h = Harness::new();
    let a = h.open();
    h.grant(a, "big", sem(MAX_CAPACITY, MAX_CAPACITY));
    h.grant(a, "one", sem(1, 1));
    for capacity in [0, MAX_CAPACITY + 1, u32::MAX] {
        for weight in [0, 1] {
            let seq = h.next_seq();
            assert_eq!(
                h.refuse(acq(a, seq, "s", sem(weight, capacity), WAIT)),
                Refusal::InvalidCapacity { capacity }
            );
        }
    }
}

/// Adds sessions `ids` (empty, ttl 10 s, no lock-delay) straight into the
/// table.
fn insert_sessions(table: &mut LockTable, ids: impl Iterator<Item = u64>) {
    let template = Session {
        ttl_ms: 10_000,
        lock_delay_ms: 0,
        nonce: 0,
        owner: String::new(),
        held: BTreeMap::new(),
        waiting: BTreeMap::new(),
        replies: Default::default(),
    };
    table
        .sessions
        .extend(ids.map(|id| (SessionId(id), template.clone())));
}

#[test]
fn waiters_per_name_edge() {
    let mut h = Harness::new();
    let holder = h.open();
    h.grant(holder, "x", X);
    // MAX_WAITERS_PER_NAME - 1 sessions queued on x, built directly.
    let first = h.index + 1;
    let last = first + MAX_WAITERS_PER_NAME as u64 - 2;
    insert_sessions(&mut h.table, first..=last);
    let x = name("x");
    for id in first..=last {
        let s = h.table.sessions.get_mut(&SessionId(id)).unwrap();
        s.waiting.insert(x.clone(), WaitRef { seq: 1, index: id });
        let lock = h.table.locks.get_mut(&x).unwrap();
        lock.queue.push_back(Waiter {
            session: SessionId(id),
            seq: 1,
            mode: X,
            value: Vec::new(),
            timeout_ms: WAIT,
            index: id,
        });
    }
    h.index = last;
    assert_eq!(h.table.stats().waiters, MAX_WAITERS_PER_NAME as u64 - 1);

    let p = match h.apply_unchecked(open_cmd(10_000, 0, 0)).reply {
        Reply::Opened { session, .. } => session,
        other => panic!("{other:?}"),
    };
    let q = SessionId(h.index + 1);
    h.apply_unchecked(open_cmd(10_000, 0, 0));
    // The last place in the queue is given...
    let r = h.apply_unchecked(acq(p, 1, "x", X, WAIT));
    assert_eq!(r.reply, Reply::Acquire(Acquired::Queued));
    assert_eq!(h.table.stats().waiters, MAX_WAITERS_PER_NAME as u64);
    // ... the next is refused, and a try still just fails.
    assert_eq!(
        h.refuse_unchecked(acq(q, 1, "x", SH, WAIT)),
        Refusal::TooManyWaiters { name: x.clone() }
    );
    let r = h.apply_unchecked(acq(q, 2, "x", X, TRY));
    assert_eq!(r.reply, Reply::Acquire(Acquired::NotAcquired));
    assert!(r.events.is_empty());
    assert_eq!(h.table.stats().waiters, MAX_WAITERS_PER_NAME as u64);
    // A full queue is checked, snapshotted and restored in linear time.
    h.table.check_invariants().unwrap();
    let restored = LockTable::from_snapshot(&h.table.to_snapshot()).unwrap();
    assert!(restored == h.table);
}

#[test]
fn locks_per_session_edge() {
    let mut h = Harness::new();
    let a = h.open();
    let b = h.open();
    h.grant(b, "busy", X);
    // A holds MAX_LOCKS_PER_SESSION - 2 names and waits for one more.
    for i in 0..MAX_LOCKS_PER_SESSION - 2 {
        let r = h.apply_unchecked(acq(a, i as u64 + 1, &format!("n{i:05}"), X, TRY));
        fence_of(&r);
    }
    h.seq = MAX_LOCKS_PER_SESSION as u64;
    h.table.check_invariants().unwrap();
    let seq = h.next_seq();
    let r = h.apply_unchecked(acq(a, seq, "busy", X, WAIT));
    assert_eq!(r.reply, Reply::Acquire(Acquired::Queued));
    // The last name is given...
    let seq = h.next_seq();
    fence_of(&h.apply_unchecked(acq(a, seq, "last", SH, TRY)));
    // ... the next is refused, whether a try or a wait.
    for timeout in [TRY, WAIT] {
        let seq = h.next_seq();
        assert_eq!(
            h.refuse_unchecked(acq(a, seq, "one-more", X, timeout)),
            Refusal::TooManyLocks { session: a }
        );
    }
    // Asking again for a name it holds or waits for is no new name: it is
    // refused as held or waiting, not as one too many.
    let seq = h.next_seq();
    assert!(matches!(
        h.refuse_unchecked(acq(a, seq, "n00000", X, TRY)),
        Refusal::AlreadyHeld { .. }
    ));
    let seq = h.next_seq();
    assert!(matches!(
        h.refuse_unchecked(acq(a, seq, "busy", X, WAIT)),
        Refusal::AlreadyWaiting { .. }
    ));
    // Letting one go makes room.
    let seq = h.next_seq();
    h.apply_unchecked(cancel(a, "busy", MAX_LOCKS_PER_SESSION as u64 + 1));
    fence_of(&h.apply_unchecked(acq(a, seq, "one-more", X, TRY)));
    h.table.check_invariants().unwrap();
}

#[test]
fn sessions_edge() {
    let mut h = Harness::new();
    // MAX_SESSIONS - 1 sessions, inserted directly.
    insert_sessions(&mut h.table, 1..MAX_SESSIONS as u64);
    h.index = MAX_SESSIONS as u64 - 1;
    // The last one is given...
    let r = h.apply_unchecked(open_cmd(10_000, 0, 77));
    let last = SessionId(h.index);
    assert_eq!(
        r.reply,
        Reply::Opened {
            session: last,
            ttl_ms: 10_000,
            lock_delay_ms: 0
        }
    );
    assert_eq!(h.table.stats().sessions, MAX_SESSIONS as u64);
    // ... the next is refused (one comparison for both: cloning a quarter
    // of a million sessions is the slow part of this test).
    let before = h.table.clone();
    for nonce in [0, 78] {
        let r = h.apply_unchecked(open_cmd(10_000, 0, nonce));
        assert_eq!(r.reply, Reply::Refused(Refusal::TooManySessions));
        assert!(r.events.is_empty());
    }
    assert!(h.table == before, "a refusal changed the table");
    // A retried open still finds its session at the limit.
    let r = h.apply_unchecked(open_cmd(10_000, 0, 77));
    assert_eq!(
        r.reply,
        Reply::Opened {
            session: last,
            ttl_ms: 10_000,
            lock_delay_ms: 0
        }
    );
    // Ending one makes room.
    h.apply_unchecked(Command::ExpireSession {
        session: SessionId(1),
    });
    let r = h.apply_unchecked(open_cmd(10_000, 0, 0));
    assert_eq!(
        r.reply,
        Reply::Opened {
            session: SessionId(h.index),
            ttl_ms: 10_000,
            lock_delay_ms: 0
        }
    );
    h.table.check_invariants().unwrap();
}

// ------------------------------------------------------------------- views

#[test]
fn describe_shows_holders_waiters_capacity_and_delay() {
    let mut h = Harness::new();
    let [a, b, c] = [(); 3].map(|_| h.open());
    let seq_a = h.next_seq();
    let fa = fence_of(&h.apply(acq_value(a, seq_a, "x", SH, WAIT, b"va".to_vec())));
    let ia = h.index;
    let seq_b = h.next_seq();
    let fb = fence_of(&h.apply(acq_value(b, seq_b, "x", SH, WAIT, b"vb".to_vec())));
    let ib = h.index;
    let seq_c = h.next_seq();
    h.apply(acq_value(c, seq_c, "x", X, 1_234, b"vc".to_vec()));
    let ic = h.index;
    assert_eq!(
        h.table.describe(&name("x")),
        Some(LockInfo {
            name: name("x"),
            capacity: None,
            holders: vec![
                HolderInfo {
                    session: a,
                    fence: fa,
                    mode: SH,
                    value: b"va".to_vec(),
                    index: ia
                },
                HolderInfo {
                    session: b,
                    fence: fb,
                    mode: SH,
                    value: b"vb".to_vec(),
                    index: ib
                },
            ],
            waiters: vec![WaitInfo {
                session: c,
                name: name("x"),
                seq: seq_c,
                mode: X,
                timeout_ms: 1_234,
                index: ic
            }],
            lock_delayed: false,
        })
    );
    assert_eq!(h.table.describe(&name("nothing")), None);
    h.grant(a, "s", sem(2, 5));
    let info = h.table.describe(&name("s")).unwrap();
    assert_eq!(info.capacity, Some(5));
    assert_eq!(info.holders[0].mode, sem(2, 5));
}

#[test]
fn list_filters_by_prefix_and_pages() {
    let mut h = Harness::new();
    let a = h.open();
    for n in ["b/1", "a/2", "ab", "a/1", "a/3", "a"] {
        h.grant(a, n, X);
    }
    let names = |infos: Vec<LockInfo>| -> Vec<String> {
        infos
            .into_iter()
            .map(|i| i.name.as_str().to_string())
            .collect()
    };
    let t = &h.table;
    assert_eq!(names(t.list("a/", None, 10)), ["a/1", "a/2", "a/3"]);
    assert_eq!(names(t.list("a/", None, 2)), ["a/1", "a/2"]);
    assert_eq!(names(t.list("a/", Some("a/1"), 10)), ["a/2", "a/3"]);
    assert_eq!(names(t.list("a/", Some("a/2"), 1)), ["a/3"]);
    assert_eq!(names(t.list("a/", Some("a/3"), 10)), Vec::<String>::new());
    assert_eq!(names(t.list("a/", Some("a/"), 10)), ["a/1", "a/2", "a/3"]);
    // A cursor before the prefix starts at the prefix; one after it ends.
    assert_eq!(names(t.list("a/", Some("0"), 10)), ["a/1", "a/2", "a/3"]);
    assert_eq!(names(t.list("a/", Some("b"), 10)), Vec::<String>::new());
    assert_eq!(
        names(t.list("a", None, 10)),
        ["a", "a/1", "a/2", "a/3", "ab"]
    );
    assert_eq!(names(t.list("c", None, 10)), Vec::<String>::new());
    assert_eq!(names(t.list("", None, 0)), Vec::<String>::new());
    // Paging through everything visits each name once, in order.
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = names(t.list("", after.as_deref(), 2));
        if page.is_empty() {
            break;
        }
        after = page.last().cloned();
        all.extend(page);
    }
    assert_eq!(all, ["a", "a/1", "a/2", "a/3", "ab", "b/1"]);
    // Entries carry full state.
    assert_eq!(t.list("b/", None, 1)[0], t.describe(&name("b/1")).unwrap());
}

#[test]
fn check_fence_answers_for_current_holders_only() {
    let mut h = Harness::new();
    let [a, b] = [(); 2].map(|_| h.open());
    let fa = h.grant(a, "x", SH);
    let fb = h.grant(b, "x", SH);
    let x = name("x");
    assert_eq!(h.table.check_fence(&x, fa), (true, Some(fb)));
    assert_eq!(h.table.check_fence(&x, fb), (true, Some(fb)));
    assert_eq!(h.table.check_fence(&x, Fence(fb.0 + 1)), (false, Some(fb)));
    h.released(b, "x", fb);
    assert_eq!(h.table.check_fence(&x, fb), (false, Some(fa)));
    assert_eq!(h.table.check_fence(&x, fa), (true, Some(fa)));
    h.released(a, "x", fa);
    assert_eq!(h.table.check_fence(&x, fa), (false, None));
    assert_eq!(h.table.check_fence(&name("never"), Fence(1)), (false, None));
}

#[test]
fn stats_count_everything() {
    let mut h = Harness::new();
    assert_eq!(h.table.stats(), Stats::default());
    let [a, b, c, d] = [(); 4].map(|_| h.open());
    h.grant(a, "x", SH);
    h.grant(b, "x", SH);
    h.queue(c, "x", X);
    h.grant(c, "s", sem(1, 2));
    h.queue(d, "s", sem(2, 2));
    assert_eq!(
        h.table.stats(),
        Stats {
            sessions: 4,
            names: 2,
            grants: 3,
            waiters: 2,
            last_fence: 3
        }
    );
}

#[test]
fn waits_delays_and_sessions_list_what_a_new_leader_must_rearm() {
    let mut h = Harness::new();
    let a = h.open_with(4_000, 0);
    let b = h.open_with(5_000, 300);
    let c = h.open_with(6_000, 0);
    h.grant(a, "x", X);
    h.grant(b, "y", X);
    h.grant(b, "z", X);
    let s1 = h.next_seq();
    h.apply(acq(c, s1, "x", SH, 1_000));
    let i1 = h.index;
    let s2 = h.next_seq();
    h.apply(acq(c, s2, "y", X, WAIT_FOREVER));
    let i2 = h.index;
    let waits: Vec<_> = h.table.waits().collect();
    assert_eq!(
        waits,
        vec![
            WaitInfo {
                session: c,
                name: name("x"),
                seq: s1,
                mode: SH,
                timeout_ms: 1_000,
                index: i1
            },
            WaitInfo {
                session: c,
                name: name("y"),
                seq: s2,
                mode: X,
                timeout_ms: WAIT_FOREVER,
                index: i2
            },
        ]
    );
    let sessions: Vec<_> = h.table.sessions().collect();
    assert_eq!(
        sessions,
        vec![
            SessionInfo {
                session: a,
                ttl_ms: 4_000,
                lock_delay_ms: 0
            },
            SessionInfo {
                session: b,
                ttl_ms: 5_000,
                lock_delay_ms: 300
            },
            SessionInfo {
                session: c,
                ttl_ms: 6_000,
                lock_delay_ms: 0
            },
        ]
    );
    assert_eq!(h.table.delays().count(), 0);
    h.apply(Command::ExpireSession { session: b });
    let since = h.index;
    let delays: Vec<_> = h
        .table
        .delays()
        .map(|(n, s, d)| (n.clone(), s, d))
        .collect();
    assert_eq!(
        delays,
        vec![(name("y"), since, 300), (name("z"), since, 300)]
    );
    let sessions: Vec<_> = h.table.sessions().map(|s| s.session).collect();
    assert_eq!(sessions, vec![a, c]);
    assert_eq!(h.table.session(b), None);
}

// ---------------------------------------------------------------- snapshot

/// A table with a bit of everything: nonces, holders of every mode, waiters,
/// a lock-delay and remembered replies.
fn busy_harness() -> Harness {
    let mut h = Harness::new();
    let a = match h.apply(open_cmd(5_000, 100, 11)).reply {
        Reply::Opened { session, .. } => session,
        other => panic!("{other:?}"),
    };
    let b = h.open_with(6_000, 0);
    let c = h.open_with(7_000, 2_000);
    let d = h.open();
    let seq = h.next_seq();
    h.apply(acq_value(a, seq, "x", X, WAIT, b"a".to_vec()));
    h.queue(b, "x", SH);
    h.queue(d, "x", SH);
    h.grant(c, "y", SH);
    h.grant(b, "y", SH);
    h.grant(c, "s", sem(2, 3));
    h.queue(a, "s", sem(2, 3));
    h.apply(Command::ExpireSession { session: c });
    h.acquire(d, "z", X, TRY);
    h
}

#[test]
fn snapshot_round_trip_equals_and_continues_identically() {
    let mut live = busy_harness();
    assert!(live.table.delays().count() > 0);
    let bytes = live.table.to_snapshot();
    assert_eq!(bytes[0], SNAPSHOT_VERSION);
    let restored = LockTable::from_snapshot(&bytes).unwrap();
    assert!(restored == live.table);
    assert_eq!(restored.to_snapshot(), bytes);

    let mut copy = Harness {
        table: restored,
        index: live.index,
        seq: live.seq,
    };
    let (a, b, d) = (SessionId(1), SessionId(2), SessionId(4));
    let since = live.table.delays().next().unwrap().1;
    let fx = live.table.describe(&name("x")).unwrap().holders[0].fence;
    let next = [
        acq(d, 1, "y", X, WAIT),
        open_cmd(5_000, 0, 11),
        end_delay("s", since),
        rel(a, 90, "x", fx),
        acq(b, 91, "x", SH, WAIT),
        cancel(d, "x", 3),
        Command::ExpireSession { session: b },
        Command::CloseSession {
            session: a,
            seq: 92,
            caller: String::new(),
        },
        acq(d, 93, "s", sem(3, 3), TRY),
    ];
    for cmd in next {
        let r1 = live.apply(cmd.clone());
        let r2 = copy.apply(cmd.clone());
        assert_eq!(r1, r2, "after {cmd:?}");
        assert!(live.table == copy.table, "after {cmd:?}");
    }
}

#[test]
fn empty_table_snapshot_round_trips() {
    let t = LockTable::new();
    let restored = LockTable::from_snapshot(&t.to_snapshot()).unwrap();
    assert!(restored == t);
}

#[test]
fn snapshot_with_another_version_is_an_error() {
    let mut bytes = busy_harness().table.to_snapshot();
    for v in [0, SNAPSHOT_VERSION + 1, u8::MAX] {
        bytes[0] = v;
        match LockTable::from_snapshot(&bytes) {
            Err(SnapshotError::Version(got)) => assert_eq!(got, v),
            other => panic!("version {v}: {other:?}"),
        }
    }
}

#[test]
fn garbage_and_truncated_snapshots_are_errors_not_panics() {
    assert!(matches!(
        LockTable::from_snapshot(&[]),
        Err(SnapshotError::Corrupt(_))
    ));
    assert!(matches!(
        LockTable::from_snapshot(&[SNAPSHOT_VERSION]),
        Err(SnapshotError::Corrupt(_))
    ));
    let mut junk = vec![SNAPSHOT_VERSION];
    junk.extend([0xff; 64]);
    assert!(matches!(
        LockTable::from_snapshot(&junk),
        Err(SnapshotError::Corrupt(_))
    ));
    let good = busy_harness().table.to_snapshot();
    for len in 1..good.len() {
        assert!(
            matches!(
                LockTable::from_snapshot(&good[..len]),
                Err(SnapshotError::Corrupt(_))
            ),
            "prefix of {len} bytes decoded"
        );
    }
    // Flipped bytes: an error, or a table that passes the invariant check;
    // never a panic.
    for i in 1..good.len() {
        for flip in [0x01, 0x80, 0xff] {
            let mut bad = good.clone();
            bad[i] ^= flip;
            if let Ok(t) = LockTable::from_snapshot(&bad) {
                t.check_invariants().unwrap();
            }
        }
    }
}

#[test]
fn snapshot_that_breaks_an_invariant_is_refused() {
    // Decodable, but each breaks a rule `apply` never breaks.
    type Corrupt = fn(&mut LockTable);
    let corruptions: [(&str, Corrupt); 6] = [
        ("holder without a session", |t| {
            let s = t.sessions.keys().next().copied().unwrap();
            t.sessions.remove(&s);
        }),
        ("fence ahead of the counter", |t| t.last_fence = 0),
        ("two exclusive holders", |t| {
            let lock = t.locks.get_mut(&name("y")).unwrap();
            for h in lock.holders.values_mut() {
                h.mode = X;
            }
        }),
        ("semaphore over capacity", |t| {
            let lock = t.locks.get_mut(&name("s")).unwrap();
            lock.capacity = Some(1);
        }),
        ("semaphore waiter heavier than the capacity", |t| {
            let lock = t.locks.get_mut(&name("s")).unwrap();
            lock.queue[0].mode = sem(4, 3);
        }),
        ("semaphore waiter of weight 0", |t| {
            let lock = t.locks.get_mut(&name("s")).unwrap();
            lock.queue[0].mode = sem(0, 3);
        }),
    ];
    for (what, corrupt) in corruptions {
        let mut h = Harness::new();
        let [a, b] = [(); 2].map(|_| h.open());
        h.grant(a, "y", SH);
        h.grant(b, "y", SH);
        h.grant(a, "s", sem(2, 3));
        h.queue(b, "s", sem(2, 3));
        let mut t = h.table.clone();
        corrupt(&mut t);
        assert!(t.check_invariants().is_err(), "{what}: not detected");
        assert!(
            matches!(
                LockTable::from_snapshot(&t.to_snapshot()),
                Err(SnapshotError::Corrupt(_))
            ),
            "{what}: restored"
        );
    }
}

// ---- Sessions bound to identities (access control) ----

fn open_as(h: &mut Harness, owner: &str, nonce: u64) -> SessionId {
    let r = h.apply(Command::OpenSession {
        ttl_ms: 10_000,
        lock_delay_ms: 0,
        nonce,
        owner: owner.to_string(),
    });
    match r.reply {
        Reply::Opened { session, .. } => session,
        other => panic!("open failed: {other:?}"),
    }
}

fn acq_as(session: SessionId, seq: u64, n: &str, caller: &str) -> Command {
    Command::Acquire {
        session,
        seq,
        name: n.to_string(),
        mode: X,
        timeout_ms: WAIT,
        value: Vec::new(),
        caller: caller.to_string(),
    }
}

fn rel_as(session: SessionId, seq: u64, n: &str, fence: Fence, caller: &str) -> Command {
    Command::Release {
        session,
        seq,
        name: n.to_string(),
        fence,
        caller: caller.to_string(),
    }
}

#[test]
fn only_the_owner_identity_uses_a_session() {
    let mut h = Harness::new();
    let alice = open_as(&mut h, "alice", 0);
    let seq = h.next_seq();
    let fence = fence_of(&h.apply(acq_as(alice, seq, "x", "alice")));

    // Another identity can neither acquire with, release from, nor close
    // alice's session; each refusal changes nothing.
    let s2 = h.next_seq();
    assert_eq!(
        h.refuse(acq_as(alice, s2, "y", "mallory")),
        Refusal::NotOwner { session: alice }
    );
    let s3 = h.next_seq();
    assert_eq!(
        h.refuse(rel_as(alice, s3, "x", fence, "mallory")),
        Refusal::NotOwner { session: alice }
    );
    let s4 = h.next_seq();
    assert_eq!(
        h.refuse(Command::CloseSession {
            session: alice,
            seq: s4,
            caller: "mallory".into(),
        }),
        Refusal::NotOwner { session: alice }
    );
    // The unauthenticated identity (empty) is another identity too.
    let s5 = h.next_seq();
    assert_eq!(
        h.refuse(acq_as(alice, s5, "y", "")),
        Refusal::NotOwner { session: alice }
    );
    // A retry of alice's own acquire by another identity does not get the
    // remembered reply (and so learns nothing about the grant).
    assert_eq!(
        h.refuse(acq_as(alice, seq, "x", "mallory")),
        Refusal::NotOwner { session: alice }
    );

    // Alice herself still can.
    let s6 = h.next_seq();
    assert_eq!(
        h.apply(rel_as(alice, s6, "x", fence, "alice")).reply,
        Reply::Released { released: true }
    );
    assert_eq!(h.table.session_owner(alice), Some("alice"));
}

#[test]
fn a_retried_open_finds_its_session_only_for_the_same_identity() {
    let mut h = Harness::new();
    let alice = open_as(&mut h, "alice", 77);
    // Same nonce, same identity: the same session.
    assert_eq!(open_as(&mut h, "alice", 77), alice);
    // Same nonce, another identity: refused, nothing opened.
    let refusal = h.refuse(Command::OpenSession {
        ttl_ms: 10_000,
        lock_delay_ms: 0,
        nonce: 77,
        owner: "mallory".into(),
    });
    assert_eq!(refusal, Refusal::NotOwner { session: alice });
    assert_eq!(h.table.sessions().count(), 1);
}

#[test]
fn owner_length_is_limited() {
    let mut h = Harness::new();
    let longest = "o".repeat(MAX_OWNER_LEN);
    let s = open_as(&mut h, &longest, 0);
    assert_eq!(h.table.session_owner(s), Some(longest.as_str()));
    let refusal = h.refuse(Command::OpenSession {
        ttl_ms: 10_000,
        lock_delay_ms: 0,
        nonce: 0,
        owner: "o".repeat(MAX_OWNER_LEN + 1),
    });
    assert_eq!(
        refusal,
        Refusal::InvalidOwner {
            len: MAX_OWNER_LEN + 1
        }
    );
}

#[test]
fn owners_survive_a_snapshot() {
    let mut h = Harness::new();
    let alice = open_as(&mut h, "alice", 0);
    let restored = LockTable::from_snapshot(&h.table.to_snapshot()).expect("decodes");
    assert_eq!(restored.session_owner(alice), Some("alice"));
    assert_eq!(restored, h.table);
}

// ---- Restoring a backup in parts ----

fn part(restore: u64, part: u32, parts: u32, bytes: &[u8]) -> Command {
    Command::RestorePart {
        restore,
        part,
        parts,
        bytes: bytes.to_vec(),
        fence_bump: DEFAULT_RESTORE_FENCE_BUMP,
    }
}

/// `restored` with the index floor and fence bump a restore adds taken
/// off again: the table the backup held.
fn as_backed_up(restored: &LockTable) -> LockTable {
    LockTable {
        index_floor: 0,
        last_fence: restored.last_fence - DEFAULT_RESTORE_FENCE_BUMP,
        ..restored.clone()
    }
}

/// A backup of a small table: two sessions, a grant, a waiter.
fn small_backup() -> (LockTable, Vec<u8>) {
    let mut h = Harness::new();
    let a = h.open();
    let b = h.open();
    h.grant(a, "x", X);
    h.queue(b, "x", X);
    let bytes = h.table.to_snapshot();
    (h.table, bytes)
}

#[test]
fn a_backup_restored_in_parts_installs_on_the_last_part() {
    let (original, backup) = small_backup();
    let mut h = Harness::new();
    let chunks: Vec<&[u8]> = backup.chunks(backup.len() / 3 + 1).collect();
    let parts = chunks.len() as u32;
    assert_eq!(parts, 3);
    for (i, chunk) in chunks[..2].iter().enumerate() {
        let r = h.apply(part(7, i as u32, parts, chunk));
        assert_eq!(r.reply, Reply::RestorePartTaken { next: i as u32 + 1 });
        assert!(r.events.is_empty());
        assert_eq!(h.table.sessions().count(), 0, "nothing installed yet");
    }
    let r = h.apply(part(7, 2, parts, chunks[2]));
    assert_eq!(
        r.reply,
        Reply::Restored {
            sessions: 2,
            last_fence: original.last_fence().0 + DEFAULT_RESTORE_FENCE_BUMP
        }
    );
    assert!(h.table.index_floor > original.max_index() + RESTORE_INDEX_BUMP - 1);
    // The leader's timers hear of every session and wait.
    assert_eq!(
        r.events
            .iter()
            .filter(|e| matches!(e, Event::SessionOpened { .. }))
            .count(),
        2
    );
    assert!(r.events.iter().any(|e| matches!(e, Event::Queued { .. })));
    assert_eq!(as_backed_up(&h.table), original);
    // The table is not empty any more: a second restore is refused.
    assert_eq!(
        h.refuse(part(8, 0, 1, &backup)),
        Refusal::RestoreIntoNonEmpty
    );
}

#[test]
fn restore_parts_must_come_in_order_from_one_restore() {
    let (original, backup) = small_backup();
    let (first, rest) = backup.split_at(backup.len() / 2);
    let mut h = Harness::new();
    // A part with no restore under way.
    assert!(matches!(
        h.refuse(part(1, 1, 2, rest)),
        Refusal::InvalidRestorePart { .. }
    ));
    h.apply(part(1, 0, 2, first));
    // Another restore's part, a repeated part, a wrong count: refused, and
    // the restore under way is untouched.
    for bad in [
        part(2, 1, 2, rest),
        part(1, 2, 3, rest),
        part(1, 1, 3, rest),
    ] {
        assert!(
            matches!(h.refuse(bad.clone()), Refusal::InvalidRestorePart { .. }),
            "{bad:?}"
        );
    }
    // A bad last part is refused and the restore can still finish.
    assert!(matches!(
        h.refuse(part(1, 1, 2, b"garbage")),
        Refusal::InvalidBackup { .. }
    ));
    assert!(matches!(
        h.apply(part(1, 1, 2, rest)).reply,
        Reply::Restored { .. }
    ));
    assert_eq!(as_backed_up(&h.table), original);
}

#[test]
fn part_zero_replaces_an_abandoned_restore() {
    let (original, backup) = small_backup();
    let (first, rest) = backup.split_at(backup.len() / 2);
    let mut h = Harness::new();
    h.apply(part(1, 0, 2, b"stale beginning"));
    h.apply(part(2, 0, 2, first));
    assert!(matches!(
        h.refuse(part(1, 1, 2, rest)),
        Refusal::InvalidRestorePart { .. }
    ));
    h.apply(part(2, 1, 2, rest));
    assert_eq!(as_backed_up(&h.table), original);
}

#[test]
fn restore_part_bounds_are_checked_at_their_edges() {
    let mut h = Harness::new();
    // Numbering: parts ≥ 1, part < parts.
    for (p, parts) in [(0, 0), (1, 1), (5, 2)] {
        assert!(matches!(
            h.refuse(part(1, p, parts, b"")),
            Refusal::InvalidRestorePart { .. }
        ));
    }
    // Size of one part: MAX_RESTORE_PART is taken, one more byte is not.
    let r = h.apply(part(1, 0, 2, &vec![1; MAX_RESTORE_PART]));
    assert_eq!(r.reply, Reply::RestorePartTaken { next: 1 });
    assert!(matches!(
        h.refuse(part(1, 1, 2, &vec![1; MAX_RESTORE_PART + 1])),
        Refusal::InvalidRestorePart { .. }
    ));

    // The whole backup: up to MAX_RESTORE_BYTES is assembled (these zeros
    // then fail to decode), one byte more is refused before it is copied.
    let mut t = LockTable::new();
    t.restoring = Some(PendingRestore {
        restore: 9,
        next: 1,
        parts: 2,
        bytes: vec![0; MAX_RESTORE_BYTES - 1],
    });
    let r = t.apply(1, part(9, 1, 2, &[0, 0]));
    assert!(
        matches!(r.reply, Reply::Refused(Refusal::InvalidRestorePart { .. })),
        "{:?}",
        r.reply
    );
    assert_eq!(
        t.restoring.as_ref().map(|p| (p.next, p.bytes.len())),
        Some((1, MAX_RESTORE_BYTES - 1)),
        "the refusal changed nothing"
    );
    let r = t.apply(2, part(9, 1, 2, &[0]));
    assert!(
        matches!(r.reply, Reply::Refused(Refusal::InvalidBackup { .. })),
        "{:?}",
        r.reply
    );
    assert_eq!(
        t.restoring.as_ref().map(|p| (p.next, p.bytes.len())),
        Some((1, MAX_RESTORE_BYTES - 1))
    );
}

// ---- Restore never reuses ids, queue positions or fences ----

/// The review's backup: A holds `x`, B queues on it; in the backup's
/// cluster they were opened at indexes 2 and 3 (ids 2048 and 3072).
fn indexed_backup() -> (SessionId, SessionId, Vec<u8>) {
    let mut old = LockTable::new();
    let id = |r: &Response| match r.reply {
        Reply::Opened { session, .. } => session,
        ref other => panic!("open failed: {other:?}"),
    };
    let a = id(&old.apply(2048, open_cmd(60_000, 0, 11)));
    let b = id(&old.apply(3072, open_cmd(5_000, 0, 12)));
    old.apply(4096, acq(a, 1, "x", X, TRY));
    old.apply(5120, acq(b, 1, "x", X, WAIT));
    (a, b, old.to_snapshot())
}

/// Restores `backup` as one part at raw index 2048 (the new cluster's log
/// starts again near 0).
fn restore_at_2048(backup: &[u8]) -> LockTable {
    let mut t = LockTable::new();
    let r = t.apply(2048, part(1, 0, 1, backup));
    assert!(matches!(r.reply, Reply::Restored { .. }), "{:?}", r.reply);
    t
}

#[test]
fn a_session_opened_after_a_restore_never_takes_a_restored_id() {
    let (a, b, backup) = indexed_backup();
    let mut t = restore_at_2048(&backup);
    let r = t.apply(3072, open_cmd(10_000, 0, 99));
    let Reply::Opened { session: c, .. } = r.reply else {
        panic!("open failed: {:?}", r.reply)
    };
    assert!(c != a && c != b, "new session {c} reuses a restored id");
    assert!(c.0 > b.0, "ids keep growing across a restore");
    t.check_invariants()
        .expect("invariants hold after the restore");
    // The restored cluster can be backed up and restored again.
    let again = restore_at_2048(&t.to_snapshot());
    again
        .check_invariants()
        .expect("a backup of the restored cluster restores");
}

#[test]
fn a_restore_keeps_queue_order_and_never_grants_to_a_ghost() {
    let (a, b, backup) = indexed_backup();
    let mut t = restore_at_2048(&backup);
    let r = t.apply(4097, open_cmd(10_000, 0, 98));
    let Reply::Opened { session: c, .. } = r.reply else {
        panic!("open failed: {:?}", r.reply)
    };
    t.apply(4098, acq(c, 1, "x", X, WAIT));
    t.check_invariants().expect("queue order kept");
    // B (queued before the backup) expires, then A: C is next, not B.
    t.apply(6144, Command::ExpireSession { session: b });
    t.apply(7168, Command::ExpireSession { session: a });
    let info = t.describe(&name("x")).expect("x is held");
    assert_eq!(
        info.holders.iter().map(|h| h.session).collect::<Vec<_>>(),
        vec![c],
        "x must pass to C, the only waiter left"
    );
    t.check_invariants().expect("invariants hold");
}

#[test]
fn fences_after_a_restore_start_above_what_the_old_cluster_may_have_issued() {
    let (a, _b, backup) = indexed_backup();
    let backup_fence = LockTable::from_snapshot(&backup)
        .expect("decodes")
        .last_fence()
        .0;
    let mut t = restore_at_2048(&backup);
    let r = t.apply(3072, rel(a, 2, "x", Fence(1)));
    assert_eq!(r.reply, Reply::Released { released: true });
    // B was queued, so the release granted it; its fence must be above any
    // fence the old cluster could have issued after the backup (within the
    // default bump).
    let fence = t.describe(&name("x")).expect("held").holders[0].fence.0;
    assert!(
        fence > backup_fence + (1 << 32),
        "fence {fence} after a restore of a backup at {backup_fence} could repeat one the old cluster issued"
    );
}

#[test]
fn apply_refuses_instead_of_panicking_on_a_broken_table() {
    // A session whose nonce index points at nothing, a grant the lock does
    // not have: tables no apply makes, but a bug or a bad backup could.
    let mut h = Harness::new();
    let a = h.open();
    let fence = h.grant(a, "x", X);
    h.table.nonces.insert(77, SessionId(999_999));
    let r = h.table.apply(100, open_cmd(10_000, 0, 77));
    assert!(matches!(r.reply, Reply::Refused(_)), "{:?}", r.reply);
    h.table.nonces.remove(&77);
    h.table.locks.clear();
    let r = h.table.apply(101, rel(a, 50, "x", fence));
    assert!(matches!(r.reply, Reply::Refused(_)), "{:?}", r.reply);
}

#[test]
fn a_backup_in_the_previous_format_still_restores() {
    use serde::Serialize;

    // Format 2's layout: no index floor, no remembered closes, replies
    // without digests.
    #[derive(Serialize)]
    struct V2Replies {
        map: BTreeMap<u64, Reply>,
        floor: Option<u64>,
    }
    #[derive(Serialize)]
    struct V2Session {
        ttl_ms: u64,
        lock_delay_ms: u64,
        nonce: u64,
        owner: String,
        held: BTreeMap<LockName, Fence>,
        waiting: BTreeMap<LockName, WaitRef>,
        replies: V2Replies,
    }
    #[derive(Serialize)]
    struct V2Table<'a> {
        sessions: BTreeMap<SessionId, V2Session>,
        locks: &'a BTreeMap<LockName, super::table::Lock>,
        nonces: &'a BTreeMap<u64, SessionId>,
        last_fence: u64,
        restoring: Option<PendingRestore>,
    }
    let (original, _) = small_backup();
    let v2 = V2Table {
        sessions: original
            .sessions
            .iter()
            .map(|(id, s)| {
                let session = V2Session {
                    ttl_ms: s.ttl_ms,
                    lock_delay_ms: s.lock_delay_ms,
                    nonce: s.nonce,
                    owner: s.owner.clone(),
                    held: s.held.clone(),
                    waiting: s.waiting.clone(),
                    replies: V2Replies {
                        map: s
                            .replies
                            .map
                            .iter()
                            .map(|(seq, r)| (*seq, r.reply.clone()))
                            .collect(),
                        floor: s.replies.floor,
                    },
                };
                (*id, session)
            })
            .collect(),
        locks: &original.locks,
        nonces: &original.nonces,
        last_fence: original.last_fence,
        restoring: None,
    };
    let mut bytes = vec![super::view::SNAPSHOT_VERSION_2];
    bincode::serialize_into(&mut bytes, &v2).expect("encodes");
    let upgraded = LockTable::from_snapshot(&bytes).expect("decodes");
    // The same table, its replies' digests unknown (any retry matches).
    assert_eq!(
        upgraded.sessions.keys().collect::<Vec<_>>(),
        original.sessions.keys().collect::<Vec<_>>()
    );
    assert_eq!(upgraded.locks, original.locks);
    assert_eq!(upgraded.last_fence, original.last_fence);
    assert!(upgraded
        .sessions
        .values()
        .flat_map(|s| s.replies.map.values())
        .all(|r| r.digest == 0));
    let mut h = Harness::new();
    assert!(matches!(
        h.apply(part(3, 0, 1, &bytes)).reply,
        Reply::Restored { .. }
    ));
    let err = LockTable::from_snapshot(&[9, 0, 0]).expect_err("unknown version");
    assert!(err.to_string().contains("reads 2 and 3"), "{err}");
}

// ---- Withdraw: a client gives up on an acquire ----

fn withdraw(session: SessionId, seq: u64, name: &str) -> Command {
    Command::Withdraw {
        session,
        seq,
        name: name.to_string(),
        caller: String::new(),
    }
}

#[test]
fn withdraw_removes_a_queued_acquire_and_lets_the_queue_move() {
    let mut h = Harness::new();
    let [a, b, c] = [(); 3].map(|_| h.open());
    h.grant(a, "x", X);
    h.queue(b, "x", X);
    let b_seq = h.seq;
    h.queue(c, "x", SH);
    let r = h.apply(withdraw(b, b_seq, "x"));
    assert_eq!(r.reply, Reply::Withdrawn { withdrawn: true });
    assert!(r.events.iter().any(|e| matches!(
        e,
        Event::Cancelled { session, cause: CancelCause::Withdrawn, .. } if *session == b
    )));
    assert_eq!(waiters(&h.table, "x"), vec![(c, SH)]);
    // A retry of the withdrawn acquire learns it was not acquired.
    assert_eq!(
        h.no_op(acq(b, b_seq, "x", X, WAIT)),
        Reply::Acquire(Acquired::NotAcquired)
    );
    // Idempotent.
    assert_eq!(
        h.no_op(withdraw(b, b_seq, "x")),
        Reply::Withdrawn { withdrawn: false }
    );
}

/// A withdraw can overtake its acquire: the client gave up while the
/// acquire was still on its way, or a retry of it went out around a leader
/// change. The acquire must then grant nothing when it arrives. Found by
/// the harness's end-of-run audit (`clients` workload, `--nemesis all`): a
/// lock held, with a fence no worker ever saw, by a live session whose
/// client had abandoned that acquire.
#[test]
fn a_withdraw_that_overtakes_its_acquire_stops_it() {
    let mut h = Harness::new();
    let a = h.open();
    let seq = h.next_seq();
    let r = h.apply(withdraw(a, seq, "x"));
    assert_eq!(r.reply, Reply::Withdrawn { withdrawn: false });
    let r = h.apply(acq(a, seq, "x", X, WAIT));
    assert_eq!(r.reply, Reply::Acquire(Acquired::NotAcquired));
    assert!(r.events.is_empty(), "{:?}", r.events);
    assert!(holders(&h.table, "x").is_empty());
    // Its retries get the same answer; the session's next acquire works.
    assert_eq!(
        h.no_op(acq(a, seq, "x", X, WAIT)),
        Reply::Acquire(Acquired::NotAcquired)
    );
    h.grant(a, "x", X);
}

#[test]
fn withdraw_releases_a_grant_made_to_that_acquire_only() {
    let mut h = Harness::new();
    let [a, b] = [(); 2].map(|_| h.open());
    h.grant(a, "x", X);
    let a_seq = h.seq;
    h.queue(b, "x", X);
    // Another seq of a's is not the acquire that holds x: x stays held
    // (that seq, not seen yet, will grant nothing if it ever comes).
    assert_eq!(
        h.apply(withdraw(a, a_seq + 100, "x")).reply,
        Reply::Withdrawn { withdrawn: false }
    );
    assert_eq!(holders(&h.table, "x"), vec![(a, X)]);
    let r = h.apply(withdraw(a, a_seq, "x"));
    assert_eq!(r.reply, Reply::Withdrawn { withdrawn: true });
    assert_eq!(holders(&h.table, "x"), vec![(b, X)]);
    // Another identity cannot withdraw someone's acquire; an ended session
    // has nothing to withdraw.
    let mut t = LockTable::new();
    t.apply(
        1,
        Command::OpenSession {
            ttl_ms: 10_000,
            lock_delay_ms: 0,
            nonce: 0,
            owner: "alice".into(),
        },
    );
    let alice = SessionId(1);
    let r = t.apply(
        2,
        Command::Withdraw {
            session: alice,
            seq: 1,
            name: "x".into(),
            caller: "bob".into(),
        },
    );
    assert_eq!(
        r.reply,
        Reply::Refused(Refusal::NotOwner { session: alice })
    );
    h.close(b);
    assert_eq!(
        h.no_op(withdraw(b, 1, "x")),
        Reply::Withdrawn { withdrawn: false }
    );
}

// ---- Exactly-once without gaps (review findings 6 and 14) ----

#[test]
fn a_queued_acquire_is_never_forgotten_by_the_reply_window() {
    let mut h = Harness::new();
    let [a, s] = [(); 2].map(|_| h.open());
    h.grant(a, "x", X);
    let r = h.apply(acq(s, 1, "x", X, WAIT));
    assert_eq!(r.reply, Reply::Acquire(Acquired::Queued));
    // Many more requests on the same session than the window holds.
    for seq in 2..=MAX_REMEMBERED_REPLIES as u64 + 10 {
        h.apply(rel(s, seq, "nothing-held", Fence(1)));
    }
    // The queued acquire, retried, still learns where it stands.
    assert_eq!(
        h.no_op(acq(s, 1, "x", X, WAIT)),
        Reply::Acquire(Acquired::Queued)
    );
}

#[test]
fn a_seq_reused_for_another_command_is_refused() {
    let mut h = Harness::new();
    let a = h.open();
    let r = h.apply(acq(a, 5, "reuse-a", X, TRY));
    let fa = fence_of(&r);
    // Same seq, another name: not the first request's answer.
    let r = h.apply(acq(a, 5, "reuse-b", X, TRY));
    assert!(
        matches!(r.reply, Reply::Refused(_)),
        "seq 5 reused for another name was answered {:?}",
        r.reply
    );
    let r = h.apply(rel(a, 5, "reuse-a", fa));
    assert!(
        matches!(r.reply, Reply::Refused(_)),
        "seq 5 reused for a release was answered {:?}",
        r.reply
    );
    assert_eq!(holders(&h.table, "reuse-a"), vec![(a, X)]);
}

#[test]
fn a_retried_close_is_answered_like_the_first() {
    let mut h = Harness::new();
    let a = h.open();
    h.grant(a, "x", X);
    let close = Command::CloseSession {
        session: a,
        seq: 9,
        caller: String::new(),
    };
    assert_eq!(h.apply(close.clone()).reply, Reply::Closed { released: 1 });
    assert_eq!(h.apply(close).reply, Reply::Closed { released: 1 });
}
