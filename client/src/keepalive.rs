//! Keeping sessions alive: each session's lease view and its keep-alive
//! loop, and the one `KeepAlive` stream per [`Client`](crate::Client) that
//! all its sessions share.
//!
//! **The lease view.** A session counts its lease conservatively: from the
//! moment it *sent* the last keep-alive the leader acknowledged, minus a
//! safety margin. A session that ends with its process counts the smaller
//! of its ttl and its grace (docs/concepts/sessions-and-leases.md, "The lease rule"): the leader ends it
//! a grace after the stream that renewed it closes, and a paused process
//! cannot tell when that happened; such a session renews every third of
//! that length. The leader counts from when it processed that keep-alive
//! (later), and a new leader restarts the count at full length, so as long
//! as clocks tick at roughly the same rate the client always believes its
//! lease ends before the cluster does. The count runs on this process's
//! monotonic clock (`CLOCK_MONOTONIC`), which stops while the host is
//! suspended: a client host that sleeps past its lease believes it on
//! waking, until its next keep-alive is answered `expired` (see
//! docs/concepts/sessions-and-leases.md).
//!
//! **Held, jeopardy, lost.** While the count runs the lease is *held*. Once
//! it has run out without a newer answer the lease is in *jeopardy*: the
//! view says not held (the holder must not act: its stream may have been
//! closed behind its back, and the session ended a grace later), but
//! nothing is reported lost and keep-alives go on. A keep-alive answered
//! "renewed" proves the session alive, and a live session's grants were
//! never handed on, so the count moves on from that ask's send and the
//! lease is held again. It is *lost* (final: `Lost`, [`Lease::lost`]
//! resolves, keep-alives stop) only when a node answers that the session
//! has ended, a keep-alive is refused `UNAUTHENTICATED` (the client's
//! token was revoked: none will get through), or no keep-alive was
//! answered for a whole ttl (less the margin) after the last answer
//! *arrived*: that deadline only decides when to give up, so it counts
//! from arrival, not from the send.
//!
//! **The loop.** A session asks for a keep-alive every third of the length
//! it counts (the ttl, or the smaller of the ttl and the grace), in
//! jeopardy too, until the lease is lost or closed.
//!
//! **The stream.** The multiplexer sends every ask on one bidirectional
//! stream to the leader and hands each answer back to the ask it belongs
//! to. Opening a stream per keep-alive costs an HTTP/2 stream and a server
//! task each time: at tens of thousands of sessions per client that
//! overhead, not the cluster, decided whether leases lapsed. The stream is
//! opened lazily, through the transport's `call` (so it follows leader
//! hints and backs off like any request), and reopened when it fails:
//! every ask in flight on a failed stream gets an error and its session
//! retries. An ask that waits past its deadline on a stream that does not
//! answer marks the stream as stalled: it is dropped and the leader
//! forgotten.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use raftlock_proto::v1 as pb;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Streaming;

use crate::error::{Error, Result};
use crate::transport::{Conn, Kind, WeakTransport};

/// The client's view of its lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseState {
    /// Held until the given instant (on this process's monotonic clock).
    /// Past it, and not yet lost, the lease is in jeopardy: do not act on
    /// its grants (the view says not held), but keep-alives go on, and the
    /// next one answered makes it held again with a later instant.
    Valid(Instant),
    /// Lost for good: the cluster said the session ended, the client's
    /// credentials were refused, or no keep-alive was answered for a ttl.
    /// Locks held through it may belong to others now.
    Lost,
    /// Closed by its owner.
    Closed,
}

/// One session's lease view.
pub(crate) struct Lease {
    /// The session.
    id: u64,
    /// Its lease length.
    ttl: Duration,
    /// The grace of a session that ends with its process: the view counts
    /// at most this much from an answered send.
    grace: Option<Duration>,
    /// How much of the counted length the view leaves out (a fraction).
    margin: f64,
    /// The view; `Lost` and `Closed` are final.
    state: watch::Sender<LeaseState>,
    /// When to give up: the arrival of the last lease-starting answer +
    /// the ttl less the margin. Past it with no newer answer the lease is
    /// lost.
    give_up: Mutex<Instant>,
}

