//! The `streams` path (a session that ends with its process, on flapping
//! `KeepAlive` streams) and one-shot keep-alives.

use std::time::Duration;

use raftlock_proto::v1 as pb;
use rand::RngExt;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::calls::{from_grpc, Attempt, Reply, Target};
use super::holding::{ms_ns, Holding};
use super::requests::Actor;
use crate::beliefs::Held;
use crate::history::Type;

impl Actor {
    /// A session that ends with its process, on flapping streams.
    pub(super) async fn streams(&mut self, name: &str) {
        let ttl = self.rng.random_range(2_000..=5_000u64);
        let grace = self.rng.random_range(300..=800u64);
        let length = ms_ns(ttl.min(grace));
        let open = pb::OpenSessionRequest {
            ttl_ms: ttl,
            end_on_disconnect_ms: grace,
            nonce: self.rng.random::<u64>() | 1,
            ..Default::default()
        };
        let called = self
            .conn
            .call(
                &mut self.p,
                "open",
                json!({"ttl_ms": ttl, "end_on_disconnect_ms": grace, "path": "streams"}),
                Duration::from_secs(3),
                Duration::from_secs(1),
                move |t: Target| -> Attempt<pb::OpenSessionResponse> {
                    Box::pin(async move { from_grpc(t.locks().open_session(open).await) })
                },
                |r: &pb::OpenSessionResponse| (Type::Ok, json!({"session": r.session_id})),
            )
            .await;
        let Reply::Ok(opened) = called.reply else {
            return;
        };
        let (session, opened_sent) = (opened.session_id, called.sent);
        let name_owned = name.to_string();
        let acquire = pb::AcquireRequest {
            session_id: session,
            seq: 1,
            name: name.into(),
            mode: pb::Mode::Exclusive as i32,
            // Well inside the count from the open (min(ttl, grace)).
            timeout_ms: grace / 2,
            ..Default::default()
        };
        let got = self
            .conn
            .call(
                &mut self.p,
                "acquire",
                json!({"lock": name, "mode": "exclusive", "weight": 1, "session": session,
                       "seq": 1, "timeout_ms": grace / 2, "path": "streams"}),
                Duration::from_secs(3),
                Duration::from_millis(1_800),
                move |t: Target| -> Attempt<pb::AcquireResponse> {
                    let acquire = acquire.clone();
                    Box::pin(async move { from_grpc(t.locks().acquire(acquire).await) })
                },
                move |r: &pb::AcquireResponse| {
                    if r.acquired {
                        (
                            Type::Ok,
                            json!({"lock": name_owned, "mode": "exclusive", "weight": 1,
                                   "session": session, "fence": r.fence}),
                        )
                    } else {
                        (Type::Fail, json!({"acquired": false}))
                    }
                },
            )
            .await;
        let now = self.now();
        let holding = match got.reply {
            Reply::Ok(r) if r.acquired => Holding::new(
                "streams",
                name,
                Held::Exclusive,
                session,
                r.fence,
                self.conn.gen,
                opened_sent,
                length,
                now,
            ),
            _ => None,
        };
        let Some(mut h) = holding else {
            self.close_session(session).await;
            return;
        };
        self.hold(&h);
        let home = got.node;
        let mut streams: Vec<Option<KaStream>> = vec![self.open_stream(home).await];
        let mut ask = 0u64;
        let mut ended: Option<(u64, &str)> = None;
        if self.rng.random_bool(0.5) {
            // Across a leadership round trip: the first stream renews, the
            // leadership goes away and comes back, the first stream
            // renews again, a second opens and renews, the first ends.
            ended = self
                .renew_credit(&mut streams, 0, session, &mut ask, &mut h, length)
                .await;
            let trip = ended.is_none()
                && self.transfer(0).await.is_some_and(|l| l != home)
                && self.transfer(home).await == Some(home);
            if trip {
                ended = self
                    .renew_credit(&mut streams, 0, session, &mut ask, &mut h, length)
                    .await;
                if ended.is_none() {
                    streams.push(self.open_stream(home).await);
                    ended = self
                        .renew_credit(&mut streams, 1, session, &mut ask, &mut h, length)
                        .await;
                    streams.remove(0);
                }
            }
        } else if self.rng.random_bool(0.6) {
            streams.push(self.open_stream(home).await);
        }
        let hold_until = h.since + ms_ns(self.rng.random_range(300..=4_000));
        let dies = self.rng.random_bool(0.15);
        while ended.is_none() && self.now() < hold_until && h.runs(self.now()) {
            // A flap: a stream ends (its connection closes) and, now and
            // then, a new one takes its place.
            if streams.len() > 1 && self.rng.random_bool(0.1) {
                let gone = self.rng.random_range(0..streams.len());
                streams.remove(gone);
            } else if streams.len() < 2 && self.rng.random_bool(0.1) {
                let node = self.conn.leader.unwrap_or(home);
                streams.push(self.open_stream(node).await);
            }
            let which = self.rng.random_range(0..streams.len());
            match self.renew(&mut streams, which, session, &mut ask).await {
                Some(a) => {
                    if !credit(&mut h, a, length) {
                        ended = Some((a.2, "expired"));
                    }
                }
                None => {
                    // Not the leader any more, or the stream broke: a new
                    // stream, at the node that leads as far as we know.
                    let node = self.conn.leader.unwrap_or(home);
                    streams[which] = self.open_stream(node).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(grace / 3)).await;
        }
        let (end, why) = ended.unwrap_or_else(|| (self.now(), "close"));
        if dies && ended.is_none() {
            // The process dies: its streams close, nothing closes the
            // session; the leader ends it a grace later.
            drop(streams);
            let end = self.now();
            self.let_go(h, end, "died");
            return;
        }
        self.let_go(h, end, why);
        drop(streams);
        self.close_session(session).await;
    }

    /// One renewal on stream `which`, credited to `h`: when the session
    /// ended if the answer said it is gone.
    async fn renew_credit(
        &mut self,
        streams: &mut [Option<KaStream>],
        which: usize,
        session: u64,
        ask: &mut u64,
        h: &mut Holding,
        length: u64,
    ) -> Option<(u64, &'static str)> {
        let a = self.renew(streams, which, session, ask).await?;
        (!credit(h, a, length)).then_some((a.2, "expired"))
    }

    async fn open_stream(&mut self, node: u64) -> Option<KaStream> {
        let t = self.conn.target(node, Duration::from_secs(1));
        // A connection of its own.
        let channel = crate::raw::client_channel(&t.addr);
        let (tx, rx) = mpsc::unbounded_channel();
        let opened = tokio::time::timeout(
            Duration::from_secs(1),
            crate::raw::locks(channel, &t.creds)
                .keep_alive(tokio_stream::wrappers::UnboundedReceiverStream::new(rx)),
        )
        .await;
        match opened {
            Ok(Ok(answers)) => Some(KaStream {
                node,
                tx,
                answers: answers.into_inner(),
            }),
            Ok(Err(s)) => {
                if let Reply::NotLeader(hint) = from_grpc::<()>(Err(s)) {
                    self.conn.leader = hint;
                }
                None
            }
            Err(_) => None,
        }
    }

    /// One renewal on stream `which`: `Some((renewed, ttl_ms, arrived,
    /// sent))`, or `None` without an answer (the stream is then dropped).
    async fn renew(
        &mut self,
        streams: &mut [Option<KaStream>],
        which: usize,
        session: u64,
        ask: &mut u64,
    ) -> Option<(bool, u64, u64, u64)> {
        let s = streams.get_mut(which)?;
        let stream = s.as_mut()?;
        *ask += 1;
        let ask = *ask;
        let sent = self.p.invoke(
            "keepalive",
            json!({"session": session, "node": stream.node, "gen": self.conn.gen,
                   "ask_id": ask, "via": format!("stream {which}")}),
        );
        if stream
            .tx
            .send(pb::KeepAliveRequest {
                session_id: session,
                ask_id: ask,
            })
            .is_err()
        {
            self.p
                .complete(Type::Fail, json!({"error": "the stream is closed"}));
            *s = None;
            return None;
        }
        let answer = tokio::time::timeout(Duration::from_secs(1), async {
            loop {
                match stream.answers.message().await {
                    Ok(Some(a)) if a.ask_id == ask || a.ask_id == 0 => return Ok(a),
                    Ok(Some(_)) => continue,
                    Ok(None) => return Err("the stream ended".to_string()),
                    Err(status) => {
                        return Err(format!("{:?}: {}", status.code(), status.message()))
                    }
                }
            }
        })
        .await;
        let now = self.now();
        match answer {
            Ok(Ok(a)) => {
                let renewed = !a.expired && a.ttl_ms > 0;
                self.p.complete(
                    Type::Ok,
                    json!({"session": a.session_id, "renewed": renewed, "expired": a.expired,
                           "ttl_ms": a.ttl_ms, "ask_id": a.ask_id}),
                );
                Some((renewed, a.ttl_ms, now, sent))
            }
            Ok(Err(e)) => {
                self.p.complete(Type::Info, json!({ "error": e }));
                *s = None;
                None
            }
            Err(_) => {
                self.p
                    .complete(Type::Info, json!({"error": "no answer in time"}));
                *s = None;
                None
            }
        }
    }

    async fn close_session(&mut self, session: u64) {
        self.conn
            .call(
                &mut self.p,
                "close",
                json!({ "session": session }),
                Duration::from_secs(3),
                Duration::from_secs(1),
                move |t: Target| -> Attempt<pb::CloseSessionResponse> {
                    Box::pin(async move {
                        from_grpc(
                            t.locks()
                                .close_session(pb::CloseSessionRequest {
                                    session_id: session,
                                    seq: 2,
                                })
                                .await,
                        )
                    })
                },
                move |_: &pb::CloseSessionResponse| (Type::Ok, json!({ "session": session })),
            )
            .await;
    }
}

/// Credits a renewal's answer (renewed, ttl_ms, arrived at, sent at) to
/// `h`; false if the answer said the session is gone.
fn credit(h: &mut Holding, a: (bool, u64, u64, u64), length: u64) -> bool {
    let (renewed, ttl_ms, now, sent) = a;
    if !renewed {
        return false;
    }
    h.answered(sent, length.min(ms_ns(ttl_ms)), now);
    true
}

/// One open `KeepAlive` stream of a session that ends with its process.
struct KaStream {
    node: u64,
    tx: mpsc::UnboundedSender<pb::KeepAliveRequest>,
    answers: tonic::Streaming<pb::KeepAliveResponse>,
}

/// A one-shot keep-alive: over HTTP one ask and one answer, over gRPC a
/// stream of one message.
pub(super) async fn keep_alive_once(
    t: &Target,
    session: u64,
    ask: u64,
    http: bool,
) -> Reply<pb::KeepAliveResponse> {
    use crate::http::n;
    if http {
        let body = json!({"session_id": session.to_string(), "ask_id": ask});
        return match t.post("KeepAlive", body).await {
            Reply::Ok(a) => Reply::Ok(pb::KeepAliveResponse {
                session_id: n(&a["session_id"]),
                ttl_ms: n(&a["ttl_ms"]),
                expired: a["expired"].as_bool().unwrap_or(false),
                ask_id: n(&a["ask_id"]),
            }),
            Reply::NotLeader(h) => Reply::NotLeader(h),
            Reply::Refused(c, m) => Reply::Refused(c, m),
            Reply::Unknown(e) => Reply::Unknown(e),
        };
    }
    let req = pb::KeepAliveRequest {
        session_id: session,
        ask_id: ask,
    };
    match t.locks().keep_alive(futures::stream::iter([req])).await {
        Ok(answers) => match answers.into_inner().message().await {
            Ok(Some(a)) => Reply::Ok(a),
            Ok(None) => Reply::Unknown("the stream ended without an answer".into()),
            Err(s) => from_grpc::<pb::KeepAliveResponse>(Err(s)),
        },
        Err(s) => from_grpc(Err(s)),
    }
}

pub(super) fn keep_alive_outcome(a: &pb::KeepAliveResponse) -> (Type, Value) {
    let renewed = !a.expired && a.ttl_ms > 0;
    (
        Type::Ok,
        json!({"session": a.session_id, "renewed": renewed, "expired": a.expired,
               "ttl_ms": a.ttl_ms, "ask_id": a.ask_id}),
    )
}
