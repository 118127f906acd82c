//! Where a write's milliseconds go: a per-stage latency breakdown.
//!
//! A write crosses many hands between the gRPC handler and its reply: the
//! batcher, openraft's core, the log store's append and sync, the network
//! to each follower, the followers' own append and sync, the commit, the
//! state machine, and the way back. Each hand stamps what it did to a log
//! entry (by log index) here, with the local monotonic clock; whoever sees
//! the end of the write (the batcher, on the leader; the Raft service, on a
//! follower) takes the entry's stamps and records the time between them in
//! one histogram per [`Stage`]. `GET /debug/stages` on the metrics port
//! shows the histograms (`raftlock-bench run --trace-stages` reads them).
//!
//! Stages are intervals between events of one write, in the order the
//! write meets them; where two events overlap (a leader that replicates
//! while it syncs) the later stage starts from the event it waits for, so
//! no interval is negative. Entries nobody takes (blank and membership
//! entries, a follower's applies) are forgotten past [`MAX_TRACKED`]
//! entries, so the bookkeeping is bounded.
//!
//! A leaf like the rest of `metrics`: the stamps are plain `Instant`s and
//! log indexes.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Most log entries whose stamps are kept at once.
pub const MAX_TRACKED: usize = 4096;

/// Largest interval a histogram records (longer ones are clamped to it).
pub const MAX_RECORDED: Duration = Duration::from_secs(60);

/// One stage of a write, or of a follower's share of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Leader: the handler's start to its proposal reaching the batcher
    /// (decoding is before it; this is the checks: caller, limits, lease).
    Receive,
    /// Leader: in the batcher's queue until its batch is proposed.
    BatchWait,
    /// Leader: proposed until the log store starts appending its entry
    /// (openraft's core: queue, log id, membership).
    Propose,
    /// Leader: the log store's append and sync of the entry.
    LeaderAppend,
    /// Leader: the append's start to the first `AppendEntries` carrying
    /// the entry leaving for a follower.
    ReplicationSend,
    /// Leader: that `AppendEntries` out and its answer back, for the
    /// follower whose answer made the quorum.
    ReplicationRoundTrip,
    /// Leader: the quorum (its own sync and enough followers') to the
    /// state machine starting to apply the entry (commit, apply queue).
    Commit,
    /// Leader: the state machine applying the entry.
    Apply,
    /// Leader: applied until openraft hands the batcher its response.
    Respond,
    /// Leader: the response until the handler returns its reply.
    Reply,
    /// Leader: a parked acquire's grant applied until its handler returns.
    WaiterWake,
    /// Leader: a write's handler start to its return (everything above).
    Server,
    /// Follower: an `AppendEntries` received until its entries' append
    /// starts (decode, openraft's core).
    FollowerQueue,
    /// Follower: the log store's append and sync.
    FollowerAppend,
    /// Follower: synced until the answer leaves the handler.
    FollowerReply,
}

impl Stage {
    /// Every stage, in the order a write meets them (and of
    /// [`Stages`]' histograms).
    pub const ALL: [Stage; 15] = [
        Stage::Receive,
        Stage::BatchWait,
        Stage::Propose,
        Stage::LeaderAppend,
        Stage::ReplicationSend,
        Stage::ReplicationRoundTrip,
        Stage::Commit,
        Stage::Apply,
        Stage::Respond,
        Stage::Reply,
        Stage::WaiterWake,
        Stage::Server,
        Stage::FollowerQueue,
        Stage::FollowerAppend,
        Stage::FollowerReply,
    ];

    /// The stage's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Receive => "receive",
            Stage::BatchWait => "batch_wait",
            Stage::Propose => "propose",
            Stage::LeaderAppend => "leader_append_sync",
            Stage::ReplicationSend => "replication_send",
            Stage::ReplicationRoundTrip => "replication_round_trip",
            Stage::Commit => "commit",
            Stage::Apply => "apply",
            Stage::Respond => "respond",
            Stage::Reply => "reply",
            Stage::WaiterWake => "waiter_wake",
            Stage::Server => "server_total",
            Stage::FollowerQueue => "follower_queue",
            Stage::FollowerAppend => "follower_append_sync",
            Stage::FollowerReply => "follower_reply",
        }
    }
}

