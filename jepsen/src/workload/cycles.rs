//! A worker's cycles, one per kind of round: a lock, an atomic multi-lock,
//! an upgrade, the semaphore, the fenced counter.

use std::time::Duration;

use raftlock_client::{Error, Mode, Session};
use rand::seq::SliceRandom;
use rand::RngExt;
use serde_json::{json, Value};

use super::{classify, counter_key, err_value, mode_str, Worker, LOCK_NAMES, SEMAPHORE_NAME};
use crate::history::{Process, Type};
use crate::store::StoreReply;

impl Worker {
    pub(super) async fn lock_cycle(&mut self, session: &Session) {
        let name = LOCK_NAMES[self.rng.random_range(0..LOCK_NAMES.len())];
        match self.rng.random_range(0..100) {
            0..20 => {
                self.describe(name).await;
                return;
            }
            20..35 => return self.multi_cycle(session).await,
            35..50 => return self.upgrade_cycle(session, name).await,
            _ => {}
        }
        let mode = if self.rng.random_bool(0.7) {
            "exclusive"
        } else {
            "shared"
        };
        let timeout = self.lock_timeout();
        let Some(g) = self.acquire(session, name, mode, 1, timeout).await else {
            return;
        };
        self.sleep_ms(0, 150).await;
        if self.rng.random_bool(0.3) {
            self.describe(name).await;
        }
        self.release(g).await;
    }

    /// A wait of the `lock` workload: 20 % try-once, else 200..=1500 ms.
    fn lock_timeout(&mut self) -> Duration {
        if self.rng.random_bool(0.2) {
            Duration::ZERO
        } else {
            Duration::from_millis(self.rng.random_range(200..=1500))
        }
    }

    /// One atomic request for 2 or 3 of the `lock` workload's names, in a
    /// random order, each exclusive (70 %) or shared; hold; release each.
    async fn multi_cycle(&mut self, session: &Session) {
        let mut names = LOCK_NAMES.to_vec();
        names.shuffle(&mut self.rng);
        names.truncate(self.rng.random_range(2..=LOCK_NAMES.len()));
        let locks: Vec<(&str, Mode)> = names
            .iter()
            .map(|n| {
                let mode = if self.rng.random_bool(0.7) {
                    Mode::Exclusive
                } else {
                    Mode::Shared
                };
                (*n, mode)
            })
            .collect();
        let timeout = self.lock_timeout();
        let sid = session.id();
        let specs: Vec<Value> = locks
            .iter()
            .map(|(n, m)| json!({"lock": n, "mode": mode_str(*m)}))
            .collect();
        let op = self.op(
            "acquire-all",
            json!({"locks": specs, "session": sid, "timeout_ms": timeout.as_millis() as u64}),
        );
        let guards = match session.lock_all(&locks, Some(timeout)).await {
            Ok(guards) => {
                let grants: Vec<Value> = guards
                    .iter()
                    .map(|g| json!({"lock": g.name(), "mode": mode_str(g.mode()), "fence": g.fence()}))
                    .collect();
                op.complete(Type::Ok, json!({"session": sid, "grants": grants}));
                guards
            }
            Err(e) => {
                let kind = classify(&e);
                op.complete(kind, err_value(&e));
                if kind == Type::Info || matches!(e, Error::SessionNotFound(_)) {
                    self.end_session().await;
                }
                return;
            }
        };
        self.sleep_ms(0, 150).await;
        if self.rng.random_bool(0.3) {
            let n = names[self.rng.random_range(0..names.len())];
            self.describe(n).await;
        }
        for g in guards {
            if self.session.is_none() {
                // A release failed and the session was ended (releasing
                // the rest on the server); the guards left are spent.
                break;
            }
            self.release(g).await;
        }
    }

