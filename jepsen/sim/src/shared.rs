//! The harness's checkers on the workers' history: `raftlock-check`, the
//! crate `raftlock-jepsen` runs its own histories through, here on
//! simulated time.
//!
//! The workers record every operation as the harness's workload does
//! (`open`, `acquire`, `release`, `close`: an `invoke` event, then `ok`,
//! `fail` or `info`, a worker continuing under a new process number after
//! an `info`), stamped with simulated milliseconds since the start of the
//! run (as nanoseconds, the history's unit). At the end of the run
//! [`check`] runs the shared `mutual-exclusion` (grants certainly held at
//! once), `fence-order` and `linearizability` (porcupine's search against
//! the lock model) checkers on them.
//!
//! Nothing here reads the simulated clocks: the linearizability search is
//! run to its end (`linear::check_unbounded`), so its verdict is the same
//! on every run of a seed, on a separate thread, and waited for at most
//! [`LINEARIZABILITY_BUDGET`] of the machine's time (`CLOCK_BOOTTIME`,
//! [`crate::wall_clock::real_time`]); `std::time::Instant` is simulated
//! in this binary and stands still once the run stops stepping, so
//! porcupine's own timeout would never fire.

use std::time::Duration;

use raftlock_check::history::{pair_ops, Event, Process, Type};
use raftlock_check::{checker, linear};
use serde_json::Value;

/// The longest the linearizability search is waited for, in real time.
/// A search still running then leaves the run unjudged by it (said on
/// stderr), not failed: porcupine's search is exponential at worst, and the
/// workers' histories (one lock, three workers) take milliseconds.
pub const LINEARIZABILITY_BUDGET: Duration = Duration::from_secs(60);

/// The workers' history, in the order the events happened.
#[derive(Debug, Default)]
pub struct History {
    events: Vec<Event>,
}

impl History {
    /// Records an event of client process `process`, `now_ms` simulated
    /// milliseconds into the run.
    pub fn record(&mut self, process: u64, kind: Type, f: &str, value: Value, now_ms: u64) {
        self.events.push(Event {
            process: Process::Client(process),
            kind,
            f: f.to_string(),
            value,
            time_ns: now_ms * 1_000_000,
        });
    }

    /// The events so far.
    pub fn events(&self) -> &[Event] {
        &self.events
    }
}

/// How a client error ends an operation: `info` (it may have been applied)
/// or `fail` (it certainly was not). The harness's workload's rule
/// (`raftlock-jepsen`'s `workload::classify`), for the same client.
pub fn classify(e: &raftlock_client::Error) -> Type {
    use raftlock_client::Error;
    match e {
        Error::Unknown(_) | Error::Internal(_) | Error::LeaseLost | Error::SessionNotFound(_) => {
            Type::Info
        }
        _ => Type::Fail,
    }
}

/// Runs the shared checkers on `events`: `Err` names the first one that
/// found an anomaly, with the anomaly. The linearizability search is
/// waited for at most `budget` of real time.
pub fn check(events: &[Event], budget: Duration) -> Result<(), String> {
    let ops = pair_ops(events);
    let grants = checker::grants(&ops);
    verdict("mutual-exclusion", checker::mutual_exclusion(&grants))?;
    verdict("fence-order", checker::fence_order(&ops, &grants))?;
    let search = std::thread::spawn(move || linear::check_unbounded(&ops));
    let deadline = crate::wall_clock::real_time() + budget;
    while !search.is_finished() {
        if crate::wall_clock::real_time() >= deadline {
            // The thread is left to the end of the process.
            eprintln!(
                "linearizability (raftlock-check): the search had not finished after {budget:?} \
                 of real time; this run is not judged by it"
            );
            return Ok(());
        }
        // nanosleep: real time, not the simulated clocks.
        std::thread::sleep(Duration::from_micros(200));
    }
    let found = search
        .join()
        .map_err(|_| "linearizability (raftlock-check): the search panicked".to_string())?;
    verdict("linearizability", found)
}