/// What happened to one log entry on this node, and when.
#[derive(Clone, Debug, Default)]
pub struct EntryStamps {
    /// The log store started appending it.
    pub append_start: Option<Instant>,
    /// The log store had it on stable storage.
    pub append_done: Option<Instant>,
    /// Leader: the first `AppendEntries` carrying it left for each
    /// follower (follower id, when).
    pub sent: Vec<(u64, Instant)>,
    /// Leader: each follower's successful answer to that (id, when).
    pub acked: Vec<(u64, Instant)>,
    /// The state machine started applying it.
    pub apply_start: Option<Instant>,
    /// The state machine had applied it.
    pub applied: Option<Instant>,
}

impl EntryStamps {
    /// When the `followers`-th follower (1-based) answered, with when that
    /// follower's request had left: the answer that, with the leader's own
    /// sync, made the quorum.
    pub fn quorum_ack(&self, followers: usize) -> Option<(Instant, Instant)> {
        let mut acked = self.acked.clone();
        acked.sort_by_key(|(_, at)| *at);
        let (node, at) = *acked.get(followers.checked_sub(1)?)?;
        let sent = self.sent.iter().find(|(n, _)| *n == node)?.1;
        Some((sent, at))
    }
}

/// One stage's histogram, as `GET /debug/stages` shows it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct StageReport {
    /// [`Stage::name`].
    pub stage: &'static str,
    /// Writes (or follower appends) recorded.
    pub count: u64,
    /// Median, microseconds.
    pub p50_us: u64,
    /// 90th percentile, microseconds.
    pub p90_us: u64,
    /// 99th percentile, microseconds.
    pub p99_us: u64,
    /// Largest, microseconds.
    pub max_us: u64,
    /// The histogram itself as (microseconds, count) pairs, so that reports
    /// of several nodes can be merged.
    pub buckets: Vec<(u64, u64)>,
}

/// The stamps and the histograms of one node.
pub struct Stages {
    entries: Mutex<BTreeMap<u64, EntryStamps>>,
    histograms: [Mutex<Histogram<u64>>; Stage::ALL.len()],
}

impl Default for Stages {
    fn default() -> Self {
        Stages {
            entries: Mutex::default(),
            histograms: std::array::from_fn(|_| Mutex::new(new_histogram())),
        }
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_RECORDED.as_micros() as u64, 2)
        .expect("valid histogram bounds")
}

/// `later - earlier`, or zero if the clock says otherwise.
pub fn between(earlier: Instant, later: Instant) -> Duration {
    later.saturating_duration_since(earlier)
}

impl Stages {
    /// Records `n` writes that spent `d` in `stage`.
    pub fn record(&self, stage: Stage, d: Duration, n: u64) {
        if n == 0 {
            return;
        }
        let us = (d.as_micros() as u64).clamp(1, MAX_RECORDED.as_micros() as u64);
        let mut h = self.histograms[stage as usize]
            .lock()
            .expect("stage histogram lock poisoned");
        let _ = h.record_n(us, n);
    }

    /// The log store started appending entries `first..=last` at `start`
    /// (they are readable, so replication may send them, from now on).
    pub fn appending(&self, first: u64, last: u64, start: Instant) {
        let mut entries = self.entries.lock().expect("stage entries lock poisoned");
        for index in first..=last {
            // A new append of an index (another leader's entry) starts afresh.
            entries.insert(
                index,
                EntryStamps {
                    append_start: Some(start),
                    ..EntryStamps::default()
                },
            );
        }
        while entries.len() > MAX_TRACKED {
            entries.pop_first();
        }
    }

