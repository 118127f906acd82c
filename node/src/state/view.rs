//! Read-only views of the table (for reads, the leader's timers and
//! watches), snapshot encoding, and the invariant checker.

use std::ops::Bound;

use serde::{Deserialize, Serialize};

use super::command::{Fence, LockName, Mode, SessionId};
use super::table::LockTable;

mod invariants;

/// One holder, as readers see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderInfo {
    /// The holding session.
    pub session: SessionId,
    /// The grant's fence.
    pub fence: Fence,
    /// The mode held.
    pub mode: Mode,
    /// The holder's value.
    pub value: Vec<u8>,
    /// Log index of the grant.
    pub index: u64,
}

/// One waiter, as readers and the leader's timers see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitInfo {
    /// The waiting session.
    pub session: SessionId,
    /// The name waited for.
    pub name: LockName,
    /// The acquire's sequence number.
    pub seq: u64,
    /// The mode asked for.
    pub mode: Mode,
    /// How long it may wait ([`WAIT_FOREVER`](super::limits::WAIT_FOREVER) = no limit).
    pub timeout_ms: u64,
    /// Log index at which it was queued.
    pub index: u64,
}

/// One name's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    /// The name.
    pub name: LockName,
    /// `Some(capacity)` for a semaphore.
    pub capacity: Option<u32>,
    /// Holders in grant order.
    pub holders: Vec<HolderInfo>,
    /// Waiters in queue order.
    pub waiters: Vec<WaitInfo>,
    /// True while a lock-delay is in force.
    pub lock_delayed: bool,
}

/// One session, as the leader's timers see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    /// The session.
    pub session: SessionId,
    /// Its ttl.
    pub ttl_ms: u64,
    /// Its lock-delay.
    pub lock_delay_ms: u64,
    /// Its grace after its last keep-alive stream ends (0: none).
    pub end_on_disconnect_ms: u64,
}

/// Counts for status and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Open sessions.
    pub sessions: u64,
    /// Names with an entry.
    pub names: u64,
    /// Held grants.
    pub grants: u64,
    /// Queued requests.
    pub waiters: u64,
    /// The last fence handed out.
    pub last_fence: u64,
}

/// A snapshot that cannot be decoded.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The format version is not one this build reads.
    #[error("unsupported lock-table snapshot version {0} (this build reads {SNAPSHOT_VERSION_2} to {SNAPSHOT_VERSION}: a newer raftlock wrote it, or it is not a lock-table snapshot)")]
    Version(u8),
    /// The bytes are not a valid snapshot.
    #[error("corrupt lock-table snapshot: {0}")]
    Corrupt(String),
}

/// Format version of [`LockTable::to_snapshot`]'s output, its first byte.
/// Version 3 added the index floor a restore sets; version 4 the close
/// index of each remembered close (the oldest close is forgotten first),
/// and each session's disconnect grace and pending one-call lock; version
/// 5 the pending upgrades and the queued atomic requests; version 6 the
/// last restore installed (its id and answer, so a retry of it is
/// answered as it was).
pub const SNAPSHOT_VERSION: u8 = 6;

/// The format before, still read (see [`LockTable::from_snapshot`]).
pub const SNAPSHOT_VERSION_5: u8 = 5;

/// The format before that, still read.
pub const SNAPSHOT_VERSION_4: u8 = 4;

/// An older format, still read.
pub const SNAPSHOT_VERSION_3: u8 = 3;

/// The oldest format still read.
pub const SNAPSHOT_VERSION_2: u8 = 2;

