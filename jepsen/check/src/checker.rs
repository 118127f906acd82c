//! Checkers over a history's operations alone (no faults, no store, no
//! clock): shared by the harness (`raftlock-jepsen`'s `checker`, which
//! runs them beside its own) and the simulator (`raftlock-sim`).
//!
//! | checker | fails when |
//! |---|---|
//! | `fence-order` | a grant that began after another grant on the same name returned got a smaller fence (an upgrade's exclusive grant included), or two grants share a fence, or an atomic request's grants do not carry consecutive fences in the request's order |
//! | `mutual-exclusion` | two grants that were certainly held at the same time conflict |
//! | `semaphore` | permits certainly held at once, or described holders, exceed the capacity |
//! | `hold-windows` | never: reports where the windows clients *believed* they held overlapped |
//!
//! "Certainly held": from the acquire's return until the invocation of a
//! release that answered `released: true` (the server still had the grant
//! then, so it had it all along), or of an upgrade or downgrade that
//! answered ok (see `grants` for how those split a grant). A grant whose release found nothing may
//! have been lost to expiry at any time, so it only counts toward the
//! believed windows.

use std::collections::{BTreeMap, HashMap};

use serde_json::{json, Value};

use crate::history::{Op, Type};

/// A grant and what became of it.
#[derive(Clone, Debug)]
pub struct Grant {
    process: u64,
    lock: String,
    mode: String,
    weight: u64,
    session: u64,
    fence: u64,
    acquire_invoke: u64,
    acquire_ok: u64,
    /// Invocation time of its release, the answer, and the client's own
    /// lease end at that moment (0 = it believed the lease lost).
    release: Option<(u64, Option<bool>, u64)>,
    /// Latest invocation of a store operation carrying this fence.
    last_use: Option<u64>,
    /// The shared rest of a downgraded exclusive grant (same fence, from
    /// the downgrade's invocation on): not a new grant.
    continued: bool,
}

impl Grant {
    fn exclusive(&self) -> bool {
        self.mode == "exclusive"
    }

    /// When the grant was certainly held, if ever.
    fn certain(&self) -> Option<(u64, u64)> {
        match self.release {
            Some((r, Some(true), _)) if r >= self.acquire_ok => Some((self.acquire_ok, r)),
            _ => None,
        }
    }

    /// When the client believed it held it.
    fn believed(&self, end_of_run: u64) -> (u64, u64) {
        let mut end = match self.release {
            Some((r, _, lease)) if lease > 0 => r.min(lease),
            // It believed the lease lost by the time it released; when it
            // noticed is unknown, so count only what it went on using.
            Some(_) => self.acquire_ok,
            None => end_of_run,
        };
        if let Some(u) = self.last_use {
            end = end.max(u);
        }
        (self.acquire_ok, end.max(self.acquire_ok))
    }

    fn summary(&self) -> Value {
        json!({"process": self.process, "lock": self.lock, "mode": self.mode, "weight": self.weight,
               "session": self.session, "fence": self.fence,
               "acquired_ns": self.acquire_ok, "released_ns": self.release.map(|r| r.0)})
    }
}

