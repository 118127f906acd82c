//! Tests of snapshot files on disk: a corrupt or damaged file is refused.

use super::*;

fn table_with_a_grant() -> LockTable {
    let mut table = LockTable::new();
    table.apply(
        1,
        crate::state::Command::OpenSessionV0(crate::state::cmd::OpenSessionV0 {
            ttl_ms: 10_000,
            lock_delay_ms: 0,
            nonce: 7,
            owner: String::new(),
        }),
    );
    table
}

/// A snapshot file with a flipped bit is refused at start, naming the
/// file, instead of silently loading a different table.
#[test]
fn a_corrupt_snapshot_file_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("snapshot.bin");
    let meta = SnapshotMeta {
        last_log_id: Some(crate::raft::log_id(3, 1, 2)),
        last_membership: StoredMembership::default(),
    };
    let bytes = encode_snapshot_file(&meta, &table_with_a_grant(), 0);
    std::fs::write(&path, &bytes).expect("write");
    assert!(StateMachineStore::open(
        Shared::new_for_tests(),
        SnapshotLocation::File(path.clone())
    )
    .is_ok());
    // Flip one bit of the ttl (10_000 → 10_016): still a valid table.
    let ttl_at = bytes
        .windows(8)
        .rposition(|w| w == 10_000u64.to_le_bytes())
        .expect("ttl in the file");
    let mut bad = bytes.clone();
    bad[ttl_at] ^= 0x10;
    std::fs::write(&path, &bad).expect("write");
    let err = match StateMachineStore::open(
        Shared::new_for_tests(),
        SnapshotLocation::File(path.clone()),
    ) {
        Ok(_) => panic!("a corrupt snapshot file was loaded"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("snapshot.bin"), "{err}");
}

/// The simulator's snapshot file: replaced whole, kept as it was when
/// a replacement fails (a full disk at the write or at the sync, a
/// dying disk) or is cut short by a crash, and refused at start when
/// torn or corrupted, as a real file is.
#[tokio::test(start_paused = true)]
async fn a_simulated_snapshot_file_is_replaced_whole_and_refused_when_damaged() {
    use crate::raft::log_store::MemDisk;
    let disk = MemDisk::new();
    let location = SnapshotLocation::Simulated(disk.clone());
    let shared = Shared::new_for_tests();
    let snap = SnapshotShared::default();
    let file_at = |index| {
        let meta = SnapshotMeta {
            last_log_id: Some(crate::raft::log_id(3, 1, index)),
            last_membership: StoredMembership::default(),
        };
        encode_snapshot_file(&meta, &table_with_a_grant(), 0)
    };
    let covers = |disk: &MemDisk| {
        disk.snapshot_file().map(|b| {
            decode_snapshot_meta(&b)
                .expect("meta")
                .last_log_id
                .map(|l| l.index)
        })
    };
    assert!(StateMachineStore::open(Shared::new_for_tests(), location.clone()).is_ok());
    persist(&shared, &snap, &location, file_at(5))
        .await
        .expect("persist");
    assert_eq!(covers(&disk), Some(Some(5)));

    for (fault, errno) in [
        (MemDisk::fill as fn(&MemDisk), 28),
        (MemDisk::fill_at_sync, 28),
        (MemDisk::fail_syncs, 5),
    ] {
        fault(&disk);
        let err = persist(&shared, &snap, &location, file_at(9))
            .await
            .expect_err("the disk fails");
        assert_eq!(err.raw_os_error(), Some(errno));
        assert_eq!(covers(&disk), Some(Some(5)), "the old file stays");
        disk.heal();
    }

    // A crash while the file is being written and synced.
    disk.set_sync_latency(std::time::Duration::from_millis(10));
    let writing = {
        let (location, bytes) = (location.clone(), file_at(9));
        tokio::spawn(async move { location.replace(bytes).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    writing.abort();
    assert!(writing.await.expect_err("cut short").is_cancelled());
    assert_eq!(covers(&disk), Some(Some(5)), "the old file stays");
    disk.set_sync_latency(std::time::Duration::ZERO);

    let loaded = StateMachineStore::open(Shared::new_for_tests(), location.clone())
        .expect("a whole file loads");
    assert_eq!(loaded.persisted_snapshot().load(Ordering::SeqCst), 6);

    let whole = disk.snapshot_file().expect("file");
    for (damage, what) in [
        (disk.tear_snapshot_file(whole.len() - 1), "torn by one byte"),
        (disk.tear_snapshot_file(whole.len() / 2), "torn in half"),
    ] {
        assert!(damage);
        let err = match StateMachineStore::open(Shared::new_for_tests(), location.clone()) {
            Ok(_) => panic!("a snapshot file {what} was loaded"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains("simulated disk's snapshot file"),
            "{what}: {err}"
        );
    }
    assert!(!disk.tear_snapshot_file(whole.len()), "nothing to tear");
    for at in [0, 1, whole.len() / 2, whole.len() - 1] {
        disk.heal();
        persist(
            &shared,
            &SnapshotShared::default(),
            &location,
            whole.clone(),
        )
        .await
        .expect("whole again");
        assert!(disk.corrupt_snapshot_file(at, 0x01));
        assert!(
            StateMachineStore::open(Shared::new_for_tests(), location.clone()).is_err(),
            "a file with byte {at} flipped was loaded"
        );
    }
    assert!(
        !disk.corrupt_snapshot_file(whole.len(), 0x01),
        "no such byte"
    );
}
