//! Tests of the lease timers: activation, keep-alives, waits, lock delays,
//! bound sessions' streams, TTL changes and revokes.

use super::*;
use crate::state::Mode;

fn table_with_session(ttl_ms: u64) -> LockTable {
    let mut table = LockTable::new();
    table.apply(
        1,
        Command::OpenSessionV0(cmd::OpenSessionV0 {
            ttl_ms,
            lock_delay_ms: 0,
            nonce: 0,
            owner: String::new(),
        }),
    );
    table
}

#[tokio::test(start_paused = true)]
async fn inactive_leases_track_nothing_and_refuse_keep_alives() {
    let leases = Leases::default();
    leases.on_events(&[Event::SessionOpened {
        session: SessionId(1),
        ttl_ms: 5_000,
        end_on_disconnect_ms: 0,
    }]);
    assert_eq!(leases.armed(), 0);
    assert_eq!(
        leases.keep_alive(SessionId(1)),
        Err(KeepAliveError::NotLeader)
    );
}

#[tokio::test(start_paused = true)]
async fn activation_rearms_every_session_at_full_length() {
    let leases = Leases::default();
    let table = table_with_session(5_000);
    leases.activate_for_term(1, &table);
    assert!(leases.take_due(Instant::now()).is_empty());
    tokio::time::advance(Duration::from_millis(4_999)).await;
    assert!(leases.take_due(Instant::now()).is_empty());
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(
        leases.take_due(Instant::now()),
        vec![TimerKey::Session(SessionId(1))]
    );
    // Not taken effect yet: it fires again after RETRY_AFTER.
    assert!(leases.take_due(Instant::now()).is_empty());
    tokio::time::advance(RETRY_AFTER).await;
    assert_eq!(leases.take_due(Instant::now()).len(), 1);
    // Once the expiry applies, the timer is gone.
    leases.on_events(&[Event::SessionEnded {
        session: SessionId(1),
        expired: true,
    }]);
    assert_eq!(leases.armed(), 0);
}

#[tokio::test(start_paused = true)]
async fn keep_alive_pushes_the_deadline_from_now() {
    let leases = Leases::default();
    leases.activate_for_term(1, &table_with_session(3_000));
    tokio::time::advance(Duration::from_millis(2_000)).await;
    assert_eq!(
        leases.keep_alive(SessionId(1)),
        Ok(Duration::from_millis(3_000))
    );
    tokio::time::advance(Duration::from_millis(2_999)).await;
    assert!(leases.take_due(Instant::now()).is_empty());
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(leases.take_due(Instant::now()).len(), 1);
    assert_eq!(
        leases.keep_alive(SessionId(9)),
        Err(KeepAliveError::UnknownSession)
    );
}

#[tokio::test(start_paused = true)]
async fn waits_time_out_unless_granted_and_forever_never_does() {
    let leases = Leases::default();
    let mut table = table_with_session(60_000);
    table.apply(
        2,
        Command::OpenSessionV0(cmd::OpenSessionV0 {
            ttl_ms: 60_000,
            lock_delay_ms: 0,
            nonce: 0,
            owner: String::new(),
        }),
    );
    leases.activate_for_term(1, &table);
    let name = LockName::new("a").expect("valid");
    let queued = |session, seq, timeout_ms| Event::Queued {
        name: name.clone(),
        session: SessionId(session),
        seq,
        mode: Mode::Exclusive,
        timeout_ms,
    };
    leases.on_events(&[queued(1, 7, 1_000), queued(2, 8, WAIT_FOREVER_MS)]);
    tokio::time::advance(Duration::from_millis(1_000)).await;
    assert_eq!(
        leases.take_due(Instant::now()),
        vec![TimerKey::Wait(SessionId(1), name.clone(), 7)]
    );
    let cmd = TimerKey::Wait(SessionId(1), name.clone(), 7).command();
    assert_eq!(
        cmd,
        Command::TimeoutWait(cmd::TimeoutWait {
            session: SessionId(1),
            name: LockName::new("a").expect("valid name"),
            seq: 7
        })
    );
    leases.on_events(&[Event::Cancelled {
        name: name.clone(),
        session: SessionId(1),
        seq: 7,
        mode: Mode::Exclusive,
        cause: crate::state::CancelCause::TimedOut,
    }]);
    // Only the two sessions remain armed; the forever-wait never was.
    assert_eq!(leases.armed(), 2);
}

