//! Sessions: open, close, expiry and lock-delay; sessions bound to the identity that opened them.

use super::*;

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
            ttl_ms: 5_000,
            end_on_disconnect_ms: 0,
        }]
    );
    assert_eq!(
        t.session(SessionId(7)),
        Some(SessionInfo {
            session: SessionId(7),
            ttl_ms: 5_000,
            lock_delay_ms: 250,
            end_on_disconnect_ms: 0,
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
            ttl_ms: 5_000,
            end_on_disconnect_ms: 0,
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
