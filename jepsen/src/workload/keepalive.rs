//! The raw keep-alive prober of the `clients` workload: a client that
//! speaks the `Locks` protocol itself (no client library between it and
//! the wire) and records every `KeepAlive` answer with the time its ask
//! was sent, for the keep-alive contract check ([`crate::leases`]).
//!
//! [`PROBERS`] probers contend for one lock, [`PROBE_LOCK`], with sessions
//! of the smallest ttl ([`PROBE_TTL`]). Each cycle a prober opens a
//! session, keeps it alive every [`KEEP_ALIVE_EVERY`] on *every* node (one
//! stream per node; a node that does not lead ends its stream, which is
//! recorded too), acquires the lock (waiting up to 3 s), holds it a
//! little, and then either releases it and closes the session, or
//! abandons it: it stops keeping the session alive, as a crashed or
//! paused holder would, so the session expires on the leader and the
//! other prober is granted the lock. It then keeps asking every node to
//! renew the abandoned session every [`PROBE_EVERY`] for [`PROBE_FOR`]:
//! the contract is that once the expiry has been applied no node answers
//! `renewed` (a leader restarted in its old term with a lagging table did,
//! review finding 1). Watchers follow `Watch` on every node (directly,
//! not through the client-link proxies) and record each event, so the
//! check knows when an expiry was applied.
//!
//! History (one process number per operation for the keep-alives and the
//! watch events, which overlap each other; the prober's own operations
//! use one process per prober and generation):
//!
//! * `keepalive` {session, node, gen, ask_id} → ok {renewed, expired,
//!   ttl_ms, ask_id (the echo; 0 from a server that predates ask ids)} |
//!   fail {error} (the node refused: not the leader) | info {error} (no
//!   answer in time; the stream is dropped);
//! * `watch` {node, gen} → ok {kind, name, session, fence, index};
//! * `open` {ttl_ms, prober, gen} → ok {session};
//! * `acquire`, `release`, `close` as the other workers record them, with
//!   `prober: true`;
//! * `abandon` {session, lock, fence, gen, lease_until_ns}: the prober
//!   stops keeping the session alive and stops using its grant.
//!
//! `gen` counts the restores the prober has moved through: session ids of
//! different clusters are not compared.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use raftlock_proto::v1 as pb;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::clientlink::{prober_end, ClientLinks, ClusterAddrs};
use crate::history::{Process, Recorder, Type};
use crate::raw::Creds;

/// Probers per run.
pub const PROBERS: u64 = 2;
/// The lock the probers contend for.
pub const PROBE_LOCK: &str = "ka/0";
/// The probers' session ttl: the smallest the server accepts, so sessions
/// expire often.
pub const PROBE_TTL: Duration = Duration::from_millis(1000);
/// How often a live session is kept alive (a quarter of the ttl).
pub const KEEP_ALIVE_EVERY: Duration = Duration::from_millis(250);
/// How often an abandoned session is probed.
pub const PROBE_EVERY: Duration = Duration::from_millis(50);
/// How long an abandoned session is probed.
pub const PROBE_FOR: Duration = Duration::from_secs(6);
/// How long a keep-alive may go unanswered before its stream is dropped
/// and its outcome counts as unknown.
pub const ASK_TIMEOUT: Duration = Duration::from_millis(1500);

/// Process numbers of keep-alive asks and watch events start here (one
/// per operation).
const EVENT_PROCESS_BASE: u64 = 3_000_000_000;
/// Process numbers of the probers' own operations start here.
const PROBER_PROCESS_BASE: u64 = 2_900_000_000;

/// Where one prober sends, for one cluster generation.
#[derive(Clone, Debug)]
struct Targets {
    /// The restores moved through so far.
    gen: u64,
    /// The node ids, in order.
    nodes: Vec<u64>,
    /// For each node, the address this prober dials (a client-link proxy,
    /// or the node itself).
    via: BTreeMap<u64, String>,
}

/// Everything the probers share.
#[derive(Clone)]
pub struct ProberOptions {
    /// Credentials, if the cluster has access control.
    pub creds: Creds,
    /// The run's seed.
    pub seed: u64,
}

/// Hands out fresh process numbers for one-operation processes.
#[derive(Clone, Default)]
struct Processes(Arc<AtomicU64>);

impl Processes {
    fn next(&self) -> u64 {
        EVENT_PROCESS_BASE + self.0.fetch_add(1, Ordering::Relaxed)
    }
}

/// Records a one-operation process: invoke now, complete later.
struct OneOp {
    rec: Recorder,
    process: u64,
    f: &'static str,
}

