//! The Raft log store: the storage rules written once, over a [`Disk`].
//!
//! [`LogStore`] is the one type openraft is given as its log storage. It
//! owns the rules: append (readable at once, acknowledged only once a
//! sync covers it), truncate, purge (never past the snapshot on disk, the
//! purge point recorded before the entries go), the vote (whose sync makes
//! every earlier write durable), the commit marker (clamped to the log's
//! end at start-up), the node and cluster ids. A [`Disk`] only keeps
//! bytes: atomic writes, reads, and syncs that make every earlier write
//! durable. Two disks implement it:
//!
//! * [`SledDisk`] (`sled_disk.rs`): every real node, sled in the data
//!   directory, made durable with real syncs;
//! * [`MemDisk`] (`mem_disk.rs`): the deterministic simulator's, in
//!   memory, which a simulated crash cuts back to what was synced.
//!
//! Both run openraft's conformance suite and the store's own tests
//! (`tests.rs`), so a rule is simulated exactly as production runs it.

mod mark;
#[cfg(test)]
mod mark_tests;
mod mem_disk;
mod sled_disk;
#[cfg(test)]
mod sled_tests;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::future::Future;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::{LogState, OptionalSend, RaftLogReader};
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use super::{Entry, LogId, NodeId, TypeConfig, Vote};
use crate::codec::{decode_stored as decode, to_vec as encode};
use crate::metrics::Metrics;

pub use mark::{Mark, MARK_FILE};
pub use mem_disk::MemDisk;
pub use sled_disk::{open_db, SledDisk, StorageFaults, DB_LOCK_WAIT};

const KEY_VOTE: &str = "vote";
const KEY_COMMITTED: &str = "committed";
const KEY_LAST_PURGED: &str = "last_purged";
const KEY_NODE_ID: &str = "node_id";
const KEY_CLUSTER_ID: &str = "cluster_id";
const KEY_HELD_DATA: &str = "held_data";

/// How many indexes the whole-log read at open takes at a time.
const READ_CHUNK: u64 = 1_024;

/// Where a node keeps its log (`NodeOptions::storage`).
#[derive(Clone, Debug, Default)]
pub enum Storage {
    /// sled in the data directory, made durable with real syncs.
    #[default]
    Sled,
    /// The simulated disk (for simulators: it survives the node's process,
    /// and loses what a crash takes). The snapshot file is kept on the same
    /// disk
    /// ([`SnapshotLocation::Simulated`](crate::apply::snapshot_location::SnapshotLocation::Simulated)).
    Memory(MemDisk),
}

