//! Revoking a session: an administrator's expiry, through the log.

use super::*;

fn revoke(session: SessionId) -> Command {
    Command::RevokeSession(cmd::RevokeSession {
        session,
        by: "ops".into(),
        at_unix_ms: 1_764_000_000_000,
    })
}

#[test]
fn revoke_ends_grants_with_lock_delay_withdraws_waits_and_hands_the_lock_on() {
    let mut h = Harness::new();
    let a = h.open_with(10_000, 2_000);
    let b = h.open();
    let c = h.open();
    let fa = h.grant(a, "x", X);
    h.grant(c, "y", X);
    let aseq = h.queue(a, "y", X);
    let bseq = h.queue(b, "x", X);

    let r = h.apply(revoke(a));
    let since = h.index;
    assert_eq!(r.reply, Reply::Revoked { released: 1 });
    assert_eq!(
        r.events,
        vec![
            Event::SessionRevoked {
                session: a,
                by: "ops".into(),
                at_unix_ms: 1_764_000_000_000,
            },
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
                fence: fa,
                mode: X,
                cause: EndCause::Revoked
            },
            Event::LockDelayStarted {
                name: name("x"),
                delay_ms: 2_000,
                since
            },
            Event::SessionEnded {
                session: a,
                expired: false
            },
        ]
    );
    assert_eq!(h.table.session(a), None);
    assert_eq!(waiters(&h.table, "y"), vec![]);
    // Lock-delay holds the waiter back, as after an expiry.
    assert!(h.table.describe(&name("x")).unwrap().lock_delayed);
    assert_eq!(waiters(&h.table, "x"), vec![(b, X)]);
    let r = h.apply(end_delay("x", since));
    let fb = h.table.last_fence();
    assert!(fb > fa, "the next holder's fence must be larger");
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
    // The revoked holder's fence is no longer a holder's.
    assert!(!h.table.check_fence(&name("x"), fa).0);
}

#[test]
fn revoke_without_lock_delay_grants_the_next_waiter_at_once() {
    let mut h = Harness::new();
    let a = h.open();
    let b = h.open();
    let fa = h.grant(a, "x", X);
    let bseq = h.queue(b, "x", X);
    let r = h.apply(revoke(a));
    let fb = h.table.last_fence();
    assert!(fb > fa);
    assert_eq!(
        r.events.last(),
        Some(&Event::Granted {
            name: name("x"),
            session: b,
            seq: bseq,
            fence: fb,
            mode: X
        })
    );
    assert_eq!(holders(&h.table, "x"), vec![(b, X)]);
}

#[test]
fn a_second_revoke_or_an_unknown_or_zero_session_is_refused_and_changes_nothing() {
    let mut h = Harness::new();
    let a = h.open();
    h.grant(a, "x", X);
    assert_eq!(h.apply(revoke(a)).reply, Reply::Revoked { released: 1 });
    // Idempotent in effect: the second finds nothing to end.
    assert_eq!(h.refuse(revoke(a)), Refusal::SessionNotFound { session: a });
    assert_eq!(
        h.refuse(revoke(SessionId(999))),
        Refusal::SessionNotFound {
            session: SessionId(999)
        }
    );
    let zero = Command::RevokeSession(cmd::RevokeSession {
        session: SessionId(0),
        by: String::new(),
        at_unix_ms: 0,
    });
    assert_eq!(
        zero.validate(),
        Err(Refusal::SessionNotFound {
            session: SessionId(0)
        })
    );
    h.refuse(zero);
}

#[test]
fn revoke_checks_the_length_of_who_asked_at_the_edge() {
    let mut h = Harness::new();
    let a = h.open();
    let at = |len: usize| {
        Command::RevokeSession(cmd::RevokeSession {
            session: a,
            by: "o".repeat(len),
            at_unix_ms: 0,
        })
    };
    assert_eq!(
        h.refuse(at(MAX_OWNER_LEN + 1)),
        Refusal::InvalidOwner {
            len: MAX_OWNER_LEN + 1
        }
    );
    assert_eq!(
        h.apply(at(MAX_OWNER_LEN)).reply,
        Reply::Revoked { released: 0 }
    );
}
