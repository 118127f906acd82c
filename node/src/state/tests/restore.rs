//! Restoring a backup: parts, and never reusing ids, positions or fences.

use super::*;

// ---- Restoring a backup in parts ----

fn part(restore: u64, part: u32, parts: u32, bytes: &[u8]) -> Command {
    Command::RestorePart(cmd::RestorePart {
        restore,
        part,
        parts,
        bytes: bytes.to_vec(),
        fence_bump: DEFAULT_RESTORE_FENCE_BUMP,
    })
}

/// `restored` with the index floor, fence bump and restore record a
/// restore adds taken off again: the table the backup held.
fn as_backed_up(restored: &LockTable) -> LockTable {
    LockTable {
        index_floor: 0,
        last_fence: restored.last_fence - DEFAULT_RESTORE_FENCE_BUMP,
        restored: None,
        ..restored.clone()
    }
}

/// A backup of a small table: two sessions, a grant, a waiter.
fn small_backup() -> (LockTable, Vec<u8>) {
    let mut h = Harness::new();
    let a = h.open();
    let b = h.open();
    h.grant(a, "x", X);
    h.queue(b, "x", X);
    let bytes = h.table.to_snapshot();
    (h.table, bytes)
}

#[test]
fn a_backup_restored_in_parts_installs_on_the_last_part() {
    let (original, backup) = small_backup();
    let mut h = Harness::new();
    let chunks: Vec<&[u8]> = backup.chunks(backup.len() / 3 + 1).collect();
    let parts = chunks.len() as u32;
    assert_eq!(parts, 3);
    for (i, chunk) in chunks[..2].iter().enumerate() {
        let r = h.apply(part(7, i as u32, parts, chunk));
        assert_eq!(r.reply, Reply::RestorePartTaken { next: i as u32 + 1 });
        assert!(r.events.is_empty());
        assert_eq!(h.table.sessions().count(), 0, "nothing installed yet");
    }
    let r = h.apply(part(7, 2, parts, chunks[2]));
    assert_eq!(
        r.reply,
        Reply::Restored {
            sessions: 2,
            last_fence: original.last_fence().0 + DEFAULT_RESTORE_FENCE_BUMP
        }
    );
    assert!(h.table.index_floor > original.max_index() + RESTORE_INDEX_BUMP - 1);
    // The leader's timers hear of every session and wait.
    assert_eq!(
        r.events
            .iter()
            .filter(|e| matches!(e, Event::SessionOpened { .. }))
            .count(),
        2
    );
    assert!(r.events.iter().any(|e| matches!(e, Event::Queued { .. })));
    assert_eq!(as_backed_up(&h.table), original);
    // The table is not empty any more: a second restore is refused.
    assert_eq!(
        h.refuse(part(8, 0, 1, &backup)),
        Refusal::RestoreIntoNonEmpty
    );
}

#[test]
fn a_restore_retried_after_it_was_installed_is_answered_as_it_was() {
    // The answer to a restore's last part is lost when the leadership
    // moves just after the part commits (a 250,000-session restore keeps
    // the followers busy past their election timeout); the client retries
    // the whole restore with the same id, and is answered as the first
    // attempt was, whatever happened since, with nothing changed. Another
    // restore is still refused.
    let (_, backup) = small_backup();
    let (first, rest) = backup.split_at(backup.len() / 2);
    let mut h = Harness::new();
    h.apply(part(7, 0, 2, first));
    let installed = h.apply(part(7, 1, 2, rest)).reply;
    assert!(matches!(installed, Reply::Restored { sessions: 2, .. }));
    // Used since: a session opened, a grant.
    let c = h.open();
    h.grant(c, "y", X);
    let table = h.table.clone();
    for retry in [part(7, 0, 2, first), part(7, 1, 2, rest)] {
        let r = h.apply(retry);
        assert_eq!(r.reply, installed);
        assert!(r.events.is_empty());
        assert_eq!(h.table, table, "a retried restore changes nothing");
    }
    // A node that has the table from a snapshot answers the same.
    let mut from_snapshot = Harness::new();
    from_snapshot.table = LockTable::from_snapshot(&h.table.to_snapshot()).expect("decodes");
    assert_eq!(from_snapshot.apply(part(7, 0, 2, first)).reply, installed);
    assert_eq!(
        h.refuse(part(8, 0, 1, &backup)),
        Refusal::RestoreIntoNonEmpty
    );
}