/// One write to a disk. Each is atomic: after a crash all of it is there
/// or none of it, and writes survive in the order they were made.
#[derive(Clone, Debug)]
pub enum Write {
    /// Entries in, by index (encoded).
    Log(Vec<(u64, Vec<u8>)>),
    /// Entries out.
    Remove {
        /// The first index removed.
        from: u64,
        /// The last index removed (`u64::MAX`: every one from `from` on).
        to: u64,
    },
    /// A meta key set.
    Meta(&'static str, Vec<u8>),
}

/// A future a disk's sync returns.
pub type SyncFuture = Pin<Box<dyn Future<Output = io::Result<()>> + Send>>;

/// What a log store keeps its bytes on: the log by index and a few meta
/// keys. Reads see every write made so far; a crash keeps what a sync
/// covered (and possibly a prefix of the writes after it, in order).
pub trait Disk: Send + Sync + 'static {
    /// Makes one atomic write (readable at once, durable after a sync).
    fn write(&self, write: Write) -> io::Result<()>;
    /// Makes every write made before the call durable. Once one sync has
    /// failed, every later one of this process fails too (the kernel
    /// reports a lost writeback once: "fsyncgate"), and the first error is
    /// kept in [`first_failure`](Self::first_failure).
    fn sync(&self) -> SyncFuture;
    /// Hands an append to the disk's syncer, which acknowledges it (see
    /// [`acknowledge`]) once a sync made after the append's write covers
    /// it; appends queued meanwhile share one sync.
    fn sync_later(&self, append: PendingAppend) -> io::Result<()>;
    /// The entry at `index`.
    fn entry(&self, index: u64) -> io::Result<Option<Vec<u8>>>;
    /// The entries from `start` on, up to `end`, in index order.
    fn entries(&self, start: u64, end: Bound<u64>) -> io::Result<Vec<Vec<u8>>>;
    /// The entry with the largest index.
    fn last_entry(&self) -> io::Result<Option<Vec<u8>>>;
    /// True if the log holds no entry.
    fn log_is_empty(&self) -> io::Result<bool>;
    /// A meta key's value.
    fn meta(&self, key: &'static str) -> io::Result<Option<Vec<u8>>>;
    /// Where the first failed sync's error is kept.
    fn first_failure(&self) -> Arc<OnceLock<String>>;
    /// The mark ([`mark`]) the disk held when it was opened, if any. Every
    /// sync makes a new one durable once what it names is; a write that
    /// removes or replaces the entry it names lowers it first.
    fn opened_mark(&self) -> Option<Mark>;
}

/// An append waiting for its sync.
pub struct PendingAppend {
    /// The entries' indexes.
    first: u64,
    last: u64,
    /// When the store took them.
    submitted: Instant,
    /// Where they are timed.
    metrics: Arc<Metrics>,
    /// Told once the entries are on stable storage.
    callback: IOFlushed<TypeConfig>,
}

/// Tells the appends of `batch` how the sync that covers them went
/// (started at `started`), and times them; a disk's syncer calls it.
fn acknowledge(batch: Vec<PendingAppend>, result: &io::Result<()>, started: Instant) {
    let done = Instant::now();
    if let (Ok(()), Some(first)) = (result, batch.first()) {
        first.metrics.fsync(done.saturating_duration_since(started));
    }
    for p in batch {
        match result {
            Ok(()) => {
                p.metrics.stages.synced(p.first, p.last, done);
                p.metrics
                    .log_append(done.saturating_duration_since(p.submitted));
                p.callback.io_completed(Ok(()));
            }
            Err(e) => p
                .callback
                .io_completed(Err(io::Error::new(e.kind(), e.to_string()))),
        }
    }
}

/// The refusal of a log that lost what it had made durable (`why`).
fn lost(why: &str) -> String {
    format!(
        "the log lost data it had made durable ({why}): the disk damaged or dropped it, and \
         sled keeps only what precedes damage. This node must not start on it, {REPLACE_IT}"
    )
}

/// What every refusal of damaged data ends with: why not to start on it,
/// and what to do.
pub(super) const REPLACE_IT: &str = "or it could undo what a majority decided: replace it \
     (remove it from the cluster, then add a node with an empty data directory; see \
     docs/operations/membership.md)";

/// The refusal of a log that cannot be read whole (`e`).
fn unreadable(e: &io::Error) -> String {
    format!(
        "the log's files are damaged: reading the log failed ({e}). This node must not start on \
         them, {REPLACE_IT}"
    )
}

/// Records a sync's failure as the disk's first, if it is (see
/// [`Disk::first_failure`]).
fn note_failure(first: &OnceLock<String>, result: &io::Result<()>) {
    if let Err(e) = result {
        let _ = first.set(e.to_string());
    }
}

/// Whether a log store is closed (see [`LogStore::closed`]).
pub struct StoreClosed(Weak<dyn Disk>);

impl StoreClosed {
    /// Waits until the store is closed, at most `timeout`; false if it is
    /// still open then.
    pub async fn wait(&self, timeout: std::time::Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.0.strong_count() > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        true
    }
}

/// Where a log store keeps its first failed sync's error, apart from the
/// store (see [`LogStore::sync_failure`]).
#[derive(Clone)]
pub struct SyncFailure(Arc<OnceLock<String>>);

impl SyncFailure {
    /// The first failed sync's error, if one has failed.
    pub fn get(&self) -> Option<String> {
        self.0.get().cloned()
    }
}

/// The log store. Cheap to clone: clones share the disk, which is how
/// openraft's replication tasks get their readers.
#[derive(Clone)]
pub struct LogStore {
    disk: Arc<dyn Disk>,
    /// What the snapshot file on disk covers (last index + 1), if purges
    /// must wait for it (see [`with_snapshot_floor`](Self::with_snapshot_floor)).
    snapshot_floor: Option<Arc<AtomicU64>>,
    /// The last commit index saved, for status.
    committed: Arc<AtomicU64>,
    /// The first index not purged (see [`LogStore::purged_marker`]).
    purged: Arc<AtomicU64>,
    /// Where appends and syncs are timed (see `metrics::stages`).
    metrics: Arc<Mutex<Arc<Metrics>>>,
}

impl LogStore {
    /// The store over sled in `dir`, whose database `db` is (as opened by
    /// [`open_db`]): every real node's.
    pub fn new(db: sled::Db, dir: &std::path::Path) -> anyhow::Result<Self> {
        Self::with_faults(db, dir, StorageFaults::default())
    }

