//! The backup file: what `Cluster.Backup` returns, `raftlock snapshot save`
//! writes, and `Cluster.Restore`, `raftlockd restore` and
//! `raftlock snapshot inspect` read.
//!
//! A backup wraps the lock table (the node's snapshot encoding, which
//! carries its own version byte) in a header and a checksum, so that a
//! damaged or altered file is refused before anything is restored:
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | magic `RLBACKUP` |
//! | 8..10 | backup format, big-endian (this build writes and reads [`FORMAT`] = 1) |
//! | 10..18 | cluster id of the cluster backed up |
//! | 18..26 | log index the backup reflects |
//! | 26..34 | when it was taken, seconds since the Unix epoch |
//! | 34..42 | sessions in it |
//! | 42..50 | grants (held locks and permits) in it |
//! | 50..58 | the largest fence it contains |
//! | 58..66 | length N of the lock table |
//! | 66..66+N | the lock table |
//! | last 32 | SHA-256 of every byte before them |
//!
//! All integers are unsigned 64-bit big-endian unless said otherwise. The
//! checksum is the last 32 bytes in every format, so a file whose checksum
//! holds but whose format number is unknown was written by a newer raftlock,
//! and a file whose checksum fails is damaged: every single flipped bit is
//! refused as corrupt, in the header as in the table or the checksum.
//!
//! Backups written before format 1 are a bare lock table (first byte: its
//! version, 2 to 4) without header or checksum. They are still read, as
//! [`Backup::Legacy`]; nothing can tell a damaged one from an intact one
//! except the table's own consistency checks.

/// How long a restore of a backup of `bytes` bytes may take: a minute, and
/// a second more per 256 KiB (the cluster checks the backup, replicates it
/// in parts and decodes it on every node; a 250,000-session backup, 18.5
/// MB, took 10-25 s on a busy 2-core test machine in debug builds). The
/// client waits this long for `Cluster.Restore`, and a node seeded by
/// `raftlockd restore` keeps trying this long.
pub fn restore_patience(bytes: usize) -> std::time::Duration {
    std::time::Duration::from_secs(60 + (bytes / (256 * 1024)) as u64)
}

/// The first eight bytes of a backup.
pub const MAGIC: [u8; 8] = *b"RLBACKUP";

/// The backup format this build writes, and the only one it reads (besides
/// the header-less backups of earlier releases).
pub const FORMAT: u16 = 1;

/// Bytes of the header of format 1, before the lock table.
pub const HEADER_LEN: usize = 66;

/// Bytes of the checksum (SHA-256) at the end.
pub const CHECKSUM_LEN: usize = 32;

/// First bytes (lock-table versions) of the bare backups releases before
/// format 1 wrote.
pub const LEGACY_TABLE_VERSIONS: std::ops::RangeInclusive<u8> = 2..=4;

/// A file whose first eight bytes differ from [`MAGIC`] in at most this
/// many bits is a backup with a damaged header, not some other file.
const MAGIC_DAMAGE_BITS: u32 = 3;

/// What the header says about the backup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// The backed-up cluster's id (0 if the node did not know it).
    pub cluster_id: u64,
    /// The log index the backup reflects.
    pub index: u64,
    /// When it was taken, in seconds since the Unix epoch (the leader's
    /// clock).
    pub created_unix_secs: u64,
    /// Sessions in it.
    pub sessions: u64,
    /// Grants (held locks and semaphore permits) in it.
    pub grants: u64,
    /// The largest fence it contains (0: none granted yet).
    pub last_fence: u64,
}

/// A backup that passed its checks.
#[derive(Debug, PartialEq, Eq)]
pub enum Backup<'a> {
    /// A backup of format [`FORMAT`] whose checksum holds.
    Checked {
        /// Its header.
        header: Header,
        /// The lock table (the node's snapshot encoding).
        table: &'a [u8],
        /// The checksum, as stored (and recomputed).
        sha256: [u8; CHECKSUM_LEN],
    },
    /// A bare lock table written before format 1: no header, no checksum.
    Legacy {
        /// The lock table; its first byte is its version.
        table: &'a [u8],
    },
}

impl Backup<'_> {
    /// The lock table inside.
    pub fn table(&self) -> &[u8] {
        match self {
            Backup::Checked { table, .. } | Backup::Legacy { table } => table,
        }
    }
}

