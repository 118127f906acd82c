//! Checks of the nodes themselves, from the sampler's and the
//! supervisor's records ([`crate::supervise`]).
//!
//! * `no-zombie`: every node process either serves or has exited. A node
//!   *serves* when it answers `Status` as a member and its applied index
//!   follows the cluster's: at every sample it has applied at least what
//!   the most advanced node had applied [`FOLLOW_LAG`] before, or at least
//!   its applied index moved in the last [`PROGRESS_WINDOW`] (a follower
//!   on a slow disk falls behind but works); and its Raft core runs
//!   (`Status` does not say `shutdown`). A node
//!   that is up (not paused by the nemesis), says `SERVING` to gRPC
//!   health, and does not serve for longer than [`ZOMBIE_BOUND`] is a
//!   zombie: its health lies (the failure of review finding 4, a stopped
//!   Raft core behind a green probe). A node that says `NOT_SERVING`, or
//!   does not answer, is honest and not a zombie. At the end of the run
//!   (after healing and recovery) every member that is up must have
//!   served in the last [`END_WINDOW`].
//! * `node-exits`: a node may exit on its own only while its disk fails
//!   (the `disk-error` nemesis, up to [`EXIT_GRACE`] after it heals, and
//!   the restarts in between): that is the fail-stop the design asks for.
//!   Or after the membership nemesis asked to remove it, with status 0
//!   and the line saying the cluster removed it: raftlockd leaves a
//!   cluster that removed it. Any other exit is an anomaly: something a
//!   node should have survived (a message from a hostile peer, a restart
//!   after a power loss) ended it.

use std::collections::{BTreeMap, HashMap};

use serde_json::{json, Value};

use crate::history::{Event, Process, Type};
use crate::nemesis::{NemesisKind, Window};

/// How far behind the most advanced node a serving node may be: it must
/// have applied, at each sample, what that node had applied this long
/// before (a few election timeouts of the default 300-500 ms, and room for
/// a slow disk and a loaded debug build).
pub const FOLLOW_LAG_NS: u64 = 2_000_000_000;

/// [`FOLLOW_LAG_NS`] as a duration, for the docs.
pub const FOLLOW_LAG: std::time::Duration = std::time::Duration::from_nanos(FOLLOW_LAG_NS);

/// A node whose applied index moved within this long is working, however
/// far behind it is.
pub const PROGRESS_WINDOW_NS: u64 = 3_000_000_000;

/// [`PROGRESS_WINDOW_NS`] as a duration.
pub const PROGRESS_WINDOW: std::time::Duration =
    std::time::Duration::from_nanos(PROGRESS_WINDOW_NS);

/// How long a node may say `SERVING` without serving before it counts as
/// a zombie.
pub const ZOMBIE_BOUND_NS: u64 = 3_000_000_000;

/// [`ZOMBIE_BOUND_NS`] as a duration.
pub const ZOMBIE_BOUND: std::time::Duration = std::time::Duration::from_nanos(ZOMBIE_BOUND_NS);

/// The end of the run: each member that is up must have served within
/// this long before the last sample.
pub const END_WINDOW_NS: u64 = 3_000_000_000;

/// [`END_WINDOW_NS`] as a duration.
pub const END_WINDOW: std::time::Duration = std::time::Duration::from_nanos(END_WINDOW_NS);

/// How long after a disk fault heals a node may still exit because of it
/// (an exit takes up to a second after the failed write, a restart
/// follows the supervisor's delay).
pub const EXIT_GRACE_NS: u64 = 5_000_000_000;

/// [`EXIT_GRACE_NS`] as a duration.
pub const EXIT_GRACE: std::time::Duration = std::time::Duration::from_nanos(EXIT_GRACE_NS);

/// One node in one sample.
#[derive(Clone, Debug)]
struct Seen {
    alive: bool,
    paused: bool,
    serving_health: bool,
    applied: Option<u64>,
    members: Option<Vec<u64>>,
    role: Option<String>,
}