    /// Entries `first..=last` were on stable storage at `done`.
    pub fn synced(&self, first: u64, last: u64, done: Instant) {
        self.update(first, last, |e| {
            e.append_done.get_or_insert(done);
        });
    }

    /// An append of `first..=last` from `start` to `done` (both at once,
    /// for tests and synchronous stores).
    pub fn appended(&self, first: u64, last: u64, start: Instant, done: Instant) {
        self.appending(first, last, start);
        self.synced(first, last, done);
    }

    fn update(&self, first: u64, last: u64, mut f: impl FnMut(&mut EntryStamps)) {
        if first > last {
            return;
        }
        let mut entries = self.entries.lock().expect("stage entries lock poisoned");
        for (_, e) in entries.range_mut(first..=last) {
            f(e);
        }
    }

    /// An `AppendEntries` carrying `first..=last` left for `target` at
    /// `at` (only the first one per entry and follower counts).
    pub fn sent(&self, target: u64, first: u64, last: u64, at: Instant) {
        self.update(first, last, |e| {
            if !e.sent.iter().any(|(n, _)| *n == target) {
                e.sent.push((target, at));
            }
        });
    }

    /// `target` answered an `AppendEntries` carrying `first..=last` with
    /// success at `at`.
    pub fn acked(&self, target: u64, first: u64, last: u64, at: Instant) {
        self.update(first, last, |e| {
            if !e.acked.iter().any(|(n, _)| *n == target) {
                e.acked.push((target, at));
            }
        });
    }

    /// The state machine started applying `first..=last` at `at`.
    pub fn applying(&self, first: u64, last: u64, at: Instant) {
        self.update(first, last, |e| {
            e.apply_start.get_or_insert(at);
        });
    }

    /// The state machine had applied `first..=last` at `at`.
    pub fn applied(&self, first: u64, last: u64, at: Instant) {
        self.update(first, last, |e| {
            e.applied.get_or_insert(at);
        });
    }

    /// Takes (and forgets) the stamps of entry `index`.
    pub fn take(&self, index: u64) -> Option<EntryStamps> {
        self.entries
            .lock()
            .expect("stage entries lock poisoned")
            .remove(&index)
    }

    /// Records the leader's stages of one entry of `n` writes: proposed at
    /// `proposed`, its response handed back at `responded`, with its stamps
    /// `e`; `followers` answers make a quorum with the leader.
    pub fn record_entry(
        &self,
        e: &EntryStamps,
        proposed: Instant,
        responded: Instant,
        followers: usize,
        n: u64,
    ) {
        let (Some(append_start), Some(append_done), Some(apply_start), Some(applied)) =
            (e.append_start, e.append_done, e.apply_start, e.applied)
        else {
            return;
        };
        self.record(Stage::Propose, between(proposed, append_start), n);
        self.record(Stage::LeaderAppend, between(append_start, append_done), n);
        let quorum = if followers == 0 {
            append_done
        } else {
            let Some((sent, acked)) = e.quorum_ack(followers) else {
                return;
            };
            let first_sent = e.sent.iter().map(|(_, at)| *at).min().unwrap_or(sent);
            self.record(Stage::ReplicationSend, between(append_start, first_sent), n);
            self.record(Stage::ReplicationRoundTrip, between(sent, acked), n);
            acked.max(append_done)
        };
        self.record(Stage::Commit, between(quorum, apply_start), n);
        self.record(Stage::Apply, between(apply_start, applied), n);
        self.record(Stage::Respond, between(applied, responded), n);
    }

    /// Every stage's histogram.
    pub fn report(&self) -> Vec<StageReport> {
        Stage::ALL
            .iter()
            .map(|&stage| {
                let h = self.histograms[stage as usize]
                    .lock()
                    .expect("stage histogram lock poisoned");
                StageReport {
                    stage: stage.name(),
                    count: h.len(),
                    p50_us: h.value_at_quantile(0.5),
                    p90_us: h.value_at_quantile(0.9),
                    p99_us: h.value_at_quantile(0.99),
                    max_us: h.max(),
                    buckets: h
                        .iter_recorded()
                        .map(|v| {
                            (
                                h.highest_equivalent(v.value_iterated_to()),
                                v.count_at_value(),
                            )
                        })
                        .collect(),
                }
            })
            .collect()
    }

