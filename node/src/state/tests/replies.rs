//! Exactly-once: remembered replies, retries, reused and forgotten seqs.

use super::*;

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
    let close = Command::CloseSession(cmd::CloseSession {
        session: a,
        seq: 9,
        caller: String::new(),
    });
    assert_eq!(h.apply(close.clone()).reply, Reply::Closed { released: 1 });
    assert_eq!(h.apply(close).reply, Reply::Closed { released: 1 });
}

#[test]
fn a_close_under_a_seq_used_by_another_request_is_refused() {
    // Review finding 7: every other request reusing a seq is refused; a
    // close under an acquire's seq closed the session.
    let mut h = Harness::new();
    let a = h.open();
    let fence = h.grant(a, "x", X);
    let used = h.seq;
    let close = Command::CloseSession(cmd::CloseSession {
        session: a,
        seq: used,
        caller: String::new(),
    });
    assert_eq!(
        h.refuse(close),
        Refusal::SequenceReused {
            session: a,
            seq: used
        }
    );
    assert_eq!(holders(&h.table, "x"), vec![(a, X)], "still held");
    // The same for a seq a release used, and for one the window forgot.
    let r = h.released(a, "x", fence);
    assert!(r.events.len() == 1);
    let close = Command::CloseSession(cmd::CloseSession {
        session: a,
        seq: h.seq,
        caller: String::new(),
    });
    assert!(matches!(h.refuse(close), Refusal::SequenceReused { .. }));
    for _ in 0..MAX_REMEMBERED_REPLIES + 1 {
        let fence = h.grant(a, "y", X);
        h.released(a, "y", fence);
    }
    let close = Command::CloseSession(cmd::CloseSession {
        session: a,
        seq: used,
        caller: String::new(),
    });
    assert!(matches!(h.refuse(close), Refusal::SequenceTooOld { .. }));
    // A fresh seq closes it.
    assert_eq!(h.close(a).reply, Reply::Closed { released: 0 });
}

#[test]
fn remembered_closes_are_forgotten_oldest_close_first() {
    // Review finding 7: the oldest *opened* session's close was forgotten
    // first. A long-lived session (a small id) closed after many
    // short-lived ones must still have its retried close answered.
    let mut h = Harness::new();
    let old = h.open();
    h.grant(old, "x", X);
    let young: Vec<SessionId> = (0..MAX_REMEMBERED_CLOSES)
        .map(|_| match h.apply_unchecked(open_cmd(10_000, 0, 0)).reply {
            Reply::Opened { session, .. } => session,
            other => panic!("open: {other:?}"),
        })
        .collect();
    let mut closes = Vec::new();
    for s in &young {
        let close = Command::CloseSession(cmd::CloseSession {
            session: *s,
            seq: h.next_seq(),
            caller: String::new(),
        });
        let r = h.apply_unchecked(close.clone());
        assert_eq!(r.reply, Reply::Closed { released: 0 });
        closes.push(close);
    }
    // Every one of them is remembered so far.
    assert_eq!(
        h.apply_unchecked(closes[0].clone()).reply,
        Reply::Closed { released: 0 }
    );
    let close = Command::CloseSession(cmd::CloseSession {
        session: old,
        seq: h.next_seq(),
        caller: String::new(),
    });
    assert_eq!(h.apply(close.clone()).reply, Reply::Closed { released: 1 });
    assert_eq!(
        h.apply(close).reply,
        Reply::Closed { released: 1 },
        "the newest close is remembered"
    );
    // The oldest close is the one forgotten.
    let first = young[0];
    assert_eq!(
        h.apply(closes[0].clone()).reply,
        Reply::Refused(Refusal::SessionNotFound { session: first })
    );
    assert_eq!(
        h.apply(closes[1].clone()).reply,
        Reply::Closed { released: 0 }
    );
    // The forgetting survives a snapshot: the next close still drops the
    // oldest remaining one.
    let mut t = LockTable::from_snapshot(&h.table.to_snapshot()).expect("snapshot");
    assert_eq!(t, h.table);
    let extra = match t.apply(h.index + 1, open_cmd(10_000, 0, 0)).reply {
        Reply::Opened { session, .. } => session,
        other => panic!("open: {other:?}"),
    };
    t.apply(
        h.index + 2,
        Command::CloseSession(cmd::CloseSession {
            session: extra,
            seq: 1,
            caller: String::new(),
        }),
    );
    assert!(matches!(
        t.apply(h.index + 3, closes[1].clone()).reply,
        Reply::Refused(Refusal::SessionNotFound { .. })
    ));
    assert_eq!(
        t.apply(h.index + 4, closes[2].clone()).reply,
        Reply::Closed { released: 0 }
    );
    assert_eq!(
        t.apply(
            h.index + 5,
            Command::CloseSession(cmd::CloseSession {
                session: old,
                seq: h.seq,
                caller: String::new()
            })
        )
        .reply,
        Reply::Closed { released: 1 }
    );
}
