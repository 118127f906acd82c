//! A log store in memory over a simulated disk, for deterministic
//! simulation (`jepsen/sim`): no threads, no files, time from tokio.
//!
//! The disk ([`MemDisk`]) keeps what a real one does after a crash: every
//! write is *pending* until a sync makes it, and everything written before
//! it, *durable*. [`MemDisk::crash`] keeps the durable image plus a prefix
//! of the pending writes of the caller's choosing (the kernel may have
//! written back some of them on its own, in order) and drops the rest, as a
//! power loss does. A sync error sticks: once one sync has failed, every
//! later one fails too (as sled's store does; see `log_store`). A full
//! disk ([`MemDisk::fill`]) refuses writes with `ENOSPC` and changes
//! nothing, until [`MemDisk::heal`]: space comes back, and the next process
//! (or the same, if nothing stopped it) writes again; one that says so only
//! at the sync ([`MemDisk::fill_at_sync`]) fails the sync, and that error
//! sticks as any other. The disk also holds the node's snapshot file,
//! replaced whole or not at all, which a simulator may tear or corrupt
//! while the node is down ([`MemDisk::tear_snapshot_file`],
//! [`MemDisk::corrupt_snapshot_file`]): the checksum must refuse it.
//!
//! The store over it acknowledges an append only after a sync that covers
//! it (one task takes every append queued meanwhile, waits the disk's sync
//! latency, syncs once and acknowledges them), exactly as the sled store's
//! sync thread does; votes, truncations and purges sync before they
//! return. Real nodes keep sled (`raft::log_store`).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::{LogState, OptionalSend, RaftLogReader};
use serde::de::DeserializeOwned;

use super::{Entry, LogId, NodeId, TypeConfig, Vote};
use crate::codec::{decode_stored as decode, to_vec as encode};

const KEY_VOTE: &str = "vote";
const KEY_COMMITTED: &str = "committed";
const KEY_LAST_PURGED: &str = "last_purged";
const KEY_NODE_ID: &str = "node_id";
const KEY_CLUSTER_ID: &str = "cluster_id";

/// One write to the disk; each is atomic (as one sled batch is).
#[derive(Clone, Debug)]
enum Write {
    /// Entries in, by index.
    Log(Vec<(u64, Vec<u8>)>),
    /// Entries at `from..=to` out.
    Remove { from: u64, to: u64 },
    /// A meta key set.
    Meta(&'static str, Vec<u8>),
}

/// What the disk holds: the log by index and the meta keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Image {
    log: BTreeMap<u64, Vec<u8>>,
    meta: BTreeMap<&'static str, Vec<u8>>,
}

impl Image {
    fn apply(&mut self, write: &Write) {
        match write {
            Write::Log(entries) => {
                for (index, bytes) in entries {
                    self.log.insert(*index, bytes.clone());
                }
            }
            Write::Remove { from, to } => {
                let doomed: Vec<u64> = self.log.range(*from..=*to).map(|(i, _)| *i).collect();
                for i in doomed {
                    self.log.remove(&i);
                }
            }
            Write::Meta(key, value) => {
                self.meta.insert(key, value.clone());
            }
        }
    }
}

#[derive(Debug, Default)]
struct DiskState {
    /// What survives a crash.
    durable: Image,
    /// Written since the last sync, oldest first.
    pending: Vec<Write>,
    /// `durable` with `pending` applied: what reads see.
    live: Image,
    /// The first sync error (sticky).
    failed: Option<String>,
    /// Every sync fails from now on (a dying disk).
    fail_syncs: bool,
    /// Every write fails with `ENOSPC` (a full disk).
    full: bool,
    /// How long a sync takes.
    sync_latency: Duration,
    /// Syncs report success and make nothing durable (a broken disk).
    lying: bool,
    /// Writes succeed and every sync fails with `ENOSPC` (a full disk that
    /// says so only at the sync, as thin-provisioned volumes and
    /// delayed-allocation file systems do).
    full_at_sync: bool,
    /// The snapshot file (replaced whole; see
    /// [`MemDisk::replace_snapshot_file`]).
    snapshot: Option<Vec<u8>>,
}

/// A simulated disk holding one node's log. Clones share it; it outlives
/// the node's process (a restarted node opens the same disk).
#[derive(Clone, Debug, Default)]
pub struct MemDisk(Arc<Mutex<DiskState>>);