impl Lease {
    /// The view of session `id` whose lease (`ttl`; at most `grace` for a
    /// session that ends with its process; less the `margin` fraction of
    /// that) was started by a request sent at `sent_at`.
    pub(crate) fn new(
        id: u64,
        ttl: Duration,
        grace: Option<Duration>,
        margin: f64,
        sent_at: Instant,
    ) -> Lease {
        let mut lease = Lease {
            id,
            ttl,
            grace,
            margin: margin.clamp(0.0, 0.5),
            state: watch::channel(LeaseState::Closed).0,
            give_up: Mutex::new(Instant::now()),
        };
        lease.state = watch::channel(LeaseState::Valid(sent_at + lease.counted(ttl))).0;
        *lease.give_up.get_mut().unwrap_or_else(|e| e.into_inner()) =
            Instant::now() + lease.uncapped(ttl);
        lease
    }

    /// A ttl less the margin (not capped by the grace): how long after an
    /// answer arrived the lease may still be alive on the cluster.
    fn uncapped(&self, ttl: Duration) -> Duration {
        ttl - ttl.mul_f64(self.margin)
    }

    /// When the lease is given up as lost if no answer comes before.
    pub(crate) fn give_up(&self) -> Instant {
        *self.give_up.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The lease length.
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How long after an answered send the view runs, for a lease of
    /// `ttl`: the ttl (at most the grace), less the margin.
    fn counted(&self, ttl: Duration) -> Duration {
        let length = self.grace.map_or(ttl, |g| g.min(ttl));
        length - length.mul_f64(self.margin)
    }

    /// How often the session renews: a third of the length it counts.
    pub(crate) fn every(&self) -> Duration {
        self.grace.map_or(self.ttl, |g| g.min(self.ttl)) / 3
    }

    /// True while the view says the lease is held.
    pub(crate) fn is_valid(&self) -> bool {
        matches!(*self.state.borrow(), LeaseState::Valid(until) if Instant::now() < until)
    }

    /// True once the view is lost or closed, or its give-up deadline has
    /// passed (final; jeopardy is not over).
    pub(crate) fn is_over(&self) -> bool {
        !matches!(*self.state.borrow(), LeaseState::Valid(_)) || Instant::now() >= self.give_up()
    }

    /// Waits until the view says held (true) or the lease is lost or
    /// closed (false). Held already: at once. In jeopardy the keep-alives
    /// go on; the next one answered makes it held, and the give-up deadline
    /// bounds the wait.
    pub(crate) async fn held_or_over(&self) -> bool {
        let mut rx = self.state.subscribe();
        loop {
            match *rx.borrow_and_update() {
                LeaseState::Valid(until) if Instant::now() < until => return true,
                LeaseState::Valid(_) => {}
                _ => return false,
            }
            tokio::select! {
                _ = tokio::time::sleep_until(self.give_up()) => {
                    if Instant::now() >= self.give_up() {
                        self.mark_lost();
                        return false;
                    }
                }
                changed = rx.changed() => {
                    if changed.is_err() {
                        return false;
                    }
                }
            }
        }
    }

    /// Follows the view.
    pub(crate) fn subscribe(&self) -> watch::Receiver<LeaseState> {
        self.state.subscribe()
    }

    /// The lease may be gone (final).
    pub(crate) fn mark_lost(&self) {
        self.end(LeaseState::Lost);
    }

    /// The session was closed (final, whatever the view said before).
    pub(crate) fn mark_closed(&self) {
        self.state.send_replace(LeaseState::Closed);
    }

    fn end(&self, to: LeaseState) {
        self.state.send_if_modified(|s| {
            if matches!(s, LeaseState::Valid(_)) {
                *s = to;
                true
            } else {
                false
            }
        });
    }

    /// A keep-alive sent at `sent_at` was answered with `ttl` (the session
    /// is alive): the view runs until `sent_at` + the counted length, if
    /// that is later (from jeopardy too: held again), and the lease is
    /// given up no sooner than a ttl less the margin from now.
    fn extend(&self, sent_at: Instant, ttl: Duration) {
        let new_until = sent_at + self.counted(ttl);
        if !matches!(*self.state.borrow(), LeaseState::Valid(_)) {
            return;
        }
        {
            let mut give_up = self.give_up.lock().unwrap_or_else(|e| e.into_inner());
            *give_up = (*give_up).max(Instant::now() + self.uncapped(ttl));
        }
        self.state.send_if_modified(|s| match s {
            LeaseState::Valid(old) if *old < new_until => {
                *old = new_until;
                true
            }
            _ => false,
        });
    }

    /// Resolves when the lease is lost for good or closed, marking it lost
    /// if its give-up deadline passed while nobody looked (jeopardy alone
    /// does not resolve it).
    pub(crate) async fn lost(&self) {
        let mut rx = self.state.subscribe();
        loop {
            if !matches!(*rx.borrow_and_update(), LeaseState::Valid(_)) {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(self.give_up()) => {
                    if Instant::now() >= self.give_up() {
                        // Whoever sees the deadline pass first records it,
                        // so subscribers agree with `lost()`.
                        self.mark_lost();
                        return;
                    }
                }
                changed = rx.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
    }

    /// Resolves as soon as the view stops saying held: jeopardy, lost or
    /// closed.
    pub(crate) async fn invalid(&self) {
        let mut rx = self.state.subscribe();
        loop {
            let until = match *rx.borrow_and_update() {
                LeaseState::Valid(until) => until,
                _ => return,
            };
            if Instant::now() >= until {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(until) => {}
                changed = rx.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// Keeps `lease` alive through `mux`, the first keep-alive at `first`,
/// until the lease is lost or closed (or the task is aborted, when the
/// session is dropped).
pub(crate) async fn keep_alive_loop(mux: Mux, lease: Arc<Lease>, first: Instant) {
    tokio::time::sleep_until(first).await;
    loop {
        if !matches!(*lease.state.borrow(), LeaseState::Valid(_)) {
            return;
        }
        let give_up = lease.give_up();
        let sent_at = Instant::now();
        tokio::select! {
            result = renew(&mux, &lease) => match result {
                Ok(ttl) => lease.extend(sent_at, ttl),
                Err(Error::SessionNotFound(_)) => {
                    lease.mark_lost();
                    return;
                }
                // The cluster no longer takes this client's credentials
                // (a revoked token): no keep-alive will get through, so
                // the lease is as good as lost now; say so at once rather
                // than when it runs out.
                Err(e @ Error::Unauthenticated(_)) => {
                    tracing::warn!(session = lease.id, error = %e, "keep-alive refused; lease lost");
                    lease.mark_lost();
                    return;
                }
                Err(e) => {
                    tracing::debug!(session = lease.id, error = %e, "keep-alive failed");
                }
            },
            _ = tokio::time::sleep_until(give_up) => {}
        }
        if Instant::now() >= lease.give_up() {
            lease.mark_lost();
            return;
        }
        let until = match *lease.state.borrow() {
            LeaseState::Valid(u) => u,
            _ => return,
        };
        // Next keep-alive a third of the counted length after this one was
        // sent, or soon if this one failed; while held, never later than
        // the end of the count (in jeopardy that end has passed: the
        // cadence alone); never past the give-up deadline.
        let mut next = (sent_at + lease.every()).max(Instant::now() + Duration::from_millis(50));
        if until > Instant::now() {
            next = next.min(until);
        }
        tokio::time::sleep_until(next.min(lease.give_up())).await;
    }
}

/// One keep-alive of `lease`'s session: the ttl the leader renewed it for.
async fn renew(mux: &Mux, lease: &Lease) -> Result<Duration> {
    let id = lease.id;
    // An attempt lasts a third of the counted length, and at least a
    // second: an ask that times out drops the stream as stalled, and a
    // dropped stream starts the grace of every session it carried, so a
    // short silence on a busy machine must not end it.
    let attempt = lease.every().max(Duration::from_secs(1));
    let resp = mux.ask(id, Instant::now() + attempt).await?;
    if resp.expired {
        return Err(Error::SessionNotFound(format!("session {id} expired")));
    }
    Ok(Duration::from_millis(resp.ttl_ms))
}

/// The client's keep-alive multiplexer (started with its first ask, ended
/// when every handle is gone). Cheap to clone.
#[derive(Clone)]
pub(crate) struct Mux {
    transport: WeakTransport,
    asks: Arc<OnceLock<mpsc::UnboundedSender<Ask>>>,
    /// The last ask id handed out (ids start at 1; 0 is "none").
    ask_ids: Arc<AtomicU64>,
}

impl Mux {
    /// A multiplexer over `transport` (nothing runs until the first ask).
    pub(crate) fn new(transport: WeakTransport) -> Mux {
        Mux {
            transport,
            asks: Arc::default(),
            ask_ids: Arc::default(),
        }
    }

    /// Renews `session`'s lease through the one stream; gives up at
    /// `deadline`.
    pub(crate) async fn ask(
        &self,
        session: u64,
        deadline: Instant,
    ) -> Result<pb::KeepAliveResponse> {
        let asks = self.asks.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(run(self.transport.clone(), rx));
            tx
        });
        let (reply, answer) = oneshot::channel();
        asks.send(Ask {
            session,
            id: self.ask_ids.fetch_add(1, Ordering::Relaxed) + 1,
            deadline,
            reply,
        })
        .map_err(|_| Error::Internal("the keep-alive multiplexer stopped".into()))?;
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(Error::Internal(
                "the keep-alive multiplexer dropped an ask".into(),
            )),
            Err(_) => Err(Error::Unavailable(format!(
                "no keep-alive answer for session {session} in time"
            ))),
        }
    }
}

/// One session's request for a keep-alive.
struct Ask {
    /// The session.
    session: u64,
    /// This ask's id, which its answer echoes: an answer is credited to
    /// the ask it answers, never to a later ask of the same session (the
    /// session counts its lease from the ask's send time).
    id: u64,
    /// When the session stops waiting for this answer.
    deadline: Instant,
    /// Where its answer goes.
    reply: oneshot::Sender<Result<pb::KeepAliveResponse>>,
}

impl Ask {
    fn wanted(&self, now: Instant) -> bool {
        !self.reply.is_closed() && self.deadline > now
    }

    fn answer(self, answer: Result<pb::KeepAliveResponse>) {
        // The session may have stopped waiting; then nobody needs it.
        let _ = self.reply.send(answer);
    }
}

/// An open stream: its first answer, the answers to come, and the way in.
/// A keep-alive stream just opened: its first answer, the answers to
/// come, where asks go, and the leader its node named (a follower that
/// forwards the stream names the leader).
struct Opened {
    answer: pb::KeepAliveResponse,
    inbound: Streaming<pb::KeepAliveResponse>,
    out: mpsc::UnboundedSender<pb::KeepAliveRequest>,
    hint: Option<String>,
}

impl crate::transport::LeaderHint for Opened {
    fn leader_hint(&self) -> Option<String> {
        self.hint.clone()
    }
}

/// The multiplexer; ends when every sender of asks (every client clone
/// and session keeper) is gone, or the transport with them.
async fn run(transport: WeakTransport, mut asks: mpsc::UnboundedReceiver<Ask>) {
    // Asks not yet sent on a stream, oldest first.
    let mut backlog: VecDeque<Ask> = VecDeque::new();
    // A stream that went silent (its leader hung, or the path to it), kept
    // open until a new stream has renewed: closing it would start the
    // leader's end-on-disconnect grace for every session it carried, and
    // if the leader comes back before a new stream renews them, the
    // sessions of a live process would end. (docs/clients/writing-a-client.md:
    // open a replacement stream before closing a silent one.)
    let mut silent: Option<Silent> = None;
    loop {
        let now = Instant::now();
        backlog.retain(|a| a.wanted(now));
        if backlog.is_empty() {
            match asks.recv().await {
                Some(a) => backlog.push_back(a),
                None => return,
            }
            continue;
        }
        // Holds the transport only while opening (and to note a failure).
        let Some(open_with) = transport.upgrade() else {
            return;
        };
        let first = backlog.pop_front().expect("not empty");
        let opened = open(&open_with, &first).await;
        drop(open_with);
        let Opened {
            answer,
            mut inbound,
            out,
            ..
        } = match opened {
            Ok(o) => o,
            Err(e) => {
                first.answer(Err(e));
                continue;
            }
        };
        first.answer(Ok(answer));
        // The new stream has renewed: a silent one can go now.
        drop(silent.take());
        // Asks sent on this stream, with when, oldest first.
        let mut sent: VecDeque<(Instant, Ask)> = VecDeque::new();
        let mut last_answer = Instant::now();
        let mut broken = false;
        let mut stalled = false;
        for a in backlog.drain(..) {
            broken |= send(&out, &a).is_err();
            sent.push_back((Instant::now(), a));
        }
        while !broken {
            let oldest = sent.front().map(|(_, a)| a.deadline);
            tokio::select! {
                ask = asks.recv() => match ask {
                    Some(a) => {
                        broken = send(&out, &a).is_err();
                        sent.push_back((Instant::now(), a));
                    }
                    None => return,
                },
                msg = inbound.message() => match msg {
                    Ok(Some(r)) => {
                        last_answer = Instant::now();
                        // The ask this answers, if it still waits: an
                        // answer to an ask given up on (it timed out and
                        // its session asked again) is dropped, never
                        // credited to the newer ask.
                        if let Some(i) = sent.iter().position(|(_, a)| answers(a, &r)) {
                            sent.remove(i).expect("found").1.answer(Ok(r));
                        }
                    }
                    Ok(None) => {
                        fail(&mut sent, || Error::Unavailable("keep-alive stream ended".into()));
                        broken = true;
                    }
                    Err(status) => {
                        stream_failed(&transport, &status);
                        let e = Error::from_status(&status, false);
                        fail(&mut sent, || e.clone());
                        broken = true;
                    }
                },
                _ = tokio::time::sleep_until(oldest.unwrap_or_else(Instant::now)), if oldest.is_some() => {
                    let (asked, a) = sent.pop_front().expect("an oldest ask");
                    a.answer(Err(Error::Unavailable("no keep-alive answer in time".into())));
                    if last_answer < asked {
                        // Nothing at all came back since: the leader may
                        // be gone with the connection still up.
                        stream_failed(&transport, &tonic::Status::unavailable("keep-alive stream stalled"));
                        broken = true;
                        stalled = true;
                    }
                }
            }
        }
        fail(&mut sent, || {
            Error::Unavailable("keep-alive stream closed".into())
        });
        if stalled {
            // (Nothing older is kept: a stream opens only with an answered
            // renewal, which let any earlier silent stream go.)
            silent.replace((inbound, out));
        }
    }
}

/// A stream kept open after it went silent: its answers (not read) and the
/// way in.
type Silent = (
    Streaming<pb::KeepAliveResponse>,
    mpsc::UnboundedSender<pb::KeepAliveRequest>,
);

/// Tells the transport (if a client still holds it) that its stream to the
/// leader failed.
fn stream_failed(transport: &WeakTransport, status: &tonic::Status) {
    if let Some(t) = transport.upgrade() {
        t.stream_failed(status);
    }
}

/// Whether `r` answers ask `a`: by the ask id a node echoes; a node that
/// echoes none (0, an older one) by session, oldest ask first.
fn answers(a: &Ask, r: &pb::KeepAliveResponse) -> bool {
    match r.ask_id {
        0 => a.session == r.session_id,
        id => a.id == id && a.session == r.session_id,
    }
}

fn send(out: &mpsc::UnboundedSender<pb::KeepAliveRequest>, a: &Ask) -> Result<()> {
    out.send(pb::KeepAliveRequest {
        session_id: a.session,
        ask_id: a.id,
    })
    .map_err(|_| Error::Unavailable("keep-alive stream closed".into()))
}

fn fail(sent: &mut VecDeque<(Instant, Ask)>, error: impl Fn() -> Error) {
    for (_, a) in sent.drain(..) {
        a.answer(Err(error()));
    }
}

/// Opens a stream at the leader with `session`'s keep-alive as its first
/// message, and waits for that answer (a follower refuses on the stream,
/// with the leader's address, which `call` follows).
async fn open(transport: &crate::transport::Transport, first: &Ask) -> Result<Opened> {
    let ask = pb::KeepAliveRequest {
        session_id: first.session,
        ask_id: first.id,
    };
    let deadline = first.deadline;
    let attempt = deadline.saturating_duration_since(Instant::now());
    transport
        .call(Kind::Read, attempt, deadline, move |c: Conn| async move {
            let (out, rx) = mpsc::unbounded_channel();
            out.send(ask).expect("receiver held");
            let opened = crate::transport::locks_client(c)
                .keep_alive(UnboundedReceiverStream::new(rx))
                .await?;
            let hint = crate::transport::LeaderHint::leader_hint(&opened);
            let mut inbound = opened.into_inner();
            // A fresh stream carries nothing but this ask yet, so its
            // first answer is this ask's.
            match inbound.message().await? {
                Some(answer) if answer.ask_id == ask.ask_id || answer.ask_id == 0 => Ok(Opened {
                    answer,
                    inbound,
                    out,
                    hint,
                }),
                Some(answer) => Err(tonic::Status::internal(format!(
                    "keep-alive answer for ask {} on a stream that carried only ask {}",
                    answer.ask_id, ask.ask_id
                ))),
                None => Err(tonic::Status::unavailable("keep-alive stream ended")),
            }
        })
        .await
}
