//! `KeepAlive`: the streams that renew sessions and carry them, and the
//! one-shot keep-alive of HTTP.

use std::time::Duration;

use futures::{FutureExt, Stream};
use raftlock_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::BoxStream;
use crate::api::Api;
use crate::auth::Caller;
use crate::error::Error;
use crate::leases::KeepAliveError;
use crate::state::{Refusal, SessionId};

/// Most keep-alives of one `KeepAlive` stream confirmed by one leadership
/// round (and the depth of the stream's answer queue).
pub const KEEP_ALIVE_BATCH: usize = 1024;

/// Counts a `KeepAlive` stream's end when its task ends, however it ends.
struct StreamEnded(std::sync::Arc<crate::metrics::Metrics>);

impl Drop for StreamEnded {
    fn drop(&mut self) {
        self.0.count(crate::metrics::Counter::KeepAliveStreamsEnded);
    }
}

/// One stream that carries sessions (a keep-alive stream, or a `Lock`
/// call while it runs); tells the lease keeper when it ends, however it
/// ends.
pub(in crate::api) struct Carrier {
    leases: std::sync::Arc<crate::leases::Leases>,
    stream: crate::leases::StreamId,
}

impl Carrier {
    pub(in crate::api) fn open(api: &Api) -> Carrier {
        let leases = api.0.shared.leases.clone();
        let stream = leases.open_stream();
        Carrier { leases, stream }
    }

    /// This stream has just renewed (or opened) `session`.
    pub(in crate::api) fn carries(&self, session: SessionId) {
        self.leases.carries(self.stream, session);
    }
}

impl Drop for Carrier {
    fn drop(&mut self) {
        self.leases.stream_ended(self.stream);
    }
}

impl Api {
    /// A KeepAlive stream (gRPC, or HTTP's newline-delimited JSON) of
    /// `caller`'s asks `inbound`: the answers, in order. The stream carries
    /// the sessions it renews (`end_on_disconnect`) until `inbound` ends or
    /// fails, or the answers are no longer read. `acl_changes` was
    /// subscribed before `caller` was checked.
    pub(in crate::api) fn keep_alive_stream<S>(
        &self,
        mut caller: Caller,
        mut acl_changes: tokio::sync::watch::Receiver<u64>,
        mut inbound: S,
    ) -> BoxStream<pb::KeepAliveResponse>
    where
        S: Stream<Item = Result<pb::KeepAliveRequest, Status>> + Send + Unpin + 'static,
    {
        use futures::StreamExt as _;
        let _timer = self
            .0
            .shared
            .metrics
            .timer(crate::metrics::Method::KeepAlive);
        self.0
            .shared
            .metrics
            .count(crate::metrics::Counter::KeepAliveStreams);
        let (tx, rx) = mpsc::channel(KEEP_ALIVE_BATCH);
        let api = self.clone();
        tokio::spawn(async move {
            let _ended = StreamEnded(api.0.shared.metrics.clone());
            // The sessions this stream renews: when it ends, those that end
            // with their process start their grace (see `leases`).
            let carrier = Carrier::open(&api);
            // One client multiplexes all its sessions on one stream: take
            // every keep-alive already waiting, confirm leadership once for
            // them all (each arrived before the round starts), answer each
            // in arrival order.
            let mut batch = Vec::with_capacity(KEEP_ALIVE_BATCH);
            let mut ended = false;
            while !ended {
                let next = tokio::select! {
                    next = inbound.next() => next,
                    // The ACL was reloaded: the stream goes on only while
                    // the credentials it was opened with still hold. Its
                    // sessions are not closed: no longer renewed here,
                    // they expire one ttl after their last keep-alive.
                    Ok(()) = acl_changes.changed() => {
                        match api.0.auth.recheck(&caller) {
                            Ok(again) => caller = again,
                            Err(e) => {
                                tracing::info!(
                                    identity = %caller.identity,
                                    "ended a KeepAlive stream whose credentials were revoked; its \
                                     sessions expire one ttl after their last keep-alive"
                                );
                                let _ = tx.send(Err(Status::from(Error::from(e)))).await;
                                return;
                            }
                        }
                        continue;
                    }
                };
                match next {
                    Some(Ok(msg)) => batch.push((SessionId(msg.session_id), msg.ask_id)),
                    Some(Err(status)) => {
                        // A malformed ask (HTTP) is answered; a broken
                        // transport has nobody left to answer.
                        if status.code() == tonic::Code::InvalidArgument {
                            let _ = tx.send(Err(status)).await;
                        }
                        return;
                    }
                    None => return,
                }
                let asked = tokio::time::Instant::now();
                while batch.len() < KEEP_ALIVE_BATCH {
                    match inbound.next().now_or_never() {
                        Some(Some(Ok(msg))) => batch.push((SessionId(msg.session_id), msg.ask_id)),
                        Some(Some(Err(_)) | None) => {
                            ended = true;
                            break;
                        }
                        None => break,
                    }
                }
                let confirmed = api.0.leadership.confirm().await;
                for (session, ask_id) in batch.drain(..) {
                    let result = match &confirmed {
                        Err(e) => Err(e.clone()),
                        Ok(()) if !api.owns(&caller, session) => {
                            Err(Refusal::NotOwner { session }.into())
                        }
                        Ok(()) => api.renew_session(session),
                    };
                    // A session that is gone gets its own answer and the
                    // stream goes on for the others on it; anything else
                    // (not the leader, no quorum) ends the stream, to be
                    // retried at the leader. Every renewal counts the
                    // stream as a carrier in the term it happens in.
                    if result.is_ok() {
                        carrier.carries(session);
                    }
                    let item = match result {
                        Ok(ttl) => Ok(pb::KeepAliveResponse {
                            session_id: session.0,
                            ttl_ms: ttl.as_millis() as u64,
                            expired: false,
                            ask_id,
                        }),
                        Err(Error::NotFound(_)) => Ok(pb::KeepAliveResponse {
                            session_id: session.0,
                            ttl_ms: 0,
                            expired: true,
                            ask_id,
                        }),
                        Err(e) => Err(Status::from(e)),
                    };
                    let failed = item.is_err();
                    api.0.shared.metrics.keepalive_answer(asked.elapsed());
                    if tx.send(item).await.is_err() || failed {
                        return;
                    }
                }
            }
        });
        Box::pin(ReceiverStream::new(rx))
    }