impl MemDisk {
    /// An empty disk whose syncs take no time.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, DiskState> {
        self.0.lock().expect("disk lock poisoned")
    }

    /// Syncs take `latency` from now on.
    pub fn set_sync_latency(&self, latency: Duration) {
        self.state().sync_latency = latency;
    }

    /// From now on every sync fails with `EIO` (and so does every later
    /// one, even after [`heal`](Self::heal), until a crash: the error is
    /// sticky for the store that saw it).
    pub fn fail_syncs(&self) {
        self.state().fail_syncs = true;
    }

    /// From now on every write fails with `ENOSPC` and changes nothing,
    /// until [`heal`](Self::heal). Syncs still work (of what was written).
    pub fn fill(&self) {
        self.state().full = true;
    }

    /// From now on writes succeed and every sync fails with `ENOSPC`, until
    /// [`heal`](Self::heal); like any failed sync, the error sticks for the
    /// store that saw it (the kernel may have dropped the unsynced pages).
    pub fn fill_at_sync(&self) {
        self.state().full_at_sync = true;
    }

    /// Syncs may succeed again (for the store opened after the next crash)
    /// and writes find space again.
    pub fn heal(&self) {
        let mut s = self.state();
        s.fail_syncs = false;
        s.full = false;
        s.full_at_sync = false;
    }

    /// The snapshot file's bytes, if there is one.
    pub fn snapshot_file(&self) -> Option<Vec<u8>> {
        self.state().snapshot.clone()
    }

    /// Replaces the snapshot file as a real node does (temporary file,
    /// syncs, rename, sync of the directory): after the disk's sync
    /// latency, the new file whole, or, on an error (`ENOSPC` from a full
    /// disk at the write or the sync, `EIO` from a dying one) or a crash
    /// meanwhile, the old one as it was. A lying disk's syncs do not
    /// reach this file: only the log's do.
    pub async fn replace_snapshot_file(&self, bytes: &[u8]) -> io::Result<()> {
        if self.state().full {
            return Err(io::Error::from_raw_os_error(28));
        }
        let latency = self.state().sync_latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let mut s = self.state();
        if s.full_at_sync {
            return Err(io::Error::from_raw_os_error(28));
        }
        if s.fail_syncs {
            return Err(io::Error::from_raw_os_error(5));
        }
        s.snapshot = Some(bytes.to_vec());
        Ok(())
    }

    /// Keeps only the first `keep` bytes of the snapshot file (a torn
    /// write: the disk lost its tail). False if there is no file, or it is
    /// no longer than `keep`.
    pub fn tear_snapshot_file(&self, keep: usize) -> bool {
        match &mut self.state().snapshot {
            Some(bytes) if bytes.len() > keep => {
                bytes.truncate(keep);
                true
            }
            _ => false,
        }
    }

    /// Flips the bits `mask` of the snapshot file's byte `at` (rot at
    /// rest). False if there is no such byte or `mask` is 0.
    pub fn corrupt_snapshot_file(&self, at: usize, mask: u8) -> bool {
        match self.state().snapshot.as_mut().and_then(|b| b.get_mut(at)) {
            Some(byte) if mask != 0 => {
                *byte ^= mask;
                true
            }
            _ => false,
        }
    }

    /// The bytes of the entry at `index` as reads see them now (for a
    /// simulator's oracles: committed entries must never change).
    pub fn log_entry(&self, index: u64) -> Option<Vec<u8>> {
        self.state().live.log.get(&index).cloned()
    }

    /// From now on syncs report success without making anything durable:
    /// a disk that ignores flushes, or a store that never syncs (the
    /// defect raftlock had in November). For showing that a simulator's
    /// crashes and oracles catch lost acknowledged writes.
    pub fn lie_about_syncs(&self) {
        self.state().lying = true;
    }

    /// The first failed sync's error since the last crash, if one has
    /// failed.
    pub fn failed_sync(&self) -> Option<String> {
        self.state().failed.clone()
    }

    /// Writes not yet synced.
    pub fn pending_writes(&self) -> usize {
        self.state().pending.len()
    }

    /// A power loss: the durable image plus the first `keep` pending writes
    /// (at most all of them) survive; the rest are gone. A sticky sync
    /// error is forgotten (a new process opens the disk).
    pub fn crash(&self, keep: usize) {
        let mut s = self.state();
        let pending = std::mem::take(&mut s.pending);
        for write in pending.iter().take(keep) {
            s.durable.apply(write);
        }
        s.live = s.durable.clone();
        s.failed = None;
    }

    fn write(&self, write: Write) -> io::Result<()> {
        let mut s = self.state();
        if s.full {
            return Err(io::Error::from_raw_os_error(28));
        }
        s.live.apply(&write);
        s.pending.push(write);
        Ok(())
    }

    /// Waits the sync latency, then makes every write so far durable.
    async fn sync(&self) -> io::Result<()> {
        let latency = self.state().sync_latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let mut s = self.state();
        if let Some(first) = &s.failed {
            return Err(io::Error::other(format!(
                "an earlier sync of the log failed ({first}); nothing written since can be \
                 trusted to reach the disk"
            )));
        }
        if s.fail_syncs || s.full_at_sync {
            let e = io::Error::from_raw_os_error(if s.fail_syncs { 5 } else { 28 });
            s.failed = Some(e.to_string());
            return Err(e);
        }
        if s.lying {
            return Ok(());
        }
        let pending = std::mem::take(&mut s.pending);
        for write in &pending {
            s.durable.apply(write);
        }
        Ok(())
    }

    fn meta<T: DeserializeOwned>(&self, key: &str) -> io::Result<Option<T>> {
        match self.state().live.meta.get(key) {
            None => Ok(None),
            Some(bytes) => decode(bytes).map(Some),
        }
    }
}