/// Why bytes are not a backup this build can use.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BackupError {
    /// A backup whose bytes were changed or lost after it was written.
    #[error("corrupt backup: {0}")]
    Corrupt(String),
    /// An intact backup of a format this build does not read.
    #[error("backup format {0} was written by a newer raftlock (this build reads format {FORMAT}); its checksum holds, so the file is intact")]
    NewerFormat(u16),
    /// Bytes that are not a raftlock backup at all.
    #[error("not a raftlock backup: {0}")]
    NotABackup(String),
}

fn sha256(bytes: &[u8]) -> [u8; CHECKSUM_LEN] {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; CHECKSUM_LEN];
    out.copy_from_slice(digest.as_ref());
    out
}

/// `bytes` in lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Wraps the lock table `table` in a backup of format [`FORMAT`].
pub fn encode(header: &Header, table: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + table.len() + CHECKSUM_LEN);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT.to_be_bytes());
    for field in [
        header.cluster_id,
        header.index,
        header.created_unix_secs,
        header.sessions,
        header.grants,
        header.last_fence,
        table.len() as u64,
    ] {
        out.extend_from_slice(&field.to_be_bytes());
    }
    debug_assert_eq!(out.len(), HEADER_LEN);
    out.extend_from_slice(table);
    let sum = sha256(&out);
    out.extend_from_slice(&sum);
    out
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut field = [0u8; 8];
    field.copy_from_slice(&bytes[at..at + 8]);
    u64::from_be_bytes(field)
}

/// Checks `bytes` and takes them apart: the checksum first, then the
/// format and the header. Never panics, whatever the bytes.
pub fn decode(bytes: &[u8]) -> Result<Backup<'_>, BackupError> {
    let magic_bits_off = bytes.len() >= MAGIC.len() && {
        let off: u32 = bytes[..MAGIC.len()]
            .iter()
            .zip(MAGIC)
            .map(|(a, b)| (a ^ b).count_ones())
            .sum();
        off <= MAGIC_DAMAGE_BITS
    };
    if !magic_bits_off {
        if !bytes.is_empty() && MAGIC.starts_with(bytes) {
            return Err(BackupError::Corrupt(format!(
                "truncated: {} bytes, but a backup has at least {}",
                bytes.len(),
                HEADER_LEN + CHECKSUM_LEN
            )));
        }
        return match bytes.first() {
            Some(v) if LEGACY_TABLE_VERSIONS.contains(v) => Ok(Backup::Legacy { table: bytes }),
            None => Err(BackupError::NotABackup("the file is empty".into())),
            Some(_) => Err(BackupError::NotABackup(format!(
                "it starts with {} (hex), neither the backup header {:?} nor the version byte \
                 (2 to 4) of a backup written before backup format 1",
                hex(&bytes[..bytes.len().min(8)]),
                std::str::from_utf8(&MAGIC).unwrap_or_default(),
            ))),
        };
    }
    if bytes[..MAGIC.len()] != MAGIC {
        return Err(BackupError::Corrupt(format!(
            "its header is damaged (the first 8 bytes are {}, not {:?})",
            hex(&bytes[..MAGIC.len()]),
            std::str::from_utf8(&MAGIC).unwrap_or_default(),
        )));
    }
    if bytes.len() < HEADER_LEN + CHECKSUM_LEN {
        return Err(BackupError::Corrupt(format!(
            "truncated: {} bytes, but a backup has at least {}",
            bytes.len(),
            HEADER_LEN + CHECKSUM_LEN
        )));
    }
    let (body, stored) = bytes.split_at(bytes.len() - CHECKSUM_LEN);
    let computed = sha256(body);
    if stored != computed {
        return Err(BackupError::Corrupt(format!(
            "checksum mismatch: the file was changed, damaged or cut short after it was written \
             (SHA-256 stored {}, computed {})",
            hex(stored),
            hex(&computed)
        )));
    }
    let format = u16::from_be_bytes([bytes[8], bytes[9]]);
    if format != FORMAT {
        return Err(if format > FORMAT {
            BackupError::NewerFormat(format)
        } else {
            BackupError::NotABackup(format!(
                "backup format {format} does not exist (this build reads format {FORMAT})"
            ))
        });
    }
    let header = Header {
        cluster_id: u64_at(bytes, 10),
        index: u64_at(bytes, 18),
        created_unix_secs: u64_at(bytes, 26),
        sessions: u64_at(bytes, 34),
        grants: u64_at(bytes, 42),
        last_fence: u64_at(bytes, 50),
    };
    let len = u64_at(bytes, 58);
    let table = &body[HEADER_LEN..];
    if len != table.len() as u64 {
        return Err(BackupError::Corrupt(format!(
            "the header announces a lock table of {len} bytes, the file holds {}",
            table.len()
        )));
    }
    Ok(Backup::Checked {
        header,
        table,
        sha256: computed,
    })
}

