//! One prober: its cycle of open, keep alive, acquire, hold, then release
//! and close or abandon.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use raftlock_proto::v1 as pb;
use rand::rngs::StdRng;
use rand::RngExt;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::lanes::{lane, self_ask, Ask, ProbeSet};
use super::{
    ProberOptions, Processes, Targets, KEEP_ALIVE_EVERY, PROBER_PROCESS_BASE, PROBE_LOCK, PROBE_TTL,
};
use crate::history::{Process, Recorder, Type};

/// A `tonic::Status` without an error source came from the node, not from
/// this side's transport.
pub(super) trait StatusSource {
    fn source_is_none(&self) -> bool;
}

impl StatusSource for tonic::Status {
    fn source_is_none(&self) -> bool {
        std::error::Error::source(self).is_none()
    }
}

/// One prober.
pub(super) struct Prober {
    pub(super) k: u64,
    pub(super) rec: Recorder,
    pub(super) procs: Processes,
    pub(super) opts: ProberOptions,
    pub(super) targets: Targets,
    pub(super) rng: StdRng,
    pub(super) generation: u64,
    pub(super) lanes: BTreeMap<u64, mpsc::UnboundedSender<Ask>>,
    /// Renewed asks come back here: (session, send time).
    pub(super) renewals: mpsc::UnboundedReceiver<(u64, Instant)>,
    pub(super) renewals_tx: mpsc::UnboundedSender<(u64, Instant)>,
    /// Abandoned sessions, and those being probed.
    pub(super) probing: Arc<std::sync::Mutex<ProbeSet>>,
    /// The node believed to lead.
    pub(super) leader: Option<u64>,
    /// A channel per address, for the prober's own calls.
    pub(super) channels: BTreeMap<String, tonic::transport::Channel>,
}

impl Prober {
    fn process(&self) -> Process {
        Process::Client(PROBER_PROCESS_BASE + self.k + 100 * self.generation)
    }

    fn record(&mut self, kind: Type, f: &str, value: Value) -> u64 {
        let t = self.rec.record(self.process(), kind, f, value);
        if kind == Type::Info {
            self.generation += 1;
        }
        t
    }

    pub(super) fn start_lanes(&mut self) {
        self.lanes.clear();
        for (&node, addr) in &self.targets.via {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(lane(
                node,
                addr.clone(),
                self.targets.gen,
                self.opts.creds.clone(),
                self.rec.clone(),
                self.procs.clone(),
                rx,
                self.renewals_tx.clone(),
            ));
            self.lanes.insert(node, tx);
        }
    }

    fn ask_everyone(&self, session: u64) {
        for lane in self.lanes.values() {
            let _ = lane.send(Ask { session });
        }
    }

