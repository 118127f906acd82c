//! Requests that take or change grants: one acquire, an upgrade or a
//! downgrade, an atomic multi-lock. An acquire whose outcome the caller
//! did not take is withdrawn (`Cancel`) in the background.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use raftlock_proto::v1 as pb;
use tokio::time::Instant;

use super::{Session, FOREVER_ATTEMPT, WAIT_FOREVER_MS};
use crate::error::{Error, Result};
use crate::guard::{Guard, Mode};
use crate::transport::{after, Kind};
use crate::types::Fence;

/// A wait's `timeout_ms` on the wire (`None`, a wait without a timeout, is
/// sent as `wait`): a bounded one stays below u64::MAX, which the server
/// also reads as "no timeout".
fn wire_timeout_ms(timeout: Option<Duration>) -> u64 {
    match timeout {
        None => 0,
        Some(t) => u64::try_from(t.as_millis())
            .unwrap_or(u64::MAX)
            .min(WAIT_FOREVER_MS - 1),
    }
}

/// A mode as the .proto writes it: (mode, weight, capacity).
fn wire_mode(mode: Mode) -> (pb::Mode, u32, u32) {
    match mode {
        Mode::Exclusive => (pb::Mode::Exclusive, 0, 0),
        Mode::Shared => (pb::Mode::Shared, 0, 0),
        Mode::Semaphore { weight, capacity } => (pb::Mode::Semaphore, weight, capacity),
    }
}

/// Whether a failed request that may wait may still have been applied (and
/// so must be cancelled): a refusal changed nothing; these may not have.
fn outcome_unknown(e: &Error) -> bool {
    matches!(
        e,
        Error::Unknown(_) | Error::Unavailable(_) | Error::Internal(_)
    )
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
    /// For an upgrade: the read it would replace and the read's guard's
    /// `ended` flag. Withdrawn, the read is in doubt (it ended if the
    /// upgrade had been granted) until the cluster shows it still held.
    read: Option<(Fence, Arc<AtomicBool>)>,
}

impl Drop for PendingAcquire {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let session = self.session.clone();
        let name = self.name.clone();
        let seq = self.seq;
        let read = self.read.take();
        if let Some((_, ended)) = &read {
            ended.store(true, Ordering::SeqCst);
        }
        self.session.in_background(&self.name, async move {
            let applied = cancel(&session, &name, seq).await;
            // Only an applied Cancel settles the upgrade (one still on its
            // way could be granted later).
            if let (true, Some((fence, ended))) = (applied, read) {
                if let Ok(true) = session.client().check_fence(&name, fence).await {
                    ended.store(false, Ordering::SeqCst);
                }
            }
        });
    }
}

