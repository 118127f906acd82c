//! What runs beside the nemesis and the workers for the whole run: the
//! supervisor, which starts again a node that exited on its own (as
//! systemd's `Restart=on-failure` would, after the shipped unit's
//! `RestartSec`; a node the cluster removed is wiped and started empty
//! instead) and records why it exited; and the sampler, which asks
//! every node how it is doing (gRPC health and `Status`) twice a second,
//! for the no-zombie check ([`crate::zombie`]).
//!
//! History events (process `"nemesis"`, type `info`):
//!
//! * `node-exit` `{node, pid, code, signal, last_log_line, removed,
//!   cluster_dir}`: a node process ended without the harness stopping it
//!   (`removed`: the line in which a node that exited with status 0 said
//!   the cluster had removed it, else `null`);
//! * `node-restart` `{node, cluster_dir}` (or `{..., error}`): the
//!   supervisor started it again;
//! * `node-decommission` `{node, cluster_dir}` (or `{..., error}`): a
//!   node that exited because it was removed was wiped and started empty
//!   instead (a spare for a later add), as its log tells an operator;
//! * `sample` `{cluster_dir, nodes: [{id, alive, paused, health, role,
//!   term, leader, applied, members, error}]}`: one round of the sampler
//!   (`health` is `"serving"`, `"not-serving"` or `null` when it did not
//!   answer; `role`, `term`, `leader`, `applied` and `members` are from
//!   `Status`, absent when it did not answer).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::{mpsc, watch, Mutex};

use crate::cluster::{Cluster, ExitReport, Roster};
use crate::history::{Process, Recorder, Type};
use crate::raw::Creds;

/// How long the supervisor waits before starting a node that exited: the
/// `RestartSec` of `deploy/systemd/raftlockd.service`.
pub const RESTART_DELAY: Duration = Duration::from_secs(2);

/// How often the sampler asks every node.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(500);

/// How long a node has to answer one sample's health check and `Status`.
pub const SAMPLE_TIMEOUT: Duration = Duration::from_millis(400);

/// Records every exit the cluster reports and starts the node again after
/// [`RESTART_DELAY`], unless the harness stopped it. Runs until the
/// cluster drops its sender.
pub async fn supervisor(
    cluster: Arc<Mutex<Cluster>>,
    rec: Recorder,
    mut exits: mpsc::UnboundedReceiver<ExitReport>,
) {
    while let Some(exit) = exits.recv().await {
        if exit.by_harness {
            continue;
        }
        rec.record(
            Process::NEMESIS,
            Type::Info,
            "node-exit",
            json!({"node": exit.node, "pid": exit.pid, "code": exit.code, "signal": exit.signal,
                   "last_log_line": exit.last_log_line, "removed": exit.removed,
                   "cluster_dir": exit.cluster_dir}),
        );
        eprintln!(
            "raftlock-jepsen: node {} exited on its own (status {:?}, signal {:?}): {}",
            exit.node, exit.code, exit.signal, exit.last_log_line
        );
        let cluster = cluster.clone();
        let rec = rec.clone();
        if exit.removed.is_some() {
            // Removed from the cluster: status 0, which Restart=on-failure
            // leaves stopped. Decommission it as its log says (wipe, and
            // start it empty as a spare), unless the membership nemesis
            // already has.
            tokio::spawn(async move {
                tokio::time::sleep(RESTART_DELAY).await;
                let wiped = cluster
                    .lock()
                    .await
                    .decommission(&exit.cluster_dir, exit.node)
                    .await;
                let value = match wiped {
                    Ok(false) => return,
                    Ok(true) => json!({"node": exit.node, "cluster_dir": exit.cluster_dir}),
                    Err(e) => json!({"node": exit.node, "cluster_dir": exit.cluster_dir,
                                     "error": format!("{e:#}")}),
                };
                rec.record(Process::NEMESIS, Type::Info, "node-decommission", value);
            });
            continue;
        }
        tokio::spawn(async move {
            tokio::time::sleep(RESTART_DELAY).await;
            let revived = cluster.lock().await.revive(&exit.cluster_dir, exit.node);
            match revived {
                Ok(true) => {
                    rec.record(
                        Process::NEMESIS,
                        Type::Info,
                        "node-restart",
                        json!({"node": exit.node, "cluster_dir": exit.cluster_dir}),
                    );
                }
                Ok(false) => {}
                Err(e) => {
                    rec.record(
                        Process::NEMESIS,
                        Type::Info,
                        "node-restart",
                        json!({"node": exit.node, "cluster_dir": exit.cluster_dir,
                               "error": format!("{e:#}")}),
                    );
                }
            }
        });
    }
}

/// One node's answers in one sample.
async fn sample_node(addr: String, creds: Creds) -> (Value, Value) {
    let (health, status) = tokio::join!(
        crate::raw::serving(&addr, SAMPLE_TIMEOUT),
        crate::raw::status(&addr, &creds, SAMPLE_TIMEOUT)
    );
    let health = match health {
        Ok(true) => json!("serving"),
        Ok(false) => json!("not-serving"),
        Err(_) => Value::Null,
    };
    let status = match status {
        Ok(s) => json!({
            "role": s.role, "term": s.term, "leader": s.leader_id, "applied": s.applied_index,
            "members": s.members.iter().map(|m| m.id).collect::<Vec<_>>(),
        }),
        Err(e) => json!({ "error": e }),
    };
    (health, status)
}

/// Samples every node of the current roster every [`SAMPLE_INTERVAL`]
/// until `stop`; paused and dead nodes are recorded as such without being
/// asked.
pub async fn sampler(
    mut roster: watch::Receiver<Roster>,
    rec: Recorder,
    creds: Creds,
    stop: Arc<AtomicBool>,
) {
    let mut tick = tokio::time::interval(SAMPLE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        let r = roster.borrow_and_update().clone();
        let asked = futures::future::join_all(r.nodes.iter().map(|n| {
            let (addr, creds, ask) = (n.addr.clone(), creds.clone(), n.alive && !n.paused);
            async move {
                if ask {
                    Some(sample_node(addr, creds).await)
                } else {
                    None
                }
            }
        }))
        .await;
        // The roster may have changed while the nodes were asked (a kill,
        // a restart): a node counts as alive only if it was before and
        // after.
        let after = roster.borrow().clone();
        let nodes: Vec<Value> = r
            .nodes
            .iter()
            .zip(asked)
            .map(|(n, answer)| {
                let still = after
                    .nodes
                    .iter()
                    .find(|m| m.id == n.id)
                    .is_some_and(|m| m.alive && !m.paused)
                    && after.dir == r.dir;
                let mut v = json!({"id": n.id, "alive": n.alive && still, "paused": n.paused});
                if let (Some((health, status)), true) = (answer, still) {
                    v["health"] = health;
                    if let Some(o) = status.as_object() {
                        for (k, x) in o {
                            v[k] = x.clone();
                        }
                    }
                }
                v
            })
            .collect();
        rec.record(
            Process::NEMESIS,
            Type::Info,
            "sample",
            json!({"cluster_dir": r.dir, "nodes": nodes}),
        );
    }
}
