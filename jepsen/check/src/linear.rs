//! Linearizability of the `lock` workload, checked by `porcupine-rs`
//! (Wing–Gong–Lowe search with state caching) against a sequential model
//! of one lock, one partition per lock name.
//!
//! The model's state is the set of holders `(session, fence, shared)`, the
//! largest fence granted on the lock, and the sessions known to have ended.
//! Operations:
//!
//! * `acquire` ok with fence F: legal if the session has not ended, the
//!   mode is compatible with the holders (exclusive: none; shared: no
//!   exclusive) and F is larger than every fence granted on this lock
//!   before. An `acquire` that failed never happened and is left out.
//! * `acquire` info (outcome unknown, fence unknown): returns at the end of
//!   time; at its linearization point it is granted (fence unknown) if it
//!   could be, and otherwise stayed queued and never was. The search may
//!   place it after its session ended, where it does nothing.
//! * `release` ok(true): the grant was held; ok(false): it was not.
//!   `release` info: removes the grant if held.
//! * `acquire-all` (atomic request for several names): an `acquire` of
//!   each name, with that name's mode and fence (ok) or unknown (info). The
//!   search is per lock, so it does not see that the names were granted
//!   together; `fence-order` does (an atomic request's fences are
//!   consecutive, and nothing else gets a fence between them).
//! * `upgrade` ok with fence F of the shared grant G: legal if G is the
//!   lock's only grant and F is larger than every fence granted before;
//!   the holder then holds F exclusively and G is gone. `upgrade` info:
//!   done at its linearization point if it could be (fence unknown), else
//!   still waiting. A failed upgrade changed nothing and is left out.
//! * `downgrade` ok: the session held the grant exclusively; it holds it
//!   shared now, with the same fence. `downgrade` info: done if it could
//!   be.
//! * `describe` ok: the holders must be exactly the model's (a grant of
//!   unknown fence matches any fence of the same session and mode).
//! * session end: not an operation a client makes but one the history
//!   implies. A session is alive at every successful operation made through
//!   it, so it ends after the invocation of its last acquire, upgrade or
//!   downgrade answered ok, or release that found its grant, and before its `close` returned (or at an unknown time, if
//!   the close did not answer). Ending releases everything it held — that
//!   is how expiry looks to everyone else.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use porcupine_rs::{CheckResult, Model, Operation};
use serde_json::{json, Value};

use crate::history::{Op, Type};

/// One lock's sequential specification.
#[derive(Clone, Debug)]
pub struct LockModel;

/// An operation on one lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockOp {
    /// A grant (fence `None`: outcome unknown).
    Acquire {
        /// Holding session.
        session: u64,
        /// Shared or exclusive.
        shared: bool,
        /// The fence, when known.
        fence: Option<u64>,
    },
    /// A release (`released` `None`: outcome unknown).
    Release {
        /// Holding session.
        session: u64,
        /// The grant's fence.
        fence: u64,
        /// What the server answered.
        released: Option<bool>,
    },
    /// The session's shared grant `from` became an exclusive grant
    /// (`fence` `None`: outcome unknown).
    Upgrade {
        /// Holding session.
        session: u64,
        /// The shared grant's fence.
        from: u64,
        /// The exclusive grant's new fence, when known.
        fence: Option<u64>,
    },
    /// The session's exclusive grant `fence` became shared, keeping its
    /// fence (`known` false: outcome unknown).
    Downgrade {
        /// Holding session.
        session: u64,
        /// The grant's fence.
        fence: u64,
        /// Whether the downgrade answered ok.
        known: bool,
    },
    /// A linearizable read of the holders.
    Describe {
        /// `(session, fence, shared)`, sorted.
        holders: Vec<(u64, u64, bool)>,
    },
    /// The session ended (closed or expired).
    End {
        /// The session.
        session: u64,
    },
}

/// The model's state.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct LockState {
    /// `(session, fence, shared)` sorted; fence 0 = unknown.
    holders: Vec<(u64, u64, bool)>,
    /// Largest known fence granted.
    max_fence: u64,
    /// Ended sessions, sorted.
    ended: Vec<u64>,
}

impl LockState {
    fn compatible(&self, shared: bool) -> bool {
        if shared {
            self.holders.iter().all(|h| h.2)
        } else {
            self.holders.is_empty()
        }
    }