#[tokio::test(start_paused = true)]
async fn deactivation_forgets_everything() {
    let leases = Leases::default();
    leases.activate_for_term(1, &table_with_session(3_000));
    assert!(leases.is_active());
    leases.deactivate();
    assert!(!leases.is_active());
    assert_eq!(leases.armed(), 0);
    assert_eq!(
        leases.keep_alive(SessionId(1)),
        Err(KeepAliveError::NotLeader)
    );
}

#[tokio::test(start_paused = true)]
async fn a_newer_lock_delay_replaces_the_older_timer_and_its_end_disarms_it() {
    let leases = Leases::default();
    leases.activate_for_term(1, &LockTable::new());
    let name = LockName::new("d").expect("valid");
    let started = |since, delay_ms| Event::LockDelayStarted {
        name: name.clone(),
        delay_ms,
        since,
    };
    leases.on_events(&[started(10, 1_000)]);
    leases.on_events(&[started(20, 5_000)]);
    assert_eq!(leases.armed(), 1, "the older delay's timer is gone");
    tokio::time::advance(Duration::from_millis(1_000)).await;
    assert!(
        leases.take_due(Instant::now()).is_empty(),
        "the older delay does not fire"
    );
    tokio::time::advance(Duration::from_millis(4_000)).await;
    assert_eq!(
        leases.take_due(Instant::now()),
        vec![TimerKey::Delay(name.clone(), 20)]
    );
    leases.on_events(&[Event::LockDelayEnded { name: name.clone() }]);
    assert_eq!(leases.armed(), 0);
}

/// Review finding 10: a short loss of quorum within one term keeps the
/// deadlines (a dead client's lease still ends on time) instead of
/// restarting every lease at full length.
#[tokio::test(start_paused = true)]
async fn a_quorum_blip_in_the_same_term_keeps_the_deadlines() {
    let leases = Leases::default();
    let table = table_with_session(10_000);
    leases.activate_for_term(1, &table);
    tokio::time::advance(Duration::from_secs(6)).await;
    leases.pause();
    assert!(leases.is_paused());
    // Paused: nothing is due and no keep-alive is acknowledged.
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(leases.take_due(Instant::now()).is_empty());
    assert_eq!(
        leases.keep_alive(SessionId(1)),
        Err(KeepAliveError::NotLeader)
    );
    // The quorum is back in the same term: the lease ran out meanwhile
    // (10 s after it was armed), so it is due at once.
    leases.activate_for_term(1, &table);
    assert!(!leases.is_paused());
    assert_eq!(
        leases.take_due(Instant::now()),
        vec![TimerKey::Session(SessionId(1))]
    );
    // A new term restarts it at full length.
    leases.pause();
    leases.activate_for_term(2, &table);
    assert!(leases.take_due(Instant::now()).is_empty());
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(
        leases.take_due(Instant::now()),
        vec![TimerKey::Session(SessionId(1))]
    );
}

/// Review finding 9: once a session's expiry is proposed, no keep-alive
/// for it is acknowledged.
#[tokio::test(start_paused = true)]
async fn no_keep_alive_is_acknowledged_once_the_expiry_is_proposed() {
    let leases = Leases::default();
    leases.activate_for_term(1, &table_with_session(1_000));
    tokio::time::advance(Duration::from_millis(1_001)).await;
    assert_eq!(
        leases.take_due(Instant::now()),
        vec![TimerKey::Session(SessionId(1))]
    );
    assert_eq!(
        leases.keep_alive(SessionId(1)),
        Err(KeepAliveError::Expiring)
    );
    // Once the expiry is applied the session is simply unknown.
    leases.on_events(&[Event::SessionEnded {
        session: SessionId(1),
        expired: true,
    }]);
    assert_eq!(
        leases.keep_alive(SessionId(1)),
        Err(KeepAliveError::UnknownSession)
    );
}

