//! The store's rules, on both disks: openraft's conformance suite, purges
//! behind the snapshot, replication reads, the vote's sync of everything,
//! sticky sync errors; and, on the simulated disk, what crashes keep.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::type_config::TypeConfigExt as _;
use openraft::{RaftLogReader, StorageError};

use super::*;
use crate::apply::snapshot_location::SnapshotLocation;
use crate::apply::state_machine::StateMachineStore;
use crate::raft::{log_id, EntryPayload};

/// Where a test's store keeps its bytes: sled in a temporary directory,
/// or a simulated disk. Either opens the store again on the same bytes.
enum Place {
    Sled(tempfile::TempDir),
    Memory(MemDisk),
}

impl Place {
    fn both() -> [Place; 2] {
        [
            Place::Sled(tempfile::tempdir().expect("tempdir")),
            Place::Memory(MemDisk::new()),
        ]
    }

    /// A store on this place (for sled, once the last one is dropped).
    fn open(&self) -> LogStore {
        match self {
            Place::Sled(dir) => {
                LogStore::new(open_db(dir.path()).expect("open"), dir.path()).expect("log")
            }
            Place::Memory(disk) => LogStore::in_memory(disk.clone()).expect("open"),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Place::Sled(_) => "sled",
            Place::Memory(_) => "memory",
        }
    }
}

struct Builder(fn() -> Place);

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, Place> for Builder {
    async fn build(
        &self,
    ) -> Result<(Place, LogStore, StateMachineStore), StorageError<TypeConfig>> {
        let place = (self.0)();
        let shared = crate::apply::Shared::new_for_tests();
        let (log, sm) = match &place {
            Place::Sled(dir) => {
                let db = open_db(dir.path()).expect("open");
                let log = LogStore::new(db.clone(), dir.path()).expect("log");
                (log, StateMachineStore::new(db, shared))
            }
            Place::Memory(disk) => (
                place.open(),
                StateMachineStore::open(shared, SnapshotLocation::Simulated(disk.clone())),
            ),
        };
        let sm = sm.expect("state machine");
        Ok((place, log, sm))
    }
}

/// openraft's own conformance suite for storage, on the store over sled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_on_sled() {
    let sled = || Place::Sled(tempfile::tempdir().expect("tempdir"));
    Suite::test_all(Builder(sled)).await.expect("suite passes");
}

/// The same suite on the store over the simulated disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_on_memory() {
    let memory = || Place::Memory(MemDisk::new());
    Suite::test_all(Builder(memory))
        .await
        .expect("suite passes");
}

pub(super) fn blank(index: u64) -> Entry {
    Entry {
        log_id: log_id(1, 1, index),
        payload: EntryPayload::Blank,
    }
}

fn indexes(entries: &[Entry]) -> Vec<u64> {
    entries.iter().map(|e| e.log_id.index).collect()
}

/// Appends `indexes` and waits for their callback.
pub(super) async fn append(store: &mut LogStore, indexes: std::ops::RangeInclusive<u64>) {
    let (tx, rx) = TypeConfig::oneshot();
    store
        .append(indexes.map(blank), IOFlushed::<TypeConfig>::signal(tx))
        .await
        .expect("append");
    rx.await.expect("callback").expect("synced");
}

async fn last_index(store: &mut LogStore) -> Option<u64> {
    store
        .get_log_state()
        .await
        .expect("state")
        .last_log_id
        .map(|l| l.index)
}

/// Review finding 7a: openraft purged up to an installed snapshot before
/// the snapshot was written. The store keeps what the snapshot on disk
/// does not cover, and at start-up never reports a commit index past its
/// last entry, so a crash in that window leaves a node that restarts from
/// its older snapshot and its own log.
#[tokio::test]
async fn a_purge_never_passes_the_snapshot_on_disk() {
    for place in Place::both() {
        let name = place.name();
        let floor = Arc::new(AtomicU64::new(0));
        let mut store = place.open().with_snapshot_floor(floor.clone());
        store.write_for_tests((1..=10).map(blank));
        let read = |entries: Vec<Entry>| indexes(&entries);
        // No snapshot on disk yet: a purge to 8 deletes nothing.
        store.purge(blank(8).log_id).await.expect("purge");
        assert_eq!(
            read(store.try_get_log_entries(0..=10).await.expect("read")),
            (1..=10).collect::<Vec<_>>(),
            "{name}"
        );
        // A snapshot covering 1..=5 is on disk: the purge stops there.
        floor.store(6, Ordering::SeqCst);
        store.purge(blank(8).log_id).await.expect("purge");
        assert_eq!(
            read(store.try_get_log_entries(0..=10).await.expect("read")),
            (6..=10).collect::<Vec<_>>(),
            "{name}"
        );
        let state = store.get_log_state().await.expect("state");
        assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(5), "{name}");
        assert_eq!(store.purged_marker().load(Ordering::SeqCst), 6, "{name}");
        // The commit index saved during the install may be the snapshot's,
        // past this node's log: start-up replays only what is there.
        store
            .save_committed(Some(blank(12).log_id))
            .await
            .expect("save");
        store.flush().await.expect("sync");
        drop(store);
        let mut reopened = place.open().with_snapshot_floor(floor.clone());
        assert_eq!(
            reopened
                .read_committed()
                .await
                .expect("committed")
                .map(|l| l.index),
            Some(10),
            "{name}"
        );
        assert_eq!(reopened.purged_marker().load(Ordering::SeqCst), 6, "{name}");
        // Once the newer snapshot is on disk the rest goes.
        floor.store(9, Ordering::SeqCst);
        reopened.purge(blank(8).log_id).await.expect("purge");
        assert_eq!(
            read(reopened.try_get_log_entries(0..=10).await.expect("read")),
            vec![9, 10],
            "{name}"
        );
    }
}

