//! The paths over one-call `Lock`s: ttl changes, retries, renewals, ghost
//! waiters.

use std::sync::atomic::Ordering;
use std::time::Duration;

use raftlock_proto::v1 as pb;
use rand::RngExt;
use serde_json::json;

use super::calls::{from_grpc, Attempt, Proc, Reply, Target};
use super::holding::{ms_ns, Holding};
use super::requests::{lock_attempt, lock_response, Actor, Taken};
use super::streams::{keep_alive_once, keep_alive_outcome};
use super::{GHOST_NEXT_WAIT_MS, GHOST_PROCESS_BASE, GHOST_TTL_MS, PREFIX};
use crate::history::Type;

impl Actor {
    pub(super) async fn ttl_change(&mut self, name: &str, http: bool, at_the_end: bool) {
        let (path, ttl) = if at_the_end {
            ("ttl-end", self.rng.random_range(1_000..=2_000))
        } else {
            ("ttl-shorter", self.rng.random_range(2_000..=4_000))
        };
        let Some(Taken { mut h, .. }) = self.take(path, name, ttl, 800, http).await else {
            return;
        };
        let (at, new_ttl) = if at_the_end {
            // Around the end of the count, where the leader's deadline is
            // (it counts from a little after the send).
            let offset = self.rng.random_range(0..=60_000_000u64);
            (
                (h.until + offset).saturating_sub(15_000_000),
                self.rng.random_range(1_000..=3_000),
            )
        } else {
            (
                h.since + ms_ns(self.rng.random_range(100..=600)),
                self.rng.random_range(1_000..=ttl / 2),
            )
        };
        self.sleep_until_ns(at).await;
        if new_ttl < ttl {
            // A shorter ttl: the count so far ends at the send + the new
            // ttl at the latest (docs/concepts/sessions-and-leases.md, "The lease rule").
            let now = self.now();
            h.cut(now, ms_ns(new_ttl));
        }
        let session = h.session;
        let attempt = move |t: Target| -> Attempt<u64> {
            Box::pin(async move {
                if !http {
                    return from_grpc(
                        t.locks()
                            .set_session_ttl(pb::SetSessionTtlRequest {
                                session_id: session,
                                seq: 2,
                                ttl_ms: new_ttl,
                            })
                            .await,
                    )
                    .map(|r| r.ttl_ms);
                }
                let body = json!({"session_id": session.to_string(), "seq": 2, "ttl_ms": new_ttl});
                t.post("SetSessionTtl", body)
                    .await
                    .map(|a| crate::http::n(&a["ttl_ms"]))
            })
        };
        let until_before = h.until;
        let called = self
            .conn
            .call(
                &mut self.p,
                "set-ttl",
                json!({"session": session, "seq": 2, "ttl_ms": new_ttl, "http": http,
                       "path": path, "count_ends_ns": until_before}),
                Duration::from_secs(2),
                Duration::from_secs(1),
                attempt,
                |ttl: &u64| (Type::Ok, json!({"ttl_ms": ttl})),
            )
            .await;
        let now = self.now();
        match called.reply {
            // Counted with at most the ttl asked for (docs/concepts/sessions-and-leases.md, "The lease
            // rule": a shorter ttl caps every answer from its send on).
            Reply::Ok(ttl) => h.answered(called.sent, ms_ns(ttl.clamp(1, new_ttl)), now),
            Reply::Refused(tonic::Code::NotFound, _) => {
                // The session is gone: nothing to unlock.
                self.let_go(h, now, "not-found");
                return;
            }
            _ => {}
        }
        self.hold_then_unlock(h, http).await;
    }

