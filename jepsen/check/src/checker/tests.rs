//! Unit tests of the checkers.

use serde_json::{json, Value};

use super::{fence_order, grants, mutual_exclusion};
use crate::history::{pair_ops, Event, Process, Type};

/// An operation of process `p` invoked at `t0` and answered ok at `t1`.
fn op(p: u64, f: &str, invoke: Value, t0: u64, ok: Value, t1: u64) -> Vec<Event> {
    let ev = |kind, value, time_ns| Event {
        process: Process::Client(p),
        kind,
        f: f.into(),
        value,
        time_ns,
    };
    vec![ev(Type::Invoke, invoke, t0), ev(Type::Ok, ok, t1)]
}

fn acq(p: u64, s: u64, lock: &str, mode: &str, fence: u64, t0: u64, t1: u64) -> Vec<Event> {
    let v = json!({"lock": lock, "mode": mode, "session": s});
    let mut r = v.clone();
    r["fence"] = json!(fence);
    op(p, "acquire", v, t0, r, t1)
}

fn rel(p: u64, s: u64, lock: &str, fence: u64, t0: u64, t1: u64) -> Vec<Event> {
    op(
        p,
        "release",
        json!({"lock": lock, "fence": fence, "session": s}),
        t0,
        json!({"released": true}),
        t1,
    )
}

/// An atomic request answered with `grants` `(lock, mode, fence)`.
fn acq_all(p: u64, s: u64, grants: &[(&str, &str, u64)], t0: u64, t1: u64) -> Vec<Event> {
    let locks: Vec<Value> = grants
        .iter()
        .map(|(l, m, _)| json!({"lock": l, "mode": m}))
        .collect();
    let granted: Vec<Value> = grants
        .iter()
        .map(|(l, m, f)| json!({"lock": l, "mode": m, "fence": f}))
        .collect();
    op(
        p,
        "acquire-all",
        json!({"locks": locks, "session": s}),
        t0,
        json!({"session": s, "grants": granted}),
        t1,
    )
}

fn upgrade(p: u64, s: u64, lock: &str, from: u64, fence: u64, t0: u64, t1: u64) -> Vec<Event> {
    op(
        p,
        "upgrade",
        json!({"lock": lock, "fence": from, "session": s}),
        t0,
        json!({"lock": lock, "session": s, "from_fence": from, "fence": fence, "mode": "exclusive"}),
        t1,
    )
}

fn downgrade(p: u64, s: u64, lock: &str, fence: u64, t0: u64, t1: u64) -> Vec<Event> {
    op(
        p,
        "downgrade",
        json!({"lock": lock, "fence": fence, "session": s}),
        t0,
        json!({"lock": lock, "session": s, "fence": fence, "mode": "shared"}),
        t1,
    )
}

fn exclusion(events: Vec<Event>) -> (Value, Vec<Value>) {
    mutual_exclusion(&grants(&pair_ops(&events)))
}

fn order(events: Vec<Event>) -> (Value, Vec<Value>) {
    let ops = pair_ops(&events);
    fence_order(&ops, &grants(&ops))
}

#[test]
fn an_atomic_grant_overlapping_an_exclusive_hold_is_flagged() {
    // Session 10 holds lk/1 exclusively (fence 5) from 1 to 10; session
    // 11's atomic request is answered lk/0 and lk/1 (shared) at 3.
    let mut h = acq(0, 10, "lk/1", "exclusive", 5, 0, 1);
    h.extend(acq_all(
        1,
        11,
        &[("lk/0", "exclusive", 6), ("lk/1", "shared", 7)],
        2,
        3,
    ));
    h.extend(rel(1, 11, "lk/0", 6, 8, 8));
    h.extend(rel(1, 11, "lk/1", 7, 9, 9));
    h.extend(rel(0, 10, "lk/1", 5, 10, 11));
    let (r, a) = exclusion(h);
    assert_eq!(r["valid"], json!(false), "{a:?}");
    assert_eq!(a.len(), 1);
    assert_eq!(a[0]["grants"][0]["lock"], json!("lk/1"));
    // The same request invoked after the release: no overlap.
    let mut h = acq(0, 10, "lk/1", "exclusive", 5, 0, 1);
    h.extend(rel(0, 10, "lk/1", 5, 2, 3));
    h.extend(acq_all(
        1,
        11,
        &[("lk/0", "exclusive", 6), ("lk/1", "shared", 7)],
        4,
        5,
    ));
    h.extend(rel(1, 11, "lk/0", 6, 8, 8));
    h.extend(rel(1, 11, "lk/1", 7, 9, 9));
    let (r, a) = exclusion(h.clone());
    assert_eq!(r["valid"], json!(true), "{a:?}");
    assert_eq!(r["certain_grants"], json!(3));
    assert_eq!(order(h).0["valid"], json!(true));
}