    fn ended(&self, session: u64) -> bool {
        self.ended.binary_search(&session).is_ok()
    }
}

impl Model for LockModel {
    type State = LockState;
    type Op = LockOp;
    type Metadata = ();

    fn init() -> LockState {
        LockState::default()
    }

    fn step(state: &LockState, op: &LockOp) -> (bool, LockState) {
        match op {
            LockOp::Acquire {
                session,
                shared,
                fence: Some(f),
            } => {
                if state.ended(*session) || !state.compatible(*shared) || *f <= state.max_fence {
                    return (false, state.clone());
                }
                let mut s = state.clone();
                s.holders.push((*session, *f, *shared));
                s.holders.sort_unstable();
                s.max_fence = *f;
                (true, s)
            }
            LockOp::Acquire {
                session,
                shared,
                fence: None,
            } => {
                if state.ended(*session) || !state.compatible(*shared) {
                    // Queued and never granted.
                    return (true, state.clone());
                }
                let mut s = state.clone();
                s.holders.push((*session, 0, *shared));
                s.holders.sort_unstable();
                (true, s)
            }
            LockOp::Release {
                session,
                fence,
                released,
            } => {
                let pos = state
                    .holders
                    .iter()
                    .position(|h| h.0 == *session && h.1 == *fence);
                match (released, pos) {
                    (Some(true), Some(i)) | (None, Some(i)) => {
                        let mut s = state.clone();
                        s.holders.remove(i);
                        (true, s)
                    }
                    (Some(true), None) => (false, state.clone()),
                    (Some(false), Some(_)) => (false, state.clone()),
                    (_, None) => (true, state.clone()),
                }
            }
            LockOp::Upgrade {
                session,
                from,
                fence,
            } => {
                // Granted only when the session's read is the lock's only
                // grant; the new fence is above every earlier one.
                let alone = state.holders.as_slice() == [(*session, *from, true)];
                match fence {
                    Some(f) => {
                        if !alone || *f <= state.max_fence {
                            return (false, state.clone());
                        }
                        let mut s = state.clone();
                        s.holders = vec![(*session, *f, false)];
                        s.max_fence = *f;
                        (true, s)
                    }
                    // Unknown: granted at its linearization point if it
                    // could be, else still waiting (it never was).
                    None if alone => {
                        let mut s = state.clone();
                        s.holders = vec![(*session, 0, false)];
                        (true, s)
                    }
                    None => (true, state.clone()),
                }
            }
            LockOp::Downgrade {
                session,
                fence,
                known,
            } => {
                let pos = state
                    .holders
                    .iter()
                    .position(|h| *h == (*session, *fence, false));
                match pos {
                    Some(i) => {
                        let mut s = state.clone();
                        s.holders[i].2 = true;
                        s.holders.sort_unstable();
                        (true, s)
                    }
                    None => (!known, state.clone()),
                }
            }
            LockOp::Describe { holders } => {
                let ok = holders.len() == state.holders.len()
                    && holders.iter().all(|d| {
                        state
                            .holders
                            .iter()
                            .any(|m| m.0 == d.0 && m.2 == d.2 && (m.1 == d.1 || m.1 == 0))
                    });
                (ok, state.clone())
            }
            LockOp::End { session } => {
                let mut s = state.clone();
                s.holders.retain(|h| h.0 != *session);
                if let Err(i) = s.ended.binary_search(session) {
                    s.ended.insert(i, *session);
                }
                (true, s)
            }
        }
    }
}

