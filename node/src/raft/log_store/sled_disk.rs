//! The production disk: sled in the data directory, synced for real.
//!
//! Layout: tree `log` (key: the index as 8 big-endian bytes, so sled's
//! order is log order; value: the encoded entry) and tree `meta` (the
//! store's keys, and `format`, the on-disk format version this file
//! checks).

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};

use tokio::time::Instant;

use super::mark::{Mark, MarkFile};
use super::{acknowledge, Disk, PendingAppend, SyncFuture, Write, KEY_VOTE};
use crate::raft::FORMAT_VERSION;

pub(super) const KEY_FORMAT: &[u8] = b"format";

/// The files sled keeps the log in, synced for real.
///
/// sled 0.34's `flush` ends in `sync_file_range` on Linux: the pages reach
/// the device, but the device's cache is not flushed and neither is the
/// file's size, so a power loss can take "flushed" appends and votes with
/// it. It also writes items too large for its segments (about 128 KiB) to
/// separate files under `blobs/` without syncing them at all. After every
/// flush the disk therefore calls `fdatasync` on `db` and `fsync` on each
/// blob file it has not synced before (and on the `blobs` directory when
/// one appeared). An `fdatasync` through another descriptor of the same
/// file covers every write to it, whichever descriptor made it.
pub(super) struct DurableFiles {
    /// sled's main file.
    db: std::fs::File,
    /// The trees the mark is taken from.
    log: sled::Tree,
    meta: sled::Tree,
    /// sled's directory of large items.
    blobs: PathBuf,
    /// What syncs share; held for a whole flush and sync, so syncs never
    /// overlap and none can miss the error of the one before it.
    pub(super) state: Mutex<SyncState>,
    /// The first failed sync's error, as `state` has it, for readers that
    /// must not wait out a sync in progress (the node's liveness owner
    /// looks at it on every change of its metrics).
    first_failure: Arc<OnceLock<String>>,
    /// Faults a test injects (none in production).
    faults: StorageFaults,
}

/// The state of a disk's syncs.
#[derive(Default)]
pub(super) struct SyncState {
    /// Blob files synced already (pruned of those sled has deleted).
    pub(super) synced_blobs: BTreeSet<OsString>,
    /// The first sync error, if any. It is sticky: once a sync has failed,
    /// every later one fails too. The kernel reports a writeback error
    /// once per open file, so a second `fdatasync` could return 0 although
    /// the pages the first one lost are gone (the "fsyncgate" PostgreSQL
    /// met in 2018); a node restarts (fail-stop) and reads what is on disk.
    failed: Option<String>,
    /// The mark file ([`super::mark`]), and the mark it holds.
    mark_file: Option<MarkFile>,
    marked: Mark,
}

