//! Checkers over the history and the store's log. `fence-order`,
//! `mutual-exclusion`, `semaphore` and `hold-windows`, which read the
//! operations alone, are `raftlock-check`'s (shared with the simulator,
//! see [`raftlock_check::checker`]); `linearizability` too
//! ([`raftlock_check::linear`]).
//!
//! | checker | fails when |
//! |---|---|
//! | `fenced-store` | the store accepted a smaller fence after a larger one on a key |
//! | `counter` | a counter's final value is outside [acknowledged, acknowledged + unknown] increments, or accepted writes skip or repeat a value (a lost update) |
//! | `fence-order` | a grant that began after another grant on the same name returned got a smaller fence (an upgrade's exclusive grant included), or two grants share a fence, or an atomic request's grants do not carry consecutive fences in the request's order |
//! | `mutual-exclusion` | two grants that were certainly held at the same time conflict |
//! | `semaphore` | permits certainly held at once, or described holders, exceed the capacity |
//! | `linearizability` | no linearization of a lock's operations fits the lock model (see [`crate::linear`]) |
//! | `hold-windows` | never: reports where the windows clients *believed* they held overlapped |
//! | `audit` | anything is still held or queued at the end of the run (see [`crate::audit`]) |
//! | `keep-alive` | a keep-alive sent after its session's expiry was applied was answered `renewed`, or two sessions' lease views overlapped on one exclusive lock (see [`crate::leases`]) |
//! | `beliefs` | two clients' beliefs (counted by the lease rule) in conflicting grants of one name overlapped, or a belief ran past the moment the cluster granted its name to another session (see [`crate::beliefs`]) |
//! | `ghosts` | a waiter killed just before the hand-off kept the name: the next waiter was not granted it within 8 s while no fault was active (the `leases` workload's `ghost` path; see [`crate::beliefs::ghosts`]) |
//! | `hostile-peer` | a node with peer authentication did not refuse a hostile Raft message with `UNAUTHENTICATED`, or one without it did not refuse another cluster's with `FAILED_PRECONDITION` (see [`crate::nemesis::hostile`]) |
//! | `no-zombie` | a node said `SERVING` without following the cluster for too long, or was up at the end without serving (see [`crate::zombie`]) |
//! | `node-exits` | a node exited on its own while its disk was not failing and its log was not damaged (see [`crate::zombie`]) |
//! | `log-rot` | a node started on a damaged log that lost what its mark names, refused one that did not, or did neither (see [`crate::nemesis::rot`]) |
//! | `lost-disk` | a voter the cluster had heard from, wiped and started empty under its old id, took part (showed a term or a membership) instead of refusing, or did neither within 30 s (see [`crate::nemesis::lost_disk`]) |
//!
//! "Certainly held" and "believed": see [`raftlock_check::checker`].

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use raftlock_check::checker::{
    fence_order, grants, hold_windows, mutual_exclusion, semaphore, MAX_EXAMPLES,
};

use crate::history::{Op, Type};
use crate::workload::WorkloadKind;

/// Everything the checkers need.
pub struct CheckInput<'a> {
    /// Paired client operations.
    pub ops: &'a [Op],
    /// Every event (the nemesis's and the samplers' too).
    pub events: &'a [crate::history::Event],
    /// The faults.
    pub windows: &'a [crate::nemesis::Window],
    /// The workload that ran.
    pub workload: WorkloadKind,
    /// `store.jsonl` entries, in the store's decision order.
    pub store_log: &'a [Value],
    /// Final store values.
    pub store_values: &'a BTreeMap<String, u64>,
    /// Semaphore capacity.
    pub capacity: u32,
    /// Time budget for the linearizability search, per lock.
    pub linear_timeout: Duration,
    /// Where to put porcupine's visualizations.
    pub out_dir: &'a Path,
    /// The end-of-run audit record (`audit.json`), if the run made one.
    pub audit: Option<&'a Value>,
}

