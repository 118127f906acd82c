//! The Raft log, vote and commit markers in sled.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use tokio::time::Instant;

use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::{LogState, OptionalSend, RaftLogReader};
use serde::de::DeserializeOwned;

use super::{Entry, LogId, NodeId, TypeConfig, Vote, FORMAT_VERSION};
use crate::codec::{decode_stored as decode, to_vec as encode};
use crate::metrics::Metrics;

const KEY_FORMAT: &[u8] = b"format";
const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_LAST_PURGED: &[u8] = b"last_purged";
const KEY_NODE_ID: &[u8] = b"node_id";
const KEY_CLUSTER_ID: &[u8] = b"cluster_id";

/// The files sled keeps the log in, synced for real.
///
/// sled 0.34's `flush` ends in `sync_file_range` on Linux: the pages reach
/// the device, but the device's cache is not flushed and neither is the
/// file's size, so a power loss can take "flushed" appends and votes with
/// it. It also writes items too large for its segments (about 128 KiB) to
/// separate files under `blobs/` without syncing them at all. After every
/// flush the store therefore calls `fdatasync` on `db` and `fsync` on each
/// blob file it has not synced before (and on the `blobs` directory when
/// one appeared). An `fdatasync` through another descriptor of the same
/// file covers every write to it, whichever descriptor made it.
struct DurableFiles {
    /// sled's main file.
    db: std::fs::File,
    /// sled's directory of large items.
    blobs: PathBuf,
    /// What syncs share; held for a whole flush and sync, so syncs never
    /// overlap and none can miss the error of the one before it.
    state: Mutex<SyncState>,
    /// The first failed sync's error, as `state` has it, for readers that
    /// must not wait out a sync in progress (the node's liveness owner
    /// looks at it on every change of its metrics).
    first_failure: Arc<std::sync::OnceLock<String>>,
    /// Faults a test injects (none in production).
    faults: StorageFaults,
}

/// The state of a store's syncs.
#[derive(Default)]
struct SyncState {
    /// Blob files synced already (pruned of those sled has deleted).
    synced_blobs: BTreeSet<OsString>,
    /// The first sync error, if any. It is sticky: once a sync has failed,
    /// every later one fails too. The kernel reports a writeback error
    /// once per open file, so a second `fdatasync` could return 0 although
    /// the pages the first one lost are gone (the "fsyncgate" PostgreSQL
    /// met in 2018); a node restarts (fail-stop) and reads what is on disk.
    failed: Option<String>,
}

/// Faults a test injects into a node's log storage, as a failing disk
/// would cause them; production nodes have none (the default). Clones
/// share one switch.
#[derive(Clone, Debug, Default)]
pub struct StorageFaults {
    fail_syncs: Arc<std::sync::atomic::AtomicBool>,
}

impl StorageFaults {
    /// From now on every sync of the log fails with `EIO`, as on a disk
    /// that dropped written pages.
    pub fn fail_syncs(&self) {
        self.fail_syncs.store(true, Ordering::SeqCst);
    }

    /// Syncs reach the disk again (for a store opened afterwards).
    pub fn heal(&self) {
        self.fail_syncs.store(false, Ordering::SeqCst);
    }

    /// The injected error of a sync, if syncs fail now.
    fn sync_error(&self) -> Option<io::Error> {
        self.fail_syncs
            .load(Ordering::SeqCst)
            .then(|| io::Error::from_raw_os_error(5))
    }
}

impl DurableFiles {
    fn open(dir: &Path, faults: StorageFaults) -> std::io::Result<Self> {
        let db = std::fs::OpenOptions::new()
            .read(true)
            .open(dir.join("db"))?;
        Ok(DurableFiles {
            db,
            blobs: dir.join("blobs"),
            state: Mutex::default(),
            first_failure: Arc::default(),
            faults,
        })
    }

    /// sled's flush (which only `sync_file_range`s), then a real sync of
    /// its files: everything written before the call is on stable storage
    /// after it. Fails, without trying, once an earlier sync has failed.
    fn durable(&self, db: &sled::Db) -> io::Result<()> {
        let mut state = self.state.lock().expect("sync state lock poisoned");
        if let Some(first) = &state.failed {
            return Err(io::Error::other(format!(
                "an earlier sync of the log failed ({first}); nothing written since can be \
                 trusted to reach the disk"
            )));
        }
        let result = db
            .flush()
            .map_err(sled_io)
            .and_then(|_| self.sync(&mut state.synced_blobs));
        if let Err(e) = &result {
            state.failed = Some(e.to_string());
            let _ = self.first_failure.set(e.to_string());
        }
        result
    }

