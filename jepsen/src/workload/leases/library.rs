//! The Rust client's paths (`multi`, `upgrade`): beliefs from the library's
//! own lease view.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use raftlock_client::{Client, Error, Guard, LeaseState, Mode, Session, SessionOptions};
use rand::seq::SliceRandom;
use rand::RngExt;
use serde_json::{json, Value};

use super::super::{classify, err_value, mode_str};
use super::holding::Holding;
use super::requests::Actor;
use super::NAMES;
use crate::beliefs::Held;
use crate::history::{Recorder, Type};

/// A library session's lease view as it changed: (observed at, the view's
/// end in run time, or `None` once lost or closed).
type ViewLog = Arc<Mutex<Vec<(u64, Option<u64>)>>>;

/// Follows `session`'s lease view into a log (until it is lost or closed).
fn follow_view(rec: &Recorder, session: &Session) -> ViewLog {
    let log: ViewLog = Arc::default();
    let mut view = session.lease();
    let (rec, out) = (rec.clone(), log.clone());
    tokio::spawn(async move {
        loop {
            let state = *view.borrow_and_update();
            let now = rec.now_ns();
            let until = match state {
                LeaseState::Valid(until) => Some(
                    until
                        .into_std()
                        .saturating_duration_since(rec.start())
                        .as_nanos() as u64,
                ),
                _ => None,
            };
            out.lock().expect("view log poisoned").push((now, until));
            if until.is_none() || view.changed().await.is_err() {
                return;
            }
        }
    });
    log
}

/// The belief in a grant answered at `from` whose session's view is
/// `log`, up to `end` (its release's send): the view at `from`, extended
/// (or restored) by each later change, ended by a loss.
#[allow(clippy::too_many_arguments)]
fn library_belief(
    log: &ViewLog,
    path: &'static str,
    lock: &str,
    held: Held,
    session: u64,
    fence: u64,
    gen: u64,
    from: u64,
) -> Option<Holding> {
    let log = log.lock().expect("view log poisoned");
    // The view as it stood when the answer came.
    let until = log
        .iter()
        .take_while(|(t, _)| *t <= from)
        .last()
        .and_then(|(_, u)| *u)?;
    Holding::new(path, lock, held, session, fence, gen, until, 0, from)
}

/// Applies the view's changes after `h.since` up to `end`; the moment the
/// view said the lease was lost, if it did.
fn follow_changes(log: &ViewLog, h: &mut Holding, end: u64) -> Option<u64> {
    let log = log.lock().expect("view log poisoned");
    let start = h.since;
    for &(t, until) in log.iter().filter(|(t, _)| *t > start && *t < end) {
        match until {
            Some(u) => h.answered(u, 0, t),
            None => return Some(t),
        }
    }
    None
}

impl Actor {
    async fn library_session(&mut self, client: &Client, path: &str) -> Option<(Session, ViewLog)> {
        let ttl = self.rng.random_range(2_000..=4_000u64);
        self.p.invoke(
            "open",
            json!({"ttl_ms": ttl, "library": true, "margin": 0, "path": path, "gen": self.conn.gen}),
        );
        let opened = client
            .session_with(SessionOptions {
                ttl: Duration::from_millis(ttl),
                margin: 0.0,
                ..Default::default()
            })
            .await;
        match opened {
            Ok(s) => {
                let log = follow_view(&self.sh.rec, &s);
                self.p
                    .complete(Type::Ok, json!({ "session": s.id().get() }));
                Some((s, log))
            }
            Err(e) => {
                self.p.complete(classify(&e), err_value(&e));
                tokio::time::sleep(Duration::from_millis(100)).await;
                None
            }
        }
    }

    async fn library_close(&mut self, s: Session) {
        self.p.invoke(
            "close",
            json!({"session": s.id().get(), "gen": self.conn.gen}),
        );
        match s.close().await {
            Ok(()) => self
                .p
                .complete(Type::Ok, json!({ "session": s.id().get() })),
            Err(e) => self.p.complete(Type::Info, err_value(&e)),
        }
    }

