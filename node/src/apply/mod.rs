//! The apply path: openraft's state-machine store
//! ([`state_machine::StateMachineStore`]) and the state it shares with the
//! request handlers.
//!
//! The apply path (openraft's state-machine task) is the only writer of the
//! table. While it holds the write lock it also tells the three observers
//! what happened, so none of them can miss an event between reading the
//! table and registering interest:
//!
//! * [`Waiters`]: parked blocking acquires, woken by their grant or
//!   cancellation;
//! * [`Leases`]: the leader's timers (they only track while leader);
//! * the watch broadcast, which feeds `Watch` streams.

pub mod snapshot_location;
pub mod state_machine;
pub mod waiters;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::broadcast;

use crate::leases::Leases;
use crate::metrics::{Counter, Metrics};
use crate::raft::{command_index, Batch, LogId, StoredMembership, TypeConfig};
use crate::state::{CancelCause, EndCause, Event, LockTable, Response};
use waiters::Waiters;

/// The openraft handle used throughout the node (its state machine is
/// this module's [`StateMachineStore`](state_machine::StateMachineStore)).
pub type Raft = openraft::Raft<TypeConfig, state_machine::StateMachineStore>;

/// The applied state machine.
pub struct AppliedState {
    /// The lock table.
    pub table: LockTable,
    /// The last log id applied to it.
    pub last_applied: Option<LogId>,
    /// The last membership applied.
    pub membership: StoredMembership,
}

impl AppliedState {
    /// The log index last applied (0: none).
    pub fn index(&self) -> u64 {
        self.last_applied.map_or(0, |l| l.index)
    }
}

/// What a watch stream receives.
#[derive(Debug)]
pub enum WatchItem {
    /// Events of one applied command.
    Events {
        /// The command's log index.
        index: u64,
        /// What it did.
        events: Vec<Event>,
    },
    /// A snapshot replaced the table: events in between are not known, so
    /// watchers must re-read.
    Reset,
}

/// Capacity of the watch broadcast, in applied commands. A watcher that
/// falls further behind is told to re-read and watch again.
pub const WATCH_BUFFER: usize = 4096;

/// Everything the apply path and the handlers share.
pub struct Shared {
    /// The table and what has been applied to it: read through
    /// [`Shared::read`]; only the apply path (this module) writes it.
    applied: RwLock<AppliedState>,
    /// The latest snapshot's encoded bytes.
    snapshot: Mutex<Option<Arc<Vec<u8>>>>,
    /// Parked blocking acquires.
    pub waiters: Waiters,
    /// The leader's timers.
    pub leases: Arc<Leases>,
    /// Applied events for `Watch`.
    pub watch: broadcast::Sender<Arc<WatchItem>>,
    /// Counters for `/metrics`.
    pub metrics: Arc<Metrics>,
    /// The highest log index this node knows committed (the log store's
    /// marker, updated whenever openraft saves it).
    pub committed: Arc<AtomicU64>,
    /// Set when the node is stopping: handlers answer `UNAVAILABLE` at once
    /// instead of waiting on a Raft that will not answer.
    pub stopping: std::sync::atomic::AtomicBool,
    /// Applies and installs take it shared; whoever encodes the whole table
    /// (the snapshot builder, `Backup`) takes it exclusively while it does.
    /// The table's own lock is a blocking `std` lock: without this gate, an
    /// apply arriving during a long encode would block its tokio worker
    /// thread in `RwLock::write` (and, the lock preferring writers, every
    /// reader after it), and with two cores that stalls the whole node:
    /// Raft heartbeats, reads, keep-alives. Behind the gate the apply waits
    /// as a parked task, and only applies wait.
    pub snapshot_gate: Arc<tokio::sync::RwLock<()>>,
    /// Counts the changes of the applied membership (a membership entry
    /// applied, a snapshot installed), so that whoever waits on it is
    /// woken by those alone and not by every apply.
    memberships: tokio::sync::watch::Sender<u64>,
}

impl Shared {
    /// An empty state; `committed` is the log store's commit marker.
    pub fn new(committed: Arc<AtomicU64>) -> Arc<Self> {
        Arc::new(Shared {
            applied: RwLock::new(AppliedState {
                table: LockTable::new(),
                last_applied: None,
                membership: StoredMembership::default(),
            }),
            snapshot: Mutex::new(None),
            waiters: Waiters::default(),
            leases: Arc::new(Leases::default()),
            watch: broadcast::channel(WATCH_BUFFER).0,
            metrics: Arc::new(Metrics::default()),
            committed,
            stopping: std::sync::atomic::AtomicBool::new(false),
            snapshot_gate: Arc::default(),
            memberships: tokio::sync::watch::Sender::new(0),
        })
    }

