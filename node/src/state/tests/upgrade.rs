//! Upgrading a shared grant to exclusive and downgrading an exclusive one.

use super::*;

fn up(session: SessionId, seq: u64, n: &str, fence: Fence, timeout_ms: u64) -> Command {
    Command::Upgrade(cmd::Upgrade {
        session,
        seq,
        name: name(n),
        fence,
        timeout_ms,
        caller: String::new(),
    })
}

fn down(session: SessionId, seq: u64, n: &str, fence: Fence) -> Command {
    Command::Downgrade(cmd::Downgrade {
        session,
        seq,
        name: name(n),
        fence,
        caller: String::new(),
    })
}

impl Harness {
    fn upgrade(&mut self, session: SessionId, n: &str, fence: Fence, timeout_ms: u64) -> Response {
        let seq = self.next_seq();
        self.apply(up(session, seq, n, fence, timeout_ms))
    }

    fn downgrade(&mut self, session: SessionId, n: &str, fence: Fence) -> Response {
        let seq = self.next_seq();
        self.apply(down(session, seq, n, fence))
    }
}

#[test]
fn a_lone_shared_holder_upgrades_at_once_with_a_new_fence() {
    let mut h = Harness::new();
    let a = h.open();
    let f = h.grant(a, "doc", SH);
    let r = h.upgrade(a, "doc", f, WAIT);
    let seq = h.seq;
    let g = fence_of(&r);
    assert!(g > f, "an upgrade is a new grant with a new fence");
    assert_eq!(
        r.events,
        vec![
            Event::Ended {
                name: name("doc"),
                session: a,
                fence: f,
                mode: SH,
                cause: EndCause::Upgraded,
            },
            Event::Granted {
                name: name("doc"),
                session: a,
                seq,
                fence: g,
                mode: X,
            },
        ]
    );
    assert_eq!(holders(&h.table, "doc"), vec![(a, X)]);
    // The old fence is gone: releasing it releases nothing.
    assert_eq!(
        h.release(a, "doc", f).reply,
        Reply::Released { released: false }
    );
    h.released(a, "doc", g);
}

#[test]
fn an_upgrade_waits_for_the_other_readers_and_goes_ahead_of_the_queue() {
    let mut h = Harness::new();
    let (a, b, w, r2) = (h.open(), h.open(), h.open(), h.open());
    let fa = h.grant(a, "doc", SH);
    let fb = h.grant(b, "doc", SH);
    // A writer queued before the upgrade.
    h.queue(w, "doc", X);
    let r = h.upgrade(a, "doc", fa, WAIT);
    let seq = h.seq;
    assert_eq!(r.reply, Reply::Acquire(Acquired::Queued));
    // The upgrade is listed first among the waiters.
    assert_eq!(waiters(&h.table, "doc"), vec![(a, X), (w, X)]);
    // No new reader gets in while it waits, even with a queue of readers
    // only behind it.
    h.try_fails(r2, "doc", SH);
    // The other reader leaves: the upgrade is granted, not the writer.
    let r = h.released(b, "doc", fb);
    let granted = grants(&r);
    assert_eq!(granted.len(), 1);
    assert_eq!((granted[0].0, granted[0].1.as_str()), (a, "doc"));
    let g = granted[0].2;
    assert!(g > fb);
    assert_eq!(holders(&h.table, "doc"), vec![(a, X)]);
    assert_eq!(waiters(&h.table, "doc"), vec![(w, X)]);
    // A retry of the upgrade finds the grant.
    let again = h.apply(up(a, seq, "doc", fa, WAIT));
    assert_eq!(again.reply, granted_reply(g, X, h.index - 1));
    assert!(again.events.is_empty());
    // Its release hands the lock to the writer.
    let r = h.released(a, "doc", g);
    assert_eq!(grants(&r)[0].0, w);
}

#[test]
fn a_second_upgrader_is_refused_as_a_deadlock_naming_both() {
    let mut h = Harness::new();
    let (a, b) = (h.open(), h.open());
    let fa = h.grant(a, "doc", SH);
    let fb = h.grant(b, "doc", SH);
    let r = h.upgrade(a, "doc", fa, WAIT);
    assert_eq!(r.reply, Reply::Acquire(Acquired::Queued));
    let seq = h.next_seq();
    let refusal = h.refuse(up(b, seq, "doc", fb, WAIT));
    assert_eq!(
        refusal,
        Refusal::Deadlock {
            cycle: vec![
                WaitEdge {
                    session: b,
                    name: name("doc"),
                    blocker: a
                },
                WaitEdge {
                    session: a,
                    name: name("doc"),
                    blocker: b
                },
            ]
        }
    );
    // b gives up its read: a is granted.
    let r = h.released(b, "doc", fb);
    assert_eq!(grants(&r)[0].0, a);
}

