//! Sessions: a lease kept alive in the background (see `keepalive.rs` for
//! how the lease is counted and renewed), and the grants held through it.
//! When the view stops saying held (jeopardy: keep-alives are not getting
//! through), [`Session::invalid`] fires; when the lease is lost for good,
//! [`Session::lost`]. Work already running is not cancelled, only told.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use raftlock_proto::v1 as pb;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::guard::{Guard, Mode};
use crate::keepalive::{keep_alive_loop, Lease, LeaseState};
use crate::transport::Kind;
use crate::types::{Fence, SessionId};

mod acquire;

/// `timeout_ms` meaning "wait without a timeout".
pub const WAIT_FOREVER_MS: u64 = u64::MAX;

/// Length of one attempt of a wait without timeout; the wait is resumed
/// (same seq, same queue place) after each.
pub const FOREVER_ATTEMPT: Duration = Duration::from_secs(30);

/// The default grace of [`SessionOptions::end_on_disconnect`]: the same
/// in every first-party client (client/tests/integration/client_limits.rs
/// compares them).
pub const DEFAULT_END_ON_DISCONNECT: Duration = Duration::from_millis(750);

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
    /// End the session with this process: once the client's keep-alive
    /// stream to the leader closes (the process died, the connection
    /// dropped) and no new one renews the session within this grace, the
    /// leader expires it (`None`: only the ttl ends it; at most 60 s).
    /// 750 ms by default ([`DEFAULT_END_ON_DISCONNECT`]), as in the Go,
    /// Python and PHP clients: a killed process's locks pass on in about
    /// 0.8 s. The lease view then counts the smaller of the ttl and this
    /// grace from each answered keep-alive (docs/concepts/sessions-and-leases.md, "The lease rule": a
    /// paused process cannot tell when its stream was closed), and
    /// keep-alives go every third of that. A count that runs out while
    /// the session lives (a failover, a busy machine) is jeopardy, not
    /// loss: [`Session::is_valid`] says false until the next answered
    /// keep-alive, and [`Session::lost`] resolves only when the session
    /// ended or no keep-alive was answered for the ttl.
    pub end_on_disconnect: Option<Duration>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            ttl: Duration::from_secs(10),
            lock_delay: Duration::ZERO,
            margin: 0.1,
            end_on_disconnect: Some(DEFAULT_END_ON_DISCONNECT),
        }
    }
}

pub(crate) struct SessionInner {
    /// The cluster handle the session talks through.
    pub(crate) client: Client,
    /// The session id the cluster gave it.
    pub(crate) id: u64,
    /// The next request sequence number (exactly-once).
    seq: AtomicU64,
    /// The client's view of the lease (kept alive by `keeper`).
    lease: Arc<Lease>,
    /// Set once `close` ran.
    closed: AtomicBool,
    /// The keep-alive task.
    keeper: std::sync::Mutex<Option<JoinHandle<()>>>,
    /// Work on a name that a new acquire of that name must wait for: a
    /// release or cancel still in flight (from a dropped guard or a dropped
    /// acquire, or an explicit `release` in another task). Without it a
    /// re-acquire could reach the cluster before the release of the old
    /// grant and be refused as "already held".
    in_flight: std::sync::Mutex<BTreeMap<String, watch::Receiver<bool>>>,
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
        let nonce: u64 = crate::random::next_u64() | 1;
        let req = pb::OpenSessionRequest {
            ttl_ms: options.ttl.as_millis() as u64,
            lock_delay_ms: options.lock_delay.as_millis() as u64,
            nonce,
            end_on_disconnect_ms: options
                .end_on_disconnect
                .map_or(0, |d| d.as_millis().clamp(1, u128::from(u64::MAX)) as u64),
        };
        let sent_at = Instant::now();
        let resp = client
            .transport
            .locks_call(
                Kind::Write,
                |mut c| async move { c.open_session(req).await },
            )
            .await?
            .into_inner();
        let ttl = Duration::from_millis(resp.ttl_ms);
        let lease = Arc::new(Lease::new(
            resp.session_id,
            ttl,
            options.end_on_disconnect,
            options.margin,
            sent_at,
        ));
        let mux = client.keep_alives.clone();
        let inner = Arc::new(SessionInner {
            client,
            id: resp.session_id,
            seq: AtomicU64::new(1),
            lease: lease.clone(),
            closed: AtomicBool::new(false),
            keeper: std::sync::Mutex::new(None),
            in_flight: std::sync::Mutex::default(),
        });
        // OpenSession itself started the lease (counted from `sent_at`), so
        // the first keep-alive is due a third of the ttl after that, like
        // every later one: renewing at once would only cost a round trip and
        // a leadership confirmation per session. A session that ends with
        // its stream renews at once: until a stream on the leader has
        // renewed it, only its ttl can end it.
        let first = if options.end_on_disconnect.is_some() {
            Instant::now()
        } else {
            sent_at + lease.every()
        };
        let keeper = tokio::spawn(keep_alive_loop(mux, lease, first));
        *inner.keeper.lock().expect("keeper lock poisoned") = Some(keeper);
        Ok(Session { inner })
    }

    /// The session id.
    pub fn id(&self) -> SessionId {
        SessionId::new(self.inner.id)
    }

    /// The lease length.
    pub fn ttl(&self) -> Duration {
        self.inner.lease.ttl()
    }

    /// The client this session belongs to.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// True while the client's own (conservative) view of the lease says it
    /// is still held: act on the session's grants only then. False in
    /// jeopardy (keep-alives not answered within the count; the next one
    /// answered makes it true again), once lost, and once closed.
    pub fn is_valid(&self) -> bool {
        self.inner.lease.is_valid()
    }

    /// Follows the lease state.
    pub fn lease(&self) -> watch::Receiver<LeaseState> {
        self.inner.lease.subscribe()
    }

    /// Resolves when the lease is lost for good (the cluster said the
    /// session ended, the client's credentials were refused, or no
    /// keep-alive was answered for a ttl, less the margin, after the last
    /// answer arrived) or the session was closed. Jeopardy alone does not
    /// resolve it: to stop acting at the first doubt, use
    /// [`invalid`](Session::invalid) or [`is_valid`](Session::is_valid).
    /// It cancels nothing; it lets the holder stop on its own terms.
    pub async fn lost(&self) {
        self.inner.lease.lost().await
    }

    /// Resolves as soon as the view stops saying held: jeopardy (which may
    /// pass), lost or closed. It cancels nothing.
    pub async fn invalid(&self) {
        self.inner.lease.invalid().await
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

    /// Takes exclusive locks on all `names` (duplicates count once), all or
    /// nothing, in one atomic request ([`lock_all`](Session::lock_all)):
    /// waits up to `timeout` for all of them together. Guards come back in
    /// name order.
    pub async fn acquire_all<S: AsRef<str>>(
        &self,
        names: &[S],
        timeout: Duration,
    ) -> Result<Vec<Guard>> {
        let mut sorted: Vec<&str> = names.iter().map(AsRef::as_ref).collect();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.is_empty() {
            return Ok(Vec::new());
        }
        let locks: Vec<(&str, Mode)> = sorted.into_iter().map(|n| (n, Mode::Exclusive)).collect();
        self.lock_all(&locks, Some(timeout)).await
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
        self.inner.lease.mark_closed();
        let req = pb::CloseSessionRequest {
            session_id: self.inner.id,
            seq: self.next_seq(),
        };
        match self
            .inner
            .client
            .transport
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