    /// A receiver that sees a change each time the applied membership
    /// changes (read it with [`Shared::read`]).
    pub fn membership_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.memberships.subscribe()
    }

    /// An empty state for unit tests.
    #[cfg(test)]
    pub fn new_for_tests() -> Arc<Self> {
        Self::new(Arc::default())
    }

    /// Runs `f` on the applied state under the read lock (applies wait
    /// meanwhile, so keep `f` short; encoding the whole table goes behind
    /// [`Shared::snapshot_gate`] on a blocking thread).
    pub fn read<R>(&self, f: impl FnOnce(&AppliedState) -> R) -> R {
        f(&self.applied.read().expect("applied lock poisoned"))
    }

    /// Applies one entry's commands in order and tells the observers.
    pub fn apply(&self, log_id: LogId, batch: Batch) -> Vec<Response> {
        let mut applied = self.applied.write().expect("applied lock poisoned");
        let mut responses = Vec::with_capacity(batch.0.len());
        for (position, command) in batch.0.into_iter().enumerate() {
            let index = command_index(log_id.index, position);
            let response = applied.table.apply(index, command);
            if let Some(Event::SessionRevoked {
                session,
                by,
                at_unix_ms,
            }) = response.events.first()
            {
                // The record every node keeps of a revoke.
                tracing::warn!(
                    session = session.0,
                    by = %by,
                    at_unix_ms,
                    index,
                    reply = ?response.reply,
                    "session revoked by an administrator"
                );
            }
            if !response.events.is_empty() {
                self.waiters.on_events(index, &response.events);
                count(&self.metrics, &response.events);
                self.leases.on_events(&response.events);
                if self.watch.receiver_count() > 0 {
                    let _ = self.watch.send(Arc::new(WatchItem::Events {
                        index: log_id.index,
                        events: response.events.clone(),
                    }));
                }
            }
            responses.push(response);
        }
        applied.last_applied = Some(log_id);
        responses
    }

    /// Records a blank or membership entry as applied.
    pub fn advance(&self, log_id: LogId, membership: Option<StoredMembership>) {
        let mut applied = self.applied.write().expect("applied lock poisoned");
        applied.last_applied = Some(log_id);
        if let Some(m) = membership {
            applied.membership = m;
            drop(applied);
            self.memberships.send_modify(|n| *n += 1);
        }
    }

    /// Replaces the table with one from a snapshot.
    pub fn install(
        &self,
        table: LockTable,
        last_applied: Option<LogId>,
        membership: StoredMembership,
    ) {
        let mut applied = self.applied.write().expect("applied lock poisoned");
        applied.table = table;
        applied.last_applied = last_applied;
        applied.membership = membership;
        self.waiters.recheck(&applied.table);
        drop(applied);
        self.memberships.send_modify(|n| *n += 1);
        let _ = self.watch.send(Arc::new(WatchItem::Reset));
    }

    /// The latest snapshot's bytes.
    pub fn snapshot(&self) -> Option<Arc<Vec<u8>>> {
        self.snapshot
            .lock()
            .expect("snapshot lock poisoned")
            .clone()
    }

    /// Records the latest snapshot's bytes.
    pub fn set_snapshot(&self, bytes: Arc<Vec<u8>>) {
        *self.snapshot.lock().expect("snapshot lock poisoned") = Some(bytes);
    }
}

/// Counts the grants, releases, expiries and wait timeouts in applied
/// events.
fn count(metrics: &Metrics, events: &[Event]) {
    for e in events {
        let counter = match e {
            Event::Granted { .. } => Counter::Grants,
            Event::Ended {
                cause: EndCause::Released,
                ..
            } => Counter::Releases,
            Event::SessionEnded { expired: true, .. } => Counter::Expiries,
            Event::SessionRevoked { .. } => Counter::SessionsRevoked,
            Event::Cancelled {
                cause: CancelCause::TimedOut,
                ..
            } => Counter::WaitTimeouts,
            _ => continue,
        };
        metrics.count(counter);
    }
}
