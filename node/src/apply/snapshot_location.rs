//! Where a node keeps its latest snapshot, and the two operations on it:
//! read the whole file, and replace it atomically and durably.
//!
//! Real nodes keep a file in their data directory; the deterministic
//! simulator keeps it on its simulated disk ([`MemDisk`]), where it can be
//! torn or corrupted while the node is down, so that the checksum's refusal
//! is tested the same way on every seed. Unit tests keep it in memory.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::raft::log_store::MemDisk;

/// Where the latest snapshot is kept.
#[derive(Clone, Debug)]
pub enum SnapshotLocation {
    /// In memory only, lost with the process (unit tests).
    Memory,
    /// A file on disk (`<data-dir>/snapshot.bin`), replaced through a
    /// temporary file, `fdatasync`, rename and a sync of the directory.
    File(PathBuf),
    /// The snapshot file of a simulated disk (the simulator).
    Simulated(MemDisk),
}

/// Bytes of snapshot written between two `fdatasync`s.
const SYNC_CHUNK: usize = 4 << 20;

impl SnapshotLocation {
    /// What to call the file in an error message.
    pub fn describe(&self) -> String {
        match self {
            SnapshotLocation::Memory => "the snapshot in memory".into(),
            SnapshotLocation::File(path) => path.display().to_string(),
            SnapshotLocation::Simulated(_) => "the simulated disk's snapshot file".into(),
        }
    }

    /// The file's bytes (`None`: no file yet, or kept in memory). Blocking
    /// for a real file: call it through [`crate::blocking::spawn`] on a
    /// runtime.
    pub fn read(&self) -> io::Result<Option<Vec<u8>>> {
        match self {
            SnapshotLocation::Memory => Ok(None),
            SnapshotLocation::File(path) => match std::fs::read(path) {
                Ok(bytes) => Ok(Some(bytes)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e),
            },
            SnapshotLocation::Simulated(disk) => Ok(disk.snapshot_file()),
        }
    }

    /// Makes `bytes` the file, atomically (a crash leaves the old file or
    /// the new one, whole) and durably (synced before this returns); hands
    /// the bytes back. [`SnapshotLocation::Memory`] keeps nothing here (the
    /// caller keeps the bytes).
    pub async fn replace(&self, bytes: Vec<u8>) -> io::Result<Vec<u8>> {
        match self {
            SnapshotLocation::Memory => Ok(bytes),
            SnapshotLocation::File(path) => {
                let path = path.clone();
                crate::blocking::spawn(move || write_durably(&path, &bytes).map(|()| bytes))
                    .await
                    .map_err(io::Error::other)?
            }
            SnapshotLocation::Simulated(disk) => {
                disk.replace_snapshot_file(&bytes).await?;
                Ok(bytes)
            }
        }
    }
}

/// Writes `bytes` to `path` atomically and durably (temp file, fsync,
/// rename, fsync of the directory).
///
/// A large snapshot is synced in chunks of [`SYNC_CHUNK`]: one fsync at the
/// end would leave ~100 MB (1M held locks) of dirty pages, and the log's own
/// fsyncs, which every write waits for, would queue behind their writeback.
fn write_durably(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        for chunk in bytes.chunks(SYNC_CHUNK) {
            f.write_all(chunk)?;
            f.sync_data()?;
        }
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
