//! Grants: held until released, dropped, or the session ends.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use raftlock_proto::v1 as pb;

use crate::error::{Error, Result};
use crate::session::Session;
use crate::transport::Kind;
use crate::types::Fence;

/// What a grant holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// An exclusive lock.
    Exclusive,
    /// A shared lock.
    Shared,
    /// `weight` permits of a semaphore of `capacity`.
    Semaphore {
        /// Permits held.
        weight: u32,
        /// The semaphore's capacity.
        capacity: u32,
    },
}

struct GuardInner {
    session: Session,
    name: String,
    fence: Fence,
    mode: Mode,
    value: Vec<u8>,
    released: AtomicBool,
    /// A release was sent (or tried): from then on the holder does not
    /// believe it holds, even if that release failed and `released` was
    /// reset for a retry (its outcome may be unknown: applied, and the
    /// name granted to another).
    release_started: AtomicBool,
    /// The grant may have ended without a release: an upgrade of it was
    /// withdrawn (its outcome unknown, or its call dropped), and the
    /// cluster has not shown the read still held. Shared with the
    /// withdrawal, which clears it if it does.
    ended: Arc<AtomicBool>,
}

/// A held lock or set of semaphore permits. Released by
/// [`release`](Guard::release) (any number of times) or, failing that,
/// in the background when the last clone is dropped.
#[derive(Clone)]
pub struct Guard {
    inner: Arc<GuardInner>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("name", &self.inner.name)
            .field("fence", &self.inner.fence)
            .field("mode", &self.inner.mode)
            .finish()
    }
}

impl Guard {
    pub(crate) fn new(
        session: Session,
        name: String,
        fence: Fence,
        mode: Mode,
        value: Vec<u8>,
    ) -> Guard {
        Guard {
            inner: Arc::new(GuardInner {
                session,
                name,
                fence,
                mode,
                value,
                released: AtomicBool::new(false),
                release_started: AtomicBool::new(false),
                ended: Arc::new(AtomicBool::new(false)),
            }),
        }
    }

    /// The fencing token: pass it to every store you write while holding
    /// this grant.
    pub fn fence(&self) -> Fence {
        self.inner.fence
    }

    /// The lock or semaphore name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// What is held.
    pub fn mode(&self) -> Mode {
        self.inner.mode
    }

    /// The value attached at acquire time.
    pub fn value(&self) -> &[u8] {
        &self.inner.value
    }

    /// The session holding it.
    pub fn session(&self) -> &Session {
        &self.inner.session
    }

    /// True while the session's lease view is valid and no release of the
    /// grant was sent (a release that failed still ends it: the holder
    /// stops believing when it sends the release, whatever the answer).
    /// False, too, from an [`upgrade`](Guard::upgrade) of unknown outcome
    /// on, unless the cluster then shows the read still held.
    pub fn is_held(&self) -> bool {
        !self.given_up()
            && !self.inner.ended.load(Ordering::SeqCst)
            && self.inner.session.is_valid()
    }

    /// True once the grant was released, replaced by an upgrade or
    /// downgrade, or a release of it was sent (whatever its answer).
    pub fn is_released(&self) -> bool {
        self.given_up()
    }

    /// Released, replaced by an upgrade or downgrade, or a release was sent.
    fn given_up(&self) -> bool {
        self.inner.released.load(Ordering::SeqCst)
            || self.inner.release_started.load(Ordering::SeqCst)
    }

    /// Upgrades this shared lock to exclusive, waiting without a timeout
    /// until the other readers have left; nobody queued can get in
    /// meanwhile. On success this guard is spent (its shared grant ended)
    /// and the returned guard holds the exclusive grant, with a new, larger
    /// fence: hand that one to your stores. Another holder upgrading the
    /// same lock at the same time makes this fail at once with
    /// [`Error::Deadlock`] (the two would wait for each other forever):
    /// release this guard and take the lock again. On any other error this
    /// guard's read is still held, unless the outcome was unknown
    /// ([`Error::Unavailable`], [`Error::Unknown`]): then the upgrade is
    /// cancelled in the background, and if it had been granted meanwhile
    /// the lock is released (the read ended with the upgrade). From the
    /// error on, [`is_held`](Guard::is_held) is false; once the Cancel is
    /// applied the client asks the cluster (`CheckFence`) whether the read
    /// is still held, and if so `is_held` is true again. If not, or if
    /// that cannot be learnt, the grant has ended: `is_held` stays false
    /// and a later upgrade or downgrade is refused; release this guard and
    /// start over. The same holds if the upgrade's future is dropped.
    pub async fn upgrade(&self) -> Result<Guard> {
        self.upgrade_with(None).await
    }