#[test]
fn an_upgrade_that_would_close_a_cycle_elsewhere_is_refused() {
    let mut h = Harness::new();
    let (a, b) = (h.open(), h.open());
    let fa = h.grant(a, "doc", SH);
    h.grant(b, "doc", SH);
    h.grant(a, "other", X);
    // b waits for a's "other".
    h.queue(b, "other", X);
    // a upgrading "doc" would wait for b, who waits for a.
    let seq = h.next_seq();
    match h.refuse(up(a, seq, "doc", fa, WAIT)) {
        Refusal::Deadlock { cycle } => {
            assert_eq!(cycle[0].session, a);
            assert_eq!(cycle[0].blocker, b);
            assert!(cycle.iter().any(|e| e.session == b && e.blocker == a));
        }
        other => panic!("expected a deadlock, got {other:?}"),
    }
    // And the other way round: with a's upgrade pending, b queueing for
    // something a holds is refused too.
    let mut h = Harness::new();
    let (a, b) = (h.open(), h.open());
    let fa = h.grant(a, "doc", SH);
    h.grant(b, "doc", SH);
    h.grant(a, "other", X);
    assert_eq!(
        h.upgrade(a, "doc", fa, WAIT).reply,
        Reply::Acquire(Acquired::Queued)
    );
    let seq = h.next_seq();
    assert!(matches!(
        h.refuse(acq(b, seq, "other", X, WAIT)),
        Refusal::Deadlock { .. }
    ));
}

#[test]
fn a_try_upgrade_with_other_readers_is_not_acquired_and_changes_nothing() {
    let mut h = Harness::new();
    let (a, b) = (h.open(), h.open());
    let fa = h.grant(a, "doc", SH);
    h.grant(b, "doc", SH);
    let before = h.table.locks.clone();
    let r = h.upgrade(a, "doc", fa, TRY);
    assert_eq!(r.reply, Reply::Acquire(Acquired::NotAcquired));
    assert!(r.events.is_empty());
    assert_eq!(h.table.locks, before);
    assert!(h.table.upgrades.is_empty());
}

#[test]
fn a_pending_upgrade_ends_by_timeout_cancel_release_or_session_end() {
    // Timeout: the leader's TimeoutWait; the read stays held, readers
    // queued behind it come in.
    let mut h = Harness::new();
    let (a, b, c) = (h.open(), h.open(), h.open());
    let fa = h.grant(a, "doc", SH);
    h.grant(b, "doc", SH);
    h.upgrade(a, "doc", fa, WAIT);
    let seq = h.seq;
    h.queue(c, "doc", SH);
    let r = h.apply(cancel(a, "doc", seq));
    assert_eq!(r.reply, Reply::WaitTimedOut { ended: true });
    assert_eq!(
        r.events[0],
        Event::Cancelled {
            name: name("doc"),
            session: a,
            seq,
            mode: X,
            cause: CancelCause::TimedOut
        }
    );
    assert_eq!(grants(&r).len(), 1, "the queued reader comes in");
    assert_eq!(holders(&h.table, "doc"), vec![(a, SH), (b, SH), (c, SH)]);
    // A retry of the upgrade now answers "not acquired".
    let again = h.apply(up(a, seq, "doc", fa, WAIT));
    assert_eq!(again.reply, Reply::Acquire(Acquired::NotAcquired));

    // Cancel (the client gave up).
    let mut h = Harness::new();
    let (a, b) = (h.open(), h.open());
    let fa = h.grant(a, "doc", SH);
    h.grant(b, "doc", SH);
    h.upgrade(a, "doc", fa, WAIT);
    let seq = h.seq;
    let r = h.apply(Command::Cancel(cmd::Cancel {
        session: a,
        seq,
        name: name("doc"),
        caller: String::new(),
    }));
    assert_eq!(r.reply, Reply::Cancelled { cancelled: true });
    assert!(h.table.upgrades.is_empty());
    assert_eq!(holders(&h.table, "doc"), vec![(a, SH), (b, SH)]);

    // Releasing the read ends its upgrade.
    let mut h = Harness::new();
    let (a, b) = (h.open(), h.open());
    let fa = h.grant(a, "doc", SH);
    let fb = h.grant(b, "doc", SH);
    h.upgrade(a, "doc", fa, WAIT);
    let r = h.released(a, "doc", fa);
    assert!(r.events.iter().any(|e| matches!(
        e,
        Event::Cancelled {
            session,
            mode: Mode::Exclusive,
            cause: CancelCause::Cancelled,
            ..
        } if *session == a
    )));
    assert!(h.table.upgrades.is_empty());
    h.released(b, "doc", fb);

    // The upgrader's session expires: its upgrade and read end together.
    let mut h = Harness::new();
    let (a, b) = (h.open(), h.open());
    let fa = h.grant(a, "doc", SH);
    h.grant(b, "doc", SH);
    h.upgrade(a, "doc", fa, WAIT);
    h.apply(Command::ExpireSession(cmd::ExpireSession { session: a }));
    assert!(h.table.upgrades.is_empty());
    assert_eq!(holders(&h.table, "doc"), vec![(b, SH)]);

    // The other reader's session expires: the upgrade is granted.
    let mut h = Harness::new();
    let (a, b) = (h.open(), h.open());
    let fa = h.grant(a, "doc", SH);
    h.grant(b, "doc", SH);
    h.upgrade(a, "doc", fa, WAIT);
    let r = h.apply(Command::ExpireSession(cmd::ExpireSession { session: b }));
    assert_eq!(grants(&r)[0].0, a);
    assert_eq!(holders(&h.table, "doc"), vec![(a, X)]);
}