    /// Makes everything sled has written so far durable: blobs first, then
    /// the file that points at them.
    fn sync(&self, synced: &mut BTreeSet<OsString>) -> std::io::Result<()> {
        if let Some(e) = self.faults.sync_error() {
            return Err(e);
        }
        let mut present = BTreeSet::new();
        let mut new = false;
        match std::fs::read_dir(&self.blobs) {
            Ok(entries) => {
                for entry in entries {
                    let entry = entry?;
                    let name = entry.file_name();
                    if !synced.contains(&name) {
                        match std::fs::File::open(entry.path()) {
                            Ok(f) => f.sync_all()?,
                            // Deleted by sled meanwhile: nothing to keep.
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                            Err(e) => return Err(e),
                        }
                        new = true;
                    }
                    present.insert(name);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        if new {
            sync_dir(&self.blobs)?;
        }
        *synced = present;
        self.db.sync_data()
    }
}

/// `fsync` of a directory, so entries created or renamed in it survive a
/// power loss.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// How long opening the database waits for sled's lock on it.
pub const DB_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Opens (or creates) the node's sled database and checks its format
/// version.
pub fn open_db(path: &std::path::Path) -> anyhow::Result<sled::Db> {
    let open = || {
        sled::Config::new()
            .path(path)
            // We flush explicitly where durability matters; the background
            // flusher only adds writes.
            .flush_every_ms(None)
            .open()
    };
    // sled locks its file while any of its threads of a closing database
    // are still finishing (a node restarted in the same process, or a
    // process restarted at once): wait for that a little, not for a
    // directory another live node holds.
    // sled reports its lock as an `Other` error with this text.
    let locked =
        |e: &sled::Error| matches!(e, sled::Error::Io(e) if e.to_string().contains("acquire lock"));
    let deadline = tokio::time::Instant::now() + DB_LOCK_WAIT;
    let db = loop {
        match open() {
            Err(e) if locked(&e) && tokio::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) if locked(&e) => {
                anyhow::bail!(
                    "the data directory {} is in use by another process (sled's lock is held \
                     after {} s): stop the other raftlockd, or give this one its own directory",
                    path.display(),
                    DB_LOCK_WAIT.as_secs()
                )
            }
            Err(e) => {
                anyhow::bail!("cannot open sled database at {}: {e}", path.display())
            }
            Ok(db) => break db,
        }
    };
    let meta = db.open_tree("meta")?;
    match meta.get(KEY_FORMAT)? {
        None => {
            meta.insert(KEY_FORMAT, &FORMAT_VERSION.to_be_bytes())?;
            db.flush()?;
            // A new database: its files and their directory entries too.
            for file in ["conf", "db"] {
                std::fs::File::open(path.join(file))?.sync_all()?;
            }
            sync_dir(path)?;
            if let Some(parent) = path.parent() {
                sync_dir(parent)?;
            }
        }
        Some(v) => {
            let found = u64::from_be_bytes(v.as_ref().try_into().unwrap_or([0xff; 8]));
            if found != FORMAT_VERSION {
                anyhow::bail!(
                    "data directory {} has on-disk format {found}; this build reads {FORMAT_VERSION}. \
                     To move the data: with the old version still running, `raftlock snapshot save FILE`; \
                     then start a new cluster with this version on empty data directories and \
                     `raftlock snapshot restore FILE` (this build reads older backups)",
                    path.display()
                );
            }
        }
    }
    Ok(db)
}

/// The log store. Cheap to clone: clones share the sled trees, which is how
/// openraft's replication tasks get their readers.
#[derive(Clone)]
pub struct LogStore {
    db: sled::Db,
    log: sled::Tree,
    meta: sled::Tree,
    /// sled's files, synced after every flush.
    files: Arc<DurableFiles>,
    /// What the snapshot file on disk covers (last index + 1), if purges
    /// must wait for it (see [`with_snapshot_floor`](Self::with_snapshot_floor)).
    snapshot_floor: Option<Arc<AtomicU64>>,
    /// The last commit index saved, for status.
    committed: Arc<AtomicU64>,
    /// The first index not purged (see [`LogStore::purged_marker`]).
    purged: Arc<AtomicU64>,
    /// Where appends are timed (see `metrics::stages`), shared with the
    /// sync thread.
    metrics: Arc<Mutex<Arc<Metrics>>>,
    /// The thread that makes appends durable and acknowledges them.
    flusher: Arc<Flusher>,
}

/// Whether a log store is closed (see [`LogStore::closed`]).
pub struct StoreClosed(std::sync::Weak<dyn std::any::Any + Send + Sync>);

impl StoreClosed {
    /// Closed once `alive` is gone.
    pub fn of<T: std::any::Any + Send + Sync>(alive: std::sync::Weak<T>) -> Self {
        StoreClosed(alive)
    }

    /// Waits until the store is closed, at most `timeout`; false if it is
    /// still open then.
    pub async fn wait(&self, timeout: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.0.strong_count() > 0 {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        true
    }
}

/// An append waiting for its sync.
struct Pending {
    /// The entries' indexes.
    first: u64,
    last: u64,
    /// When the store took them.
    submitted: Instant,
    /// Told once the entries are on stable storage.
    callback: IOFlushed<TypeConfig>,
}

/// Makes appends durable off the Raft core's path: `append` writes the
/// entries into sled (readable at once, so replication can send them) and
/// queues its callback here; one thread takes every queued append, runs
/// one flush and sync for all of them ([`LogStore::durable`]), and then
/// calls their callbacks. openraft counts this node's copy of an entry
/// only from its callback, so the leader replicates while it syncs (Raft
/// thesis §10.2.1) without ever counting an entry it could still lose.
///
/// Writes stay ordered: sled applies every insert, vote and truncation in
/// call order, and a flush makes everything written before it durable, so
/// a sync never covers a later write without the earlier ones.
struct Flusher {
    /// Where appends queue (`None` once dropped).
    queue: Mutex<Option<mpsc::Sender<Pending>>>,
    /// The sync thread, joined when the last handle of the store goes, so
    /// that its copy of the database is closed before the directory can be
    /// opened again.
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Flusher {
    fn drop(&mut self) {
        drop(self.queue.lock().map(|mut q| q.take()));
        if let Ok(mut thread) = self.thread.lock() {
            if let Some(t) = thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// A sled error as an I/O error.
fn sled_io(e: sled::Error) -> io::Error {
    match e {
        sled::Error::Io(e) => e,
        e => io::Error::other(e),
    }
}

impl LogStore {
    /// Opens the log trees of `db`, the sled database in `dir` (as opened
    /// by [`open_db`]).
    pub fn new(db: sled::Db, dir: &Path) -> anyhow::Result<Self> {
        Self::with_faults(db, dir, StorageFaults::default())
    }

    /// Like [`new`](Self::new), with `faults` injected into its syncs
    /// (tests only).
    pub fn with_faults(db: sled::Db, dir: &Path, faults: StorageFaults) -> anyhow::Result<Self> {
        let log = db.open_tree("log")?;
        let meta = db.open_tree("meta")?;
        let files = DurableFiles::open(dir, faults)
            .map_err(|e| anyhow::anyhow!("cannot open sled's files in {}: {e}", dir.display()))?;
        let files = Arc::new(files);
        let (queue, pending) = mpsc::channel();
        let store = LogStore {
            db,
            log,
            meta,
            files,
            snapshot_floor: None,
            committed: Arc::default(),
            purged: Arc::default(),
            metrics: Arc::default(),
            flusher: Arc::new(Flusher {
                queue: Mutex::new(Some(queue)),
                thread: Mutex::new(None),
            }),
        };
        let (db, files) = (store.db.clone(), store.files.clone());
        let metrics = store.metrics_handle();
        let thread = std::thread::Builder::new()
            .name("raftlock-log-sync".into())
            .spawn(move || run_flusher(db, files, metrics, pending))
            .map_err(|e| anyhow::anyhow!("cannot start the log's sync thread: {e}"))?;
        *store.flusher.thread.lock().expect("flusher lock poisoned") = Some(thread);
        let committed: Option<Option<LogId>> = store.get_meta(KEY_COMMITTED)?;
        let index = committed.flatten().map_or(0, |c| c.index);
        store.committed.store(index, Ordering::Relaxed);
        let purged: Option<LogId> = store.get_meta(KEY_LAST_PURGED)?;
        store
            .purged
            .store(purged.map_or(0, |p| p.index + 1), Ordering::Relaxed);
        Ok(store)
    }

    /// Never deletes entries the snapshot file on disk does not cover
    /// (`floor`: its last index + 1, as the state-machine store keeps it).
    ///
    /// openraft 0.9 purged the log up to an installed snapshot as soon as
    /// it had *sent* the install to the state-machine task, before the
    /// snapshot was written; a crash in between would leave a node whose
    /// snapshot is older than its purged log, which cannot restart. (0.10
    /// waits for the snapshot before it purges; the store does not rely on
    /// that ordering.) So a
    /// purge past the persisted snapshot records only what is covered and
    /// leaves the rest for a later purge; openraft never reads below its
    /// own purge point, so the extra entries are only kept, never used,
    /// unless the node restarts before the new snapshot is on disk.
    pub fn with_snapshot_floor(mut self, floor: Arc<AtomicU64>) -> Self {
        self.snapshot_floor = Some(floor);
        self
    }

    /// Times appends into `metrics`' write stages.
    pub fn with_metrics(self, metrics: Arc<Metrics>) -> Self {
        *self.metrics.lock().expect("metrics lock poisoned") = metrics;
        self
    }

    /// Where the sync thread times appends (set by [`Self::with_metrics`]).
    fn metrics_handle(&self) -> Arc<Mutex<Arc<Metrics>>> {
        self.metrics.clone()
    }

    /// Tells when every handle of this store (openraft's, its replication
    /// tasks', the cluster identity's) is gone and the database closed, so
    /// that the directory can be opened again.
    pub fn closed(&self) -> StoreClosed {
        StoreClosed::of(Arc::downgrade(&self.flusher))
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

    fn get_meta<T: DeserializeOwned>(&self, key: &[u8]) -> io::Result<Option<T>> {
        match self.meta.get(key).map_err(sled_io)? {
            None => Ok(None),
            Some(bytes) => decode(&bytes).map(Some),
        }
    }

    /// Makes every write so far durable (see [`durable`]), on a blocking
    /// thread; the caller acknowledges to openraft only after it.
    async fn flush(&self) -> io::Result<()> {
        let (db, files) = (self.db.clone(), self.files.clone());
        let metrics = self.metrics.lock().expect("metrics lock poisoned").clone();
        crate::blocking::spawn(move || {
            let start = Instant::now();
            let result = files.durable(&db);
            if result.is_ok() {
                metrics.fsync(start.elapsed());
            }
            result
        })
        .await
        .map_err(io::Error::other)?
    }

    /// Writes a blank entry at `index` straight into the log (tests only).
    #[cfg(test)]
    pub(crate) fn append_for_tests(&self, index: u64) {
        let entry = Entry {
            log_id: super::log_id(1, 1, index),
            payload: super::EntryPayload::Blank,
        };
        self.log
            .insert(index.to_be_bytes(), encode(&entry))
            .expect("insert");
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
                self.meta.insert(KEY_NODE_ID, encode(&id))?;
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
        self.meta
            .insert(KEY_CLUSTER_ID, encode(&id))
            .map_err(sled_io)?;
        self.flush().await
    }

    /// True if this node has ever voted or logged (so it must not be
    /// bootstrapped again).
    pub fn is_fresh(&self) -> bool {
        self.log.is_empty() && matches!(self.meta.get(KEY_VOTE), Ok(None))
    }

    /// The first failed sync's error, once one has failed (whichever write
    /// it was for): from then on nothing this process writes can be
    /// trusted to reach the disk.
    pub fn failed_sync(&self) -> Option<String> {
        // Not through `state`: its lock is held for a whole flush and sync.
        self.files.first_failure.get().cloned()
    }

    /// Where the first failed sync's error is kept, for a watcher that
    /// must not keep the store open (a node's shutdown waits until every
    /// handle of its store is gone).
    pub fn sync_failure(&self) -> Arc<std::sync::OnceLock<String>> {
        self.files.first_failure.clone()
    }
}

/// The sync thread: waits for an append, takes every append queued by
/// then, makes them durable with one flush and sync, and acknowledges them
/// (see [`Flusher`]). Ends when the store is dropped.
fn run_flusher(
    db: sled::Db,
    files: Arc<DurableFiles>,
    metrics: Arc<Mutex<Arc<Metrics>>>,
    pending: mpsc::Receiver<Pending>,
) {
    while let Ok(first) = pending.recv() {
        let mut batch = vec![first];
        batch.extend(pending.try_iter());
        let start = Instant::now();
        let result = files.durable(&db);
        let done = Instant::now();
        let metrics = metrics.lock().expect("metrics lock poisoned").clone();
        if result.is_ok() {
            metrics.fsync(done - start);
        }
        for p in batch {
            match &result {
                Ok(()) => {
                    metrics.stages.synced(p.first, p.last, done);
                    metrics.log_append(done.saturating_duration_since(p.submitted));
                    p.callback.io_completed(Ok(()));
                }
                Err(e) => p
                    .callback
                    .io_completed(Err(io::Error::new(e.kind(), e.to_string()))),
            }
        }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i + 1,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&i) => Bound::Included(i.to_be_bytes()),
            Bound::Excluded(&i) => Bound::Excluded(i.to_be_bytes()),
            Bound::Unbounded => Bound::Unbounded,
        };
        let mut out = Vec::new();
        for item in self.log.range((Bound::Included(start.to_be_bytes()), end)) {
            let (_, v) = item.map_err(sled_io)?;
            out.push(decode(&v)?);
        }
        Ok(out)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        self.get_meta(KEY_VOTE)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let last_purged: Option<LogId> = self.get_meta(KEY_LAST_PURGED)?;
        let last = self.log.last().map_err(sled_io)?;
        let last_log_id = match last {
            Some((_, v)) => Some(decode::<Entry>(&v)?.log_id),
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
        // The flush makes the whole database durable, log entries whose
        // sync has not called back included: openraft 0.10.0-alpha.37
        // counts a new leader's log as flushed once its vote is
        // (openraft#2118; see mem_log's test of the same rule). Keep it a
        // flush of everything.
        self.meta.insert(KEY_VOTE, encode(vote)).map_err(sled_io)?;
        self.flush().await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        // Not flushed on its own: a lost commit marker only means replaying
        // fewer entries at start-up; the leader re-commits the rest.
        self.meta
            .insert(KEY_COMMITTED, encode(&committed))
            .map_err(sled_io)?;
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

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let submitted = Instant::now();
        let mut encoded: Vec<([u8; 8], Vec<u8>)> = entries
            .into_iter()
            .map(|entry| (entry.log_id.index.to_be_bytes(), encode(&entry)))
            .collect();
        let (first, last) = match (encoded.first(), encoded.last()) {
            (Some((first, _)), Some((last, _))) => {
                (u64::from_be_bytes(*first), u64::from_be_bytes(*last))
            }
            _ => {
                callback.io_completed(Ok(()));
                return Ok(());
            }
        };
        // One entry (the usual case: a batch of commands) is one sled
        // write. Several go in as one atomic sled batch, so that a crash
        // cannot keep a later one without an earlier one (no holes); but a
        // sled batch costs two extra writes, each with its own
        // `sync_file_range` (it rolls the write buffer before and after its
        // manifest), which a single insert does not need.
        let written = if encoded.len() == 1 {
            let (key, value) = encoded.pop().expect("one entry");
            self.log.insert(key, value).map(drop)
        } else {
            let mut batch = sled::Batch::default();
            for (key, value) in encoded {
                batch.insert(&key, value);
            }
            self.log.apply_batch(batch)
        };
        written.map_err(sled_io)?;
        let metrics = self.metrics.lock().expect("metrics lock poisoned").clone();
        metrics.stages.appending(first, last, submitted);
        // Readable now; durable (and acknowledged) once the sync thread has
        // synced it.
        let pending = Pending {
            first,
            last,
            submitted,
            callback,
        };
        let queue = self.flusher.queue.lock().expect("flusher lock poisoned");
        match queue.as_ref().map(|q| q.send(pending)) {
            Some(Ok(())) => Ok(()),
            _ => Err(io::Error::other("the log's sync thread stopped")),
        }
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let from = last_log_id.map_or(0, |l| l.index + 1);
        // From the end backward would also leave no hole; one atomic batch
        // does not even leave a shorter log half-way.
        let mut batch = sled::Batch::default();
        for item in self.log.range(from.to_be_bytes()..) {
            let (k, _) = item.map_err(sled_io)?;
            batch.remove(k);
        }
        self.log.apply_batch(batch).map_err(sled_io)?;
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
                    match self.log.get(upto.to_be_bytes()).map_err(sled_io)? {
                        Some(v) => decode::<Entry>(&v)?.log_id,
                        // Gone already: nothing more to purge now.
                        None => return Ok(()),
                    }
                }
            }
        };
        // Record the purge point first: a crash between the two steps then
        // leaves extra entries below it, which are ignored, never a gap.
        self.meta
            .insert(KEY_LAST_PURGED, encode(&log_id))
            .map_err(sled_io)?;
        self.purged.fetch_max(log_id.index + 1, Ordering::SeqCst);
        self.flush().await?;
        let mut batch = sled::Batch::default();
        for item in self.log.range(..=log_id.index.to_be_bytes()) {
            let (k, _) = item.map_err(sled_io)?;
            batch.remove(k);
        }
        self.log.apply_batch(batch).map_err(sled_io)?;
        self.flush().await
    }
}

#[cfg(test)]
mod tests;
