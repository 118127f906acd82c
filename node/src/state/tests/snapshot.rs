//! Snapshots: round trips, versions, corrupt input.

use super::*;

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
    h.apply(Command::ExpireSession(cmd::ExpireSession { session: c }));
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
        Command::ExpireSession(cmd::ExpireSession { session: b }),
        Command::CloseSession(cmd::CloseSession {
            session: a,
            seq: 92,
            caller: String::new(),
        }),
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

#[test]
fn a_snapshot_in_format_3_still_decodes_and_its_closes_are_forgotten_first() {
    use serde::Serialize;

    // Format 3's layout: remembered closes without a close index, sessions
    // without a disconnect grace or a pending one-call lock.
    #[derive(Serialize)]
    struct V3Closed<'a> {
        seq: u64,
        released: u32,
        owner: &'a str,
    }
    #[derive(Serialize)]
    struct V3Session<'a> {
        ttl_ms: u64,
        lock_delay_ms: u64,
        nonce: u64,
        owner: &'a str,
        held: &'a BTreeMap<LockName, Fence>,
        waiting: &'a BTreeMap<LockName, WaitRef>,
        replies: &'a crate::state::table::Replies,
    }
    #[derive(Serialize)]
    struct V3Table<'a> {
        sessions: BTreeMap<SessionId, V3Session<'a>>,
        locks: &'a BTreeMap<LockName, crate::state::table::Lock>,
        nonces: &'a BTreeMap<u64, SessionId>,
        last_fence: u64,
        restoring: Option<PendingRestore>,
        index_floor: u64,
        closed: BTreeMap<SessionId, V3Closed<'a>>,
    }
    let mut h = busy_harness();
    let gone = h.open();
    let close = Command::CloseSession(cmd::CloseSession {
        session: gone,
        seq: h.next_seq(),
        caller: String::new(),
    });
    assert_eq!(h.apply(close.clone()).reply, Reply::Closed { released: 0 });
    let t = &h.table;
    let v3 = V3Table {
        sessions: t
            .sessions
            .iter()
            .map(|(id, s)| {
                let old = V3Session {
                    ttl_ms: s.ttl_ms,
                    lock_delay_ms: s.lock_delay_ms,
                    nonce: s.nonce,
                    owner: &s.owner,
                    held: &s.held,
                    waiting: &s.waiting,
                    replies: &s.replies,
                };
                (*id, old)
            })
            .collect(),
        locks: &t.locks,
        nonces: &t.nonces,
        last_fence: t.last_fence,
        restoring: None,
        index_floor: t.index_floor,
        closed: t
            .closed
            .iter()
            .map(|(id, c)| {
                let old = V3Closed {
                    seq: c.seq,
                    released: c.released,
                    owner: &c.owner,
                };
                (*id, old)
            })
            .collect(),
    };
    let mut bytes = vec![crate::state::view::SNAPSHOT_VERSION_3];
    crate::codec::encode_into(&mut bytes, &v3).expect("encodes");
    let mut upgraded = LockTable::from_snapshot(&bytes).expect("decodes");
    assert_eq!(upgraded.sessions, t.sessions);
    assert_eq!(upgraded.locks, t.locks);
    assert_eq!(upgraded.last_fence, t.last_fence);
    assert_eq!(
        upgraded.closed[&gone].index, 0,
        "no close index in format 3"
    );
    // The retried close is still answered like the first.
    let next = h.index + 1;
    assert_eq!(
        upgraded.apply(next, close).reply,
        Reply::Closed { released: 0 }
    );
    // Written again, it is format 4 and round-trips.
    let again = upgraded.to_snapshot();
    assert_eq!(again[0], SNAPSHOT_VERSION);
    assert_eq!(LockTable::from_snapshot(&again).expect("decodes"), upgraded);
}
