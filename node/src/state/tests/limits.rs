//! Every limit at its edge.

use super::*;

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
        end_on_disconnect_ms: 0,
        lock_pending: false,
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