fn bound_session(ttl_ms: u64, grace_ms: u64) -> Event {
    Event::SessionOpened {
        session: SessionId(1),
        ttl_ms,
        end_on_disconnect_ms: grace_ms,
    }
}

#[tokio::test(start_paused = true)]
async fn a_bound_session_expires_a_grace_after_its_last_stream_ends() {
    let leases = Leases::default();
    leases.activate_for_term(1, &LockTable::new());
    leases.on_events(&[bound_session(30_000, 300)]);
    // Before any stream carried it, a stream's end changes nothing.
    let (a, b) = (leases.open_stream(), leases.open_stream());
    leases.stream_ended(a);
    tokio::time::advance(Duration::from_millis(301)).await;
    assert!(leases.take_due(Instant::now()).is_empty());
    // Two streams carry it (renewing again counts once); one ends: the
    // other still does.
    leases.carries(a, SessionId(1));
    leases.carries(a, SessionId(1));
    leases.carries(b, SessionId(1));
    leases.stream_ended(a);
    tokio::time::advance(Duration::from_millis(301)).await;
    assert!(leases.take_due(Instant::now()).is_empty());
    // The last one ends: expiry after the grace, not the ttl.
    leases.stream_ended(b);
    tokio::time::advance(Duration::from_millis(299)).await;
    assert!(leases.take_due(Instant::now()).is_empty());
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(
        leases.take_due(Instant::now()),
        vec![TimerKey::Session(SessionId(1))]
    );
}

#[tokio::test(start_paused = true)]
async fn a_stream_back_within_the_grace_keeps_the_session() {
    let leases = Leases::default();
    leases.activate_for_term(1, &LockTable::new());
    leases.on_events(&[bound_session(30_000, 300)]);
    let a = leases.open_stream();
    leases.carries(a, SessionId(1));
    leases.stream_ended(a);
    tokio::time::advance(Duration::from_millis(200)).await;
    // A new stream renews it: the ttl counts again.
    assert_eq!(
        leases.keep_alive(SessionId(1)),
        Ok(Duration::from_millis(30_000))
    );
    let b = leases.open_stream();
    leases.carries(b, SessionId(1));
    tokio::time::advance(Duration::from_millis(29_999)).await;
    assert!(leases.take_due(Instant::now()).is_empty());
    // An unbound session ignores streams altogether.
    leases.on_events(&[Event::SessionOpened {
        session: SessionId(2),
        ttl_ms: 10_000,
        end_on_disconnect_ms: 0,
    }]);
    let c = leases.open_stream();
    leases.carries(c, SessionId(2));
    leases.stream_ended(c);
    tokio::time::advance(Duration::from_millis(9_999)).await;
    assert!(!leases
        .take_due(Instant::now())
        .contains(&TimerKey::Session(SessionId(2))));
}

