//! The health of this node's links to its peers: when a failing peer may be
//! tried again, and what the operator is told about it.
//!
//! openraft alone would retry a dead peer as fast as the network fails. Its
//! replication backoff sleeps inside the stream of requests it hands the
//! network, and a connection refused before the first request is taken
//! never reaches that sleep; its heartbeats have no backoff at all. On
//! 6bd3e3c that was over 12,000 failed RPCs a second to one stopped
//! follower, a core and a half of CPU, and not one log line.
//!
//! So every outgoing RPC asks [`Links::admit`] first. A peer whose last
//! attempt failed is tried again only after a delay that doubles with each
//! failure, from [`FIRST_RETRY`] up to [`MAX_RETRY`], times a random factor
//! in `[1/2, 1]` (so the nodes of a cluster do not retry in step); an RPC
//! asked for sooner fails at once without touching the network. The first
//! success ends the backoff: the peer's next RPC goes out at once, and
//! [`Links`] tells its owner (who resets openraft's replication backoff
//! for the peer, so replication resumes without waiting out a delay).
//!
//! Peers also tell this node when it has been removed from the cluster:
//! they refuse its (pre-)vote requests with [`REMOVED_KEY`] set (see
//! [`Links::removed_by`]), including the pre-vote marked [`LEFT_KEY`] by
//! which a node that may have been removed unawares asks.
//!
//! The log says when a peer becomes unreachable (after [`DOWN_AFTER`]
//! failures in a row, with the error), every [`REPORT_EVERY`] while it
//! stays so (with the number of failed attempts since the last line), and
//! when it answers again (with how long it was away).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::mpsc;

use super::NodeId;

/// Delay before the second attempt at a peer whose first failed.
pub const FIRST_RETRY: Duration = Duration::from_millis(20);

/// Longest delay between attempts at a failing peer (before the random
/// factor): it bounds both the RPCs spent on a dead peer (two to four a
/// second) and how long a peer that is back waits to be noticed.
pub const MAX_RETRY: Duration = Duration::from_millis(500);

/// Failed attempts in a row after which a peer is reported unreachable
/// (fewer are a blip: a restarting connection, a slow answer).
pub const DOWN_AFTER: u32 = 3;

/// While a peer stays unreachable, the log repeats it this often.
pub const REPORT_EVERY: Duration = Duration::from_secs(60);

/// Metadata key on a refused vote or pre-vote: the log index of the
/// responder's committed membership, which does not have the candidate,
/// while the candidate's log ends before it (or, for a pre-vote marked with
/// [`LEFT_KEY`], while the candidate's latest membership is no newer). The
/// candidate has been removed from the cluster.
pub const REMOVED_KEY: &str = "raftlock-removed-at";

/// Metadata key on a pre-vote by which a node asks whether it has been
/// removed: the log index of its own latest membership. It sends one when
/// it may have been removed without any peer telling it so (see
/// `Node::ask_if_removed`): it holds a membership that leaves it out but
/// not that membership's commit, and has heard from no leader for a while
/// (openraft made it a learner, which never campaigns); or it leads in
/// openraft's eyes but no quorum has acknowledged it for a while (a leader
/// handing over its leadership sends nothing, and a new leader that
/// removed it never writes to it). The peer answers it without openraft.
pub const LEFT_KEY: &str = "raftlock-left-at";

/// How long to wait before attempt number `failures + 1` at a peer that
/// has failed `failures` times in a row, with `jitter` in `[0.5, 1]`.
pub fn retry_delay(failures: u32, jitter: f64) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    let doubled = FIRST_RETRY.saturating_mul(1u32 << (failures - 1).min(16));
    doubled.min(MAX_RETRY).mul_f64(jitter.clamp(0.5, 1.0))
}

/// A random factor for [`retry_delay`].
fn jitter() -> f64 {
    // The top of the range is never drawn; 1.0 - ε is as good.
    crate::random::in_range(0.5, 1.0)
}

/// The retry delays of one run of failures, as openraft's replication
/// backoff takes them: the same schedule as [`Links::admit`].
pub fn backoff_delays() -> impl Iterator<Item = Duration> + Send + 'static {
    (1u32..).map(|failures| retry_delay(failures, jitter()))
}

