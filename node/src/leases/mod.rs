//! Leader-only timers: session leases, wait timeouts and lock-delays, on the
//! leader's monotonic clock.
//!
//! Only one clock decides expiry: the current leader's. Followers track
//! nothing. When a node becomes leader it cannot know how much of each lease
//! the old leader had counted, so it re-arms every session, wait and
//! lock-delay at full length: on failover, leases only get longer. When a
//! timer runs out the leader proposes a command (`ExpireSession`,
//! `TimeoutWait`, `EndLockDelay`) through Raft; the timer is dropped only
//! when the command's effect is applied, so a proposal lost to a leader
//! change or an error is simply retried.
//!
//! Keep-alives are not written to the log: they move a deadline in this
//! leader's memory, after the leader has confirmed with a quorum that it is
//! still the leader (see `api::locks`).
//!
//! **The lease rule** (docs/concepts/sessions-and-leases.md, "The lease rule"): a client believes its
//! lease until the send time of its last answered renewal plus the lease
//! length (the ttl, or the smaller of the ttl and the grace of a session
//! that ends with its process) less a margin. So this keeper never ends a
//! lease before that: a renewal, a ttl change and a new leader only ever
//! push a deadline later (never earlier); the grace of a session that ends
//! with its process is counted from the end of the last stream that
//! renewed it in this term (each renewal's send came before that end); a
//! ttl change in flight holds its session's expiry back until it has
//! applied; a revoke stops the renewals at once and ends the session only
//! at the deadline its last renewal earned.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::raft::{Batch, MAX_BATCH};
use crate::state::limits::WAIT_FOREVER as WAIT_FOREVER_MS;
use crate::state::{cmd, Command, Event, LockName, LockTable, SessionId};

/// How long to wait before proposing an expiry command again if the first
/// proposal has not taken effect.
pub const RETRY_AFTER: Duration = Duration::from_millis(500);

/// What a timer is for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TimerKey {
    /// A session's lease.
    Session(SessionId),
    /// A queued acquire's timeout: (session, name, seq).
    Wait(SessionId, LockName, u64),
    /// A lock-delay: (name, since).
    Delay(LockName, u64),
}

impl TimerKey {
    fn command(&self) -> Command {
        match self {
            TimerKey::Session(session) => cmd::ExpireSession { session: *session }.into(),
            TimerKey::Wait(session, name, seq) => cmd::TimeoutWait {
                session: *session,
                name: name.clone(),
                seq: *seq,
            }
            .into(),
            TimerKey::Delay(name, since) => cmd::EndLockDelay {
                name: name.clone(),
                since: *since,
            }
            .into(),
        }
    }
}

/// The timers proper.
#[derive(Default)]
struct Timers {
    /// True while this node is leader and has armed its timers.
    active: bool,
    /// The term the timers were armed for.
    term: Option<u64>,
    /// Deadline of each timer.
    deadlines: BTreeMap<TimerKey, Instant>,
    /// The same, ordered by deadline, so the next one is found in O(log n).
    queue: BTreeSet<(Instant, TimerKey)>,
    /// Session ttls, for keep-alives.
    ttls: BTreeMap<SessionId, Duration>,
    /// The lock-delay in force per name (its `since`); a name has at most
    /// one, and a newer one replaces the older.
    delays: BTreeMap<LockName, u64>,
    /// True while this leader has lost touch with a quorum within its term:
    /// deadlines are kept (if a quorum acknowledges it again in this term,
    /// no other leader was elected meanwhile: nodes that voted for one
    /// would refuse it), but nothing is proposed and no keep-alive is
    /// acknowledged until the quorum is back.
    paused: bool,
    /// Sessions whose expiry has been proposed: no keep-alive is
    /// acknowledged for them any more (the expiry may commit any moment).
    expiring: BTreeSet<SessionId>,
    /// Sessions that end with their process: the grace after their last
    /// keep-alive stream on this leader ends.
    graces: BTreeMap<SessionId, Duration>,
    /// The streams (keep-alive streams, and `Lock` calls while they run)
    /// that have renewed each session with a grace in this term; when the
    /// last one ends, the session expires after its grace unless a stream
    /// renews it again.
    carriers: BTreeMap<SessionId, BTreeSet<u64>>,
    /// The same, by stream: the sessions each one carries.
    carried: BTreeMap<u64, BTreeSet<SessionId>>,
    /// Sessions with a `SetSessionTtl` in flight on this leader (how
    /// many): their expiry is not decided until it has applied, which
    /// restarts the lease (see [`Leases::begin_ttl_change`]).
    ttl_changes: BTreeMap<SessionId, u32>,
    /// Sessions an administrator is revoking (by how many revokes): no
    /// renewal is acknowledged and no expiry proposed; the revoke ends them
    /// at their deadline (see [`Leases::begin_revoke`]).
    revoking: BTreeMap<SessionId, u32>,
}