/// Review 2026-11-29 #4: a stream that renewed a session in an earlier
/// term is counted again when it renews in this one, and a second
/// stream keeps the session when the first ends.
#[tokio::test(start_paused = true)]
async fn streams_are_counted_in_every_term_they_renew_in() {
    let leases = Leases::default();
    let table = LockTable::new();
    leases.activate_for_term(1, &table);
    leases.on_events(&[bound_session(30_000, 300)]);
    let a = leases.open_stream();
    leases.carries(a, SessionId(1));
    // The leadership leaves and comes back: a new term.
    leases.deactivate();
    let mut table = LockTable::new();
    table.apply(
        1,
        Command::OpenSession(cmd::OpenSession {
            ttl_ms: 30_000,
            lock_delay_ms: 0,
            nonce: 0,
            owner: String::new(),
            end_on_disconnect_ms: 300,
        }),
    );
    let session = table.sessions().next().expect("a session").session;
    leases.activate_for_term(3, &table);
    // Stream A renews it again, and stream B too.
    leases.carries(a, session);
    let b = leases.open_stream();
    leases.carries(b, session);
    leases.stream_ended(a);
    tokio::time::advance(Duration::from_millis(301)).await;
    assert!(
        leases.take_due(Instant::now()).is_empty(),
        "B still carries it"
    );
    leases.stream_ended(b);
    tokio::time::advance(Duration::from_millis(300)).await;
    assert_eq!(
        leases.take_due(Instant::now()),
        vec![TimerKey::Session(session)]
    );
}

/// A ttl change restarts the lease at the new length when it applies,
/// longer or shorter (the client's duty caps its count at the change's
/// send + the new ttl, docs/concepts/sessions-and-leases.md "The lease rule"); keep-alives then renew
/// at the new length and never move the end earlier.
#[tokio::test(start_paused = true)]
async fn a_new_ttl_restarts_the_lease_at_its_length() {
    let leases = Leases::default();
    leases.activate_for_term(1, &table_with_session(30_000));
    tokio::time::advance(Duration::from_millis(1_000)).await;
    // A longer ttl restarts the lease at its length.
    leases.on_events(&[Event::SessionTtlChanged {
        session: SessionId(1),
        ttl_ms: 60_000,
    }]);
    tokio::time::advance(Duration::from_millis(40_000)).await;
    assert!(leases.take_due(Instant::now()).is_empty(), "60 s, not 30");
    // A shorter one ends it the new ttl after the change, sooner than
    // the lease in force (Symfony's refresh($ttl) after its long
    // initial ttl).
    leases.on_events(&[Event::SessionTtlChanged {
        session: SessionId(1),
        ttl_ms: 2_000,
    }]);
    tokio::time::advance(Duration::from_millis(1_999)).await;
    assert!(leases.take_due(Instant::now()).is_empty());
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(leases.take_due(Instant::now()).len(), 1);
    leases.on_events(&[Event::SessionEnded {
        session: SessionId(1),
        expired: true,
    }]);
    // Keep-alives renew at the new length.
    leases.on_events(&[Event::SessionOpened {
        session: SessionId(2),
        ttl_ms: 30_000,
        end_on_disconnect_ms: 0,
    }]);
    tokio::time::advance(Duration::from_millis(29_000)).await;
    leases.on_events(&[Event::SessionTtlChanged {
        session: SessionId(2),
        ttl_ms: 2_000,
    }]);
    tokio::time::advance(Duration::from_millis(1_000)).await;
    assert_eq!(
        leases.keep_alive(SessionId(2)),
        Ok(Duration::from_millis(2_000))
    );
    tokio::time::advance(Duration::from_millis(1_999)).await;
    assert!(leases.take_due(Instant::now()).is_empty());
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(leases.take_due(Instant::now()).len(), 1);
}

/// Review 2026-11-29 #2: while a ttl change is in flight, the session's
/// expiry is not decided (it would undo the lease the change's answer
/// promises); once its end is under way, a change is refused.
#[tokio::test(start_paused = true)]
async fn a_ttl_change_in_flight_holds_the_expiry_back() {
    let leases = Leases::default();
    leases.activate_for_term(1, &table_with_session(1_000));
    tokio::time::advance(Duration::from_millis(999)).await;
    assert_eq!(leases.begin_ttl_change(SessionId(1)), Ok(()));
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(
        leases.take_due(Instant::now()).is_empty(),
        "held back while the change is in flight"
    );
    // The change applies and restarts the lease.
    leases.on_events(&[Event::SessionTtlChanged {
        session: SessionId(1),
        ttl_ms: 30_000,
    }]);
    leases.end_ttl_change(SessionId(1));
    tokio::time::advance(Duration::from_millis(29_999)).await;
    assert!(leases.take_due(Instant::now()).is_empty());
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(leases.take_due(Instant::now()).len(), 1);
    // Its expiry is proposed now: a change is refused, and one that
    // applies anyway (written elsewhere) does not restart it.
    assert_eq!(
        leases.begin_ttl_change(SessionId(1)),
        Err(KeepAliveError::Expiring)
    );
    leases.on_events(&[Event::SessionTtlChanged {
        session: SessionId(1),
        ttl_ms: 30_000,
    }]);
    assert_eq!(
        leases.keep_alive(SessionId(1)),
        Err(KeepAliveError::Expiring)
    );
}

