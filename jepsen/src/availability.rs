//! How long each fault took to recover from: the time from the end of a
//! fault (when the nemesis healed it) to the first grant any client was
//! answered after it (`recovery_ms`). Not a pass/fail check: a liveness
//! regression shows up as a number here long before it becomes a lost run.
//! A fault after which no grant came before the run ended has
//! `recovery_ms: null` and counts as `unrecovered`.
//!
//! `results.json` gets `availability`: `{"faults": [{kind, variant,
//! start_ns, end_ns, recovery_ms}], "by_kind": {KIND: {faults, recovered,
//! unrecovered, median_ms, worst_ms}}}`.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::history::{Op, Type};
use crate::nemesis::Window;

/// The median of `v` (sorted in place), the upper one of two.
fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// The recovery table of a run.
pub fn table(ops: &[Op], windows: &[Window]) -> Value {
    let mut grants: Vec<u64> = ops
        .iter()
        .filter(|o| o.f == "acquire" && o.kind == Type::Ok)
        .filter_map(|o| o.complete_ns)
        .collect();
    grants.sort_unstable();
    let mut faults = Vec::new();
    let mut by_kind: BTreeMap<String, Vec<Option<f64>>> = BTreeMap::new();
    for w in windows {
        let i = grants.partition_point(|&t| t <= w.end_ns);
        let recovery = grants.get(i).map(|&t| (t - w.end_ns) as f64 / 1e6);
        faults.push(
            json!({"kind": w.kind, "variant": w.variant, "start_ns": w.start_ns,
                           "end_ns": w.end_ns, "recovery_ms": recovery}),
        );
        by_kind
            .entry(w.kind.name().to_string())
            .or_default()
            .push(recovery);
    }
    let by_kind: serde_json::Map<String, Value> = by_kind
        .into_iter()
        .map(|(k, v)| {
            let mut done: Vec<f64> = v.iter().flatten().copied().collect();
            let worst = done
                .iter()
                .copied()
                .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
            let summary = json!({
                "faults": v.len(),
                "recovered": done.len(),
                "unrecovered": v.len() - done.len(),
                "median_ms": median(&mut done),
                "worst_ms": worst,
            });
            (k, summary)
        })
        .collect();
    json!({"faults": faults, "by_kind": by_kind})
}

/// Merges the `recovery_ms` of many runs' tables into one per kind (for a
/// campaign).
pub fn merge<'a>(tables: impl IntoIterator<Item = &'a Value>) -> Value {
    let mut by_kind: BTreeMap<String, Vec<Option<f64>>> = BTreeMap::new();
    for t in tables {
        for f in t["faults"].as_array().into_iter().flatten() {
            let kind = f["kind"].as_str().unwrap_or("?").to_string();
            by_kind
                .entry(kind)
                .or_default()
                .push(f["recovery_ms"].as_f64());
        }
    }
    let out: serde_json::Map<String, Value> = by_kind
        .into_iter()
        .map(|(k, v)| {
            let mut done: Vec<f64> = v.iter().flatten().copied().collect();
            let worst = done.iter().copied().fold(None, |m: Option<f64>, x| {
                Some(m.map_or(x, |m| m.max(x)))
            });
            (
                k,
                json!({"faults": v.len(), "recovered": done.len(), "unrecovered": v.len() - done.len(),
                       "median_ms": median(&mut done), "worst_ms": worst}),
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
            nodes: vec![1],
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
}