    /// As [`upgrade`](Guard::upgrade), waiting at most `timeout`
    /// ([`Duration::ZERO`]: only if this is the lock's only reader);
    /// [`Error::NotAcquired`] when it runs out, the read still held.
    pub async fn upgrade_timeout(&self, timeout: std::time::Duration) -> Result<Guard> {
        self.upgrade_with(Some(timeout)).await
    }

    async fn upgrade_with(&self, timeout: Option<std::time::Duration>) -> Result<Guard> {
        if self.inner.mode != Mode::Shared {
            return Err(Error::InvalidArgument(format!(
                "only a shared lock can be upgraded; {} is held as {:?}",
                self.inner.name, self.inner.mode
            )));
        }
        if self.given_up() {
            return Err(Error::InvalidArgument(format!(
                "the grant on {} was released",
                self.inner.name
            )));
        }
        self.refuse_if_ended()?;
        let fence = self
            .inner
            .session
            .upgrade(
                &self.inner.name,
                self.inner.fence,
                timeout,
                &self.inner.ended,
            )
            .await?;
        Ok(self.replaced_by(fence, Mode::Exclusive))
    }

    /// Downgrades this exclusive lock to shared, at once: readers queued
    /// behind it come in. The fence stays the same (the grant only
    /// weakens). On success this guard is spent and the returned guard
    /// holds the shared grant.
    pub async fn downgrade(&self) -> Result<Guard> {
        if self.inner.mode != Mode::Exclusive {
            return Err(Error::InvalidArgument(format!(
                "only an exclusive lock can be downgraded; {} is held as {:?}",
                self.inner.name, self.inner.mode
            )));
        }
        if self.given_up() {
            return Err(Error::InvalidArgument(format!(
                "the grant on {} was released",
                self.inner.name
            )));
        }
        self.refuse_if_ended()?;
        self.inner
            .session
            .downgrade(&self.inner.name, self.inner.fence)
            .await?;
        Ok(self.replaced_by(self.inner.fence, Mode::Shared))
    }

    /// Refuses a request on a grant an upgrade's withdrawal may have ended.
    fn refuse_if_ended(&self) -> Result<()> {
        if self.inner.ended.load(Ordering::SeqCst) {
            return Err(Error::InvalidArgument(format!(
                "the grant on {} ended: an upgrade of it was withdrawn",
                self.inner.name
            )));
        }
        Ok(())
    }

    /// A guard for the grant that replaced this one; this one is spent
    /// (neither it nor its drop releases anything).
    fn replaced_by(&self, fence: Fence, mode: Mode) -> Guard {
        self.inner.released.store(true, Ordering::SeqCst);
        Guard::new(
            self.inner.session.clone(),
            self.inner.name.clone(),
            fence,
            mode,
            self.inner.value.clone(),
        )
    }

    /// Releases the grant. Returns whether this call released it (`false`:
    /// already released, or ended with its session). Safe to call any number
    /// of times; if it fails (cluster unreachable), calling it again retries.
    pub async fn release(&self) -> Result<bool> {
        self.inner.release_started.store(true, Ordering::SeqCst);
        if self.inner.released.swap(true, Ordering::SeqCst) {
            return Ok(false);
        }
        // In flight until done: an acquire of this name on the session
        // (another task's) waits for it instead of being refused as "already
        // held".
        let _in_flight = self.inner.session.start_in_flight(&self.inner.name).await;
        let result = release(&self.inner.session, &self.inner.name, self.inner.fence).await;
        if result.is_err() {
            // Not released as far as we know: let a later call (or the drop)
            // try again. Releasing twice is harmless on the server.
            self.inner.released.store(false, Ordering::SeqCst);
        }
        result
    }
}

async fn release(session: &Session, name: &str, fence: Fence) -> Result<bool> {
    let req = pb::ReleaseRequest {
        session_id: session.id().get(),
        seq: session.next_seq(),
        name: name.to_string(),
        fence: fence.get(),
    };
    match session
        .client()
        .transport
        .locks_call(Kind::Write, |mut c| {
            let req = req.clone();
            async move { c.release(req).await }
        })
        .await
    {
        Ok(r) => Ok(r.into_inner().released),
        // The session ended, and the grant with it.
        Err(Error::SessionNotFound(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

impl Drop for GuardInner {
    fn drop(&mut self) {
        if self.released.swap(true, Ordering::SeqCst) {
            return;
        }
        // In the background (without a runtime nothing runs: the session's
        // expiry or close releases it), and in flight for the name, so a
        // `lock` of the same name on this session right after the drop
        // waits for this release instead of racing it.
        let session = self.session.clone();
        let name = self.name.clone();
        let fence = self.fence;
        self.session.in_background(&self.name, async move {
            if let Err(e) = release(&session, &name, fence).await {
                tracing::warn!(name, fence = fence.get(), error = %e, "release on drop failed; the session's expiry will release it");
            }
        });
    }
}