    /// False if `session` is open and belongs to an identity other than
    /// `caller`'s. (An unknown session is left to the caller's request,
    /// which answers `NOT_FOUND`.)
    fn owns(&self, caller: &Caller, session: SessionId) -> bool {
        self.0.shared.read(|applied| {
            applied
                .table
                .session_owner(session)
                .is_none_or(|owner| owner == caller.identity)
        })
    }

    /// One keep-alive, answered at once (`KeepAlive` over HTTP): the same
    /// checks as on a stream (a quorum round that starts after the ask
    /// arrived), but it renews the session only; no stream carries it.
    pub(in crate::api) async fn keep_alive_once(
        &self,
        req: Request<pb::KeepAliveRequest>,
    ) -> Result<Response<pb::KeepAliveResponse>, Status> {
        let _timer = self
            .0
            .shared
            .metrics
            .timer(crate::metrics::Method::KeepAlive);
        let asked = tokio::time::Instant::now();
        let caller = self.caller(&req)?;
        let ask = req.into_inner();
        let session = SessionId(ask.session_id);
        self.0.leadership.confirm().await?;
        if !self.owns(&caller, session) {
            return Err(Error::from(Refusal::NotOwner { session }).into());
        }
        let (ttl_ms, expired) = match self.renew_session(session) {
            Ok(ttl) => (ttl.as_millis() as u64, false),
            Err(Error::NotFound(_)) => (0, true),
            Err(e) => return Err(e.into()),
        };
        self.0.shared.metrics.keepalive_answer(asked.elapsed());
        Ok(Response::new(pb::KeepAliveResponse {
            session_id: session.0,
            ttl_ms,
            expired,
            ask_id: ask.ask_id,
        }))
    }

    /// Restarts `session`'s lease at full length (leadership already
    /// confirmed); its ttl.
    pub(in crate::api) fn renew_session(&self, session: SessionId) -> Result<Duration, Error> {
        let ttl = self
            .0
            .shared
            .leases
            .keep_alive(session)
            .map_err(|e| match e {
                KeepAliveError::NotLeader => self.not_leader(),
                KeepAliveError::UnknownSession => {
                    Error::NotFound(format!("{session} not found (closed or expired)"))
                }
                KeepAliveError::Expiring => Error::NotFound(format!("{session} expired")),
            })?;
        self.0
            .shared
            .metrics
            .count(crate::metrics::Counter::KeepAlives);
        Ok(ttl)
    }
}
