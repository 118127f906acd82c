//! Unit tests of the lock model and the linearizability checks.

use std::time::Duration;

use porcupine_rs::CheckResult;
use serde_json::{json, Value};

use super::{check, check_unbounded, lock_histories, LockModel};
use crate::history::{pair_ops, Event, Process, Type};

fn ev(p: u64, kind: Type, f: &str, value: Value, t: u64) -> Event {
    Event {
        process: Process::Client(p),
        kind,
        f: f.into(),
        value,
        time_ns: t,
    }
}

fn verdict(events: Vec<Event>) -> bool {
    let ops = pair_ops(&events);
    lock_histories(&ops).into_values().all(|h| {
        porcupine_rs::check_operations_timeout::<LockModel>(&h, Duration::from_secs(5))
            == CheckResult::Ok
    })
}

fn acquire(p: u64, s: u64, t0: u64, t1: u64, fence: u64, mode: &str) -> Vec<Event> {
    vec![
        ev(
            p,
            Type::Invoke,
            "acquire",
            json!({"lock": "a", "mode": mode, "session": s}),
            t0,
        ),
        ev(
            p,
            Type::Ok,
            "acquire",
            json!({"lock": "a", "mode": mode, "session": s, "fence": fence}),
            t1,
        ),
    ]
}

fn release(p: u64, s: u64, t0: u64, t1: u64, fence: u64, released: bool) -> Vec<Event> {
    vec![
        ev(
            p,
            Type::Invoke,
            "release",
            json!({"lock": "a", "session": s, "fence": fence}),
            t0,
        ),
        ev(p, Type::Ok, "release", json!({"released": released}), t1),
    ]
}

fn upgrade(p: u64, s: u64, t0: u64, t1: u64, from: u64, fence: u64) -> Vec<Event> {
    vec![
        ev(
            p,
            Type::Invoke,
            "upgrade",
            json!({"lock": "a", "session": s, "fence": from}),
            t0,
        ),
        ev(
            p,
            Type::Ok,
            "upgrade",
            json!({"lock": "a", "session": s, "from_fence": from, "fence": fence, "mode": "exclusive"}),
            t1,
        ),
    ]
}

fn downgrade(p: u64, s: u64, t0: u64, t1: u64, fence: u64) -> Vec<Event> {
    vec![
        ev(
            p,
            Type::Invoke,
            "downgrade",
            json!({"lock": "a", "session": s, "fence": fence}),
            t0,
        ),
        ev(
            p,
            Type::Ok,
            "downgrade",
            json!({"lock": "a", "session": s, "fence": fence, "mode": "shared"}),
            t1,
        ),
    ]
}

fn describe(p: u64, t0: u64, t1: u64, holders: Value) -> Vec<Event> {
    vec![
        ev(p, Type::Invoke, "describe", json!({"lock": "a"}), t0),
        ev(
            p,
            Type::Ok,
            "describe",
            json!({"lock": "a", "holders": holders}),
            t1,
        ),
    ]
}

#[test]
fn an_upgrade_needs_to_be_the_only_reader_and_a_larger_fence() {
    let mut h = acquire(0, 10, 0, 1, 5, "shared");
    h.extend(upgrade(0, 10, 2, 3, 5, 6));
    h.extend(describe(
        1,
        4,
        5,
        json!([{"session": 10, "fence": 6, "mode": "exclusive"}]),
    ));
    h.extend(release(0, 10, 6, 7, 6, true));
    assert!(verdict(h));
    // Granted while reader 11 still held (its release found it later).
    let mut h = acquire(0, 10, 0, 1, 5, "shared");
    h.extend(acquire(1, 11, 0, 1, 6, "shared"));
    h.extend(upgrade(0, 10, 2, 3, 5, 7));
    h.extend(release(1, 11, 4, 5, 6, true));
    assert!(!verdict(h), "an upgrade beside another reader");
    // The same, reader 11 leaving while the upgrade waits.
    let mut h = acquire(0, 10, 0, 1, 5, "shared");
    h.extend(acquire(1, 11, 0, 1, 6, "shared"));
    h.extend(upgrade(0, 10, 2, 5, 5, 7));
    h.extend(release(1, 11, 3, 4, 6, true));
    assert!(verdict(h));
    // The upgrade's fence must be new.
    let mut h = acquire(0, 10, 0, 1, 5, "shared");
    h.extend(upgrade(0, 10, 2, 3, 5, 5));
    assert!(!verdict(h), "an upgrade that kept its fence");
    // The shared grant is gone once the upgrade returned.
    let mut h = acquire(0, 10, 0, 1, 5, "shared");
    h.extend(upgrade(0, 10, 2, 3, 5, 6));
    h.extend(release(0, 10, 4, 5, 5, true));
    assert!(!verdict(h), "the upgraded read released afterwards");
}