fn seen(v: &Value) -> Seen {
    Seen {
        alive: v["alive"].as_bool().unwrap_or(false),
        paused: v["paused"].as_bool().unwrap_or(false),
        serving_health: v["health"].as_str() == Some("serving"),
        applied: v["applied"].as_u64(),
        members: v["members"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect()),
        role: v["role"].as_str().map(str::to_string),
    }
}

/// The samples of one cluster (directory), in time order:
/// `(time, [(id, seen)])`.
type Series = Vec<(u64, Vec<(u64, Seen)>)>;

fn series(events: &[Event]) -> BTreeMap<String, Series> {
    let mut out: BTreeMap<String, Series> = BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| e.process == Process::NEMESIS && e.f == "sample")
    {
        let dir = e.value["cluster_dir"].as_str().unwrap_or("").to_string();
        let nodes = e.value["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| Some((n["id"].as_u64()?, seen(n))))
            .collect();
        out.entry(dir).or_default().push((e.time_ns, nodes));
    }
    out
}

/// The `no-zombie` check over the history's samples.
pub fn no_zombie(events: &[Event]) -> (Value, Vec<Value>) {
    let mut anomalies = Vec::new();
    let mut samples = 0;
    let mut checked = 0;
    for (dir, series) in series(events) {
        samples += series.len();
        // The most advanced applied index at each sample, and the
        // membership of the node that had it.
        let reference: Vec<(u64, u64, Vec<u64>)> = series
            .iter()
            .map(|(t, nodes)| {
                let best = nodes
                    .iter()
                    .filter_map(|(_, s)| Some((s.applied?, s.members.clone().unwrap_or_default())))
                    .max_by_key(|(a, _)| *a);
                let (applied, members) = best.unwrap_or((0, Vec::new()));
                (*t, applied, members)
            })
            .collect();
        let applied_by = |t: u64| -> u64 {
            // What the most advanced node had applied at the latest sample
            // no later than `t`.
            let i = reference.partition_point(|(rt, _, _)| *rt <= t);
            if i == 0 {
                0
            } else {
                reference[i - 1].1
            }
        };
        // Per node: since when it has said SERVING without serving.
        let mut bad_since: HashMap<u64, (u64, Value)> = HashMap::new();
        let mut last_served: HashMap<u64, u64> = HashMap::new();
        let mut reported: HashMap<u64, bool> = HashMap::new();
        // Per node, its applied index at each sample since it last came up.
        let mut seen_applied: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
        for (i, (t, nodes)) in series.iter().enumerate() {
            let members = &reference[i].2;
            for (id, s) in nodes {
                if !s.alive || s.paused || !members.contains(id) {
                    bad_since.remove(id);
                    reported.remove(id);
                    seen_applied.remove(id);
                    // Not up or not a member: nothing to serve.
                    last_served.insert(*id, *t);
                    continue;
                }
                checked += 1;
                let due = applied_by(t.saturating_sub(FOLLOW_LAG_NS));
                // A node whose core has stopped ("shutdown") follows
                // nothing, whatever its applied index says.
                let past = seen_applied.entry(*id).or_default();
                if let Some(a) = s.applied {
                    past.push((*t, a));
                }
                // Its applied index moved within the window (or it has not
                // been up that long).
                let progressing = match (s.applied, past.first()) {
                    (Some(a), Some(&(first, _))) if t - first >= PROGRESS_WINDOW_NS => {
                        let i = past.partition_point(|(pt, _)| *pt <= t - PROGRESS_WINDOW_NS);
                        past[i.saturating_sub(1)].1 < a
                    }
                    (Some(_), _) => true,
                    (None, _) => false,
                };
                let follows = (s.applied.is_some_and(|a| a >= due) || progressing)
                    && s.members.as_ref().is_some_and(|m| m.contains(id))
                    && s.role.as_deref() != Some("shutdown");
                if follows && s.serving_health {
                    last_served.insert(*id, *t);
                }
                if s.serving_health && !follows {
                    let (since, _) = bad_since.entry(*id).or_insert_with(|| {
                        (
                            *t,
                            json!({"applied": s.applied, "due": due, "role": s.role}),
                        )
                    });
                    let since = *since;
                    if t - since > ZOMBIE_BOUND_NS && !reported.get(id).copied().unwrap_or(false) {
                        reported.insert(*id, true);
                        anomalies.push(json!({
                            "checker": "no-zombie",
                            "message": format!(
                                "node {id} said SERVING but did not follow from {:.1} s to {:.1} s \
                                 (applied {}, while the cluster had applied {} by {:.1} s; role {})",
                                since as f64 / 1e9, *t as f64 / 1e9,
                                s.applied.map_or("unknown".into(), |a| a.to_string()),
                                due, t.saturating_sub(FOLLOW_LAG_NS) as f64 / 1e9,
                                s.role.as_deref().unwrap_or("unknown"),
                            ),
                            "node": id, "cluster_dir": dir, "since_ns": since, "time_ns": t,
                            "applied": s.applied, "cluster_applied": due, "role": s.role,
                        }));
                    }
                } else {
                    bad_since.remove(id);
                    reported.remove(id);
                }
            }
        }
        // The end: every member that is up served recently.
        if let (Some((end, nodes)), Some((_, _, members))) = (series.last(), reference.last()) {
            for (id, s) in nodes {
                if !s.alive || s.paused || !members.contains(id) {
                    continue;
                }
                let served = last_served.get(id).copied();
                if served.is_none_or(|t| end - t > END_WINDOW_NS) {
                    anomalies.push(json!({
                        "checker": "no-zombie",
                        "message": format!(
                            "node {id} was up at the end of the run ({:.1} s) but had not served \
                             since {} (health {}, applied {}, role {})",
                            *end as f64 / 1e9,
                            served.map_or("the start".into(), |t| format!("{:.1} s", t as f64 / 1e9)),
                            if s.serving_health { "SERVING" } else { "not SERVING" },
                            s.applied.map_or("unknown".into(), |a| a.to_string()),
                            s.role.as_deref().unwrap_or("unknown"),
                        ),
                        "node": id, "cluster_dir": dir, "time_ns": end, "end": true,
                    }));
                }
            }
        }
    }
    (
        json!({"valid": anomalies.is_empty(), "samples": samples, "checked": checked,
               "zombies": anomalies.len()}),
        anomalies,
    )
}

