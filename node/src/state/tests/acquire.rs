//! Acquiring: exclusive and shared modes, semaphores, fences, re-acquire.

use super::*;

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