#[test]
fn a_downgrade_keeps_the_fence_and_lets_readers_in() {
    let mut h = acquire(0, 10, 0, 1, 5, "exclusive");
    h.extend(downgrade(0, 10, 2, 3, 5));
    h.extend(acquire(1, 11, 4, 5, 6, "shared"));
    h.extend(describe(
        2,
        6,
        7,
        json!([{"session": 10, "fence": 5, "mode": "shared"},
               {"session": 11, "fence": 6, "mode": "shared"}]),
    ));
    h.extend(release(0, 10, 8, 9, 5, true));
    assert!(verdict(h));
    // Seen still exclusive after the downgrade returned.
    let mut h = acquire(0, 10, 0, 1, 5, "exclusive");
    h.extend(downgrade(0, 10, 2, 3, 5));
    h.extend(describe(
        2,
        6,
        7,
        json!([{"session": 10, "fence": 5, "mode": "exclusive"}]),
    ));
    h.extend(release(0, 10, 8, 9, 5, true));
    assert!(!verdict(h), "a downgrade that did not weaken");
    // A reader let in before the downgrade was invoked.
    let mut h = acquire(0, 10, 0, 1, 5, "exclusive");
    h.extend(acquire(1, 11, 2, 3, 6, "shared"));
    h.extend(downgrade(0, 10, 4, 5, 5));
    assert!(!verdict(h), "a reader beside a writer");
    // A downgrade of a grant not held exclusively.
    let mut h = acquire(0, 10, 0, 1, 5, "shared");
    h.extend(downgrade(0, 10, 2, 3, 5));
    assert!(!verdict(h), "a reader downgraded");
}

#[test]
fn an_atomic_request_is_checked_on_each_of_its_names() {
    let all = |p: u64, s: u64, t0: u64, t1: u64, fa: u64, fb: u64| {
        vec![
            ev(
                p,
                Type::Invoke,
                "acquire-all",
                json!({"session": s, "locks": [{"lock": "b", "mode": "exclusive"},
                                                {"lock": "a", "mode": "exclusive"}]}),
                t0,
            ),
            ev(
                p,
                Type::Ok,
                "acquire-all",
                json!({"session": s, "grants": [{"lock": "b", "mode": "exclusive", "fence": fb},
                                                 {"lock": "a", "mode": "exclusive", "fence": fa}]}),
                t1,
            ),
        ]
    };
    // Session 10 holds `a` until its release found it at 6; session
    // 11's atomic request was answered `a` (and `b`) at 3.
    let mut h = acquire(0, 10, 0, 1, 5, "exclusive");
    h.extend(all(1, 11, 2, 3, 7, 6));
    h.extend(release(0, 10, 6, 7, 5, true));
    let ops = pair_ops(&h);
    assert_eq!(lock_histories(&ops).len(), 2, "one history per name");
    assert!(!verdict(h), "an atomic grant beside an exclusive holder");
    let mut h = acquire(0, 10, 0, 1, 5, "exclusive");
    h.extend(release(0, 10, 2, 3, 5, true));
    h.extend(all(1, 11, 2, 4, 7, 6));
    assert!(verdict(h));
    // An atomic request of unknown outcome may have been granted.
    let mut h = vec![ev(
        1,
        Type::Invoke,
        "acquire-all",
        json!({"session": 11, "locks": [{"lock": "a", "mode": "exclusive"}]}),
        0,
    )];
    h.push(ev(
        1,
        Type::Info,
        "acquire-all",
        json!({"error": "unknown"}),
        1,
    ));
    h.extend(describe(
        2,
        2,
        3,
        json!([{"session": 11, "fence": 9, "mode": "exclusive"}]),
    ));
    assert!(verdict(h));
}