/// What is known of the link to one peer.
#[derive(Debug, Default)]
struct Link {
    /// Attempts that failed since the last success.
    failures: u32,
    /// When the first of them failed.
    failing_since: Option<Instant>,
    /// No attempt before this instant.
    next_try: Option<Instant>,
    /// The latest failure.
    last_error: String,
    /// The log has said this peer is unreachable.
    reported: bool,
    /// When the log last said so.
    last_report: Option<Instant>,
    /// Failed attempts since that line.
    since_report: u64,
}

/// The links of one node to its peers.
#[derive(Debug, Default)]
pub struct Links {
    links: Mutex<BTreeMap<NodeId, Link>>,
    /// Told the id of each peer that answers after failing.
    back: Option<mpsc::UnboundedSender<NodeId>>,
    /// The first peer that said this node was removed, and the log index
    /// of the membership without it.
    removed: tokio::sync::watch::Sender<Option<(NodeId, u64)>>,
}

impl Links {
    /// Links that send the id of a peer that answers again after failing
    /// to `back`.
    pub fn new(back: mpsc::UnboundedSender<NodeId>) -> Links {
        Links {
            back: Some(back),
            ..Links::default()
        }
    }

    /// Peer `by` refused this node's vote: its committed membership at log
    /// index `at` does not have this node.
    pub fn removed_by(&self, by: NodeId, at: u64) {
        self.removed.send_if_modified(|r| {
            let first = r.is_none();
            if first {
                *r = Some((by, at));
            }
            first
        });
    }

    /// Resolves with the peer that said this node was removed, and the log
    /// index of the membership without it.
    pub async fn removed(&self) -> (NodeId, u64) {
        let mut rx = self.removed.subscribe();
        let removed = match rx.wait_for(Option::is_some).await {
            Ok(r) => *r,
            // The sender lives as long as `self`.
            Err(_) => None,
        };
        match removed {
            Some(r) => r,
            None => std::future::pending().await,
        }
    }

    fn with<T>(&self, peer: NodeId, f: impl FnOnce(&mut Link) -> T) -> T {
        let mut links = self.links.lock().expect("links lock poisoned");
        f(links.entry(peer).or_default())
    }

    /// May an RPC to `peer` go out now? `Err` says why not: the peer is
    /// failing and its next attempt is not due yet. An attempt that is let
    /// through takes the slot: the next one waits for its outcome's delay.
    pub fn admit(&self, peer: NodeId) -> Result<(), String> {
        self.admit_at(peer, Instant::now())
    }

    fn admit_at(&self, peer: NodeId, now: Instant) -> Result<(), String> {
        self.with(peer, |link| {
            let Some(next) = link.next_try else {
                return Ok(());
            };
            if now < next {
                return Err(format!(
                    "node {peer} is failing (backing off; next attempt in {:?}): {}",
                    next - now,
                    link.last_error
                ));
            }
            // Until this attempt's outcome is known, no other goes out.
            link.next_try = Some(now + MAX_RETRY);
            Ok(())
        })
    }

    /// An RPC to `peer` succeeded.
    pub fn succeeded(&self, peer: NodeId) {
        let was = self.with(peer, |link| {
            (link.failures > 0).then(|| std::mem::take(link))
        });
        let Some(was) = was else { return };
        if was.reported {
            let away = was.failing_since.map(|at| at.elapsed()).unwrap_or_default();
            tracing::info!(
                peer,
                away = ?away,
                failed_attempts = was.failures,
                "peer {peer} reachable again"
            );
        }
        if let Some(back) = &self.back {
            let _ = back.send(peer);
        }
    }

    /// An RPC to `peer` failed with `error`.
    pub fn failed(&self, peer: NodeId, error: &str) {
        self.failed_at(peer, error, Instant::now(), jitter());
    }

    fn failed_at(&self, peer: NodeId, error: &str, now: Instant, jitter: f64) {
        self.with(peer, |link| {
            link.failures = link.failures.saturating_add(1);
            link.failing_since.get_or_insert(now);
            link.next_try = Some(now + retry_delay(link.failures, jitter));
            link.since_report += 1;
            if link.last_error != error {
                link.last_error = error.to_string();
            }
            if !link.reported && link.failures >= DOWN_AFTER {
                tracing::warn!(
                    peer,
                    reason = %error,
                    "peer {peer} unreachable; retrying at most every {MAX_RETRY:?}"
                );
                link.reported = true;
                link.last_report = Some(now);
                link.since_report = 0;
            } else if link.reported
                && link
                    .last_report
                    .is_none_or(|at| now.duration_since(at) >= REPORT_EVERY)
            {
                let away = link
                    .failing_since
                    .map(|at| now.duration_since(at))
                    .unwrap_or_default();
                tracing::warn!(
                    peer,
                    reason = %error,
                    away = ?away,
                    failed_attempts = link.since_report,
                    "peer {peer} still unreachable"
                );
                link.last_report = Some(now);
                link.since_report = 0;
            }
        })
    }