impl OneOp {
    fn start(rec: &Recorder, procs: &Processes, f: &'static str, value: Value) -> (OneOp, u64) {
        let process = procs.next();
        let t = rec.record(Process::Client(process), Type::Invoke, f, value);
        (
            OneOp {
                rec: rec.clone(),
                process,
                f,
            },
            t,
        )
    }

    fn end(self, kind: Type, value: Value) {
        self.rec
            .record(Process::Client(self.process), kind, self.f, value);
    }
}

/// An ask a lane must send.
struct Ask {
    session: u64,
}

/// The keep-alive stream to one node, and the asks on it.
#[allow(clippy::too_many_arguments)]
async fn lane(
    node: u64,
    addr: String,
    gen: u64,
    creds: Creds,
    rec: Recorder,
    procs: Processes,
    mut asks: mpsc::UnboundedReceiver<Ask>,
    renewals: mpsc::UnboundedSender<(u64, Instant)>,
) {
    type Stream = (
        mpsc::UnboundedSender<pb::KeepAliveRequest>,
        tonic::Streaming<pb::KeepAliveResponse>,
    );
    let mut stream: Option<Stream> = None;
    // A new ask id for every ask on this lane (the proto asks for one per
    // request on a stream; a server that predates ask ids echoes 0).
    let mut next_ask_id: u64 = 0;
    // Per session: the op, its deadline, when it was sent.
    let mut pending: BTreeMap<u64, (OneOp, Instant, Instant)> = BTreeMap::new();
    let fail_all =
        |pending: &mut BTreeMap<u64, (OneOp, Instant, Instant)>, kind: Type, why: &str| {
            for (_, (op, _, _)) in std::mem::take(pending) {
                op.end(kind, json!({ "error": why }));
            }
        };
    loop {
        let next_deadline = pending.values().map(|p| p.1).min();
        tokio::select! {
            ask = asks.recv() => {
                let Some(ask) = ask else { break };
                if pending.contains_key(&ask.session) {
                    continue;
                }
                if stream.is_none() {
                    let (tx, rx) = mpsc::unbounded_channel();
                    let mut locks = crate::raw::locks(crate::raw::client_channel(&addr), &creds);
                    let opened = tokio::time::timeout(
                        ASK_TIMEOUT,
                        locks.keep_alive(tokio_stream::wrappers::UnboundedReceiverStream::new(rx)),
                    )
                    .await;
                    match opened {
                        Ok(Ok(answers)) => stream = Some((tx, answers.into_inner())),
                        Ok(Err(status)) => {
                            let (op, _) = OneOp::start(&rec, &procs, "keepalive",
                                json!({"session": ask.session, "node": node, "gen": gen}));
                            op.end(Type::Fail, json!({"error": format!("{:?}: {}", status.code(), status.message())}));
                            continue;
                        }
                        Err(_) => {
                            let (op, _) = OneOp::start(&rec, &procs, "keepalive",
                                json!({"session": ask.session, "node": node, "gen": gen}));
                            op.end(Type::Fail, json!({"error": "could not open a stream in time"}));
                            continue;
                        }
                    }
                }
                let (tx, _) = stream.as_ref().expect("opened above");
                next_ask_id += 1;
                let (op, _) = OneOp::start(&rec, &procs, "keepalive",
                    json!({"session": ask.session, "node": node, "gen": gen, "ask_id": next_ask_id}));
                let sent = Instant::now();
                let request = pb::KeepAliveRequest { session_id: ask.session, ask_id: next_ask_id };
                if tx.send(request).is_err() {
                    op.end(Type::Fail, json!({"error": "stream closed"}));
                    stream = None;
                    continue;
                }
                pending.insert(ask.session, (op, sent + ASK_TIMEOUT, sent));
            }
            answer = async { stream.as_mut().expect("checked").1.message().await }, if stream.is_some() => {
                match answer {
                    Ok(Some(a)) => {
                        if let Some((op, _, sent)) = pending.remove(&a.session_id) {
                            let renewed = !a.expired && a.ttl_ms > 0;
                            op.end(Type::Ok, json!({"session": a.session_id, "renewed": renewed,
                                                    "expired": a.expired, "ttl_ms": a.ttl_ms,
                                                    "ask_id": a.ask_id}));
                            if renewed {
                                let _ = renewals.send((a.session_id, sent));
                            }
                        }
                    }
                    Ok(None) => {
                        fail_all(&mut pending, Type::Info, "the stream ended");
                        stream = None;
                    }
                    Err(status) => {
                        // "Not the leader" renews nothing; anything else
                        // (a transport failure) may have come after a
                        // renewal.
                        let not_leader = status.metadata().get(raftlock_proto::NOT_LEADER_KEY).is_some()
                            || status.code() == tonic::Code::Unavailable && status.source_is_none();
                        let why = format!("{:?}: {}", status.code(), status.message());
                        fail_all(&mut pending, if not_leader { Type::Fail } else { Type::Info }, &why);
                        stream = None;
                    }
                }
            }
            _ = async { tokio::time::sleep_until(next_deadline.expect("checked")).await }, if next_deadline.is_some() => {
                fail_all(&mut pending, Type::Info, "no answer in time");
                stream = None;
            }
        }
    }
    fail_all(&mut pending, Type::Info, "the prober stopped");
}

