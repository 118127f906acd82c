//! The mark: what the log last made durable, kept apart from the log.
//!
//! sled 0.34 opens a damaged file without an error and keeps only what
//! came before the damage (a flipped byte in the middle of `db` lost every
//! key written after it; `docs/internals/design.md`, Durability). A node
//! started on such a log would have forgotten entries it acknowledged, or
//! the vote it granted, and could undo a majority's decision. So every
//! sync of the log also records, once the log's own sync is done, the
//! newest entry (its index and the CRC of its bytes) and the vote the log
//! held when the sync began: the *mark*. At open the log must still hold
//! both (the entry unless a purge took it; a vote no older); if not, the
//! store refuses to open and the node does not start.
//!
//! The mark never names more than is durable in the log: it is taken
//! before the log's sync and written after it. A write that would remove
//! or replace the entry it names (a truncation of a conflicting suffix, a
//! purge up to it) first lowers it to the entry before, durably, while no
//! sync can take a new one in between (each disk holds its sync lock).
//!
//! On a real disk the mark is the file `raftlock-mark` beside sled's
//! files: two slots of [`SLOT`] bytes, written in turn in place, each
//! with a sequence number and a CRC, so a torn write of one leaves the
//! other. A file whose slots are all zeros names nothing (just created);
//! one whose slots are all damaged is refused as a damaged log is.

use std::io;
use std::os::unix::fs::FileExt as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{Vote, Write};
use crate::codec::{decode, to_vec};

/// The mark file's name, in the directory of sled's files.
pub const MARK_FILE: &str = "raftlock-mark";

/// The size of one slot of the mark file (one page: a torn write tears
/// one slot at most).
pub const SLOT: usize = 4096;

/// What the log held when a sync began, durable once the sync ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    /// The newest entry: its index and the CRC-32 of its bytes.
    pub last: Option<(u64, u32)>,
    /// The vote's bytes.
    pub vote: Option<Vec<u8>>,
}

impl Mark {
    /// The mark of a log whose newest entry is `last` (index, bytes) and
    /// whose vote is `vote`.
    pub fn of(last: Option<(u64, &[u8])>, vote: Option<Vec<u8>>) -> Mark {
        Mark {
            last: last.map(|(index, bytes)| (index, crc32fast::hash(bytes))),
            vote,
        }
    }

    /// The mark to make durable before `write` is made, if `write` would
    /// remove or replace the entry this mark names: the same mark naming
    /// the entry before the first one `write` touches (`entry` reads the
    /// log as it is), or none if that one is not there.
    pub fn before(&self, write: &Write, entry: impl Fn(u64) -> Option<Vec<u8>>) -> Option<Mark> {
        let (named, _) = self.last?;
        let first = match write {
            Write::Remove { from, to } if (*from..=*to).contains(&named) => *from,
            Write::Log(entries) => match entries.first() {
                Some((first, _)) if *first <= named => *first,
                _ => return None,
            },
            _ => return None,
        };
        let last = first
            .checked_sub(1)
            .and_then(|i| entry(i).map(|bytes| (i, bytes)));
        Some(Mark::of(
            last.as_ref().map(|(i, b)| (*i, b.as_slice())),
            self.vote.clone(),
        ))
    }