impl Timers {
    fn arm(&mut self, key: TimerKey, at: Instant) {
        if let Some(old) = self.deadlines.insert(key.clone(), at) {
            self.queue.remove(&(old, key.clone()));
        }
        self.queue.insert((at, key));
    }

    fn disarm(&mut self, key: &TimerKey) {
        if let Some(old) = self.deadlines.remove(key) {
            self.queue.remove(&(old, key.clone()));
        }
    }

    /// Moves `key`'s deadline to `at` if that is later (a lease is never
    /// cut short by a renewal); arms it if it had none.
    fn extend(&mut self, key: TimerKey, at: Instant) {
        if self.deadlines.get(&key).is_none_or(|d| *d < at) {
            self.arm(key, at);
        }
    }

    fn clear(&mut self) {
        self.active = false;
        self.paused = false;
        self.term = None;
        self.deadlines.clear();
        self.queue.clear();
        self.ttls.clear();
        self.delays.clear();
        self.expiring.clear();
        self.graces.clear();
        self.carriers.clear();
        self.carried.clear();
        self.ttl_changes.clear();
        self.revoking.clear();
    }

    /// Forgets everything about `session` but its timer.
    fn forget(&mut self, session: SessionId) {
        self.ttls.remove(&session);
        self.expiring.remove(&session);
        self.graces.remove(&session);
        self.ttl_changes.remove(&session);
        self.revoking.remove(&session);
        if let Some(streams) = self.carriers.remove(&session) {
            for stream in streams {
                if let Some(sessions) = self.carried.get_mut(&stream) {
                    sessions.remove(&session);
                }
            }
        }
    }

    /// Whether a renewal of `session` must be refused: its expiry has been
    /// proposed, or it is being revoked.
    fn ending(&self, session: SessionId) -> bool {
        self.expiring.contains(&session) || self.revoking.contains_key(&session)
    }

    /// Times the lock-delay on `name` that started at `since`, replacing an
    /// older one on the same name (whose end command would be ignored and
    /// so retried forever).
    fn arm_delay(&mut self, name: &LockName, since: u64, at: Instant) {
        if let Some(old) = self.delays.insert(name.clone(), since) {
            self.disarm(&TimerKey::Delay(name.clone(), old));
        }
        self.arm(TimerKey::Delay(name.clone(), since), at);
    }
}

/// The lease keeper. One per node; it only counts while the node leads.
#[derive(Default)]
pub struct Leases {
    timers: Mutex<Timers>,
    /// Wakes the timer task when the earliest deadline may have changed.
    changed: Notify,
    /// The last stream id handed out ([`Leases::open_stream`]).
    streams: std::sync::atomic::AtomicU64,
}

/// One keep-alive stream (or one `Lock` call) on this node: what carries
/// sessions that end with their process. Ids are never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct StreamId(u64);

/// Why a keep-alive was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum KeepAliveError {
    /// This node is not (or not yet) the active leader.
    NotLeader,
    /// No such open session.
    UnknownSession,
    /// The session's lease ran out and its expiry has been proposed, or an
    /// administrator is revoking it.
    Expiring,
}

fn duration_ms(ms: u64) -> Option<Duration> {
    (ms != WAIT_FOREVER_MS).then(|| Duration::from_millis(ms))
}

