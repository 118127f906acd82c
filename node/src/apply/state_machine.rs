//! openraft's state-machine store: applies committed entries to the shared
//! [`LockTable`](crate::state::LockTable), builds and installs snapshots.
//!
//! The table itself lives in memory ([`Shared`]); durability comes from the
//! log plus snapshots: at start-up the latest snapshot is loaded and openraft
//! re-applies the committed log after it.

use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use futures::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{OptionalSend, RaftSnapshotBuilder};
use serde::{Deserialize, Serialize};

use super::snapshot_location::SnapshotLocation;
use super::Shared;
use crate::raft::{
    Applied, EntryPayload, LogId, Snapshot, SnapshotData, SnapshotMeta, StoredMembership,
    TypeConfig,
};
use crate::state::LockTable;

/// A snapshot as stored on disk and sent to lagging nodes.
#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    meta: SnapshotMeta,
    /// [`LockTable::to_snapshot`] bytes.
    table: Vec<u8>,
}

/// Version byte at the start of a snapshot file. Version 2 ends with a
/// CRC32 (little-endian) of everything before it.
const SNAPSHOT_FILE_VERSION: u8 = 2;

/// Bytes of the checksum at the end of a snapshot file.
const CHECKSUM_LEN: usize = 4;

/// The state-machine store handed to openraft.
pub struct StateMachineStore {
    shared: Arc<Shared>,
    /// Where the latest snapshot is kept.
    location: SnapshotLocation,
    /// What snapshot building and this store share.
    snap: Arc<SnapshotShared>,
}

/// Coordination between the apply path and the snapshot builder (which
/// openraft runs in a task of its own).
#[derive(Default)]
struct SnapshotShared {
    /// Serializes writes of the snapshot file (they share its temp file).
    file: tokio::sync::Mutex<()>,
    /// Size of the last snapshot built, to size the next one's buffer.
    last_len: AtomicUsize,
    /// What the snapshot file on disk covers: its last log index + 1 (0: no
    /// file). Shared with the log store, which never purges past it (see
    /// [`LogStore::with_snapshot_floor`](crate::raft::log_store::LogStore::with_snapshot_floor)).
    persisted: Arc<AtomicU64>,
}