#[test]
fn restore_parts_must_come_in_order_from_one_restore() {
    let (original, backup) = small_backup();
    let (first, rest) = backup.split_at(backup.len() / 2);
    let mut h = Harness::new();
    // A part with no restore under way.
    assert!(matches!(
        h.refuse(part(1, 1, 2, rest)),
        Refusal::InvalidRestorePart { .. }
    ));
    h.apply(part(1, 0, 2, first));
    // Another restore's part, a repeated part, a wrong count: refused, and
    // the restore under way is untouched.
    for bad in [
        part(2, 1, 2, rest),
        part(1, 2, 3, rest),
        part(1, 1, 3, rest),
    ] {
        assert!(
            matches!(h.refuse(bad.clone()), Refusal::InvalidRestorePart { .. }),
            "{bad:?}"
        );
    }
    // A bad last part is refused and the restore can still finish.
    assert!(matches!(
        h.refuse(part(1, 1, 2, b"garbage")),
        Refusal::InvalidBackup { .. }
    ));
    assert!(matches!(
        h.apply(part(1, 1, 2, rest)).reply,
        Reply::Restored { .. }
    ));
    assert_eq!(as_backed_up(&h.table), original);
}

#[test]
fn part_zero_replaces_an_abandoned_restore() {
    let (original, backup) = small_backup();
    let (first, rest) = backup.split_at(backup.len() / 2);
    let mut h = Harness::new();
    h.apply(part(1, 0, 2, b"stale beginning"));
    h.apply(part(2, 0, 2, first));
    assert!(matches!(
        h.refuse(part(1, 1, 2, rest)),
        Refusal::InvalidRestorePart { .. }
    ));
    h.apply(part(2, 1, 2, rest));
    assert_eq!(as_backed_up(&h.table), original);
}

#[test]
fn restore_part_bounds_are_checked_at_their_edges() {
    let mut h = Harness::new();
    // Numbering: parts ≥ 1, part < parts.
    for (p, parts) in [(0, 0), (1, 1), (5, 2)] {
        assert!(matches!(
            h.refuse(part(1, p, parts, b"")),
            Refusal::InvalidRestorePart { .. }
        ));
    }
    // Size of one part: MAX_RESTORE_PART is taken, one more byte is not.
    let r = h.apply(part(1, 0, 2, &vec![1; MAX_RESTORE_PART]));
    assert_eq!(r.reply, Reply::RestorePartTaken { next: 1 });
    assert!(matches!(
        h.refuse(part(1, 1, 2, &vec![1; MAX_RESTORE_PART + 1])),
        Refusal::InvalidRestorePart { .. }
    ));

    // The whole backup: up to MAX_RESTORE_BYTES is assembled (these zeros
    // then fail to decode), one byte more is refused before it is copied.
    let mut t = LockTable::new();
    t.restoring = Some(PendingRestore {
        restore: 9,
        next: 1,
        parts: 2,
        bytes: vec![0; MAX_RESTORE_BYTES - 1],
    });
    let r = t.apply(1, part(9, 1, 2, &[0, 0]));
    assert!(
        matches!(r.reply, Reply::Refused(Refusal::InvalidRestorePart { .. })),
        "{:?}",
        r.reply
    );
    assert_eq!(
        t.restoring.as_ref().map(|p| (p.next, p.bytes.len())),
        Some((1, MAX_RESTORE_BYTES - 1)),
        "the refusal changed nothing"
    );
    let r = t.apply(2, part(9, 1, 2, &[0]));
    assert!(
        matches!(r.reply, Reply::Refused(Refusal::InvalidBackup { .. })),
        "{:?}",
        r.reply
    );
    assert_eq!(
        t.restoring.as_ref().map(|p| (p.next, p.bytes.len())),
        Some((1, MAX_RESTORE_BYTES - 1))
    );
}