impl Leases {
    /// Starts counting as the leader of `term`, unless already counting for
    /// it: every session, wait and lock-delay in `table` is armed at full
    /// length from now. Called with the table read-locked, so no apply slips
    /// in between.
    pub fn activate_for_term(&self, term: u64, table: &LockTable) {
        let now = Instant::now();
        let mut t = self.timers.lock().expect("timers lock poisoned");
        if t.active && t.term == Some(term) {
            if t.paused {
                // The quorum is back within the same term: no other leader
                // was elected meanwhile (nodes that voted for one would
                // refuse this one), so this leader's deadlines stayed valid
                // and go on from where they were instead of restarting at
                // full length.
                tracing::info!(term, "leases: quorum back, counting on");
                t.paused = false;
                drop(t);
                self.changed.notify_one();
            }
            return;
        }
        tracing::info!(
            term,
            sessions = table.sessions().count(),
            "leases: counting as leader"
        );
        t.clear();
        t.active = true;
        t.term = Some(term);
        for s in table.sessions() {
            let ttl = Duration::from_millis(s.ttl_ms);
            t.ttls.insert(s.session, ttl);
            if s.end_on_disconnect_ms > 0 {
                // Counted from its first stream on this leader: before it,
                // the session has its ordinary ttl (this leader cannot know
                // the old one's streams).
                t.graces
                    .insert(s.session, Duration::from_millis(s.end_on_disconnect_ms));
            }
            t.arm(TimerKey::Session(s.session), now + ttl);
        }
        for w in table.waits() {
            if let Some(d) = duration_ms(w.timeout_ms) {
                t.arm(TimerKey::Wait(w.session, w.name, w.seq), now + d);
            }
        }
        for (name, since, delay_ms) in table.delays() {
            t.arm_delay(name, since, now + Duration::from_millis(delay_ms));
        }
        drop(t);
        self.changed.notify_one();
    }

    /// This leader lost touch with a quorum but is still leader of the
    /// term it counts for: keep every deadline, propose nothing and
    /// acknowledge no keep-alive until [`activate_for_term`] is called for
    /// the same term again (then counting goes on) or another term (then
    /// everything restarts at full length), or [`deactivate`].
    ///
    /// [`activate_for_term`]: Self::activate_for_term
    /// [`deactivate`]: Self::deactivate
    pub fn pause(&self) {
        let mut t = self.timers.lock().expect("timers lock poisoned");
        if t.active {
            t.paused = true;
        }
        drop(t);
        self.changed.notify_one();
    }

    /// True while counting is paused (see [`pause`](Self::pause)).
    pub fn is_paused(&self) -> bool {
        self.timers.lock().expect("timers lock poisoned").paused
    }

    /// Stops counting (leadership lost).
    pub fn deactivate(&self) {
        self.timers.lock().expect("timers lock poisoned").clear();
        self.changed.notify_one();
    }

    /// True while this node counts leases.
    pub fn is_active(&self) -> bool {
        self.timers.lock().expect("timers lock poisoned").active
    }

    /// Number of armed timers (for status and tests).
    pub fn armed(&self) -> usize {
        self.timers
            .lock()
            .expect("timers lock poisoned")
            .deadlines
            .len()
    }

