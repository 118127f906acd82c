//! A session's reply window: what makes a retried request exactly-once.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::state::command::{Acquired, AcquiredAll, Refusal, Reply, SessionId};
use crate::state::limits::MAX_REMEMBERED_REPLIES;

/// A session's remembered replies: the newest [`MAX_REMEMBERED_REPLIES`]
/// by sequence number, plus every reply whose outcome is still pending (a
/// queued acquire: its client may need to ask again, however many requests
/// it sent meanwhile), and the highest sequence number forgotten.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(in crate::state) struct Replies {
    pub(in crate::state) map: BTreeMap<u64, Remembered>,
    pub(in crate::state) floor: Option<u64>,
}

/// One remembered reply and a digest of the command it answered, so a seq
/// reused for another command is refused instead of answered with this.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(in crate::state) struct Remembered {
    /// [`Command::digest`] of the request (0: unknown, for replies restored
    /// from a format that kept none; any request matches it).
    pub(in crate::state) digest: u64,
    /// The answer.
    pub(in crate::state) reply: Reply,
}

enum Lookup {
    New,
    Replay(Reply),
    TooOld(u64),
    Reused,
}

impl Replies {
    /// What the window says of request `seq` of `session`, whose command
    /// has `digest`: `None` for a new request, the remembered reply for a
    /// retry, or the refusal of a seq reused for another command or
    /// forgotten already.
    pub(in crate::state) fn check(
        &self,
        session: SessionId,
        seq: u64,
        digest: u64,
    ) -> Result<Option<Reply>, Refusal> {
        match self.lookup(seq, digest) {
            Lookup::New => Ok(None),
            Lookup::Replay(reply) => Ok(Some(reply)),
            Lookup::Reused => Err(Refusal::SequenceReused { session, seq }),
            Lookup::TooOld(floor) => Err(Refusal::SequenceTooOld {
                session,
                seq,
                floor,
            }),
        }
    }

    fn lookup(&self, seq: u64, digest: u64) -> Lookup {
        if let Some(r) = self.map.get(&seq) {
            if r.digest != 0 && r.digest != digest {
                return Lookup::Reused;
            }
            return Lookup::Replay(r.reply.clone());
        }
        match self.floor {
            Some(floor) if seq <= floor => Lookup::TooOld(floor),
            _ => Lookup::New,
        }
    }

    pub(in crate::state) fn remember(&mut self, seq: u64, digest: u64, reply: &Reply) {
        self.map.insert(
            seq,
            Remembered {
                digest,
                reply: reply.clone(),
            },
        );
        while self.map.len() > MAX_REMEMBERED_REPLIES {
            // The oldest settled reply goes; pending ones (queued acquires)
            // stay until settled, so their retries still find them. A
            // session waits for at most MAX_LOCKS_PER_SESSION names, which
            // bounds them.
            let Some(old) = self
                .map
                .iter()
                .find(|(_, r)| {
                    r.reply != Reply::Acquire(Acquired::Queued)
                        && r.reply != Reply::AcquiredAll(AcquiredAll::Queued)
                })
                .map(|(seq, _)| *seq)
            else {
                break;
            };
            self.map.remove(&old);
            self.floor = Some(self.floor.map_or(old, |f| f.max(old)));
        }
    }

    /// The remembered reply to `seq`, if any.
    pub(in crate::state) fn get(&self, seq: u64) -> Option<&Reply> {
        self.map.get(&seq).map(|r| &r.reply)
    }

    /// True if `seq` was never answered (nor forgotten below the floor).
    pub(in crate::state) fn is_unseen(&self, seq: u64) -> bool {
        !self.map.contains_key(&seq) && self.floor.is_none_or(|f| seq > f)
    }

    /// Rewrites a remembered reply whose outcome has since been decided (a
    /// queued acquire granted or cancelled).
    pub(in crate::state) fn settle(&mut self, seq: u64, reply: Reply) {
        if let Some(slot) = self.map.get_mut(&seq) {
            slot.reply = reply;
        }
    }
}