/// Withdraws the acquire `seq` on `name` (`Cancel`). Cancelling is
/// idempotent, so transient failures are retried for as long as the
/// session's lease could keep the wait alive (a ttl, at least the client's
/// retry deadline); a final failure is logged: the session's end (expiry or
/// close) withdraws the wait then. Whether the Cancel was applied (or the
/// session had ended, which withdrew it).
async fn cancel(session: &Session, name: &str, seq: u64) -> bool {
    let req = pb::CancelRequest {
        session_id: session.id().get(),
        seq,
        name: name.to_string(),
    };
    let deadline = after(session.ttl().max(session.client().options().retry_deadline));
    loop {
        let result = session
            .client()
            .transport
            .locks_call(Kind::Write, |mut c| {
                let req = req.clone();
                async move { c.cancel(req).await }
            })
            .await;
        match result {
            Ok(_) | Err(Error::SessionNotFound(_)) => return true,
            Err(e) if e.is_retryable() || matches!(e, Error::Internal(_)) => {
                if Instant::now() >= deadline || !session.is_valid() {
                    tracing::warn!(name, seq, error = %e, "cancelling an abandoned acquire failed; the session's end will withdraw it");
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => {
                tracing::warn!(name, seq, error = %e, "cancelling an abandoned acquire was refused; the session's end will withdraw it");
                return false;
            }
        }
    }
}

impl Session {
    /// How long one attempt of a request that may wait up to `timeout`
    /// may take, and when to give up retrying it. One attempt may wait as
    /// long as the request's own timeout; a retry (same seq) resumes the
    /// same place in the queue. A wait without a timeout is polled in
    /// bounded attempts, so a node cut off from the cluster is not waited
    /// on forever.
    fn attempt_and_deadline(&self, timeout: Option<Duration>) -> (Duration, Instant) {
        let opts = self.inner.client.options();
        match timeout {
            None => (FOREVER_ATTEMPT, after(Duration::MAX)),
            Some(t) => (
                opts.request_timeout.saturating_add(t.saturating_mul(2)),
                after(opts.retry_deadline.saturating_add(t.saturating_mul(2))),
            ),
        }
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
        // In jeopardy the request goes (keep-alives go on, and the grant
        // is handed out only once held); a lost or closed session asks
        // for nothing.
        if self.inner.lease.is_over() {
            return Err(Error::LeaseLost);
        }
        // A release or cancel of this name still in flight goes first: the
        // cluster refuses a new acquire of a name the session still holds.
        self.settle(name).await;
        let seq = self.next_seq();
        let timeout_ms = wire_timeout_ms(timeout);
        let (pmode, weight, capacity) = wire_mode(mode);
        let req = pb::AcquireRequest {
            session_id: self.inner.id,
            seq,
            name: name.to_string(),
            mode: pmode as i32,
            weight,
            capacity,
            timeout_ms,
            value: value.clone(),
            wait: timeout.is_none(),
        };
        let (attempt, deadline) = self.attempt_and_deadline(timeout);
        // From here on the acquire may be queued or granted: if this future
        // is dropped, or the outcome stays unknown, it is withdrawn.
        let mut pending = PendingAcquire {
            session: self.clone(),
            name: name.to_string(),
            seq,
            armed: true,
            read: None,
        };
        let result = self
            .inner
            .client
            .transport
            .call(Kind::Write, attempt, deadline, |c| {
                let req = req.clone();
                async move { crate::transport::locks_client(c).acquire(req).await }
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
                pending.armed = outcome_unknown(&e);
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
        // (etcd #11456). In jeopardy, wait for the keep-alives: held again,
        // the grant is handed out; lost, it is given back and said so.
        if !self.inner.lease.held_or_over().await {
            guard.release().await.ok();
            return Err(Error::LeaseLost);
        }
        Ok(guard)
    }

    /// Upgrades the shared grant `fence` on `name` to exclusive, waiting up
    /// to `timeout` (`None`: forever, `Some(ZERO)`: only if it can be
    /// granted at once). Returns the exclusive grant's fence and the value
    /// the shared grant carried. See [`Guard::upgrade`].
    pub(crate) async fn upgrade(
        &self,
        name: &str,
        fence: Fence,
        timeout: Option<Duration>,
        read_ended: &Arc<AtomicBool>,
    ) -> Result<Fence> {
        // In jeopardy the request goes (keep-alives go on, and the grant
        // is handed out only once held); a lost or closed session asks
        // for nothing.
        if self.inner.lease.is_over() {
            return Err(Error::LeaseLost);
        }
        let seq = self.next_seq();
        let timeout_ms = wire_timeout_ms(timeout);
        let req = pb::UpgradeRequest {
            session_id: self.inner.id,
            seq,
            name: name.to_string(),
            fence: fence.get(),
            timeout_ms,
            wait: timeout.is_none(),
        };
        let (attempt, deadline) = self.attempt_and_deadline(timeout);
        // As for an acquire: if this future is dropped or the outcome stays
        // unknown, the upgrade is cancelled (a pending one stops waiting; one
        // granted meanwhile is released, and the shared grant with it).
        let mut pending = PendingAcquire {
            session: self.clone(),
            name: name.to_string(),
            seq,
            armed: true,
            read: Some((fence, read_ended.clone())),
        };
        let result = self
            .inner
            .client
            .transport
            .call(Kind::Write, attempt, deadline, |c| {
                let req = req.clone();
                async move { crate::transport::locks_client(c).upgrade(req).await }
            })
            .await;
        let resp = match result {
            Ok(resp) => {
                pending.armed = false;
                resp.into_inner()
            }
            Err(e) => {
                pending.armed = outcome_unknown(&e);
                return Err(e);
            }
        };
        if !resp.acquired {
            return Err(Error::NotAcquired(timeout.unwrap_or(Duration::MAX)));
        }
        // As for an acquire: only once held (the exclusive grant stays
        // the guard's, released with it).
        if !self.inner.lease.held_or_over().await {
            return Err(Error::LeaseLost);
        }
        Ok(Fence::new(resp.fence))
    }

    /// Downgrades the exclusive grant `fence` on `name` to shared.
    pub(crate) async fn downgrade(&self, name: &str, fence: Fence) -> Result<()> {
        let req = pb::DowngradeRequest {
            session_id: self.inner.id,
            seq: self.next_seq(),
            name: name.to_string(),
            fence: fence.get(),
        };
        self.inner
            .client
            .transport
            .locks_call(Kind::Write, |mut c| {
                let req = req.clone();
                async move { c.downgrade(req).await }
            })
            .await?;
        Ok(())
    }

    /// Acquires every `(name, mode)` of `locks` (1..=64 names, each once)
    /// in one atomic request: all are granted together, each with its own
    /// fence, or none is. If they cannot all be granted now the request
    /// waits in every name's queue at once (up to `timeout`; `None`: without
    /// one, `Some(ZERO)`: try once) and is granted when it is first in line
    /// for all of them: it never waits for another atomic request in a
    /// cycle, whatever order the names are given in. Guards come back in
    /// the order of `locks`. [`Error::NotAcquired`] when the time runs out,
    /// [`Error::Deadlock`] if the session holds something that a waiter for
    /// one of these names needs while this would wait for it.
    pub async fn lock_all(
        &self,
        locks: &[(&str, Mode)],
        timeout: Option<Duration>,
    ) -> Result<Vec<Guard>> {
        // In jeopardy the request goes (keep-alives go on, and the grant
        // is handed out only once held); a lost or closed session asks
        // for nothing.
        if self.inner.lease.is_over() {
            return Err(Error::LeaseLost);
        }
        // Releases or cancels of these names still in flight go first.
        for (name, _) in locks {
            self.settle(name).await;
        }
        let seq = self.next_seq();
        let timeout_ms = wire_timeout_ms(timeout);
        let req = pb::AcquireAllRequest {
            session_id: self.inner.id,
            seq,
            locks: locks
                .iter()
                .map(|(name, mode)| {
                    let (m, weight, capacity) = wire_mode(*mode);
                    pb::LockSpec {
                        name: name.to_string(),
                        mode: m as i32,
                        weight,
                        capacity,
                    }
                })
                .collect(),
            timeout_ms,
            wait: timeout.is_none(),
            value: Vec::new(),
        };
        let (attempt, deadline) = self.attempt_and_deadline(timeout);
        // As for one acquire: dropped or of unknown outcome, it is
        // cancelled (one Cancel names any of its names and ends it all).
        let mut pending = PendingAcquire {
            session: self.clone(),
            name: locks
                .first()
                .map(|(n, _)| n.to_string())
                .unwrap_or_default(),
            seq,
            armed: !locks.is_empty(),
            read: None,
        };
        let result = self
            .inner
            .client
            .transport
            .call(Kind::Write, attempt, deadline, |c| {
                let req = req.clone();
                async move { crate::transport::locks_client(c).acquire_all(req).await }
            })
            .await;
        let resp = match result {
            Ok(resp) => {
                pending.armed = false;
                resp.into_inner()
            }
            Err(e) => {
                pending.armed = !locks.is_empty() && outcome_unknown(&e);
                return Err(e);
            }
        };
        if !resp.acquired {
            return Err(Error::NotAcquired(timeout.unwrap_or(Duration::MAX)));
        }
        if resp.grants.len() != locks.len() {
            return Err(Error::Internal(format!(
                "asked for {} names, granted {}",
                locks.len(),
                resp.grants.len()
            )));
        }
        let guards: Vec<Guard> = locks
            .iter()
            .zip(resp.grants)
            .map(|((name, mode), g)| {
                Guard::new(
                    self.clone(),
                    name.to_string(),
                    Fence::new(g.fence),
                    *mode,
                    Vec::new(),
                )
            })
            .collect();
        // Never hand out grants on a lease that may already have lapsed
        // (in jeopardy, as for one acquire: wait for held or lost).
        if !self.inner.lease.held_or_over().await {
            for g in &guards {
                g.release().await.ok();
            }
            return Err(Error::LeaseLost);
        }
        Ok(guards)
    }
}