#[test]
fn an_atomic_request_must_take_consecutive_fences_in_its_order() {
    let gap = acq_all(
        0,
        10,
        &[("lk/0", "exclusive", 5), ("lk/1", "shared", 7)],
        0,
        1,
    );
    let (r, a) = order(gap);
    assert_eq!(r["valid"], json!(false));
    assert!(a[0]["message"]
        .as_str()
        .unwrap()
        .contains("not consecutive"));
    let reversed = acq_all(
        0,
        10,
        &[("lk/0", "exclusive", 6), ("lk/1", "shared", 5)],
        0,
        1,
    );
    assert_eq!(order(reversed).0["valid"], json!(false));
    let fine = acq_all(
        0,
        10,
        &[
            ("lk/2", "exclusive", 5),
            ("lk/0", "shared", 6),
            ("lk/1", "exclusive", 7),
        ],
        0,
        1,
    );
    let (r, _) = order(fine);
    assert_eq!(r["valid"], json!(true));
    assert_eq!(r["atomic_requests"], json!(1));
    // Something else granted inside the request's range of fences.
    let mut inside = acq_all(
        0,
        10,
        &[("lk/0", "exclusive", 5), ("lk/1", "shared", 6)],
        0,
        1,
    );
    inside.extend(acq(1, 11, "lk/2", "exclusive", 6, 0, 1));
    let (r, a) = order(inside);
    assert_eq!(r["valid"], json!(false));
    assert!(a[0]["message"].as_str().unwrap().contains("granted twice"));
}

#[test]
fn an_upgrade_granted_while_another_reader_holds_is_flagged() {
    // Readers 10 (fence 5) and 11 (fence 6); 10's upgrade is answered
    // fence 7 at 5 while 11 still holds until its release at 8.
    let mut h = acq(0, 10, "a", "shared", 5, 0, 1);
    h.extend(acq(1, 11, "a", "shared", 6, 2, 3));
    h.extend(upgrade(0, 10, "a", 5, 7, 4, 5));
    h.extend(rel(1, 11, "a", 6, 8, 8));
    h.extend(rel(0, 10, "a", 7, 9, 9));
    let (r, a) = exclusion(h.clone());
    assert_eq!(r["valid"], json!(false));
    assert_eq!(a[0]["grants"][1]["fence"], json!(7));
    // The upgrade is a grant with a new fence: fence order holds.
    assert_eq!(order(h).0["valid"], json!(true));
    // The other reader left before the upgrade returned: fine.
    let mut h = acq(0, 10, "a", "shared", 5, 0, 1);
    h.extend(acq(1, 11, "a", "shared", 6, 2, 3));
    h.extend(rel(1, 11, "a", 6, 4, 4));
    h.extend(upgrade(0, 10, "a", 5, 7, 4, 5));
    h.extend(rel(0, 10, "a", 7, 9, 9));
    assert_eq!(exclusion(h).0["valid"], json!(true));
    // An upgrade answered a fence below one already returned.
    let mut h = acq(0, 10, "a", "shared", 5, 0, 1);
    h.extend(acq(1, 11, "a", "shared", 8, 2, 3));
    h.extend(rel(1, 11, "a", 8, 4, 4));
    h.extend(upgrade(0, 10, "a", 5, 7, 5, 6));
    let (r, a) = order(h);
    assert_eq!(r["valid"], json!(false));
    assert!(a[0]["message"]
        .as_str()
        .unwrap()
        .contains("fence 7 granted after fence 8"));
}

#[test]
fn a_downgraded_grant_is_exclusive_until_the_downgrade_and_shared_after() {
    // A reader let in before the downgrade was invoked.
    let mut h = acq(0, 10, "a", "exclusive", 5, 0, 1);
    h.extend(acq(1, 11, "a", "shared", 6, 2, 3));
    h.extend(downgrade(0, 10, "a", 5, 4, 5));
    h.extend(rel(1, 11, "a", 6, 8, 8));
    h.extend(rel(0, 10, "a", 5, 9, 9));
    let (r, a) = exclusion(h);
    assert_eq!(r["valid"], json!(false));
    assert_eq!(a[0]["grants"][0]["mode"], json!("exclusive"));
    // A reader let in after it: fine, and the shared rest of fence 5 is
    // not a second grant of it.
    let mut h = acq(0, 10, "a", "exclusive", 5, 0, 1);
    h.extend(downgrade(0, 10, "a", 5, 2, 3));
    h.extend(acq(1, 11, "a", "shared", 6, 2, 4));
    h.extend(rel(1, 11, "a", 6, 8, 8));
    h.extend(rel(0, 10, "a", 5, 9, 9));
    assert_eq!(exclusion(h.clone()).0["valid"], json!(true));
    assert_eq!(order(h).0["valid"], json!(true));
    // A writer let in while the downgraded reader still holds.
    let mut h = acq(0, 10, "a", "exclusive", 5, 0, 1);
    h.extend(downgrade(0, 10, "a", 5, 2, 3));
    h.extend(acq(1, 11, "a", "exclusive", 6, 4, 5));
    h.extend(rel(1, 11, "a", 6, 6, 6));
    h.extend(rel(0, 10, "a", 5, 9, 9));
    assert_eq!(exclusion(h).0["valid"], json!(false));
}
