//! The console's side table: when this node applied each live grant and
//! wait, and the latest events (its tail).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::{now_ms, MAX_CONSOLE_EVENTS};
use crate::apply::WatchItem;
use crate::state::{EndCause, Event};

/// The side table: when this node applied each live grant and wait, and
/// the latest events. Information only.
/// It also times lock waits and holds for the metrics (on the monotonic
/// clock).
#[derive(Default)]
pub struct Notes {
    inner: Mutex<NotesInner>,
    /// Where lock wait and hold times go (none in unit tests).
    metrics: Option<Arc<crate::metrics::Metrics>>,
}

/// When something was applied here: wall clock (shown) and monotonic
/// (measured).
type Noted = (u64, Instant);

#[derive(Default)]
struct NotesInner {
    /// (name, fence) of a grant → when it was applied here.
    grants: BTreeMap<(String, u64), Noted>,
    /// (session, name, seq) of a queued request → when it was applied here.
    waits: BTreeMap<(u64, String, u64), Noted>,
    /// The latest events, oldest first.
    tail: VecDeque<TailEvent>,
}

/// One event of the tail.
#[derive(Clone, Debug, Serialize)]
pub struct TailEvent {
    /// When this node applied it (ms since the epoch, its wall clock).
    pub at_unix_ms: u64,
    /// The log index of the entry.
    pub index: u64,
    /// granted, queued, released, expired, closed, revoked, cancelled,
    /// upgraded, downgraded, lock-delay-started, lock-delay-ended.
    pub kind: &'static str,
    /// The name.
    pub name: String,
    /// The session concerned (0: none).
    pub session: u64,
    /// The grant's fence (0: none).
    pub fence: u64,
    /// Revoked grants: who revoked the session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked_by: Option<String>,
}

impl Notes {
    /// Notes that also time lock waits and holds into `metrics`.
    pub fn with_metrics(metrics: Arc<crate::metrics::Metrics>) -> Notes {
        Notes {
            inner: Mutex::default(),
            metrics: Some(metrics),
        }
    }

    /// Notes the events of one applied entry at `at_unix_ms`.
    pub fn record(&self, index: u64, events: &[Event], at_unix_ms: u64) {
        let now = Instant::now();
        let noted = (at_unix_ms, now);
        let mut n = self.inner.lock().expect("console notes poisoned");
        let mut revoked_by: Option<String> = None;
        for e in events {
            let (kind, name, session, fence) = match e {
                Event::SessionRevoked { by, .. } => {
                    revoked_by = Some(by.clone());
                    continue;
                }
                Event::SessionOpened { .. }
                | Event::SessionEnded { .. }
                | Event::SessionTtlChanged { .. } => continue,
                Event::Granted {
                    name,
                    session,
                    seq,
                    fence,
                    ..
                } => {
                    let waited = n
                        .waits
                        .remove(&(session.0, name.as_str().to_string(), *seq));
                    if let (Some((_, since)), Some(m)) = (waited, &self.metrics) {
                        m.lock_wait(name.as_str(), now.saturating_duration_since(since));
                    }
                    n.grants.insert((name.as_str().to_string(), fence.0), noted);
                    ("granted", name, session.0, fence.0)
                }
                Event::Queued {
                    name, session, seq, ..
                } => {
                    n.waits
                        .insert((session.0, name.as_str().to_string(), *seq), noted);
                    ("queued", name, session.0, 0)
                }
                Event::Ended {
                    name,
                    session,
                    fence,
                    cause,
                    ..
                } => {
                    let held = n.grants.remove(&(name.as_str().to_string(), fence.0));
                    if let (Some((_, since)), Some(m)) = (held, &self.metrics) {
                        m.lock_hold(name.as_str(), now.saturating_duration_since(since));
                    }
                    let kind = match cause {
                        EndCause::Released => "released",
                        EndCause::SessionClosed => "closed",
                        EndCause::SessionExpired => "expired",
                        EndCause::Upgraded => "upgraded",
                        EndCause::Revoked => "revoked",
                    };
                    (kind, name, session.0, fence.0)
                }
                Event::Cancelled {
                    name, session, seq, ..
                } => {
                    n.waits
                        .remove(&(session.0, name.as_str().to_string(), *seq));
                    ("cancelled", name, session.0, 0)
                }
                Event::LockDelayStarted { name, .. } => ("lock-delay-started", name, 0, 0),
                Event::LockDelayEnded { name } => ("lock-delay-ended", name, 0, 0),
                Event::Downgraded {
                    name,
                    session,
                    fence,
                } => ("downgraded", name, session.0, fence.0),
            };
            let revoked_by = (kind == "revoked").then(|| revoked_by.clone().unwrap_or_default());
            n.tail.push_back(TailEvent {
                at_unix_ms,
                index,
                kind,
                name: name.as_str().to_string(),
                session,
                fence,
                revoked_by,
            });
            while n.tail.len() > MAX_CONSOLE_EVENTS {
                n.tail.pop_front();
            }
        }
    }

    /// Forgets every time (a snapshot replaced the table, or events were
    /// missed): what is live now has no known time.
    pub fn forget(&self) {
        let mut n = self.inner.lock().expect("console notes poisoned");
        n.grants.clear();
        n.waits.clear();
    }

    pub(super) fn grant_since(&self, name: &str, fence: u64) -> Option<u64> {
        let n = self.inner.lock().expect("console notes poisoned");
        n.grants.get(&(name.to_string(), fence)).map(|t| t.0)
    }

    pub(super) fn wait_since(&self, session: u64, name: &str, seq: u64) -> Option<u64> {
        let n = self.inner.lock().expect("console notes poisoned");
        n.waits.get(&(session, name.to_string(), seq)).map(|t| t.0)
    }

    /// How long the oldest live grant has been held and the oldest queued
    /// request has waited, as far as this process saw them applied (for
    /// the metrics; zero when there is none).
    pub fn oldest(&self) -> (std::time::Duration, std::time::Duration) {
        let n = self.inner.lock().expect("console notes poisoned");
        fn age<K>(m: &BTreeMap<K, Noted>) -> std::time::Duration {
            m.values()
                .map(|(_, since)| since.elapsed())
                .max()
                .unwrap_or_default()
        }
        (age(&n.grants), age(&n.waits))
    }

    pub(super) fn tail(&self) -> Vec<TailEvent> {
        let n = self.inner.lock().expect("console notes poisoned");
        n.tail.iter().cloned().collect()
    }
}

/// Follows the applied events of `watch` into `notes` until the channel
/// closes (the node stops). Subscribe before the first apply so nothing
/// is missed.
pub async fn follow(notes: Arc<Notes>, mut watch: broadcast::Receiver<Arc<WatchItem>>) {
    loop {
        match watch.recv().await {
            Ok(item) => match item.as_ref() {
                WatchItem::Events { index, events } => notes.record(*index, events, now_ms()),
                WatchItem::Reset => notes.forget(),
            },
            Err(broadcast::error::RecvError::Lagged(_)) => notes.forget(),
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}
