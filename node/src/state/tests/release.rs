//! Releasing, cancelling a wait and withdrawing an acquire.

use super::*;

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

// ------------------------------------------------------------- TimeoutWait

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
        assert_eq!(h.no_op(wrong), Reply::WaitTimedOut { ended: false });
    }
    let r = h.apply(cancel(b, "x", bseq));
    assert_eq!(r.reply, Reply::WaitTimedOut { ended: true });
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
        Reply::WaitTimedOut { ended: false }
    );

    // A timer for an old wait leaves the session's newer wait alone.
    let newer = h.queue(b, "x", X);
    assert_eq!(
        h.no_op(cancel(b, "x", bseq)),
        Reply::WaitTimedOut { ended: false }
    );
    assert_eq!(waiters(&h.table, "x"), vec![(b, X)]);
    let r = h.apply(cancel(b, "x", newer));
    assert_eq!(r.reply, Reply::WaitTimedOut { ended: true });
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
        Reply::WaitTimedOut { ended: false }
    );
    assert_eq!(holders(&h.table, "x"), vec![(b, X)]);
}

// ---- Cancel: a client gives up on an acquire ----

fn withdraw(session: SessionId, seq: u64, name: &str) -> Command {
    Command::Cancel(cmd::Cancel {
        session,
        seq,
        name: LockName::new(name).expect("valid name"),
        caller: String::new(),
    })
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
    assert_eq!(r.reply, Reply::Cancelled { cancelled: true });
    assert!(r.events.iter().any(|e| matches!(
        e,
        Event::Cancelled { session, cause: CancelCause::Cancelled, .. } if *session == b
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
        Reply::Cancelled { cancelled: false }
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
    assert_eq!(r.reply, Reply::Cancelled { cancelled: false });
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
        Reply::Cancelled { cancelled: false }
    );
    assert_eq!(holders(&h.table, "x"), vec![(a, X)]);
    let r = h.apply(withdraw(a, a_seq, "x"));
    assert_eq!(r.reply, Reply::Cancelled { cancelled: true });
    assert_eq!(holders(&h.table, "x"), vec![(b, X)]);
    // Another identity cannot withdraw someone's acquire; an ended session
    // has nothing to withdraw.
    let mut t = LockTable::new();
    t.apply(
        1,
        Command::OpenSessionV0(cmd::OpenSessionV0 {
            ttl_ms: 10_000,
            lock_delay_ms: 0,
            nonce: 0,
            owner: "alice".into(),
        }),
    );
    let alice = SessionId(1);
    let r = t.apply(
        2,
        Command::Cancel(cmd::Cancel {
            session: alice,
            seq: 1,
            name: LockName::new("x").expect("valid name"),
            caller: "bob".into(),
        }),
    );
    assert_eq!(
        r.reply,
        Reply::Refused(Refusal::NotOwner { session: alice })
    );
    h.close(b);
    assert_eq!(
        h.no_op(withdraw(b, 1, "x")),
        Reply::Cancelled { cancelled: false }
    );
}
