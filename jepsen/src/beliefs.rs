//! The belief oracle (`beliefs` in `results.json`): while a client that
//! follows the duties believes it holds a grant, nobody else holds it
//! (docs/concepts/sessions-and-leases.md, "The lease rule").
//!
//! The `leases` workload's clients record, for every grant they were
//! given, the spans during which they believed they held it, counted as
//! the rule says (a `belief` operation, written when the belief ended; see
//! [`crate::workload::leases`]). The cluster's grants are seen in the
//! history: `watch` events of kind `granted` (on any node) and the
//! answers of `acquire`, `acquire-all` and `upgrade` operations. Two
//! checks:
//!
//! 1. **Beliefs never overlap.** Two beliefs on one name, by different
//!    sessions, in conflicting modes (one of them exclusive), never
//!    overlap in time.
//! 2. **No belief outlives a grant to another.** No belief runs past the
//!    moment the cluster granted its name to another session in a
//!    conflicting mode with a larger fence. The moment is the earliest
//!    sighting of that grant: a watch event's arrival or an answer's,
//!    both recorded after the grant was made, so the check can only be
//!    late, never early.
//!
//! Every time on the harness's side errs the same way: a span starts when
//! the granting answer *arrived* and its count runs from the moment just
//! *before* the request was sent, so a recorded belief is never longer
//! than the client's real one. Both checks are therefore conservative:
//! what they report happened. Beliefs and grants of different cluster
//! generations (a restore in between) are not compared. As for the lease
//! views of [`crate::leases`], what touches a `clock` fault (until
//! [`crate::leases::CLOCK_EXCUSE_NS`] after it healed) is counted in
//! `excused_by_clock` and not failed: the rule holds while clock rates
//! agree.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::history::{Op, Type};
use crate::leases::CLOCK_EXCUSE_NS;
use crate::nemesis::{NemesisKind, Window};

/// At most this many anomalies of each kind are listed.
const MAX_LISTED: usize = 20;

/// How a grant is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Held {
    /// Alone.
    Exclusive,
    /// Beside other shared holders.
    Shared,
}

impl Held {
    /// From the history's spelling (`exclusive`, `shared`); `None` for
    /// anything else (semaphore permits are not checked here).
    pub fn parse(mode: &str) -> Option<Held> {
        match mode {
            "exclusive" => Some(Held::Exclusive),
            "shared" => Some(Held::Shared),
            _ => None,
        }
    }

    /// As the history spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Held::Exclusive => "exclusive",
            Held::Shared => "shared",
        }
    }

    fn conflicts(self, other: Held) -> bool {
        self == Held::Exclusive || other == Held::Exclusive
    }
}

/// One span during which a client believed it held a grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Belief {
    /// The cluster generation (restores moved through).
    pub gen: u64,
    /// The name.
    pub lock: String,
    /// The holding session.
    pub session: u64,
    /// The grant's fence.
    pub fence: u64,
    /// The mode believed.
    pub held: Held,
    /// From (ns since the start of the run)...
    pub from: u64,
    /// ... until (exclusive).
    pub until: u64,
    /// The path that gave and kept the grant.
    pub path: String,
    /// The client process that believed it.
    pub process: u64,
}

impl Belief {
    fn describe(&self) -> String {
        format!(
            "session {} ({}, process {}) believed fence {} ({}) from {:.3} s until {:.3} s",
            self.session,
            self.path,
            self.process,
            self.fence,
            self.held.as_str(),
            secs(self.from),
            secs(self.until)
        )
    }

    fn json(&self) -> Value {
        json!({"session": self.session, "fence": self.fence, "mode": self.held.as_str(),
               "from_ns": self.from, "until_ns": self.until, "path": self.path,
               "process": self.process, "gen": self.gen})
    }
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// A grant as the cluster made it, first seen at `seen`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sighting {
    /// The holding session.
    pub session: u64,
    /// How it is held.
    pub held: Held,
    /// When the harness first saw it (ns since the start of the run).
    pub seen: u64,
    /// Where it was seen.
    pub how: String,
}

/// Grants by (generation, name, fence).
pub type Sightings = BTreeMap<(u64, String, u64), Sighting>;

fn gen(o: &Op) -> u64 {
    o.invoke.get("gen").and_then(Value::as_u64).unwrap_or(0)
}

