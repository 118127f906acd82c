//! The disk nemeses, through the FUSE layer (`crate::lazyfs`).

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::RngExt;
use serde_json::json;
use tokio::sync::Mutex;

use super::{Active, Started};
use crate::cluster::Cluster;
use crate::lazyfs::DiskError;

/// `lose-unsynced`: kills nodes and drops what their disks had not synced.
/// `members` are shuffled voters, `l` the leader (or a stand-in).
pub(super) async fn lose_unsynced(
    cluster: &Arc<Mutex<Cluster>>,
    members: &[u64],
    l: u64,
    majority: usize,
    rng: &mut StdRng,
) -> anyhow::Result<Started> {
    // A power loss: one node, the leader, the leader and a
    // follower, every node (then no copy of an unsynced write
    // survives anywhere), or a majority while the rest lag behind
    // (paused for 1-2 s first, so the majority alone holds the
    // newest acknowledged writes; the laggards then lead).
    let variant = *[
        "one",
        "leader",
        "leader-and-follower",
        "all",
        "majority-ahead",
    ]
    .choose(rng)
    .expect("non-empty");
    let mut majority_set = vec![l];
    majority_set.extend(
        members
            .iter()
            .copied()
            .filter(|&m| m != l)
            .take(majority - 1),
    );
    let targets: Vec<u64> = match variant {
        "one" => vec![members[0]],
        "leader" => vec![l],
        "leader-and-follower" => {
            let mut t = vec![l];
            t.extend(members.iter().copied().find(|&m| m != l));
            t
        }
        "majority-ahead" => majority_set.clone(),
        _ => members.to_vec(),
    };
    let laggards: Vec<u64> = if variant == "majority-ahead" {
        members
            .iter()
            .copied()
            .filter(|m| !targets.contains(m))
            .collect()
    } else {
        Vec::new()
    };
    let mut c = cluster.lock().await;
    let mut lost = Vec::new();
    for &t in &laggards {
        c.pause(t)?;
    }
    if !laggards.is_empty() {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1000..=2000))).await;
    }
    for &t in &targets {
        c.kill(t).await?;
    }
    for &t in &laggards {
        c.resume(t)?;
    }
    for &t in &targets {
        lost.push(json!({"node": t, "files": c.lose_unsynced(t)?}));
    }
    Ok((
        variant.to_string(),
        targets.clone(),
        json!({ "lost": lost, "laggards": laggards }),
        Active::Killed(targets),
    ))
}

/// `slow-disk`: makes syncs slow on the leader, a follower or a majority.
pub(super) async fn slow_disk(
    cluster: &Arc<Mutex<Cluster>>,
    members: &[u64],
    l: u64,
    majority: usize,
    rng: &mut StdRng,
) -> anyhow::Result<Started> {
    let variant = *["leader", "follower", "majority"]
        .choose(rng)
        .expect("non-empty");
    let targets: Vec<u64> = match variant {
        "leader" => vec![l],
        "follower" => members
            .iter()
            .copied()
            .filter(|&m| m != l)
            .take(1)
            .collect(),
        _ => members.iter().copied().take(majority).collect(),
    };
    let delay = Duration::from_millis(rng.random_range(100..=2000));
    let c = cluster.lock().await;
    for &t in &targets {
        c.set_fsync_delay(t, delay)?;
    }
    Ok((
        variant.to_string(),
        targets.clone(),
        json!({ "fsync_ms": delay.as_millis() as u64 }),
        Active::SlowDisk(targets),
    ))
}

/// `disk-error`: the disk of the leader, a follower or (rarely) a
/// majority fills up (ENOSPC) or fails its syncs (EIO) for the fault's
/// length. A node that exits on it is started again by the supervisor
/// (and fails again while the disk does); healing clears the error and
/// starts every target that is down.
pub(super) async fn disk_error(
    cluster: &Arc<Mutex<Cluster>>,
    members: &[u64],
    l: u64,
    majority: usize,
    rng: &mut StdRng,
) -> anyhow::Result<Started> {
    let error = if rng.random_bool(0.5) {
        DiskError::Full
    } else {
        DiskError::SyncEio
    };
    let target = match rng.random_range(0..10) {
        0..=4 => "leader",
        5..=8 => "follower",
        _ => "majority",
    };
    let targets: Vec<u64> = match target {
        "leader" => vec![l],
        "follower" => members
            .iter()
            .copied()
            .filter(|&m| m != l)
            .take(1)
            .collect(),
        _ => {
            let mut t = vec![l];
            t.extend(
                members
                    .iter()
                    .copied()
                    .filter(|&m| m != l)
                    .take(majority - 1),
            );
            t
        }
    };
    anyhow::ensure!(!targets.is_empty(), "no node to fail the disk of");
    let c = cluster.lock().await;
    for &t in &targets {
        c.set_disk_error(t, Some(error))?;
    }
    let name = match error {
        DiskError::Full => "full",
        DiskError::SyncEio => "sync-eio",
    };
    Ok((
        format!("{name}-{target}"),
        targets.clone(),
        json!({ "error": error }),
        Active::DiskError(targets),
    ))
}
