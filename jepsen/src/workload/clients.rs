//! The `clients` workload's behaviours: abandoned waits, dropped guards,
//! a session shared by two tasks, dropped campaigns, short bounded waits.

use std::time::Duration;

use raftlock_client::{Error, Session};
use rand::RngExt;
use serde_json::{json, Value};

use super::{classify, err_value, Worker, CLIENT_NAMES, ELECTION_NAME};
use crate::history::{Process, Recorder, Type};

/// A second task on a worker's session records its operations under the
/// worker's process number plus this many generations (so it has its own
/// process, on the worker's row of the timeline).
const TWIN_GENERATIONS: u64 = 1_000_000;

impl Worker {
    fn twin(&self) -> Twin {
        Twin {
            rec: self.rec.clone(),
            process: self.process + self.opts.concurrency * TWIN_GENERATIONS,
            concurrency: self.opts.concurrency,
        }
    }

    pub(super) async fn clients_cycle(&mut self, session: &Session) {
        let name = CLIENT_NAMES[self.rng.random_range(0..CLIENT_NAMES.len())];
        match self.rng.random_range(0..10) {
            // Plain hold and release: the queue the others wait in.
            0..=2 => {
                let timeout = Duration::from_millis(self.rng.random_range(300..=1500));
                if let Some(g) = self.acquire(session, name, "exclusive", 1, timeout).await {
                    self.sleep_ms(50, 300).await;
                    self.release(g).await;
                }
            }
            // A short bounded wait, given up on if it does not come.
            3 => {
                let timeout = Duration::from_millis(self.rng.random_range(100..=300));
                if let Some(g) = self.acquire(session, name, "exclusive", 1, timeout).await {
                    self.release(g).await;
                }
            }
            4 | 5 => self.abandon(session, name).await,
            6 | 7 => self.drop_and_relock(session, name).await,
            8 => self.shared_session(session, name).await,
            _ => self.campaign(session).await,
        }
    }

    /// Starts a bounded `lock()` and drops the future after 20–400 ms,
    /// usually while it is queued behind another worker.
    async fn abandon(&mut self, session: &Session, name: &str) {
        let sid = session.id();
        let patience = Duration::from_millis(self.rng.random_range(20..=400));
        let op = self.op(
            "acquire",
            json!({"lock": name, "mode": "exclusive", "weight": 1, "session": sid,
                   "timeout_ms": 3000, "patience_ms": patience.as_millis() as u64}),
        );
        let wait = session.lock_timeout(name, Duration::from_secs(3));
        tokio::select! {
            r = wait => match r {
                Ok(g) => {
                    op.complete(
                        Type::Ok,
                        json!({"lock": name, "mode": "exclusive", "weight": 1, "session": sid, "fence": g.fence()}),
                    );
                    self.release(g).await;
                }
                Err(e) => {
                    let kind = classify(&e);
                    op.complete(kind, err_value(&e));
                    if kind == Type::Info || matches!(e, Error::SessionNotFound(_)) {
                        self.end_session().await;
                    }
                }
            },
            _ = tokio::time::sleep(patience) => {
                // The future is dropped here, queued or not.
                op.complete(Type::Info, json!({"abandoned": true}));
            }
        }
    }

    /// Takes `name`, drops the guard without releasing, and at once locks
    /// the same name again on the same session.
    async fn drop_and_relock(&mut self, session: &Session, name: &str) {
        let Some(g) = self
            .acquire(session, name, "exclusive", 1, Duration::from_secs(2))
            .await
        else {
            return;
        };
        let op = self.op(
            "release",
            json!({"lock": name, "fence": g.fence(), "session": session.id(),
                   "lease_until_ns": 0}),
        );
        drop(g);
        op.complete(Type::Info, json!({"dropped": true}));
        if let Some(g) = self
            .acquire(session, name, "exclusive", 1, Duration::from_secs(2))
            .await
        {
            self.sleep_ms(0, 50).await;
            self.release(g).await;
        }
    }