/// An append waiting for its sync.
type Waiting = IOFlushed<TypeConfig>;

/// The log store over a [`MemDisk`]. Cheap to clone: clones share the disk
/// and the sync task. Open it inside a tokio runtime (it starts its sync
/// task there).
#[derive(Clone)]
pub struct MemLogStore {
    disk: MemDisk,
    /// Where appends wait for the sync task.
    queue: tokio::sync::mpsc::UnboundedSender<Waiting>,
    /// What the snapshot covers (last index + 1), if purges must wait for
    /// it (as `LogStore::with_snapshot_floor`).
    snapshot_floor: Option<Arc<AtomicU64>>,
    /// The last commit index saved, for status.
    committed: Arc<AtomicU64>,
    /// The first index not purged (see [`MemLogStore::purged_marker`]).
    purged: Arc<AtomicU64>,
    /// Gone once every handle is (see [`MemLogStore::alive`]).
    alive: Arc<()>,
}

impl MemLogStore {
    /// The store over `disk`, with its sync task started.
    pub fn open(disk: MemDisk) -> io::Result<Self> {
        let (queue, mut waiting) = tokio::sync::mpsc::unbounded_channel::<Waiting>();
        let synced = disk.clone();
        tokio::spawn(async move {
            while let Some(first) = waiting.recv().await {
                let mut batch = vec![first];
                while let Ok(more) = waiting.try_recv() {
                    batch.push(more);
                }
                let result = synced.sync().await;
                for callback in batch {
                    callback.io_completed(match &result {
                        Ok(()) => Ok(()),
                        Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
                    });
                }
            }
        });
        let committed: Option<Option<LogId>> = disk.meta(KEY_COMMITTED)?;
        let purged: Option<LogId> = disk.meta(KEY_LAST_PURGED)?;
        Ok(MemLogStore {
            disk,
            queue,
            snapshot_floor: None,
            committed: Arc::new(AtomicU64::new(committed.flatten().map_or(0, |c| c.index))),
            purged: Arc::new(AtomicU64::new(purged.map_or(0, |p| p.index + 1))),
            alive: Arc::new(()),
        })
    }

    /// A shared view of the first index this store has not purged (0:
    /// nothing purged): set when a purge is recorded, before its entries
    /// go.
    pub fn purged_marker(&self) -> Arc<AtomicU64> {
        self.purged.clone()
    }

    /// Never purges entries the snapshot does not cover (`floor`: its last
    /// index + 1).
    pub fn with_snapshot_floor(mut self, floor: Arc<AtomicU64>) -> Self {
        self.snapshot_floor = Some(floor);
        self
    }

    /// A handle that is dropped with the last clone of this store.
    pub fn alive(&self) -> std::sync::Weak<()> {
        Arc::downgrade(&self.alive)
    }

    /// A shared view of the commit index this store has saved.
    pub fn committed_marker(&self) -> Arc<AtomicU64> {
        self.committed.clone()
    }

    /// As `LogStore::check_node_id`.
    pub async fn check_node_id(&self, id: NodeId) -> anyhow::Result<()> {
        match self.disk.meta::<NodeId>(KEY_NODE_ID)? {
            Some(own) if own == id => Ok(()),
            Some(own) => anyhow::bail!("this disk belongs to node {own}, not to node {id}"),
            None => {
                self.disk.write(Write::Meta(KEY_NODE_ID, encode(&id)))?;
                self.disk.sync().await?;
                Ok(())
            }
        }
    }