impl LockTable {
    /// The state of `name`, if it has any.
    pub fn describe(&self, name: &LockName) -> Option<LockInfo> {
        self.locks.get(name).map(|lock| LockInfo {
            name: name.clone(),
            capacity: lock.capacity,
            holders: lock
                .holders
                .iter()
                .map(|(fence, h)| HolderInfo {
                    session: h.session,
                    fence: *fence,
                    mode: h.mode,
                    value: h.value.clone(),
                    index: h.index,
                })
                .collect(),
            // A pending upgrade first: it goes ahead of everyone queued.
            waiters: self
                .upgrade_wait(name)
                .into_iter()
                .chain(lock.queue.iter().map(|w| WaitInfo {
                    session: w.session,
                    name: name.clone(),
                    seq: w.seq,
                    mode: w.mode,
                    timeout_ms: w.timeout_ms,
                    index: w.index,
                }))
                .collect(),
            lock_delayed: lock.delay.is_some(),
        })
    }

    /// Up to `limit` names starting with `prefix`, strictly after `after`
    /// (when given), in name order.
    pub fn list(&self, prefix: &str, after: Option<&str>, limit: usize) -> Vec<LockInfo> {
        let start = match after {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        self.locks
            .range::<str, _>((start, Bound::Unbounded))
            .take_while(|(name, _)| name.as_str().starts_with(prefix))
            .take(limit)
            .filter_map(|(name, _)| self.describe(name))
            .collect()
    }

    /// Whether `fence` is a current grant on `name`, and the largest fence
    /// currently held on it.
    pub fn check_fence(&self, name: &LockName, fence: Fence) -> (bool, Option<Fence>) {
        match self.locks.get(name) {
            None => (false, None),
            Some(lock) => (
                lock.holders.contains_key(&fence),
                lock.holders.keys().next_back().copied(),
            ),
        }
    }

    /// A session's settings, if it is open.
    pub fn session(&self, session: SessionId) -> Option<SessionInfo> {
        self.sessions.get(&session).map(|s| SessionInfo {
            end_on_disconnect_ms: s.end_on_disconnect_ms,
            session,
            ttl_ms: s.ttl_ms,
            lock_delay_ms: s.lock_delay_ms,
        })
    }

    /// Every open session (the leader re-arms their leases on election).
    pub fn sessions(&self) -> impl Iterator<Item = SessionInfo> + '_ {
        self.sessions.iter().map(|(id, s)| SessionInfo {
            session: *id,
            ttl_ms: s.ttl_ms,
            lock_delay_ms: s.lock_delay_ms,
            end_on_disconnect_ms: s.end_on_disconnect_ms,
        })
    }

    /// The identity `session` belongs to, if it is open.
    pub fn session_owner(&self, session: SessionId) -> Option<&str> {
        self.sessions.get(&session).map(|s| s.owner.as_str())
    }