    /// Follows the table: arms timers for new sessions, waits and delays,
    /// drops those whose subject is gone. Called from the apply path.
    pub fn on_events(&self, events: &[Event]) {
        let mut t = self.timers.lock().expect("timers lock poisoned");
        if !t.active {
            return;
        }
        let now = Instant::now();
        let mut changed = false;
        for e in events {
            match e {
                Event::SessionOpened {
                    session,
                    ttl_ms,
                    end_on_disconnect_ms,
                } => {
                    let ttl = Duration::from_millis(*ttl_ms);
                    t.ttls.insert(*session, ttl);
                    if *end_on_disconnect_ms > 0 {
                        t.graces
                            .insert(*session, Duration::from_millis(*end_on_disconnect_ms));
                    }
                    t.arm(TimerKey::Session(*session), now + ttl);
                    changed = true;
                }
                Event::SessionTtlChanged { session, ttl_ms } => {
                    // Renewals from now on are at the new length, and the
                    // lease restarts at it, shorter or longer: a client
                    // that shortens its ttl counts every answer from the
                    // change's send on with the new ttl, and cuts its
                    // count to that send + the new ttl (docs/concepts/sessions-and-leases.md, "The lease
                    // rule"), never later than this. A session whose end
                    // is under way stays ending (its `SetSessionTtl`
                    // answers `NOT_FOUND`).
                    if t.ttls.contains_key(session) && !t.ending(*session) {
                        let ttl = Duration::from_millis(*ttl_ms);
                        t.ttls.insert(*session, ttl);
                        t.arm(TimerKey::Session(*session), now + ttl);
                        changed = true;
                    }
                }
                // A SessionEnded follows.
                Event::SessionRevoked { .. } => {}
                Event::SessionEnded { session, .. } => {
                    t.forget(*session);
                    t.disarm(&TimerKey::Session(*session));
                }
                Event::Queued {
                    name,
                    session,
                    seq,
                    timeout_ms,
                    ..
                } => {
                    if let Some(d) = duration_ms(*timeout_ms) {
                        t.arm(TimerKey::Wait(*session, name.clone(), *seq), now + d);
                        changed = true;
                    }
                }
                Event::Granted {
                    name, session, seq, ..
                }
                | Event::Cancelled {
                    name, session, seq, ..
                } => {
                    t.disarm(&TimerKey::Wait(*session, name.clone(), *seq));
                }
                Event::LockDelayStarted {
                    name,
                    delay_ms,
                    since,
                } => {
                    t.arm_delay(name, *since, now + Duration::from_millis(*delay_ms));
                    changed = true;
                }
                Event::LockDelayEnded { name } => {
                    // A map lookup, not a scan of every timer: this runs on
                    // the apply path.
                    if let Some(since) = t.delays.remove(name) {
                        t.disarm(&TimerKey::Delay(name.clone(), since));
                    }
                }
                Event::Ended { .. } | Event::Downgraded { .. } => {}
            }
        }
        drop(t);
        if changed {
            self.changed.notify_one();
        }
    }

    /// As the leader with armed timers: for each session, how long ago its
    /// lease was last restarted (a keep-alive, its open, a ttl change, or
    /// this leader taking over), by this node's monotonic clock. Empty
    /// elsewhere. Information for the console only; nothing decides by it.
    pub fn since_renewal(&self) -> BTreeMap<SessionId, Duration> {
        let t = self.timers.lock().expect("timers lock poisoned");
        if !t.active {
            return BTreeMap::new();
        }
        let now = Instant::now();
        t.ttls
            .iter()
            .filter_map(|(session, ttl)| {
                let deadline = t.deadlines.get(&TimerKey::Session(*session))?;
                let left = deadline.saturating_duration_since(now);
                Some((*session, ttl.saturating_sub(left)))
            })
            .collect()
    }

    /// Restarts `session`'s lease from now (never to end sooner than it
    /// would have). The caller has confirmed leadership with a quorum
    /// *after* the keep-alive arrived.
    pub fn keep_alive(&self, session: SessionId) -> Result<Duration, KeepAliveError> {
        let mut t = self.timers.lock().expect("timers lock poisoned");
        if !t.active || t.paused {
            return Err(KeepAliveError::NotLeader);
        }
        let ttl = *t.ttls.get(&session).ok_or(KeepAliveError::UnknownSession)?;
        if t.ending(session) {
            // Its expiry is proposed (or a revoke waits for its deadline):
            // acknowledging now would tell the client its lease goes on
            // while its grants are being handed over.
            return Err(KeepAliveError::Expiring);
        }
        t.extend(TimerKey::Session(session), Instant::now() + ttl);
        Ok(ttl)
    }

    /// A new stream id, for a keep-alive stream (or a `Lock` call) that may
    /// carry sessions.
    pub fn open_stream(&self) -> StreamId {
        StreamId(
            self.streams
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                + 1,
        )
    }

