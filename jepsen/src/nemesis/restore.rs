//! The `restore` nemesis: disaster recovery under load.

use std::sync::Arc;

use raftlock_client::Fence;
use rand::rngs::StdRng;
use rand::RngExt;
use serde_json::json;
use tokio::sync::Mutex;

use super::{Active, NemesisOptions, Started};
use crate::cluster::Cluster;
use crate::history::{Process, Recorder, Type};

/// A backup taken during the run: the table and its largest fence.
pub struct Backup {
    snapshot: Vec<u8>,
    last_fence: u64,
}

/// Disaster recovery under load: `Backup` from the live cluster, start a
/// fresh cluster, `Restore` into it (a third of the time an older backup of
/// this run, when there is one), and move the workers there. The old
/// cluster is stopped, as an operator would. Fences granted after the move
/// must be above everything the store accepted before it, and restored
/// session ids and queue positions must not collide with new ones.
pub(super) async fn restore(
    cluster: &Arc<Mutex<Cluster>>,
    rec: &Recorder,
    opts: &NemesisOptions,
    rng: &mut StdRng,
    backups: &mut Vec<Backup>,
) -> anyhow::Result<Started> {
    let mut c = cluster.lock().await;
    let backup = c.admin().backup().await?;
    backups.push(Backup {
        snapshot: backup.snapshot,
        last_fence: backup.last_fence.map_or(0, Fence::get),
    });
    let older = backups.len() > 1 && rng.random_bool(1.0 / 3.0);
    let pick = if older {
        rng.random_range(0..backups.len() - 1)
    } else {
        backups.len() - 1
    };
    let generation = std::fs::read_dir(&opts.out)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("restore-"))
                .count()
        })
        .unwrap_or(0)
        + 1;
    let variant = if older {
        "older-backup"
    } else {
        "latest-backup"
    };
    // What an operator does (docs/operations/backup-and-recovery.md, "Backup and restore"): the
    // server's default bump, which must cover what the cluster granted
    // after the backup and, for an older backup, everything an earlier
    // restore of it (or of a later backup) handed out since: the checkers
    // see a fence granted twice if it does not (the first version of this
    // nemesis found that of the old default, a flat 2^32).
    let live_last_fence = backup.last_fence.map_or(0, Fence::get);
    let fence_bump: Option<u64> = None;
    rec.record(
        Process::NEMESIS,
        Type::Info,
        "start-restore",
        json!({"variant": variant, "backup": pick, "backups": backups.len(),
               "live_index": backup.index, "live_last_fence": live_last_fence,
               "backup_last_fence": backups[pick].last_fence, "fence_bump": fence_bump}),
    );
    let restored = c
        .replace_by_restore(
            backups[pick].snapshot.clone(),
            fence_bump,
            opts.out.join(format!("restore-{generation}")),
        )
        .await?;
    if let Some(tx) = &opts.addrs {
        let gen = tx.borrow().gen + 1;
        tx.send_replace(crate::clientlink::ClusterAddrs {
            gen,
            nodes: c.addrs(),
        });
    }
    let detail = json!({
        "backup": pick, "backups": backups.len(), "generation": generation, "fence_bump": fence_bump,
        "sessions": restored.sessions, "last_fence": restored.last_fence,
    });
    rec.record(Process::NEMESIS, Type::Info, "restored", detail.clone());
    Ok((variant.to_string(), c.initial_ids(), detail, Active::Done))
}
