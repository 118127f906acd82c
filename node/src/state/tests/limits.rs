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
    // A name that breaks the rules cannot be made, and a log entry or
    // snapshot that holds one does not decode: the name is checked once,
    // where it enters, and the table never sees it.
    for (bad, len) in [
        (too_long.as_str(), MAX_NAME_LEN + 1),
        (too_wide.as_str(), MAX_NAME_LEN + 2),
        ("", 0),
    ] {
        assert_eq!(LockName::new(bad), Err(Refusal::InvalidName { len }));
        let seq = h.next_seq();
        for command in [
            acq(a, seq, "x", X, WAIT),
            rel(a, seq, "x", f),
            cancel(a, "x", 1),
            end_delay("x", 1),
        ] {
            let bytes = with_name(&command, "x", bad);
            let decoded = crate::codec::decode::<Command>(&bytes);
            let err = decoded.expect_err("a bad name must not decode").to_string();
            assert!(err.contains("lock name must be"), "{err}");
            // The same bytes with a good name decode to the command.
            assert_eq!(
                crate::codec::decode::<Command>(&with_name(&command, "x", "x")).expect("decodes"),
                command
            );
        }
    }
    assert_eq!(
        LockName::new("n".repeat(MAX_NAME_LEN)).unwrap().as_str(),
        longest
    );
    h.released(a, &longest, f);
}