// ---- Restore never reuses ids, queue positions or fences ----

/// The review's backup: A holds `x`, B queues on it; in the backup's
/// cluster they were opened at indexes 2 and 3 (ids 2048 and 3072).
fn indexed_backup() -> (SessionId, SessionId, Vec<u8>) {
    let mut old = LockTable::new();
    let id = |r: &Response| match r.reply {
        Reply::Opened { session, .. } => session,
        ref other => panic!("open failed: {other:?}"),
    };
    let a = id(&old.apply(2048, open_cmd(60_000, 0, 11)));
    let b = id(&old.apply(3072, open_cmd(5_000, 0, 12)));
    old.apply(4096, acq(a, 1, "x", X, TRY));
    old.apply(5120, acq(b, 1, "x", X, WAIT));
    (a, b, old.to_snapshot())
}

/// Restores `backup` as one part at raw index 2048 (the new cluster's log
/// starts again near 0).
fn restore_at_2048(backup: &[u8]) -> LockTable {
    let mut t = LockTable::new();
    let r = t.apply(2048, part(1, 0, 1, backup));
    assert!(matches!(r.reply, Reply::Restored { .. }), "{:?}", r.reply);
    t
}

#[test]
fn a_session_opened_after_a_restore_never_takes_a_restored_id() {
    let (a, b, backup) = indexed_backup();
    let mut t = restore_at_2048(&backup);
    let r = t.apply(3072, open_cmd(10_000, 0, 99));
    let Reply::Opened { session: c, .. } = r.reply else {
        panic!("open failed: {:?}", r.reply)
    };
    assert!(c != a && c != b, "new session {c} reuses a restored id");
    assert!(c.0 > b.0, "ids keep growing across a restore");
    t.check_invariants()
        .expect("invariants hold after the restore");
    // The restored cluster can be backed up and restored again.
    let again = restore_at_2048(&t.to_snapshot());
    again
        .check_invariants()
        .expect("a backup of the restored cluster restores");
}

#[test]
fn a_restore_keeps_queue_order_and_never_grants_to_a_ghost() {
    let (a, b, backup) = indexed_backup();
    let mut t = restore_at_2048(&backup);
    let r = t.apply(4097, open_cmd(10_000, 0, 98));
    let Reply::Opened { session: c, .. } = r.reply else {
        panic!("open failed: {:?}", r.reply)
    };
    t.apply(4098, acq(c, 1, "x", X, WAIT));
    t.check_invariants().expect("queue order kept");
    // B (queued before the backup) expires, then A: C is next, not B.
    t.apply(
        6144,
        Command::ExpireSession(cmd::ExpireSession { session: b }),
    );
    t.apply(
        7168,
        Command::ExpireSession(cmd::ExpireSession { session: a }),
    );
    let info = t.describe(&name("x")).expect("x is held");
    assert_eq!(
        info.holders.iter().map(|h| h.session).collect::<Vec<_>>(),
        vec![c],
        "x must pass to C, the only waiter left"
    );
    t.check_invariants().expect("invariants hold");
}

#[test]
fn fences_after_a_restore_start_above_what_the_old_cluster_may_have_issued() {
    let (a, _b, backup) = indexed_backup();
    let backup_fence = LockTable::from_snapshot(&backup)
        .expect("decodes")
        .last_fence()
        .0;
    let mut t = restore_at_2048(&backup);
    let r = t.apply(3072, rel(a, 2, "x", Fence(1)));
    assert_eq!(r.reply, Reply::Released { released: true });
    // B was queued, so the release granted it; its fence must be above any
    // fence the old cluster could have issued after the backup (within the
    // default bump).
    let fence = t.describe(&name("x")).expect("held").holders[0].fence.0;
    assert!(
        fence > backup_fence + (1 << 32),
        "fence {fence} after a restore of a backup at {backup_fence} could repeat one the old cluster issued"
    );
}