/// `Err` with the first anomaly if the checker's result is invalid.
fn verdict(name: &str, (result, anomalies): (Value, Vec<Value>)) -> Result<(), String> {
    if result["valid"] != Value::Bool(false) {
        return Ok(());
    }
    let Some(first) = anomalies.first() else {
        return Err(format!("{name} (raftlock-check): invalid: {result}"));
    };
    let message = first["message"].as_str().unwrap_or("invalid");
    let mut rest = first.clone();
    if let Some(m) = rest.as_object_mut() {
        m.remove("message");
        m.remove("checker");
        m.retain(|_, v| !v.is_null());
    }
    Err(format!(
        "{name} (raftlock-check): {message}; {rest} (anomalies found: {}; times in ns of simulated \
         time)",
        anomalies.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const BUDGET: Duration = Duration::from_secs(30);

    /// Worker `p` (session `s`) asks for `L` at `asked`, is granted `fence`
    /// at `granted`, sends its release at `until`, answered `released`
    /// one ms later (times in simulated ms).
    fn grant(h: &mut History, p: u64, s: u64, fence: u64, t: [u64; 3], released: bool) {
        let [asked, granted, until] = t;
        let acquire = json!({"lock": "L", "mode": "exclusive", "session": s});
        h.record(p, Type::Invoke, "acquire", acquire.clone(), asked);
        let mut answer = acquire;
        answer["fence"] = json!(fence);
        h.record(p, Type::Ok, "acquire", answer, granted);
        h.record(
            p,
            Type::Invoke,
            "release",
            json!({"lock": "L", "fence": fence, "session": s}),
            until,
        );
        h.record(
            p,
            Type::Ok,
            "release",
            json!({ "released": released }),
            until + 1,
        );
    }

    fn sorted(h: History) -> Vec<Event> {
        let mut events = h.events;
        events.sort_by_key(|e| e.time_ns);
        events
    }

    #[test]
    fn a_handoff_passes() {
        let mut h = History::default();
        grant(&mut h, 0, 10, 5, [0, 10, 20], true);
        grant(&mut h, 1, 11, 6, [5, 25, 30], true);
        assert_eq!(check(&sorted(h), BUDGET), Ok(()));
    }

    #[test]
    fn two_exclusive_grants_certainly_held_at_once_fail() {
        // Worker 1 is granted fence 6 at 15 ms; worker 0's release of
        // fence 5, sent at 20 ms, still found its grant.
        let mut h = History::default();
        grant(&mut h, 0, 10, 5, [0, 10, 20], true);
        grant(&mut h, 1, 11, 6, [5, 15, 30], true);
        let e = check(&sorted(h), BUDGET).expect_err("overlap");
        assert!(
            e.starts_with("mutual-exclusion (raftlock-check): L: fences 5 and 6"),
            "{e}"
        );
        // The linearizability search alone finds it too.
        let mut h = History::default();
        grant(&mut h, 0, 10, 5, [0, 10, 20], true);
        grant(&mut h, 1, 11, 6, [5, 15, 30], true);
        let (r, _) = linear::check_unbounded(&pair_ops(&sorted(h)));
        assert_eq!(r["valid"], json!(false));
        // A release that found nothing: the first grant may have expired
        // before the second; nothing is owed.
        let mut h = History::default();
        grant(&mut h, 0, 10, 5, [0, 10, 20], false);
        grant(&mut h, 1, 11, 6, [5, 15, 30], true);
        assert_eq!(check(&sorted(h), BUDGET), Ok(()));
    }

    #[test]
    fn a_fence_going_backwards_fails() {
        // Worker 1 asked at 25 ms, after fence 7 had reached worker 0 and
        // been released, and got the smaller fence 6.
        let mut h = History::default();
        grant(&mut h, 0, 10, 7, [0, 10, 20], true);
        grant(&mut h, 1, 11, 6, [25, 30, 40], true);
        let e = check(&sorted(h), BUDGET).expect_err("backwards");
        assert!(
            e.starts_with("fence-order (raftlock-check): L: fence 6 granted after fence 7"),
            "{e}"
        );
        // The same fence twice.
        let mut h = History::default();
        grant(&mut h, 0, 10, 7, [0, 10, 20], true);
        grant(&mut h, 1, 11, 7, [25, 30, 40], true);
        let e = check(&sorted(h), BUDGET).expect_err("twice");
        assert!(e.contains("fence 7 granted twice"), "{e}");
    }

    #[test]
    fn a_history_only_the_search_rejects_fails_on_linearizability() {
        // Worker 0's release of fence 5 answered that the grant was gone,
        // and a second release of it, sent later, found it held: a grant
        // gone and back. Neither single-grant checker sees it (one grant,
        // certainly held until the second release); the search does.
        let mut h = History::default();
        grant(&mut h, 0, 10, 5, [0, 10, 20], false);
        h.record(
            0,
            Type::Invoke,
            "release",
            json!({"lock": "L", "fence": 5, "session": 10}),
            30,
        );
        h.record(0, Type::Ok, "release", json!({"released": true}), 31);
        let e = check(&sorted(h), BUDGET).expect_err("not linearizable");
        assert!(
            e.starts_with(
                "linearizability (raftlock-check): no linearization of this lock's operations"
            ),
            "{e}"
        );
        assert!(e.contains("\"lock\":\"L\""), "{e}");
    }

    #[test]
    fn client_errors_are_classified_as_the_harness_does() {
        use raftlock_client::Error;
        assert_eq!(classify(&Error::Unknown("x".into())), Type::Info);
        assert_eq!(classify(&Error::LeaseLost), Type::Info);
        assert_eq!(classify(&Error::SessionNotFound("x".into())), Type::Info);
        assert_eq!(
            classify(&Error::NotAcquired(Duration::from_secs(3))),
            Type::Fail
        );
        assert_eq!(classify(&Error::Unavailable("x".into())), Type::Fail);
    }
}
