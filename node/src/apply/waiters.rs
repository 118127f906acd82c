//! The registry of parked blocking acquires.
//!
//! A blocking acquire that the table queued is answered when its grant (or
//! its cancellation) is applied on this node. The handler registers while
//! holding the table's read lock, after seeing the request still queued;
//! the apply path wakes registrations while holding the write lock. So a
//! wake-up can never fall between the check and the registration.

use std::collections::BTreeMap;
use std::sync::Mutex;
use tokio::time::Instant;

use tokio::sync::oneshot;

use crate::state::{Acquired, Event, LockName, LockTable, SessionId};

/// How a parked acquire ended.
pub type Outcome = Acquired;

/// A parked acquire's outcome and when it was applied (to time the
/// wake-up, see `metrics::stages`).
pub type Wake = (Outcome, Instant);

type Key = (SessionId, LockName);

/// Parked acquires by (session, name).
#[derive(Default)]
pub struct Waiters {
    /// Ordered, so that waking all of them (`fail_all`) answers in the same
    /// order on every run (the simulator's determinism).
    parked: Mutex<BTreeMap<Key, Vec<oneshot::Sender<Wake>>>>,
}

impl Waiters {
    /// Parks a request of `session` for `name`. Call with the table
    /// read-locked, after checking the request is still queued.
    pub fn register(&self, session: SessionId, name: LockName) -> oneshot::Receiver<Wake> {
        let (tx, rx) = oneshot::channel();
        let mut parked = self.parked.lock().expect("waiters lock poisoned");
        let list = parked.entry((session, name)).or_default();
        // Drop registrations whose handler has gone away (client hung up).
        list.retain(|tx| !tx.is_closed());
        list.push(tx);
        rx
    }

    /// Number of parked requests.
    pub fn len(&self) -> usize {
        self.parked
            .lock()
            .expect("waiters lock poisoned")
            .values()
            .map(Vec::len)
            .sum()
    }

    /// True if nothing is parked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Wakes requests settled by `events` (applied at command index
    /// `index`).
    pub fn on_events(&self, index: u64, events: &[Event]) {
        let mut parked = self.parked.lock().expect("waiters lock poisoned");
        if parked.is_empty() {
            return;
        }
        let now = Instant::now();
        for e in events {
            let (key, outcome) = match e {
                Event::Granted {
                    name,
                    session,
                    fence,
                    mode,
                    ..
                } => (
                    (*session, name.clone()),
                    Acquired::Granted {
                        fence: *fence,
                        mode: *mode,
                        index,
                    },
                ),
                Event::Cancelled { name, session, .. } => {
                    ((*session, name.clone()), Acquired::NotAcquired)
                }
                _ => continue,
            };
            if let Some(list) = parked.remove(&key) {
                for tx in list {
                    let _ = tx.send((outcome, now));
                }
            }
        }
    }

    /// Drops every parked request without an outcome: this node stopped
    /// leading or is shutting down and may never apply their outcome. Their
    /// handlers answer `UNAVAILABLE` with the leader's address, and clients
    /// retry there with the same seq.
    pub fn fail_all(&self) {
        let dropped = std::mem::take(&mut *self.parked.lock().expect("waiters lock poisoned"));
        if !dropped.is_empty() {
            tracing::info!(
                parked = dropped.len(),
                "releasing parked acquires to retry at the leader"
            );
        }
    }

    /// After a snapshot replaced the table: settles every parked request
    /// whose fate the new table already shows.
    pub fn recheck(&self, table: &LockTable) {
        let mut parked = self.parked.lock().expect("waiters lock poisoned");
        let now = Instant::now();
        parked.retain(
            |(session, name), list| match table.standing(*session, name) {
                Acquired::Queued => true,
                outcome => {
                    for tx in list.drain(..) {
                        let _ = tx.send((outcome, now));
                    }
                    false
                }
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{CancelCause, Fence, Mode};

    #[test]
    fn grant_and_cancel_wake_only_their_own_waiters() {
        let waiters = Waiters::default();
        let a = LockName::new("a").expect("valid");
        let mut granted = waiters.register(SessionId(1), a.clone());
        let mut cancelled = waiters.register(SessionId(2), a.clone());
        let mut other = waiters.register(SessionId(3), a.clone());
        waiters.on_events(
            9,
            &[
                Event::Granted {
                    name: a.clone(),
                    session: SessionId(1),
                    seq: 1,
                    fence: Fence(4),
                    mode: Mode::Exclusive,
                },
                Event::Cancelled {
                    name: a.clone(),
                    session: SessionId(2),
                    seq: 1,
                    mode: Mode::Exclusive,
                    cause: CancelCause::TimedOut,
                },
            ],
        );
        assert_eq!(
            granted.try_recv().expect("woken").0,
            Acquired::Granted {
                fence: Fence(4),
                mode: Mode::Exclusive,
                index: 9
            }
        );
        assert_eq!(
            cancelled.try_recv().expect("woken").0,
            Acquired::NotAcquired
        );
        assert!(other.try_recv().is_err(), "session 3 is still waiting");
        assert_eq!(waiters.len(), 1);
    }
}