/// A replication read never sends entries that do not follow its start:
/// with the log purged past a stale stream's start (openraft
/// 0.10.0-alpha.37, the simulator's seed 713724 on 4d345ff) it gives
/// nothing, where the range read gives what is left, as openraft's
/// contract for it says.
#[tokio::test]
async fn a_replication_read_gives_nothing_from_a_purged_start() {
    for place in Place::both() {
        let name = place.name();
        let mut log = place.open();
        append(&mut log, 1..=5).await;
        log.purge(log_id(1, 1, 2)).await.expect("purge");
        assert_eq!(log.purged_marker().load(Ordering::SeqCst), 3, "{name}");
        let read = log.limited_get_log_entries(3, 6).await.expect("read");
        assert_eq!(indexes(&read), vec![3, 4, 5], "{name}");
        let read = log.limited_get_log_entries(2, 6).await.expect("read");
        assert_eq!(
            indexes(&read),
            Vec::<u64>::new(),
            "{name}: the head is purged"
        );
        let read = log.try_get_log_entries(2..6).await.expect("read");
        assert_eq!(
            indexes(&read),
            vec![3, 4, 5],
            "{name}: a range read keeps openraft's contract"
        );
        let empty = log.try_get_log_entries(4..4).await.expect("read");
        assert!(empty.is_empty(), "{name}");
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = log.try_get_log_entries(5..2).await.expect("read");
        assert!(reversed.is_empty(), "{name}");
    }
}

/// The replication read stops at a missing index (a purge that a range
/// scan overtook).
#[test]
fn from_start_stops_at_the_first_missing_index() {
    let at = blank;
    assert_eq!(
        indexes(&from_start(4, vec![at(4), at(5), at(7)])),
        vec![4, 5]
    );
    assert_eq!(
        indexes(&from_start(4, vec![at(5), at(6)])),
        Vec::<u64>::new()
    );
    assert_eq!(indexes(&from_start(4, vec![])), Vec::<u64>::new());
}

/// The node and cluster ids: recorded once, another node's id refused,
/// and a fresh store is one with no vote and no entry.
#[tokio::test]
async fn ids_are_bound_and_freshness_is_vote_or_log() {
    for place in Place::both() {
        let name = place.name();
        let mut store = place.open();
        assert!(store.is_fresh(), "{name}");
        store.check_node_id(3).await.expect("recorded");
        store.check_node_id(3).await.expect("the same id");
        let err = store.check_node_id(4).await.expect_err("another node's");
        assert!(
            err.to_string().contains("belongs to node 3, not to node 4"),
            "{name}: {err}"
        );
        assert_eq!(store.cluster_id().expect("read"), None, "{name}");
        store.set_cluster_id(77).await.expect("recorded");
        assert!(store.is_fresh(), "{name}: ids are not a vote or an entry");
        store.save_vote(&Vote::new(1, 3)).await.expect("vote");
        assert!(!store.is_fresh(), "{name}");
        drop(store);
        let store = place.open();
        assert_eq!(store.cluster_id().expect("read"), Some(77), "{name}");
        assert!(!store.is_fresh(), "{name}");
    }
}

