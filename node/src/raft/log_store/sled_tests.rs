//! sled's disk: durability of blob files, format and lock refusals,
//! sticky sync errors. (The store's rules are tested on both disks in
//! `tests.rs`.)

use super::sled_disk::{DurableFiles, KEY_FORMAT};
use super::*;

/// Items too large for sled's segments go to blob files, which sled
/// never syncs: the store finds and syncs them.
#[test]
fn large_items_land_in_blob_files_that_get_synced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = open_db(dir.path()).expect("open");
    let (files, _) = DurableFiles::open(dir.path(), &db, StorageFaults::default()).expect("files");
    db.insert(b"big", vec![7u8; 1 << 20]).expect("insert");
    files.durable(&db).expect("sync");
    let blobs: Vec<_> = std::fs::read_dir(dir.path().join("blobs"))
        .expect("blobs dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(!blobs.is_empty(), "a 1 MiB item is a blob");
    let synced = files.state.lock().expect("lock").synced_blobs.clone();
    for blob in &blobs {
        assert!(synced.contains(blob), "{blob:?} was not synced");
    }
}

/// A directory another live database holds is refused after
/// `DB_LOCK_WAIT`, saying so.
#[test]
fn a_directory_in_use_is_refused_after_a_wait() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _held = open_db(dir.path()).expect("open");
    let start = tokio::time::Instant::now();
    let err = open_db(dir.path()).expect_err("held");
    assert!(start.elapsed() >= DB_LOCK_WAIT);
    assert!(
        format!("{err:#}").contains("in use by another process"),
        "{err:#}"
    );
}

/// A data directory of another format version (e.g. 3, whose members
/// had one address) is refused with the steps to move its data, and
/// left as it was.
#[test]
fn another_format_version_is_refused_with_upgrade_steps() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let db = open_db(dir.path()).expect("open");
        let meta = db.open_tree("meta").expect("meta");
        meta.insert(KEY_FORMAT, &3u64.to_be_bytes())
            .expect("insert");
        db.flush().expect("flush");
    }
    let err = open_db(dir.path()).expect_err("format 3 is refused");
    let msg = format!("{err:#}");
    assert!(
        msg.contains("format 3") && msg.contains("reads 4") && msg.contains("snapshot save"),
        "{msg}"
    );
    let db = sled::open(dir.path()).expect("reopen");
    let found = db
        .open_tree("meta")
        .expect("meta")
        .get(KEY_FORMAT)
        .expect("get");
    assert_eq!(found.as_deref(), Some(&3u64.to_be_bytes()[..]));
}

/// fsyncgate: once a sync of the log has failed, every later sync of the
/// same store fails too, even if the disk answers again. The kernel
/// reports a writeback error once per open file, so a second `fdatasync`
/// through the same descriptor could return 0 for pages that were lost
/// (review finding 6; PostgreSQL made the same rule in 2018).
#[tokio::test]
async fn a_failed_sync_fails_every_later_sync_of_the_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let faults = StorageFaults::default();
    let store = LogStore::with_faults(
        open_db(dir.path()).expect("open"),
        dir.path(),
        faults.clone(),
    )
    .expect("log");
    store.flush().await.expect("a healthy disk syncs");
    assert_eq!(store.failed_sync(), None);
    faults.fail_syncs();
    let first = store.flush().await.expect_err("the disk fails");
    assert_eq!(first.raw_os_error(), Some(5), "{first}");
    // Reported to the node's liveness owner, which stops the process.
    let reported = store.failed_sync().expect("the failed sync is reported");
    assert!(reported.contains("os error 5"), "{reported}");
    // The disk answers again, as one whose error was reported once does.
    faults.heal();
    for (i, again) in [store.flush().await, store.flush().await]
        .into_iter()
        .enumerate()
    {
        let err = again.expect_err("a sync after a failed one must fail too");
        assert!(
            err.to_string().contains("an earlier sync"),
            "sync {i}: {err}"
        );
    }
    // The sync thread's appends fail the same way (they share the store).
    // A store opened afresh on the directory (a restarted node) syncs.
    drop(store);
    let reopened = LogStore::new(open_db(dir.path()).expect("reopen"), dir.path()).expect("log");
    reopened.flush().await.expect("a new store starts clean");
    assert_eq!(reopened.failed_sync(), None);
}