/// Faults a test injects into a node's log storage, as a failing disk
/// would cause them; production nodes have none (the default). Clones
/// share one switch.
#[derive(Clone, Debug, Default)]
pub struct StorageFaults {
    fail_syncs: Arc<AtomicBool>,
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
    /// sled's files in `dir` and the mark file beside them; returns them
    /// with the mark found there.
    pub(super) fn open(
        dir: &Path,
        db: &sled::Db,
        faults: StorageFaults,
    ) -> io::Result<(Self, Option<Mark>)> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .open(dir.join("db"))?;
        let (mark_file, found) = MarkFile::open(dir)?;
        let files = DurableFiles {
            db: file,
            log: db.open_tree("log").map_err(sled_io)?,
            meta: db.open_tree("meta").map_err(sled_io)?,
            blobs: dir.join("blobs"),
            state: Mutex::new(SyncState {
                mark_file: Some(mark_file),
                marked: found.clone().unwrap_or_default(),
                ..SyncState::default()
            }),
            first_failure: Arc::default(),
            faults,
        };
        Ok((files, found))
    }

    /// The mark of the log as it is now (see [`super::mark`]).
    fn claim(&self) -> io::Result<Mark> {
        let last = self.log.last().map_err(sled_io)?;
        let vote = self.meta.get(KEY_VOTE.as_bytes()).map_err(sled_io)?;
        Ok(Mark::of(
            last.as_ref().map(|(k, v)| (index_of(k), v.as_ref())),
            vote.map(|v| v.to_vec()),
        ))
    }

    /// Makes `write` in sled; first, if it would remove or replace the
    /// entry the mark names, lowers the mark durably, holding the sync
    /// lock so that no sync takes a mark in between.
    pub(super) fn write_marked(
        &self,
        write: Write,
        apply: impl FnOnce(Write) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut state = self.state.lock().expect("sync state lock poisoned");
        let entry = |i: u64| {
            self.log
                .get(i.to_be_bytes())
                .ok()
                .flatten()
                .map(|v| v.to_vec())
        };
        if let Some(lower) = state.marked.before(&write, entry) {
            if let Some(first) = &state.failed {
                return Err(io::Error::other(format!(
                    "an earlier sync of the log failed ({first})"
                )));
            }
            let stored = match state.mark_file.as_mut() {
                Some(file) => file.store(&lower),
                None => Ok(()),
            };
            if let Err(e) = &stored {
                state.failed = Some(e.to_string());
            }
            super::note_failure(&self.first_failure, &stored);
            stored?;
            state.marked = lower;
        }
        apply(write)
    }

    /// sled's flush (which only `sync_file_range`s), then a real sync of
    /// its files: everything written before the call is on stable storage
    /// after it. Fails, without trying, once an earlier sync has failed.
    pub(super) fn durable(&self, db: &sled::Db) -> io::Result<()> {
        let mut state = self.state.lock().expect("sync state lock poisoned");
        if let Some(first) = &state.failed {
            return Err(io::Error::other(format!(
                "an earlier sync of the log failed ({first}); nothing written since can be \
                 trusted to reach the disk"
            )));
        }
        let result = self.claim().and_then(|claim| {
            db.flush().map_err(sled_io)?;
            self.sync(&mut state.synced_blobs)?;
            // The mark, once what it names is durable (and only when it
            // changed: a sync of meta keys alone costs no second sync).
            if claim != state.marked {
                if let Some(file) = state.mark_file.as_mut() {
                    file.store(&claim)?;
                }
                state.marked = claim;
            }
            Ok(())
        });
        if let Err(e) = &result {
            state.failed = Some(e.to_string());
        }
        super::note_failure(&self.first_failure, &result);
        result
    }

    /// Makes everything sled has written so far durable: blobs first, then
    /// the file that points at them.
    fn sync(&self, synced: &mut BTreeSet<OsString>) -> io::Result<()> {
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
                            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                            Err(e) => return Err(e),
                        }
                        new = true;
                    }
                    present.insert(name);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        if new {
            sync_dir(&self.blobs)?;
        }
        *synced = present;
        self.db.sync_data()
    }
}

/// The log index a key of the `log` tree stands for.
fn index_of(key: &[u8]) -> u64 {
    u64::from_be_bytes(key.try_into().unwrap_or([0; 8]))
}