    /// Ends the beliefs in `held` at `end` (their release's send, or the
    /// session's end), following the view's changes up to then.
    fn library_let_go(&self, log: &ViewLog, mut h: Holding, end: u64, why: &str) {
        match follow_changes(log, &mut h, end) {
            Some(lost) => self.let_go(h, lost, "lease-lost"),
            None => self.let_go(h, end, why),
        }
    }

    async fn library_release(&mut self, log: &ViewLog, g: Guard, h: Option<Holding>) {
        let sid = g.session().id().get();
        let end = self.now();
        if let Some(h) = h {
            self.library_let_go(log, h, end, "release");
        }
        self.p.invoke(
            "release",
            json!({"lock": g.name(), "fence": g.fence().get(), "session": sid,
                   "gen": self.conn.gen, "library": true}),
        );
        match g.release().await {
            Ok(released) => self.p.complete(Type::Ok, json!({ "released": released })),
            Err(e) => {
                let kind = classify(&e);
                self.p.complete(kind, err_value(&e));
            }
        }
    }

    /// An atomic request for 2 or 3 names in random modes; hold; release.
    pub(super) async fn multi(&mut self, client: &Client) {
        let Some((session, log)) = self.library_session(client, "multi").await else {
            return;
        };
        let mut names = NAMES.to_vec();
        names.shuffle(&mut self.rng);
        names.truncate(self.rng.random_range(2..=NAMES.len()));
        let locks: Vec<(&str, Mode)> = names
            .iter()
            .map(|n| {
                let m = if self.rng.random_bool(0.7) {
                    Mode::Exclusive
                } else {
                    Mode::Shared
                };
                (*n, m)
            })
            .collect();
        let sid = session.id().get();
        let specs: Vec<Value> = locks
            .iter()
            .map(|(n, m)| json!({"lock": n, "mode": mode_str(*m)}))
            .collect();
        self.p.invoke(
            "acquire-all",
            json!({"locks": specs, "session": sid, "timeout_ms": 1000, "gen": self.conn.gen}),
        );
        let guards = match session
            .lock_all(&locks, Some(Duration::from_millis(1_000)))
            .await
        {
            Ok(guards) => {
                let grants: Vec<Value> = guards
                    .iter()
                    .map(|g| json!({"lock": g.name(), "mode": mode_str(g.mode()), "fence": g.fence().get()}))
                    .collect();
                self.p
                    .complete(Type::Ok, json!({"session": sid, "grants": grants}));
                guards
            }
            Err(e) => {
                self.p.complete(classify(&e), err_value(&e));
                self.library_close(session).await;
                return;
            }
        };
        let from = self.now();
        let mut held: Vec<(Guard, Option<Holding>)> = Vec::new();
        for g in guards {
            let mode = if g.mode() == Mode::Shared {
                Held::Shared
            } else {
                Held::Exclusive
            };
            let h = library_belief(
                &log,
                "multi",
                g.name(),
                mode,
                sid,
                g.fence().get(),
                self.conn.gen,
                from,
            );
            if let Some(h) = &h {
                self.hold(h);
            }
            held.push((g, h));
        }
        let hold = self.rng.random_range(0..=2_000);
        tokio::time::sleep(Duration::from_millis(hold)).await;
        for (g, h) in held {
            self.library_release(&log, g, h).await;
        }
        self.library_close(session).await;
    }