/// The grants of a history, each with what became of it.
///
/// An `acquire-all` answered ok is one grant per name, each with its own
/// fence, all from the request's invocation to its answer. An `upgrade`
/// answered ok ends its shared grant at the upgrade's invocation (the
/// server still had it when it applied the upgrade, which was later) and
/// is a new exclusive grant with the answer's fence, from the upgrade's
/// invocation to its answer. A `downgrade` answered ok splits its grant:
/// exclusive until the downgrade's invocation (the server applied it
/// later, on an exclusive grant), then shared with the same fence (held
/// in one mode or the other all along; shared is the weaker claim). An
/// upgrade or downgrade that failed changed nothing; one of unknown
/// outcome leaves its grant as it was (the workload then ends the
/// session, so the grant gets no release and is never certainly held).
pub fn grants(ops: &[Op]) -> Vec<Grant> {
    let mut grants: Vec<Grant> = Vec::new();
    let mut by_key: HashMap<(u64, String, u64), usize> = HashMap::new();
    let lease_of = |o: &Op| {
        o.invoke
            .get("lease_until_ns")
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    fn push(grants: &mut Vec<Grant>, by_key: &mut HashMap<(u64, String, u64), usize>, g: Grant) {
        by_key.insert((g.session, g.lock.clone(), g.fence), grants.len());
        grants.push(g);
    }
    for o in ops {
        let new = |lock: &str, mode: &str, session: u64, fence: u64, ok: u64| Grant {
            process: o.process,
            lock: lock.to_string(),
            mode: mode.to_string(),
            weight: o.u64("weight").unwrap_or(1),
            session,
            fence,
            acquire_invoke: o.invoke_ns,
            acquire_ok: ok,
            release: None,
            last_use: None,
            continued: false,
        };
        match (o.f.as_str(), o.kind) {
            ("acquire", Type::Ok) => {
                let (Some(lock), Some(fence), Some(session), Some(ok)) = (
                    o.str("lock"),
                    o.u64("fence"),
                    o.u64("session"),
                    o.complete_ns,
                ) else {
                    continue;
                };
                let mode = o.str("mode").unwrap_or("exclusive");
                push(
                    &mut grants,
                    &mut by_key,
                    new(lock, mode, session, fence, ok),
                );
            }
            ("acquire-all", Type::Ok) => {
                let (Some(session), Some(ok)) = (o.u64("session"), o.complete_ns) else {
                    continue;
                };
                for g in o.result["grants"].as_array().into_iter().flatten() {
                    let (Some(lock), Some(fence)) = (g["lock"].as_str(), g["fence"].as_u64())
                    else {
                        continue;
                    };
                    let mode = g["mode"].as_str().unwrap_or("exclusive");
                    push(
                        &mut grants,
                        &mut by_key,
                        new(lock, mode, session, fence, ok),
                    );
                }
            }
            ("upgrade", Type::Ok) => {
                let (Some(lock), Some(session), Some(from), Some(fence), Some(ok)) = (
                    o.str("lock"),
                    o.u64("session"),
                    o.invoke["fence"].as_u64(),
                    o.result["fence"].as_u64(),
                    o.complete_ns,
                ) else {
                    continue;
                };
                if let Some(&i) = by_key.get(&(session, lock.to_string(), from)) {
                    grants[i].release = Some((o.invoke_ns, Some(true), lease_of(o)));
                }
                push(
                    &mut grants,
                    &mut by_key,
                    new(lock, "exclusive", session, fence, ok),
                );
            }
            ("downgrade", Type::Ok) => {
                let (Some(lock), Some(session), Some(fence)) =
                    (o.str("lock"), o.u64("session"), o.invoke["fence"].as_u64())
                else {
                    continue;
                };
                let Some(&i) = by_key.get(&(session, lock.to_string(), fence)) else {
                    continue;
                };
                grants[i].release = Some((o.invoke_ns, Some(true), lease_of(o)));
                let mut rest = new(lock, "shared", session, fence, o.invoke_ns);
                rest.acquire_invoke = grants[i].acquire_invoke;
                rest.continued = true;
                push(&mut grants, &mut by_key, rest);
            }
            ("release", _) => {
                let (Some(lock), Some(fence), Some(session)) =
                    (o.str("lock"), o.u64("fence"), o.u64("session"))
                else {
                    continue;
                };
                if let Some(&i) = by_key.get(&(session, lock.to_string(), fence)) {
                    let released = (o.kind == Type::Ok).then(|| o.bool("released")).flatten();
                    grants[i].release = Some((o.invoke_ns, released, lease_of(o)));
                }
            }
            _ => {}
        }
    }
    // Store operations carry the fence: they show how long a (possibly
    // paused) holder went on using its grant.
    let by_fence: HashMap<u64, usize> = grants
        .iter()
        .enumerate()
        .map(|(i, g)| (g.fence, i))
        .collect();
    for o in ops {
        if matches!(o.f.as_str(), "read" | "write") {
            if let Some(i) = o.u64("fence").and_then(|f| by_fence.get(&f)) {
                let g = &mut grants[*i];
                g.last_use = Some(g.last_use.unwrap_or(0).max(o.invoke_ns));
            }
        }
    }
    grants
}

/// The most examples a checker lists of one kind of anomaly.
pub const MAX_EXAMPLES: usize = 20;

/// `fence-order` (see the module's table).
pub fn fence_order(ops: &[Op], grants: &[Grant]) -> (Value, Vec<Value>) {
    let mut anomalies = Vec::new();
    // One atomic request is one command: its grants take consecutive
    // fences from the one counter, in the request's order, and nothing
    // else is granted in between (with the uniqueness check below). Fences
    // with a gap mean the names were granted in more than one step.
    let mut atomic = 0;
    for o in ops
        .iter()
        .filter(|o| o.f == "acquire-all" && o.kind == Type::Ok)
    {
        atomic += 1;
        let fences: Vec<Option<u64>> = o.result["grants"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|g| g["fence"].as_u64())
            .collect();
        let first = fences.first().copied().flatten().unwrap_or(0);
        let consecutive = fences
            .iter()
            .enumerate()
            .all(|(i, f)| *f == Some(first + i as u64));
        if !consecutive {
            anomalies.push(json!({
                "checker": "fence-order",
                "message": format!("acquire-all of session {} was granted fences {}, not consecutive in the request's order: not one atomic step",
                                   o.u64("session").unwrap_or(0), json!(fences)),
                "process": o.process, "invoke_ns": o.invoke_ns, "complete_ns": o.complete_ns,
                "grants": o.result["grants"],
            }));
        }
    }
    let grants: Vec<&Grant> = grants.iter().filter(|g| !g.continued).collect();
    let mut seen: HashMap<u64, &Grant> = HashMap::new();
    for g in grants.iter().copied() {
        if let Some(other) = seen.insert(g.fence, g) {
            anomalies.push(json!({
                "checker": "fence-order",
                "message": format!("fence {} granted twice", g.fence),
                "grants": [other.summary(), g.summary()],
            }));
        }
    }
    let mut by_lock: BTreeMap<&str, Vec<&Grant>> = BTreeMap::new();
    for g in grants.iter().copied() {
        by_lock.entry(&g.lock).or_default().push(g);
    }
    let mut checked = 0;
    for list in by_lock.values() {
        // Sweep in invocation order; every grant that returned before this
        // one was invoked was granted before it, so its fence is smaller.
        let mut by_invoke = list.clone();
        by_invoke.sort_by_key(|g| g.acquire_invoke);
        let mut by_return = list.clone();
        by_return.sort_by_key(|g| g.acquire_ok);
        let mut j = 0;
        let mut max_before: Option<&Grant> = None;
        for g in by_invoke {
            while j < by_return.len() && by_return[j].acquire_ok < g.acquire_invoke {
                if max_before.is_none_or(|m| by_return[j].fence > m.fence) {
                    max_before = Some(by_return[j]);
                }
                j += 1;
            }
            checked += 1;
            if let Some(m) = max_before {
                if m.fence >= g.fence {
                    anomalies.push(json!({
                        "checker": "fence-order",
                        "message": format!("{}: fence {} granted after fence {} had been returned", g.lock, g.fence, m.fence),
                        "earlier": m.summary(), "later": g.summary(),
                    }));
                }
            }
        }
    }
    anomalies.truncate(MAX_EXAMPLES * 5);
    (
        json!({"valid": anomalies.is_empty(), "grants": grants.len(), "checked": checked,
               "atomic_requests": atomic}),
        anomalies,
    )
}

/// Pairs of conflicting windows (exclusive with anything) on one name.
/// A grant with a time window.
type Windowed<'a> = (&'a Grant, (u64, u64));

