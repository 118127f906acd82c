//! How much of the table each identity uses: open sessions and entries
//! (grants held plus requests queued), in all and per identity, for the
//! limits of [`limits`](crate::state::limits) that bound the table's size.
//!
//! Derived, not stored: not in the snapshot, rebuilt when one is decoded
//! or restored, and checked against a recount by `check_invariants`. It
//! follows the table from the events of each command: every change to a
//! session's grants or waits tells of that session, so after each command
//! only the sessions its events name are counted again (a session's
//! entries are two map lengths away).

use std::collections::BTreeMap;

use super::{LockTable, Session};
use crate::state::command::{Event, Refusal, SessionId};
use crate::state::limits::{
    MAX_ENTRIES, MAX_ENTRIES_PER_IDENTITY, MAX_SESSIONS, MAX_SESSIONS_PER_IDENTITY,
};

/// Sessions and entries of one identity, or of the whole table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(in crate::state) struct Counts {
    /// Open sessions.
    pub(in crate::state) sessions: u64,
    /// Grants held plus requests queued.
    pub(in crate::state) entries: u64,
}

/// The table's use, in all and per identity.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(in crate::state) struct Usage {
    /// The whole table.
    pub(in crate::state) total: Counts,
    /// Per identity (the anonymous caller of a cluster without access
    /// control is "").
    owners: BTreeMap<String, Counts>,
    /// What each open session was last counted with: its owner and
    /// entries.
    counted: BTreeMap<SessionId, (String, u64)>,
}

fn entries(s: &Session) -> u64 {
    (s.held.len() + s.waiting.len()) as u64
}

impl Usage {
    /// The use of `table`, counted from scratch.
    pub(in crate::state) fn of(table: &LockTable) -> Usage {
        let mut usage = Usage::default();
        for (id, s) in &table.sessions {
            usage.count(*id, Some(s));
        }
        usage
    }

    /// Counts `session` again (`None`: it is gone).
    fn count(&mut self, session: SessionId, now: Option<&Session>) {
        if let Some((owner, n)) = self.counted.remove(&session) {
            self.total.sessions -= 1;
            self.total.entries -= n;
            if let Some(c) = self.owners.get_mut(&owner) {
                c.sessions -= 1;
                c.entries -= n;
                if c.sessions == 0 {
                    self.owners.remove(&owner);
                }
            }
        }
        if let Some(s) = now {
            let n = entries(s);
            self.total.sessions += 1;
            self.total.entries += n;
            let c = self.owners.entry(s.owner.clone()).or_default();
            c.sessions += 1;
            c.entries += n;
            self.counted.insert(session, (s.owner.clone(), n));
        }
    }

    /// Follows what a command changed: counts again every session its
    /// `events` name.
    pub(in crate::state) fn follow(
        &mut self,
        sessions: &BTreeMap<SessionId, Session>,
        events: &[Event],
    ) {
        let mut last = None;
        for e in events {
            let session = match e {
                Event::SessionOpened { session, .. }
                | Event::SessionEnded { session, .. }
                | Event::Queued { session, .. }
                | Event::Granted { session, .. }
                | Event::Cancelled { session, .. }
                | Event::Ended { session, .. } => *session,
                Event::SessionTtlChanged { .. }
                | Event::SessionRevoked { .. }
                | Event::Downgraded { .. }
                | Event::LockDelayStarted { .. }
                | Event::LockDelayEnded { .. } => continue,
            };
            // Runs of events of one session are common (an expiry ends
            // all its grants): count it once per run.
            if last == Some(session) {
                continue;
            }
            last = Some(session);
            self.count(session, sessions.get(&session));
        }
    }

    /// Refuses a new session of `owner` past the limits.
    pub(in crate::state) fn admit_session(&self, owner: &str) -> Result<(), Refusal> {
        if self.total.sessions >= MAX_SESSIONS as u64 {
            return Err(Refusal::TooManySessions);
        }
        let mine = self.owners.get(owner).copied().unwrap_or_default();
        if !owner.is_empty() && mine.sessions >= MAX_SESSIONS_PER_IDENTITY as u64 {
            return Err(Refusal::IdentityLimit {
                identity: owner.to_string(),
                what: "open sessions".into(),
                max: MAX_SESSIONS_PER_IDENTITY,
            });
        }
        Ok(())
    }

    /// Refuses `n` new entries (grants or queued requests) of `owner`'s
    /// sessions past the limits.
    pub(in crate::state) fn admit_entries(&self, owner: &str, n: u64) -> Result<(), Refusal> {
        if self.total.entries + n > MAX_ENTRIES as u64 {
            return Err(Refusal::TooManyEntries);
        }
        let mine = self.owners.get(owner).copied().unwrap_or_default();
        if !owner.is_empty() && mine.entries + n > MAX_ENTRIES_PER_IDENTITY as u64 {
            return Err(Refusal::IdentityLimit {
                identity: owner.to_string(),
                what: "grants and queued requests".into(),
                max: MAX_ENTRIES_PER_IDENTITY,
            });
        }
        Ok(())
    }

    /// Pretends `owner` (and the whole table) uses `counts` more than it
    /// does: for tests of the limits' edges without building millions of
    /// entries. The table's invariant check fails until it is recounted.
    #[cfg(test)]
    pub(in crate::state) fn pretend(&mut self, owner: &str, counts: Counts) {
        self.total.sessions += counts.sessions;
        self.total.entries += counts.entries;
        let c = self.owners.entry(owner.to_string()).or_default();
        c.sessions += counts.sessions;
        c.entries += counts.entries;
    }
}
