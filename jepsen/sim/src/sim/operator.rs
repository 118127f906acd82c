//! The operator: replaces a node (removes it, then adds a fresh one), and
//! restores a backup into the new cluster before any load, as the
//! operations docs tell an operator to (in a quarter of the runs:
//! `start_restorer`).

use std::time::Duration;

use rand::rngs::StdRng;
use rand::RngExt as _;

use raftlock_proto::v1 as pb;
use raftlock_proto::v1::cluster_client::ClusterClient;

use super::host::{applied_without, channel, Channels};
use super::{addr, note, now_ms, Cluster, Settings, Shared, LIVENESS_BOUND};

/// The operator replacing node `old` with node `new` (a fresh node on a
/// fresh disk, already started by the driver), as `docs/operations/membership.md` tells
/// an operator to replace a node whose data cannot be trusted: `raftlock
/// members remove OLD` on the leader, then `raftlock members add NEW`
/// (learner, caught up, promoted). Each step is retried on every member
/// until one takes it.
pub(super) async fn operator(old: u64, new: u64, stop_ms: u64, record: Shared) -> turmoil::Result {
    let mut chans = Channels::default();
    // Once faults are off, each step must be done within the liveness
    // bound.
    let overdue = |step: &str| -> turmoil::Result {
        if now_ms() > stop_ms + LIVENESS_BOUND.as_millis() as u64 {
            return Err(format!(
                "liveness: the operator could not {step} within {LIVENESS_BOUND:?} of the end of \
                 the faults"
            )
            .into());
        }
        Ok(())
    };
    'remove: loop {
        overdue(&format!("remove node {old}"))?;
        // The node itself too: a leader removes itself (and steps down).
        for (id, ch) in chans.of_members(&record) {
            let mut c = ClusterClient::new(ch.clone());
            let req = pb::RemoveNodeRequest { id: old };
            match tokio::time::timeout(Duration::from_secs(3), c.remove_node(req)).await {
                Ok(Ok(_)) => {
                    note(&record, format!("operator: node {id} removed node {old}"));
                    break 'remove;
                }
                Ok(Err(e)) if e.code() != tonic::Code::NotFound => {
                    note(
                        &record,
                        format!(
                            "operator: remove node {old} on node {id}: {:?} {}",
                            e.code(),
                            e.message()
                        ),
                    );
                }
                // NotFound: not in the membership node `id` uses. An
                // earlier attempt whose answer was lost may have removed
                // it, but that membership may not be committed yet (and a
                // leader elected next may not have it): done once a leader
                // has applied a membership without it.
                Ok(Err(_)) if applied_without(&record, id, old) => {
                    note(
                        &record,
                        format!(
                            "operator: node {old} is no member (node {id} leads and has \
                             applied a membership without it)"
                        ),
                    );
                    break 'remove;
                }
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    {
        let mut r = record.borrow_mut();
        r.retired.insert(old);
        r.members.retain(|m| *m != old);
        r.removed_at.insert(old, now_ms());
    }
    'add: loop {
        overdue(&format!("add node {new}"))?;
        // The new node too: promoted before an answer was lost, it may
        // lead by now.
        let mut to = chans.of_members(&record);
        to.push((
            new,
            chans.0.entry(new).or_insert_with(|| channel(new)).clone(),
        ));
        for (id, ch) in to {
            let mut c = ClusterClient::new(ch.clone());
            let req = pb::AddNodeRequest {
                id: new,
                addr: addr(new),
                catch_up_timeout_ms: 10_000,
                ..Default::default()
            };
            match tokio::time::timeout(Duration::from_secs(12), c.add_node(req)).await {
                Ok(Ok(_)) => {
                    note(&record, format!("operator: node {id} added node {new}"));
                    break 'add;
                }
                Ok(Err(e)) => note(
                    &record,
                    format!(
                        "operator: add node {new} on node {id}: {:?} {}",
                        e.code(),
                        e.message()
                    ),
                ),
                Err(_) => note(
                    &record,
                    format!("operator: add node {new} on node {id}: no answer"),
                ),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    overdue(&format!("add node {new}"))?;
    let mut r = record.borrow_mut();
    r.members.push(new);
    r.replaced.push((old, new));
    Ok(())
}

/// The operator restoring a backup into the new cluster before any load,
/// with a fence bump that leaves `left` fences before the bound
/// (`MAX_FENCE`): `Cluster.Backup` of the empty cluster on the leader,
/// then `Cluster.Restore` of it with that bump, sent again as it was (the
/// same `restore_id`) until a node answers. A retry of a restore that was
/// installed while its answer was lost must be answered as installed,
/// with the fence counter the restore set. The workers wait for it.
pub(super) async fn restorer(left: u64, stop_ms: u64, record: Shared) -> turmoil::Result {
    use raftlock_node::state::limits::MAX_FENCE;
    let mut chans = Channels::default();
    let target = MAX_FENCE - left;
    // The request, once made: every attempt sends it as it was.
    let mut request: Option<pb::RestoreRequest> = None;
    loop {
        if now_ms() > stop_ms + LIVENESS_BOUND.as_millis() as u64 {
            return Err("liveness: the restore was not done by the end of the run".into());
        }
        for (id, ch) in chans.of_members(&record) {
            let mut c = ClusterClient::new(ch);
            let req = match &request {
                Some(req) => req.clone(),
                None => {
                    let Ok(Ok(backup)) = tokio::time::timeout(
                        Duration::from_secs(2),
                        c.backup(pb::BackupRequest {}),
                    )
                    .await
                    else {
                        continue;
                    };
                    let backup = backup.into_inner();
                    let req = pb::RestoreRequest {
                        snapshot: backup.snapshot,
                        fence_bump: Some(target - backup.last_fence),
                        restore_id: Some(raftlock_client::random::next_u64() | 1),
                    };
                    request = Some(req.clone());
                    req
                }
            };
            match tokio::time::timeout(Duration::from_secs(2), c.restore(req)).await {
                Ok(Ok(r)) => {
                    let r = r.into_inner();
                    if r.last_fence != target {
                        return Err(format!(
                            "restorer: node {id} answered the restore with fence counter {}, \
                             not the {target} it set (a retry must be answered as the restore \
                             that was installed)",
                            r.last_fence
                        )
                        .into());
                    }
                    note(
                        &record,
                        format!(
                            "restorer: node {id} restored the backup, fence counter {} ({left} \
                             before the bound)",
                            r.last_fence
                        ),
                    );
                    let mut rec = record.borrow_mut();
                    rec.restored_fence = Some(r.last_fence);
                    rec.ready = true;
                    return Ok(());
                }
                Ok(Err(e)) => note(
                    &record,
                    format!("restorer: node {id}: {:?} {}", e.code(), e.message()),
                ),
                Err(_) => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Starts the restorer in a quarter of the runs (drawn from `ops_rng`);
/// in the others the workers may start at once.
pub(super) fn start_restorer(settings: &Settings, cluster: &mut Cluster<'_>, ops_rng: &mut StdRng) {
    let Cluster { sim, record, .. } = cluster;
    // A quarter of the runs start from a restored backup whose fence
    // counter is near the bound: a few hundred fences left (the run may
    // use them all: grants must then be refused, never wrap or pass it),
    // or up to a few hundred thousand.
    if settings.faults && ops_rng.random_bool(0.25) {
        let left = if ops_rng.random_bool(0.5) {
            ops_rng.random_range(1..400)
        } else {
            ops_rng.random_range(400..300_000)
        };
        sim.client(
            "restorer",
            restorer(left, settings.duration_ms, record.clone()),
        );
    } else {
        record.borrow_mut().ready = true;
    }
}