/// The `node-exits` check: exits only while a disk fails, or, with
/// status 0 and a line saying so, after the node was removed from the
/// cluster (a removal the membership nemesis asked for before the exit).
pub fn node_exits(events: &[Event], windows: &[Window]) -> (Value, Vec<Value>) {
    let disk: Vec<&Window> = windows
        .iter()
        .filter(|w| matches!(w.kind, NemesisKind::DiskError | NemesisKind::Rot))
        .collect();
    let removals: Vec<(u64, u64)> = events
        .iter()
        .filter(|e| e.process == Process::NEMESIS && e.f == "remove-node")
        .filter(|e| e.kind == Type::Invoke)
        .filter_map(|e| Some((e.value["node"].as_u64()?, e.time_ns)))
        .collect();
    let mut anomalies = Vec::new();
    let (mut exits, mut expected, mut removed) = (0, 0, 0);
    for e in events
        .iter()
        .filter(|e| e.process == Process::NEMESIS && e.f == "node-exit")
    {
        exits += 1;
        let node = e.value["node"].as_u64().unwrap_or(0);
        let explained = disk.iter().any(|w| {
            w.nodes.contains(&node)
                && w.start_ns <= e.time_ns
                && e.time_ns <= w.end_ns + EXIT_GRACE_NS
        });
        if explained {
            expected += 1;
            continue;
        }
        let said_removed = e.value["code"] == json!(0) && e.value["removed"].is_string();
        if said_removed && removals.iter().any(|(n, t)| *n == node && *t <= e.time_ns) {
            removed += 1;
            continue;
        }
        anomalies.push(json!({
            "checker": "node-exits",
            "message": format!(
                "node {node} exited on its own at {:.1} s (status {}, signal {}) with no disk \
                 fault to explain it; its last log line: {}",
                e.time_ns as f64 / 1e9, e.value["code"], e.value["signal"],
                e.value["last_log_line"].as_str().unwrap_or("")
            ),
            "node": node, "time_ns": e.time_ns, "exit": e.value,
        }));
    }
    (
        json!({"valid": anomalies.is_empty(), "exits": exits, "during_disk_faults": expected,
               "after_removal": removed}),
        anomalies,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Type;

    const S: u64 = 1_000_000_000;

    fn sample(t: u64, nodes: Value) -> Event {
        Event {
            process: Process::NEMESIS,
            kind: Type::Info,
            f: "sample".into(),
            value: json!({"cluster_dir": "/run", "nodes": nodes}),
            time_ns: t,
        }
    }

    fn node(id: u64, health: &str, applied: u64) -> Value {
        json!({"id": id, "alive": true, "paused": false, "health": health, "role": "follower",
               "applied": applied, "members": [1, 2, 3]})
    }

    /// Three nodes; node 3's applied index is `stuck(t)` (others advance
    /// by 10 every half second), and it says `health`.
    fn history(health3: &str, stuck: impl Fn(u64) -> u64) -> Vec<Event> {
        (0..40)
            .map(|i| {
                let t = i * S / 2;
                let a = 10 * i;
                sample(
                    t,
                    json!([
                        node(1, "serving", a),
                        node(2, "serving", a),
                        node(3, health3, stuck(a))
                    ]),
                )
            })
            .collect()
    }

    #[test]
    fn a_node_that_says_serving_and_does_not_follow_is_a_zombie() {
        // Node 3 stops applying at 50 (t = 2.5 s) and keeps saying SERVING.
        let events = history("serving", |a| a.min(50));
        let (r, found) = no_zombie(&events);
        assert_eq!(r["valid"], json!(false), "{r}");
        assert!(found
            .iter()
            .any(|a| a["node"] == 3 && a["message"].as_str().unwrap().contains("SERVING")));
        assert!(found.iter().all(|a| a["node"] == 3), "{found:?}");
    }

    #[test]
    fn an_honest_or_following_node_is_no_zombie() {
        // The same stuck node, but it says NOT_SERVING: honest.
        let (r, found) = no_zombie(&history("not-serving", |a| a.min(50)));
        // ...yet it never served, so the end-of-run check names it.
        assert!(found.iter().all(|a| a["end"] == true), "{found:?}");
        assert_eq!(r["zombies"], json!(found.len()));
        // A node lagging less than the bound follows.
        let (r, found) = no_zombie(&history("serving", |a| a.saturating_sub(30)));
        assert_eq!(r["valid"], json!(true), "{found:?}");
    }

    /// A follower on a slow disk falls further and further behind but
    /// keeps applying: it works, slowly, and is no zombie.
    #[test]
    fn a_slow_follower_that_keeps_applying_is_no_zombie() {
        // Applies at a third of the others' rate: 260 entries (13 s of
        // the others' work) behind by the end, but its index moves at
        // every sample.
        let (r, found) = no_zombie(&history("serving", |a| a / 3));
        assert_eq!(r["valid"], json!(true), "{found:?}");
    }

    #[test]
    fn a_zombie_is_named_only_past_the_bound() {
        // Node 3 stops at 100 (t = 5 s) for n samples, then catches up.
        // The others apply 20 a second, so from t = 7.5 s it is more than
        // the 2 s lag behind, and from t = 8 s its index has not moved for
        // the 3 s progress window: not serving from 8 s until it moves
        // again at (10 + n) / 2 s.
        let stuck_for = |n: u64| move |a: u64| if a > 100 && a <= 100 + 10 * n { 100 } else { a };
        // n = 12: not serving from 8 s to 11 s, exactly the 3 s bound.
        let (r, found) = no_zombie(&history("serving", stuck_for(12)));
        assert_eq!(r["valid"], json!(true), "{found:?}");
        // n = 13: to 11.5 s, half a second past it.
        let (r, found) = no_zombie(&history("serving", stuck_for(13)));
        assert_eq!(r["valid"], json!(false));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0]["since_ns"], json!(8 * S));
    }

    #[test]
    fn exits_outside_disk_faults_are_anomalies() {
        let exit = |t: u64, node: u64| Event {
            process: Process::NEMESIS,
            kind: Type::Info,
            f: "node-exit".into(),
            value: json!({"node": node, "code": 70, "signal": null,
                          "last_log_line": "FATAL: disk full in /d"}),
            time_ns: t,
        };
        let windows = vec![Window {
            kind: NemesisKind::DiskError,
            variant: "full".into(),
            nodes: vec![2],
            detail: json!({}),
            start_ns: 10 * S,
            end_ns: 15 * S,
        }];
        let events = vec![
            exit(11 * S, 2),
            exit(19 * S, 2),
            exit(12 * S, 1),
            exit(21 * S, 2),
        ];
        let (r, found) = node_exits(&events, &windows);
        assert_eq!(r["valid"], json!(false));
        assert_eq!(r["during_disk_faults"], json!(2));
        let named: Vec<(u64, u64)> = found
            .iter()
            .map(|a| {
                (
                    a["node"].as_u64().unwrap(),
                    a["time_ns"].as_u64().unwrap() / S,
                )
            })
            .collect();
        assert_eq!(named, vec![(1, 12), (2, 21)]);
        assert!(found[0]["message"]
            .as_str()
            .unwrap()
            .contains("FATAL: disk full"));
    }

    #[test]
    fn an_exit_is_explained_by_a_removal_only_with_status_0_its_line_and_a_removal_before_it() {
        let exit = |t: u64, node: u64, code: i32, removed: Value| Event {
            process: Process::NEMESIS,
            kind: Type::Info,
            f: "node-exit".into(),
            value: json!({"node": node, "code": code, "signal": null,
                          "last_log_line": "shutting down", "removed": removed}),
            time_ns: t,
        };
        let line = json!("WARN raftlockd: node 3 was removed from the cluster (...); exiting.");
        let remove = |t: u64, node: u64| Event {
            process: Process::NEMESIS,
            kind: Type::Invoke,
            f: "remove-node".into(),
            value: json!({"node": node}),
            time_ns: t,
        };
        let events = vec![
            remove(10 * S, 3),
            // Explained: status 0, the line, after node 3's removal.
            exit(11 * S, 3, 0, line.clone()),
            // Not: before its removal was asked for.
            exit(9 * S, 3, 0, line.clone()),
            // Not: another node.
            exit(12 * S, 4, 0, line.clone()),
            // Not: no line saying so.
            exit(13 * S, 3, 0, Value::Null),
            // Not: a failure status.
            exit(14 * S, 3, 70, line),
        ];
        let (r, found) = node_exits(&events, &[]);
        assert_eq!(r["valid"], json!(false));
        assert_eq!(r["after_removal"], json!(1));
        let named: Vec<(u64, u64)> = found
            .iter()
            .map(|a| {
                (
                    a["node"].as_u64().unwrap(),
                    a["time_ns"].as_u64().unwrap() / S,
                )
            })
            .collect();
        assert_eq!(named, vec![(3, 9), (4, 12), (3, 13), (3, 14)]);
    }
}
