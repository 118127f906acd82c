//! One `KeepAlive` stream per [`Client`], shared by all its sessions.
//!
//! A session asks for a keep-alive and waits for its own answer; the
//! multiplexer sends every ask on one bidirectional stream to the leader
//! and hands each answer (matched by session id) back. Opening a stream per
//! keep-alive costs an HTTP/2 stream and a server task each time: at tens
//! of thousands of sessions per client that overhead, not the cluster,
//! decided whether leases lapsed.
//!
//! The stream is opened lazily, through [`Client::call`] (so it follows
//! leader hints and backs off like any request), and reopened when it
//! fails: every ask in flight on a failed stream gets an error and its
//! session retries (see `session::keep_alive_loop`). An ask that waits past
//! its deadline on a stream that does not answer marks the stream as
//! stalled: it is dropped and the leader forgotten.

use std::collections::VecDeque;
use std::sync::Weak;

use raftlock_proto::v1 as pb;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Streaming;

use crate::client::{Client, Conn, Inner, Kind};
use crate::error::{Error, Result};

/// One session's request for a keep-alive.
pub(crate) struct Ask {
    /// The session.
    pub(crate) session: u64,
    /// When the session stops waiting for this answer.
    pub(crate) deadline: Instant,
    /// Where its answer goes.
    pub(crate) reply: oneshot::Sender<Result<pb::KeepAliveResponse>>,
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
type Opened = (
    pb::KeepAliveResponse,
    Streaming<pb::KeepAliveResponse>,
    mpsc::UnboundedSender<pb::KeepAliveRequest>,
);

/// Starts the multiplexer of the client behind `inner`; it ends when the
/// client (every clone) is dropped.
pub(crate) fn start(inner: Weak<Inner>) -> mpsc::UnboundedSender<Ask> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(run(inner, rx));
    tx
}

async fn run(inner: Weak<Inner>, mut asks: mpsc::UnboundedReceiver<Ask>) {
    // Asks not yet sent on a stream, oldest first.
    let mut backlog: VecDeque<Ask> = VecDeque::new();
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
        // Holds the client only while opening (and to note a failure), so
        // that dropping its last handle drops the ask sender and ends this
        // task, closing the stream.
        let Some(inner_now) = inner.upgrade() else {
            return;
        };
        let first = backlog.pop_front().expect("not empty");
        let opened = open(&Client { inner: inner_now }, first.session, first.deadline).await;
        let (answer, mut inbound, out) = match opened {
            Ok(o) => o,
            Err(e) => {
                first.answer(Err(e));
                continue;
            }
        };
        first.answer(Ok(answer));
        // Asks sent on this stream, with when, oldest first.
        let mut sent: VecDeque<(Instant, Ask)> = VecDeque::new();
        let mut last_answer = Instant::now();
        let mut broken = false;
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
                        // Answers come in the order asked; search anyway.
                        if let Some(i) = sent.iter().position(|(_, a)| a.session == r.session_id) {
                            sent.remove(i).expect("found").1.answer(Ok(r));
                        }
                    }
                    Ok(None) => {
                        fail(&mut sent, || Error::Unavailable("keep-alive stream ended".into()));
                        broken = true;
                    }
                    Err(status) => {
                        stream_failed(&inner, &status);
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
                        stream_failed(&inner, &tonic::Status::unavailable("keep-alive stream stalled"));
                        broken = true;
                    }
                }
            }
        }
        fail(&mut sent, || {
            Error::Unavailable("keep-alive stream closed".into())
        });
    }
}

/// Tells the client (if any handle is left) that its stream to the leader
/// failed.
fn stream_failed(inner: &Weak<Inner>, status: &tonic::Status) {
    if let Some(inner) = inner.upgrade() {
        Client { inner }.stream_failed(status);
    }
}

fn send(out: &mpsc::UnboundedSender<pb::KeepAliveRequest>, a: &Ask) -> Result<()> {
    out.send(pb::KeepAliveRequest {
        session_id: a.session,
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
async fn open(client: &Client, session: u64, deadline: Instant) -> Result<Opened> {
    let attempt = deadline.saturating_duration_since(Instant::now());
    client
        .call(Kind::Read, attempt, deadline, move |c: Conn| async move {
            let (out, rx) = mpsc::unbounded_channel();
            out.send(pb::KeepAliveRequest {
                session_id: session,
            })
            .expect("receiver held");
            let mut inbound = Client::locks(c)
                .keep_alive(UnboundedReceiverStream::new(rx))
                .await?
                .into_inner();
            match inbound.message().await? {
                Some(answer) => Ok((answer, inbound, out)),
                None => Err(tonic::Status::unavailable("keep-alive stream ended")),
            }
        })
        .await
}
