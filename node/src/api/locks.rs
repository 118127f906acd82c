//! The `Locks` service.

use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use raftlock_proto::v1 as pb;
use raftlock_proto::v1::locks_server::Locks;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::convert::{self, lock_info, mode_from_request, mode_to_proto, watch_events};
use super::Api;
use crate::apply::WatchItem;
use crate::auth::{Caller, Permission};
use crate::error::Error;
use crate::raft::log_index_of;
use crate::state::limits::WAIT_FOREVER;
use crate::state::{cmd, Acquired, AcquiredAll, Fence, LockName, SessionId};

mod keep_alive;
mod park;

pub(super) use keep_alive::Carrier;
pub use keep_alive::KEEP_ALIVE_BATCH;

/// Default page size of `List`.
pub const DEFAULT_LIST_LIMIT: usize = 100;
/// Largest page size of `List`.
pub const MAX_LIST_LIMIT: usize = 1000;
/// A parked acquire waits for its cancellation at most this much longer
/// than its own timeout (the leader proposes the cancellation; a leader
/// change re-arms it at full length), then answers `DEADLINE_EXCEEDED`.
pub const WAIT_GRACE: Duration = Duration::from_secs(5);

/// Most `Watch` streams open on one node at once; past it `Watch` answers
/// `RESOURCE_EXHAUSTED`.
pub const MAX_WATCHES: usize = 1000;

/// Counts an open watch until dropped.
struct WatchSlot(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl WatchSlot {
    fn take(count: &std::sync::Arc<std::sync::atomic::AtomicUsize>) -> Result<WatchSlot, Error> {
        use std::sync::atomic::Ordering;
        let taken = count.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < MAX_WATCHES).then_some(n + 1)
        });
        match taken {
            Ok(_) => Ok(WatchSlot(count.clone())),
            Err(_) => Err(Error::ResourceExhausted(format!(
                "this node already serves the maximum of {MAX_WATCHES} watches"
            ))),
        }
    }
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

fn name(s: impl Into<String>) -> Result<LockName, Error> {
    LockName::new(s).map_err(Error::from)
}

fn acquired_response(outcome: Acquired) -> pb::AcquireResponse {
    match outcome {
        Acquired::Granted { fence, mode, index } => pb::AcquireResponse {
            acquired: true,
            fence: fence.0,
            mode: mode_to_proto(mode) as i32,
            index: log_index_of(index),
        },
        Acquired::Queued | Acquired::NotAcquired => pb::AcquireResponse::default(),
    }
}

#[tonic::async_trait]
impl Locks for Api {
    #[tracing::instrument(skip_all, fields(ttl_ms = req.get_ref().ttl_ms))]
    async fn open_session(
        &self,
        req: Request<pb::OpenSessionRequest>,
    ) -> Result<Response<pb::OpenSessionResponse>, Status> {
        let _timer = self
            .0
            .shared
            .metrics
            .timer(crate::metrics::Method::OpenSession);
        let caller = self.caller(&req)?;
        caller.require_any(Permission::Lock)?;
        let r = req.into_inner();
        // An open that does not end with its stream keeps the older
        // encoding (see `Command::from`).
        let command = cmd::OpenSession {
            ttl_ms: r.ttl_ms,
            lock_delay_ms: r.lock_delay_ms,
            nonce: r.nonce,
            owner: caller.identity,
            end_on_disconnect_ms: r.end_on_disconnect_ms,
        };
        command.validate()?;
        let opened = self.write(command).await?;
        let response = pb::OpenSessionResponse {
            session_id: opened.session.0,
            ttl_ms: opened.ttl_ms,
            lock_delay_ms: opened.lock_delay_ms,
        };
        Ok(Response::new(response))
    }

    type KeepAliveStream = BoxStream<pb::KeepAliveResponse>;

    async fn keep_alive(
        &self,
        req: Request<Streaming<pb::KeepAliveRequest>>,
    ) -> Result<Response<Self::KeepAliveStream>, Status> {
        // Subscribed before the credentials are checked, so a reload
        // between the two is seen.
        let acl_changes = self.0.auth.changes();
        let caller = self.caller(&req)?;
        Ok(Response::new(self.keep_alive_stream(
            caller,
            acl_changes,
            req.into_inner(),
        )))
    }

    #[tracing::instrument(skip_all, fields(session = req.get_ref().session_id))]
    async fn close_session(
        &self,
        req: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        let _timer = self
            .0
            .shared
            .metrics
            .timer(crate::metrics::Method::CloseSession);
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let released = self
            .write(cmd::CloseSession {
                session: SessionId(r.session_id),
                seq: r.seq,
                caller: caller.identity,
            })
            .await?;
        Ok(Response::new(pb::CloseSessionResponse { released }))
    }

