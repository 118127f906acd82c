//! Sessions: a lease kept alive in the background, and the grants held
//! through it.
//!
//! The client counts its lease conservatively: from the moment it *sent*
//! the last keep-alive the leader acknowledged, minus a safety margin. The
//! leader counts from when it processed that keep-alive (later), and a new
//! leader restarts the count at full length, so as long as clocks tick at
//! roughly the same rate the client always believes its lease ends before
//! the cluster does. When the client's count runs out, [`Session::lost`]
//! fires; work already running is not cancelled, only told.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use raftlock_proto::v1 as pb;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::client::{Client, Kind};
use crate::error::{Error, Result};
use crate::guard::{Guard, Mode};
use crate::types::{Fence, SessionId};

/// `timeout_ms` meaning "wait without a timeout".
pub const WAIT_FOREVER_MS: u64 = u64::MAX;

/// Length of one attempt of a wait without timeout; the wait is resumed
/// (same seq, same queue place) after each.
pub const FOREVER_ATTEMPT: Duration = Duration::from_secs(30);

/// The instant `d` from now, or about a century from now if that is
/// further (or overflows the clock): "no deadline" without a panic.
pub(crate) fn after(d: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    let now = Instant::now();
    now.checked_add(d.min(FAR)).unwrap_or(now)
}

/// How a session is opened.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// Lease length (server bounds: 1 s ..= 1 h).
    pub ttl: Duration,
    /// Lock-delay: after an expiry, the session's locks stay unavailable
    /// this long (0 = none).
    pub lock_delay: Duration,
    /// Fraction of the ttl the client subtracts from its own view of the
    /// lease, for clock-rate differences and scheduling delays.
    pub margin: f64,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            ttl: Duration::from_secs(10),
            lock_delay: Duration::ZERO,
            margin: 0.1,
        }
    }
}

/// The client's view of its lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseState {
    /// Valid until the given instant (on this process's monotonic clock).
    Valid(Instant),
    /// May have lapsed: keep-alives failed past the lease, or the session
    /// was found expired. Locks held through it may belong to others now.
    Lost,
    /// Closed by its owner.
    Closed,
}

pub(crate) struct SessionInner {
    /// The cluster handle the session talks through.
    pub(crate) client: Client,
    /// The session id the cluster gave it.
    pub(crate) id: u64,
    /// Its lease length.
    pub(crate) ttl: Duration,
    /// How much of the ttl the client's own lease view leaves out.
    margin: Duration,
    /// The next request sequence number (exactly-once).
    seq: AtomicU64,
    /// The client's view of the lease.
    lease: watch::Sender<LeaseState>,
    /// Set once `close` ran.
    closed: AtomicBool,
    /// The keep-alive task.
    keeper: std::sync::Mutex<Option<JoinHandle<()>>>,
    /// Work on a name that a new acquire of that name must wait for: a
    /// release or cancel still in flight (from a dropped guard or a dropped
    /// acquire, or an explicit `release` in another task). Without it a
    /// re-acquire could reach the cluster before the release of the old
    /// grant and be refused as "already held".
    in_flight: std::sync::Mutex<HashMap<String, watch::Receiver<bool>>>,
}

/// Marks work on a name as in flight until dropped (see
/// `SessionInner::in_flight`).
pub(crate) struct InFlight {
    session: Session,
    name: String,
    done: watch::Sender<bool>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let _ = self.done.send(true);
        let mut map = self
            .session
            .inner
            .in_flight
            .lock()
            .expect("in-flight lock poisoned");
        if map
            .get(&self.name)
            .is_some_and(|rx| rx.same_channel(&self.done.subscribe()))
        {
            map.remove(&self.name);
        }
    }
}

/// An acquire that was sent and whose outcome the caller has not taken: if
/// it is dropped armed (the caller's future was dropped, or the outcome is
/// unknown), the acquire is withdrawn in the background (`Cancel`), so no
/// wait stays queued and no grant stays held for nobody.
struct PendingAcquire {
    session: Session,
    name: String,
    seq: u64,
    armed: bool,
}

impl Drop for PendingAcquire {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let session = self.session.clone();
        let name = self.name.clone();
        let seq = self.seq;
        self.session.in_background(&self.name, async move {
            cancel(&session, &name, seq).await;
        });
    }
}