#[test]
fn apply_refuses_instead_of_panicking_on_a_broken_table() {
    // A session whose nonce index points at nothing, a grant the lock does
    // not have: tables no apply makes, but a bug or a bad backup could.
    let mut h = Harness::new();
    let a = h.open();
    let fence = h.grant(a, "x", X);
    h.table.nonces.insert(77, SessionId(999_999));
    let r = h.table.apply(100, open_cmd(10_000, 0, 77));
    assert!(matches!(r.reply, Reply::Refused(_)), "{:?}", r.reply);
    h.table.nonces.remove(&77);
    h.table.locks.clear();
    let r = h.table.apply(101, rel(a, 50, "x", fence));
    assert!(matches!(r.reply, Reply::Refused(_)), "{:?}", r.reply);
}

#[test]
fn a_backup_in_the_previous_format_still_restores() {
    use serde::Serialize;

    // Format 2's layout: no index floor, no remembered closes, replies
    // without digests.
    #[derive(Serialize)]
    struct V2Replies {
        map: BTreeMap<u64, Reply>,
        floor: Option<u64>,
    }
    #[derive(Serialize)]
    struct V2Session {
        ttl_ms: u64,
        lock_delay_ms: u64,
        nonce: u64,
        owner: String,
        held: BTreeMap<LockName, Fence>,
        waiting: BTreeMap<LockName, WaitRef>,
        replies: V2Replies,
    }
    #[derive(Serialize)]
    struct V2Table<'a> {
        sessions: BTreeMap<SessionId, V2Session>,
        locks: &'a BTreeMap<LockName, crate::state::table::Lock>,
        nonces: &'a BTreeMap<u64, SessionId>,
        last_fence: u64,
        restoring: Option<PendingRestore>,
    }
    let (original, _) = small_backup();
    let v2 = V2Table {
        sessions: original
            .sessions
            .iter()
            .map(|(id, s)| {
                let session = V2Session {
                    ttl_ms: s.ttl_ms,
                    lock_delay_ms: s.lock_delay_ms,
                    nonce: s.nonce,
                    owner: s.owner.clone(),
                    held: s.held.clone(),
                    waiting: s.waiting.clone(),
                    replies: V2Replies {
                        map: s
                            .replies
                            .map
                            .iter()
                            .map(|(seq, r)| (*seq, r.reply.clone()))
                            .collect(),
                        floor: s.replies.floor,
                    },
                };
                (*id, session)
            })
            .collect(),
        locks: &original.locks,
        nonces: &original.nonces,
        last_fence: original.last_fence,
        restoring: None,
    };
    let mut bytes = vec![crate::state::view::SNAPSHOT_VERSION_2];
    crate::codec::encode_into(&mut bytes, &v2).expect("encodes");
    let upgraded = LockTable::from_snapshot(&bytes).expect("decodes");
    // The same table, its replies' digests unknown (any retry matches).
    assert_eq!(
        upgraded.sessions.keys().collect::<Vec<_>>(),
        original.sessions.keys().collect::<Vec<_>>()
    );
    assert_eq!(upgraded.locks, original.locks);
    assert_eq!(upgraded.last_fence, original.last_fence);
    assert!(upgraded
        .sessions
        .values()
        .flat_map(|s| s.replies.map.values())
        .all(|r| r.digest == 0));
    let mut h = Harness::new();
    assert!(matches!(
        h.apply(part(3, 0, 1, &bytes)).reply,
        Reply::Restored { .. }
    ));
    let err = LockTable::from_snapshot(&[9, 0, 0]).expect_err("unknown version");
    assert!(err.to_string().contains("reads 2 to 6"), "{err}");
}