#[cfg(test)]
mod tests {
    /// A restore waits a minute, and a second more per whole 256 KiB.
    #[test]
    fn a_restore_waits_longer_for_a_larger_backup() {
        use std::time::Duration;
        assert_eq!(restore_patience(0), Duration::from_secs(60));
        assert_eq!(restore_patience(256 * 1024 - 1), Duration::from_secs(60));
        assert_eq!(restore_patience(256 * 1024), Duration::from_secs(61));
        // The largest backup a node takes (1 GiB): 4,096 s more.
        assert_eq!(restore_patience(1 << 30), Duration::from_secs(60 + 4096));
    }

    use super::*;

    fn sample() -> (Header, Vec<u8>) {
        let header = Header {
            cluster_id: 0x0123_4567_89ab_cdef,
            index: 42,
            created_unix_secs: 1_764_000_000,
            sessions: 1,
            grants: 1,
            last_fence: 7,
        };
        // Any bytes: this layer does not look inside the table.
        let table: Vec<u8> = (0..200u32).map(|i| (i * 37 % 251) as u8).collect();
        (header, table)
    }

    #[test]
    fn a_backup_reads_back_as_written() {
        let (header, table) = sample();
        let bytes = encode(&header, &table);
        assert_eq!(bytes.len(), HEADER_LEN + table.len() + CHECKSUM_LEN);
        match decode(&bytes).expect("decode") {
            Backup::Checked {
                header: h,
                table: t,
                ..
            } => assert_eq!((h, t), (header, &table[..])),
            other => panic!("{other:?}"),
        }
        // An empty table is still a backup.
        assert_eq!(decode(&encode(&header, &[])).expect("empty").table(), b"");
    }

    /// Every single flipped bit, anywhere in the file (magic, format,
    /// header, table, checksum), is refused as corrupt.
    #[test]
    fn every_single_bit_flip_is_refused_as_corrupt() {
        let (header, table) = sample();
        let bytes = encode(&header, &table);
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            match decode(&flipped) {
                Err(e @ BackupError::Corrupt(_)) => {
                    assert!(e.to_string().starts_with("corrupt backup: "), "{e}")
                }
                other => panic!("bit {bit} (byte {}): {other:?}", bit / 8),
            }
        }
    }

    #[test]
    fn cut_or_lengthened_files_are_corrupt() {
        let (header, table) = sample();
        let bytes = encode(&header, &table);
        for len in [0, 7, 8, 50, HEADER_LEN, bytes.len() - 1] {
            let cut = &bytes[..len];
            let err = decode(cut).expect_err("cut");
            if len == 0 {
                assert!(matches!(err, BackupError::NotABackup(_)), "{len}: {err}");
            } else {
                assert!(matches!(err, BackupError::Corrupt(_)), "{len}: {err}");
            }
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(decode(&longer), Err(BackupError::Corrupt(_))));
    }

    #[test]
    fn garbage_is_called_what_it_is() {
        for garbage in [&b"not a backup"[..], b"\x67garbage", b"{\"json\": 1}"] {
            let err = decode(garbage).expect_err("garbage");
            assert!(matches!(err, BackupError::NotABackup(_)), "{err}");
            assert!(!err.to_string().contains("newer"), "{err}");
        }
    }

    #[test]
    fn a_newer_format_with_a_good_checksum_is_told_apart_from_damage() {
        let (header, table) = sample();
        let mut bytes = encode(&header, &table);
        bytes[8..10].copy_from_slice(&(FORMAT + 1).to_be_bytes());
        let body = bytes.len() - CHECKSUM_LEN;
        let sum = sha256(&bytes[..body]);
        bytes[body..].copy_from_slice(&sum);
        assert_eq!(decode(&bytes), Err(BackupError::NewerFormat(FORMAT + 1)));
    }

    #[test]
    fn bare_tables_of_earlier_releases_are_read_as_legacy() {
        for v in LEGACY_TABLE_VERSIONS {
            let table = [v, 1, 2, 3];
            assert_eq!(decode(&table), Ok(Backup::Legacy { table: &table }));
        }
    }
}