/// An acknowledged append survives any crash; writes after the last sync
/// survive only as the prefix the crash keeps, in order.
#[tokio::test]
async fn a_crash_keeps_synced_writes_and_a_prefix_of_the_rest() {
    let disk = MemDisk::new();
    let mut store = LogStore::in_memory(disk.clone()).expect("open");
    append(&mut store, 1..=3).await;
    store
        .save_committed(Some(log_id(1, 1, 3)))
        .await
        .expect("commit");
    assert_eq!(disk.pending_writes(), 1, "the commit marker waits");
    // Two more writes, never synced.
    store.write_for_tests([blank(4)]);
    store.write_for_tests([blank(5)]);
    disk.crash(2);
    let mut store = LogStore::in_memory(disk.clone()).expect("reopen");
    assert_eq!(
        last_index(&mut store).await,
        Some(4),
        "marker and 4 kept, 5 lost"
    );
    assert_eq!(store.committed_marker().load(Ordering::SeqCst), 3);
    disk.crash(0);
    let mut store = LogStore::in_memory(disk.clone()).expect("reopen");
    assert_eq!(
        last_index(&mut store).await,
        Some(4),
        "nothing pending: no loss"
    );
    store.write_for_tests([blank(5)]);
    disk.crash(0);
    let mut store = LogStore::in_memory(disk).expect("reopen");
    assert_eq!(last_index(&mut store).await, Some(4));
}

/// openraft#2118: in 0.10.0-alpha.37 `become_leader` (a leader restored at
/// start-up, or a follower handed a committed vote naming itself by a
/// leadership transfer) counts the log up to its last entry as flushed
/// once the vote it has just saved is flushed, without waiting for earlier
/// appends' callbacks. That is safe only if saving a vote makes every
/// earlier write durable, which is what this pins: the store's half of the
/// argument (openraft submits storage calls in order, so those appends
/// reached the store before the vote). An append whose callback has not
/// come when a vote is saved survives a crash right after it. The store
/// is production's: sled's disk keeps the same rule with a flush of the
/// whole database (the vote's sync and the appends' go through one
/// `DurableFiles::durable`).
#[tokio::test(start_paused = true)]
async fn a_saved_vote_makes_the_appends_before_it_durable() {
    let disk = MemDisk::new();
    disk.set_sync_latency(Duration::from_millis(50));
    let mut store = LogStore::in_memory(disk.clone()).expect("open");
    let (tx, mut flushed) = TypeConfig::oneshot();
    store
        .append((1..=3).map(blank), IOFlushed::<TypeConfig>::signal(tx))
        .await
        .expect("append");
    assert_eq!(disk.pending_writes(), 1, "the append waits for its sync");
    store.save_vote(&Vote::new(2, 1)).await.expect("vote");
    assert!(
        flushed.try_recv().is_err(),
        "the append's own sync has not called back: the vote's made it durable"
    );
    disk.crash(0);
    let mut store = LogStore::in_memory(disk).expect("reopen");
    assert_eq!(last_index(&mut store).await, Some(3));
}

/// The first failed sync is reported by `failed_sync` and `sync_failure`,
/// whichever write it was for (here the cluster id's, outside openraft's
/// writes): the node's owner of liveness stops the process on it.
#[tokio::test]
async fn a_failed_sync_of_any_write_is_reported() {
    let disk = MemDisk::new();
    let store = LogStore::in_memory(disk.clone()).expect("open");
    let watcher = store.sync_failure();
    assert_eq!(store.failed_sync(), None);
    store.set_cluster_id(7).await.expect("recorded");
    assert_eq!(store.failed_sync(), None);
    disk.fill_at_sync();
    assert!(store.set_cluster_id(8).await.is_err());
    let first = store.failed_sync().expect("the failed sync is reported");
    assert!(first.contains("os error 28"), "{first}");
    assert_eq!(watcher.get(), Some(first.clone()));
    // Space back: the error still sticks for this process.
    disk.heal();
    assert!(store.set_cluster_id(9).await.is_err());
    assert_eq!(store.failed_sync(), Some(first));
}

/// A failed sync fails the append's callback and every sync after it, even
/// once the disk is healed; a crash (a new process) clears it.
#[tokio::test]
async fn a_sync_error_sticks() {
    let disk = MemDisk::new();
    let mut store = LogStore::in_memory(disk.clone()).expect("open");
    disk.fail_syncs();
    let (tx, rx) = TypeConfig::oneshot();
    store
        .append([blank(1)], IOFlushed::<TypeConfig>::signal(tx))
        .await
        .expect("queued");
    assert!(rx.await.expect("callback").is_err());
    assert!(
        store.failed_sync().is_some(),
        "the syncer's failure is reported"
    );
    disk.heal();
    let vote = Vote::new(1, 1);
    assert!(store.save_vote(&vote).await.is_err(), "sticky");
    disk.crash(0);
    let mut store = LogStore::in_memory(disk).expect("reopen");
    assert_eq!(
        last_index(&mut store).await,
        None,
        "the unsynced append is gone"
    );
    assert_eq!(store.failed_sync(), None);
    store
        .save_vote(&vote)
        .await
        .expect("a new process syncs again");
    assert_eq!(store.read_vote().await.expect("vote"), Some(vote));
}