/// Checker results by name, and the anomalies they found.
pub struct Checked {
    /// `{name: {valid, ...}}`.
    pub checkers: serde_json::Map<String, Value>,
    /// Every anomaly, tagged with its checker.
    pub anomalies: Vec<Value>,
}

impl Checked {
    /// True if every checker is valid.
    pub fn valid(&self) -> bool {
        self.checkers
            .values()
            .all(|c| c.get("valid").and_then(Value::as_bool) != Some(false))
    }
}

fn fenced_store(log: &[Value]) -> (Value, Vec<Value>) {
    let mut latest: HashMap<&str, u64> = HashMap::new();
    let mut anomalies = Vec::new();
    let (mut accepted, mut rejected) = (0u64, 0u64);
    for (i, e) in log.iter().enumerate() {
        let key = e["key"].as_str().unwrap_or("");
        let fence = e["fence"].as_u64().unwrap_or(0);
        if e["accepted"].as_bool() != Some(true) {
            rejected += 1;
            continue;
        }
        accepted += 1;
        let l = latest.entry(key).or_insert(0);
        if fence < *l {
            anomalies.push(json!({
                "checker": "fenced-store",
                "message": format!("store accepted fence {fence} on {key} after fence {l}"),
                "key": key, "fence": fence, "after_fence": *l, "entry": i, "time_ns": e["time_ns"],
            }));
        }
        *l = (*l).max(fence);
    }
    (
        json!({"valid": anomalies.is_empty(), "accepted": accepted, "rejected_stale": rejected,
               "violations": anomalies.len()}),
        anomalies,
    )
}

fn counter(ops: &[Op], log: &[Value], values: &BTreeMap<String, u64>) -> (Value, Vec<Value>) {
    let mut acked: BTreeMap<String, u64> = BTreeMap::new();
    let mut unknown: BTreeMap<String, u64> = BTreeMap::new();
    for o in ops.iter().filter(|o| o.f == "write") {
        let Some(key) = o.str("key") else { continue };
        match o.kind {
            Type::Ok => *acked.entry(key.to_string()).or_default() += 1,
            Type::Info => *unknown.entry(key.to_string()).or_default() += 1,
            _ => {}
        }
    }
    let mut anomalies = Vec::new();
    let mut keys = serde_json::Map::new();
    let all: std::collections::BTreeSet<&String> = acked
        .keys()
        .chain(unknown.keys())
        .chain(values.keys())
        .collect();
    for key in all {
        let a = acked.get(key).copied().unwrap_or(0);
        let u = unknown.get(key).copied().unwrap_or(0);
        let v = values.get(key).copied().unwrap_or(0);
        let ok = a <= v && v <= a + u;
        keys.insert(
            key.clone(),
            json!({"final": v, "acknowledged": a, "unknown": u, "valid": ok}),
        );
        if !ok {
            anomalies.push(json!({
                "checker": "counter",
                "message": format!("{key}: final value {v}, but {a} increments were acknowledged and {u} unknown (expected {a}..={})", a + u),
                "key": key, "final": v, "acknowledged": a, "unknown": u,
            }));
        }
    }
    // Each accepted write must be the previous accepted value plus one.
    let mut last: HashMap<&str, u64> = HashMap::new();
    let mut lost = 0;
    for (i, e) in log.iter().enumerate() {
        if e["accepted"].as_bool() != Some(true) {
            continue;
        }
        let key = e["key"].as_str().unwrap_or("");
        let value = e["value"].as_u64().unwrap_or(0);
        let prev = last.insert(key, value).unwrap_or(0);
        if value != prev + 1 {
            lost += 1;
            if lost <= MAX_EXAMPLES {
                anomalies.push(json!({
                    "checker": "counter",
                    "message": format!("{key}: accepted write of {value} after {prev} (lost update)"),
                    "key": key, "value": value, "previous": prev, "fence": e["fence"], "entry": i,
                }));
            }
        }
    }
    (
        json!({"valid": anomalies.is_empty(), "keys": keys, "lost_updates": lost}),
        anomalies,
    )
}