    /// `stream` has just renewed `session` (or opened it, for a `Lock`
    /// call): in this term it carries the session until it ends. Cheap
    /// to call at every renewal; only sessions with a grace are tracked.
    pub fn carries(&self, stream: StreamId, session: SessionId) {
        let mut t = self.timers.lock().expect("timers lock poisoned");
        if !t.active || !t.graces.contains_key(&session) {
            return;
        }
        if t.carriers.entry(session).or_default().insert(stream.0) {
            t.carried.entry(stream.0).or_default().insert(session);
        }
    }

    /// `stream` ended (its client closed it, the connection dropped, the
    /// `Lock` call answered or went away). A session it carried that no
    /// other stream carries in this term expires after its grace, unless a
    /// stream renews it before.
    pub fn stream_ended(&self, stream: StreamId) {
        let mut t = self.timers.lock().expect("timers lock poisoned");
        let Some(sessions) = t.carried.remove(&stream.0) else {
            return;
        };
        let now = Instant::now();
        let mut changed = false;
        for session in sessions {
            let Some(carriers) = t.carriers.get_mut(&session) else {
                continue;
            };
            carriers.remove(&stream.0);
            if !carriers.is_empty() {
                continue;
            }
            t.carriers.remove(&session);
            let Some(grace) = t.graces.get(&session).copied() else {
                continue;
            };
            let key = TimerKey::Session(session);
            let at = now + grace;
            if t.deadlines.get(&key).is_some_and(|d| *d > at) {
                t.arm(key, at);
                changed = true;
            }
        }
        drop(t);
        if changed {
            self.changed.notify_one();
        }
    }

    /// A `SetSessionTtl` of `session` is about to be written on this
    /// node. Refused if its end is under way (the expiry proposed, or a
    /// revoke waiting); otherwise no expiry of the session is decided until
    /// [`end_ttl_change`](Self::end_ttl_change): the change restarts the
    /// lease when it applies, and an expiry decided meanwhile would undo
    /// the lease its answer promises. Not leading: nothing to hold back
    /// (the write is refused).
    pub fn begin_ttl_change(&self, session: SessionId) -> Result<(), KeepAliveError> {
        let mut t = self.timers.lock().expect("timers lock poisoned");
        if !t.active {
            return Ok(());
        }
        if t.ending(session) {
            return Err(KeepAliveError::Expiring);
        }
        *t.ttl_changes.entry(session).or_default() += 1;
        Ok(())
    }

    /// The `SetSessionTtl` begun with [`begin_ttl_change`] has ended
    /// (answered or failed).
    ///
    /// [`begin_ttl_change`]: Self::begin_ttl_change
    pub fn end_ttl_change(&self, session: SessionId) {
        let mut t = self.timers.lock().expect("timers lock poisoned");
        if let Some(n) = t.ttl_changes.get_mut(&session) {
            *n -= 1;
            if *n == 0 {
                t.ttl_changes.remove(&session);
            }
        }
        drop(t);
        self.changed.notify_one();
    }

    /// An administrator revokes `session`: from now on no renewal of it is
    /// acknowledged (its client learns at its next keep-alive) and no
    /// expiry is proposed for it; the revoke ends it at the returned
    /// deadline, the end of the lease its last renewal earned, which its
    /// client may count until. `NotLeader` unless this node counts leases.
    ///
    /// Also returns the term this keeper counts for: the deadline holds
    /// only while it still counts for that term (see
    /// [`still_revoking`](Self::still_revoking)); a later term restarted
    /// every lease at full length, and its renewals count.
    pub fn begin_revoke(&self, session: SessionId) -> Result<(Instant, u64), KeepAliveError> {
        let mut t = self.timers.lock().expect("timers lock poisoned");
        let term = match (t.active, t.paused, t.term) {
            (true, false, Some(term)) => term,
            _ => return Err(KeepAliveError::NotLeader),
        };
        if !t.ttls.contains_key(&session) {
            return Err(KeepAliveError::UnknownSession);
        }
        *t.revoking.entry(session).or_default() += 1;
        let deadline = t
            .deadlines
            .get(&TimerKey::Session(session))
            .copied()
            .unwrap_or_else(Instant::now);
        Ok((deadline, term))
    }

