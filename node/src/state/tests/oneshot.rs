//! The one-call `Lock` (open + acquire in one command), `Unlock` (a close
//! under `UNLOCK_SEQ`), sessions that end with their stream (the grace is
//! kept, the leader's timers use it) and changing a session's ttl.

use super::*;
use crate::state::{LOCK_SEQ, UNLOCK_SEQ};

fn lock_cmd(nonce: u64, name: &str, mode: Mode, timeout_ms: u64) -> Command {
    Command::Lock(cmd::Lock {
        open: cmd::OpenSession {
            ttl_ms: 10_000,
            lock_delay_ms: 0,
            nonce,
            owner: String::new(),
            end_on_disconnect_ms: 0,
        },
        name: LockName::new(name).expect("valid name"),
        mode,
        timeout_ms,
        value: Vec::new(),
    })
}

fn locked(r: &Response) -> (SessionId, Acquired) {
    match r.reply {
        Reply::Locked {
            session, outcome, ..
        } => (session, outcome),
        ref other => panic!("not a lock reply: {other:?}"),
    }
}

fn unlock(session: SessionId) -> Command {
    Command::CloseSession(cmd::CloseSession {
        session,
        seq: UNLOCK_SEQ,
        caller: String::new(),
    })
}

#[test]
fn a_lock_opens_a_session_and_grants_in_one_command_and_unlock_ends_it() {
    let mut h = Harness::new();
    let r = h.apply(lock_cmd(7, "x", X, TRY));
    let (s, outcome) = locked(&r);
    let Acquired::Granted { fence, .. } = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(
        s,
        SessionId(h.index),
        "the session id is the command's index"
    );
    assert_eq!(holders(&h.table, "x"), vec![(s, X)]);
    assert!(matches!(r.events[0], Event::SessionOpened { session, .. } if session == s));
    assert!(matches!(r.events[1], Event::Granted { fence: f, .. } if f == fence));
    // A retry (same nonce) is answered with the same grant, changing nothing.
    let retried = h.no_op(lock_cmd(7, "x", X, TRY));
    assert_eq!(
        retried,
        Reply::Locked {
            session: s,
            ttl_ms: 10_000,
            outcome
        }
    );
    // Unlock: release and close in one command; a retry is answered alike.
    assert_eq!(h.apply(unlock(s)).reply, Reply::Closed { released: 1 });
    assert_eq!(h.apply(unlock(s)).reply, Reply::Closed { released: 1 });
    assert!(h.table.describe(&name("x")).is_none());
    assert_eq!(h.table.sessions().count(), 0);
}

#[test]
fn a_lock_not_granted_at_once_leaves_no_session_behind() {
    let mut h = Harness::new();
    let a = h.open();
    h.grant(a, "x", X);
    let before = h.table.clone();
    let r = h.apply(lock_cmd(9, "x", X, TRY));
    assert_eq!(
        r.reply,
        Reply::Locked {
            session: SessionId(0),
            ttl_ms: 10_000,
            outcome: Acquired::NotAcquired
        }
    );
    assert!(r.events.is_empty(), "{:?}", r.events);
    assert_eq!(h.table, before, "no session, no nonce, nothing queued");
    // A refused acquire (a semaphore asked of a lock) leaves nothing too.
    let refused = h.refuse(lock_cmd(10, "x", sem(1, 2), WAIT));
    assert!(
        matches!(refused, Refusal::KindMismatch { .. }),
        "{refused:?}"
    );
}

#[test]
fn a_queued_lock_whose_wait_ends_without_a_grant_ends_its_session() {
    let mut h = Harness::new();
    let a = h.open();
    h.grant(a, "x", X);
    let r = h.apply(lock_cmd(11, "x", X, 5_000));
    let (s, outcome) = locked(&r);
    assert_eq!(outcome, Acquired::Queued);
    assert_eq!(waiters(&h.table, "x"), vec![(s, X)]);
    // The leader's timer runs out: the wait and the session go together.
    let r = h.apply(Command::TimeoutWait(cmd::TimeoutWait {
        session: s,
        name: LockName::new("x").expect("valid name"),
        seq: LOCK_SEQ,
    }));
    assert_eq!(r.reply, Reply::WaitTimedOut { ended: true });
    assert!(r
        .events
        .iter()
        .any(|e| matches!(e, Event::SessionEnded { session, expired: false } if *session == s)));
    assert!(h.table.sessions().all(|i| i.session != s));
    // Withdrawn (its caller went away): the same.
    let r = h.apply(lock_cmd(12, "x", X, WAIT));
    let (s2, _) = locked(&r);
    let r = h.apply(Command::Cancel(cmd::Cancel {
        session: s2,
        seq: LOCK_SEQ,
        name: LockName::new("x").expect("valid name"),
        caller: String::new(),
    }));
    assert_eq!(r.reply, Reply::Cancelled { cancelled: true });
    assert!(h.table.sessions().all(|i| i.session != s2));
}