/// Withdraws the acquire `seq` on `name` (`Cancel`). Cancelling is
/// idempotent, so transient failures are retried for as long as the
/// session's lease could keep the wait alive (a ttl, at least the client's
/// retry deadline); a final failure is logged: the session's end (expiry or
/// close) withdraws the wait then.
async fn cancel(session: &Session, name: &str, seq: u64) {
    let req = pb::CancelRequest {
        session_id: session.id().get(),
        seq,
        name: name.to_string(),
    };
    let deadline = after(session.ttl().max(session.client().options().retry_deadline));
    loop {
        let result = session
            .client()
            .locks_call(Kind::Write, |mut c| {
                let req = req.clone();
                async move { c.cancel(req).await }
            })
            .await;
        match result {
            Ok(_) | Err(Error::SessionNotFound(_)) => return,
            Err(e) if e.is_retryable() || matches!(e, Error::Internal(_)) => {
                if Instant::now() >= deadline || !session.is_valid() {
                    tracing::warn!(name, seq, error = %e, "cancelling an abandoned acquire failed; the session's end will withdraw it");
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => {
                tracing::warn!(name, seq, error = %e, "cancelling an abandoned acquire was refused; the session's end will withdraw it");
                return;
            }
        }
    }
}

/// An open session. Cheap to clone; the lease is kept alive until the last
/// clone is dropped or [`close`](Session::close) is called.
#[derive(Clone)]
pub struct Session {
    pub(crate) inner: Arc<SessionInner>,
}

impl Drop for SessionInner {
    fn drop(&mut self) {
        if let Some(k) = self.keeper.lock().ok().and_then(|mut k| k.take()) {
            k.abort();
        }
    }
}

impl Session {
    pub(crate) async fn open(client: Client, options: SessionOptions) -> Result<Session> {
        let nonce: u64 = rand::random::<u64>() | 1;
        let req = pb::OpenSessionRequest {
            ttl_ms: options.ttl.as_millis() as u64,
            lock_delay_ms: options.lock_delay.as_millis() as u64,
            nonce,
        };
        let sent_at = Instant::now();
        let resp = client
            .locks_call(
                Kind::Write,
                |mut c| async move { c.open_session(req).await },
            )
            .await?
            .into_inner();
        let ttl = Duration::from_millis(resp.ttl_ms);
        let margin = ttl.mul_f64(options.margin.clamp(0.0, 0.5));
        let (lease, _) = watch::channel(LeaseState::Valid(sent_at + ttl - margin));
        let inner = Arc::new(SessionInner {
            client,
            id: resp.session_id,
            ttl,
            margin,
            seq: AtomicU64::new(1),
            lease,
            closed: AtomicBool::new(false),
            keeper: std::sync::Mutex::new(None),
            in_flight: std::sync::Mutex::default(),
        });
        // OpenSession itself started the lease (counted from `sent_at`), so
        // the first keep-alive is due a third of the ttl after that, like
        // every later one: renewing at once would only cost a round trip and
        // a leadership confirmation per session.
        let first = sent_at + ttl / 3;
        let keeper = tokio::spawn(keep_alive_loop(Arc::downgrade(&inner), first));
        *inner.keeper.lock().expect("keeper lock poisoned") = Some(keeper);
        Ok(Session { inner })
    }

    /// The session id.
    pub fn id(&self) -> SessionId {
        SessionId::new(self.inner.id)
    }

    /// The lease length.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// The client this session belongs to.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// True while the client's own (conservative) view of the lease says it
    /// is still held.
    pub fn is_valid(&self) -> bool {
        matches!(*self.inner.lease.borrow(), LeaseState::Valid(until) if Instant::now() < until)
    }

    /// Follows the lease state.
    pub fn lease(&self) -> watch::Receiver<LeaseState> {
        self.inner.lease.subscribe()
    }

    /// Resolves when the lease may be gone (lost or closed). It does not
    /// cancel anything; it lets the holder stop on its own terms.
    pub async fn lost(&self) {
        let mut rx = self.inner.lease.subscribe();
        loop {
            let until = match *rx.borrow_and_update() {
                LeaseState::Valid(until) => until,
                _ => return,
            };
            tokio::select! {
                _ = tokio::time::sleep_until(until) => {
                    if !matches!(*rx.borrow(), LeaseState::Valid(u) if u > Instant::now()) {
                        // Whoever sees the lease run out first records it,
                        // so `lease()` watchers agree with `lost()`.
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

    pub(crate) fn next_seq(&self) -> u64 {
        self.inner.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Marks work on `name` in flight until the returned value is dropped;
    /// first waits for work on `name` already in flight, so releases and
    /// cancels of one name reach the cluster in order.
    pub(crate) async fn start_in_flight(&self, name: &str) -> InFlight {
        let (marker, previous) = self.mark_in_flight(name);
        if let Some(mut previous) = previous {
            let _ = previous.wait_for(|done| *done).await;
        }
        marker
    }

    fn mark_in_flight(&self, name: &str) -> (InFlight, Option<watch::Receiver<bool>>) {
        let (done, rx) = watch::channel(false);
        let previous = self
            .inner
            .in_flight
            .lock()
            .expect("in-flight lock poisoned")
            .insert(name.to_string(), rx);
        let marker = InFlight {
            session: self.clone(),
            name: name.to_string(),
            done,
        };
        (marker, previous)
    }

    /// Runs `work` on `name` in the background, in flight (see
    /// [`start_in_flight`](Self::start_in_flight)). Without a runtime
    /// (dropped outside one) nothing runs: the session's end releases and
    /// withdraws whatever it has.
    pub(crate) fn in_background<F>(&self, name: &str, work: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        // Registered now, not when the task first runs, so an acquire of
        // the name right after the drop already waits for it.
        let (marker, previous) = self.mark_in_flight(name);
        handle.spawn(async move {
            if let Some(mut previous) = previous {
                let _ = previous.wait_for(|done| *done).await;
            }
            work.await;
            drop(marker);
        });
    }

    /// Waits until no release or cancel of `name` is in flight.
    pub(crate) async fn settle(&self, name: &str) {
        let rx = self
            .inner
            .in_flight
            .lock()
            .expect("in-flight lock poisoned")
            .get(name)
            .cloned();
        if let Some(mut rx) = rx {
            let _ = rx.wait_for(|done| *done).await;
        }
    }

    fn mark_lost(&self) {
        self.inner.lease.send_if_modified(|s| {
            if matches!(s, LeaseState::Valid(_)) {
                *s = LeaseState::Lost;
                true
            } else {
                false
            }
        });
    }

    /// Acquires `name` in `mode`, waiting up to `timeout` (`None`: forever,
    /// `Some(ZERO)`: try once) and attaching `value`.
    pub(crate) async fn acquire(
        &self,
        name: &str,
        mode: Mode,
        timeout: Option<Duration>,
        value: Vec<u8>,
    ) -> Result<Guard> {
        if !self.is_valid() {
            return Err(Error::LeaseLost);
        }
        // A release or cancel of this name still in flight goes first: the
        // cluster refuses a new acquire of a name the session still holds.
        self.settle(name).await;
        let seq = self.next_seq();
        let timeout_ms = match timeout {
            None => WAIT_FOREVER_MS,
            Some(t) => u64::try_from(t.as_millis())
                .unwrap_or(u64::MAX)
                .min(WAIT_FOREVER_MS - 1),
        };
        let (pmode, weight, capacity) = match mode {
            Mode::Exclusive => (pb::Mode::Exclusive, 0, 0),
            Mode::Shared => (pb::Mode::Shared, 0, 0),
            Mode::Semaphore { weight, capacity } => (pb::Mode::Semaphore, weight, capacity),
        };
        let req = pb::AcquireRequest {
            session_id: self.inner.id,
            seq,
            name: name.to_string(),
            mode: pmode as i32,
            weight,
            capacity,
            timeout_ms,
            value: value.clone(),
        };
        let opts = self.inner.client.options();
        // One attempt may wait as long as the acquire's own timeout; a
        // retry (same seq) resumes the same place in the queue.
        // A wait without timeout is polled in bounded attempts: a retry with
        // the same seq resumes the same place in the queue, and a node that
        // was cut off from the cluster is not waited on forever.
        let (attempt, deadline) = match timeout {
            None => (FOREVER_ATTEMPT, after(Duration::MAX)),
            Some(t) => (
                opts.request_timeout.saturating_add(t.saturating_mul(2)),
                after(opts.retry_deadline.saturating_add(t.saturating_mul(2))),
            ),
        };
        // From here on the acquire may be queued or granted: if this future
        // is dropped, or the outcome stays unknown, it is withdrawn.
        let mut pending = PendingAcquire {
            session: self.clone(),
            name: name.to_string(),
            seq,
            armed: true,
        };
        let result = self
            .inner
            .client
            .call(Kind::Write, attempt, deadline, |c| {
                let req = req.clone();
                async move { Client::locks(c).acquire(req).await }
            })
            .await;
        let resp = match result {
            Ok(resp) => {
                pending.armed = false;
                resp.into_inner()
            }
            Err(e) => {
                // A refusal changed nothing; anything else may have left the
                // acquire queued (or granted) on the cluster.
                pending.armed = matches!(
                    e,
                    Error::Unknown(_) | Error::Unavailable(_) | Error::Internal(_)
                );
                return Err(e);
            }
        };
        if !resp.acquired {
            return Err(Error::NotAcquired(timeout.unwrap_or(Duration::MAX)));
        }
        let guard = Guard::new(
            self.clone(),
            name.to_string(),
            Fence::new(resp.fence),
            mode,
            value,
        );
        // Never hand out a grant on a lease that may already have lapsed
        // (etcd #11456): give it back and say so.
        if !self.is_valid() {
            guard.release().await.ok();
            return Err(Error::LeaseLost);
        }
        Ok(guard)
    }

    /// Waits for and takes an exclusive lock on `name`.
    pub async fn lock(&self, name: &str) -> Result<Guard> {
        self.acquire(name, Mode::Exclusive, None, Vec::new()).await
    }

    /// Takes an exclusive lock on `name` if it is free now.
    pub async fn try_lock(&self, name: &str) -> Result<Option<Guard>> {
        match self
            .acquire(name, Mode::Exclusive, Some(Duration::ZERO), Vec::new())
            .await
        {
            Ok(g) => Ok(Some(g)),
            Err(Error::NotAcquired(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Waits up to `timeout` for an exclusive lock on `name`.
    pub async fn lock_timeout(&self, name: &str, timeout: Duration) -> Result<Guard> {
        self.acquire(name, Mode::Exclusive, Some(timeout), Vec::new())
            .await
    }

    /// Waits for a shared lock on `name`.
    pub async fn read_lock(&self, name: &str) -> Result<Guard> {
        self.acquire(name, Mode::Shared, None, Vec::new()).await
    }

    /// Waits up to `timeout` for a lock in `mode` with a holder value.
    pub async fn lock_with(
        &self,
        name: &str,
        shared: bool,
        timeout: Option<Duration>,
        value: Vec<u8>,
    ) -> Result<Guard> {
        let mode = if shared {
            Mode::Shared
        } else {
            Mode::Exclusive
        };
        self.acquire(name, mode, timeout, value).await
    }

    /// A handle on semaphore `name` of `capacity`.
    pub fn semaphore(&self, name: &str, capacity: u32) -> Semaphore {
        Semaphore {
            session: self.clone(),
            name: name.to_string(),
            capacity,
        }
    }

    /// Runs `f` while holding an exclusive lock on `name`, passing it the
    /// fence; releases afterwards whatever `f` returned.
    pub async fn with_lock<F, Fut, T>(&self, name: &str, f: F) -> Result<T>
    where
        F: FnOnce(Fence) -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let guard = self.lock(name).await?;
        let out = f(guard.fence()).await;
        guard.release().await?;
        Ok(out)
    }

    /// Takes exclusive locks on all `names`, all or nothing. Names are
    /// taken in sorted order, the same order every caller uses, so two
    /// callers cannot deadlock on each other. Waits up to `timeout` in
    /// total.
    pub async fn acquire_all<S: AsRef<str>>(
        &self,
        names: &[S],
        timeout: Duration,
    ) -> Result<Vec<Guard>> {
        let mut sorted: Vec<&str> = names.iter().map(AsRef::as_ref).collect();
        sorted.sort_unstable();
        sorted.dedup();
        let deadline = after(timeout);
        let mut held: Vec<Guard> = Vec::with_capacity(sorted.len());
        for name in sorted {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lock_timeout(name, left).await {
                Ok(g) => held.push(g),
                Err(e) => {
                    for g in held.drain(..).rev() {
                        let _ = g.release().await;
                    }
                    return Err(e);
                }
            }
        }
        Ok(held)
    }

    /// Closes the session: releases everything it holds and stops the
    /// keep-alives. Safe to call more than once.
    pub async fn close(&self) -> Result<()> {
        if self.inner.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        if let Some(k) = self
            .inner
            .keeper
            .lock()
            .expect("keeper lock poisoned")
            .take()
        {
            k.abort();
        }
        self.inner.lease.send_replace(LeaseState::Closed);
        let req = pb::CloseSessionRequest {
            session_id: self.inner.id,
            seq: self.next_seq(),
        };
        match self
            .inner
            .client
            .locks_call(
                Kind::Write,
                |mut c| async move { c.close_session(req).await },
            )
            .await
        {
            Ok(_) | Err(Error::SessionNotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// A semaphore through a session.
pub struct Semaphore {
    session: Session,
    name: String,
    capacity: u32,
}

impl Semaphore {
    /// Waits for `weight` permits.
    pub async fn acquire(&self, weight: u32) -> Result<Guard> {
        let mode = Mode::Semaphore {
            weight,
            capacity: self.capacity,
        };
        self.session
            .acquire(&self.name, mode, None, Vec::new())
            .await
    }

    /// Waits up to `timeout` for `weight` permits.
    pub async fn acquire_timeout(&self, weight: u32, timeout: Duration) -> Result<Guard> {
        let mode = Mode::Semaphore {
            weight,
            capacity: self.capacity,
        };
        self.session
            .acquire(&self.name, mode, Some(timeout), Vec::new())
            .await
    }

    /// Takes `weight` permits if they are free now.
    pub async fn try_acquire(&self, weight: u32) -> Result<Option<Guard>> {
        let mode = Mode::Semaphore {
            weight,
            capacity: self.capacity,
        };
        match self
            .session
            .acquire(&self.name, mode, Some(Duration::ZERO), Vec::new())
            .await
        {
            Ok(g) => Ok(Some(g)),
            Err(Error::NotAcquired(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Sends keep-alives about every ttl/3, the first at `first`, and keeps
/// the lease view current. If the lease runs out before a keep-alive gets
/// through, the session is marked lost at that instant (even while an
/// attempt is still under way) and keep-alives stop: `Lost` is final.
async fn keep_alive_loop(weak: std::sync::Weak<SessionInner>, first: Instant) {
    // Holds no reference while asleep, so dropping the last `Session` ends
    // the session's keep-alives even before the first one.
    tokio::time::sleep_until(first).await;
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let session = Session { inner };
        let until = match *session.inner.lease.borrow() {
            LeaseState::Valid(u) => u,
            _ => return,
        };
        let sent_at = Instant::now();
        tokio::select! {
            result = send_keep_alive(&session) => match result {
                Ok(ttl) => {
                    let new_until = sent_at + ttl - session.inner.margin;
                    session.inner.lease.send_if_modified(|s| match s {
                        LeaseState::Valid(old) if *old < new_until => {
                            *old = new_until;
                            true
                        }
                        _ => false,
                    });
                }
                Err(Error::SessionNotFound(_)) => {
                    session.mark_lost();
                    return;
                }
                Err(e) => {
                    tracing::debug!(session = session.inner.id, error = %e, "keep-alive failed");
                }
            },
            _ = tokio::time::sleep_until(until) => {}
        }
        if !session.is_valid() {
            session.mark_lost();
            return;
        }
        let until = match *session.inner.lease.borrow() {
            LeaseState::Valid(u) => u,
            _ => return,
        };
        // Next keep-alive a third of the ttl after this one was sent, or
        // soon if this one failed; never later than the lease's end.
        let next =
            (sent_at + session.inner.ttl / 3).max(Instant::now() + Duration::from_millis(50));
        drop(session);
        tokio::time::sleep_until(next.min(until)).await;
    }
}

async fn send_keep_alive(session: &Session) -> Result<Duration> {
    let id = session.inner.id;
    // A keep-alive that takes longer than a third of the ttl is useless.
    let attempt = (session.inner.ttl / 3).max(Duration::from_millis(200));
    let resp = session
        .inner
        .client
        .keep_alive(id, Instant::now() + attempt)
        .await?;
    if resp.expired {
        return Err(Error::SessionNotFound(format!("session {id} expired")));
    }
    Ok(Duration::from_millis(resp.ttl_ms))
}