    #[tracing::instrument(skip_all, fields(lock = %req.get_ref().name, session = req.get_ref().session_id))]
    async fn acquire(
        &self,
        req: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::AcquireResponse>, Status> {
        let _timer = self.0.shared.metrics.timer(crate::metrics::Method::Acquire);
        let caller = self.caller(&req)?;
        caller.require_name(Permission::Lock, &req.get_ref().name)?;
        let r = req.into_inner();
        let mode = mode_from_request(&r)?;
        let session = SessionId(r.session_id);
        let lock = name(r.name)?;
        // `wait` is the portable "wait without a timeout"; u64::MAX in
        // `timeout_ms` means the same (older clients).
        let timeout_ms = if r.wait { WAIT_FOREVER } else { r.timeout_ms };
        let command = cmd::Acquire {
            session,
            seq: r.seq,
            name: lock.clone(),
            mode,
            timeout_ms,
            value: r.value,
            caller: caller.identity,
        };
        command.validate()?;
        let outcome = match self.write(command).await? {
            Acquired::Queued => self.park(session, lock, timeout_ms).await?,
            outcome => outcome,
        };
        Ok(Response::new(acquired_response(outcome)))
    }

    #[tracing::instrument(skip_all, fields(lock = %req.get_ref().name, session = req.get_ref().session_id))]
    async fn release(
        &self,
        req: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let _timer = self.0.shared.metrics.timer(crate::metrics::Method::Release);
        // Releasing needs no rule: only the session's owner can release
        // (checked in the table), and a grant must stay releasable even if
        // the rule that allowed it is gone.
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let released = self
            .write(cmd::Release {
                session: SessionId(r.session_id),
                seq: r.seq,
                name: name(r.name)?,
                fence: Fence(r.fence),
                caller: caller.identity,
            })
            .await?;
        Ok(Response::new(pb::ReleaseResponse { released }))
    }

    #[tracing::instrument(skip_all, fields(lock = %req.get_ref().name, session = req.get_ref().session_id))]
    async fn cancel(
        &self,
        req: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelResponse>, Status> {
        let _timer = self.0.shared.metrics.timer(crate::metrics::Method::Cancel);
        // Like a release: only the session's owner may (checked in the
        // table), and no rule is needed to give something up.
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let cancelled = self
            .write(cmd::Cancel {
                session: SessionId(r.session_id),
                seq: r.seq,
                name: name(r.name)?,
                caller: caller.identity,
            })
            .await?;
        Ok(Response::new(pb::CancelResponse { cancelled }))
    }

    #[tracing::instrument(skip_all, fields(lock = %req.get_ref().name))]
    async fn describe(
        &self,
        req: Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::DescribeResponse>, Status> {
        let _timer = self
            .0
            .shared
            .metrics
            .timer(crate::metrics::Method::Describe);
        self.caller(&req)?
            .require_name(Permission::Read, &req.get_ref().name)?;
        let r = req.into_inner();
        let lock = name(&r.name)?;
        self.read_barrier(r.stale).await?;
        let (info, index) = self
            .0
            .shared
            .read(|applied| (applied.table.describe(&lock), applied.index()));
        Ok(Response::new(pb::DescribeResponse {
            exists: info.is_some(),
            info: info.map(lock_info),
            index,
        }))
    }

    #[tracing::instrument(skip_all, fields(prefix = %req.get_ref().prefix))]
    async fn list(
        &self,
        req: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        let _timer = self.0.shared.metrics.timer(crate::metrics::Method::List);
        self.caller(&req)?
            .require_prefix(Permission::Read, &req.get_ref().prefix)?;
        let r = req.into_inner();
        let limit = match r.limit as usize {
            0 => DEFAULT_LIST_LIMIT,
            n if n > MAX_LIST_LIMIT => {
                return Err(Error::InvalidArgument(format!(
                    "list limit must be at most {MAX_LIST_LIMIT}, got {n}"
                ))
                .into())
            }
            n => n,
        };
        self.read_barrier(r.stale).await?;
        let after = (!r.page_token.is_empty()).then_some(r.page_token.as_str());
        // One extra tells whether another page follows.
        let (mut page, index) = self.0.shared.read(|applied| {
            (
                applied.table.list(&r.prefix, after, limit + 1),
                applied.index(),
            )
        });
        let next_page_token = if page.len() > limit {
            page.truncate(limit);
            page.last()
                .map(|l| l.name.as_str().to_string())
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok(Response::new(pb::ListResponse {
            locks: page.into_iter().map(lock_info).collect(),
            next_page_token,
            index,
        }))
    }

    #[tracing::instrument(skip_all, fields(lock = %req.get_ref().name, fence = req.get_ref().fence))]
    async fn check_fence(
        &self,
        req: Request<pb::CheckFenceRequest>,
    ) -> Result<Response<pb::CheckFenceResponse>, Status> {
        let _timer = self
            .0
            .shared
            .metrics
            .timer(crate::metrics::Method::CheckFence);
        self.caller(&req)?
            .require_name(Permission::Read, &req.get_ref().name)?;
        let r = req.into_inner();
        let lock = name(&r.name)?;
        self.read_barrier(r.stale).await?;
        let ((current, latest), index) = self.0.shared.read(|applied| {
            (
                applied.table.check_fence(&lock, Fence(r.fence)),
                applied.index(),
            )
        });
        Ok(Response::new(pb::CheckFenceResponse {
            current,
            latest_fence: latest.map_or(0, |f| f.0),
            index,
        }))
    }

    type WatchStream = BoxStream<pb::WatchEvent>;

    async fn watch(
        &self,
        req: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let _timer = self.0.shared.metrics.timer(crate::metrics::Method::Watch);
        let mut acl_changes = self.0.auth.changes();
        let caller = self.caller(&req)?;
        let allowed = |caller: &Caller, r: &pb::WatchRequest| match r.name.as_str() {
            "" => caller.require_prefix(Permission::Read, &r.prefix),
            name => caller.require_name(Permission::Read, name),
        };
        allowed(&caller, req.get_ref())?;
        let r = req.into_inner();
        if !r.name.is_empty() {
            name(&r.name)?;
        }
        let slot = WatchSlot::take(&self.0.watches)?;
        let mut events = self.0.shared.watch.subscribe();
        let (tx, rx) = mpsc::channel(256);
        let auth = self.0.auth.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let mut caller = caller;
            let matches = |n: &str| {
                if r.name.is_empty() {
                    n.starts_with(&r.prefix)
                } else {
                    n == r.name
                }
            };
            loop {
                // Stop as soon as the client goes away, even if nothing
                // happens on the watched names.
                let received = tokio::select! {
                    r = events.recv() => r,
                    _ = tx.closed() => return,
                    // The ACL was reloaded: go on only while the watch's
                    // credentials hold and still allow reading it.
                    Ok(()) = acl_changes.changed() => {
                        let still = auth
                            .recheck(&caller)
                            .and_then(|again| allowed(&again, &r).map(|()| again));
                        match still {
                            Ok(again) => caller = again,
                            Err(e) => {
                                let _ = tx.send(Err(Status::from(Error::from(e)))).await;
                                return;
                            }
                        }
                        continue;
                    }
                };
                let item = match received {
                    Ok(item) => item,
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        let _ = tx
                            .send(Err(Status::aborted(format!(
                                "watch fell {n} commands behind; re-read and watch again"
                            ))))
                            .await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                match item.as_ref() {
                    WatchItem::Reset => {
                        let _ = tx
                            .send(Err(Status::aborted(
                                "this node installed a snapshot; re-read and watch again",
                            )))
                            .await;
                        return;
                    }
                    WatchItem::Events { index, events } => {
                        for w in watch_events(*index, events) {
                            if matches(&w.name) && tx.send(Ok(w)).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn lock(
        &self,
        req: Request<pb::LockRequest>,
    ) -> Result<Response<pb::LockResponse>, Status> {
        let _timer = self.0.shared.metrics.timer(crate::metrics::Method::Lock);
        let caller = self.caller(&req)?;
        Ok(Response::new(
            self.lock_call(caller, req.into_inner()).await?,
        ))
    }

    async fn unlock(
        &self,
        req: Request<pb::UnlockRequest>,
    ) -> Result<Response<pb::UnlockResponse>, Status> {
        let _timer = self.0.shared.metrics.timer(crate::metrics::Method::Unlock);
        let caller = self.caller(&req)?;
        Ok(Response::new(
            self.unlock_call(caller, req.into_inner()).await?,
        ))
    }

    async fn set_session_ttl(
        &self,
        req: Request<pb::SetSessionTtlRequest>,
    ) -> Result<Response<pb::SetSessionTtlResponse>, Status> {
        let _timer = self
            .0
            .shared
            .metrics
            .timer(crate::metrics::Method::SetSessionTtl);
        let caller = self.caller(&req)?;
        Ok(Response::new(
            self.set_session_ttl_call(caller, req.into_inner()).await?,
        ))
    }

    #[tracing::instrument(skip_all, fields(lock = %req.get_ref().name, session = req.get_ref().session_id))]
    async fn upgrade(
        &self,
        req: Request<pb::UpgradeRequest>,
    ) -> Result<Response<pb::AcquireResponse>, Status> {
        let _timer = self.0.shared.metrics.timer(crate::metrics::Method::Upgrade);
        // Like a release: only the session's owner may (checked in the
        // table), and the grant being upgraded was allowed by the rules.
        let caller = self.caller(&req)?;
        caller.require_name(Permission::Lock, &req.get_ref().name)?;
        let r = req.into_inner();
        let session = SessionId(r.session_id);
        let lock = name(r.name)?;
        let timeout_ms = if r.wait { WAIT_FOREVER } else { r.timeout_ms };
        let outcome = match self
            .write(cmd::Upgrade {
                session,
                seq: r.seq,
                name: lock.clone(),
                fence: Fence(r.fence),
                timeout_ms,
                caller: caller.identity,
            })
            .await?
        {
            Acquired::Queued => self.park(session, lock, timeout_ms).await?,
            outcome => outcome,
        };
        Ok(Response::new(acquired_response(outcome)))
    }

    #[tracing::instrument(skip_all, fields(session = req.get_ref().session_id))]
    async fn acquire_all(
        &self,
        req: Request<pb::AcquireAllRequest>,
    ) -> Result<Response<pb::AcquireAllResponse>, Status> {
        let _timer = self
            .0
            .shared
            .metrics
            .timer(crate::metrics::Method::AcquireAll);
        let caller = self.caller(&req)?;
        for l in &req.get_ref().locks {
            caller.require_name(Permission::Lock, &l.name)?;
        }
        let r = req.into_inner();
        let session = SessionId(r.session_id);
        let mut locks = Vec::with_capacity(r.locks.len());
        for l in r.locks {
            let mode = convert::mode_from_parts(l.mode, l.weight, l.capacity)?;
            locks.push((name(l.name)?, mode));
        }
        let timeout_ms = if r.wait { WAIT_FOREVER } else { r.timeout_ms };
        let command = cmd::AcquireAll {
            session,
            seq: r.seq,
            locks: locks.clone(),
            timeout_ms,
            value: r.value,
            caller: caller.identity,
        };
        command.validate()?;
        let outcome = match self.write(command).await? {
            AcquiredAll::Queued => {
                // Granted all at once or not at all: the first name tells.
                let first = locks[0].0.clone();
                match self.park(session, first, timeout_ms).await? {
                    Acquired::Granted { .. } => {
                        let names: Vec<&LockName> = locks.iter().map(|(n, _)| n).collect();
                        self.0
                            .shared
                            .read(|applied| applied.table.standing_all(session, r.seq, &names))
                    }
                    _ => AcquiredAll::NotAcquired,
                }
            }
            outcome => outcome,
        };
        let response = match outcome {
            AcquiredAll::Granted { grants, index } => pb::AcquireAllResponse {
                acquired: true,
                grants: locks
                    .iter()
                    .zip(grants)
                    .map(|((name, _), (fence, mode))| pb::Grant {
                        name: name.as_str().to_string(),
                        fence: fence.0,
                        mode: mode_to_proto(mode) as i32,
                        weight: mode.weight(),
                    })
                    .collect(),
                index: log_index_of(index),
            },
            AcquiredAll::Queued | AcquiredAll::NotAcquired => pb::AcquireAllResponse::default(),
        };
        Ok(Response::new(response))
    }

    #[tracing::instrument(skip_all, fields(lock = %req.get_ref().name, session = req.get_ref().session_id))]
    async fn downgrade(
        &self,
        req: Request<pb::DowngradeRequest>,
    ) -> Result<Response<pb::DowngradeResponse>, Status> {
        let _timer = self
            .0
            .shared
            .metrics
            .timer(crate::metrics::Method::Downgrade);
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        self.write(cmd::Downgrade {
            session: SessionId(r.session_id),
            seq: r.seq,
            name: name(r.name)?,
            fence: Fence(r.fence),
            caller: caller.identity,
        })
        .await?;
        Ok(Response::new(pb::DowngradeResponse { fence: r.fence }))
    }
}