    /// Every queued request (the leader re-arms their timeouts on election).
    pub fn waits(&self) -> impl Iterator<Item = WaitInfo> + '_ {
        let queued = self.locks.iter().flat_map(|(name, lock)| {
            lock.queue.iter().map(move |w| WaitInfo {
                session: w.session,
                name: name.clone(),
                seq: w.seq,
                mode: w.mode,
                timeout_ms: w.timeout_ms,
                index: w.index,
            })
        });
        queued.chain(self.upgrades.keys().filter_map(|n| self.upgrade_wait(n)))
    }

    /// The pending upgrade of `name` as a wait (for exclusive).
    fn upgrade_wait(&self, name: &LockName) -> Option<WaitInfo> {
        self.upgrades.get(name).map(|u| WaitInfo {
            session: u.session,
            name: name.clone(),
            seq: u.seq,
            mode: Mode::Exclusive,
            timeout_ms: u.timeout_ms,
            index: u.index,
        })
    }

    /// Every lock-delay in force as `(name, since, delay_ms)` (the leader
    /// re-arms them on election).
    pub fn delays(&self) -> impl Iterator<Item = (&LockName, u64, u64)> + '_ {
        self.locks
            .iter()
            .filter_map(|(name, lock)| lock.delay.map(|d| (name, d.since, d.delay_ms)))
    }

    /// The names `session` holds and the names it waits for, in name
    /// order (`None` if it is not open).
    pub fn session_names(&self, session: SessionId) -> Option<(Vec<&LockName>, Vec<&LockName>)> {
        self.sessions
            .get(&session)
            .map(|s| (s.held.keys().collect(), s.waiting.keys().collect()))
    }

    /// Queued requests of the longest queue (for metrics). Linear in the
    /// number of names.
    pub fn longest_queue(&self) -> u64 {
        self.locks
            .values()
            .map(|l| l.queue.len() as u64)
            .max()
            .unwrap_or(0)
    }

    /// Counts for status and metrics. Linear in the number of names.
    pub fn stats(&self) -> Stats {
        let mut stats = Stats {
            sessions: self.sessions.len() as u64,
            names: self.locks.len() as u64,
            last_fence: self.last_fence,
            ..Stats::default()
        };
        for lock in self.locks.values() {
            stats.grants += lock.holders.len() as u64;
            stats.waiters += lock.queue.len() as u64;
        }
        stats
    }

    /// The largest command index the table holds anywhere (session ids,
    /// grant and queue indexes, lock-delay starts, and its own floor): a
    /// restore of this table lifts later indexes above it.
    pub fn max_index(&self) -> u64 {
        let sessions = self.sessions.keys().next_back().map_or(0, |s| s.0);
        let locks = self.locks.values().flat_map(|lock| {
            lock.holders
                .values()
                .map(|h| h.index)
                .chain(lock.queue.iter().map(|w| w.index))
                .chain(lock.delay.map(|d| d.since))
        });
        locks.chain([sessions, self.index_floor]).max().unwrap_or(0)
    }

    /// The floor added to every command index (0 until a restore).
    pub fn index_floor(&self) -> u64 {
        self.index_floor
    }

    /// The last fence handed out.
    pub fn last_fence(&self) -> Fence {
        Fence(self.last_fence)
    }

    /// Encodes the whole table: a version byte, then bincode.
    pub fn to_snapshot(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_snapshot_into(&mut out);
        out
    }

    /// Appends [`to_snapshot`](Self::to_snapshot)'s bytes to `out`, for a
    /// caller that frames them without another copy.
    pub fn encode_snapshot_into(&self, out: &mut Vec<u8>) {
        out.push(SNAPSHOT_VERSION);
        crate::codec::encode_into(out, self).expect("serializing to a Vec cannot fail");
    }

    /// Decodes a table written by [`to_snapshot`](Self::to_snapshot), or by
    /// an earlier format ([`SNAPSHOT_VERSION_5`], without the last restore;
    /// [`SNAPSHOT_VERSION_4`], without pending upgrades;
    /// [`SNAPSHOT_VERSION_3`], whose remembered closes
    /// have no close index: they are forgotten first, by id;
    /// [`SNAPSHOT_VERSION_2`], which also lacked the index floor: such a
    /// table has floor 0), so backups of older clusters can be restored.
    pub fn from_snapshot(bytes: &[u8]) -> Result<Self, SnapshotError> {
        fn decode<T: serde::de::DeserializeOwned>(rest: &[u8]) -> Result<T, SnapshotError> {
            crate::codec::decode(rest).map_err(|e| SnapshotError::Corrupt(e.to_string()))
        }
        let mut table = match bytes.split_first() {
            Some((&SNAPSHOT_VERSION, rest)) => decode::<LockTable>(rest)?,
            Some((&SNAPSHOT_VERSION_5, rest)) => decode::<v5::LockTable>(rest)?.upgrade(),
            Some((&SNAPSHOT_VERSION_4, rest)) => decode::<v4::LockTable>(rest)?.upgrade(),
            Some((&SNAPSHOT_VERSION_3, rest)) => decode::<v3::LockTable>(rest)?.upgrade(),
            Some((&SNAPSHOT_VERSION_2, rest)) => decode::<v2::LockTable>(rest)?.upgrade(),
            Some((&v, _)) => return Err(SnapshotError::Version(v)),
            None => return Err(SnapshotError::Corrupt("empty".into())),
        };
        table.closed_order = table.closed.iter().map(|(id, c)| (c.index, *id)).collect();
        table.usage = super::table::Usage::of(&table);
        table.check_invariants().map_err(SnapshotError::Corrupt)?;
        Ok(table)
    }
}

