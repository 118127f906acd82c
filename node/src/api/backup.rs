//! Backups on the node's side: `Backup` wraps the lock table in the
//! checksummed backup file ([`raftlock_proto::backup`]); every restore
//! (`Restore`, `raftlockd restore`, the bootstrap seed) runs [`check`]
//! before anything else. The lock table's own snapshot encoding
//! (`state::view`) is untouched: the backup is a layer around it.

use std::ops::Range;

use raftlock_proto::backup::{self, Backup, Header};

use crate::state::LockTable;

/// A backup that passed every check: checksum, format, and a lock table
/// that decodes, keeps its invariants and agrees with the header.
#[derive(Debug)]
pub struct Checked {
    /// Its header; `None` for a backup written before backup format 1
    /// (a bare lock table, without checksum).
    pub header: Option<Header>,
    /// The lock table.
    pub table: LockTable,
    /// Where the lock table's bytes are in the file (what a restore
    /// proposes).
    pub table_range: Range<usize>,
}

impl Checked {
    /// The default fence bump of restoring this backup now, by this
    /// machine's clock (see [`default_restore_fence_bump`]).
    ///
    /// [`default_restore_fence_bump`]: crate::state::limits::default_restore_fence_bump
    pub fn default_fence_bump_now(&self) -> u64 {
        let now_unix_micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        crate::state::limits::default_restore_fence_bump(
            self.table.last_fence().0,
            self.header.as_ref().map(|h| h.created_unix_secs),
            now_unix_micros,
        )
    }
}

/// Checks `bytes` as a backup file. The message of an error says what is
/// wrong: `corrupt backup: ...` for a damaged file (a checksum or header
/// that does not hold), `not a raftlock backup: ...` for other bytes,
/// `backup format N was written by a newer raftlock` for an intact backup
/// this build cannot read.
pub fn check(bytes: &[u8]) -> Result<Checked, String> {
    let decoded = backup::decode(bytes).map_err(|e| e.to_string())?;
    let table_bytes = decoded.table();
    let start = table_bytes.as_ptr() as usize - bytes.as_ptr() as usize;
    let table_range = start..start + table_bytes.len();
    match decoded {
        Backup::Checked { header, table, .. } => {
            // The checksum holds, so a table that does not decode was
            // written that way: still call it what it is for the operator.
            let table = LockTable::from_snapshot(table)
                .map_err(|e| format!("corrupt backup: its checksum holds, but {e}"))?;
            let stats = table.stats();
            let said = (header.sessions, header.grants, header.last_fence);
            let holds = (stats.sessions, stats.grants, stats.last_fence);
            if said != holds {
                return Err(format!(
                    "corrupt backup: the header says {} sessions, {} grants and last fence {}, \
                     the lock table holds {}, {} and {}",
                    said.0, said.1, said.2, holds.0, holds.1, holds.2
                ));
            }
            Ok(Checked {
                header: Some(header),
                table,
                table_range,
            })
        }
        Backup::Legacy { table } => {
            let table = LockTable::from_snapshot(table).map_err(|e| {
                format!(
                    "not a raftlock backup, or a corrupt one written before backup format 1 \
                     (those carry no checksum): {e}"
                )
            })?;
            Ok(Checked {
                header: None,
                table,
                table_range,
            })
        }
    }
}

/// The backup file of `table` (at log `index`, of cluster `cluster_id`),
/// taken at `created_unix_secs`.
pub fn write(table: &LockTable, index: u64, cluster_id: u64, created_unix_secs: u64) -> Vec<u8> {
    let stats = table.stats();
    let header = Header {
        cluster_id,
        index,
        created_unix_secs,
        sessions: stats.sessions,
        grants: stats.grants,
        last_fence: stats.last_fence,
    };
    backup::encode(&header, &table.to_snapshot())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_backup_checks_and_a_bare_table_is_legacy() {
        let table = LockTable::new();
        let file = write(&table, 9, 0xabc, 1_764_000_000);
        let checked = check(&file).expect("check");
        let header = checked.header.expect("a header");
        assert_eq!((header.index, header.cluster_id), (9, 0xabc));
        assert_eq!(&file[checked.table_range], &table.to_snapshot()[..]);

        // The same empty table as a release before backup format 1 wrote
        // it: lock-table format 4 (format 5 added two maps, empty here:
        // 8 bytes of length each; format 6 the last restore, none here:
        // 1 byte).
        let mut bare = table.to_snapshot();
        bare[0] = 4;
        bare.truncate(bare.len() - 17);
        assert_eq!(LockTable::from_snapshot(&bare).expect("format 4"), table);
        let legacy = check(&bare).expect("legacy");
        assert!(legacy.header.is_none());
        assert_eq!(legacy.table_range, 0..bare.len());
    }

    #[test]
    fn a_header_that_disagrees_with_its_table_is_refused() {
        let table = LockTable::new();
        let header = Header {
            sessions: 1,
            ..Header::default()
        };
        let file = backup::encode(&header, &table.to_snapshot());
        let err = check(&file).expect_err("a header that lies");
        assert!(
            err.starts_with("corrupt backup: the header says 1 sessions"),
            "{err}"
        );
    }

    #[test]
    fn garbage_is_not_blamed_on_a_newer_release() {
        for garbage in [&b"not a backup"[..], b"gibberish", b"\x04\xff\xff"] {
            let err = check(garbage).expect_err("garbage");
            assert!(err.starts_with("not a raftlock backup"), "{err}");
            assert!(!err.contains("newer"), "{err}");
        }
    }
}