/// `command`'s bincode with the name `from` (the only string of that
/// length and content in it) replaced by `to`.
fn with_name(command: &Command, from: &str, to: &str) -> Vec<u8> {
    let bytes = crate::codec::encode(command).expect("encodes");
    let mut needle = (from.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(from.as_bytes());
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the name is in the encoding");
    let mut out = bytes[..at].to_vec();
    out.extend_from_slice(&(to.len() as u64).to_le_bytes());
    out.extend_from_slice(to.as_bytes());
    out.extend_from_slice(&bytes[at + needle.len()..]);
    out
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
    let r = h.apply(Command::ExpireSession(cmd::ExpireSession { session: a }));
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
    table.usage = Usage::of(table);
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
    h.table.usage = Usage::of(&h.table);
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
    h.apply_unchecked(Command::ExpireSession(cmd::ExpireSession {
        session: SessionId(1),
    }));
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

/// A session opened by identity `owner`.
fn open_as(h: &mut Harness, owner: &str) -> Result<SessionId, Refusal> {
    let r = h.apply_unchecked(Command::OpenSession(cmd::OpenSession {
        ttl_ms: 10_000,
        lock_delay_ms: 0,
        nonce: 0,
        owner: owner.into(),
        end_on_disconnect_ms: 0,
    }));
    match r.reply {
        Reply::Opened { session, .. } => Ok(session),
        Reply::Refused(refusal) => {
            assert!(r.events.is_empty());
            Err(refusal)
        }
        other => panic!("{other:?}"),
    }
}

/// An acquire of `name` by `owner`'s `session`: granted, or refused.
fn acq_as(h: &mut Harness, owner: &str, session: SessionId, name: &str) -> Result<(), Refusal> {
    let seq = h.next_seq();
    let r = h.apply_unchecked(Command::Acquire(cmd::Acquire {
        session,
        seq,
        name: LockName::new(name).expect("a name"),
        mode: X,
        timeout_ms: TRY,
        value: Vec::new(),
        caller: owner.into(),
    }));
    match r.reply {
        Reply::Acquire(Acquired::Granted { .. }) => Ok(()),
        Reply::Refused(refusal) => {
            assert!(r.events.is_empty());
            Err(refusal)
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn sessions_per_identity_edge() {
    let mut h = Harness::new();
    // One identity has MAX_SESSIONS_PER_IDENTITY - 1 sessions.
    for _ in 1..MAX_SESSIONS_PER_IDENTITY {
        open_as(&mut h, "app").expect("within the limit");
    }
    // The last one is given, the next refused; another identity, and the
    // anonymous caller of a cluster without access control, still open.
    open_as(&mut h, "app").expect("the last one");
    assert_eq!(
        open_as(&mut h, "app"),
        Err(Refusal::IdentityLimit {
            identity: "app".into(),
            what: "open sessions".into(),
            max: MAX_SESSIONS_PER_IDENTITY,
        })
    );
    let other = open_as(&mut h, "billing").expect("another identity");
    open_as(&mut h, "").expect("no access control: only the cluster's limit");
    h.table.check_invariants().unwrap();
    // A one-call Lock opens a session too.
    let r = h.apply_unchecked(Command::Lock(cmd::Lock {
        open: cmd::OpenSession {
            ttl_ms: 10_000,
            lock_delay_ms: 0,
            nonce: 5,
            owner: "app".into(),
            end_on_disconnect_ms: 0,
        },
        name: name("free"),
        mode: X,
        timeout_ms: TRY,
        value: Vec::new(),
    }));
    assert!(
        matches!(r.reply, Reply::Refused(Refusal::IdentityLimit { .. })),
        "{r:?}"
    );
    assert!(h.table.describe(&name("free")).is_none());
    // Ending one of its sessions makes room.
    let first = h.table.sessions.keys().next().copied().expect("a session");
    h.apply_unchecked(Command::ExpireSession(cmd::ExpireSession {
        session: first,
    }));
    open_as(&mut h, "app").expect("room again");
    acq_as(&mut h, "billing", other, "b").expect("unaffected");
    h.table.check_invariants().unwrap();
}

#[test]
fn entries_edge() {
    let mut h = Harness::new();
    let a = open_as(&mut h, "").expect("a");
    let b = open_as(&mut h, "").expect("b");
    acq_as(&mut h, "", b, "busy").expect("held");
    // Pretend the rest of the table holds all but two of MAX_ENTRIES (the
    // count is what the limit reads; building two million entries is not
    // what this test is about).
    let have = h.table.usage.total.entries;
    h.table.usage.pretend(
        "",
        Counts {
            sessions: 0,
            entries: MAX_ENTRIES as u64 - 2 - have,
        },
    );
    // A grant, then a queued wait, take the last two entries...
    acq_as(&mut h, "", a, "x").expect("the second to last");
    let seq = h.next_seq();
    assert_eq!(
        h.apply_unchecked(acq(a, seq, "busy", X, WAIT)).reply,
        Reply::Acquire(Acquired::Queued)
    );
    assert_eq!(h.table.usage.total.entries, MAX_ENTRIES as u64);
    // ... the next is refused, a try and a wait alike, and an atomic
    // request of any size.
    assert_eq!(acq_as(&mut h, "", a, "y"), Err(Refusal::TooManyEntries));
    let seq = h.next_seq();
    assert_eq!(
        h.refuse_unchecked(acq(b, seq, "x", X, WAIT)),
        Refusal::TooManyEntries
    );
    let seq = h.next_seq();
    assert_eq!(
        h.refuse_unchecked(Command::AcquireAll(cmd::AcquireAll {
            session: b,
            seq,
            locks: vec![(name("p"), X), (name("q"), X)],
            timeout_ms: TRY,
            value: Vec::new(),
            caller: String::new(),
        })),
        Refusal::TooManyEntries
    );
    // A release makes room, and a grant to a waiter needs none (its wait
    // was an entry already).
    let seq = h.next_seq();
    let released = h.apply_unchecked(Command::Release(cmd::Release {
        session: a,
        seq,
        name: name("x"),
        fence: h.table.describe(&name("x")).expect("held").holders[0].fence,
        caller: String::new(),
    }));
    assert_eq!(released.reply, Reply::Released { released: true });
    acq_as(&mut h, "", a, "y").expect("room again");
    h.apply_unchecked(Command::CloseSession(cmd::CloseSession {
        session: b,
        seq: 999,
        caller: String::new(),
    }));
    // B's grant ended; A's wait for it became a grant.
    assert_eq!(h.table.usage.total.entries, MAX_ENTRIES as u64 - 1);
    assert!(matches!(
        h.table.standing(a, &name("busy")),
        Acquired::Granted { .. }
    ));
}

#[test]
fn entries_per_identity_edge() {
    let mut h = Harness::new();
    let a = open_as(&mut h, "app").expect("a");
    let other = open_as(&mut h, "billing").expect("other");
    // Pretend another session of the identity holds all but one.
    h.table.usage.pretend(
        "app",
        Counts {
            sessions: 1,
            entries: MAX_ENTRIES_PER_IDENTITY as u64 - 1,
        },
    );
    acq_as(&mut h, "app", a, "x").expect("the last one");
    assert_eq!(
        acq_as(&mut h, "app", a, "y"),
        Err(Refusal::IdentityLimit {
            identity: "app".into(),
            what: "grants and queued requests".into(),
            max: MAX_ENTRIES_PER_IDENTITY,
        })
    );
    acq_as(&mut h, "billing", other, "y").expect("another identity");
}
