//! Deadlock detection: cycles refused, non-cycles allowed.

use super::*;

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
    h.apply(Command::ExpireSession(cmd::ExpireSession { session: d }));
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
    t.usage = Usage::of(&t);
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
    h.apply(Command::ExpireSession(cmd::ExpireSession { session: d }));
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