    /// Checks a log against this mark, as the log is read at open: its
    /// vote (`vote`), its purge point (`purged`: the first index not
    /// purged, 0 if none) and its entries (`entry`). `Err` says what the
    /// log lost.
    pub fn check(
        &self,
        vote: Option<&[u8]>,
        purged: u64,
        entry: impl Fn(u64) -> io::Result<Option<Vec<u8>>>,
    ) -> Result<(), String> {
        if let Some(marked) = &self.vote {
            let decoded = |bytes: &[u8]| decode::<Vote>(bytes).ok();
            let older = match (decoded(marked), vote.and_then(decoded)) {
                (Some(marked), Some(now)) => !matches!(
                    now.partial_cmp(&marked),
                    Some(std::cmp::Ordering::Greater | std::cmp::Ordering::Equal)
                ),
                _ => true,
            };
            if older {
                return Err(format!(
                    "its vote is {} but it had made {} durable",
                    vote.and_then(decoded)
                        .map_or("missing".into(), |v| v.to_string()),
                    decoded(marked).map_or("a vote".into(), |v| v.to_string()),
                ));
            }
        }
        if let Some((index, crc)) = self.last {
            if index >= purged {
                match entry(index).map_err(|e| e.to_string())? {
                    None => {
                        return Err(format!("entry {index}, which it had made durable, is gone"))
                    }
                    Some(bytes) if crc32fast::hash(&bytes) != crc => {
                        return Err(format!("entry {index} is not the one it had made durable"))
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(())
    }

    /// Slot `seq` of the mark file holding this mark: length, CRC, then the
    /// sequence number and the mark, zero-padded to [`SLOT`] bytes.
    pub fn to_slot(&self, seq: u64) -> Vec<u8> {
        let body = to_vec(&(seq, self));
        let mut slot = Vec::with_capacity(SLOT);
        slot.extend_from_slice(&(body.len() as u32).to_le_bytes());
        slot.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        slot.extend_from_slice(&body);
        assert!(slot.len() <= SLOT, "a mark fits its slot");
        slot.resize(SLOT, 0);
        slot
    }

    /// The newest valid mark in the mark file's bytes, with its sequence
    /// number: `Ok(None)` if every slot is zeros (nothing marked yet),
    /// `Err` if no slot is valid and one is not zeros (damaged).
    pub fn from_file(bytes: &[u8]) -> Result<Option<(u64, Mark)>, String> {
        let mut best: Option<(u64, Mark)> = None;
        let mut damaged = false;
        for slot in bytes.chunks(SLOT) {
            if slot.iter().all(|b| *b == 0) {
                continue;
            }
            match Self::from_slot(slot) {
                Some((seq, mark)) if best.as_ref().is_none_or(|(s, _)| seq > *s) => {
                    best = Some((seq, mark))
                }
                Some(_) => {}
                None => damaged = true,
            }
        }
        match best {
            None if damaged => Err("no slot of the mark file is intact".into()),
            best => Ok(best),
        }
    }

    fn from_slot(slot: &[u8]) -> Option<(u64, Mark)> {
        let len = u32::from_le_bytes(slot.get(..4)?.try_into().ok()?) as usize;
        let crc = u32::from_le_bytes(slot.get(4..8)?.try_into().ok()?);
        let body = slot.get(8..8usize.checked_add(len)?)?;
        (crc32fast::hash(body) == crc)
            .then(|| decode::<(u64, Mark)>(body).ok())
            .flatten()
    }
}

/// The mark file of a real disk, open for writing.
pub struct MarkFile {
    file: std::fs::File,
    /// The sequence number of the next mark written.
    next: u64,
}

impl MarkFile {
    /// Opens (creating it, durably, if it is missing) the mark file in
    /// `dir`; returns it with the mark it holds.
    pub fn open(dir: &Path) -> io::Result<(MarkFile, Option<Mark>)> {
        let path = dir.join(MARK_FILE);
        let created = !path.exists();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        if created {
            file.set_len(2 * SLOT as u64)?;
            file.sync_all()?;
            super::sled_disk::sync_dir(dir)?;
        }
        let mut bytes = vec![0; 2 * SLOT];
        let read = file.read_at(&mut bytes, 0)?;
        bytes.truncate(read);
        let found = Mark::from_file(&bytes).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        })?;
        let next = found.as_ref().map_or(0, |(seq, _)| seq + 1);
        Ok((MarkFile { file, next }, found.map(|(_, m)| m)))
    }

    /// Writes `mark` over the older slot and syncs it.
    pub fn store(&mut self, mark: &Mark) -> io::Result<()> {
        let seq = self.next;
        self.file
            .write_all_at(&mark.to_slot(seq), (seq % 2) * SLOT as u64)?;
        self.file.sync_data()?;
        self.next = seq + 1;
        Ok(())
    }
}