/// A full disk refuses every write with ENOSPC and changes nothing; once
/// healed, the same store writes again.
#[tokio::test]
async fn a_full_disk_refuses_writes_and_changes_nothing() {
    let disk = MemDisk::new();
    let mut store = LogStore::in_memory(disk.clone()).expect("open");
    append(&mut store, 1..=2).await;
    disk.fill();
    let (tx, _rx) = TypeConfig::oneshot();
    let refused = store
        .append([blank(3)], IOFlushed::<TypeConfig>::signal(tx))
        .await
        .expect_err("no room");
    assert_eq!(refused.raw_os_error(), Some(28));
    let vote = Vote::new(1, 1);
    assert_eq!(
        store
            .save_vote(&vote)
            .await
            .expect_err("no room")
            .raw_os_error(),
        Some(28)
    );
    assert!(store.save_committed(Some(log_id(1, 1, 2))).await.is_err());
    assert!(store.truncate_after(None).await.is_err());
    assert_eq!(disk.pending_writes(), 0, "nothing was written");
    assert_eq!(last_index(&mut store).await, Some(2));
    assert_eq!(store.read_vote().await.expect("vote"), None);
    disk.heal();
    append(&mut store, 3..=3).await;
    store.save_vote(&vote).await.expect("room again");
    assert_eq!(last_index(&mut store).await, Some(3));
}

/// A disk that runs out of space only at the sync: the writes go in, the
/// sync fails with ENOSPC, and, as any failed sync, the error sticks for
/// this store even once space is back; a crash keeps a prefix of the
/// unsynced writes, as ever.
#[tokio::test]
async fn a_full_disk_at_the_sync_fails_the_sync_and_sticks() {
    let disk = MemDisk::new();
    let mut store = LogStore::in_memory(disk.clone()).expect("open");
    append(&mut store, 1..=2).await;
    disk.fill_at_sync();
    let (tx, rx) = TypeConfig::oneshot();
    store
        .append([blank(3)], IOFlushed::<TypeConfig>::signal(tx))
        .await
        .expect("the write goes in");
    let err = rx.await.expect("callback").expect_err("the sync fails");
    assert!(err.to_string().contains("No space left"), "{err}");
    assert_eq!(disk.pending_writes(), 1);
    disk.heal();
    assert!(store.save_vote(&Vote::new(1, 1)).await.is_err(), "sticky");
    disk.crash(0);
    let mut store = LogStore::in_memory(disk).expect("reopen");
    assert_eq!(last_index(&mut store).await, Some(2));
    append(&mut store, 3..=3).await;
}

/// A lying disk acknowledges syncs and keeps nothing: a crash then loses
/// acknowledged writes.
#[tokio::test]
async fn a_lying_disk_loses_acknowledged_writes() {
    let disk = MemDisk::new();
    disk.lie_about_syncs();
    let mut store = LogStore::in_memory(disk.clone()).expect("open");
    append(&mut store, 1..=3).await;
    store
        .save_vote(&Vote::new(2, 1))
        .await
        .expect("acknowledged");
    disk.crash(0);
    let mut store = LogStore::in_memory(disk).expect("reopen");
    assert_eq!(last_index(&mut store).await, None);
    assert_eq!(store.read_vote().await.expect("vote"), None);
}

/// Appends are acknowledged only after the sync latency (simulated time),
/// and a truncation or purge removes what it names.
#[tokio::test(start_paused = true)]
async fn appends_wait_for_the_sync_and_reads_follow_writes() {
    let disk = MemDisk::new();
    disk.set_sync_latency(Duration::from_millis(7));
    let mut store = LogStore::in_memory(disk.clone()).expect("open");
    let start = tokio::time::Instant::now();
    append(&mut store, 1..=5).await;
    assert_eq!(start.elapsed(), Duration::from_millis(7));
    store
        .truncate_after(Some(log_id(1, 1, 3)))
        .await
        .expect("truncate");
    assert_eq!(last_index(&mut store).await, Some(3));
    store.purge(log_id(1, 1, 2)).await.expect("purge");
    let entries = store.try_get_log_entries(0..10).await.expect("read");
    assert_eq!(indexes(&entries), vec![3]);
    let state = store.get_log_state().await.expect("state");
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 2)));
    assert_eq!(disk.pending_writes(), 0);
}