/// Builds each lock's porcupine history from the paired operations.
pub fn lock_histories(ops: &[Op]) -> BTreeMap<String, Vec<Operation<LockModel>>> {
    let end_of_time = ops
        .iter()
        .flat_map(|o| [Some(o.invoke_ns), o.recorded_ns])
        .flatten()
        .max()
        .unwrap_or(0) as i64
        + 1_000_000_000;
    let ret = |o: &Op| o.complete_ns.map(|c| c as i64).unwrap_or(end_of_time);
    let mut by_lock: BTreeMap<String, Vec<Operation<LockModel>>> = BTreeMap::new();
    // Per session: the invocation of its last proof of life, its open, its
    // close, and the locks it touched.
    let mut alive_at: BTreeMap<u64, i64> = BTreeMap::new();
    let mut closed: BTreeMap<u64, i64> = BTreeMap::new();
    let mut touched: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    for o in ops {
        let session = o.u64("session");
        let mut push = |lock: &str, op: LockOp| {
            by_lock
                .entry(lock.to_string())
                .or_default()
                .push(Operation {
                    client_id: Some(o.process as u32),
                    call_time: o.invoke_ns as i64,
                    return_time: ret(o),
                    op,
                    metadata: None,
                });
        };
        match (o.f.as_str(), o.kind) {
            ("open", Type::Ok) => {
                if let Some(s) = o.u64("session") {
                    alive_at.entry(s).or_insert(o.invoke_ns as i64);
                }
            }
            ("close", Type::Ok) => {
                if let (Some(s), Some(c)) = (session, o.complete_ns) {
                    closed.insert(s, c as i64);
                }
            }
            ("acquire", Type::Ok | Type::Info) => {
                let (Some(lock), Some(s)) = (o.str("lock"), session) else {
                    continue;
                };
                let shared = o.str("mode") == Some("shared");
                let fence = if o.kind == Type::Ok {
                    o.u64("fence")
                } else {
                    None
                };
                if o.kind == Type::Ok {
                    let t = alive_at.entry(s).or_insert(0);
                    *t = (*t).max(o.invoke_ns as i64);
                }
                touched.entry(s).or_default().insert(lock.to_string());
                push(
                    lock,
                    LockOp::Acquire {
                        session: s,
                        shared,
                        fence,
                    },
                );
            }
            ("release", Type::Ok | Type::Info) => {
                let (Some(lock), Some(s), Some(fence)) = (o.str("lock"), session, o.u64("fence"))
                else {
                    continue;
                };
                let released = if o.kind == Type::Ok {
                    o.bool("released")
                } else {
                    None
                };
                if released == Some(true) {
                    let t = alive_at.entry(s).or_insert(0);
                    *t = (*t).max(o.invoke_ns as i64);
                }
                touched.entry(s).or_default().insert(lock.to_string());
                push(
                    lock,
                    LockOp::Release {
                        session: s,
                        fence,
                        released,
                    },
                );
            }
            ("acquire-all", Type::Ok | Type::Info) => {
                // Checked name by name: each grant as an acquire of its
                // own, with its own fence. That the names were granted in
                // one step is for `fence-order` (consecutive fences).
                let Some(s) = session else { continue };
                let specs = if o.kind == Type::Ok {
                    &o.result["grants"]
                } else {
                    &o.invoke["locks"]
                };
                if o.kind == Type::Ok {
                    let t = alive_at.entry(s).or_insert(0);
                    *t = (*t).max(o.invoke_ns as i64);
                }
                for g in specs.as_array().into_iter().flatten() {
                    let Some(lock) = g["lock"].as_str() else {
                        continue;
                    };
                    let fence = if o.kind == Type::Ok {
                        g["fence"].as_u64()
                    } else {
                        None
                    };
                    touched.entry(s).or_default().insert(lock.to_string());
                    push(
                        lock,
                        LockOp::Acquire {
                            session: s,
                            shared: g["mode"].as_str() == Some("shared"),
                            fence,
                        },
                    );
                }
            }
            ("upgrade", Type::Ok | Type::Info) => {
                let (Some(lock), Some(s), Some(from)) =
                    (o.str("lock"), session, o.invoke["fence"].as_u64())
                else {
                    continue;
                };
                let fence = if o.kind == Type::Ok {
                    let t = alive_at.entry(s).or_insert(0);
                    *t = (*t).max(o.invoke_ns as i64);
                    o.result["fence"].as_u64()
                } else {
                    None
                };
                touched.entry(s).or_default().insert(lock.to_string());
                push(
                    lock,
                    LockOp::Upgrade {
                        session: s,
                        from,
                        fence,
                    },
                );
            }
            ("downgrade", Type::Ok | Type::Info) => {
                let (Some(lock), Some(s), Some(fence)) =
                    (o.str("lock"), session, o.invoke["fence"].as_u64())
                else {
                    continue;
                };
                let known = o.kind == Type::Ok;
                if known {
                    let t = alive_at.entry(s).or_insert(0);
                    *t = (*t).max(o.invoke_ns as i64);
                }
                touched.entry(s).or_default().insert(lock.to_string());
                push(
                    lock,
                    LockOp::Downgrade {
                        session: s,
                        fence,
                        known,
                    },
                );
            }
            ("describe", Type::Ok) => {
                let Some(lock) = o.str("lock") else { continue };
                let mut holders: Vec<(u64, u64, bool)> = o
                    .result
                    .get("holders")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|h| {
                        (
                            h["session"].as_u64().unwrap_or(0),
                            h["fence"].as_u64().unwrap_or(0),
                            h["mode"].as_str() == Some("shared"),
                        )
                    })
                    .collect();
                holders.sort_unstable();
                push(lock, LockOp::Describe { holders });
            }
            _ => {}
        }
    }
    for (session, locks) in touched {
        let call = alive_at.get(&session).copied().unwrap_or(0);
        let ret = closed
            .get(&session)
            .copied()
            .filter(|&c| c >= call)
            .unwrap_or(end_of_time);
        for lock in locks {
            by_lock.entry(lock).or_default().push(Operation {
                client_id: None,
                call_time: call,
                return_time: ret,
                op: LockOp::End { session },
                metadata: None,
            });
        }
    }
    by_lock
}

