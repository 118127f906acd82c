//! The simulator's disk: in memory, no threads, no files, time from
//! tokio (`jepsen/sim`).
//!
//! It keeps what a real disk does after a crash: every write is *pending*
//! until a sync makes it, and everything written before it, *durable*.
//! [`MemDisk::crash`] keeps the durable image plus a prefix of the pending
//! writes of the caller's choosing (the kernel may have written back some
//! of them on its own, in order) and drops the rest, as a power loss does.
//! A sync error sticks: once one sync has failed, every later one fails
//! too (as sled's disk does). A full disk ([`MemDisk::fill`]) refuses
//! writes with `ENOSPC` and changes nothing, until [`MemDisk::heal`]: space
//! comes back, and the next process (or the same, if nothing stopped it)
//! writes again; one that says so only at the sync
//! ([`MemDisk::fill_at_sync`]) fails the sync, and that error sticks as any
//! other. The disk also holds the node's snapshot file, replaced whole or
//! not at all, which a simulator may tear or corrupt while the node is down
//! ([`MemDisk::tear_snapshot_file`], [`MemDisk::corrupt_snapshot_file`]):
//! the checksum must refuse it.
//!
//! The log store over it is production's ([`LogStore`](super::LogStore));
//! appends are synced by a task (it takes every append queued meanwhile,
//! waits the disk's sync latency, syncs once and acknowledges them), as
//! sled's disk does with a thread.

use std::collections::BTreeMap;
use std::io;
use std::ops::Bound;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use std::collections::VecDeque;

use super::mark::Mark;
use super::{acknowledge, note_failure, Disk, PendingAppend, SyncFuture, Write, KEY_VOTE};

/// How many durable writes [`MemDisk::lose_newest`] can take back.
const UNDOABLE: usize = 64;

/// What the disk holds: the log by index and the meta keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Image {
    log: BTreeMap<u64, Vec<u8>>,
    meta: BTreeMap<&'static str, Vec<u8>>,
}

/// What undoes one write made durable.
#[derive(Debug)]
enum Undo {
    /// Entries as they were (`None`: absent).
    Log(Vec<(u64, Option<Vec<u8>>)>),
    /// A meta key as it was.
    Meta(&'static str, Option<Vec<u8>>),
}

impl Image {
    /// Applies `write` and returns what undoes it.
    fn apply_undoable(&mut self, write: &Write) -> Undo {
        let undo = match write {
            Write::Log(entries) => Undo::Log(
                entries
                    .iter()
                    .map(|(i, _)| (*i, self.log.get(i).cloned()))
                    .collect(),
            ),
            Write::Remove { from, to } => Undo::Log(
                self.log
                    .range(*from..=*to)
                    .map(|(i, v)| (*i, Some(v.clone())))
                    .collect(),
            ),
            Write::Meta(key, _) => Undo::Meta(key, self.meta.get(key).cloned()),
        };
        self.apply(write);
        undo
    }

    fn undo(&mut self, undo: Undo) {
        match undo {
            Undo::Log(entries) => {
                for (i, was) in entries {
                    match was {
                        Some(v) => self.log.insert(i, v),
                        None => self.log.remove(&i),
                    };
                }
            }
            Undo::Meta(key, Some(v)) => {
                self.meta.insert(key, v);
            }
            Undo::Meta(key, None) => {
                self.meta.remove(key);
            }
        }
    }

    /// The mark of this image (see [`super::mark`]).
    fn mark(&self) -> Mark {
        Mark::of(
            self.log.last_key_value().map(|(i, v)| (*i, v.as_slice())),
            self.meta.get(KEY_VOTE).cloned(),
        )
    }

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
    /// Crashes so far.
    crashes: u64,
    /// Snapshot files written so far.
    snapshot_files: u64,
    /// What undoes the newest durable writes, oldest first.
    undo: VecDeque<Undo>,
    /// The mark ([`super::mark`]): kept apart from the log, durable as
    /// soon as it is written.
    mark: Option<Mark>,
}

impl DiskState {
    /// Makes `write` durable, keeping what undoes it.
    fn make_durable(&mut self, write: &Write) {
        let undo = self.durable.apply_undoable(write);
        if self.undo.len() == UNDOABLE {
            self.undo.pop_front();
        }
        self.undo.push_back(undo);
    }
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
        s.snapshot_files += 1;
        Ok(())
    }