    /// Two tasks lock the same name on one session at the same time: at
    /// most one may get it (the other is refused or waits), and never the
    /// same grant twice.
    async fn shared_session(&mut self, session: &Session, name: &str) {
        let twin = self.twin();
        let timeout = Duration::from_millis(self.rng.random_range(300..=1500));
        let other = tokio::spawn({
            let session = session.clone();
            let name = name.to_string();
            async move { twin.acquire_release(&session, &name, timeout).await }
        });
        if let Some(g) = self.acquire(session, name, "exclusive", 1, timeout).await {
            self.sleep_ms(20, 100).await;
            self.release(g).await;
        }
        let _ = other.await;
    }

    /// Campaigns for `cl/leader`, giving up (dropping the campaign) after
    /// 50–600 ms if not elected; resigns after a short term otherwise.
    async fn campaign(&mut self, session: &Session) {
        let sid = session.id();
        let patience = Duration::from_millis(self.rng.random_range(50..=600));
        let mut election = raftlock_client::Election::new(session.clone(), ELECTION_NAME);
        let op = self.op(
            "acquire",
            json!({"lock": ELECTION_NAME, "mode": "exclusive", "weight": 1, "session": sid,
                   "campaign": true, "patience_ms": patience.as_millis() as u64}),
        );
        let outcome = tokio::time::timeout(patience, election.campaign(Vec::new())).await;
        match outcome {
            Ok(Ok(fence)) => {
                op.complete(
                    Type::Ok,
                    json!({"lock": ELECTION_NAME, "mode": "exclusive", "weight": 1, "session": sid, "fence": fence}),
                );
                self.sleep_ms(20, 200).await;
                let op = self.op(
                    "release",
                    json!({"lock": ELECTION_NAME, "fence": fence, "session": sid,
                           "lease_until_ns": 0, "resign": true}),
                );
                match election.resign().await {
                    // `resign` does not say whether the grant was still
                    // held, so the release answers nothing.
                    Ok(()) => op.complete(Type::Ok, json!({"resigned": true})),
                    Err(e) => {
                        op.complete(Type::Info, err_value(&e));
                        self.end_session().await;
                    }
                }
            }
            Ok(Err(e)) => {
                let kind = classify(&e);
                op.complete(kind, err_value(&e));
                if kind == Type::Info || matches!(e, Error::SessionNotFound(_)) {
                    self.end_session().await;
                }
            }
            Err(_) => {
                // The campaign future was dropped while queued.
                op.complete(Type::Info, json!({"abandoned": true}));
            }
        }
    }
}

/// A second task on a worker's session, with its own process number.
struct Twin {
    rec: Recorder,
    process: u64,
    concurrency: u64,
}

impl Twin {
    fn record(&mut self, kind: Type, f: &str, value: Value) {
        self.rec
            .record(Process::Client(self.process), kind, f, value);
        if kind == Type::Info {
            self.process += self.concurrency;
        }
    }

    async fn acquire_release(mut self, session: &Session, name: &str, timeout: Duration) {
        let sid = session.id();
        self.record(
            Type::Invoke,
            "acquire",
            json!({"lock": name, "mode": "exclusive", "weight": 1, "session": sid,
                   "timeout_ms": timeout.as_millis() as u64, "twin": true}),
        );
        match session.lock_timeout(name, timeout).await {
            Ok(g) => {
                let fence = g.fence();
                self.record(
                    Type::Ok,
                    "acquire",
                    json!({"lock": name, "mode": "exclusive", "weight": 1, "session": sid, "fence": fence}),
                );
                tokio::time::sleep(Duration::from_millis(30)).await;
                self.record(
                    Type::Invoke,
                    "release",
                    json!({"lock": name, "fence": fence, "session": sid, "lease_until_ns": 0}),
                );
                match g.release().await {
                    Ok(released) => {
                        self.record(Type::Ok, "release", json!({ "released": released }))
                    }
                    Err(e) => self.record(classify(&e), "release", err_value(&e)),
                }
            }
            Err(e) => self.record(classify(&e), "acquire", err_value(&e)),
        }
    }
}