/// A `tonic::Status` without an error source came from the node, not from
/// this side's transport.
trait StatusSource {
    fn source_is_none(&self) -> bool;
}

impl StatusSource for tonic::Status {
    fn source_is_none(&self) -> bool {
        std::error::Error::source(self).is_none()
    }
}

/// One prober.
struct Prober {
    k: u64,
    rec: Recorder,
    procs: Processes,
    opts: ProberOptions,
    targets: Targets,
    rng: StdRng,
    generation: u64,
    lanes: BTreeMap<u64, mpsc::UnboundedSender<Ask>>,
    /// Renewed asks come back here: (session, send time).
    renewals: mpsc::UnboundedReceiver<(u64, Instant)>,
    renewals_tx: mpsc::UnboundedSender<(u64, Instant)>,
    /// Abandoned sessions, and those being probed.
    probing: Arc<std::sync::Mutex<ProbeSet>>,
    /// The node believed to lead.
    leader: Option<u64>,
    /// A channel per address, for the prober's own calls.
    channels: BTreeMap<String, tonic::transport::Channel>,
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

    fn start_lanes(&mut self) {
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

    async fn cycle(&mut self, stop: &AtomicBool) {
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

/// A prober's abandoned sessions: waiting for their expiry, then probed
/// until a deadline.
#[derive(Default)]
struct ProbeSet {
    abandoned: BTreeSet<u64>,
    probed: BTreeMap<u64, Instant>,
}

/// Probes a prober's abandoned sessions once their expiry has been applied
/// (from the watchers' `expired` events), every [`PROBE_EVERY`] for
/// [`PROBE_FOR`], on every node. Ends once `quit` says so and nothing is
/// left to probe (or [`PROBE_FOR`] after `quit`).
async fn probe(
    set: Arc<std::sync::Mutex<ProbeSet>>,
    lanes: BTreeMap<u64, mpsc::UnboundedSender<Ask>>,
    mut expired: tokio::sync::broadcast::Receiver<u64>,
    quit: impl Fn() -> bool,
) {
    let mut tick = tokio::time::interval(PROBE_EVERY);
    let mut quit_at: Option<Instant> = None;
    loop {
        tokio::select! {
            e = expired.recv() => match e {
                Ok(s) => {
                    let mut set = set.lock().expect("probe set lock poisoned");
                    if set.abandoned.remove(&s) {
                        set.probed.insert(s, Instant::now() + PROBE_FOR);
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => {
                    // No watcher left: only the probing goes on.
                    tick.tick().await;
                }
            },
            _ = tick.tick() => {
                let now = Instant::now();
                let sessions: Vec<u64> = {
                    let mut set = set.lock().expect("probe set lock poisoned");
                    set.probed.retain(|_, until| *until > now);
                    set.probed.keys().copied().collect()
                };
                for s in sessions {
                    self_ask(&lanes, s);
                }
                if quit() {
                    let at = *quit_at.get_or_insert(now + PROBE_FOR);
                    let set = set.lock().expect("probe set lock poisoned");
                    if set.probed.is_empty() || now >= at {
                        return;
                    }
                }
            }
        }
    }
}

/// Sends an ask for `session` on every lane (usable while `self` is
/// borrowed by a call).
fn self_ask(lanes: &BTreeMap<u64, mpsc::UnboundedSender<Ask>>, session: u64) {
    for lane in lanes.values() {
        let _ = lane.send(Ask { session });
    }
}

/// Follows `Watch` of the probe lock on one node and records each event.
#[allow(clippy::too_many_arguments)]
async fn watcher(
    node: u64,
    addr: String,
    gen: u64,
    creds: Creds,
    rec: Recorder,
    procs: Processes,
    expired: tokio::sync::broadcast::Sender<u64>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::SeqCst) {
        let mut locks = crate::raw::locks(crate::raw::fresh_channel(&addr), &creds);
        let opened = tokio::time::timeout(
            Duration::from_secs(1),
            locks.watch(pb::WatchRequest {
                name: PROBE_LOCK.into(),
                prefix: String::new(),
            }),
        )
        .await;
        if let Ok(Ok(stream)) = opened {
            let mut stream = stream.into_inner();
            loop {
                let next = tokio::time::timeout(Duration::from_millis(500), stream.message()).await;
                match next {
                    Ok(Ok(Some(e))) => {
                        let kind = event_kind_name(e.kind);
                        let (op, _) =
                            OneOp::start(&rec, &procs, "watch", json!({"node": node, "gen": gen}));
                        op.end(
                            Type::Ok,
                            json!({"kind": kind, "name": e.name, "session": e.session_id,
                                   "fence": e.fence, "index": e.index}),
                        );
                        if e.kind == pb::EventKind::Expired as i32 {
                            let _ = expired.send(e.session_id);
                        }
                    }
                    Ok(_) => break,
                    Err(_) if stop.load(Ordering::SeqCst) => return,
                    Err(_) => {}
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs the probers and the watchers until `stop`, moving to each new
/// cluster (a restored one) as it comes. With client links each prober
/// dials its own proxies; the watchers always dial the nodes.
pub async fn run(
    rec: Recorder,
    opts: ProberOptions,
    links: Option<Arc<ClientLinks>>,
    mut addrs: tokio::sync::watch::Receiver<ClusterAddrs>,
    stop: Arc<AtomicBool>,
) {
    let procs = Processes::default();
    loop {
        let a = addrs.borrow_and_update().clone();
        let moved = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let (expired, _) = tokio::sync::broadcast::channel(1024);
        let mut tasks = tokio::task::JoinSet::new();
        let mut watchers = tokio::task::JoinSet::new();
        for (&node, addr) in &a.nodes {
            watchers.spawn(watcher(
                node,
                addr.clone(),
                a.gen,
                opts.creds.clone(),
                rec.clone(),
                procs.clone(),
                expired.clone(),
                done.clone(),
            ));
        }
        for k in 0..PROBERS {
            let via = match &links {
                Some(l) => match l.via(prober_end(k), &a).await {
                    Ok(via) => via,
                    Err(e) => {
                        eprintln!("raftlock-jepsen: prober {k} has no client links: {e:#}");
                        a.nodes.clone()
                    }
                },
                None => a.nodes.clone(),
            };
            let targets = Targets {
                gen: a.gen,
                nodes: a.nodes.keys().copied().collect(),
                via,
            };
            let (renewals_tx, renewals) = mpsc::unbounded_channel();
            let probing = Arc::new(std::sync::Mutex::new(ProbeSet::default()));
            let mut p = Prober {
                k,
                rec: rec.clone(),
                procs: procs.clone(),
                opts: opts.clone(),
                targets,
                rng: StdRng::seed_from_u64(opts.seed ^ (0x6b61 << 16) ^ k),
                generation: a.gen * 1_000,
                lanes: BTreeMap::new(),
                renewals,
                renewals_tx,
                probing: probing.clone(),
                leader: None,
                channels: BTreeMap::new(),
            };
            p.start_lanes();
            let quit = {
                let (stop, moved) = (stop.clone(), moved.clone());
                move || stop.load(Ordering::SeqCst) || moved.load(Ordering::SeqCst)
            };
            tasks.spawn(probe(
                probing,
                p.lanes.clone(),
                expired.subscribe(),
                quit.clone(),
            ));
            let stop = stop.clone();
            tasks.spawn(async move {
                while !quit() {
                    p.cycle(&stop).await;
                }
            });
        }
        tokio::select! {
            _ = async { while tasks.join_next().await.is_some() {} } => {
                done.store(true, Ordering::SeqCst);
                watchers.shutdown().await;
                return;
            }
            changed = addrs.changed() => {
                moved.store(true, Ordering::SeqCst);
                done.store(true, Ordering::SeqCst);
                tasks.shutdown().await;
                watchers.shutdown().await;
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

/// A watch event's kind as the history spells it (`granted`, `expired`,
/// ...), or its number if this harness does not know it.
pub fn event_kind_name(kind: i32) -> String {
    pb::EventKind::try_from(kind)
        .map(|k| {
            k.as_str_name()
                .trim_start_matches("EVENT_KIND_")
                .to_lowercase()
        })
        .unwrap_or_else(|_| kind.to_string())
}
