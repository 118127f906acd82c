//! The client's own types for what the cluster hands out and reports, and
//! every conversion from the .proto's messages, in one place.
//!
//! Fences and session ids are distinct types, so one cannot be passed where
//! the other is meant. Enums the server sends as numbers are checked here:
//! a number the .proto does not define is an [`Error::Internal`], never a
//! silent default.

use std::fmt;
use std::str::FromStr;

use raftlock_proto::v1 as pb;

use crate::error::{Error, Result};

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(
            Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(u64);

        impl $name {
            #[doc = concat!("A ", $what, " with the value `raw` (as read from the wire, a file or the environment).")]
            pub const fn new(raw: u64) -> Self {
                Self(raw)
            }

            #[doc = concat!("The ", $what, "'s number.")]
            pub const fn get(self) -> u64 {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl FromStr for $name {
            type Err = std::num::ParseIntError;

            fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
                s.trim().parse().map(Self)
            }
        }

        impl From<$name> for u64 {
            fn from(v: $name) -> u64 {
                v.0
            }
        }
    };
}

id_type!(
    /// A fencing token: every grant gets a fresh one, larger than any the
    /// cluster gave before. Stores refuse writes that carry a smaller fence
    /// than one they have accepted (see [`crate::fence`]). Programs run by
    /// `raftlock lock` read it from `RAFTLOCK_FENCE`
    /// (`std::env::var("RAFTLOCK_FENCE")?.parse::<Fence>()`).
    Fence,
    "fence"
);

id_type!(
    /// A session's id, as the cluster assigned it.
    SessionId,
    "session id"
);

/// How a name is held or waited for, without amounts (see [`Holder`] and
/// [`Waiter`] for the weight).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockMode {
    /// An exclusive lock.
    Exclusive,
    /// A shared lock.
    Shared,
    /// Semaphore permits.
    Semaphore,
}

impl LockMode {
    /// The mode's name in the CLI's output: `exclusive`, `shared`,
    /// `semaphore`.
    pub fn as_str(self) -> &'static str {
        match self {
            LockMode::Exclusive => "exclusive",
            LockMode::Shared => "shared",
            LockMode::Semaphore => "semaphore",
        }
    }

    pub(crate) fn from_pb(mode: i32) -> Result<LockMode> {
        match pb::Mode::try_from(mode) {
            Ok(pb::Mode::Exclusive) => Ok(LockMode::Exclusive),
            Ok(pb::Mode::Shared) => Ok(LockMode::Shared),
            Ok(pb::Mode::Semaphore) => Ok(LockMode::Semaphore),
            Err(_) => Err(undefined("Mode", mode)),
        }
    }
}

impl fmt::Display for LockMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

fn undefined(what: &str, n: i32) -> Error {
    Error::Internal(format!(
        "the server sent {what} {n}, which the .proto does not define"
    ))
}

/// What a name is: a lock (exclusive or shared) or a semaphore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockKind {
    /// A lock, held exclusively or shared.
    Lock,
    /// A semaphore of `capacity` permits.
    Semaphore {
        /// Permits in all.
        capacity: u32,
    },
}

/// One grant on a name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The session holding it.
    pub session: SessionId,
    /// Its fence.
    pub fence: Fence,
    /// How it is held.
    pub mode: LockMode,
    /// Permits held (1 for locks).
    pub weight: u32,
    /// The value the holder attached (e.g. a leader's address).
    pub value: Vec<u8>,
    /// The log index of the grant.
    pub granted_index: u64,
}

/// One queued acquire on a name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiter {
    /// The session waiting.
    pub session: SessionId,
    /// The acquire's sequence number in that session.
    pub seq: u64,
    /// The mode asked for.
    pub mode: LockMode,
    /// Permits asked for (1 for locks).
    pub weight: u32,
    /// The log index at which it queued.
    pub queued_index: u64,
}

/// A name's state: who holds it, who waits, whether it is lock-delayed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockInfo {
    /// The name.
    pub name: String,
    /// Lock or semaphore.
    pub kind: LockKind,
    /// Current grants, oldest first.
    pub holders: Vec<Holder>,
    /// Queued acquires, in the order they will be served.
    pub waiters: Vec<Waiter>,
    /// True while the name is held back after an expiry (lock-delay).
    pub lock_delayed: bool,
}

