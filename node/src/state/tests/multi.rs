//! Atomic requests for several names: all or none, FIFO in every queue.

use super::*;

fn all(session: SessionId, seq: u64, locks: &[(&str, Mode)], timeout_ms: u64) -> Command {
    Command::AcquireAll(cmd::AcquireAll {
        session,
        seq,
        locks: locks.iter().map(|(n, m)| (name(n), *m)).collect(),
        timeout_ms,
        value: Vec::new(),
        caller: String::new(),
    })
}

fn granted_all(r: &Response) -> Vec<(Fence, Mode)> {
    match &r.reply {
        Reply::AcquiredAll(AcquiredAll::Granted { grants, .. }) => grants.clone(),
        other => panic!("expected all granted, got {other:?}"),
    }
}

impl Harness {
    fn acquire_all(
        &mut self,
        session: SessionId,
        locks: &[(&str, Mode)],
        timeout_ms: u64,
    ) -> Response {
        let seq = self.next_seq();
        self.apply(all(session, seq, locks, timeout_ms))
    }
}

#[test]
fn free_names_are_granted_at_once_in_order() {
    let mut h = Harness::new();
    let a = h.open();
    let r = h.acquire_all(a, &[("x", X), ("y", SH), ("s", sem(2, 3))], WAIT);
    let grants = granted_all(&r);
    assert_eq!(grants.len(), 3);
    assert!(
        grants.windows(2).all(|w| w[0].0 < w[1].0),
        "fences in order"
    );
    assert_eq!(grants[2].1, sem(2, 3));
    let granted: Vec<String> = grants_named(&r);
    assert_eq!(granted, ["x", "y", "s"]);
    assert_eq!(h.table.last_fence(), grants[2].0);
}

fn grants_named(r: &Response) -> Vec<String> {
    grants(r).into_iter().map(|g| g.1).collect()
}

#[test]
fn one_busy_name_queues_the_request_in_every_queue_and_holds_the_free_one() {
    let mut h = Harness::new();
    let (a, b, c) = (h.open(), h.open(), h.open());
    let fx = h.grant(b, "x", X);
    let r = h.acquire_all(a, &[("x", X), ("y", X)], WAIT);
    let seq = h.seq;
    assert_eq!(r.reply, Reply::AcquiredAll(AcquiredAll::Queued));
    assert_eq!(waiters(&h.table, "x"), vec![(a, X)]);
    assert_eq!(waiters(&h.table, "y"), vec![(a, X)]);
    // "y" is free, but a waits for it first: nobody barges in.
    h.try_fails(c, "y", X);
    // A retry finds it queued.
    assert_eq!(
        h.no_op(all(a, seq, &[("x", X), ("y", X)], WAIT)),
        Reply::AcquiredAll(AcquiredAll::Queued)
    );
    // x frees: both are granted in one step.
    let r = h.released(b, "x", fx);
    assert_eq!(grants_named(&r), ["x", "y"]);
    assert_eq!(holders(&h.table, "x"), vec![(a, X)]);
    assert_eq!(holders(&h.table, "y"), vec![(a, X)]);
    // The retry now finds the grants.
    let again = h.no_op(all(a, seq, &[("x", X), ("y", X)], WAIT));
    match again {
        Reply::AcquiredAll(AcquiredAll::Granted { grants, .. }) => assert_eq!(grants.len(), 2),
        other => panic!("{other:?}"),
    }
}

#[test]
fn two_atomic_requests_in_opposite_orders_never_deadlock() {
    let mut h = Harness::new();
    let (a, b, c) = (h.open(), h.open(), h.open());
    let fx = h.grant(c, "x", X);
    assert_eq!(
        h.acquire_all(a, &[("x", X), ("y", X)], WAIT).reply,
        Reply::AcquiredAll(AcquiredAll::Queued)
    );
    // b asks for the same names the other way round: queued behind a in
    // both, no cycle.
    assert_eq!(
        h.acquire_all(b, &[("y", X), ("x", X)], WAIT).reply,
        Reply::AcquiredAll(AcquiredAll::Queued)
    );
    let r = h.released(c, "x", fx);
    assert!(grants(&r).iter().all(|g| g.0 == a));
    let fa: Vec<Fence> = h
        .table
        .describe(&name("x"))
        .into_iter()
        .chain(h.table.describe(&name("y")))
        .flat_map(|i| i.holders)
        .map(|h| h.fence)
        .collect();
    let r = h.released(a, "x", fa[0]);
    assert!(grants(&r).is_empty(), "b still needs y");
    let r = h.released(a, "y", fa[1]);
    assert_eq!(grants_named(&r), ["y", "x"]);
    assert!(grants(&r).iter().all(|g| g.0 == b));
}

