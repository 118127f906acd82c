//! How long each fault took to recover from: the time from the end of a
//! fault (when the nemesis healed it) to the first grant any client was
//! answered after it (`recovery_ms`). Not a pass/fail check: a liveness
//! regression shows up as a number here long before it becomes a lost run.
//! A fault after which no grant came before the run ended has
//! `recovery_ms: null` and counts as `unrecovered`.
//!
//! Beside it, `rejoin_ms`: from the end of the fault until every node it
//! touched had applied what the most advanced node had applied when it
//! ended (from the sampler's rounds, so to the next half second; `null` if
//! some node never did, or was not sampled).
//!
//! `results.json` gets `availability`: `{"faults": [{kind, variant,
//! start_ns, end_ns, recovery_ms, rejoin_ms}], "by_kind": {KIND: {faults,
//! recovered, unrecovered, median_ms, worst_ms, rejoin_median_ms,
//! rejoin_worst_ms}}}`.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::history::{Event, Op, Process, Type};
use crate::nemesis::Window;

/// Applied index by node at each sample: `(time, {node: applied})`.
fn applied_series(events: &[Event]) -> Vec<(u64, BTreeMap<u64, u64>)> {
    events
        .iter()
        .filter(|e| e.process == Process::NEMESIS && e.f == "sample")
        .map(|e| {
            let nodes = e.value["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| Some((n["id"].as_u64()?, n["applied"].as_u64()?)))
                .collect();
            (e.time_ns, nodes)
        })
        .collect()
}

/// How long after `w` ended every node it touched had caught up.
fn rejoin_ms(series: &[(u64, BTreeMap<u64, u64>)], w: &Window) -> Option<f64> {
    let i = series.partition_point(|(t, _)| *t <= w.end_ns);
    let target = series.get(i.checked_sub(1)?)?.1.values().copied().max()?;
    let mut worst = 0u64;
    for node in &w.nodes {
        let (t, _) = series[i..]
            .iter()
            .find(|(_, a)| a.get(node).is_some_and(|&x| x >= target))?;
        worst = worst.max(t - w.end_ns);
    }
    Some(worst as f64 / 1e6)
}

/// The median of `v` (sorted in place), the upper one of two.
fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// The recovery table of a run.
pub fn table(ops: &[Op], events: &[Event], windows: &[Window]) -> Value {
    let series = applied_series(events);
    let mut grants: Vec<u64> = ops
        .iter()
        // Any grant: a lock, permits, an atomic request, an upgrade.
        .filter(|o| {
            matches!(o.f.as_str(), "acquire" | "acquire-all" | "upgrade") && o.kind == Type::Ok
        })
        .filter_map(|o| o.complete_ns)
        .collect();
    grants.sort_unstable();
    let mut faults = Vec::new();
    for w in windows {
        let i = grants.partition_point(|&t| t <= w.end_ns);
        let recovery = grants.get(i).map(|&t| (t - w.end_ns) as f64 / 1e6);
        faults.push(
            json!({"kind": w.kind, "variant": w.variant, "start_ns": w.start_ns,
                           "end_ns": w.end_ns, "recovery_ms": recovery,
                           "rejoin_ms": rejoin_ms(&series, w)}),
        );
    }
    let t = json!({ "faults": faults });
    let by_kind = merge([&t]);
    json!({"faults": t["faults"], "by_kind": by_kind})
}

fn worst(v: &[f64]) -> Option<f64> {
    v.iter().copied().reduce(f64::max)
}

/// Summarizes the faults of many runs' tables per kind (for a run, and
/// for a campaign).
pub fn merge<'a>(tables: impl IntoIterator<Item = &'a Value>) -> Value {
    let mut by_kind: BTreeMap<String, (Vec<Option<f64>>, Vec<f64>)> = BTreeMap::new();
    for t in tables {
        for f in t["faults"].as_array().into_iter().flatten() {
            let kind = f["kind"].as_str().unwrap_or("?").to_string();
            let e = by_kind.entry(kind).or_default();
            e.0.push(f["recovery_ms"].as_f64());
            if let Some(r) = f["rejoin_ms"].as_f64() {
                e.1.push(r);
            }
        }
    }
    let out: serde_json::Map<String, Value> = by_kind
        .into_iter()
        .map(|(k, (v, mut rejoin))| {
            let mut done: Vec<f64> = v.iter().flatten().copied().collect();
            (
                k,
                json!({"faults": v.len(), "recovered": done.len(), "unrecovered": v.len() - done.len(),
                       "worst_ms": worst(&done), "median_ms": median(&mut done),
                       "rejoin_worst_ms": worst(&rejoin), "rejoin_median_ms": median(&mut rejoin)}),
            )
        })
        .collect();
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{pair_ops, Event, Process};
    use crate::nemesis::NemesisKind;

    const MS: u64 = 1_000_000;

    fn grant(p: u64, at_ms: u64) -> [Event; 2] {
        let e = |kind, t| Event {
            process: Process::Client(p),
            kind,
            f: "acquire".into(),
            value: json!({"lock": "a"}),
            time_ns: t,
        };
        [e(Type::Invoke, at_ms * MS - MS), e(Type::Ok, at_ms * MS)]
    }

    fn window(kind: NemesisKind, start_ms: u64, end_ms: u64) -> Window {
        Window {
            kind,
            variant: "x".into(),
            nodes: vec![3],
            detail: json!({}),
            start_ns: start_ms * MS,
            end_ns: end_ms * MS,
        }
    }

    #[test]
    fn recovery_is_the_first_grant_after_the_fault_ends() {
        let mut events: Vec<Event> = [10, 1500, 1700, 5200]
            .iter()
            .enumerate()
            .flat_map(|(p, &t)| grant(p as u64, t))
            .collect();
        events.sort_by_key(|e| e.time_ns);
        let ops = pair_ops(&events);
        let t = table(
            &ops,
            &events,
            &[
                window(NemesisKind::Kill, 100, 1000),
                window(NemesisKind::Kill, 2000, 5000),
                window(NemesisKind::Pause, 5500, 6000),
            ],
        );
        let rec: Vec<Value> = t["faults"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["recovery_ms"].clone())
            .collect();
        assert_eq!(rec, vec![json!(500.0), json!(200.0), Value::Null]);
        assert_eq!(t["by_kind"]["kill"]["median_ms"], json!(500.0));
        assert_eq!(t["by_kind"]["kill"]["worst_ms"], json!(500.0));
        assert_eq!(t["by_kind"]["pause"]["unrecovered"], json!(1));
        let merged = merge([&t, &t]);
        assert_eq!(merged["kill"]["faults"], json!(4));
        assert_eq!(merged["kill"]["worst_ms"], json!(500.0));
    }

    #[test]
    fn an_atomic_request_or_an_upgrade_is_a_grant_too() {
        let mut events = Vec::new();
        for (p, (f, at_ms)) in [("acquire-all", 1200), ("upgrade", 2300), ("release", 3100)]
            .into_iter()
            .enumerate()
        {
            for (kind, t) in [(Type::Invoke, at_ms * MS - MS), (Type::Ok, at_ms * MS)] {
                events.push(Event {
                    process: Process::Client(p as u64),
                    kind,
                    f: f.into(),
                    value: json!({"lock": "a"}),
                    time_ns: t,
                });
            }
        }
        let ops = pair_ops(&events);
        let t = table(
            &ops,
            &events,
            &[
                window(NemesisKind::Kill, 100, 1000),
                window(NemesisKind::Kill, 2000, 2100),
                window(NemesisKind::Kill, 3000, 3050),
            ],
        );
        let rec: Vec<Value> = t["faults"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["recovery_ms"].clone())
            .collect();
        // A release is no grant.
        assert_eq!(rec, vec![json!(200.0), json!(200.0), Value::Null]);
    }

    #[test]
    fn rejoin_is_when_the_touched_nodes_caught_up() {
        let sample = |t_ms: u64, a: [u64; 3]| Event {
            process: Process::NEMESIS,
            kind: Type::Info,
            f: "sample".into(),
            value: json!({"nodes": [
                {"id": 1, "applied": a[0]}, {"id": 2, "applied": a[1]}, {"id": 3, "applied": a[2]}]}),
            time_ns: t_ms * MS,
        };
        // Node 3 is cut off until 1 s, then catches up by 2 s.
        let events = vec![
            sample(500, [10, 10, 5]),
            sample(1000, [20, 20, 5]),
            sample(1500, [25, 25, 12]),
            sample(2000, [30, 30, 30]),
        ];
        let t = table(&[], &events, &[window(NemesisKind::Partition, 200, 1000)]);
        assert_eq!(t["faults"][0]["rejoin_ms"], json!(1000.0));
        let mut w = window(NemesisKind::Partition, 200, 1000);
        w.nodes = vec![3, 4];
        let t = table(&[], &events, &[w]);
        assert_eq!(
            t["faults"][0]["rejoin_ms"],
            Value::Null,
            "node 4 never sampled"
        );
    }
}