/// The spans of every `belief` operation. Its invocation carries `lock`,
/// `mode`, `session`, `fence`, `gen`, `path`, `process` and `spans`
/// (`[[from_ns, until_ns], ...]`); empty spans are left out.
pub fn beliefs(ops: &[Op]) -> Vec<Belief> {
    let mut out = Vec::new();
    for o in ops.iter().filter(|o| o.f == "belief") {
        let v = &o.invoke;
        let (Some(lock), Some(held), Some(session), Some(fence)) = (
            v["lock"].as_str(),
            v["mode"].as_str().and_then(Held::parse),
            v["session"].as_u64(),
            v["fence"].as_u64(),
        ) else {
            continue;
        };
        for span in v["spans"].as_array().into_iter().flatten() {
            let (Some(from), Some(until)) = (span[0].as_u64(), span[1].as_u64()) else {
                continue;
            };
            if from < until {
                out.push(Belief {
                    gen: gen(o),
                    lock: lock.to_string(),
                    session,
                    fence,
                    held,
                    from,
                    until,
                    path: v["path"].as_str().unwrap_or("?").to_string(),
                    process: v["process"].as_u64().unwrap_or(o.process),
                });
            }
        }
    }
    out
}

/// Every grant the history shows, at its earliest sighting: `watch`
/// events of kind `granted` (their `mode`, exclusive if unsaid), and the
/// answers of `acquire`, `acquire-all` and `upgrade`.
pub fn sightings(ops: &[Op]) -> Sightings {
    let mut out = Sightings::new();
    let mut saw = |gen: u64, lock: &str, fence: u64, session: u64, held: Held, t: u64, how| {
        let key = (gen, lock.to_string(), fence);
        if out.get(&key).is_none_or(|s| t < s.seen) {
            out.insert(
                key,
                Sighting {
                    session,
                    held,
                    seen: t,
                    how,
                },
            );
        }
    };
    for o in ops.iter().filter(|o| o.kind == Type::Ok) {
        let Some(t) = o.complete_ns else { continue };
        match o.f.as_str() {
            "watch" if o.result["kind"] == "granted" => {
                let r = &o.result;
                let (Some(lock), Some(fence), Some(session)) = (
                    r["name"].as_str(),
                    r["fence"].as_u64(),
                    r["session"].as_u64(),
                ) else {
                    continue;
                };
                let Some(held) = Held::parse(r["mode"].as_str().unwrap_or("exclusive")) else {
                    continue;
                };
                saw(
                    gen(o),
                    lock,
                    fence,
                    session,
                    held,
                    t,
                    format!("a watch on node {}", o.invoke["node"]),
                );
            }
            "acquire" => {
                let (Some(lock), Some(fence), Some(session)) =
                    (o.str("lock"), o.u64("fence"), o.u64("session"))
                else {
                    continue;
                };
                let Some(held) = Held::parse(o.str("mode").unwrap_or("exclusive")) else {
                    continue;
                };
                saw(
                    gen(o),
                    lock,
                    fence,
                    session,
                    held,
                    t,
                    format!("the answer to process {}", o.process),
                );
            }
            "acquire-all" => {
                let Some(session) = o.u64("session") else {
                    continue;
                };
                for g in o.result["grants"].as_array().into_iter().flatten() {
                    let (Some(lock), Some(fence)) = (g["lock"].as_str(), g["fence"].as_u64())
                    else {
                        continue;
                    };
                    let Some(held) = Held::parse(g["mode"].as_str().unwrap_or("exclusive")) else {
                        continue;
                    };
                    saw(
                        gen(o),
                        lock,
                        fence,
                        session,
                        held,
                        t,
                        format!("the answer to process {}", o.process),
                    );
                }
            }
            "upgrade" => {
                let (Some(lock), Some(fence), Some(session)) =
                    (o.str("lock"), o.result["fence"].as_u64(), o.u64("session"))
                else {
                    continue;
                };
                saw(
                    gen(o),
                    lock,
                    fence,
                    session,
                    Held::Exclusive,
                    t,
                    format!("the upgrade answer to process {}", o.process),
                );
            }
            _ => {}
        }
    }
    out
}