/// A revoke refuses renewals at once and proposes nothing itself: the
/// revoker ends the session at the deadline the last renewal earned.
#[tokio::test(start_paused = true)]
async fn a_revoke_stops_renewals_and_keeps_the_deadline() {
    let leases = Leases::default();
    leases.activate_for_term(1, &table_with_session(3_000));
    tokio::time::advance(Duration::from_millis(1_000)).await;
    assert_eq!(
        leases.keep_alive(SessionId(1)),
        Ok(Duration::from_millis(3_000))
    );
    let renewed = Instant::now();
    assert_eq!(
        leases.begin_revoke(SessionId(1)),
        Ok((renewed + Duration::from_millis(3_000), 1))
    );
    assert!(leases.still_revoking(SessionId(1), 1));
    assert!(!leases.still_revoking(SessionId(1), 2));
    assert_eq!(
        leases.keep_alive(SessionId(1)),
        Err(KeepAliveError::Expiring)
    );
    assert_eq!(
        leases.begin_ttl_change(SessionId(1)),
        Err(KeepAliveError::Expiring)
    );
    tokio::time::advance(Duration::from_millis(3_000)).await;
    assert!(
        leases.take_due(Instant::now()).is_empty(),
        "the revoker ends it"
    );
    // A revoke that failed leaves the timer to expire it.
    leases.end_revoke(SessionId(1));
    assert!(!leases.still_revoking(SessionId(1), 1));
    tokio::time::advance(RETRY_AFTER).await;
    assert_eq!(
        leases.take_due(Instant::now()),
        vec![TimerKey::Session(SessionId(1))]
    );
    assert_eq!(
        leases.begin_revoke(SessionId(9)),
        Err(KeepAliveError::UnknownSession)
    );
}

/// While a revoke's write has an unknown outcome, the revoker asks where
/// it stands: paused (the quorum is lost: renewals stay refused, wait),
/// counting again in the same term (propose it again), or gone (another
/// term, or the revoke ended): sim seed 705670.
#[tokio::test(start_paused = true)]
async fn a_pending_revoke_holds_through_a_pause_and_ends_with_its_term() {
    let leases = Leases::default();
    let table = table_with_session(3_000);
    leases.activate_for_term(1, &table);
    let (_, term) = leases.begin_revoke(SessionId(1)).expect("revoke");
    assert_eq!(leases.revoke_pending(SessionId(1), term), Some(false));
    leases.pause();
    assert_eq!(leases.revoke_pending(SessionId(1), term), Some(true));
    assert_eq!(
        leases.keep_alive(SessionId(1)),
        Err(KeepAliveError::NotLeader)
    );
    // The quorum is back in the same term: still revoking, renewals
    // still refused.
    leases.activate_for_term(1, &table);
    assert_eq!(leases.revoke_pending(SessionId(1), term), Some(false));
    assert_eq!(
        leases.keep_alive(SessionId(1)),
        Err(KeepAliveError::Expiring)
    );
    assert_eq!(leases.revoke_pending(SessionId(1), term + 1), None);
    // A later term restarts every lease (after applying what this one
    // proposed): the revoke no longer stands.
    leases.activate_for_term(2, &table);
    assert_eq!(leases.revoke_pending(SessionId(1), term), None);
}