    /// Runs one unary call against the leader, trying the nodes in turn
    /// and following "not the leader" answers, for up to `budget`.
    async fn call<T, F, Fut>(&mut self, budget: Duration, mut f: F) -> Result<T, (bool, String)>
    where
        F: FnMut(crate::raw::Conn) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let deadline = Instant::now() + budget;
        let mut sent = false;
        let mut last = String::from("no node answered");
        let mut turn = 0usize;
        while Instant::now() < deadline {
            let node = self.leader.unwrap_or_else(|| {
                let n = self.targets.nodes[turn % self.targets.nodes.len()];
                turn += 1;
                n
            });
            let Some(addr) = self.targets.via.get(&node).cloned() else {
                self.leader = None;
                continue;
            };
            let channel = self
                .channels
                .entry(addr.clone())
                .or_insert_with(|| crate::raw::client_channel(&addr))
                .clone();
            let conn = tonic::service::interceptor::InterceptedService::new(
                channel,
                self.opts.creds.clone(),
            );
            match tokio::time::timeout_at(deadline, f(conn)).await {
                Ok(Ok(r)) => {
                    self.leader = Some(node);
                    return Ok(r.into_inner());
                }
                Ok(Err(status)) => {
                    let not_leader = status
                        .metadata()
                        .get(raftlock_proto::NOT_LEADER_KEY)
                        .is_some();
                    last = format!("{:?}: {}", status.code(), status.message());
                    match status.code() {
                        tonic::Code::Unavailable if not_leader => {
                            self.leader = status
                                .metadata()
                                .get(raftlock_proto::LEADER_ID_KEY)
                                .and_then(|v| v.to_str().ok()?.parse().ok())
                                .filter(|l| Some(*l) != self.leader);
                        }
                        tonic::Code::Unavailable
                        | tonic::Code::DeadlineExceeded
                        | tonic::Code::Cancelled
                        | tonic::Code::Unknown => {
                            sent = true;
                            self.leader = None;
                        }
                        // The node's own refusal; if an earlier attempt
                        // was sent, it may still have been applied.
                        _ if status.source_is_none() => return Err((sent, last)),
                        _ => {
                            sent = true;
                            self.leader = None;
                        }
                    }
                }
                Err(_) => {
                    sent = true;
                    self.leader = None;
                    last = "no answer in time".into();
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err((sent, last))
    }

    /// The lease this prober may count on for `session` now: the send
    /// time of its latest renewed ask plus the ttl, as the proto tells a
    /// client to count (0 if none).
    fn lease_until_ns(&self, renewed_at: Option<Instant>) -> u64 {
        renewed_at.map_or(0, |t| {
            (t + PROBE_TTL)
                .into_std()
                .saturating_duration_since(self.rec.start())
                .as_nanos() as u64
        })
    }

    pub(super) async fn cycle(&mut self, stop: &AtomicBool) {
        let gen = self.targets.gen;
        let ttl_ms = PROBE_TTL.as_millis() as u64;
        let nonce = self.rng.random::<u64>() | 1;
        self.record(
            Type::Invoke,
            "open",
            json!({"ttl_ms": ttl_ms, "prober": true, "gen": gen}),
        );
        let opened_at = Instant::now();
        let opened = self
            .call(Duration::from_secs(4), |c| {
                let mut l = raftlock_proto::v1::locks_client::LocksClient::new(c);
                async move {
                    l.open_session(pb::OpenSessionRequest {
                        ttl_ms,
                        nonce,
                        ..Default::default()
                    })
                    .await
                }
            })
            .await;
        let session = match opened {
            Ok(r) => {
                self.record(Type::Ok, "open", json!({"session": r.session_id}));
                r.session_id
            }
            Err((sent, e)) => {
                self.record(
                    if sent { Type::Info } else { Type::Fail },
                    "open",
                    json!({ "error": e }),
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
                return;
            }
        };
        let mut renewed_at = Some(opened_at);
        // Keep alive while acquiring and holding.
        let mut next_keep = Instant::now();
        let acquire = {
            let name = PROBE_LOCK.to_string();
            move |c| {
                let mut l = raftlock_proto::v1::locks_client::LocksClient::new(c);
                let name = name.clone();
                async move {
                    l.acquire(pb::AcquireRequest {
                        session_id: session,
                        seq: 1,
                        name,
                        mode: pb::Mode::Exclusive as i32,
                        timeout_ms: 3000,
                        ..Default::default()
                    })
                    .await
                }
            }
        };
        self.record(
            Type::Invoke,
            "acquire",
            json!({"lock": PROBE_LOCK, "mode": "exclusive", "weight": 1, "session": session,
                   "timeout_ms": 3000, "prober": true, "gen": gen}),
        );
        let acquired = {
            // The call borrows the prober; the lanes are cloned handles.
            let lanes = self.lanes.clone();
            let call = self.call(Duration::from_secs(5), acquire);
            tokio::pin!(call);
            loop {
                tokio::select! {
                    r = &mut call => break r,
                    _ = tokio::time::sleep_until(next_keep) => {
                        next_keep += KEEP_ALIVE_EVERY;
                        self_ask(&lanes, session);
                    }
                }
            }
        };
        while let Ok((s, at)) = self.renewals.try_recv() {
            if s == session {
                renewed_at = renewed_at.max(Some(at));
            }
        }
        let fence = match acquired {
            Ok(r) if r.acquired => {
                self.record(
                    Type::Ok,
                    "acquire",
                    json!({"lock": PROBE_LOCK, "mode": "exclusive", "weight": 1,
                           "session": session, "fence": r.fence}),
                );
                Some(r.fence)
            }
            Ok(_) => {
                self.record(
                    Type::Fail,
                    "acquire",
                    json!({"error": "not acquired in time"}),
                );
                None
            }
            Err((sent, e)) => {
                self.record(
                    if sent { Type::Info } else { Type::Fail },
                    "acquire",
                    json!({ "error": e }),
                );
                if sent {
                    // It may hold the lock: abandon the session (it will
                    // expire and let go of everything).
                    self.abandon(session, None, renewed_at);
                    return;
                }
                None
            }
        };
        let hold_until = Instant::now() + Duration::from_millis(self.rng.random_range(100..=900));
        while Instant::now() < hold_until && !stop.load(Ordering::SeqCst) {
            if Instant::now() >= next_keep {
                next_keep += KEEP_ALIVE_EVERY;
                self.ask_everyone(session);
            }
            tokio::time::sleep_until(next_keep.min(hold_until)).await;
            while let Ok((s, at)) = self.renewals.try_recv() {
                if s == session {
                    renewed_at = renewed_at.max(Some(at));
                }
            }
        }
        if fence.is_some() && !stop.load(Ordering::SeqCst) && self.rng.random_bool(0.5) {
            self.abandon(session, fence, renewed_at);
            return;
        }
        if let Some(fence) = fence {
            let lease = self.lease_until_ns(renewed_at);
            self.record(
                Type::Invoke,
                "release",
                json!({"lock": PROBE_LOCK, "fence": fence, "session": session,
                       "lease_until_ns": lease, "prober": true}),
            );
            let released = self
                .call(Duration::from_secs(4), |c| {
                    let mut l = raftlock_proto::v1::locks_client::LocksClient::new(c);
                    async move {
                        l.release(pb::ReleaseRequest {
                            session_id: session,
                            seq: 2,
                            name: PROBE_LOCK.into(),
                            fence,
                        })
                        .await
                    }
                })
                .await;
            match released {
                Ok(r) => {
                    self.record(Type::Ok, "release", json!({"released": r.released}));
                }
                Err((sent, e)) => {
                    self.record(
                        if sent { Type::Info } else { Type::Fail },
                        "release",
                        json!({ "error": e }),
                    );
                    self.abandon(session, None, renewed_at);
                    return;
                }
            }
        }
        self.record(
            Type::Invoke,
            "close",
            json!({"session": session, "prober": true}),
        );
        let closed = self
            .call(Duration::from_secs(4), |c| {
                let mut l = raftlock_proto::v1::locks_client::LocksClient::new(c);
                async move {
                    l.close_session(pb::CloseSessionRequest {
                        session_id: session,
                        seq: 3,
                    })
                    .await
                }
            })
            .await;
        match closed {
            Ok(_) => {
                self.record(Type::Ok, "close", json!({ "session": session }));
            }
            Err((sent, e)) => {
                self.record(
                    if sent { Type::Info } else { Type::Fail },
                    "close",
                    json!({ "error": e }),
                );
            }
        }
    }

    /// Stops keeping `session` alive (and using its grant, if any); once
    /// its expiry is applied (a watch event), it is probed.
    fn abandon(&mut self, session: u64, fence: Option<u64>, renewed_at: Option<Instant>) {
        let lease = self.lease_until_ns(renewed_at);
        let v = json!({"session": session, "lock": PROBE_LOCK, "fence": fence,
                       "gen": self.targets.gen, "lease_until_ns": lease});
        self.record(Type::Invoke, "abandon", v.clone());
        self.record(Type::Ok, "abandon", v);
        self.probing
            .lock()
            .expect("probe set lock poisoned")
            .abandoned
            .insert(session);
    }
}
