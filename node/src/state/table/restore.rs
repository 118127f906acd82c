//! Restoring a backup into an empty table, part by part.

use super::{Cx, LockTable, PendingRestore, RestoreDone};
use crate::state::cmd;
use crate::state::command::{Event, Refusal, Reply};
use crate::state::limits::{MAX_FENCE, MAX_RESTORE_BYTES, RESTORE_INDEX_BUMP};

impl LockTable {
    /// The fence counter a restore of this table with `fence_bump` starts
    /// from, or the refusal if that would pass [`MAX_FENCE`]. The API checks
    /// it before it proposes a restore, and the apply again.
    pub fn fence_after_restore(&self, fence_bump: u64) -> Result<u64, Refusal> {
        self.last_fence
            .checked_add(fence_bump)
            .filter(|f| *f <= MAX_FENCE)
            .ok_or(Refusal::FenceBumpTooLarge {
                last_fence: self.last_fence,
                fence_bump,
            })
    }

    pub(super) fn restore_part(
        &mut self,
        cx: &mut Cx,
        c: cmd::RestorePart,
    ) -> Result<Reply, Refusal> {
        let cmd::RestorePart {
            restore,
            part,
            parts,
            bytes,
            fence_bump,
        } = c;
        let events = &mut *cx.events;
        // A part of the restore installed last: a retry of a restore whose
        // answer was lost (the leadership moved as its last part
        // committed). Answered as it was; nothing changes.
        if let Some(done) = self.restored.as_ref().filter(|d| d.restore == restore) {
            return Ok(Reply::Restored {
                sessions: done.sessions,
                last_fence: done.last_fence,
            });
        }
        let empty = self.sessions.is_empty()
            && self.locks.is_empty()
            && self.nonces.is_empty()
            && self.last_fence == 0;
        if !empty {
            return Err(Refusal::RestoreIntoNonEmpty);
        }
        let refuse = |reason: String| {
            Err(Refusal::InvalidRestorePart {
                restore,
                part,
                parts,
                reason,
            })
        };
        // Part 0 starts a restore (replacing one that was abandoned); every
        // other part must continue the one under way, in order.
        let mut pending = if part == 0 {
            PendingRestore {
                restore,
                next: 0,
                parts,
                bytes: Vec::new(),
            }
        } else {
            match &self.restoring {
                Some(p) if p.restore == restore && p.parts == parts && p.next == part => {
                    self.restoring.take().expect("checked above")
                }
                Some(p) if p.restore == restore => {
                    return refuse(format!("expected part {} of {}", p.next, p.parts))
                }
                _ => return refuse("no such restore under way (part 0 starts one)".into()),
            }
        };
        if pending.bytes.len() + bytes.len() > MAX_RESTORE_BYTES {
            if part > 0 {
                self.restoring = Some(pending);
            }
            return refuse(format!("the backup exceeds {MAX_RESTORE_BYTES} bytes"));
        }
        let before = pending.bytes.len();
        pending.bytes.extend_from_slice(&bytes);
        pending.next += 1;
        if pending.next < parts {
            self.restoring = Some(pending);
            return Ok(Reply::RestorePartTaken { next: part + 1 });
        }
        let checked = LockTable::from_snapshot(&pending.bytes)
            .map_err(|e| Refusal::InvalidBackup {
                reason: e.to_string(),
            })
            .and_then(|table| {
                // New fences start above every fence the backup's cluster
                // may have handed out after the backup was taken (within
                // `fence_bump`), and never past the bound.
                let last_fence = table.fence_after_restore(fence_bump)?;
                Ok((table, last_fence))
            });
        let (table, last_fence) = match checked {
            Ok(ok) => ok,
            Err(refusal) => {
                // Refused: leave the restore as it was before this part.
                pending.bytes.truncate(before);
                pending.next -= 1;
                if part > 0 {
                    self.restoring = Some(pending);
                }
                return Err(refusal);
            }
        };
        // New ids and queue positions start above everything the backup's
        // cluster used.
        let index_floor = table.max_index().saturating_add(RESTORE_INDEX_BUMP);
        let sessions = table.sessions.len() as u64;
        *self = LockTable {
            restoring: None,
            index_floor,
            last_fence,
            restored: Some(RestoreDone {
                restore,
                sessions,
                last_fence,
            }),
            ..table
        };
        // Tell the leader's timers about everything that now needs one.
        for s in self.sessions() {
            events.push(Event::SessionOpened {
                session: s.session,
                ttl_ms: s.ttl_ms,
                end_on_disconnect_ms: s.end_on_disconnect_ms,
            });
        }
        for w in self.waits() {
            events.push(Event::Queued {
                name: w.name,
                session: w.session,
                seq: w.seq,
                mode: w.mode,
                timeout_ms: w.timeout_ms,
            });
        }
        let delays: Vec<Event> = self
            .delays()
            .map(|(name, since, delay_ms)| Event::LockDelayStarted {
                name: name.clone(),
                delay_ms,
                since,
            })
            .collect();
        events.extend(delays);
        Ok(Reply::Restored {
            sessions: self.sessions.len() as u64,
            last_fence: self.last_fence,
        })
    }
}