#[test]
fn a_queued_lock_granted_later_keeps_its_session_like_any_other() {
    let mut h = Harness::new();
    let a = h.open();
    let fence = h.grant(a, "x", X);
    let (s, _) = locked(&h.apply(lock_cmd(13, "x", X, WAIT)));
    h.released(a, "x", fence);
    assert_eq!(holders(&h.table, "x"), vec![(s, X)]);
    // A retry now answers with the grant.
    let Reply::Locked { outcome, .. } = h.no_op(lock_cmd(13, "x", X, WAIT)) else {
        panic!()
    };
    assert!(matches!(outcome, Acquired::Granted { .. }), "{outcome:?}");
    // Released by an ordinary release, the session stays (it was granted).
    let held = h.table.describe(&name("x")).expect("held").holders[0].fence;
    h.released(s, "x", held);
    assert!(h.table.sessions().any(|i| i.session == s));
}

#[test]
fn a_session_keeps_its_disconnect_grace_and_its_ttl_can_change_once_per_seq() {
    let mut h = Harness::new();
    let r = h.apply(Command::OpenSession(cmd::OpenSession {
        ttl_ms: 30_000,
        lock_delay_ms: 0,
        nonce: 0,
        owner: String::new(),
        end_on_disconnect_ms: 300,
    }));
    let Reply::Opened { session: s, .. } = r.reply else {
        panic!("{:?}", r.reply)
    };
    assert_eq!(
        r.events,
        vec![Event::SessionOpened {
            session: s,
            ttl_ms: 30_000,
            end_on_disconnect_ms: 300
        }]
    );
    let info = h.table.sessions().find(|i| i.session == s).expect("open");
    assert_eq!((info.ttl_ms, info.end_on_disconnect_ms), (30_000, 300));
    let set = |seq, ttl_ms| {
        Command::SetTtl(cmd::SetTtl {
            session: s,
            seq,
            ttl_ms,
            caller: String::new(),
        })
    };
    let r = h.apply(set(5, 2_000));
    assert_eq!(r.reply, Reply::TtlSet { ttl_ms: 2_000 });
    assert_eq!(
        r.events,
        vec![Event::SessionTtlChanged {
            session: s,
            ttl_ms: 2_000
        }]
    );
    // A retry is answered alike and changes nothing; the seq reused for
    // another ttl is refused; a bad ttl is refused.
    assert_eq!(h.no_op(set(5, 2_000)), Reply::TtlSet { ttl_ms: 2_000 });
    assert!(matches!(
        h.refuse(set(5, 3_000)),
        Refusal::SequenceReused { .. }
    ));
    assert!(matches!(h.refuse(set(6, 10)), Refusal::InvalidTtl { .. }));
    assert!(matches!(
        h.refuse(Command::OpenSession(cmd::OpenSession {
            ttl_ms: 30_000,
            lock_delay_ms: 0,
            nonce: 0,
            owner: String::new(),
            end_on_disconnect_ms: MAX_END_ON_DISCONNECT_MS + 1
        })),
        Refusal::InvalidDisconnectGrace { .. }
    ));
    // Both survive a snapshot.
    let copy = LockTable::from_snapshot(&h.table.to_snapshot()).expect("decodes");
    let info = copy.sessions().find(|i| i.session == s).expect("open");
    assert_eq!((info.ttl_ms, info.end_on_disconnect_ms), (2_000, 300));
}

#[test]
fn commands_keep_their_place_in_the_log_encoding() {
    // The log holds commands in bincode, which writes a variant's position
    // first: new commands go at the end, and old entries still decode.
    let cases: Vec<(Command, u32)> = vec![
        (open_cmd(1_000, 0, 0), 0),
        (
            Command::CloseSession(cmd::CloseSession {
                session: SessionId(1),
                seq: 1,
                caller: String::new(),
            }),
            1,
        ),
        (acq(SessionId(1), 1, "x", X, TRY), 2),
        (rel(SessionId(1), 1, "x", Fence(1)), 3),
        (
            Command::ExpireSession(cmd::ExpireSession {
                session: SessionId(1),
            }),
            4,
        ),
        (cancel(SessionId(1), "x", 1), 5),
        (end_delay("x", 1), 6),
        (
            Command::Cancel(cmd::Cancel {
                session: SessionId(1),
                seq: 1,
                name: LockName::new("x").expect("valid name"),
                caller: String::new(),
            }),
            8,
        ),
        (
            Command::OpenSession(cmd::OpenSession {
                ttl_ms: 1_000,
                lock_delay_ms: 0,
                nonce: 0,
                owner: String::new(),
                end_on_disconnect_ms: 0,
            }),
            9,
        ),
        (lock_cmd(1, "x", X, TRY), 10),
        (
            Command::SetTtl(cmd::SetTtl {
                session: SessionId(1),
                seq: 1,
                ttl_ms: 1_000,
                caller: String::new(),
            }),
            11,
        ),
    ];
    for (command, position) in cases {
        let bytes = crate::codec::encode(&command).expect("encodes");
        assert_eq!(
            u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")),
            position,
            "{command:?}"
        );
        let back: Command = crate::codec::decode(&bytes).expect("decodes");
        assert_eq!(back, command);
    }
}