#[test]
fn a_try_that_finds_one_name_busy_changes_nothing() {
    let mut h = Harness::new();
    let (a, b) = (h.open(), h.open());
    h.grant(b, "y", X);
    let before = h.table.locks.clone();
    let r = h.acquire_all(a, &[("x", X), ("y", X)], TRY);
    assert_eq!(r.reply, Reply::AcquiredAll(AcquiredAll::NotAcquired));
    assert!(r.events.is_empty());
    assert_eq!(h.table.locks, before);
}

#[test]
fn a_timeout_on_one_name_ends_the_wait_in_every_queue() {
    let mut h = Harness::new();
    let (a, b, c) = (h.open(), h.open(), h.open());
    h.grant(b, "x", X);
    h.acquire_all(a, &[("x", X), ("y", X)], WAIT);
    let seq = h.seq;
    h.queue(c, "y", X);
    let r = h.apply(cancel(a, "x", seq));
    assert_eq!(r.reply, Reply::WaitTimedOut { ended: true });
    let cancelled: Vec<&str> = r
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Cancelled { name, session, .. } if *session == a => Some(name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(cancelled, ["x", "y"]);
    // c, behind a on y, gets it.
    assert_eq!(grants(&r)[0].0, c);
    assert_eq!(waiters(&h.table, "x"), vec![]);
    // The other name's timer finds nothing left.
    assert_eq!(
        h.no_op(cancel(a, "y", seq)),
        Reply::WaitTimedOut { ended: false }
    );
    // A retry answers not acquired.
    assert_eq!(
        h.no_op(all(a, seq, &[("x", X), ("y", X)], WAIT)),
        Reply::AcquiredAll(AcquiredAll::NotAcquired)
    );
}

#[test]
fn cancel_withdraws_a_queued_request_everywhere_and_releases_a_granted_one() {
    let mut h = Harness::new();
    let (a, b) = (h.open(), h.open());
    let fx = h.grant(b, "x", X);
    h.acquire_all(a, &[("x", X), ("y", X)], WAIT);
    let seq = h.seq;
    let withdraw = |seq| {
        Command::Cancel(cmd::Cancel {
            session: a,
            seq,
            name: name("y"),
            caller: String::new(),
        })
    };
    let r = h.apply(withdraw(seq));
    assert_eq!(r.reply, Reply::Cancelled { cancelled: true });
    assert_eq!(waiters(&h.table, "x"), vec![]);
    assert_eq!(waiters(&h.table, "y"), vec![]);
    h.released(b, "x", fx);
    // Granted, then cancelled: every grant of it is released.
    let r = h.acquire_all(a, &[("x", X), ("y", X)], WAIT);
    granted_all(&r);
    let seq = h.seq;
    let r = h.apply(withdraw(seq));
    assert_eq!(r.reply, Reply::Cancelled { cancelled: true });
    assert!(holders(&h.table, "x").is_empty() && holders(&h.table, "y").is_empty());
    // A retry of the request now answers not acquired.
    assert_eq!(
        h.no_op(all(a, seq, &[("x", X), ("y", X)], WAIT)),
        Reply::AcquiredAll(AcquiredAll::NotAcquired)
    );
    // A cancel that comes before its request: the request grants nothing.
    let seq = h.next_seq();
    assert_eq!(
        h.apply(withdraw(seq)).reply,
        Reply::Cancelled { cancelled: false }
    );
    assert_eq!(
        h.apply(all(a, seq, &[("x", X), ("y", X)], WAIT)).reply,
        Reply::AcquiredAll(AcquiredAll::NotAcquired)
    );
    assert!(holders(&h.table, "x").is_empty());
}

#[test]
fn a_session_end_takes_its_atomic_request_out_of_every_queue() {
    let mut h = Harness::new();
    let (a, b, c) = (h.open(), h.open(), h.open());
    h.grant(b, "x", X);
    h.acquire_all(a, &[("x", X), ("y", X)], WAIT);
    h.queue(c, "y", X);
    let r = h.apply(Command::ExpireSession(cmd::ExpireSession { session: a }));
    assert_eq!(grants(&r)[0].0, c);
    assert!(h.table.groups.is_empty());
}

#[test]
fn an_atomic_request_that_closes_a_cycle_is_refused() {
    let mut h = Harness::new();
    let (a, b) = (h.open(), h.open());
    h.grant(a, "z", X);
    h.grant(b, "x", X);
    h.queue(b, "z", X);
    let seq = h.next_seq();
    match h.refuse(all(a, seq, &[("y", X), ("x", X)], WAIT)) {
        Refusal::Deadlock { cycle } => {
            assert_eq!(cycle[0].session, a);
            assert_eq!(cycle[0].name, name("x"));
        }
        other => panic!("expected a deadlock, got {other:?}"),
    }
}

#[test]
fn bad_atomic_requests_are_refused_and_change_nothing() {
    let mut h = Harness::new();
    let a = h.open();
    let names: Vec<String> = (0..=MAX_NAMES_PER_REQUEST)
        .map(|i| format!("n{i}"))
        .collect();
    let locks: Vec<(&str, Mode)> = names.iter().map(|n| (n.as_str(), X)).collect();
    let seq = h.next_seq();
    assert_eq!(
        h.refuse(all(a, seq, &[], WAIT)),
        Refusal::InvalidLockCount { count: 0 }
    );
    assert_eq!(
        h.refuse(all(a, seq, &locks, WAIT)),
        Refusal::InvalidLockCount {
            count: MAX_NAMES_PER_REQUEST + 1
        }
    );
    assert_eq!(
        h.refuse(all(a, seq, &[("x", X), ("y", X), ("x", SH)], WAIT)),
        Refusal::DuplicateName { name: name("x") }
    );
    assert_eq!(
        h.refuse(all(a, seq, &[("x", X), ("s", sem(4, 3))], WAIT)),
        Refusal::InvalidWeight {
            weight: 4,
            capacity: 3
        }
    );
    h.grant(a, "held", X);
    let seq = h.next_seq();
    assert!(matches!(
        h.refuse(all(a, seq, &[("x", X), ("held", X)], WAIT)),
        Refusal::AlreadyHeld { .. }
    ));
    // Exactly the limit is taken.
    let r = h.acquire_all(a, &locks[..MAX_NAMES_PER_REQUEST], WAIT);
    assert_eq!(granted_all(&r).len(), MAX_NAMES_PER_REQUEST);
}

#[test]
fn shared_atomic_requests_come_in_together_and_survive_a_snapshot() {
    let mut h = Harness::new();
    let (a, b, c) = (h.open(), h.open(), h.open());
    let fw = h.grant(c, "x", X);
    h.acquire_all(a, &[("x", SH), ("y", SH)], WAIT);
    h.acquire_all(b, &[("y", SH), ("x", SH)], WAIT);
    let back = LockTable::from_snapshot(&h.table.to_snapshot()).expect("decodes");
    assert_eq!(back, h.table);
    assert_eq!(
        back.waits().count(),
        4,
        "the leader re-arms a timer per name"
    );
    let r = h.released(c, "x", fw);
    let sessions: Vec<SessionId> = grants(&r).iter().map(|g| g.0).collect();
    assert_eq!(sessions, vec![a, a, b, b]);
}

#[test]
fn a_timeout_naming_another_name_leaves_the_request_alone() {
    let mut h = Harness::new();
    let (a, b) = (h.open(), h.open());
    h.grant(b, "x", X);
    h.acquire_all(a, &[("x", X), ("y", X)], WAIT);
    let seq = h.seq;
    assert_eq!(
        h.no_op(cancel(a, "z", seq)),
        Reply::WaitTimedOut { ended: false }
    );
    assert_eq!(waiters(&h.table, "y"), vec![(a, X)]);
}