/// Runs the checkers that apply to the workload.
pub fn check(input: &CheckInput) -> Checked {
    let mut checkers = serde_json::Map::new();
    let mut anomalies = Vec::new();
    let grants = grants(input.ops);
    let end = input
        .ops
        .iter()
        .flat_map(|o| [Some(o.invoke_ns), o.recorded_ns])
        .flatten()
        .max()
        .unwrap_or(0);
    let mut add = |name: &str, (result, mut found): (Value, Vec<Value>)| {
        checkers.insert(name.to_string(), result);
        anomalies.append(&mut found);
    };
    add("fence-order", fence_order(input.ops, &grants));
    match input.workload {
        WorkloadKind::FencedCounter => {
            add("fenced-store", fenced_store(input.store_log));
            add(
                "counter",
                counter(input.ops, input.store_log, input.store_values),
            );
            add("mutual-exclusion", mutual_exclusion(&grants));
        }
        WorkloadKind::Lock => {
            add("mutual-exclusion", mutual_exclusion(&grants));
            add(
                "linearizability",
                crate::linear::check(input.ops, input.linear_timeout, input.out_dir),
            );
        }
        WorkloadKind::Semaphore => {
            add("semaphore", semaphore(input.ops, &grants, input.capacity));
        }
        WorkloadKind::Clients | WorkloadKind::Leases => {
            add("mutual-exclusion", mutual_exclusion(&grants));
        }
    }
    if let Some(audit) = input.audit {
        add("audit", crate::audit::check(audit));
    }
    add("no-zombie", crate::zombie::no_zombie(input.events));
    add("keep-alive", crate::leases::check(input.ops, input.windows));
    add("beliefs", crate::beliefs::check(input.ops, input.windows));
    add("ghosts", crate::beliefs::ghosts(input.ops, input.windows));
    add("hostile-peer", crate::nemesis::hostile::check(input.events));
    add("log-rot", crate::nemesis::rot::check(input.events));
    add("lost-disk", crate::nemesis::lost_disk::check(input.events));
    add(
        "node-exits",
        crate::zombie::node_exits(input.events, input.windows),
    );
    add(
        "hold-windows",
        (
            hold_windows(input.ops, &grants, end, input.capacity),
            Vec::new(),
        ),
    );
    Checked {
        checkers,
        anomalies,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_checker_catches_a_smaller_fence_after_a_larger() {
        let log = vec![
            json!({"key": "k", "fence": 3, "value": 1, "accepted": true, "time_ns": 1}),
            json!({"key": "k", "fence": 2, "value": 1, "accepted": false, "time_ns": 2}),
            json!({"key": "j", "fence": 1, "value": 1, "accepted": true, "time_ns": 3}),
        ];
        assert_eq!(fenced_store(&log).0["valid"], json!(true));
        let mut bad = log.clone();
        bad.push(json!({"key": "k", "fence": 2, "value": 2, "accepted": true, "time_ns": 4}));
        let (r, a) = fenced_store(&bad);
        assert_eq!(r["valid"], json!(false));
        assert_eq!(a.len(), 1);
    }

    #[test]
    fn the_counter_checker_catches_lost_updates() {
        let log = vec![
            json!({"key": "k", "fence": 3, "value": 1, "accepted": true}),
            json!({"key": "k", "fence": 4, "value": 2, "accepted": true}),
            json!({"key": "k", "fence": 2, "value": 2, "accepted": true}),
        ];
        let values = BTreeMap::from([("k".to_string(), 2)]);
        let (r, a) = counter(&[], &log, &values);
        assert_eq!(r["valid"], json!(false));
        assert!(a
            .iter()
            .any(|x| x["message"].as_str().unwrap().contains("lost update")));
    }
}
