//! openraft's state-machine store: applies committed entries to the shared
//! [`LockTable`](crate::state::LockTable), builds and installs snapshots.
//!
//! The table itself lives in memory ([`Shared`]); durability comes from the
//! log plus snapshots: at start-up the latest snapshot is loaded and openraft
//! re-applies the committed log after it.

use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, ErrorSubject, ErrorVerb, LogId, OptionalSend,
    RaftSnapshotBuilder, SnapshotMeta, StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};

use super::{io_err, Applied, NodeId, StorageError, TypeConfig};
use crate::shared::Shared;
use crate::state::LockTable;

/// A snapshot as stored on disk and sent to lagging nodes.
#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    meta: SnapshotMeta<NodeId, BasicNode>,
    /// [`LockTable::to_snapshot`] bytes.
    table: Vec<u8>,
}

/// Version byte at the start of a snapshot file.
const SNAPSHOT_FILE_VERSION: u8 = 1;

/// The state-machine store handed to openraft.
pub struct StateMachineStore {
    shared: Arc<Shared>,
    /// Where the latest snapshot is kept (`None`: memory only, for tests).
    snapshot_path: Option<PathBuf>,
}

fn encode_snapshot(file: &SnapshotFile) -> Vec<u8> {
    let mut out = vec![SNAPSHOT_FILE_VERSION];
    bincode::serialize_into(&mut out, file).expect("snapshot serializes");
    out
}

fn decode_snapshot(bytes: &[u8]) -> Result<SnapshotFile, String> {
    match bytes.split_first() {
        Some((&SNAPSHOT_FILE_VERSION, rest)) => {
            bincode::deserialize(rest).map_err(|e| format!("corrupt snapshot: {e}"))
        }
        Some((v, _)) => Err(format!("unsupported snapshot version {v}")),
        None => Err("empty snapshot".into()),
    }
}

/// Writes `bytes` to `path` atomically and durably (temp file, fsync,
/// rename, fsync of the directory).
fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

impl StateMachineStore {
    /// A store over `shared`, loading the snapshot at `snapshot_path` (if it
    /// exists) into the shared table.
    pub fn open(shared: Arc<Shared>, snapshot_path: Option<PathBuf>) -> anyhow::Result<Self> {
        if let Some(path) = &snapshot_path {
            if path.exists() {
                let bytes = std::fs::read(path)?;
                let file = decode_snapshot(&bytes).map_err(anyhow::Error::msg)?;
                let table = LockTable::from_snapshot(&file.table)?;
                shared.install(
                    table,
                    file.meta.last_log_id,
                    file.meta.last_membership.clone(),
                );
                shared.set_snapshot(Arc::new(bytes));
            }
        }
        Ok(StateMachineStore {
            shared,
            snapshot_path,
        })
    }

    /// A store with no snapshot file, for unit tests.
    #[cfg(test)]
    pub fn new(_db: sled::Db, shared: Arc<Shared>) -> anyhow::Result<Self> {
        Self::open(shared, None)
    }

    async fn persist(&mut self, bytes: Vec<u8>) -> Result<(), StorageError> {
        let bytes = Arc::new(bytes);
        if let Some(path) = self.snapshot_path.clone() {
            let b = bytes.clone();
            tokio::task::spawn_blocking(move || write_durably(&path, &b))
                .await
                .map_err(|e| io_err(ErrorSubject::Snapshot(None), ErrorVerb::Write, e))?
                .map_err(|e| io_err(ErrorSubject::Snapshot(None), ErrorVerb::Write, e))?;
        }
        self.shared.set_snapshot(bytes);
        Ok(())
    }
}

/// Builds a snapshot from a copy of the table taken at one applied index.
pub struct SnapshotBuilder {
    shared: Arc<Shared>,
    snapshot_path: Option<PathBuf>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        // Encode under the read lock: applies wait for the encoding, but no
        // copy of a large table is made.
        let file = {
            let applied = self.shared.applied.read().expect("applied lock poisoned");
            let last = applied.last_applied;
            let snapshot_id = match last {
                Some(id) => format!(
                    "{}-{}-{}",
                    id.leader_id.term,
                    id.index,
                    applied.table.last_fence().0
                ),
                None => "empty".to_string(),
            };
            SnapshotFile {
                meta: SnapshotMeta {
                    last_log_id: last,
                    last_membership: applied.membership.clone(),
                    snapshot_id,
                },
                table: applied.table.to_snapshot(),
            }
        };
        let bytes = encode_snapshot(&file);
        if let Some(path) = self.snapshot_path.clone() {
            let b = bytes.clone();
            tokio::task::spawn_blocking(move || write_durably(&path, &b))
                .await
                .map_err(|e| io_err(ErrorSubject::Snapshot(None), ErrorVerb::Write, e))?
                .map_err(|e| io_err(ErrorSubject::Snapshot(None), ErrorVerb::Write, e))?;
        }
        self.shared.set_snapshot(Arc::new(bytes.clone()));
        Ok(Snapshot {
            meta: file.meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), StorageError> {
        let applied = self.shared.applied.read().expect("applied lock poisoned");
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut out = Vec::new();
        for entry in entries {
            let index = entry.log_id.index;
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
            out.push(Applied { index, responses });
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            shared: self.shared.clone(),
            snapshot_path: self.snapshot_path.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let bytes = snapshot.into_inner();
        let bad = |e: String| -> StorageError {
            StorageIOError::new(
                ErrorSubject::Snapshot(Some(meta.signature())),
                ErrorVerb::Read,
                openraft::AnyError::error(e),
            )
            .into()
        };
        let file = decode_snapshot(&bytes).map_err(bad)?;
        let table = LockTable::from_snapshot(&file.table).map_err(|e| bad(e.to_string()))?;
        self.persist(bytes).await?;
        self.shared
            .install(table, meta.last_log_id, meta.last_membership.clone());
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        match self.shared.snapshot() {
            None => Ok(None),
            Some(bytes) => {
                let file = decode_snapshot(&bytes).map_err(|e| {
                    StorageError::from(StorageIOError::new(
                        ErrorSubject::Snapshot(None),
                        ErrorVerb::Read,
                        openraft::AnyError::error(e),
                    ))
                })?;
                Ok(Some(Snapshot {
                    meta: file.meta,
                    snapshot: Box::new(Cursor::new(bytes.as_ref().clone())),
                }))
            }
        }
    }
}