impl TryFrom<pb::LockInfo> for LockInfo {
    type Error = Error;

    fn try_from(i: pb::LockInfo) -> Result<LockInfo> {
        let holders = i
            .holders
            .into_iter()
            .map(|h| {
                Ok(Holder {
                    session: SessionId(h.session_id),
                    fence: Fence(h.fence),
                    mode: LockMode::from_pb(h.mode)?,
                    weight: h.weight,
                    value: h.value,
                    granted_index: h.granted_index,
                })
            })
            .collect::<Result<_>>()?;
        let waiters = i
            .waiters
            .into_iter()
            .map(|w| {
                Ok(Waiter {
                    session: SessionId(w.session_id),
                    seq: w.seq,
                    mode: LockMode::from_pb(w.mode)?,
                    weight: w.weight,
                    queued_index: w.queued_index,
                })
            })
            .collect::<Result<_>>()?;
        Ok(LockInfo {
            name: i.name,
            kind: if i.semaphore {
                LockKind::Semaphore {
                    capacity: i.capacity,
                }
            } else {
                LockKind::Lock
            },
            holders,
            waiters,
            lock_delayed: i.lock_delayed,
        })
    }
}

/// What happened to a watched name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A grant was made.
    Granted,
    /// An acquire queued.
    Queued,
    /// A grant was released.
    Released,
    /// A session expired, taking its grants (and waits) with it.
    Expired,
    /// A queued acquire was withdrawn or timed out.
    Cancelled,
    /// The name is held back after an expiry (lock-delay).
    LockDelayStarted,
    /// The lock-delay ended; the name can be granted again.
    LockDelayEnded,
    /// A shared grant ended because its holder upgraded it (a `Granted`
    /// event with the exclusive grant's new fence follows).
    Upgraded,
    /// An exclusive grant became shared, keeping its fence.
    Downgraded,
    /// A grant ended because an administrator revoked its session
    /// ([`WatchEvent::revoked_by`] says who).
    Revoked,
}

impl EventKind {
    /// The kind's name in the CLI's output (`granted`, `lock-delay-ended`…).
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Granted => "granted",
            EventKind::Queued => "queued",
            EventKind::Released => "released",
            EventKind::Expired => "expired",
            EventKind::Cancelled => "cancelled",
            EventKind::LockDelayStarted => "lock-delay-started",
            EventKind::LockDelayEnded => "lock-delay-ended",
            EventKind::Upgraded => "upgraded",
            EventKind::Downgraded => "downgraded",
            EventKind::Revoked => "revoked",
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One event of a watch stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    /// The log index that caused it.
    pub index: u64,
    /// What happened.
    pub kind: EventKind,
    /// The name it happened to.
    pub name: String,
    /// The session concerned (none for lock-delay events).
    pub session: Option<SessionId>,
    /// The grant's fence (granted and released events).
    pub fence: Option<Fence>,
    /// The mode (granted, queued, released and cancelled events).
    pub mode: LockMode,
    /// Permits (1 for locks).
    pub weight: u32,
    /// Revoked events: the identity of the administrator who revoked the
    /// session ("" without access control) and when, in milliseconds
    /// since the Unix epoch by the wall clock of the node that proposed
    /// it.
    pub revoked: Option<(String, u64)>,
}

impl TryFrom<pb::WatchEvent> for WatchEvent {
    type Error = Error;

