//! The requests every path is made of: taking, holding and letting go of a
//! grant.

use std::sync::Arc;
use std::time::Duration;

use raftlock_proto::v1 as pb;
use rand::rngs::StdRng;
use rand::RngExt;
use serde_json::{json, Value};

use super::calls::{from_grpc, Attempt, Conn, Proc, Reply, Target};
use super::holding::{ms_ns, Holding};
use super::Shared;
use crate::beliefs::Held;
use crate::history::Type;

fn mode_name(held: Held) -> &'static str {
    match held {
        Held::Exclusive => "MODE_EXCLUSIVE",
        Held::Shared => "MODE_SHARED",
    }
}

/// A `LockResponse` from its JSON.
pub(super) fn lock_response(a: &Value) -> pb::LockResponse {
    use crate::http::n;
    pb::LockResponse {
        acquired: a["acquired"].as_bool().unwrap_or(false),
        fence: n(&a["fence"]),
        session_id: n(&a["session_id"]),
        ttl_ms: n(&a["ttl_ms"]),
        next_seq: n(&a["next_seq"]),
    }
}

pub(super) fn lock_attempt(
    req: pb::LockRequest,
    http: bool,
) -> impl FnMut(Target) -> Attempt<pb::LockResponse> {
    move |t: Target| {
        let req = req.clone();
        Box::pin(async move {
            if !http {
                return from_grpc(t.locks().lock(req).await);
            }
            let mode = if req.mode == pb::Mode::Shared as i32 {
                Held::Shared
            } else {
                Held::Exclusive
            };
            let body = json!({"name": req.name, "ttl_ms": req.ttl_ms,
                              "timeout_ms": req.timeout_ms, "nonce": req.nonce.to_string(),
                              "mode": mode_name(mode),
                              "end_on_disconnect_ms": req.end_on_disconnect_ms});
            t.post("Lock", body).await.map(|a| lock_response(&a))
        })
    }
}

/// What a worker, a contender or the operator is.
pub(super) struct Actor {
    pub(super) sh: Arc<Shared>,
    /// Its link end (client-link proxies).
    pub(super) end: u64,
    pub(super) p: Proc,
    pub(super) conn: Conn,
    pub(super) rng: StdRng,
}

/// A grant taken with a one-call `Lock`.
pub(super) struct Taken {
    pub(super) h: Holding,
    pub(super) nonce: u64,
    pub(super) req: pb::LockRequest,
    pub(super) http: bool,
}

impl Actor {
    pub(super) fn now(&self) -> u64 {
        self.sh.rec.now_ns()
    }

    /// Moves to the restored cluster, if the restore nemesis moved it.
    pub(super) async fn follow_moves(&mut self) {
        let addrs = self.sh.opts.moved.borrow().clone();
        if addrs.gen != self.conn.gen {
            self.conn = Conn::new(&self.sh, self.end, &addrs).await;
        }
    }

    pub(super) async fn sleep_until_ns(&self, at: u64) {
        let now = self.now();
        if at > now {
            tokio::time::sleep(Duration::from_nanos(at - now)).await;
        }
    }

    pub(super) fn hold(&self, h: &Holding) {
        *self
            .sh
            .holding
            .lock()
            .expect("holding lock poisoned")
            .entry((h.gen, h.session))
            .or_default() += 1;
    }

    pub(super) fn let_go(&self, h: Holding, end: u64, why: &str) {
        {
            let mut holding = self.sh.holding.lock().expect("holding lock poisoned");
            let key = (h.gen, h.session);
            if let Some(n) = holding.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    holding.remove(&key);
                }
            }
        }
        h.finish(&self.sh, self.p.process, end, why);
    }

    /// A one-call `Lock` of `name` (ttl `ttl_ms`, waiting up to
    /// `timeout_ms`), over HTTP or gRPC; the grant and its count if
    /// granted and still counted when the answer came.
    pub(super) async fn take(
        &mut self,
        path: &'static str,
        name: &str,
        ttl_ms: u64,
        timeout_ms: u64,
        http: bool,
    ) -> Option<Taken> {
        let nonce = self.rng.random::<u64>() | 1;
        let req = pb::LockRequest {
            name: name.into(),
            ttl_ms,
            timeout_ms,
            nonce,
            mode: pb::Mode::Exclusive as i32,
            ..Default::default()
        };
        let within = Duration::from_millis(timeout_ms + 1_000);
        let name_owned = name.to_string();
        let called = self
            .conn
            .call(
                &mut self.p,
                "acquire",
                json!({"lock": name, "mode": "exclusive", "weight": 1, "ttl_ms": ttl_ms,
                       "timeout_ms": timeout_ms, "nonce": nonce, "one_call": true,
                       "http": http, "path": path}),
                within + Duration::from_secs(2),
                within,
                lock_attempt(req.clone(), http),
                move |r: &pb::LockResponse| {
                    if r.acquired {
                        (
                            Type::Ok,
                            json!({"lock": name_owned, "mode": "exclusive", "weight": 1,
                                   "session": r.session_id, "fence": r.fence, "ttl_ms": r.ttl_ms}),
                        )
                    } else {
                        (Type::Fail, json!({"acquired": false}))
                    }
                },
            )
            .await;
        let now = self.now();
        let Reply::Ok(r) = called.reply else {
            return None;
        };
        if !r.acquired {
            return None;
        }
        match Holding::new(
            path,
            name,
            Held::Exclusive,
            r.session_id,
            r.fence,
            self.conn.gen,
            called.sent,
            ms_ns(ttl_ms),
            now,
        ) {
            Some(h) => {
                self.hold(&h);
                Some(Taken {
                    h,
                    nonce,
                    req,
                    http,
                })
            }
            None => {
                // Answered after its count had run out: never believed;
                // let it go.
                self.unlock(r.session_id, name, r.fence, http).await;
                None
            }
        }
    }

    /// `Unlock` of a `Lock`'s session (recorded as the release of its
    /// grant).
    pub(super) async fn unlock(&mut self, session: u64, name: &str, fence: u64, http: bool) {
        let attempt = move |t: Target| -> Attempt<u32> {
            Box::pin(async move {
                if !http {
                    return from_grpc(
                        t.locks()
                            .unlock(pb::UnlockRequest {
                                session_id: session,
                            })
                            .await,
                    )
                    .map(|r| r.released);
                }
                t.post("Unlock", json!({"session_id": session.to_string()}))
                    .await
                    .map(|a| crate::http::n(&a["released"]) as u32)
            })
        };
        self.conn
            .call(
                &mut self.p,
                "release",
                json!({"lock": name, "fence": fence, "session": session, "unlock": true,
                       "http": http}),
                Duration::from_secs(3),
                Duration::from_secs(1),
                attempt,
                |released: &u32| (Type::Ok, json!({"released": *released >= 1})),
            )
            .await;
    }

    /// Holds `h` until a moment drawn near the end of its count (half the
    /// time 5-100 ms before it, otherwise anywhere in it), then sends the
    /// `Unlock` (the belief ends as it is sent).
    pub(super) async fn hold_then_unlock(&mut self, h: Holding, http: bool) {
        let now = self.now();
        let left = h.until.saturating_sub(now);
        let at = if self.rng.random_bool(0.5) {
            h.until
                .saturating_sub(ms_ns(self.rng.random_range(5..=100)))
                .max(now)
        } else {
            now + self.rng.random_range(0..=left)
        };
        self.sleep_until_ns(at).await;
        let (session, name, fence) = (h.session, h.lock.clone(), h.fence);
        let end = self.now();
        self.let_go(h, end, "unlock");
        self.unlock(session, &name, fence, http).await;
    }
}