// ---- Fences never wrap ----

/// The documented fence bound (2^63 - 1, PostgreSQL's largest `bigint`).
const FENCE_BOUND: u64 = (1 << 63) - 1;
const _: () = assert!(FENCE_BOUND == MAX_FENCE);

/// `small_backup` restored with `bump`: the reply and the harness.
fn restore_small_with_bump(bump: u64) -> (Reply, Harness) {
    let (_, backup) = small_backup();
    let mut h = Harness::new();
    let r = h.apply(Command::RestorePart(cmd::RestorePart {
        restore: 1,
        part: 0,
        parts: 1,
        bytes: backup,
        fence_bump: bump,
    }));
    (r.reply, h)
}

#[test]
fn a_restore_whose_bump_would_pass_the_fence_bound_is_refused() {
    // The review's reproduction: `--fence-bump 18446744073709551614` took
    // the counter to u64::MAX and the next grants got fences 0, 1, ...
    for bump in [u64::MAX - 1, u64::MAX, FENCE_BOUND] {
        // Refused in the apply too (a leader's API checks it first).
        let (reply, h) = restore_small_with_bump(bump);
        assert_eq!(
            reply,
            Reply::Refused(Refusal::FenceBumpTooLarge {
                last_fence: 1,
                fence_bump: bump
            }),
            "bump {bump} over a backup at fence 1"
        );
        assert_eq!(
            h.table,
            LockTable::new(),
            "a refused restore changed nothing"
        );
    }
}

#[test]
fn at_the_fence_bound_grants_stop_instead_of_wrapping() {
    // The backup's counter is 1 (A holds x with fence 1, B waits): a bump
    // of BOUND - 2 leaves exactly one fence to hand out.
    let (reply, mut h) = restore_small_with_bump(FENCE_BOUND - 2);
    assert!(matches!(reply, Reply::Restored { .. }), "{reply:?}");
    let holder = h.table.describe(&name("x")).expect("x").holders[0].session;
    let c = h.open();
    let last = h.grant(c, "y", X);
    assert_eq!(
        last,
        Fence(FENCE_BOUND),
        "the last fence is the bound itself"
    );
    // No fence is left: a new acquire is refused and changes nothing.
    let seq = h.next_seq();
    assert_eq!(
        h.refuse(acq(c, seq, "z", X, WAIT)),
        Refusal::FencesExhausted
    );
    let seq = h.next_seq();
    assert_eq!(h.refuse(acq(c, seq, "z", X, TRY)), Refusal::FencesExhausted);
    // Releasing x cannot grant B (no fence left): B's wait ends without a
    // grant, and nothing ever gets a fence at or below one in use.
    let r = h.release(holder, "x", Fence(1));
    assert_eq!(r.reply, Reply::Released { released: true });
    assert!(
        grants(&r).is_empty(),
        "granted past the bound: {:?}",
        r.events
    );
    assert!(
        r.events
            .iter()
            .any(|e| matches!(e, Event::Cancelled { name: n, cause: CancelCause::FencesExhausted, .. } if n.as_str() == "x")),
        "the waiter behind x is told it will not be granted: {:?}",
        r.events
    );
    assert_eq!(h.table.last_fence(), Fence(FENCE_BOUND));
    // A snapshot of the table still decodes (the node can restart).
    LockTable::from_snapshot(&h.table.to_snapshot()).expect("snapshot decodes");
}