    fn try_from(e: pb::WatchEvent) -> Result<WatchEvent> {
        let kind = match pb::EventKind::try_from(e.kind) {
            Ok(pb::EventKind::Granted) => EventKind::Granted,
            Ok(pb::EventKind::Queued) => EventKind::Queued,
            Ok(pb::EventKind::Released) => EventKind::Released,
            Ok(pb::EventKind::Expired) => EventKind::Expired,
            Ok(pb::EventKind::Cancelled) => EventKind::Cancelled,
            Ok(pb::EventKind::LockDelayStarted) => EventKind::LockDelayStarted,
            Ok(pb::EventKind::LockDelayEnded) => EventKind::LockDelayEnded,
            Ok(pb::EventKind::Upgraded) => EventKind::Upgraded,
            Ok(pb::EventKind::Downgraded) => EventKind::Downgraded,
            Ok(pb::EventKind::Revoked) => EventKind::Revoked,
            Ok(pb::EventKind::Unspecified) | Err(_) => return Err(undefined("EventKind", e.kind)),
        };
        Ok(WatchEvent {
            index: e.index,
            kind,
            name: e.name,
            session: (e.session_id != 0).then_some(SessionId(e.session_id)),
            fence: (e.fence != 0).then_some(Fence(e.fence)),
            mode: LockMode::from_pb(e.mode)?,
            weight: e.weight,
            revoked: (kind == EventKind::Revoked).then_some((e.revoked_by, e.revoked_at_unix_ms)),
        })
    }
}

/// The events of [`crate::Client::watch`], in log order.
pub type WatchStream = futures::stream::BoxStream<'static, Result<WatchEvent>>;

/// A cluster member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its node id.
    pub id: u64,
    /// The address clients use.
    pub addr: String,
    /// The address peers use, when it serves them on a port of its own
    /// (`raftlockd run --peer-listen`).
    pub peer_addr: Option<String>,
    /// A voter (else a learner).
    pub voter: bool,
}

impl From<pb::Member> for Member {
    fn from(m: pb::Member) -> Member {
        Member {
            id: m.id,
            addr: m.addr,
            peer_addr: (!m.peer_addr.is_empty()).then_some(m.peer_addr),
            voter: m.voter,
        }
    }
}

pub(crate) fn members(members: Vec<pb::Member>) -> Vec<Member> {
    members.into_iter().map(Member::from).collect()
}

/// A node's Raft role.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The leader: it serves writes and linearizable reads.
    Leader,
    /// A voting follower.
    Follower,
    /// Campaigning for leadership.
    Candidate,
    /// A non-voting member catching up.
    Learner,
    /// A role this client does not know (a newer server).
    Other(String),
}

impl Role {
    fn parse(role: String) -> Role {
        match role.as_str() {
            "leader" => Role::Leader,
            "follower" => Role::Follower,
            "candidate" => Role::Candidate,
            "learner" => Role::Learner,
            _ => Role::Other(role),
        }
    }

    /// The role as the server names it.
    pub fn as_str(&self) -> &str {
        match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
            Role::Candidate => "candidate",
            Role::Learner => "learner",
            Role::Other(s) => s,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One node's view of the cluster, and the lock table's counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeStatus {
    /// The node's id.
    pub id: u64,
    /// The node's client address.
    pub addr: String,
    /// Its Raft role.
    pub role: Role,
    /// Its current term.
    pub term: u64,
    /// The leader it knows, if any: (id, client address).
    pub leader: Option<(u64, String)>,
    /// Its commit index.
    pub commit_index: u64,
    /// The last log index its lock table applied.
    pub applied_index: u64,
    /// The last index in its log.
    pub last_log_index: u64,
    /// The membership it knows.
    pub members: Vec<Member>,
    /// Live sessions in its lock table.
    pub sessions: u64,
    /// Grants held.
    pub grants: u64,
    /// Queued acquires.
    pub waiters: u64,
    /// The largest fence given so far (none before the first grant).
    pub last_fence: Option<Fence>,
}

impl From<pb::StatusResponse> for NodeStatus {
    fn from(s: pb::StatusResponse) -> NodeStatus {
        NodeStatus {
            id: s.id,
            addr: s.addr,
            role: Role::parse(s.role),
            term: s.term,
            leader: (s.leader_id != 0).then_some((s.leader_id, s.leader_addr)),
            commit_index: s.commit_index,
            applied_index: s.applied_index,
            last_log_index: s.last_log_index,
            members: members(s.members),
            sessions: s.sessions,
            grants: s.grants,
            waiters: s.waiters,
            last_fence: (s.last_fence != 0).then_some(Fence(s.last_fence)),
        }
    }
}

/// A consistent backup of the lock table (see [`crate::Client::backup`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backup {
    /// The backup file (the lock table with a header and a SHA-256
    /// checksum; [`crate::backup`] reads it), for
    /// [`crate::Client::restore`] or `raftlockd restore`.
    pub snapshot: Vec<u8>,
    /// The log index it reflects.
    pub index: u64,
    /// The largest fence given when it was taken.
    pub last_fence: Option<Fence>,
}

impl From<pb::BackupResponse> for Backup {
    fn from(b: pb::BackupResponse) -> Backup {
        Backup {
            snapshot: b.snapshot,
            index: b.index,
            last_fence: (b.last_fence != 0).then_some(Fence(b.last_fence)),
        }
    }
}

/// What a restore installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restored {
    /// Sessions restored (each with a fresh full lease).
    pub sessions: u64,
    /// The fence counter after the bump: every later grant's fence is
    /// larger.
    pub last_fence: Fence,
}