fn overlaps(
    grants: &[Grant],
    window: impl Fn(&Grant) -> Option<(u64, u64)>,
) -> Vec<(&Grant, &Grant, u64)> {
    let mut by_lock: BTreeMap<&str, Vec<Windowed>> = BTreeMap::new();
    for g in grants.iter().filter(|g| g.mode != "semaphore") {
        if let Some(w) = window(g) {
            by_lock.entry(&g.lock).or_default().push((g, w));
        }
    }
    let mut out = Vec::new();
    for list in by_lock.values_mut() {
        list.sort_by_key(|(_, w)| w.0);
        for i in 0..list.len() {
            for j in i + 1..list.len() {
                let ((a, wa), (b, wb)) = (list[i], list[j]);
                if wb.0 >= wa.1 {
                    break;
                }
                if (a.exclusive() || b.exclusive()) && a.session != b.session {
                    out.push((a, b, wa.1.min(wb.1) - wb.0));
                }
            }
        }
    }
    out
}

/// `mutual-exclusion` (see the module's table).
pub fn mutual_exclusion(grants: &[Grant]) -> (Value, Vec<Value>) {
    let found = overlaps(grants, Grant::certain);
    let anomalies: Vec<Value> = found
        .iter()
        .take(MAX_EXAMPLES)
        .map(|(a, b, ns)| {
            json!({
                "checker": "mutual-exclusion",
                "message": format!("{}: fences {} and {} were both certainly held for {} ms", a.lock, a.fence, b.fence, ns / 1_000_000),
                "grants": [a.summary(), b.summary()],
            })
        })
        .collect();
    let certain = grants.iter().filter(|g| g.certain().is_some()).count();
    (
        json!({"valid": found.is_empty(), "certain_grants": certain, "violations": found.len()}),
        anomalies,
    )
}