/// The lock-table format 2 (before the index floor, command digests in the
/// reply window and remembered closes), decoded so backups of older
/// clusters can be restored.
mod v2 {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::super::command::{Fence, LockName, Reply, SessionId};
    use super::super::table::{self, Lock, PendingRestore, Remembered, Replies, WaitRef};

    #[derive(Deserialize)]
    pub(super) struct LockTable {
        sessions: BTreeMap<SessionId, Session>,
        locks: BTreeMap<LockName, Lock>,
        nonces: BTreeMap<u64, SessionId>,
        last_fence: u64,
        restoring: Option<PendingRestore>,
    }

    #[derive(Deserialize)]
    struct Session {
        ttl_ms: u64,
        lock_delay_ms: u64,
        nonce: u64,
        owner: String,
        held: BTreeMap<LockName, Fence>,
        waiting: BTreeMap<LockName, WaitRef>,
        replies: OldReplies,
    }

    #[derive(Deserialize)]
    struct OldReplies {
        map: BTreeMap<u64, Reply>,
        floor: Option<u64>,
    }

    impl LockTable {
        /// The same table in today's format: no floor, no remembered
        /// closes, replies with an unknown digest (any retry matches).
        pub(super) fn upgrade(self) -> table::LockTable {
            let sessions = self
                .sessions
                .into_iter()
                .map(|(id, s)| {
                    let replies = Replies {
                        map: s
                            .replies
                            .map
                            .into_iter()
                            .map(|(seq, reply)| (seq, Remembered { digest: 0, reply }))
                            .collect(),
                        floor: s.replies.floor,
                    };
                    let session = table::Session {
                        ttl_ms: s.ttl_ms,
                        lock_delay_ms: s.lock_delay_ms,
                        nonce: s.nonce,
                        owner: s.owner,
                        held: s.held,
                        waiting: s.waiting,
                        replies,
                        end_on_disconnect_ms: 0,
                        lock_pending: false,
                    };
                    (id, session)
                })
                .collect();
            table::LockTable {
                sessions,
                locks: self.locks,
                nonces: self.nonces,
                last_fence: self.last_fence,
                restoring: self.restoring,
                index_floor: 0,
                closed: BTreeMap::new(),
                closed_order: Default::default(),
                upgrades: BTreeMap::new(),
                groups: BTreeMap::new(),
                restored: None,
                usage: Default::default(),
            }
        }
    }
}

/// The lock-table format 5 (no record of the last restore), decoded so
/// tables and backups written before it still load.
mod v5 {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::super::command::{LockName, SessionId};
    use super::super::table::{self, Closed, Lock, PendingRestore, Session, Upgrade};

    #[derive(Deserialize)]
    pub(super) struct LockTable {
        pub(super) sessions: BTreeMap<SessionId, Session>,
        pub(super) locks: BTreeMap<LockName, Lock>,
        pub(super) nonces: BTreeMap<u64, SessionId>,
        pub(super) last_fence: u64,
        pub(super) restoring: Option<PendingRestore>,
        pub(super) index_floor: u64,
        pub(super) closed: BTreeMap<SessionId, Closed>,
        pub(super) upgrades: BTreeMap<LockName, Upgrade>,
        pub(super) groups: BTreeMap<(SessionId, u64), Vec<LockName>>,
    }

    impl LockTable {
        /// The same table in today's format, with no restore on record (a
        /// retry of the restore that made it is refused, as before).
        pub(super) fn upgrade(self) -> table::LockTable {
            table::LockTable {
                sessions: self.sessions,
                locks: self.locks,
                nonces: self.nonces,
                last_fence: self.last_fence,
                restoring: self.restoring,
                index_floor: self.index_floor,
                closed: self.closed,
                closed_order: Default::default(),
                upgrades: self.upgrades,
                groups: self.groups,
                restored: None,
                usage: Default::default(),
            }
        }
    }
}