#[test]
fn both_checks_give_the_search_verdict_per_lock() {
    let mut bad = acquire(0, 10, 0, 1, 5, "exclusive");
    bad.extend(acquire(1, 11, 2, 3, 6, "exclusive"));
    bad.extend(release(0, 10, 4, 5, 5, true));
    let dir = std::env::temp_dir().join(format!("raftlock-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (r, a) in [
        check_unbounded(&pair_ops(&bad)),
        check(&pair_ops(&bad), Duration::from_secs(5), &dir),
    ] {
        assert_eq!(r["valid"], json!(false), "{r}");
        assert_eq!(r["locks"]["a"]["result"], json!("not linearizable"));
        assert_eq!(
            r["locks"]["a"]["ops"],
            json!(5),
            "3 operations, 2 session ends"
        );
        assert_eq!(a.len(), 1);
        assert_eq!(a[0]["lock"], json!("a"));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let mut fine = acquire(0, 10, 0, 1, 5, "exclusive");
    fine.extend(release(0, 10, 2, 3, 5, true));
    fine.extend(acquire(1, 11, 4, 5, 6, "exclusive"));
    let (r, a) = check_unbounded(&pair_ops(&fine));
    assert_eq!(
        (r["valid"].clone(), r["unknown"].clone()),
        (json!(true), json!(false))
    );
    assert_eq!(r["locks"]["a"]["result"], json!("linearizable"));
    assert!(a.is_empty());
}

#[test]
fn sequential_handoff_is_linearizable() {
    let mut h = acquire(0, 10, 0, 1, 5, "exclusive");
    h.extend(release(0, 10, 2, 3, 5, true));
    h.extend(acquire(1, 11, 4, 5, 6, "exclusive"));
    assert!(verdict(h));
}

#[test]
fn two_exclusive_holders_at_once_are_not() {
    let mut h = acquire(0, 10, 0, 1, 5, "exclusive");
    h.extend(acquire(1, 11, 2, 3, 6, "exclusive"));
    h.extend(release(0, 10, 4, 5, 5, true));
    assert!(!verdict(h));
}

#[test]
fn shared_holders_coexist_but_fences_must_grow() {
    let mut h = acquire(0, 10, 0, 1, 5, "shared");
    h.extend(acquire(1, 11, 2, 3, 6, "shared"));
    assert!(verdict(h));
    let mut h = acquire(0, 10, 0, 1, 7, "exclusive");
    h.extend(release(0, 10, 2, 3, 7, true));
    h.extend(acquire(1, 11, 4, 5, 6, "exclusive"));
    assert!(!verdict(h), "a later grant with a smaller fence");
}

#[test]
fn an_expired_session_frees_its_lock() {
    // Session 10 holds, then (unseen) expires; 11 takes the lock; 10's
    // close returns; 10's release finds nothing.
    let mut h = vec![
        ev(0, Type::Invoke, "open", json!({}), 0),
        ev(0, Type::Ok, "open", json!({"session": 10}), 1),
    ];
    h.extend(acquire(0, 10, 2, 3, 5, "exclusive"));
    h.extend(acquire(1, 11, 4, 9, 6, "exclusive"));
    h.extend(release(0, 10, 10, 11, 5, false));
    h.push(ev(0, Type::Invoke, "close", json!({"session": 10}), 12));
    h.push(ev(0, Type::Ok, "close", json!({"session": 10}), 13));
    assert!(verdict(h));
}

#[test]
fn describe_must_match_the_holders() {
    let mut h = acquire(0, 10, 0, 1, 5, "exclusive");
    h.push(ev(1, Type::Invoke, "describe", json!({"lock": "a"}), 2));
    h.push(ev(
        1,
        Type::Ok,
        "describe",
        json!({"lock": "a", "holders": []}),
        3,
    ));
    // Without a later proof of life the session may have expired.
    assert!(verdict(h.clone()));
    // A release that still found the grant proves it was held.
    h.extend(release(0, 10, 4, 5, 5, true));
    assert!(!verdict(h), "the holder is invisible");
    let mut h = acquire(0, 10, 0, 1, 5, "exclusive");
    h.push(ev(1, Type::Invoke, "describe", json!({"lock": "a"}), 2));
    h.push(ev(
        1,
        Type::Ok,
        "describe",
        json!({"lock": "a", "holders": [{"session": 10, "fence": 5, "mode": "exclusive"}]}),
        3,
    ));
    assert!(verdict(h));
}

#[test]
fn an_unknown_acquire_may_or_may_not_have_happened() {
    // Process 0's acquire timed out; a describe later sees it held.
    let mut h = vec![ev(
        0,
        Type::Invoke,
        "acquire",
        json!({"lock": "a", "mode": "exclusive", "session": 10}),
        0,
    )];
    h.push(ev(0, Type::Info, "acquire", json!({"error": "unknown"}), 5));
    h.push(ev(1, Type::Invoke, "describe", json!({"lock": "a"}), 6));
    h.push(ev(
        1,
        Type::Ok,
        "describe",
        json!({"lock": "a", "holders": [{"session": 10, "fence": 9, "mode": "exclusive"}]}),
        7,
    ));
    // ... and after its session closed, someone else gets it.
    h.push(ev(3, Type::Invoke, "close", json!({"session": 10}), 8));
    h.push(ev(3, Type::Ok, "close", json!({"session": 10}), 9));
    h.extend(acquire(2, 11, 10, 11, 12, "exclusive"));
    assert!(verdict(h.clone()));
    // Or it never happened.
    let mut h2 = vec![ev(
        0,
        Type::Invoke,
        "acquire",
        json!({"lock": "a", "mode": "exclusive", "session": 10}),
        0,
    )];
    h2.push(ev(0, Type::Info, "acquire", json!({"error": "unknown"}), 5));
    h2.extend(acquire(2, 11, 10, 11, 12, "exclusive"));
    assert!(verdict(h2));
}