    /// The cluster this node belongs to, if known.
    pub fn cluster_id(&self) -> io::Result<Option<u64>> {
        self.disk.meta(KEY_CLUSTER_ID)
    }

    /// Records (durably) that this node belongs to cluster `id`.
    pub async fn set_cluster_id(&self, id: u64) -> io::Result<()> {
        self.disk.write(Write::Meta(KEY_CLUSTER_ID, encode(&id)))?;
        self.disk.sync().await
    }

    /// The first failed sync's error, once one has failed (see
    /// `LogStore::failed_sync`).
    pub fn failed_sync(&self) -> Option<String> {
        self.disk.failed_sync()
    }

    /// Its disk (a handle that does not keep the store open).
    pub fn disk(&self) -> MemDisk {
        self.disk.clone()
    }

    /// True if this node has never voted or logged.
    pub fn is_fresh(&self) -> bool {
        let s = self.disk.state();
        s.live.log.is_empty() && !s.live.meta.contains_key(KEY_VOTE)
    }

    fn entry_at(&self, index: u64) -> io::Result<Option<Entry>> {
        match self.disk.state().live.log.get(&index) {
            None => Ok(None),
            Some(bytes) => decode(bytes).map(Some),
        }
    }
}

impl RaftLogReader<TypeConfig> for MemLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let bounds = (range.start_bound().cloned(), range.end_bound().cloned());
        let s = self.disk.state();
        if matches!(bounds, (Bound::Included(a), Bound::Excluded(b)) if b <= a) {
            return Ok(Vec::new());
        }
        s.live.log.range(bounds).map(|(_, v)| decode(v)).collect()
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        self.disk.meta(KEY_VOTE)
    }
}

impl RaftLogStorage<TypeConfig> for MemLogStore {
    type LogReader = MemLogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let last_purged: Option<LogId> = self.disk.meta(KEY_LAST_PURGED)?;
        let last = self
            .disk
            .state()
            .live
            .log
            .last_key_value()
            .map(|(_, v)| v.clone());
        let last_log_id = match last {
            Some(v) => Some(decode::<Entry>(&v)?.log_id),
            None => last_purged,
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        self.disk.write(Write::Meta(KEY_VOTE, encode(vote)))?;
        self.disk.sync().await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        // Not synced on its own, as in the sled store.
        self.disk
            .write(Write::Meta(KEY_COMMITTED, encode(&committed)))?;
        self.committed
            .store(committed.map_or(0, |c| c.index), Ordering::Relaxed);
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        let committed = self.disk.meta::<Option<LogId>>(KEY_COMMITTED)?.flatten();
        // Never past the log's end (see the sled store's).
        let last = self.get_log_state().await?.last_log_id;
        Ok(match (committed, last) {
            (Some(c), Some(l)) if c.index > l.index => Some(l),
            (Some(_), None) => None,
            (c, _) => c,
        })
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let encoded: Vec<(u64, Vec<u8>)> = entries
            .into_iter()
            .map(|entry| (entry.log_id.index, encode(&entry)))
            .collect();
        if encoded.is_empty() {
            callback.io_completed(Ok(()));
            return Ok(());
        }
        self.disk.write(Write::Log(encoded))?;
        self.queue
            .send(callback)
            .map_err(|_| io::Error::other("the log's sync task stopped"))
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let from = last_log_id.map_or(0, |l| l.index + 1);
        self.disk.write(Write::Remove { from, to: u64::MAX })?;
        self.disk.sync().await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        // Only what the snapshot covers, as the sled store.
        let log_id = match &self.snapshot_floor {
            None => log_id,
            Some(floor) => {
                let covered = floor.load(Ordering::SeqCst);
                if log_id.index < covered {
                    log_id
                } else {
                    let Some(upto) = covered.checked_sub(1) else {
                        return Ok(());
                    };
                    match self.entry_at(upto)? {
                        Some(entry) => entry.log_id,
                        None => return Ok(()),
                    }
                }
            }
        };
        self.disk
            .write(Write::Meta(KEY_LAST_PURGED, encode(&log_id)))?;
        self.purged.fetch_max(log_id.index + 1, Ordering::SeqCst);
        self.disk.sync().await?;
        self.disk.write(Write::Remove {
            from: 0,
            to: log_id.index,
        })?;
        self.disk.sync().await
    }
}