    /// The peers that have been reported unreachable and not heard from
    /// since.
    pub fn unreachable(&self) -> Vec<NodeId> {
        let links = self.links.lock().expect("links lock poisoned");
        links
            .iter()
            .filter(|(_, l)| l.reported)
            .map(|(id, _)| *id)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_from_the_first_up_to_the_cap_scaled_by_the_jitter() {
        assert_eq!(retry_delay(0, 1.0), Duration::ZERO);
        assert_eq!(retry_delay(1, 1.0), FIRST_RETRY);
        assert_eq!(retry_delay(2, 1.0), FIRST_RETRY * 2);
        assert_eq!(retry_delay(3, 1.0), FIRST_RETRY * 4);
        assert_eq!(retry_delay(20, 1.0), MAX_RETRY);
        assert_eq!(retry_delay(u32::MAX, 1.0), MAX_RETRY, "no overflow");
        assert_eq!(retry_delay(1, 0.5), FIRST_RETRY / 2);
        assert_eq!(retry_delay(20, 0.5), MAX_RETRY / 2);
        // Out-of-range jitter is clamped, never a zero or an overlong wait.
        assert_eq!(retry_delay(20, 0.0), MAX_RETRY / 2);
        assert_eq!(retry_delay(20, 7.0), MAX_RETRY);
        for d in backoff_delays().take(50) {
            assert!(d >= FIRST_RETRY / 2 && d <= MAX_RETRY, "{d:?}");
        }
    }

    #[test]
    fn a_failing_peer_is_tried_again_only_when_due_and_at_once_after_a_success() {
        let links = Links::default();
        let t0 = Instant::now();
        assert!(links.admit_at(2, t0).is_ok(), "a new peer goes at once");
        links.failed_at(2, "connection refused", t0, 1.0);
        let refused = links
            .admit_at(2, t0 + FIRST_RETRY / 2)
            .expect_err("not due yet");
        assert!(refused.contains("connection refused"), "{refused}");
        assert!(links.admit_at(2, t0 + FIRST_RETRY).is_ok(), "due");
        assert!(
            links.admit_at(2, t0 + FIRST_RETRY).is_err(),
            "one attempt at a time while it fails"
        );
        assert!(links.admit_at(3, t0).is_ok(), "other peers are not held");
        links.succeeded(2);
        assert!(links.admit_at(2, t0 + FIRST_RETRY).is_ok());
        assert!(
            links.admit_at(2, t0 + FIRST_RETRY).is_ok(),
            "a healthy peer takes any number of RPCs"
        );
    }

    #[test]
    fn a_peer_is_reported_after_failures_in_a_row_and_a_success_says_it_is_back() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let links = Links::new(tx);
        let t0 = Instant::now();
        for i in 0..DOWN_AFTER - 1 {
            links.failed_at(3, "refused", t0 + MAX_RETRY * i, 1.0);
        }
        assert!(links.unreachable().is_empty(), "a blip is not reported");
        links.failed_at(3, "refused", t0 + MAX_RETRY * DOWN_AFTER, 1.0);
        assert_eq!(links.unreachable(), vec![3]);
        links.succeeded(3);
        assert!(links.unreachable().is_empty());
        assert_eq!(rx.try_recv().ok(), Some(3), "the owner hears it is back");
        links.succeeded(3);
        assert!(rx.try_recv().is_err(), "only once");
    }

    #[tokio::test]
    async fn the_first_peer_that_says_this_node_was_removed_is_kept() {
        let links = Links::default();
        let waiting = tokio::time::timeout(Duration::from_millis(20), links.removed()).await;
        assert!(waiting.is_err(), "nobody said so yet");
        links.removed_by(3, 42);
        links.removed_by(2, 50);
        assert_eq!(links.removed().await, (3, 42));
    }
}