/// Checks every lock with porcupine's search bounded by `timeout` per lock
/// (measured on `std::time::Instant`: the harness's real clock); returns
/// the checker's JSON result and anomalies. Writes porcupine's
/// visualization of a failing lock to `viz_dir`.
pub fn check(ops: &[Op], timeout: Duration, viz_dir: &std::path::Path) -> (Value, Vec<Value>) {
    check_by(ops, |lock, history| {
        let started = std::time::Instant::now();
        let result = porcupine_rs::check_operations_timeout::<LockModel>(history, timeout);
        let mut entry = json!({"ms": started.elapsed().as_millis() as u64});
        if result == CheckResult::Illegal {
            let file = viz_dir.join(format!(
                "linearizability-{}.html",
                lock.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
            ));
            let (_, info) =
                porcupine_rs::check_operations_info_timeout::<LockModel>(history, timeout);
            if porcupine_rs::visualize_path::<LockModel>(&info, &file).is_ok() {
                entry["visualization"] = json!(file.display().to_string());
            }
        }
        (result, entry)
    })
}

/// Checks every lock with porcupine's search run to its end, reading no
/// clock: the verdict is the search's, never "unknown". For a caller that
/// bounds the time itself (the simulator, whose `Instant` is simulated and
/// stands still while it checks, so porcupine's own timeout would never
/// fire).
pub fn check_unbounded(ops: &[Op]) -> (Value, Vec<Value>) {
    check_by(ops, |_, history| {
        let result = if porcupine_rs::check_operations::<LockModel>(history) {
            CheckResult::Ok
        } else {
            CheckResult::Illegal
        };
        (result, json!({}))
    })
}

/// Checks every lock's history with `search`, which answers the verdict
/// and fields for that lock's entry in the result (`visualization`, if it
/// has one, is repeated in the anomaly).
fn check_by(
    ops: &[Op],
    mut search: impl FnMut(&str, &[Operation<LockModel>]) -> (CheckResult, Value),
) -> (Value, Vec<Value>) {
    let mut per_lock = serde_json::Map::new();
    let mut anomalies = Vec::new();
    let mut valid = true;
    let mut unknown = false;
    for (lock, history) in lock_histories(ops) {
        let (result, found) = search(&lock, &history);
        let verdict = match result {
            CheckResult::Ok => "linearizable",
            CheckResult::Illegal => "not linearizable",
            CheckResult::Unknown => "unknown (search timed out)",
        };
        let mut entry = json!({"ops": history.len(), "result": verdict});
        if let (Some(entry), Value::Object(found)) = (entry.as_object_mut(), found) {
            entry.extend(found);
        }
        if result == CheckResult::Illegal {
            valid = false;
            anomalies.push(json!({
                "checker": "linearizability",
                "lock": lock,
                "message": "no linearization of this lock's operations satisfies the lock model",
                "visualization": entry.get("visualization"),
            }));
        }
        if result == CheckResult::Unknown {
            unknown = true;
        }
        per_lock.insert(lock, entry);
    }
    (
        json!({
            "valid": valid,
            "unknown": unknown,
            "model": "lock: holders, monotonic fences per lock, session ends",
            "checker": "porcupine-rs (Wing-Gong-Lowe with caching)",
            "locks": per_lock,
        }),
        anomalies,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{pair_ops, Event, Process};

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
}