    /// Empties every histogram (stamps stay).
    pub fn reset(&self) {
        for h in &self.histograms {
            h.lock().expect("stage histogram lock poisoned").reset();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, us: u64) -> Instant {
        base + Duration::from_micros(us)
    }

    /// The median of `stage`, checked to be `us` within the histogram's
    /// precision (two significant digits: 1 %).
    fn p50(s: &Stages, stage: Stage) -> u64 {
        let r = s.report();
        let r = r.iter().find(|r| r.stage == stage.name()).expect("stage");
        r.p50_us
    }

    #[track_caller]
    fn assert_about(got: u64, want: u64) {
        assert!(
            got.abs_diff(want) * 100 <= want,
            "{got} µs is not {want} µs within 1 %"
        );
    }

    #[test]
    fn a_leader_entry_is_cut_into_its_stages() {
        let s = Stages::default();
        let t = Instant::now();
        s.appended(7, 7, at(t, 100), at(t, 400));
        s.sent(2, 7, 7, at(t, 450));
        s.sent(3, 7, 7, at(t, 460));
        s.acked(3, 7, 7, at(t, 900));
        s.acked(2, 7, 7, at(t, 1000));
        s.applying(7, 7, at(t, 1100));
        s.applied(7, 7, at(t, 1150));
        let e = s.take(7).expect("stamps");
        assert!(s.take(7).is_none(), "taken once");
        s.record_entry(&e, t, at(t, 1300), 1, 5);
        assert_about(p50(&s, Stage::Propose), 100);
        assert_about(p50(&s, Stage::LeaderAppend), 300);
        assert_about(p50(&s, Stage::ReplicationSend), 350);
        // Node 3 answered first: its round trip made the quorum.
        assert_about(p50(&s, Stage::ReplicationRoundTrip), 440);
        assert_about(p50(&s, Stage::Commit), 200);
        assert_about(p50(&s, Stage::Apply), 50);
        assert_about(p50(&s, Stage::Respond), 150);
        let r = s.report();
        assert_eq!(r[Stage::Propose as usize].count, 5, "weighted by writes");
        s.reset();
        assert!(s.report().iter().all(|r| r.count == 0));
    }

    #[test]
    fn an_overlapping_sync_never_makes_a_negative_stage() {
        // Replication answered before the leader's own sync: the quorum
        // is the sync.
        let s = Stages::default();
        let t = Instant::now();
        s.appended(1, 1, at(t, 0), at(t, 800));
        s.sent(2, 1, 1, at(t, 10));
        s.acked(2, 1, 1, at(t, 300));
        s.applying(1, 1, at(t, 850));
        s.applied(1, 1, at(t, 860));
        let e = s.take(1).expect("stamps");
        s.record_entry(&e, t, at(t, 900), 1, 1);
        assert_about(p50(&s, Stage::Commit), 50);
    }

    #[test]
    fn stamps_without_an_append_are_not_kept_and_old_ones_are_dropped() {
        let s = Stages::default();
        let t = Instant::now();
        s.applied(5, 5, t);
        assert!(s.take(5).is_none());
        for i in 0..(MAX_TRACKED as u64 + 10) {
            s.appended(i, i, t, t);
        }
        assert!(s.take(0).is_none(), "the oldest was dropped");
        assert!(s.take(MAX_TRACKED as u64 + 9).is_some());
    }

    #[test]
    fn long_intervals_are_clamped_not_lost() {
        let s = Stages::default();
        s.record(Stage::Apply, Duration::from_secs(3600), 1);
        assert_eq!(s.report()[Stage::Apply as usize].count, 1);
    }
}