/// The belief oracle over a run's operations and faults.
pub fn check(ops: &[Op], windows: &[Window]) -> (Value, Vec<Value>) {
    let all = beliefs(ops);
    let seen = sightings(ops);
    let clock: Vec<(u64, u64)> = windows
        .iter()
        .filter(|w| w.kind == NemesisKind::Clock)
        .map(|w| (w.start_ns, w.end_ns + CLOCK_EXCUSE_NS))
        .collect();
    let excused = |lo: u64, hi: u64| clock.iter().any(|&(s, e)| s <= hi && lo < e);
    let mut anomalies = Vec::new();
    let (mut overlaps, mut past, mut by_clock) = (0u64, 0u64, 0u64);

    // 1. Conflicting beliefs of different sessions never overlap.
    let mut by_lock: BTreeMap<(u64, &str), Vec<&Belief>> = BTreeMap::new();
    for b in &all {
        by_lock.entry((b.gen, &b.lock)).or_default().push(b);
    }
    for list in by_lock.values_mut() {
        list.sort_by_key(|b| (b.from, b.until));
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                if b.from >= a.until {
                    break;
                }
                if a.session == b.session || !a.held.conflicts(b.held) {
                    continue;
                }
                let (lo, hi) = (b.from, a.until.min(b.until));
                if excused(lo, hi) {
                    by_clock += 1;
                    continue;
                }
                overlaps += 1;
                if overlaps as usize <= MAX_LISTED {
                    anomalies.push(json!({
                        "checker": "beliefs",
                        "message": format!(
                            "{}: beliefs overlap for {:.1} ms: {}, while {}",
                            a.lock, (hi - lo) as f64 / 1e6, a.describe(), b.describe()
                        ),
                        "lock": a.lock,
                        "beliefs": [a.json(), b.json()],
                    }));
                }
            }
        }
    }

    // 2. No belief runs past a grant of its name to another session.
    for b in &all {
        let later =
            seen.range((b.gen, b.lock.clone(), b.fence + 1)..=(b.gen, b.lock.clone(), u64::MAX));
        // The earliest conflicting grant to another session that came
        // before the belief ended (one anomaly per belief).
        let Some(((_, _, fence), g)) = later
            .filter(|(_, g)| g.session != b.session && g.held.conflicts(b.held) && g.seen < b.until)
            .min_by_key(|(_, g)| g.seen)
        else {
            continue;
        };
        if excused(g.seen, b.until) {
            by_clock += 1;
            continue;
        }
        past += 1;
        if past as usize <= MAX_LISTED {
            anomalies.push(json!({
                "checker": "beliefs",
                "message": format!(
                    "{}: {}, but the cluster had granted it to session {} with fence {} ({}) \
                     by {:.3} s ({}), {:.1} ms before the belief ended",
                    b.lock, b.describe(), g.session, fence, g.held.as_str(), secs(g.seen),
                    g.how, (b.until - g.seen) as f64 / 1e6
                ),
                "lock": b.lock,
                "belief": b.json(),
                "grant": {"session": g.session, "fence": fence, "mode": g.held.as_str(),
                          "seen_ns": g.seen, "how": g.how},
            }));
        }
    }

    let mut paths: BTreeMap<&str, u64> = BTreeMap::new();
    let mut believed_grants = 0u64;
    let mut restored = 0u64;
    for o in ops.iter().filter(|o| o.f == "belief") {
        believed_grants += 1;
        *paths
            .entry(o.invoke["path"].as_str().unwrap_or("?"))
            .or_default() += 1;
        let spans = o.invoke["spans"].as_array().map_or(0, Vec::len) as u64;
        restored += spans.saturating_sub(1);
    }
    let believed_ms: u64 = all.iter().map(|b| (b.until - b.from) / 1_000_000).sum();
    (
        json!({"valid": overlaps == 0 && past == 0,
               "beliefs": believed_grants, "spans": all.len(), "restored_spans": restored,
               "believed_ms": believed_ms, "grants_seen": seen.len(),
               "overlaps": overlaps, "past_a_grant": past, "excused_by_clock": by_clock,
               "paths": paths}),
        anomalies,
    )
}

