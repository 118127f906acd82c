//! The `lost-disk` nemesis: a voter loses its whole data directory (a
//! dead disk replaced, a Kubernetes volume lost) and comes back empty
//! under its old id, as a careless operator or a StatefulSet would start
//! it. It forgot the votes it granted and the entries it acknowledged, so
//! the node must refuse to take part ("A voter that lost its data stays
//! out" in `docs/operations/deploy.md`): it logs the way back
//! (`raftlock members remove N`) and adopts nothing. The nemesis kills
//! one follower the cluster has heard from, wipes its data, starts it
//! again, and waits until it either refuses or takes part (it shows a
//! term or a membership); then it replaces it as
//! `docs/operations/membership.md` says: removed, wiped, added again. The
//! `lost-disk` check ([`check`]) fails a node that took part, or did
//! neither within [`DECIDE_WITHIN`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::{json, Value};
use tokio::sync::Mutex;

use super::{Active, Started};
use crate::cluster::Cluster;
use crate::history::{Event, Process, Recorder, Type};

/// How long the wiped node gets to refuse or take part.
pub const DECIDE_WITHIN: Duration = Duration::from_secs(30);

pub(super) async fn lost_disk(
    cluster: &Arc<Mutex<Cluster>>,
    rec: &Recorder,
    members: &[u64],
    leader: Option<u64>,
) -> anyhow::Result<Started> {
    anyhow::ensure!(
        members.len() >= 3,
        "lost-disk needs a majority of voters besides the node it wipes"
    );
    let target = members
        .iter()
        .copied()
        .find(|m| Some(*m) != leader)
        .context("no follower to wipe")?;
    let (log, admin, addr) = {
        let c = cluster.lock().await;
        (c.log_path(target), c.admin().clone(), c.addr(target))
    };
    // The cluster must have heard from it: a follower that answers with
    // a log (it may have been down, or just added).
    let before = read_from(&log, 0).len();
    let heard = match admin.node_status(&addr).await {
        Ok(s) => s.last_log_index > 0 || s.term > 0,
        Err(_) => false,
    };
    cluster.lock().await.wipe(target).await?;
    let refusal = format!("raftlock members remove {target}");
    let deadline = Instant::now() + DECIDE_WITHIN;
    let outcome = loop {
        let since = read_from(&log, before);
        if since.contains(&refusal) {
            break "refused";
        }
        if let Ok(s) = admin.node_status(&addr).await {
            if s.term > 0 || !s.members.is_empty() {
                break "took-part";
            }
        }
        if Instant::now() >= deadline {
            break "undecided";
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let replaced = super::rot::replace(cluster, rec, target).await;
    let value = json!({
        "node": target, "heard_before": heard, "outcome": outcome, "replaced": replaced,
    });
    rec.record(
        Process::NEMESIS,
        Type::Info,
        "lost-disk-outcome",
        value.clone(),
    );
    Ok(("wiped".to_string(), vec![target], value, Active::Done))
}

/// The text of `log` from byte `from` on (empty if unreadable).
fn read_from(log: &std::path::Path, from: usize) -> String {
    let bytes = std::fs::read(log).unwrap_or_default();
    String::from_utf8_lossy(bytes.get(from..).unwrap_or_default()).into_owned()
}

/// The `lost-disk` check: every wiped voter the cluster had heard from
/// refused to take part; a wiped voter it had not heard from may do
/// either.
pub fn check(events: &[Event]) -> (Value, Vec<Value>) {
    let mut anomalies = Vec::new();
    let (mut wiped, mut refused) = (0, 0);
    for e in events
        .iter()
        .filter(|e| e.process == Process::NEMESIS && e.f == "lost-disk-outcome")
    {
        wiped += 1;
        let v = &e.value;
        let outcome = v["outcome"].as_str().unwrap_or("?");
        refused += u64::from(outcome == "refused");
        let problem = match (outcome, v["heard_before"].as_bool()) {
            ("refused", _) => None,
            ("took-part", Some(false)) => None,
            ("took-part", _) => Some(
                "took part again under its old id after losing its data (it forgot the votes \
                 it granted and the entries it acknowledged)"
                    .to_string(),
            ),
            (other, _) => Some(format!(
                "neither refused nor took part within {DECIDE_WITHIN:?} ({other})"
            )),
        };
        if let Some(p) = problem {
            anomalies.push(json!({
                "checker": "lost-disk",
                "message": format!("node {}: {p}", v["node"]),
                "time_ns": e.time_ns, "event": v,
            }));
        }
    }
    (
        json!({"valid": anomalies.is_empty(), "wiped": wiped, "refused": refused}),
        anomalies,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(outcome: &str, heard: bool) -> Event {
        Event {
            process: Process::NEMESIS,
            kind: Type::Info,
            f: "lost-disk-outcome".into(),
            value: json!({"node": 3, "heard_before": heard, "outcome": outcome}),
            time_ns: 0,
        }
    }

    #[test]
    fn a_wiped_voter_that_took_part_fails_the_check() {
        let (summary, anomalies) = check(&[outcome("refused", true)]);
        assert_eq!(summary["valid"], true);
        assert_eq!(summary["refused"], 1);
        assert!(anomalies.is_empty());
        for bad in ["took-part", "undecided"] {
            let (summary, anomalies) = check(&[outcome("refused", true), outcome(bad, true)]);
            assert_eq!(summary["valid"], false, "{bad}");
            assert_eq!(anomalies.len(), 1, "{bad}");
            assert_eq!(anomalies[0]["checker"], "lost-disk");
        }
        // One the cluster had not heard from may join as new.
        let (summary, _) = check(&[outcome("took-part", false)]);
        assert_eq!(summary["valid"], true);
    }
}