impl From<pb::RestoreResponse> for Restored {
    fn from(r: pb::RestoreResponse) -> Restored {
        Restored {
            sessions: r.sessions,
            last_fence: Fence(r.last_fence),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_and_session_ids_parse_print_and_order() {
        let f: Fence = " 42\n".parse().expect("a number");
        assert_eq!((f.get(), f.to_string()), (42, "42".to_string()));
        assert!(Fence::new(7) < Fence::new(8));
        assert!("x".parse::<Fence>().is_err());
        assert!("-1".parse::<SessionId>().is_err());
        assert_eq!(u64::from(SessionId::new(9)), 9);
    }

    #[test]
    fn numbers_the_proto_does_not_define_are_errors() {
        let info = pb::LockInfo {
            name: "a".into(),
            holders: vec![pb::Holder {
                session_id: 1,
                fence: 2,
                mode: 9,
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(matches!(LockInfo::try_from(info), Err(Error::Internal(_))));
        let event = pb::WatchEvent {
            kind: 0,
            ..Default::default()
        };
        assert!(matches!(
            WatchEvent::try_from(event),
            Err(Error::Internal(_))
        ));
        let event = pb::WatchEvent {
            kind: 42,
            ..Default::default()
        };
        assert!(WatchEvent::try_from(event).is_err());
    }

    #[test]
    fn conversions_keep_every_field() {
        let info = LockInfo::try_from(pb::LockInfo {
            name: "s".into(),
            semaphore: true,
            capacity: 5,
            holders: vec![pb::Holder {
                session_id: 3,
                fence: 11,
                mode: pb::Mode::Semaphore as i32,
                weight: 2,
                value: b"v".to_vec(),
                granted_index: 17,
            }],
            waiters: vec![pb::Waiter {
                session_id: 4,
                seq: 6,
                mode: pb::Mode::Semaphore as i32,
                weight: 4,
                queued_index: 19,
            }],
            lock_delayed: true,
        })
        .expect("valid");
        assert_eq!(info.kind, LockKind::Semaphore { capacity: 5 });
        assert_eq!(
            info.holders,
            [Holder {
                session: SessionId::new(3),
                fence: Fence::new(11),
                mode: LockMode::Semaphore,
                weight: 2,
                value: b"v".to_vec(),
                granted_index: 17,
            }]
        );
        assert_eq!(
            info.waiters,
            [Waiter {
                session: SessionId::new(4),
                seq: 6,
                mode: LockMode::Semaphore,
                weight: 4,
                queued_index: 19,
            }]
        );
        assert!(info.lock_delayed);
        let status = NodeStatus::from(pb::StatusResponse {
            role: "learner".into(),
            leader_id: 2,
            leader_addr: "x:1".into(),
            members: vec![pb::Member {
                id: 2,
                addr: "x:1".into(),
                voter: true,
                peer_addr: String::new(),
            }],
            ..Default::default()
        });
        assert_eq!(status.role, Role::Learner);
        assert_eq!(status.leader, Some((2, "x:1".to_string())));
        assert_eq!(status.members[0].peer_addr, None);
        assert_eq!(status.last_fence, None);
        assert_eq!(Role::parse("observer".into()).as_str(), "observer");
    }
}
