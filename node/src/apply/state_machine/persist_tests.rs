//! Tests of persisting snapshots: an older one never replaces a newer one.

use super::*;

fn file_at(index: u64) -> Vec<u8> {
    let meta = SnapshotMeta {
        last_log_id: Some(crate::raft::log_id(1, 1, index)),
        last_membership: StoredMembership::default(),
    };
    encode_snapshot_file(&meta, &LockTable::new(), 0)
}

/// A snapshot built from an older applied index (the builder encodes,
/// meanwhile an install persists a newer one) must not overwrite the
/// newer file: the log behind it may be purged already.
#[tokio::test]
async fn an_older_snapshot_never_replaces_a_newer_one() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("snapshot.bin");
    let shared = Shared::new_for_tests();
    let snap = SnapshotShared::default();
    persist(
        &shared,
        &snap,
        &SnapshotLocation::File(path.clone()),
        file_at(5000),
    )
    .await
    .expect("persist 5000");
    persist(
        &shared,
        &snap,
        &SnapshotLocation::File(path.clone()),
        file_at(1000),
    )
    .await
    .expect("persist 1000");
    let on_disk = decode_snapshot_meta(&std::fs::read(&path).expect("read")).expect("meta");
    assert_eq!(on_disk.last_log_id.map(|l| l.index), Some(5000));
}
