//! The `membership` nemesis: add a spare, remove a voter.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::RngExt;
use serde_json::{json, Value};
use tokio::sync::Mutex;

use super::{Active, NemesisOptions, Started};
use crate::cluster::Cluster;
use crate::history::{Process, Recorder, Type};

pub(super) async fn membership(
    cluster: &Arc<Mutex<Cluster>>,
    rec: &Recorder,
    opts: &NemesisOptions,
    voters: Vec<u64>,
    leader: Option<u64>,
    rng: &mut StdRng,
) -> anyhow::Result<Started> {
    let (admin, all, members) = {
        let c = cluster.lock().await;
        (
            c.admin().clone(),
            c.ids(),
            c.members().await.unwrap_or_else(|| voters.clone()),
        )
    };
    if voters.len() as u64 > opts.nodes {
        // Shrink back: remove a voter, the leader a third of the time.
        let target = match leader {
            Some(l) if rng.random_bool(0.33) => l,
            _ => *voters.choose(rng).expect("voters"),
        };
        rec.record(
            Process::NEMESIS,
            Type::Invoke,
            "remove-node",
            json!({"node": target}),
        );
        let r = tokio::time::timeout(Duration::from_secs(30), admin.remove_node(target)).await;
        let (kind, value) = change_outcome(target, &r);
        rec.record(Process::NEMESIS, kind, "remove-node", value.clone());
        // A node that has left is decommissioned: wiped and started empty,
        // a spare for a later add. Only when the leader confirms it left.
        let mut wiped = false;
        if kind == Type::Ok {
            let mut c = cluster.lock().await;
            if c.members().await.is_some_and(|m| !m.contains(&target)) {
                c.wipe(target).await?;
                wiped = true;
            }
        }
        Ok((
            "remove".into(),
            vec![target],
            json!({"result": value, "wiped": wiped}),
            Active::Done,
        ))
    } else {
        let spares: Vec<u64> = all
            .iter()
            .copied()
            .filter(|id| !members.contains(id))
            .collect();
        anyhow::ensure!(!spares.is_empty(), "no spare node to add");
        let target = *spares.choose(rng).expect("spares");
        let addr = cluster.lock().await.addr(target);
        rec.record(
            Process::NEMESIS,
            Type::Invoke,
            "add-node",
            json!({"node": target, "addr": addr}),
        );
        let r = tokio::time::timeout(
            Duration::from_secs(40),
            admin.add_node(target, &addr, false),
        )
        .await;
        let (kind, value) = change_outcome(target, &r);
        rec.record(Process::NEMESIS, kind, "add-node", value.clone());
        Ok((
            "add".into(),
            vec![target],
            json!({ "result": value }),
            Active::Done,
        ))
    }
}

/// How a membership change on `target` ended, as the history records it:
/// `ok` with the new members, `fail` for a definite refusal, `info` when the
/// outcome is unknown (retryable error or timeout).
pub(super) fn change_outcome(
    target: u64,
    r: &Result<raftlock_client::Result<Vec<raftlock_client::Member>>, tokio::time::error::Elapsed>,
) -> (Type, Value) {
    match r {
        Ok(Ok(m)) => (
            Type::Ok,
            json!({"node": target, "members": m.iter().map(|m| m.id).collect::<Vec<_>>()}),
        ),
        Ok(Err(e)) => (
            if e.is_retryable() {
                Type::Info
            } else {
                Type::Fail
            },
            json!({"node": target, "error": e.to_string()}),
        ),
        Err(_) => (Type::Info, json!({"node": target, "error": "timed out"})),
    }
}
