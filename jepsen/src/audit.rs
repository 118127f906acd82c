//! The end-of-run audit: after healing, with the workers stopped, every
//! holder and waiter left in the cluster must belong to a session some
//! worker still believes it has *and* to a grant or wait that worker still
//! believes in. Workers stop holding nothing, so at the end of a run the
//! answer must be: no holder, no waiter, for anybody.
//!
//! What it catches is work a client abandoned that the cluster did not
//! forget: a dropped `lock()` future whose request stayed queued (and is
//! granted later to a session whose owner never learns of it), a dropped
//! guard whose release never went out, a campaign dropped while queued.
//! Sessions nobody keeps alive expire; so the audit polls for up to twice
//! the ttl plus a margin (a new leader restarts leases at full length)
//! before it calls a leftover a leak, and it reads the cluster while the
//! workers' own sessions are still alive (a leaked wait on a live session
//! never goes away by itself — exactly what it is looking for).
//!
//! `DIR/audit.json`: `{"believed": [{"process", "session"}], "waited_ms",
//! "locks": [{"name", "holders": [{"session", "fence"}], "waiters":
//! [{"session", "seq"}]}], "error"}`. `raftlock-jepsen check` re-runs the
//! checker on it.

use std::collections::BTreeMap;
use std::time::Duration;

use raftlock_client::Client;
use serde_json::{json, Value};

/// Names with holders or waiters, as the audit records them.
pub fn leftovers(locks: &[raftlock_client::LockInfo]) -> Vec<Value> {
    locks
        .iter()
        .filter(|l| !l.holders.is_empty() || !l.waiters.is_empty())
        .map(|l| {
            json!({
                "name": l.name,
                "holders": l.holders.iter().map(|h| json!({"session": h.session, "fence": h.fence})).collect::<Vec<_>>(),
                "waiters": l.waiters.iter().map(|w| json!({"session": w.session, "seq": w.seq})).collect::<Vec<_>>(),
            })
        })
        .collect()
}

/// Reads the cluster until nothing is held or queued, or `patience` has
/// passed; returns the audit record (see the module docs).
pub async fn collect(client: &Client, believed: &[(u64, u64)], patience: Duration) -> Value {
    let started = tokio::time::Instant::now();
    let deadline = started + patience;
    let mut last: Result<Vec<Value>, String> = Err("never read".into());
    loop {
        match client.list("").await {
            Ok(locks) => last = Ok(leftovers(&locks)),
            // A good listing is kept over a later transient error.
            Err(e) if last.is_err() => last = Err(e.to_string()),
            Err(_) => {}
        }
        let clean = matches!(&last, Ok(l) if l.is_empty());
        if clean || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let believed: Vec<Value> = believed
        .iter()
        .map(|(p, s)| json!({"process": p, "session": s}))
        .collect();
    let waited_ms = started.elapsed().as_millis() as u64;
    match last {
        Ok(locks) => {
            json!({"believed": believed, "waited_ms": waited_ms, "locks": locks, "error": null})
        }
        Err(e) => json!({"believed": believed, "waited_ms": waited_ms, "locks": [], "error": e}),
    }
}

/// The `audit` checker over an audit record: every holder and waiter is an
/// anomaly (workers end holding and waiting for nothing); it says whether
/// the session is one a worker still has (so the worker lost track of a
/// grant or a wait) or nobody's (it should have ended). An audit that
/// could not read the cluster is invalid too.
pub fn check(audit: &Value) -> (Value, Vec<Value>) {
    let owner: BTreeMap<u64, u64> = audit["believed"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| Some((b["session"].as_u64()?, b["process"].as_u64()?)))
        .collect();
    let whose = |session: u64| {
        match owner.get(&session) {
        Some(p) => format!(
            "session {session}, which worker process {p} still has but believes holds and awaits nothing"
        ),
        None => format!("session {session}, which no worker has"),
    }
    };
    let mut anomalies = Vec::new();
    let (mut held, mut queued) = (0u64, 0u64);
    for lock in audit["locks"].as_array().into_iter().flatten() {
        let name = lock["name"].as_str().unwrap_or("?");
        for h in lock["holders"].as_array().into_iter().flatten() {
            held += 1;
            let s = h["session"].as_u64().unwrap_or(0);
            anomalies.push(json!({
                "checker": "audit",
                "message": format!("{name} is still held (fence {}) by {}", h["fence"], whose(s)),
                "lock": name, "session": s, "fence": h["fence"], "leak": "holder",
            }));
        }
        for w in lock["waiters"].as_array().into_iter().flatten() {
            queued += 1;
            let s = w["session"].as_u64().unwrap_or(0);
            anomalies.push(json!({
                "checker": "audit",
                "message": format!("{name} still has a queued request (seq {}) of {}", w["seq"], whose(s)),
                "lock": name, "session": s, "seq": w["seq"], "leak": "waiter",
            }));
        }
    }
    let error = audit["error"].as_str();
    if let Some(e) = error {
        anomalies.push(json!({
            "checker": "audit",
            "message": format!("the audit could not read the cluster: {e}"),
        }));
    }
    (
        json!({
            "valid": anomalies.is_empty(),
            "sessions_believed": owner.len(),
            "leaked_holders": held,
            "leaked_waiters": queued,
            "waited_ms": audit["waited_ms"],
            "error": error,
        }),
        anomalies,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(locks: Value) -> Value {
        json!({
            "believed": [{"process": 0, "session": 11}, {"process": 5, "session": 12}],
            "waited_ms": 9000,
            "locks": locks,
            "error": null,
        })
    }

    #[test]
    fn a_clean_end_passes() {
        let (r, a) = check(&record(json!([])));
        assert_eq!(r["valid"], json!(true));
        assert!(a.is_empty());
    }

    /// A dropped `lock()` whose request stayed queued on a session the
    /// worker still has: the leak the old client left behind.
    #[test]
    fn a_leaked_waiter_fails_the_audit() {
        let (r, a) = check(&record(json!([
            {"name": "cl/1", "holders": [], "waiters": [{"session": 12, "seq": 40}]}
        ])));
        assert_eq!(r["valid"], json!(false));
        assert_eq!(r["leaked_waiters"], json!(1));
        assert_eq!(a.len(), 1);
        let msg = a[0]["message"].as_str().unwrap();
        assert!(
            msg.contains("cl/1") && msg.contains("worker process 5"),
            "{msg}"
        );
    }

    #[test]
    fn a_holder_nobody_has_fails_the_audit() {
        let (r, a) = check(&record(json!([
            {"name": "cl/0", "holders": [{"session": 99, "fence": 7}], "waiters": []}
        ])));
        assert_eq!(r["valid"], json!(false));
        assert_eq!(r["leaked_holders"], json!(1));
        assert!(a[0]["message"].as_str().unwrap().contains("no worker has"));
    }

    #[test]
    fn an_unreadable_cluster_fails_the_audit() {
        let mut rec = record(json!([]));
        rec["error"] = json!("unavailable");
        assert_eq!(check(&rec).0["valid"], json!(false));
    }
}