    /// A shared lock, upgraded (and half the time downgraded again);
    /// released.
    pub(super) async fn upgrade(&mut self, client: &Client, name: &str) {
        let Some((session, log)) = self.library_session(client, "upgrade").await else {
            return;
        };
        let sid = session.id().get();
        let gen = self.conn.gen;
        self.p.invoke(
            "acquire",
            json!({"lock": name, "mode": "shared", "weight": 1, "session": sid,
                   "timeout_ms": 1000, "gen": gen, "library": true}),
        );
        let read = match session
            .lock_with(name, true, Some(Duration::from_millis(1_000)), Vec::new())
            .await
        {
            Ok(g) => {
                self.p.complete(
                    Type::Ok,
                    json!({"lock": name, "mode": "shared", "weight": 1, "session": sid,
                           "fence": g.fence().get()}),
                );
                g
            }
            Err(e) => {
                self.p.complete(classify(&e), err_value(&e));
                self.library_close(session).await;
                return;
            }
        };
        let from = self.now();
        let mut h = library_belief(
            &log,
            "upgrade",
            name,
            Held::Shared,
            sid,
            read.fence().get(),
            gen,
            from,
        );
        if let Some(h) = &h {
            self.hold(h);
        }
        tokio::time::sleep(Duration::from_millis(self.rng.random_range(0..=300))).await;
        let timeout = Duration::from_millis(self.rng.random_range(0..=1_000));
        self.p.invoke(
            "upgrade",
            json!({"lock": name, "fence": read.fence().get(), "session": sid,
                   "timeout_ms": timeout.as_millis() as u64, "gen": gen}),
        );
        let mut g = match read.upgrade_timeout(timeout).await {
            Ok(up) => {
                let now = self.now();
                self.p.complete(
                    Type::Ok,
                    json!({"lock": name, "session": sid, "from_fence": read.fence().get(),
                           "fence": up.fence().get(), "mode": "exclusive"}),
                );
                // The read ended with the upgrade; the exclusive grant is
                // believed from its answer.
                if let Some(old) = h.take() {
                    self.library_let_go(&log, old, now, "upgraded");
                }
                h = library_belief(
                    &log,
                    "upgrade",
                    name,
                    Held::Exclusive,
                    sid,
                    up.fence().get(),
                    gen,
                    now,
                );
                if let Some(h) = &h {
                    self.hold(h);
                }
                up
            }
            Err(e) => {
                let kind = classify(&e);
                self.p.complete(kind, err_value(&e));
                if kind == Type::Info || matches!(e, Error::SessionNotFound(_)) {
                    let end = self.now();
                    if let Some(h) = h {
                        self.library_let_go(&log, h, end, "closing");
                    }
                    self.library_close(session).await;
                    return;
                }
                read
            }
        };
        tokio::time::sleep(Duration::from_millis(self.rng.random_range(0..=300))).await;
        if g.mode() == Mode::Exclusive && self.rng.random_bool(0.5) {
            let sent = self.now();
            self.p.invoke(
                "downgrade",
                json!({"lock": name, "fence": g.fence().get(), "session": sid, "gen": gen}),
            );
            match g.downgrade().await {
                Ok(down) => {
                    self.p.complete(
                        Type::Ok,
                        json!({"lock": name, "session": sid, "fence": down.fence().get(),
                               "mode": "shared"}),
                    );
                    // Exclusive until the downgrade was sent, shared from
                    // then on (the weaker claim), on the same count.
                    if let Some(mut old) = h.take() {
                        let lost = follow_changes(&log, &mut old, sent);
                        let until = old.until;
                        self.let_go(old, lost.unwrap_or(sent), "downgraded");
                        if lost.is_none() {
                            h = Holding::new(
                                "upgrade",
                                name,
                                Held::Shared,
                                sid,
                                down.fence().get(),
                                gen,
                                until,
                                0,
                                sent,
                            );
                            if let Some(s) = &h {
                                self.hold(s);
                            }
                        }
                    }
                    g = down;
                }
                Err(e) => {
                    let kind = classify(&e);
                    self.p.complete(kind, err_value(&e));
                    if kind == Type::Info || matches!(e, Error::SessionNotFound(_)) {
                        let end = self.now();
                        if let Some(h) = h {
                            self.library_let_go(&log, h, end, "closing");
                        }
                        self.library_close(session).await;
                        return;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(self.rng.random_range(0..=300))).await;
        }
        self.library_release(&log, g, h).await;
        self.library_close(session).await;
    }
}
