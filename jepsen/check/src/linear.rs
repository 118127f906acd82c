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
mod tests;