#[test]
fn an_upgrade_respects_a_lock_delay_of_an_expired_reader() {
    let mut h = Harness::new();
    let a = h.open();
    let b = h.open_with(10_000, 500);
    let fa = h.grant(a, "doc", SH);
    h.grant(b, "doc", SH);
    h.upgrade(a, "doc", fa, WAIT);
    let r = h.apply(Command::ExpireSession(cmd::ExpireSession { session: b }));
    assert!(grants(&r).is_empty(), "not during b's lock-delay");
    let since = h.index;
    let r = h.apply(end_delay("doc", since));
    assert_eq!(grants(&r)[0].0, a);
}

#[test]
fn an_upgrade_alone_during_a_lock_delay_waits_for_its_end() {
    // The other reader expired before the upgrade asked: a is alone, but
    // the delay holds any new grant back, the upgrade's included.
    let mut h = Harness::new();
    let a = h.open();
    let b = h.open_with(10_000, 500);
    let fa = h.grant(a, "doc", SH);
    h.grant(b, "doc", SH);
    h.apply(Command::ExpireSession(cmd::ExpireSession { session: b }));
    let since = h.index;
    assert_eq!(
        h.upgrade(a, "doc", fa, TRY).reply,
        Reply::Acquire(Acquired::NotAcquired)
    );
    assert_eq!(
        h.upgrade(a, "doc", fa, WAIT).reply,
        Reply::Acquire(Acquired::Queued)
    );
    let r = h.apply(end_delay("doc", since));
    assert_eq!(grants(&r)[0].0, a);
    assert_eq!(holders(&h.table, "doc"), vec![(a, X)]);
}

#[test]
fn upgrades_and_downgrades_of_what_is_not_held_so_are_refused() {
    let mut h = Harness::new();
    let (a, b) = (h.open(), h.open());
    let fx = h.grant(a, "w", X);
    let fs = h.grant(b, "r", SH);
    let fsem = h.grant(a, "s", sem(1, 3));
    for (command, session, n, fence, mode) in [
        (up(a, 1_000, "w", fx, WAIT), a, "w", fx, "shared"),
        (
            up(b, 1_001, "r", Fence(fs.0 + 100), WAIT),
            b,
            "r",
            Fence(fs.0 + 100),
            "shared",
        ),
        (up(a, 1_002, "r", fs, WAIT), a, "r", fs, "shared"),
        (up(a, 1_003, "s", fsem, WAIT), a, "s", fsem, "shared"),
        (down(b, 1_004, "r", fs), b, "r", fs, "exclusive"),
        (down(a, 1_005, "s", fsem), a, "s", fsem, "exclusive"),
        (down(b, 1_006, "w", fx), b, "w", fx, "exclusive"),
    ] {
        assert_eq!(
            h.refuse(command),
            Refusal::NotHeldInMode {
                session,
                name: name(n),
                fence,
                mode: mode.into()
            }
        );
    }
    // Another identity's session, and a session that does not exist.
    let other = Command::Upgrade(cmd::Upgrade {
        session: b,
        seq: 1_007,
        name: name("r"),
        fence: fs,
        timeout_ms: WAIT,
        caller: "mallory".into(),
    });
    assert_eq!(h.refuse(other), Refusal::NotOwner { session: b });
    let ghost = SessionId(9_999);
    assert_eq!(
        h.refuse(down(ghost, 1, "w", fx)),
        Refusal::SessionNotFound { session: ghost }
    );
}