proptest::proptest! {
    /// Near the top of the counter, whatever the backup's counter and the
    /// bump: the restore is refused, or every later grant is above every
    /// fence before it and within the bound, and the table stays valid.
    #[test]
    fn fences_near_the_bound_only_grow(
        backup_fence in proptest::prop_oneof![0u64..4, (FENCE_BOUND - 4)..=FENCE_BOUND, (u64::MAX - 4)..=u64::MAX],
        bump in proptest::prop_oneof![0u64..4, (FENCE_BOUND - 4)..=FENCE_BOUND, (u64::MAX - 4)..=u64::MAX],
        grants_after in 1usize..6,
    ) {
        let mut old = Harness::new();
        let a = old.open();
        old.grant(a, "held", X);
        old.table.last_fence = old.table.last_fence.max(backup_fence);
        let backup = old.table.to_snapshot();
        let mut h = Harness::new();
        let r = h.apply_unchecked(Command::RestorePart(cmd::RestorePart { restore: 1, part: 0, parts: 1, bytes: backup, fence_bump: bump }));
        proptest::prop_assert!(h.table.check_invariants().is_ok());
        if matches!(r.reply, Reply::Refused(_)) {
            proptest::prop_assert_eq!(&h.table, &LockTable::new());
            return Ok(());
        }
        proptest::prop_assert!(h.table.last_fence().0 <= FENCE_BOUND);
        let c = h.open();
        let mut last = h.table.last_fence();
        for i in 0..grants_after {
            let r = h.acquire(c, &format!("n{i}"), X, WAIT);
            match r.reply {
                Reply::Acquire(Acquired::Granted { fence, .. }) => {
                    proptest::prop_assert!(fence > last && fence.0 <= FENCE_BOUND);
                    last = fence;
                }
                Reply::Refused(Refusal::FencesExhausted) => {
                    proptest::prop_assert_eq!(last.0, FENCE_BOUND)
                }
                other => proptest::prop_assert!(false, "unexpected {:?}", other),
            }
        }
    }
}

// ---- The default fence bump ----

/// The default bump puts new fences 2^32 above the restore's time in
/// microseconds (the time floor): a later restore, of the same file or
/// another, starts above everything a cluster restored earlier handed out
/// at fewer than a million grants a second; restoring a restored cluster's
/// backup does not climb above its own time floor (so an older backup
/// restored after it starts above its fences); a clock behind the backup's
/// stamp, or a backup without one, also gets the old 2^32; nothing
/// overflows.
#[test]
fn the_default_fence_bump_starts_at_the_restores_time_floor() {
    let created = 1_764_000_000;
    let t1 = (created + 60) * 1_000_000;
    let last = 1_000;
    let counter = |last: u64, now: u64| last + default_restore_fence_bump(last, Some(created), now);
    assert_eq!(counter(last, t1), t1 + DEFAULT_RESTORE_FENCE_BUMP);
    // A cluster restored at t1 that grants at the bound for a second...
    let reached = counter(last, t1) + RESTORE_FENCES_PER_SECOND;
    // ...is behind a restore of the same backup a second and a microsecond
    // later, and behind the restore of its own backup taken then, which
    // starts at that time floor too, not 2^32 above its counter.
    let t2 = t1 + 1_000_001;
    assert!(counter(last, t2) > reached);
    assert_eq!(counter(reached, t2), t2 + DEFAULT_RESTORE_FENCE_BUMP);
    // So the original backup restored after that chain starts above it.
    let chained = counter(reached, t2) + RESTORE_FENCES_PER_SECOND;
    let t3 = t2 + 1_000_001;
    assert!(counter(last, t3) > chained);
    // A counter at or past the floor (clocks that disagree) still moves on.
    assert_eq!(default_restore_fence_bump(t1 * 2, Some(created), t1), 1);
    // A clock behind the backup's stamp, or no stamp: at least 2^32.
    let behind = created * 1_000_000 - 1;
    assert_eq!(
        default_restore_fence_bump(behind * 4, Some(created), behind),
        DEFAULT_RESTORE_FENCE_BUMP
    );
    assert_eq!(
        default_restore_fence_bump(t1 * 2, None, t1),
        DEFAULT_RESTORE_FENCE_BUMP
    );
    assert!(counter(last, t1) < MAX_FENCE / 1000);
    assert_eq!(
        default_restore_fence_bump(0, Some(0), u64::MAX),
        u64::MAX,
        "saturates"
    );
}