    /// Like [`new`](Self::new), with `faults` injected into its syncs
    /// (tests only).
    pub fn with_faults(
        db: sled::Db,
        dir: &std::path::Path,
        faults: StorageFaults,
    ) -> anyhow::Result<Self> {
        Ok(Self::open(Arc::new(SledDisk::open(db, dir, faults)?))?)
    }

    /// The store over a simulated disk (the simulator's; open it inside a
    /// tokio runtime: its syncer is a task there).
    pub fn in_memory(disk: MemDisk) -> io::Result<Self> {
        Self::open(disk.open())
    }

    /// The store over the disk that the node's options name.
    pub fn of(
        storage: &Storage,
        data_dir: &std::path::Path,
        faults: StorageFaults,
    ) -> anyhow::Result<Self> {
        match storage {
            Storage::Sled => {
                let sled_dir = data_dir.join("sled");
                // sled panics on some damage ("tried to serialize
                // Uninitialized", met by the harness's rot nemesis): a
                // refusal that says what to do, not a panic on every
                // restart.
                let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let db = open_db(&sled_dir)?;
                    Self::with_faults(db, &sled_dir, faults)
                }));
                opened.unwrap_or_else(|panic| {
                    let why = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic".into());
                    anyhow::bail!(
                        "{}",
                        unreadable(&io::Error::other(format!("sled panicked: {why}")))
                    )
                })
            }
            Storage::Memory(disk) => Ok(Self::in_memory(disk.clone())?),
        }
    }

    fn open(disk: Arc<dyn Disk>) -> io::Result<Self> {
        let store = LogStore {
            disk,
            snapshot_floor: None,
            committed: Arc::default(),
            purged: Arc::default(),
            metrics: Arc::default(),
        };
        let committed: Option<Option<LogId>> = store.get_meta(KEY_COMMITTED)?;
        let index = committed.flatten().map_or(0, |c| c.index);
        store.committed.store(index, Ordering::Relaxed);
        let purged: Option<LogId> = store.get_meta(KEY_LAST_PURGED)?;
        let first_kept = purged.map_or(0, |p| p.index + 1);
        store.purged.store(first_kept, Ordering::Relaxed);
        if let Some(mark) = store.disk.opened_mark() {
            let vote = store.disk.meta(KEY_VOTE)?;
            mark.check(vote.as_deref(), first_kept, |i| store.disk.entry(i))
                .map_err(|why| io::Error::new(io::ErrorKind::InvalidData, lost(&why)))?;
        }
        // Every entry kept, read once: sled finds some damage only when it
        // reads the page (openraft's replay at start-up would then fail,
        // and the node exit, on every restart, without saying what to do).
        store
            .read_whole(first_kept)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, unreadable(&e)))?;
        Ok(store)
    }

    /// Reads every entry from `first` on, [`READ_CHUNK`] indexes at a time
    /// (so memory stays bounded however large the log).
    fn read_whole(&self, first: u64) -> io::Result<()> {
        let Some(last) = self.disk.last_entry()? else {
            return Ok(());
        };
        let last = decode::<Entry>(&last)?.log_id.index;
        let mut start = first;
        while start <= last {
            let end = start.saturating_add(READ_CHUNK);
            self.disk.entries(start, Bound::Excluded(end))?;
            start = end;
        }
        Ok(())
    }

    /// Never deletes entries the snapshot file on disk does not cover
    /// (`floor`: its last index + 1, as the state-machine store keeps it).
    ///
    /// openraft 0.9 purged the log up to an installed snapshot as soon as
    /// it had *sent* the install to the state-machine task, before the
    /// snapshot was written; a crash in between would leave a node whose
    /// snapshot is older than its purged log, which cannot restart. (0.10
    /// waits for the snapshot before it purges; the store does not rely on
    /// that ordering.) So a purge past the persisted snapshot records only
    /// what is covered and leaves the rest for a later purge; openraft
    /// never reads below its own purge point, so the extra entries are only
    /// kept, never used, unless the node restarts before the new snapshot
    /// is on disk.
    pub fn with_snapshot_floor(mut self, floor: Arc<AtomicU64>) -> Self {
        self.snapshot_floor = Some(floor);
        self
    }

    /// Times appends and syncs into `metrics`.
    pub fn with_metrics(self, metrics: Arc<Metrics>) -> Self {
        *self.metrics.lock().expect("metrics lock poisoned") = metrics;
        self
    }

    fn metrics(&self) -> Arc<Metrics> {
        self.metrics.lock().expect("metrics lock poisoned").clone()
    }

    /// Tells when every handle of this store (openraft's, its replication
    /// tasks', the cluster identity's) is gone and its disk closed, so that
    /// the directory can be opened again.
    pub fn closed(&self) -> StoreClosed {
        StoreClosed(Arc::downgrade(&self.disk))
    }

    /// A shared view of the commit index this store has saved.
    pub fn committed_marker(&self) -> Arc<AtomicU64> {
        self.committed.clone()
    }

    /// A shared view of the first index this store has not purged (0:
    /// nothing purged): set when a purge is recorded, before its entries
    /// go.
    pub fn purged_marker(&self) -> Arc<AtomicU64> {
        self.purged.clone()
    }

    fn get_meta<T: DeserializeOwned>(&self, key: &'static str) -> io::Result<Option<T>> {
        match self.disk.meta(key)? {
            None => Ok(None),
            Some(bytes) => decode(&bytes).map(Some),
        }
    }

    /// Makes every write so far durable; callers acknowledge to openraft
    /// only after it.
    async fn flush(&self) -> io::Result<()> {
        let start = Instant::now();
        self.disk.sync().await?;
        self.metrics().fsync(start.elapsed());
        Ok(())
    }

    /// Binds the data directory to node `id`: records it on first use, and
    /// refuses another id later (a directory mixed up between nodes would
    /// make a node forget its vote and lack entries it acknowledged).
    pub async fn check_node_id(&self, id: NodeId) -> anyhow::Result<()> {
        match self.get_meta::<NodeId>(KEY_NODE_ID)? {
            Some(own) if own == id => Ok(()),
            Some(own) => anyhow::bail!(
                "this data directory belongs to node {own}, not to node {id} (--id {id}): start \
                 node {own} on it, or give node {id} its own empty data directory (and, if node \
                 {id} is new, add it with `raftlock members add`)"
            ),
            None => {
                self.disk.write(Write::Meta(KEY_NODE_ID, encode(&id)))?;
                self.flush().await?;
                Ok(())
            }
        }
    }

    /// The cluster this node belongs to (`None` until it bootstraps one or
    /// hears from one).
    pub fn cluster_id(&self) -> io::Result<Option<u64>> {
        self.get_meta(KEY_CLUSTER_ID)
    }

    /// Records (durably) that this node belongs to cluster `id`.
    pub async fn set_cluster_id(&self, id: u64) -> io::Result<()> {
        self.disk.write(Write::Meta(KEY_CLUSTER_ID, encode(&id)))?;
        self.flush().await
    }

    /// The nodes this node has known to hold data (a log or a vote) in
    /// its cluster (see [`VOTERS_WITH_DATA_KEY`](crate::raft::identity::VOTERS_WITH_DATA_KEY)),
    /// `None` until first recorded. A key older builds do not read: it
    /// changes no format.
    pub fn held_data(&self) -> io::Result<Option<BTreeSet<NodeId>>> {
        self.get_meta(KEY_HELD_DATA)
    }

    /// Records (durably) that the nodes in `nodes` have held data.
    pub async fn set_held_data(&self, nodes: &BTreeSet<NodeId>) -> io::Result<()> {
        self.disk.write(Write::Meta(KEY_HELD_DATA, encode(nodes)))?;
        self.flush().await
    }

    /// True if this node has never voted or logged (so it must not be
    /// bootstrapped again).
    pub fn is_fresh(&self) -> bool {
        matches!(self.disk.log_is_empty(), Ok(true)) && matches!(self.disk.meta(KEY_VOTE), Ok(None))
    }

    /// The first failed sync's error, once one has failed (whichever write
    /// it was for): from then on nothing this process writes can be
    /// trusted to reach the disk.
    pub fn failed_sync(&self) -> Option<String> {
        self.disk.first_failure().get().cloned()
    }

    /// Where the first failed sync's error is kept, for a watcher that
    /// must not keep the store open (a node's shutdown waits until every
    /// handle of its store is gone).
    pub fn sync_failure(&self) -> SyncFailure {
        SyncFailure(self.disk.first_failure())
    }

    fn entry_at(&self, index: u64) -> io::Result<Option<Entry>> {
        match self.disk.entry(index)? {
            None => Ok(None),
            Some(bytes) => decode(&bytes).map(Some),
        }
    }

    /// Writes entries straight onto the disk, as an append does but with
    /// no sync and no callback (tests only).
    #[cfg(test)]
    pub(crate) fn write_for_tests(&self, entries: impl IntoIterator<Item = Entry>) {
        let encoded = entries
            .into_iter()
            .map(|e| (e.log_id.index, encode(&e)))
            .collect();
        self.disk.write(Write::Log(encoded)).expect("write");
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => match i.checked_add(1) {
                Some(i) => i,
                None => return Ok(Vec::new()),
            },
            Bound::Unbounded => 0,
        };
        let end = range.end_bound().cloned();
        let empty = match end {
            Bound::Included(e) => e < start,
            Bound::Excluded(e) => e <= start,
            Bound::Unbounded => false,
        };
        if empty {
            return Ok(Vec::new());
        }
        self.disk
            .entries(start, end)?
            .iter()
            .map(|bytes| decode(bytes))
            .collect()
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        self.get_meta(KEY_VOTE)
    }

    /// What a replication stream sends from `start` (the only reader
    /// openraft calls this for): the entries from `start` on, up to the
    /// first missing index, and nothing if `start` itself is gone.
    ///
    /// openraft 0.10.0-alpha.37 can restart a follower's stream from a
    /// `LogsSince` payload that its leader has already replaced by a
    /// snapshot (the core switches a follower to a snapshot without telling
    /// its replication task), while the log is purged past where that
    /// stream starts (the simulator's seed 713724 on 4d345ff). The entries
    /// after the purged head would make a request whose first entry does
    /// not follow `prev_log_id`: a debug assertion in openraft, and in a
    /// release build a request the follower refuses
    /// (`peer_input::check_append`), which restarts the snapshot. Given
    /// nothing, openraft sends an entry-less request instead, which the
    /// network ends the stale stream on ([`network`](super::network),
    /// `ends_stale_stream`), so the task takes up the leader's current
    /// payload.
    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> io::Result<Vec<Entry>> {
        let entries = self.try_get_log_entries(start..end).await?;
        Ok(from_start(start, entries))
    }
}