#[cfg(test)]
mod tests {
    use openraft::type_config::TypeConfigExt as _;

    use super::*;
    use crate::raft::{log_id, EntryPayload};

    struct SuiteBuilder;

    impl
        openraft::testing::log::StoreBuilder<
            TypeConfig,
            MemLogStore,
            crate::apply::state_machine::StateMachineStore,
            (),
        > for SuiteBuilder
    {
        async fn build(
            &self,
        ) -> Result<
            (
                (),
                MemLogStore,
                crate::apply::state_machine::StateMachineStore,
            ),
            openraft::StorageError<TypeConfig>,
        > {
            let disk = MemDisk::new();
            let log = MemLogStore::open(disk.clone()).expect("open");
            let sm = crate::apply::state_machine::StateMachineStore::open(
                crate::apply::Shared::new_for_tests(),
                crate::apply::snapshot_location::SnapshotLocation::Simulated(disk),
            )
            .expect("state machine");
            Ok(((), log, sm))
        }
    }

    /// openraft's conformance suite for storage, as the sled store runs it:
    /// the simulator's log store keeps the same contract.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn openraft_storage_suite() {
        openraft::testing::log::Suite::test_all(SuiteBuilder)
            .await
            .expect("suite passes");
    }

    fn blank(index: u64) -> Entry {
        Entry {
            log_id: log_id(1, 1, index),
            payload: EntryPayload::Blank,
        }
    }

    async fn append(store: &mut MemLogStore, indexes: std::ops::RangeInclusive<u64>) {
        let (callback, rx) = {
            let (tx, rx) = TypeConfig::oneshot();
            (IOFlushed::<TypeConfig>::signal(tx), rx)
        };
        store
            .append(indexes.map(blank), callback)
            .await
            .expect("append");
        rx.await.expect("callback").expect("synced");
    }

    async fn last_index(store: &mut MemLogStore) -> Option<u64> {
        store
            .get_log_state()
            .await
            .expect("state")
            .last_log_id
            .map(|l| l.index)
    }

    /// An acknowledged append survives any crash; writes after the last
    /// sync survive only as the prefix the crash keeps, in order.
    #[tokio::test]
    async fn a_crash_keeps_synced_writes_and_a_prefix_of_the_rest() {
        let disk = MemDisk::new();
        let mut store = MemLogStore::open(disk.clone()).expect("open");
        append(&mut store, 1..=3).await;
        store
            .save_committed(Some(log_id(1, 1, 3)))
            .await
            .expect("commit");
        assert_eq!(disk.pending_writes(), 1, "the commit marker waits");
        // Two more writes, never synced: a commit marker and a vote-less
        // log write straight onto the disk.
        disk.write(Write::Log(vec![(4, encode(&blank(4)))]))
            .expect("room");
        disk.write(Write::Log(vec![(5, encode(&blank(5)))]))
            .expect("room");
        disk.crash(2);
        let mut store = MemLogStore::open(disk.clone()).expect("reopen");
        assert_eq!(
            last_index(&mut store).await,
            Some(4),
            "marker and 4 kept, 5 lost"
        );
        assert_eq!(store.committed_marker().load(Ordering::SeqCst), 3);
        disk.crash(0);
        let mut store = MemLogStore::open(disk.clone()).expect("reopen");
        assert_eq!(
            last_index(&mut store).await,
            Some(4),
            "nothing pending: no loss"
        );
        disk.write(Write::Log(vec![(5, encode(&blank(5)))]))
            .expect("room");
        disk.crash(0);
        let mut store = MemLogStore::open(disk).expect("reopen");
        assert_eq!(last_index(&mut store).await, Some(4));
    }

    /// openraft#2118: in 0.10.0-alpha.37 `become_leader` (a leader
    /// restored at start-up, or a follower handed a committed vote naming
    /// itself by a leadership transfer) counts the log up to its last
    /// entry as flushed once the vote it has just saved is flushed, without
    /// waiting for earlier appends' callbacks. That is safe only if saving
    /// a vote makes every earlier write durable, which is what this pins:
    /// the store's half of the argument (openraft submits storage calls in
    /// order, so those appends reached the store before the vote). An
    /// append whose callback has not come when a vote is saved survives a
    /// crash right after it.
    #[tokio::test(start_paused = true)]
    async fn a_saved_vote_makes_the_appends_before_it_durable() {
        let disk = MemDisk::new();
        disk.set_sync_latency(Duration::from_millis(50));
        let mut store = MemLogStore::open(disk.clone()).expect("open");
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
        let mut store = MemLogStore::open(disk).expect("reopen");
        assert_eq!(last_index(&mut store).await, Some(3));
    }

    /// The first failed sync is reported by `failed_sync`, whichever write
    /// it was for (here the cluster id's, outside openraft's writes): the
    /// node's owner of liveness stops the process on it.
    #[tokio::test]
    async fn a_failed_sync_of_any_write_is_reported() {
        let disk = MemDisk::new();
        let store = MemLogStore::open(disk.clone()).expect("open");
        assert_eq!(store.failed_sync(), None);
        store.set_cluster_id(7).await.expect("recorded");
        assert_eq!(store.failed_sync(), None);
        disk.fill_at_sync();
        assert!(store.set_cluster_id(8).await.is_err());
        let first = store.failed_sync().expect("the failed sync is reported");
        assert!(first.contains("os error 28"), "{first}");
        // Space back: the error still sticks for this process.
        disk.heal();
        assert!(store.set_cluster_id(9).await.is_err());
        assert_eq!(store.failed_sync(), Some(first));
    }

    /// A failed sync fails the append's callback and every sync after it,
    /// even once the disk is healed; a crash (a new process) clears it.
    #[tokio::test]
    async fn a_sync_error_sticks() {
        let disk = MemDisk::new();
        let mut store = MemLogStore::open(disk.clone()).expect("open");
        disk.fail_syncs();
        let (tx, rx) = TypeConfig::oneshot();
        store
            .append([blank(1)], IOFlushed::<TypeConfig>::signal(tx))
            .await
            .expect("queued");
        assert!(rx.await.expect("callback").is_err());
        disk.heal();
        let vote = Vote::new(1, 1);
        assert!(store.save_vote(&vote).await.is_err(), "sticky");
        disk.crash(0);
        let mut store = MemLogStore::open(disk).expect("reopen");
        assert_eq!(
            last_index(&mut store).await,
            None,
            "the unsynced append is gone"
        );
        store
            .save_vote(&vote)
            .await
            .expect("a new process syncs again");
        assert_eq!(store.read_vote().await.expect("vote"), Some(vote));
    }

    /// A full disk refuses every write with ENOSPC and changes nothing;
    /// once healed, the same store writes again.
    #[tokio::test]
    async fn a_full_disk_refuses_writes_and_changes_nothing() {
        let disk = MemDisk::new();
        let mut store = MemLogStore::open(disk.clone()).expect("open");
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

    /// A disk that runs out of space only at the sync: the writes go in,
    /// the sync fails with ENOSPC, and, as any failed sync, the error
    /// sticks for this store even once space is back; a crash keeps a
    /// prefix of the unsynced writes, as ever.
    #[tokio::test]
    async fn a_full_disk_at_the_sync_fails_the_sync_and_sticks() {
        let disk = MemDisk::new();
        let mut store = MemLogStore::open(disk.clone()).expect("open");
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
        let mut store = MemLogStore::open(disk).expect("reopen");
        assert_eq!(last_index(&mut store).await, Some(2));
        append(&mut store, 3..=3).await;
    }

    /// A lying disk acknowledges syncs and keeps nothing: a crash then
    /// loses acknowledged writes.
    #[tokio::test]
    async fn a_lying_disk_loses_acknowledged_writes() {
        let disk = MemDisk::new();
        disk.lie_about_syncs();
        let mut store = MemLogStore::open(disk.clone()).expect("open");
        append(&mut store, 1..=3).await;
        store
            .save_vote(&Vote::new(2, 1))
            .await
            .expect("acknowledged");
        disk.crash(0);
        let mut store = MemLogStore::open(disk).expect("reopen");
        assert_eq!(last_index(&mut store).await, None);
        assert_eq!(store.read_vote().await.expect("vote"), None);
    }

    /// Appends are acknowledged only after the sync latency (simulated
    /// time), and a truncation or purge removes what it names.
    #[tokio::test(start_paused = true)]
    async fn appends_wait_for_the_sync_and_reads_follow_writes() {
        let disk = MemDisk::new();
        disk.set_sync_latency(Duration::from_millis(7));
        let mut store = MemLogStore::open(disk.clone()).expect("open");
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
        assert_eq!(
            entries.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
            vec![3]
        );
        let state = store.get_log_state().await.expect("state");
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 2)));
        assert_eq!(disk.pending_writes(), 0);
    }
}
