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
mod tests {
    use super::*;
    use crate::state::{cmd, Command, LockName, Mode, SessionId};

    #[test]
    fn snapshot_file_is_encoded_in_place_with_the_same_bytes() {
        let mut table = LockTable::new();
        table.apply(
            1,
            Command::OpenSessionV0(cmd::OpenSessionV0 {
                ttl_ms: 10_000,
                lock_delay_ms: 0,
                nonce: 7,
                owner: String::new(),
            }),
        );
        table.apply(
            2,
            Command::Acquire(cmd::Acquire {
                session: SessionId(1),
                seq: 1,
                name: LockName::new("a").expect("valid name"),
                mode: Mode::Exclusive,
                timeout_ms: 0,
                value: b"v".to_vec(),
                caller: String::new(),
            }),
        );
        let meta = SnapshotMeta {
            last_log_id: Some(crate::raft::log_id(3, 1, 2)),
            last_membership: StoredMembership::default(),
        };
        let mut old = vec![SNAPSHOT_FILE_VERSION];
        crate::codec::encode_into(
            &mut old,
            &SnapshotFile {
                meta: meta.clone(),
                table: table.to_snapshot(),
            },
        )
        .expect("serializes");
        let crc = crc32fast::hash(&old);
        old.extend_from_slice(&crc.to_le_bytes());
        for capacity in [0, 16, 1 << 20] {
            assert_eq!(encode_snapshot_file(&meta, &table, capacity), old);
        }
        assert_eq!(decode_snapshot_meta(&old).expect("meta"), meta);
        let file = decode_snapshot(&old).expect("decodes");
        assert_eq!(LockTable::from_snapshot(&file.table).expect("table"), table);
    }
}

#[cfg(test)]
mod file_tests {
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
}

#[cfg(test)]
mod persist_tests {
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
}

/// A crash at every step of installing a snapshot, in both orders openraft
/// may run its purge and our write: the node must restart from what is on
/// disk (review finding 7).
#[cfg(test)]
mod install_crash_tests {
    use std::path::Path;

    use openraft::storage::{RaftLogReader, RaftLogStorage};

    use super::*;
    use crate::raft::log_store::{open_db, LogStore};

    fn log_id(index: u64) -> LogId {
        crate::raft::log_id(1, 1, index)
    }

    fn file_at(index: u64) -> Vec<u8> {
        let meta = SnapshotMeta {
            last_log_id: Some(log_id(index)),
            last_membership: StoredMembership::default(),
        };
        encode_snapshot_file(&meta, &LockTable::new(), 0)
    }

    #[derive(Clone, Copy, Debug)]
    enum Step {
        /// openraft saves the snapshot's index as committed.
        Commit,
        /// openraft purges the log up to the snapshot.
        Purge,
        /// The snapshot's temp file is half written.
        HalfWritten,
        /// The snapshot is written, synced and renamed into place.
        Persisted,
    }

    fn stores(dir: &Path) -> (LogStore, StateMachineStore) {
        let sm = StateMachineStore::open(
            Shared::new_for_tests(),
            SnapshotLocation::File(dir.join("snapshot.bin")),
        )
        .expect("state machine opens");
        let sled = dir.join("sled");
        let log = LogStore::new(open_db(&sled).expect("db"), &sled)
            .expect("log")
            .with_snapshot_floor(sm.persisted_snapshot());
        (log, sm)
    }

    /// What openraft needs at start-up: the snapshot loads, the log is not
    /// purged past it, and every entry between it and the commit index is
    /// there to replay.
    async fn restarts(dir: &Path, what: &str) {
        let (mut log, mut sm) = stores(dir);
        let (applied, _) = sm.applied_state().await.expect("applied");
        let applied = applied.map_or(0, |l| l.index);
        let state = log.get_log_state().await.expect("log state");
        let purged = state.last_purged_log_id.map_or(0, |l| l.index);
        assert!(
            purged <= applied,
            "{what}: log purged to {purged} behind a snapshot at {applied}"
        );
        let committed = log
            .read_committed()
            .await
            .expect("committed")
            .map_or(0, |l| l.index);
        if committed > applied {
            let entries = log
                .try_get_log_entries(applied + 1..=committed)
                .await
                .expect("read");
            assert_eq!(
                entries.len() as u64,
                committed - applied,
                "{what}: entries {}..={committed} missing for the replay",
                applied + 1
            );
        }
    }

    #[tokio::test]
    async fn a_crash_at_any_step_of_an_install_leaves_a_node_that_restarts() {
        use Step::*;
        let orders = [
            [Commit, Purge, HalfWritten, Persisted],
            [Commit, HalfWritten, Persisted, Purge],
        ];
        for order in orders {
            for crash_after in 0..=order.len() {
                let dir = tempfile::tempdir().expect("dir");
                // Before: a snapshot at 5 on disk, entries 1..=8, committed 8.
                {
                    let (mut log, sm) = stores(dir.path());
                    persist(&sm.shared, &sm.snap, &sm.location, file_at(5))
                        .await
                        .expect("old snapshot");
                    log.write_for_tests((1..=8u64).map(|i| crate::raft::Entry {
                        log_id: log_id(i),
                        payload: crate::raft::EntryPayload::Blank,
                    }));
                    log.save_committed(Some(log_id(8))).await.expect("commit");
                }
                let what = format!("{order:?} crashed after {crash_after} steps");
                {
                    // The install of a snapshot at 20, cut short.
                    let (mut log, sm) = stores(dir.path());
                    for step in &order[..crash_after] {
                        match step {
                            Commit => log.save_committed(Some(log_id(20))).await.expect("commit"),
                            Purge => log.purge(log_id(20)).await.expect("purge"),
                            HalfWritten => {
                                let bytes = file_at(20);
                                std::fs::write(
                                    dir.path().join("snapshot.tmp"),
                                    &bytes[..bytes.len() / 2],
                                )
                                .expect("tmp");
                            }
                            Persisted => {
                                persist(&sm.shared, &sm.snap, &sm.location, file_at(20))
                                    .await
                                    .expect("persist");
                            }
                        }
                    }
                }
                restarts(dir.path(), &what).await;
            }
        }
    }
}
