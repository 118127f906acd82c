//! A backup made offline from a stopped node's data directory, for when a
//! cluster has lost its majority and no node can answer `snapshot save`
//! (`raftlockd export`, and `raftlockd run --force-new-cluster`, which
//! starts a new cluster from it).
//!
//! What it keeps: the node's latest snapshot, then every entry of its log
//! after it, in order, applied as the node would apply them. That is every
//! entry the node knew committed and those after, which the lost majority
//! may have committed without this node hearing so (a lost majority cannot
//! tell us): keeping them loses no grant a client was told of. An entry the
//! majority never committed only holds a lock for a session that then
//! expires, or releases one whose holder was told "outcome unknown"; the
//! new cluster's fences start above every fence of the old one either way
//! (the restore's fence bump), so a store that checks fences refuses every
//! write made under the old cluster's grants once a new grant writes.

use std::collections::BTreeMap;
use std::path::Path;

use openraft::storage::{RaftLogReader as _, RaftLogStorage as _};

use crate::apply::state_machine::StateMachineStore;
use crate::apply::{snapshot_location::SnapshotLocation, Shared};
use crate::raft::log_store::{open_db, LogStore};
use crate::raft::{EntryPayload, NodeAddrs, NodeId, StoredMembership};
use crate::state::Stats;

/// What [`export`] read from a data directory.
pub struct Exported {
    /// The backup (the format of `raftlock snapshot save`).
    pub backup: Vec<u8>,
    /// The last log index applied to make it.
    pub index: u64,
    /// The last index the node knew committed (`None`: none saved).
    pub committed: Option<u64>,
    /// The cluster the data belongs to (0: none recorded).
    pub cluster_id: u64,
    /// The voters of the last membership in the data, with their
    /// addresses.
    pub voters: BTreeMap<NodeId, NodeAddrs>,
    /// What the table holds.
    pub stats: Stats,
}

/// Whether the data directory `data_dir` of a stopped node is empty as
/// `raftlockd run` counts it (no vote, no log entry: the node never took
/// part in a cluster, and `--init` would bootstrap it), whatever files an
/// interrupted first start left. Refused while a node runs on it.
pub fn is_empty(data_dir: &Path) -> anyhow::Result<bool> {
    let sled_dir = data_dir.join("sled");
    if !sled_dir.exists() {
        return Ok(true);
    }
    let db = open_db(&sled_dir).map_err(|e| {
        anyhow::anyhow!(
            "cannot open {}: {e} (is a node still running on it? stop it first)",
            sled_dir.display()
        )
    })?;
    Ok(LogStore::new(db, &sled_dir)?.is_fresh())
}

/// Reads the data directory `data_dir` of a stopped node (refused while a
/// node runs on it: sled holds a lock on its files) and makes a backup of
/// everything in it.
pub async fn export(data_dir: &Path) -> anyhow::Result<Exported> {
    let sled_dir = data_dir.join("sled");
    anyhow::ensure!(
        sled_dir.is_dir(),
        "{} holds no node's data (no sled directory)",
        data_dir.display()
    );
    let db = open_db(&sled_dir).map_err(|e| {
        anyhow::anyhow!(
            "cannot open {}: {e} (is a node still running on it? stop it first)",
            sled_dir.display()
        )
    })?;
    let mut log = LogStore::new(db, &sled_dir)?;
    let cluster_id = log.cluster_id()?.unwrap_or(0);
    let committed = log.read_committed().await?.map(|c| c.index);
    let shared = Shared::new(log.committed_marker());
    // Loads the snapshot file (checked against its checksum) into `shared`.
    let _sm = StateMachineStore::open(
        shared.clone(),
        SnapshotLocation::File(data_dir.join("snapshot.bin")),
    )?;
    let from = shared.read(|a| a.last_applied.map_or(0, |l| l.index + 1));
    let state = log.get_log_state().await?;
    if let Some(last) = state.last_log_id {
        let mut reader = log.get_log_reader().await;
        // In slices, so a long log is not all in memory at once.
        const SLICE: u64 = 4096;
        let mut at = from;
        while at <= last.index {
            let to = (at + SLICE).min(last.index + 1);
            let entries = reader.try_get_log_entries(at..to).await?;
            anyhow::ensure!(
                entries.len() as u64 == to - at,
                "the log has a gap in {at}..{to} (entries purged without a snapshot covering them)"
            );
            for entry in entries {
                match entry.payload {
                    EntryPayload::Blank => shared.advance(entry.log_id, None),
                    EntryPayload::Normal(batch) => {
                        shared.apply(entry.log_id, batch);
                    }
                    EntryPayload::Membership(m) => shared.advance(
                        entry.log_id,
                        Some(StoredMembership::new(Some(entry.log_id), m)),
                    ),
                }
            }
            at = to;
        }
    }
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(shared.read(|a| {
        let index = a.last_applied.map_or(0, |l| l.index);
        Exported {
            backup: crate::api::backup::write(&a.table, index, cluster_id, created),
            index,
            committed,
            cluster_id,
            voters: {
                let m = a.membership.membership();
                m.voter_ids()
                    .filter_map(|id| Some((id, m.get_node(&id)?.clone())))
                    .collect()
            },
            stats: a.table.stats(),
        }
    }))
}