/// The `ghosts` checker: a round of the `leases` workload's `ghost` path
/// (a waiter killed just before the hand-off, then the worker waiting for
/// the name itself) whose worker was not granted the name, while no fault
/// was active from the round's start to its end, means the dead waiter
/// kept it. Rounds that overlap a fault are counted, not judged (a
/// partition or a pause can keep anyone from the name that long).
pub fn ghosts(ops: &[Op], windows: &[Window]) -> (Value, Vec<Value>) {
    let (mut rounds, mut freed, mut kept, mut excused) = (0u64, 0u64, 0u64, 0u64);
    let mut waits_ms = Vec::new();
    let mut anomalies = Vec::new();
    for o in ops.iter().filter(|o| o.f == "ghost") {
        rounds += 1;
        match o.kind {
            Type::Ok => {
                freed += 1;
                if let Some(ms) = o.result["next_granted_after_ms"].as_u64() {
                    waits_ms.push(ms);
                }
            }
            Type::Fail => {
                let from = o.invoke["round_started_ns"].as_u64().unwrap_or(o.invoke_ns);
                let to = o.complete_ns.unwrap_or(u64::MAX);
                if windows.iter().any(|w| w.start_ns <= to && from <= w.end_ns) {
                    excused += 1;
                    continue;
                }
                kept += 1;
                if anomalies.len() < MAX_LISTED {
                    anomalies.push(json!({
                        "checker": "ghosts",
                        "message": format!(
                            "{}: a waiter killed {} ms after the holder's release was sent kept \
                             the name: {} (released at {:.3} s, no fault active)",
                            o.invoke["lock"].as_str().unwrap_or("?"),
                            o.invoke["kill_after_release_ms"],
                            o.result["error"].as_str().unwrap_or("not granted"),
                            secs(o.invoke["released_ns"].as_u64().unwrap_or(0)),
                        ),
                        "lock": o.invoke["lock"],
                    }));
                }
            }
            _ => excused += 1,
        }
    }
    waits_ms.sort_unstable();
    let max_wait = waits_ms.last().copied();
    (
        json!({"valid": kept == 0, "rounds": rounds, "freed": freed, "kept": kept,
               "excused_by_faults": excused, "next_grant_max_ms": max_wait}),
        anomalies,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{pair_ops, Event, Process};

    const MS: u64 = 1_000_000;

    #[derive(Default)]
    struct H(Vec<Event>, u64);

    impl H {
        fn op(&mut self, f: &str, t0: u64, t1: u64, invoke: Value, result: Value) {
            self.op_as(Type::Ok, f, t0, t1, invoke, result);
        }

        fn op_as(&mut self, end: Type, f: &str, t0: u64, t1: u64, invoke: Value, result: Value) {
            self.1 += 1;
            let p = Process::Client(self.1);
            for (kind, value, time_ns) in [(Type::Invoke, invoke, t0), (end, result, t1)] {
                self.0.push(Event {
                    process: p.clone(),
                    kind,
                    f: f.into(),
                    value,
                    time_ns,
                });
            }
        }

        /// A belief of `session` in `fence` on `x` over `spans` (ms).
        fn belief(&mut self, session: u64, fence: u64, mode: &str, spans: &[(u64, u64)]) {
            let end = spans.last().map_or(0, |s| s.1) * MS;
            let spans: Vec<Value> = spans.iter().map(|(a, b)| json!([a * MS, b * MS])).collect();
            self.op(
                "belief",
                end,
                end,
                json!({"lock": "x", "mode": mode, "session": session, "fence": fence,
                       "gen": 0, "path": "test", "process": session, "spans": spans}),
                json!({}),
            );
        }

        /// A `granted` watch event of `fence` to `session`, arriving at `t` ms.
        fn watched(&mut self, session: u64, fence: u64, mode: &str, t: u64) {
            self.op(
                "watch",
                0,
                t * MS,
                json!({"node": 2, "gen": 0}),
                json!({"kind": "granted", "name": "x", "session": session, "fence": fence,
                       "mode": mode, "index": 9}),
            );
        }

        fn check(&self, windows: &[Window]) -> (Value, Vec<Value>) {
            let mut events = self.0.clone();
            events.sort_by_key(|e| e.time_ns);
            check(&pair_ops(&events), windows)
        }
    }

    #[test]
    fn beliefs_one_after_another_are_fine() {
        let mut h = H::default();
        h.belief(1, 10, "exclusive", &[(0, 100)]);
        h.belief(2, 11, "exclusive", &[(100, 200)]);
        h.watched(2, 11, "exclusive", 100);
        let (r, found) = h.check(&[]);
        assert_eq!(r["valid"], json!(true), "{found:?}");
        assert_eq!(r["beliefs"], json!(2));
        assert_eq!(r["grants_seen"], json!(1));
    }

    #[test]
    fn overlapping_conflicting_beliefs_of_two_sessions_are_caught() {
        let mut h = H::default();
        h.belief(1, 10, "exclusive", &[(0, 100)]);
        h.belief(2, 11, "exclusive", &[(99, 200)]);
        let (r, found) = h.check(&[]);
        assert_eq!(r["valid"], json!(false));
        assert_eq!(r["overlaps"], json!(1), "{found:?}");
        assert!(found[0]["message"]
            .as_str()
            .unwrap()
            .contains("beliefs overlap"));
        // Shared beside shared is fine; shared beside exclusive is not.
        let mut h = H::default();
        h.belief(1, 10, "shared", &[(0, 100)]);
        h.belief(2, 11, "shared", &[(50, 150)]);
        assert_eq!(h.check(&[]).0["valid"], json!(true));
        let mut h = H::default();
        h.belief(1, 10, "shared", &[(0, 100)]);
        h.belief(3, 12, "exclusive", &[(50, 150)]);
        assert_eq!(h.check(&[]).0["overlaps"], json!(1));
        // One session's own grants (an upgrade) never conflict.
        let mut h = H::default();
        h.belief(1, 10, "shared", &[(0, 100)]);
        h.belief(1, 12, "exclusive", &[(50, 150)]);
        assert_eq!(h.check(&[]).0["valid"], json!(true));
    }

    /// The old node's nonce retry: the client counts from the retry's
    /// send, the leader expired the session a ttl after the first answer
    /// and granted the name to a waiting contender, whose answer and the
    /// watch event both came inside the retrying client's count.
    #[test]
    fn a_belief_past_a_grant_to_another_is_caught() {
        let mut h = H::default();
        h.belief(1, 10, "exclusive", &[(0, 2_900)]);
        h.watched(2, 11, "exclusive", 2_000);
        h.op(
            "acquire",
            1_500 * MS,
            2_010 * MS,
            json!({"lock": "x", "mode": "exclusive", "gen": 0}),
            json!({"lock": "x", "mode": "exclusive", "session": 2, "fence": 11}),
        );
        let (r, found) = h.check(&[]);
        assert_eq!(r["valid"], json!(false));
        assert_eq!(r["past_a_grant"], json!(1), "{found:?}");
        let message = found[0]["message"].as_str().unwrap();
        assert!(
            message.contains("granted it to session 2 with fence 11")
                && message.contains("by 2.000 s (a watch on node 2)"),
            "{message}"
        );
        // Seen only from the acquirer's answer: caught all the same.
        let mut h = H::default();
        h.belief(1, 10, "exclusive", &[(0, 2_900)]);
        h.op(
            "acquire",
            1_500 * MS,
            2_010 * MS,
            json!({"lock": "x", "mode": "exclusive"}),
            json!({"lock": "x", "mode": "exclusive", "session": 2, "fence": 11}),
        );
        assert_eq!(h.check(&[]).0["past_a_grant"], json!(1));
    }

    #[test]
    fn grants_that_are_not_anothers_later_conflicting_ones_are_fine() {
        // Seen at the moment the belief ended: fine.
        let mut h = H::default();
        h.belief(1, 10, "exclusive", &[(0, 100)]);
        h.watched(2, 11, "exclusive", 100);
        assert_eq!(h.check(&[]).0["valid"], json!(true));
        // A smaller fence (an older grant, answered late), the same
        // session's later grant, and a shared grant beside a shared belief.
        let mut h = H::default();
        h.belief(1, 10, "shared", &[(0, 100)]);
        h.watched(2, 9, "exclusive", 50);
        h.watched(1, 12, "exclusive", 60);
        h.watched(3, 13, "shared", 70);
        let (r, found) = h.check(&[]);
        assert_eq!(r["valid"], json!(true), "{found:?}");
        // An upgrade's answer is an exclusive grant.
        let mut h = H::default();
        h.belief(1, 10, "shared", &[(0, 100)]);
        h.op(
            "upgrade",
            40 * MS,
            60 * MS,
            json!({"lock": "x", "fence": 8, "session": 3}),
            json!({"lock": "x", "session": 3, "from_fence": 8, "fence": 14, "mode": "exclusive"}),
        );
        assert_eq!(h.check(&[]).0["past_a_grant"], json!(1));
    }

    /// A count that ran out and was restored by a later lease-starting
    /// answer: a grant to another while it had lapsed is fine only if the
    /// belief never came back after it.
    #[test]
    fn a_restored_span_counts_from_its_restoring_answer() {
        let mut h = H::default();
        h.belief(1, 10, "exclusive", &[(0, 100), (150, 300)]);
        h.belief(2, 11, "exclusive", &[(110, 140)]);
        let (r, found) = h.check(&[]);
        assert_eq!(r["overlaps"], json!(0), "{found:?}");
        assert_eq!(r["restored_spans"], json!(1));
        // But the grant to session 2 came before the restored span
        // ended: the session lost its name while its client believed it.
        h.watched(2, 11, "exclusive", 105);
        let (r, found) = h.check(&[]);
        assert_eq!(r["past_a_grant"], json!(1), "{found:?}");
    }

    #[test]
    fn a_ghost_round_whose_next_waiter_waited_in_vain_fails_unless_a_fault_was_on() {
        let round = |h: &mut H, ok: bool| {
            h.op_as(
                if ok { Type::Ok } else { Type::Fail },
                "ghost",
                1_000 * MS,
                21_500 * MS,
                json!({"lock": "bl/g0.1", "kill_after_release_ms": 4,
                       "round_started_ns": 600 * MS, "released_ns": 1_400 * MS}),
                if ok {
                    json!({"next_granted_after_ms": 3})
                } else {
                    json!({"error": "the name was not granted to the next waiter in 20100 ms"})
                },
            );
        };
        let mut h = H::default();
        round(&mut h, true);
        let (r, _) = ghosts(&pair_ops(&h.0), &[]);
        assert_eq!(r["valid"], json!(true));
        assert_eq!(r["freed"], json!(1));
        let mut h = H::default();
        round(&mut h, false);
        let (r, found) = ghosts(&pair_ops(&h.0), &[]);
        assert_eq!(r["valid"], json!(false));
        assert_eq!(r["kept"], json!(1));
        assert!(found[0]["message"]
            .as_str()
            .unwrap()
            .contains("killed 4 ms after the holder's release was sent kept the name"));
        // A partition during the round excuses it.
        let partition = Window {
            kind: NemesisKind::Partition,
            variant: "halves".into(),
            nodes: vec![1],
            detail: json!({}),
            start_ns: 5_000 * MS,
            end_ns: 8_000 * MS,
        };
        let (r, _) = ghosts(&pair_ops(&h.0), &[partition]);
        assert_eq!(r["valid"], json!(true));
        assert_eq!(r["excused_by_faults"], json!(1));
    }

    #[test]
    fn generations_are_not_compared_and_clock_faults_excuse() {
        let mut h = H::default();
        h.belief(1, 10, "exclusive", &[(0, 100)]);
        h.op(
            "belief",
            0,
            0,
            json!({"lock": "x", "mode": "exclusive", "session": 2, "fence": 11, "gen": 1,
                   "path": "test", "process": 2, "spans": [[50 * MS, 150 * MS]]}),
            json!({}),
        );
        assert_eq!(h.check(&[]).0["valid"], json!(true));
        let clock = Window {
            kind: NemesisKind::Clock,
            variant: "leader-fast".into(),
            nodes: vec![1],
            detail: json!({}),
            start_ns: 0,
            end_ns: 10 * MS,
        };
        let mut h = H::default();
        h.belief(1, 10, "exclusive", &[(0, 100)]);
        h.belief(2, 11, "exclusive", &[(50, 150)]);
        h.watched(2, 11, "exclusive", 50);
        let (r, found) = h.check(&[clock]);
        assert_eq!(r["valid"], json!(true), "{found:?}");
        assert_eq!(r["excused_by_clock"], json!(2));
    }
}