    /// Whether the revoke of `session` begun in `term` still stands: this
    /// keeper still counts for that term (the leadership did not leave and
    /// come back meanwhile, restarting every lease) and has not lost its
    /// quorum, and the session is still being revoked.
    pub fn still_revoking(&self, session: SessionId, term: u64) -> bool {
        let t = self.timers.lock().expect("timers lock poisoned");
        t.active && !t.paused && t.term == Some(term) && t.revoking.contains_key(&session)
    }

    /// Where the revoke of `session` begun in `term` stands while its
    /// write's outcome is unknown: `None` once this keeper no longer counts
    /// for that term (a later leader restarts every lease after applying
    /// what this one proposed) or the session is no longer being revoked;
    /// else whether the keeper is paused (its quorum is lost for now).
    pub fn revoke_pending(&self, session: SessionId, term: u64) -> Option<bool> {
        let t = self.timers.lock().expect("timers lock poisoned");
        (t.active && t.term == Some(term) && t.revoking.contains_key(&session)).then_some(t.paused)
    }

    /// The revoke begun with [`begin_revoke`](Self::begin_revoke) has
    /// ended (applied or failed): if the session is still open, its timer
    /// works as before (a lease that ran out meanwhile expires at once).
    pub fn end_revoke(&self, session: SessionId) {
        let mut t = self.timers.lock().expect("timers lock poisoned");
        if let Some(n) = t.revoking.get_mut(&session) {
            *n -= 1;
            if *n == 0 {
                t.revoking.remove(&session);
            }
        }
        drop(t);
        self.changed.notify_one();
    }

    /// Timers due at `now`; each is pushed back by [`RETRY_AFTER`] so it
    /// fires again if its command does not take effect.
    fn take_due(&self, now: Instant) -> Vec<TimerKey> {
        let mut t = self.timers.lock().expect("timers lock poisoned");
        let mut due = Vec::new();
        if t.paused {
            return due;
        }
        while let Some((at, _)) = t.queue.first() {
            if *at > now {
                break;
            }
            let (_, key) = t.queue.pop_first().expect("first exists");
            due.push(key);
        }
        for key in &due {
            t.arm(key.clone(), now + RETRY_AFTER);
        }
        // A session with a ttl change in flight, or being revoked, is looked
        // at again later; the others' expiry is proposed now.
        due.retain(|key| match key {
            TimerKey::Session(session) => {
                let held_back =
                    t.ttl_changes.contains_key(session) || t.revoking.contains_key(session);
                if !held_back {
                    t.expiring.insert(*session);
                }
                !held_back
            }
            _ => true,
        });
        due
    }

    fn next_deadline(&self) -> Option<Instant> {
        let t = self.timers.lock().expect("timers lock poisoned");
        if t.paused {
            return None;
        }
        t.queue.first().map(|(at, _)| *at)
    }

    /// The timer loop: sleeps until the next deadline (or a change) and
    /// proposes the commands that are due with `propose` (the leader's
    /// Raft write). Runs until the task is dropped.
    pub async fn run<P, F>(self: Arc<Self>, propose: P)
    where
        P: Fn(Batch) -> F,
        F: std::future::Future<Output = Result<(), String>> + Send + 'static,
    {
        loop {
            let next = self.next_deadline();
            let changed = self.changed.notified();
            match next {
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = changed => continue,
                    }
                }
                None => {
                    changed.await;
                    continue;
                }
            }
            let due = self.take_due(Instant::now());
            for chunk in due.chunks(MAX_BATCH) {
                let commands: Vec<Command> = chunk.iter().map(TimerKey::command).collect();
                let n = commands.len();
                crate::proposals::note(&commands);
                let proposed = propose(Batch(commands));
                tokio::spawn(async move {
                    match proposed.await {
                        Ok(()) => tracing::debug!(n, "expiry commands applied"),
                        Err(e) => {
                            tracing::debug!(n, error = %e, "expiry proposal failed; will retry")
                        }
                    }
                });
            }
        }
    }
}

#[cfg(test)]
mod tests;