    /// How many snapshot files have replaced the one before (for a
    /// simulator's oracles: read the file again only when it changed).
    pub fn snapshot_files_written(&self) -> u64 {
        self.state().snapshot_files
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

    /// The vote on the disk as reads see it now (for a simulator's
    /// oracles: a node never forgets a vote it acted on). `None` when
    /// there is none, or it does not decode.
    pub fn vote(&self) -> Option<super::Vote> {
        let bytes = self.state().live.meta.get(super::KEY_VOTE).cloned()?;
        super::decode(&bytes).ok()
    }

    /// The log id of the entry at `index` as reads see it now, if it is
    /// there and decodes (for a simulator's oracles).
    pub fn log_id(&self, index: u64) -> Option<super::LogId> {
        let bytes = self.log_entry(index)?;
        super::decode::<super::Entry>(&bytes).ok().map(|e| e.log_id)
    }

    /// The index up to which the log was purged (behind a snapshot), as
    /// reads see it now; 0 when nothing was.
    pub fn purged_index(&self) -> u64 {
        let bytes = self.state().live.meta.get(super::KEY_LAST_PURGED).cloned();
        bytes
            .and_then(|b| super::decode::<super::LogId>(&b).ok())
            .map_or(0, |l| l.index)
    }

    /// How many times the disk has crashed ([`MemDisk::crash`]).
    pub fn crashes(&self) -> u64 {
        self.state().crashes
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
            s.make_durable(write);
        }
        s.live = s.durable.clone();
        s.failed = None;
        s.crashes += 1;
    }

    /// Damage at rest, found by a node that was down: the newest `count`
    /// durable writes (at most the last 64) are gone, as sled loses what
    /// follows a damaged or truncated part of its file; the mark is kept
    /// (it lives in a file of its own). Returns how many were lost.
    pub fn lose_newest(&self, count: usize) -> usize {
        let mut s = self.state();
        let mut lost = 0;
        while lost < count {
            let Some(undo) = s.undo.pop_back() else { break };
            s.durable.undo(undo);
            lost += 1;
        }
        s.pending.clear();
        s.live = s.durable.clone();
        lost
    }

    fn write(&self, write: Write) -> io::Result<()> {
        let mut s = self.state();
        if s.full {
            return Err(io::Error::from_raw_os_error(28));
        }
        // A write that removes or replaces the entry the mark names lowers
        // the mark first (see `super::mark`).
        let lower = s
            .mark
            .as_ref()
            .and_then(|m| m.before(&write, |i| s.live.log.get(&i).cloned()));
        if lower.is_some() {
            s.mark = lower;
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
            s.make_durable(write);
        }
        s.mark = Some(s.durable.mark());
        Ok(())
    }

    /// [`sync`](Self::sync), its failure kept in `first` if it is the
    /// process's first.
    async fn sync_noting(&self, first: &OnceLock<String>) -> io::Result<()> {
        let result = self.sync().await;
        note_failure(first, &result);
        result
    }

    /// Opens the disk for one process's log store: its syncer is a task in
    /// the current tokio runtime.
    pub(super) fn open(&self) -> Arc<dyn Disk> {
        let (queue, mut waiting) = tokio::sync::mpsc::unbounded_channel::<PendingAppend>();
        let first_failure = Arc::new(OnceLock::new());
        let (disk, failure) = (self.clone(), first_failure.clone());
        tokio::spawn(async move {
            while let Some(first) = waiting.recv().await {
                let mut batch = vec![first];
                while let Ok(more) = waiting.try_recv() {
                    batch.push(more);
                }
                let started = Instant::now();
                let result = disk.sync_noting(&failure).await;
                acknowledge(batch, &result, started);
            }
        });
        Arc::new(Opened {
            disk: self.clone(),
            queue,
            first_failure,
            mark: self.state().mark.clone(),
        })
    }
}

/// A [`MemDisk`] as one process's log store sees it.
struct Opened {
    disk: MemDisk,
    /// Where appends wait for the sync task.
    queue: tokio::sync::mpsc::UnboundedSender<PendingAppend>,
    /// The first failed sync's error of this process.
    first_failure: Arc<OnceLock<String>>,
    /// The mark when the process opened the disk.
    mark: Option<Mark>,
}

impl Disk for Opened {
    fn write(&self, write: Write) -> io::Result<()> {
        self.disk.write(write)
    }

    fn sync(&self) -> SyncFuture {
        let (disk, failure) = (self.disk.clone(), self.first_failure.clone());
        Box::pin(async move { disk.sync_noting(&failure).await })
    }

    fn sync_later(&self, append: PendingAppend) -> io::Result<()> {
        self.queue
            .send(append)
            .map_err(|_| io::Error::other("the log's sync task stopped"))
    }

    fn entry(&self, index: u64) -> io::Result<Option<Vec<u8>>> {
        Ok(self.disk.state().live.log.get(&index).cloned())
    }

    fn entries(&self, start: u64, end: Bound<u64>) -> io::Result<Vec<Vec<u8>>> {
        let s = self.disk.state();
        Ok(s.live
            .log
            .range((Bound::Included(start), end))
            .map(|(_, v)| v.clone())
            .collect())
    }

    fn last_entry(&self) -> io::Result<Option<Vec<u8>>> {
        Ok(self
            .disk
            .state()
            .live
            .log
            .last_key_value()
            .map(|(_, v)| v.clone()))
    }

    fn log_is_empty(&self) -> io::Result<bool> {
        Ok(self.disk.state().live.log.is_empty())
    }

    fn meta(&self, key: &'static str) -> io::Result<Option<Vec<u8>>> {
        Ok(self.disk.state().live.meta.get(key).cloned())
    }

    fn first_failure(&self) -> Arc<OnceLock<String>> {
        self.first_failure.clone()
    }

    fn opened_mark(&self) -> Option<Mark> {
        self.mark.clone()
    }
}