    /// Take `name` shared, upgrade it to exclusive (try-once or a bounded
    /// wait; another reader upgrading at the same time is refused with
    /// ABORTED), half the time downgrade it back to shared, release.
    async fn upgrade_cycle(&mut self, session: &Session, name: &str) {
        let timeout = self.lock_timeout();
        let Some(mut g) = self.acquire(session, name, "shared", 1, timeout).await else {
            return;
        };
        self.sleep_ms(0, 100).await;
        let timeout = self.lock_timeout();
        let lease_until_ns = self.lease_until_ns();
        let op = self.op(
            "upgrade",
            json!({"lock": name, "fence": g.fence(), "session": session.id(),
                   "timeout_ms": timeout.as_millis() as u64, "lease_until_ns": lease_until_ns}),
        );
        match g.upgrade_timeout(timeout).await {
            Ok(up) => {
                op.complete(
                    Type::Ok,
                    json!({"lock": name, "session": session.id(), "from_fence": g.fence(),
                           "fence": up.fence(), "mode": "exclusive"}),
                );
                g = up;
            }
            Err(e) => {
                let kind = classify(&e);
                op.complete(kind, err_value(&e));
                if kind == Type::Info || matches!(e, Error::SessionNotFound(_)) {
                    // The upgrade may have been granted (the client
                    // cancels it in the background): end the session.
                    self.end_session().await;
                    return;
                }
                // Refused, timed out or a deadlock: the read is still held.
            }
        }
        self.sleep_ms(0, 100).await;
        if g.mode() == Mode::Exclusive && self.rng.random_bool(0.5) {
            let lease_until_ns = self.lease_until_ns();
            let op = self.op(
                "downgrade",
                json!({"lock": name, "fence": g.fence(), "session": session.id(),
                       "lease_until_ns": lease_until_ns}),
            );
            match g.downgrade().await {
                Ok(down) => {
                    op.complete(
                        Type::Ok,
                        json!({"lock": name, "session": session.id(), "fence": down.fence(),
                               "mode": "shared"}),
                    );
                    g = down;
                }
                Err(e) => {
                    let kind = classify(&e);
                    op.complete(kind, err_value(&e));
                    if kind == Type::Info || matches!(e, Error::SessionNotFound(_)) {
                        self.end_session().await;
                        return;
                    }
                }
            }
            self.sleep_ms(0, 100).await;
        }
        if self.rng.random_bool(0.3) {
            self.describe(name).await;
        }
        self.release(g).await;
    }

    pub(super) async fn semaphore_cycle(&mut self, session: &Session) {
        if self.rng.random_bool(0.15) {
            self.describe(SEMAPHORE_NAME).await;
            return;
        }
        let weight = self.rng.random_range(1..=self.opts.capacity);
        let timeout = Duration::from_millis(self.rng.random_range(200..=1500));
        let Some(g) = self
            .acquire(session, SEMAPHORE_NAME, "semaphore", weight, timeout)
            .await
        else {
            return;
        };
        self.sleep_ms(0, 150).await;
        if self.rng.random_bool(0.2) {
            self.describe(SEMAPHORE_NAME).await;
        }
        self.release(g).await;
    }

    pub(super) async fn counter_cycle(&mut self, session: &Session) {
        let key = counter_key(self.rng.random_range(0..self.opts.keys));
        let Some(g) = self
            .acquire(session, &key, "exclusive", 1, Duration::from_secs(2))
            .await
        else {
            return;
        };
        let fence = g.fence();
        let op = self.op("read", json!({"key": key, "fence": fence}));
        let reply =
            op.w.store
                .as_mut()
                .expect("fenced-counter has a store")
                .read(&key, fence)
                .await;
        let value = match reply {
            StoreReply::Ok(v) => {
                op.complete(Type::Ok, json!({"key": key, "fence": fence, "value": v}));
                Some(v)
            }
            StoreReply::Stale { latest } => {
                op.complete(
                    Type::Fail,
                    json!({"error": "stale fence", "latest": latest}),
                );
                None
            }
            StoreReply::Unknown(e) => {
                op.complete(Type::Info, json!({ "error": e }));
                None
            }
        };
        if let Some(v) = value {
            if self.rng.random_bool(self.opts.client_pauses) {
                // The holder "pauses" here. While it sleeps its lease ends
                // (its session is closed behind its back, exactly what
                // expiry would do, only sooner) and the lock passes on.
                let sid = session.id();
                let pause = json!({"session": sid, "key": key, "fence": fence});
                self.end_session().await;
                self.rec.record(
                    Process::Client(self.process),
                    Type::Invoke,
                    "pause",
                    pause.clone(),
                );
                self.sleep_ms(300, 800).await;
                self.rec
                    .record(Process::Client(self.process), Type::Ok, "pause", pause);
            }
            let op = self.op("write", json!({"key": key, "fence": fence, "value": v + 1}));
            let reply =
                op.w.store
                    .as_mut()
                    .expect("fenced-counter has a store")
                    .write(&key, fence, v + 1)
                    .await;
            match reply {
                StoreReply::Ok(_) => op.complete(
                    Type::Ok,
                    json!({"key": key, "fence": fence, "value": v + 1}),
                ),
                StoreReply::Stale { latest } => op.complete(
                    Type::Fail,
                    json!({"error": "stale fence", "latest": latest}),
                ),
                StoreReply::Unknown(e) => op.complete(Type::Info, json!({ "error": e })),
            }
        }
        self.release(g).await;
    }
}
