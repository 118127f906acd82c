//! Tests of a crash at every step of installing a snapshot.

use std::path::Path;

use openraft::storage::{RaftLogReader, RaftLogStorage};

use super::*;
use crate::raft::log_store::{open_db, LogStore};

fn log_id(index: u64) -> LogId {
    crate::raft::log_id(1, 1, index)
}

fn file_at(index: u64) -> Vec<u8> {
    let meta = SnapshotMeta {
        last_log_id: Some(log_id(index)),
        last_membership: StoredMembership::default(),
    };
    encode_snapshot_file(&meta, &LockTable::new(), 0)
}

#[derive(Clone, Copy, Debug)]
enum Step {
    /// openraft saves the snapshot's index as committed.
    Commit,
    /// openraft purges the log up to the snapshot.
    Purge,
    /// The snapshot's temp file is half written.
    HalfWritten,
    /// The snapshot is written, synced and renamed into place.
    Persisted,
}

fn stores(dir: &Path) -> (LogStore, StateMachineStore) {
    let sm = StateMachineStore::open(
        Shared::new_for_tests(),
        SnapshotLocation::File(dir.join("snapshot.bin")),
    )
    .expect("state machine opens");
    let sled = dir.join("sled");
    let log = LogStore::new(open_db(&sled).expect("db"), &sled)
        .expect("log")
        .with_snapshot_floor(sm.persisted_snapshot());
    (log, sm)
}

/// What openraft needs at start-up: the snapshot loads, the log is not
/// purged past it, and every entry between it and the commit index is
/// there to replay.
async fn restarts(dir: &Path, what: &str) {
    let (mut log, mut sm) = stores(dir);
    let (applied, _) = sm.applied_state().await.expect("applied");
    let applied = applied.map_or(0, |l| l.index);
    let state = log.get_log_state().await.expect("log state");
    let purged = state.last_purged_log_id.map_or(0, |l| l.index);
    assert!(
        purged <= applied,
        "{what}: log purged to {purged} behind a snapshot at {applied}"
    );
    let committed = log
        .read_committed()
        .await
        .expect("committed")
        .map_or(0, |l| l.index);
    if committed > applied {
        let entries = log
            .try_get_log_entries(applied + 1..=committed)
            .await
            .expect("read");
        assert_eq!(
            entries.len() as u64,
            committed - applied,
            "{what}: entries {}..={committed} missing for the replay",
            applied + 1
        );
    }
}

#[tokio::test]
async fn a_crash_at_any_step_of_an_install_leaves_a_node_that_restarts() {
    use Step::*;
    let orders = [
        [Commit, Purge, HalfWritten, Persisted],
        [Commit, HalfWritten, Persisted, Purge],
    ];
    for order in orders {
        for crash_after in 0..=order.len() {
            let dir = tempfile::tempdir().expect("dir");
            // Before: a snapshot at 5 on disk, entries 1..=8, committed 8.
            {
                let (mut log, sm) = stores(dir.path());
                persist(&sm.shared, &sm.snap, &sm.location, file_at(5))
                    .await
                    .expect("old snapshot");
                log.write_for_tests((1..=8u64).map(|i| crate::raft::Entry {
                    log_id: log_id(i),
                    payload: crate::raft::EntryPayload::Blank,
                }));
                log.save_committed(Some(log_id(8))).await.expect("commit");
            }
            let what = format!("{order:?} crashed after {crash_after} steps");
            {
                // The install of a snapshot at 20, cut short.
                let (mut log, sm) = stores(dir.path());
                for step in &order[..crash_after] {
                    match step {
                        Commit => log.save_committed(Some(log_id(20))).await.expect("commit"),
                        Purge => log.purge(log_id(20)).await.expect("purge"),
                        HalfWritten => {
                            let bytes = file_at(20);
                            std::fs::write(
                                dir.path().join("snapshot.tmp"),
                                &bytes[..bytes.len() / 2],
                            )
                            .expect("tmp");
                        }
                        Persisted => {
                            persist(&sm.shared, &sm.snap, &sm.location, file_at(20))
                                .await
                                .expect("persist");
                        }
                    }
                }
            }
            restarts(dir.path(), &what).await;
        }
    }
}