#[test]
fn a_downgrade_keeps_the_fence_and_lets_the_readers_behind_in() {
    let mut h = Harness::new();
    let (a, b, c, w) = (h.open(), h.open(), h.open(), h.open());
    let f = h.grant(a, "doc", X);
    h.queue(b, "doc", SH);
    h.queue(c, "doc", SH);
    h.queue(w, "doc", X);
    let r = h.downgrade(a, "doc", f);
    let seq = h.seq;
    assert_eq!(r.reply, Reply::Downgraded);
    assert_eq!(
        r.events[0],
        Event::Downgraded {
            name: name("doc"),
            session: a,
            fence: f
        }
    );
    let granted: Vec<SessionId> = grants(&r).iter().map(|g| g.0).collect();
    assert_eq!(granted, vec![b, c]);
    assert_eq!(holders(&h.table, "doc"), vec![(a, SH), (b, SH), (c, SH)]);
    assert_eq!(waiters(&h.table, "doc"), vec![(w, X)]);
    // Retried: the same answer, nothing more.
    assert_eq!(h.no_op(down(a, seq, "doc", f)), Reply::Downgraded);
    // The fence is the same grant: its release releases it.
    h.released(a, "doc", f);
}

#[test]
fn a_table_with_a_pending_upgrade_survives_a_snapshot() {
    let mut h = Harness::new();
    let (a, b) = (h.open(), h.open());
    let fa = h.grant(a, "doc", SH);
    let fb = h.grant(b, "doc", SH);
    h.upgrade(a, "doc", fa, WAIT);
    let bytes = h.table.to_snapshot();
    let back = LockTable::from_snapshot(&bytes).expect("decodes");
    assert_eq!(back, h.table);
    assert_eq!(
        back.waits().count(),
        1,
        "the leader re-arms the upgrade's timeout"
    );
    // A snapshot whose upgrade is grantable (its grant alone) is refused.
    let mut bad = h.table.clone();
    let lock = bad.locks.get_mut(&name("doc")).expect("lock");
    lock.holders.remove(&fb);
    lock.held_weight -= 1;
    bad.sessions.get_mut(&b).expect("b").held.clear();
    let err = LockTable::from_snapshot(&bad.to_snapshot()).expect_err("refused");
    assert!(
        err.to_string().contains("pending upgrade is grantable"),
        "{err}"
    );
}

#[test]
fn an_upgrade_that_would_make_a_queued_atomic_request_wait_for_its_own_waiter_is_refused() {
    // a reads "doc" alone; b's atomic request for "doc" (shared) and "z"
    // waits in both queues (c holds z); a waits for "other", which b
    // holds. Upgrading "doc" now would make b wait for a, and a already
    // waits for b: a deadlock, refused, and nothing changes.
    let mut h = Harness::new();
    let (a, b, c) = (h.open(), h.open(), h.open());
    let fa = h.grant(a, "doc", SH);
    h.grant(b, "other", X);
    h.grant(c, "z", X);
    let seq = h.next_seq();
    let r = h.apply(Command::AcquireAll(cmd::AcquireAll {
        session: b,
        seq,
        locks: vec![(name("doc"), SH), (name("z"), X)],
        timeout_ms: WAIT,
        value: Vec::new(),
        caller: String::new(),
    }));
    assert_eq!(r.reply, Reply::AcquiredAll(AcquiredAll::Queued));
    h.queue(a, "other", X);
    let seq = h.next_seq();
    match h.refuse(up(a, seq, "doc", fa, WAIT)) {
        Refusal::Deadlock { cycle } => {
            assert_eq!(cycle[0].session, a);
            assert!(cycle.iter().any(|e| e.session == b && e.blocker == a));
        }
        other => panic!("expected a deadlock, got {other:?}"),
    }
    // The same with a try.
    let seq = h.next_seq();
    assert!(matches!(
        h.refuse(up(a, seq, "doc", fa, TRY)),
        Refusal::Deadlock { .. }
    ));
}