/// The lock-table format 4 (no pending upgrades, no atomic requests),
/// decoded so tables and backups written before them still load.
mod v4 {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::super::command::{LockName, SessionId};
    use super::super::table::{self, Closed, Lock, PendingRestore, Session};

    #[derive(Deserialize)]
    pub(super) struct LockTable {
        sessions: BTreeMap<SessionId, Session>,
        locks: BTreeMap<LockName, Lock>,
        nonces: BTreeMap<u64, SessionId>,
        last_fence: u64,
        restoring: Option<PendingRestore>,
        index_floor: u64,
        closed: BTreeMap<SessionId, Closed>,
    }

    impl LockTable {
        /// The same table in format 5, with no upgrade pending, then in
        /// today's format.
        pub(super) fn upgrade(self) -> table::LockTable {
            super::v5::LockTable {
                sessions: self.sessions,
                locks: self.locks,
                nonces: self.nonces,
                last_fence: self.last_fence,
                restoring: self.restoring,
                index_floor: self.index_floor,
                closed: self.closed,
                upgrades: BTreeMap::new(),
                groups: BTreeMap::new(),
            }
            .upgrade()
        }
    }
}

/// The lock-table format 3 (remembered closes without their close index,
/// sessions without a disconnect grace or a pending one-call lock),
/// decoded so backups of clusters before it can be restored.
mod v3 {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::super::command::{Fence, LockName, SessionId};
    use super::super::table::{self, Closed, Lock, PendingRestore, Replies, WaitRef};

    #[derive(Deserialize)]
    struct Session {
        ttl_ms: u64,
        lock_delay_ms: u64,
        nonce: u64,
        owner: String,
        held: BTreeMap<LockName, Fence>,
        waiting: BTreeMap<LockName, WaitRef>,
        replies: Replies,
    }

    #[derive(Deserialize)]
    pub(super) struct LockTable {
        sessions: BTreeMap<SessionId, Session>,
        locks: BTreeMap<LockName, Lock>,
        nonces: BTreeMap<u64, SessionId>,
        last_fence: u64,
        restoring: Option<PendingRestore>,
        index_floor: u64,
        closed: BTreeMap<SessionId, OldClosed>,
    }

    #[derive(Deserialize)]
    struct OldClosed {
        seq: u64,
        released: u32,
        owner: String,
    }

    impl LockTable {
        /// The same table in today's format; its closes get close index 0,
        /// so they are forgotten before any later close, lowest id first.
        pub(super) fn upgrade(self) -> table::LockTable {
            let closed = self
                .closed
                .into_iter()
                .map(|(id, c)| {
                    let closed = Closed {
                        index: 0,
                        seq: c.seq,
                        released: c.released,
                        owner: c.owner,
                    };
                    (id, closed)
                })
                .collect();
            let sessions = self
                .sessions
                .into_iter()
                .map(|(id, s)| {
                    let session = table::Session {
                        ttl_ms: s.ttl_ms,
                        lock_delay_ms: s.lock_delay_ms,
                        nonce: s.nonce,
                        owner: s.owner,
                        held: s.held,
                        waiting: s.waiting,
                        replies: s.replies,
                        end_on_disconnect_ms: 0,
                        lock_pending: false,
                    };
                    (id, session)
                })
                .collect();
            table::LockTable {
                sessions,
                locks: self.locks,
                nonces: self.nonces,
                last_fence: self.last_fence,
                restoring: self.restoring,
                index_floor: self.index_floor,
                closed,
                closed_order: Default::default(),
                upgrades: BTreeMap::new(),
                groups: BTreeMap::new(),
                restored: None,
                usage: Default::default(),
            }
        }
    }
}