    /// A waiter that dies just before the hand-off: a holder takes a name
    /// of this round's own (ttl 10 s), a ghost waiter queues for it with a
    /// one-call `Lock` over HTTP (ttl [`GHOST_TTL_MS`], waiting up to 20 s, on a
    /// connection of its own, as a PHP worker sends it) and is killed (the
    /// connection half-closed: see [`crate::http::post_until_killed`]) from
    /// 12 ms before to 12 ms after the holder's `Unlock` is sent; a waiter
    /// that died unanswered is judged: the worker waits for the name itself, up to [`GHOST_NEXT_WAIT_MS`]. A
    /// node that grants the ghost the name and keeps it (review
    /// 2026-11-29 #5) makes that wait fail: the round is recorded as a
    /// `ghost` operation, failed (see [`crate::beliefs::ghosts`]).
    pub(super) async fn ghost(&mut self, slot: u64, http: bool) {
        let name = format!("{PREFIX}g{slot}.{}", self.rng.random::<u32>());
        let round_start = self.now();
        let Some(Taken { h, .. }) = self.take("ghost", &name, 10_000, 800, http).await else {
            return;
        };
        let Some(leader) = self.conn.leader else {
            return self.release_now(h, http).await;
        };
        let nonce = self.rng.random::<u64>() | 1;
        let addr = self.conn.target(leader, Duration::from_secs(1)).addr;
        let mut ghost_p = Proc::new(
            &self.sh.rec,
            GHOST_PROCESS_BASE + self.sh.beliefs.fetch_add(1, Ordering::Relaxed),
            0,
        );
        ghost_p.invoke(
            "acquire",
            json!({"lock": name, "mode": "exclusive", "weight": 1, "ttl_ms": GHOST_TTL_MS,
                   "timeout_ms": 20_000, "nonce": nonce, "one_call": true, "http": true,
                   "path": "ghost", "ghost": true, "node": leader, "gen": self.conn.gen}),
        );
        let body = json!({"name": name, "ttl_ms": GHOST_TTL_MS, "timeout_ms": 20_000,
                          "nonce": nonce.to_string()});
        let token = self.sh.opts.token.clone();
        let (kill, killed) = tokio::sync::oneshot::channel();
        let waiter = tokio::spawn(async move {
            crate::http::post_until_killed(&addr, "/v1/locks/Lock", &body, token.as_deref(), killed)
                .await
        });
        // Queued by now on a node that answers (an answer already given is
        // handled below).
        tokio::time::sleep(Duration::from_millis(self.rng.random_range(150..=400))).await;
        // The kill comes from 12 ms before the holder's `Unlock` is sent to
        // 12 ms after (the grant to the waiter applies a write after the
        // send: a kill from then until its answer is written is the window
        // review 2026-11-29 #5 found).
        let kill_ms = self.rng.random_range(-12..=12i64);
        let killer = tokio::spawn(async move {
            if kill_ms > 0 {
                tokio::time::sleep(Duration::from_millis(kill_ms as u64)).await;
            }
            let _ = kill.send(());
        });
        if kill_ms < 0 {
            let _ = killer.await;
            tokio::time::sleep(Duration::from_millis(kill_ms.unsigned_abs())).await;
        }
        let released_at = self.now();
        self.release_now(h, http).await;
        let outcome = waiter
            .await
            .unwrap_or_else(|e| crate::http::Killed::Failed(e.to_string()));
        // Only a waiter that died unanswered is judged: an answer the node
        // wrote before it saw the connection end is one a live process
        // could have read (a holder killed after its grant keeps the lock
        // for its ttl unless a KeepAlive stream carried its session for
        // `end_on_disconnect`: docs/http.md).
        let (answer, judged) = match &outcome {
            crate::http::Killed::Answered(a) => (Some(a), false),
            crate::http::Killed::AnsweredAfterKill(a) => (Some(a), false),
            crate::http::Killed::Unanswered => (None, true),
            crate::http::Killed::Failed(_) => (None, false),
        };
        let how = match &outcome {
            crate::http::Killed::Answered(_) => "answered before the kill",
            crate::http::Killed::AnsweredAfterKill(_) => "answered after the kill",
            crate::http::Killed::Unanswered => "died unanswered",
            crate::http::Killed::Failed(_) => "failed before the kill",
        };
        match answer.map(|a| (a.status, lock_response(&a.body))) {
            Some((200, r)) => {
                ghost_p.complete(
                    if r.acquired { Type::Ok } else { Type::Fail },
                    json!({"acquired": r.acquired, "session": r.session_id, "fence": r.fence,
                           "how": how}),
                );
                if r.acquired {
                    self.unlock(r.session_id, &name, r.fence, true).await;
                }
            }
            _ => ghost_p.complete(
                Type::Info,
                json!({"error": how, "kill_after_release_ms": kill_ms}),
            ),
        }
        if !judged {
            return;
        }
        let mut round = Proc::new(
            &self.sh.rec,
            GHOST_PROCESS_BASE + self.sh.beliefs.fetch_add(1, Ordering::Relaxed),
            0,
        );
        round.invoke(
            "ghost",
            json!({"lock": name, "kill_after_release_ms": kill_ms,
                   "round_started_ns": round_start, "released_ns": released_at}),
        );
        let next = self
            .take("ghost-next", &name, 2_000, GHOST_NEXT_WAIT_MS, http)
            .await;
        let waited_ms = (self.now() - released_at) / 1_000_000;
        match next {
            Some(Taken { h, .. }) => {
                round.complete(Type::Ok, json!({"next_granted_after_ms": waited_ms}));
                self.release_now(h, http).await;
            }
            None => round.complete(
                Type::Fail,
                json!({"error": format!("the name was not granted to the next waiter in {waited_ms} ms")}),
            ),
        }
    }

    /// Lets go of `h` at once (`Unlock`).
    async fn release_now(&mut self, h: Holding, http: bool) {
        let (session, name, fence) = (h.session, h.lock.clone(), h.fence);
        let end = self.now();
        self.let_go(h, end, "unlock");
        self.unlock(session, &name, fence, http).await;
    }