/// Encodes a snapshot file of `table` straight into one buffer: the bytes of
/// `SnapshotFile { meta, table: table.to_snapshot() }` under bincode, but
/// without the intermediate `to_snapshot()` copy (the table's bytes are
/// written in place and their length prefix patched afterwards).
fn encode_snapshot_file(meta: &SnapshotMeta, table: &LockTable, capacity: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(capacity);
    out.push(SNAPSHOT_FILE_VERSION);
    crate::codec::encode_into(&mut out, meta).expect("snapshot meta serializes");
    // bincode writes a `Vec<u8>` as its length (u64, little-endian), then
    // the bytes.
    let len_at = out.len();
    out.extend_from_slice(&0u64.to_le_bytes());
    table.encode_snapshot_into(&mut out);
    let len = (out.len() - len_at - 8) as u64;
    out[len_at..len_at + 8].copy_from_slice(&len.to_le_bytes());
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The file's bytes without their checksum, if the checksum matches.
fn checked(bytes: &[u8]) -> Result<&[u8], String> {
    if bytes.first() != Some(&SNAPSHOT_FILE_VERSION) {
        return match bytes.first() {
            None => Err("empty snapshot".into()),
            Some(v) => Err(format!(
                "unsupported snapshot file version {v} (this build reads {SNAPSHOT_FILE_VERSION})"
            )),
        };
    }
    let Some(body_len) = bytes.len().checked_sub(CHECKSUM_LEN) else {
        return Err("truncated snapshot".into());
    };
    let (body, crc) = bytes.split_at(body_len);
    let stored = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
    let computed = crc32fast::hash(body);
    if stored != computed {
        return Err(format!(
            "snapshot checksum mismatch (stored {stored:08x}, computed {computed:08x}): the file is corrupt"
        ));
    }
    Ok(body)
}

fn decode_snapshot(bytes: &[u8]) -> Result<SnapshotFile, String> {
    let bytes = checked(bytes)?;
    match bytes.split_first() {
        Some((&SNAPSHOT_FILE_VERSION, rest)) => {
            crate::codec::decode(rest).map_err(|e| format!("corrupt snapshot: {e}"))
        }
        Some((v, _)) => Err(format!("unsupported snapshot version {v}")),
        None => Err("empty snapshot".into()),
    }
}

/// Checks a snapshot a leader sends before it is installed: the file's
/// checksum and format, that its meta is the one the leader announced, and
/// that its table decodes and keeps every invariant. An install that
/// failed any of these would stop the Raft core (a storage error), so a
/// peer's bad snapshot is refused here instead. Slow for a large table:
/// call it off the runtime's threads.
pub fn check_snapshot(meta: &SnapshotMeta, bytes: &[u8]) -> Result<(), String> {
    let file = decode_snapshot(bytes)?;
    if file.meta != *meta {
        return Err(format!(
            "the snapshot's file covers {:?}, not {:?} as its head says",
            file.meta.last_log_id, meta.last_log_id
        ));
    }
    LockTable::from_snapshot(&file.table)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// The meta of a snapshot file, without copying out the table's bytes.
fn decode_snapshot_meta(bytes: &[u8]) -> Result<SnapshotMeta, String> {
    let bytes = checked(bytes)?;
    match bytes.split_first() {
        Some((&SNAPSHOT_FILE_VERSION, mut rest)) => {
            // `SnapshotFile` starts with its meta; reading from a reader
            // stops there.
            crate::codec::decode_from(&mut rest).map_err(|e| format!("corrupt snapshot: {e}"))
        }
        Some((v, _)) => Err(format!("unsupported snapshot version {v}")),
        None => Err("empty snapshot".into()),
    }
}

/// The last log index a snapshot file covers, if its checksum and format
/// are good (for a simulator's oracles: what a node's snapshot file holds
/// it need not keep in its log).
pub fn snapshot_file_index(bytes: &[u8]) -> Option<u64> {
    decode_snapshot_meta(bytes)
        .ok()?
        .last_log_id
        .map(|l| l.index)
}

impl StateMachineStore {
    /// A store over `shared`, loading the snapshot kept at `location` (if
    /// there is one) into the shared table. A file that fails its checksum
    /// or does not decode is refused: the node does not start.
    pub fn open(shared: Arc<Shared>, location: SnapshotLocation) -> anyhow::Result<Self> {
        let snap = Arc::new(SnapshotShared::default());
        if let Some(bytes) = location.read()? {
            let refuse = |e: String| {
                anyhow::anyhow!(
                    "{}: {e}. This node's data cannot be trusted: remove it from the \
                     cluster (`raftlock members remove ID`), empty its data directory and \
                     add it back as a new node (`raftlock members add`)",
                    location.describe()
                )
            };
            let file = decode_snapshot(&bytes).map_err(refuse)?;
            let table = LockTable::from_snapshot(&file.table).map_err(|e| refuse(e.to_string()))?;
            snap.persisted.store(covered(&file.meta), Ordering::SeqCst);
            shared.install(
                table,
                file.meta.last_log_id,
                file.meta.last_membership.clone(),
            );
            // The bytes stay on disk only: `get_current_snapshot` reads
            // the file when a follower needs it.
        }
        Ok(StateMachineStore {
            shared,
            location,
            snap,
        })
    }

    /// What the snapshot file on disk covers (its last log index + 1; 0: no
    /// file), for the log store's purges.
    pub fn persisted_snapshot(&self) -> Arc<AtomicU64> {
        self.snap.persisted.clone()
    }

    /// A store with no snapshot file, for unit tests.
    #[cfg(test)]
    pub fn new(_db: sled::Db, shared: Arc<Shared>) -> anyhow::Result<Self> {
        Self::open(shared, SnapshotLocation::Memory)
    }

    async fn persist(&mut self, bytes: Vec<u8>) -> io::Result<Vec<u8>> {
        persist(&self.shared, &self.snap, &self.location, bytes).await
    }
}

/// Makes `bytes` the latest snapshot: written durably at `location`, or,
/// kept in memory (unit tests). Hands the bytes back.
async fn persist(
    shared: &Shared,
    snap: &SnapshotShared,
    location: &SnapshotLocation,
    bytes: Vec<u8>,
) -> io::Result<Vec<u8>> {
    let covers = decode_snapshot_meta(&bytes)
        .map(|m| covered(&m))
        .map_err(io::Error::other)?;
    if let SnapshotLocation::Memory = location {
        shared.set_snapshot(Arc::new(bytes.clone()));
        snap.persisted.fetch_max(covers, Ordering::SeqCst);
        return Ok(bytes);
    }
    let _file = snap.file.lock().await;
    // The builder encodes from the table while an install may persist a
    // newer snapshot meanwhile: the newer file stays (the log behind it may
    // be purged already).
    if covers < snap.persisted.load(Ordering::SeqCst) {
        return Ok(bytes);
    }
    let bytes = location.replace(bytes).await?;
    snap.persisted.store(covers, Ordering::SeqCst);
    Ok(bytes)
}

/// What a snapshot covers: its last log index + 1 (0 for an empty one).
fn covered(meta: &SnapshotMeta) -> u64 {
    meta.last_log_id.map_or(0, |l| l.index + 1)
}

/// Builds a snapshot of the table at one applied index.
pub struct SnapshotBuilder {
    shared: Arc<Shared>,
    location: SnapshotLocation,
    snap: Arc<SnapshotShared>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> io::Result<Snapshot> {
        // The table is encoded in place, under its read lock, so the
        // snapshot is of one applied index and no copy of a large table is
        // made (cloning the table costs about twice as much as encoding it).
        // Applies wait for the encoding at the gate, as parked tasks; reads
        // go on. The encoding runs on a blocking thread, not on one of the
        // runtime's workers.
        let gate = self.shared.snapshot_gate.clone().write_owned().await;
        let shared = self.shared.clone();
        let capacity = self.snap.last_len.load(Ordering::Relaxed);
        let (meta, bytes) = crate::blocking::spawn(move || {
            let _gate = gate;
            shared.read(|applied| {
                let meta = SnapshotMeta {
                    last_log_id: applied.last_applied,
                    last_membership: applied.membership.clone(),
                };
                // Room for some growth, so the buffer is not reallocated (and
                // copied) while the lock is held.
                let bytes = encode_snapshot_file(&meta, &applied.table, capacity + capacity / 8);
                (meta, bytes)
            })
        })
        .await
        .map_err(io::Error::other)?;
        self.snap.last_len.store(bytes.len(), Ordering::Relaxed);
        let bytes = persist(&self.shared, &self.snap, &self.location, bytes).await?;
        Ok(Snapshot {
            meta,
            snapshot: bytes,
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> io::Result<(Option<LogId>, StoredMembership)> {
        Ok(self
            .shared
            .read(|applied| (applied.last_applied, applied.membership.clone())))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> io::Result<()>
    where
        Strm: Stream<Item = io::Result<EntryResponder<TypeConfig>>> + Unpin + OptionalSend,
    {
        // Waits here, as a parked task, while a snapshot is being encoded.
        let _gate = self.shared.snapshot_gate.read().await;
        let stages = &self.shared.metrics.stages;
        while let Some((entry, responder)) = entries.try_next().await? {
            let index = entry.log_id.index;
            stages.applying(index, index, tokio::time::Instant::now());
            let responses = match entry.payload {
                EntryPayload::Blank => {
                    self.shared.advance(entry.log_id, None);
                    Vec::new()
                }
                EntryPayload::Normal(batch) => self.shared.apply(entry.log_id, batch),
                EntryPayload::Membership(m) => {
                    self.shared.advance(
                        entry.log_id,
                        Some(StoredMembership::new(Some(entry.log_id), m)),
                    );
                    Vec::new()
                }
            };
            stages.applied(index, index, tokio::time::Instant::now());
            if let Some(responder) = responder {
                // The writer's answer goes out from here, as soon as its
                // entry is applied.
                responder.send(Applied { index, responses });
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            shared: self.shared.clone(),
            location: self.location.clone(),
            snap: self.snap.clone(),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> io::Result<()> {
        let bytes = snapshot;
        let bad = |e: String| io::Error::new(io::ErrorKind::InvalidData, e);
        // Decoding and checking a large table takes a while (seconds at 1M
        // held locks): not on a runtime thread, where it would hold up
        // heartbeats and requests.
        let (table, bytes) = crate::blocking::spawn(move || {
            let table = decode_snapshot(&bytes)
                .and_then(|file| LockTable::from_snapshot(&file.table).map_err(|e| e.to_string()));
            (table, bytes)
        })
        .await
        .map_err(|e| bad(e.to_string()))?;
        let table = table.map_err(bad)?;
        self.persist(bytes).await?;
        let _gate = self.shared.snapshot_gate.read().await;
        self.shared
            .install(table, meta.last_log_id, meta.last_membership.clone());
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> io::Result<Option<Snapshot>> {
        // The latest snapshot is its file (read when a follower needs it,
        // not kept in memory), or, without a file (unit tests), the bytes in
        // memory.
        let bytes = match &self.location {
            SnapshotLocation::Memory => match self.shared.snapshot() {
                Some(bytes) => bytes.as_ref().clone(),
                None => return Ok(None),
            },
            location => {
                let location = location.clone();
                match crate::blocking::spawn(move || location.read())
                    .await
                    .map_err(io::Error::other)??
                {
                    Some(bytes) => bytes,
                    None => return Ok(None),
                }
            }
        };
        let meta = decode_snapshot_meta(&bytes).map_err(io::Error::other)?;
        Ok(Some(Snapshot {
            meta,
            snapshot: bytes,
        }))
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod file_tests;

#[cfg(test)]
mod persist_tests;

/// A crash at every step of installing a snapshot, in both orders openraft
/// may run its purge and our write: the node must restart from what is on
/// disk (review finding 7).
#[cfg(test)]
mod install_crash_tests;