/// `fsync` of a directory, so entries created or renamed in it survive a
/// power loss.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// How long opening the database waits for sled's lock on it.
pub const DB_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Opens (or creates) the node's sled database and checks its format
/// version.
pub fn open_db(path: &Path) -> anyhow::Result<sled::Db> {
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
    let deadline = Instant::now() + DB_LOCK_WAIT;
    let db = loop {
        match open() {
            Err(e) if locked(&e) && Instant::now() < deadline => {
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
            Err(e @ sled::Error::Corruption { .. }) => {
                anyhow::bail!(
                    "sled's files in {} are damaged ({e}). This node must not start on them, {}",
                    path.display(),
                    super::REPLACE_IT
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

/// A sled error as an I/O error.
fn sled_io(e: sled::Error) -> io::Error {
    match e {
        sled::Error::Io(e) => e,
        e => io::Error::other(e),
    }
}

/// sled as a [`Disk`]: the trees `log` and `meta` of one database, its
/// files synced for real, and a thread that syncs appends.
pub struct SledDisk {
    db: sled::Db,
    log: sled::Tree,
    meta: sled::Tree,
    files: Arc<DurableFiles>,
    syncer: Syncer,
    /// The mark found when the disk was opened.
    mark: Option<Mark>,
}

/// The sync thread: it takes every append queued by the time it wakes,
/// makes them durable with one flush and sync, and acknowledges them, off
/// the Raft core's path.
struct Syncer {
    /// Where appends queue (`None` once dropped).
    queue: Mutex<Option<mpsc::Sender<PendingAppend>>>,
    /// Joined when the disk is dropped, so that the thread's copy of the
    /// database is closed before the directory can be opened again.
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Syncer {
    fn drop(&mut self) {
        drop(self.queue.lock().map(|mut q| q.take()));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl SledDisk {
    /// The log trees of `db`, the sled database in `dir` (as opened by
    /// [`open_db`]), with `faults` injected into its syncs (tests).
    pub fn open(db: sled::Db, dir: &Path, faults: StorageFaults) -> anyhow::Result<Self> {
        let log = db.open_tree("log")?;
        let meta = db.open_tree("meta")?;
        let (files, mark) = DurableFiles::open(dir, &db, faults)
            .map_err(|e| anyhow::anyhow!("cannot open sled's files in {}: {e}", dir.display()))?;
        let files = Arc::new(files);
        let (queue, pending) = mpsc::channel::<PendingAppend>();
        let (synced_db, synced_files) = (db.clone(), files.clone());
        let thread = std::thread::Builder::new()
            .name("raftlock-log-sync".into())
            .spawn(move || {
                while let Ok(first) = pending.recv() {
                    let mut batch = vec![first];
                    batch.extend(pending.try_iter());
                    let started = Instant::now();
                    let result = synced_files.durable(&synced_db);
                    acknowledge(batch, &result, started);
                }
            })
            .map_err(|e| anyhow::anyhow!("cannot start the log's sync thread: {e}"))?;
        Ok(SledDisk {
            db,
            log,
            meta,
            files,
            syncer: Syncer {
                queue: Mutex::new(Some(queue)),
                thread: Some(thread),
            },
            mark,
        })
    }
}

impl SledDisk {
    fn write_unmarked(&self, write: Write) -> io::Result<()> {
        match write {
            // One entry (the usual case: a batch of commands) is one sled
            // write. Several go in as one atomic sled batch, so that a
            // crash cannot keep a later one without an earlier one (no
            // holes); but a sled batch costs two extra writes, each with
            // its own `sync_file_range` (it rolls the write buffer before
            // and after its manifest), which a single insert does not
            // need.
            Write::Log(mut entries) if entries.len() == 1 => {
                let (index, bytes) = entries.pop().expect("one entry");
                self.log.insert(index.to_be_bytes(), bytes).map(drop)
            }
            Write::Log(entries) => {
                let mut batch = sled::Batch::default();
                for (index, bytes) in entries {
                    batch.insert(&index.to_be_bytes(), bytes);
                }
                self.log.apply_batch(batch)
            }
            Write::Remove { from, to } => {
                let mut batch = sled::Batch::default();
                for item in self.log.range(from.to_be_bytes()..=to.to_be_bytes()) {
                    let (k, _) = item.map_err(sled_io)?;
                    batch.remove(k);
                }
                self.log.apply_batch(batch)
            }
            Write::Meta(key, value) => self.meta.insert(key.as_bytes(), value).map(drop),
        }
        .map_err(sled_io)
    }
}

impl Disk for SledDisk {
    fn write(&self, write: Write) -> io::Result<()> {
        // Appends past the end cannot touch the mark: no lock for them.
        let past_end = match &write {
            Write::Log(entries) => match (entries.first(), self.log.last().map_err(sled_io)?) {
                (Some((first, _)), Some((last, _))) => *first > index_of(&last),
                _ => true,
            },
            Write::Remove { .. } => false,
            Write::Meta(..) => true,
        };
        if past_end {
            self.write_unmarked(write)
        } else {
            self.files
                .write_marked(write, |write| self.write_unmarked(write))
        }
    }

    fn opened_mark(&self) -> Option<Mark> {
        self.mark.clone()
    }

    fn sync(&self) -> SyncFuture {
        let (db, files) = (self.db.clone(), self.files.clone());
        Box::pin(async move {
            crate::blocking::spawn(move || files.durable(&db))
                .await
                .map_err(io::Error::other)?
        })
    }

    fn sync_later(&self, append: PendingAppend) -> io::Result<()> {
        let queue = self.syncer.queue.lock().expect("syncer lock poisoned");
        match queue.as_ref().map(|q| q.send(append)) {
            Some(Ok(())) => Ok(()),
            _ => Err(io::Error::other("the log's sync thread stopped")),
        }
    }

    fn entry(&self, index: u64) -> io::Result<Option<Vec<u8>>> {
        Ok(self
            .log
            .get(index.to_be_bytes())
            .map_err(sled_io)?
            .map(|v| v.to_vec()))
    }

    fn entries(&self, start: u64, end: Bound<u64>) -> io::Result<Vec<Vec<u8>>> {
        let end = match end {
            Bound::Included(i) => Bound::Included(i.to_be_bytes()),
            Bound::Excluded(i) => Bound::Excluded(i.to_be_bytes()),
            Bound::Unbounded => Bound::Unbounded,
        };
        self.log
            .range((Bound::Included(start.to_be_bytes()), end))
            .map(|item| item.map(|(_, v)| v.to_vec()).map_err(sled_io))
            .collect()
    }

    fn last_entry(&self) -> io::Result<Option<Vec<u8>>> {
        Ok(self.log.last().map_err(sled_io)?.map(|(_, v)| v.to_vec()))
    }

    fn log_is_empty(&self) -> io::Result<bool> {
        Ok(self.log.is_empty())
    }

    fn meta(&self, key: &'static str) -> io::Result<Option<Vec<u8>>> {
        Ok(self
            .meta
            .get(key.as_bytes())
            .map_err(sled_io)?
            .map(|v| v.to_vec()))
    }

    fn first_failure(&self) -> Arc<OnceLock<String>> {
        self.files.first_failure.clone()
    }
}