    pub(super) async fn lock_retry(&mut self, name: &str, http: bool, failover: bool) {
        let path = if failover { "retry-failover" } else { "retry" };
        let ttl = self.rng.random_range(1_500..=3_000);
        let Some(Taken {
            mut h,
            nonce,
            req,
            http,
        }) = self.take(path, name, ttl, 800, http).await
        else {
            return;
        };
        if failover {
            self.transfer(0).await;
        }
        let at = (h.since + ms_ns(ttl) * self.rng.random_range(30..=95) / 100)
            .min(h.until.saturating_sub(ms_ns(50)));
        self.sleep_until_ns(at).await;
        let (session, fence) = (h.session, h.fence);
        let called = self
            .conn
            .call(
                &mut self.p,
                "lock-retry",
                json!({"lock": name, "nonce": nonce, "session": session, "fence": fence,
                       "http": http, "path": path}),
                Duration::from_secs(3),
                Duration::from_millis(1_800),
                lock_attempt(req, http),
                |r: &pb::LockResponse| {
                    (
                        if r.acquired { Type::Ok } else { Type::Fail },
                        json!({"acquired": r.acquired, "session": r.session_id,
                               "fence": r.fence, "ttl_ms": r.ttl_ms}),
                    )
                },
            )
            .await;
        let now = self.now();
        match called.reply {
            Reply::Ok(r) if r.acquired && r.session_id == session && r.fence == fence => {
                h.answered(called.sent, ms_ns(ttl), now);
            }
            Reply::Ok(r) if !r.acquired => {
                // The retry says the grant is not held: believe nothing
                // from now on.
                self.let_go(h, now, "retry-not-acquired");
                return self.unlock(session, name, fence, http).await;
            }
            Reply::Refused(tonic::Code::NotFound, _) => {
                self.let_go(h, now, "not-found");
                return;
            }
            Reply::Ok(r) if r.session_id != session => {
                // The retry opened a session of its own (the first one was
                // forgotten): nobody wants that one. The first answer's
                // count stands.
                self.unlock(r.session_id, name, r.fence, http).await;
            }
            // An unknown outcome: the first answer's count stands.
            _ => {}
        }
        self.hold_then_unlock(h, http).await;
    }

    pub(super) async fn renewals(&mut self, name: &str, http: bool) {
        let ttl = self.rng.random_range(1_000..=3_000);
        let Some(Taken { mut h, http, .. }) = self.take("renewals", name, ttl, 800, http).await
        else {
            return;
        };
        let hold_until = h.since + ms_ns(self.rng.random_range(200..=5_000));
        let mut ask = 0u64;
        let mut ended = None;
        while self.now() < hold_until && h.runs(self.now()) {
            tokio::time::sleep(Duration::from_millis(ttl / 3)).await;
            ask += 1;
            let session = h.session;
            let within = Duration::from_millis((ttl / 3).clamp(200, 1_000));
            let attempt = move |t: Target| -> Attempt<pb::KeepAliveResponse> {
                Box::pin(async move { keep_alive_once(&t, session, ask, http).await })
            };
            let called = self
                .conn
                .call(
                    &mut self.p,
                    "keepalive",
                    json!({"session": session, "ask_id": ask, "http": http,
                           "via": if http { "http" } else { "one-message stream" }}),
                    within,
                    within,
                    attempt,
                    keep_alive_outcome,
                )
                .await;
            let now = self.now();
            if let Reply::Ok(a) = called.reply {
                if a.ask_id != 0 && a.ask_id != ask {
                    continue;
                }
                if a.expired {
                    ended = Some(now);
                    break;
                }
                h.answered(called.sent, ms_ns(a.ttl_ms), now);
            }
        }
        if let Some(end) = ended {
            let (session, fence) = (h.session, h.fence);
            self.let_go(h, end, "expired");
            return self.unlock(session, name, fence, http).await;
        }
        self.hold_then_unlock(h, http).await;
    }

    pub(super) async fn transfer(&mut self, to: u64) -> Option<u64> {
        let attempt = move |t: Target| -> Attempt<pb::TransferLeaderResponse> {
            Box::pin(async move {
                from_grpc(
                    t.cluster()
                        .transfer_leader(pb::TransferLeaderRequest { to })
                        .await,
                )
            })
        };
        let called = self
            .conn
            .call(
                &mut self.p,
                "transfer-leader",
                json!({ "to": to }),
                Duration::from_secs(6),
                Duration::from_secs(5),
                attempt,
                |r: &pb::TransferLeaderResponse| (Type::Ok, json!({"leader": r.leader_id})),
            )
            .await;
        match called.reply {
            Reply::Ok(r) if r.leader_id != 0 => {
                self.conn.leader = Some(r.leader_id);
                Some(r.leader_id)
            }
            _ => {
                self.conn.leader = None;
                None
            }
        }
    }
}