/// `hold-windows` (see the module's table): never invalid.
pub fn hold_windows(ops: &[Op], grants: &[Grant], end: u64, capacity: u32) -> Value {
    let found = overlaps(grants, |g| Some(g.believed(end)));
    // Holders the workload paused on purpose (client-pause emulation)
    // explain their own overlaps; the others are the interesting ones.
    let paused: std::collections::HashSet<u64> = ops
        .iter()
        .filter(|o| o.f == "pause")
        .filter_map(|o| o.u64("fence"))
        .collect();
    let (by_pause, other): (Vec<_>, Vec<_>) = found
        .iter()
        .partition(|(a, b, _)| paused.contains(&a.fence) || paused.contains(&b.fence));
    let examples: Vec<Value> = other
        .iter()
        .chain(by_pause.iter())
        .take(MAX_EXAMPLES)
        .map(|(a, b, ns)| {
            json!({"lock": a.lock, "overlap_ms": *ns as f64 / 1e6, "grants": [a.summary(), b.summary()]})
        })
        .collect();
    let over = semaphore_over(grants, capacity, |g| Some(g.believed(end)));
    json!({
        "valid": true,
        "note": "windows clients believed they held; overlaps are what fencing protects against, not failures",
        "overlaps": found.len(),
        "overlaps_with_paused_holder": by_pause.len(),
        "overlaps_other": other.len(),
        "examples": examples,
        "semaphore_over_capacity": over.len(),
    })
}

/// Instants where the weights of permits held (by `window`) exceed the
/// capacity: (time, total, grants).
fn semaphore_over(
    grants: &[Grant],
    capacity: u32,
    window: impl Fn(&Grant) -> Option<(u64, u64)>,
) -> Vec<(u64, u64, Vec<&Grant>)> {
    let sem: Vec<(&Grant, (u64, u64))> = grants
        .iter()
        .filter(|g| g.mode == "semaphore")
        .filter_map(|g| window(g).map(|w| (g, w)))
        .collect();
    let mut points: Vec<(u64, i64, usize)> = Vec::new();
    for (i, (g, (s, e))) in sem.iter().enumerate() {
        // Ends sort before starts at the same instant.
        points.push((*s, g.weight as i64, i));
        points.push((*e, -(g.weight as i64), i));
    }
    points.sort_by_key(|p| (p.0, p.1));
    let mut held: i64 = 0;
    let mut live: Vec<usize> = Vec::new();
    let mut out = Vec::new();
    for (t, dw, i) in points {
        held += dw;
        if dw > 0 {
            live.push(i);
        } else {
            live.retain(|&x| x != i);
        }
        if held > capacity as i64 && out.len() < MAX_EXAMPLES {
            out.push((t, held as u64, live.iter().map(|&x| sem[x].0).collect()));
        }
    }
    out
}

/// `semaphore` (see the module's table).
pub fn semaphore(ops: &[Op], grants: &[Grant], capacity: u32) -> (Value, Vec<Value>) {
    let mut anomalies: Vec<Value> = semaphore_over(grants, capacity, Grant::certain)
        .into_iter()
        .map(|(t, total, gs)| {
            json!({
                "checker": "semaphore",
                "message": format!("{total} permits certainly held at once (capacity {capacity})"),
                "time_ns": t,
                "grants": gs.iter().map(|g| g.summary()).collect::<Vec<_>>(),
            })
        })
        .collect();
    let mut describes = 0;
    for o in ops
        .iter()
        .filter(|o| o.f == "describe" && o.kind == Type::Ok)
    {
        describes += 1;
        let total: u64 = o
            .result
            .get("holders")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|h| h["weight"].as_u64().unwrap_or(0))
            .sum();
        if total > capacity as u64 {
            anomalies.push(json!({
                "checker": "semaphore",
                "message": format!("describe showed {total} permits held (capacity {capacity})"),
                "time_ns": o.invoke_ns, "holders": o.result["holders"],
            }));
        }
    }
    (
        json!({"valid": anomalies.is_empty(), "capacity": capacity, "describes": describes}),
        anomalies,
    )
}

#[cfg(test)]
mod tests;