/// The entries of `entries` from index `start` on, up to the first
/// missing index: nothing if `start` is missing (see
/// [`LogStore::limited_get_log_entries`]).
fn from_start(start: u64, mut entries: Vec<Entry>) -> Vec<Entry> {
    let keep = entries
        .iter()
        .zip(start..)
        .take_while(|(e, index)| e.log_id.index == *index)
        .count();
    if keep < entries.len() {
        tracing::debug!(
            start,
            read = entries.len(),
            kept = keep,
            "a replication read found an index missing (purged while a stale stream still \
             wanted it)"
        );
        entries.truncate(keep);
    }
    entries
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let last_purged: Option<LogId> = self.get_meta(KEY_LAST_PURGED)?;
        let last_log_id = match self.disk.last_entry()? {
            Some(bytes) => Some(decode::<Entry>(&bytes)?.log_id),
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
        // The sync makes every earlier write durable, log entries whose
        // sync has not called back included: openraft 0.10.0-alpha.37
        // counts a new leader's log as flushed once its vote is
        // (openraft#2118; `tests::a_saved_vote_makes_the_appends_before_it_durable`).
        // Keep it a sync of everything.
        self.disk.write(Write::Meta(KEY_VOTE, encode(vote)))?;
        self.flush().await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        // Not synced on its own: a lost commit marker only means replaying
        // fewer entries at start-up; the leader re-commits the rest.
        self.disk
            .write(Write::Meta(KEY_COMMITTED, encode(&committed)))?;
        self.committed
            .store(committed.map_or(0, |c| c.index), Ordering::Relaxed);
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        let committed = self.get_meta::<Option<LogId>>(KEY_COMMITTED)?.flatten();
        // openraft re-applies up to this at start-up, so it must not point
        // past the entries this node has: after a crash while a snapshot was
        // being installed, the commit index may already be the snapshot's
        // while the older snapshot on disk and the log end below it. A lower
        // commit index is always safe; the leader tells the rest again.
        let last = self.get_log_state().await?.last_log_id;
        Ok(match (committed, last) {
            (Some(c), Some(l)) if c.index > l.index => Some(l),
            (Some(_), None) => None,
            (c, _) => c,
        })
    }

    /// Writes the entries (readable at once, so replication can send them)
    /// and hands the callback to the disk's syncer, which calls it once a
    /// sync covers them: openraft counts this node's copy of an entry only
    /// from its callback, so the leader replicates while it syncs (Raft
    /// thesis §10.2.1) without ever counting an entry it could still lose.
    /// Writes stay ordered (the disk applies them in call order and a sync
    /// makes everything before it durable), so a sync never covers a later
    /// write without the earlier ones.
    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let submitted = Instant::now();
        let encoded: Vec<(u64, Vec<u8>)> = entries
            .into_iter()
            .map(|entry| (entry.log_id.index, encode(&entry)))
            .collect();
        let (first, last) = match (encoded.first(), encoded.last()) {
            (Some((first, _)), Some((last, _))) => (*first, *last),
            _ => {
                callback.io_completed(Ok(()));
                return Ok(());
            }
        };
        self.disk.write(Write::Log(encoded))?;
        let metrics = self.metrics();
        metrics.stages.appending(first, last, submitted);
        self.disk.sync_later(PendingAppend {
            first,
            last,
            submitted,
            metrics,
            callback,
        })
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let from = last_log_id.map_or(0, |l| l.index + 1);
        // One atomic write: not even a shorter log half-way.
        self.disk.write(Write::Remove { from, to: u64::MAX })?;
        self.flush().await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        // Only what the snapshot on disk covers (see `with_snapshot_floor`).
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
                        // Gone already: nothing more to purge now.
                        None => return Ok(()),
                    }
                }
            }
        };
        // Record the purge point first: a crash between the two steps then
        // leaves extra entries below it, which are ignored, never a gap.
        self.disk
            .write(Write::Meta(KEY_LAST_PURGED, encode(&log_id)))?;
        self.purged.fetch_max(log_id.index + 1, Ordering::SeqCst);
        self.flush().await?;
        self.disk.write(Write::Remove {
            from: 0,
            to: log_id.index,
        })?;
        self.flush().await
    }
}
