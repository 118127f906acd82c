//! The `leases` workload: clients that drive every path of the lease rule
//! (docs/concepts/sessions-and-leases.md, "The lease rule") against the live cluster and record what
//! they believe, for the belief oracle ([`crate::beliefs`]).
//!
//! Every grant a client is given here is followed by a `belief` operation
//! that says during which spans the client believed it held it, counted
//! exactly as the rule says, with no margin (the nodes and the harness
//! read one machine's monotonic clock; with the `clock` nemesis the
//! oracle excuses what touches a skewed clock): from the answer that
//! granted it until the earliest of sending its release or `Unlock`, an
//! answer saying the session is gone (`expired`, `NOT_FOUND`), and the end
//! of its count, the latest `S + L` over the lease-starting answers (`S`
//! when the request answered was sent, taken just before sending; `L` the
//! ttl, or min(ttl, grace) for a session that ends with its process). A
//! count that ran out is restored by a later lease-starting answer from
//! the moment that answer arrived.
//!
//! Paths (`--lease-paths`, default all), each worker picking one at
//! random per cycle, over the names `bl/0..2`, gRPC or (40 %) HTTP/JSON
//! (`POST /v1/locks/{Rpc}`, `Content-Type: application/json`):
//!
//! * `ttl-end`: a one-call `Lock` (ttl 1-2 s), then `SetSessionTtl` (a new
//!   ttl of 1-3 s) sent from 15 ms before to 45 ms after the end of the
//!   count, where the leader's expiry decision races it;
//! * `ttl-shorter`: a `Lock` (ttl 2-4 s), then early on a `SetSessionTtl`
//!   to a ttl under half of it, which shortens the lease: the client cuts
//!   its count to the change's send + the new ttl;
//! * `retry`: a `Lock` (ttl 1.5-3 s), then the same `Lock` again with its
//!   nonce while held (as after a transport error), 30-95 % into the ttl;
//!   answered `acquired`, it counts from the retry's send;
//! * `retry-failover`: the same, with a leadership transfer
//!   (`Cluster.TransferLeader`) between the first answer and the retry;
//! * `streams`: a session that ends with its process (`OpenSession` with
//!   `end_on_disconnect_ms` 300-800, ttl 2-5 s, then `Acquire`), kept
//!   alive on one or two `KeepAlive` streams (each on a connection of its
//!   own) that flap, half the time across a leadership round trip (the
//!   worker hands the leadership away and back); now and then its
//!   "process dies" (the streams close and nothing ends the session: the
//!   leader must end it a grace later, and the name passes on);
//! * `renewals`: a `Lock` (ttl 1-3 s) kept alive by one-shot `KeepAlive`s
//!   every third of the ttl (over HTTP one ask and one answer, over gRPC
//!   a one-message stream);
//! * `multi` and `upgrade`: the Rust client (`raftlock-client`, a session
//!   with margin 0, renewed by the library): an atomic `lock_all` of 2-3
//!   names in exclusive or shared mode, or a shared lock upgraded to
//!   exclusive and half the time downgraded again; the belief is the
//!   library's own lease view, followed as it changes;
//! * `revoke`: an operator task that revokes (`Cluster.RevokeSession`) a
//!   session some worker holds a grant in, every 1-3 s;
//! * `ghost`: a waiter (a one-call `Lock` over HTTP) whose process dies
//!   from 12 ms before to 12 ms after the holder lets go; when it died
//!   unanswered, the worker then waits for the name
//!   itself, and a round in which it is not granted it within 8 s while
//!   no fault was active fails the `ghosts` checker (a node that granted
//!   the dead waiter the name and kept it, review 2026-11-29 #5).
//!
//! Beside the workers, two contenders take a random name with a one-call
//! `Lock` (waiting up to 1.5 s) as soon as they can and let go within
//! 30 ms, over and over, so that a name a session loses too early is
//! granted to someone at once, where the oracle sees it; and watchers
//! follow `Watch` of the prefix `bl/` on every node (directly, not through
//! the client-link proxies) and record every event.
//!
//! History: every attempt of a request is an operation of its own, with
//! the node it went to (`node`), the cluster generation (`gen`) and, for
//! HTTP, `http: true`: `acquire` (a `Lock`'s first send and the contenders'
//! `Lock`s, `one_call: true`, and the `streams` path's `Acquire`) → ok
//! {lock, mode, session, fence, ttl_ms} | fail {acquired: false} or
//! {error, code}; `lock-retry` (a deliberate retry with the nonce) → ok
//! {acquired, session, fence}; `set-ttl` {session, seq, ttl_ms} → ok
//! {ttl_ms}; `keepalive` {session, node, gen, ask_id, via} → ok {renewed,
//! expired, ttl_ms, ask_id}; `release` (an `Unlock`, with `unlock: true`,
//! or the library's release) → ok {released}; `open`, `close`,
//! `acquire-all`, `upgrade`, `downgrade` as the `lock` workload records
//! them; `revoke` {session} → ok {released}; `transfer-leader` {to} → ok
//! {leader}; `watch` {node, gen} → ok {kind, name, session, fence, mode,
//! index}; `belief` {lock, mode, session, fence, gen, path, process,
//! spans: [[from_ns, until_ns], ...], end} (recorded when the belief
//! ended, under a process of its own).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use raftlock_client::{Client, Error, Guard, LeaseState, Mode, Session, SessionOptions};
use raftlock_proto::v1 as pb;
use raftlock_proto::v1::cluster_client::ClusterClient;
use raftlock_proto::v1::locks_client::LocksClient;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tonic::transport::Channel;

use super::{classify, err_value, mode_str, Leftover};
use crate::beliefs::Held;
use crate::clientlink::{ClientLinks, ClusterAddrs};
use crate::history::{Process, Recorder, Type};
use crate::raw::Creds;

/// The names the workload contends for.
pub const NAMES: [&str; 3] = ["bl/0", "bl/1", "bl/2"];
/// Their common prefix (what the watchers follow).
pub const PREFIX: &str = "bl/";
/// Contenders per run.
pub const CONTENDERS: u64 = 2;

/// Link ends of the contenders and the operator (after every worker's).
const CONTENDER_END_BASE: u64 = 1_500;
/// Process numbers of the contenders (each advances by 100 after an
/// unknown outcome).
const CONTENDER_PROCESS_BASE: u64 = 2_700_000_000;
/// Process numbers of the operator.
const OPERATOR_PROCESS_BASE: u64 = 2_750_000_000;
/// Process numbers of watch events (one per event).
const WATCH_PROCESS_BASE: u64 = 3_500_000_000;
/// Process numbers of `belief` records (one per belief).
const BELIEF_PROCESS_BASE: u64 = 3_600_000_000;
/// Process numbers of the ghost waiters and the `ghost` round records.
const GHOST_PROCESS_BASE: u64 = 3_800_000_000;
/// How long the worker waits for a name after its ghost waiter died
/// (milliseconds): less than [`GHOST_TTL_MS`], which a ghost's session
/// that kept the name would hold it for, and far more than the
/// milliseconds it takes when the node ends that session.
pub const GHOST_NEXT_WAIT_MS: u64 = 8_000;
/// The ttl of a ghost waiter's session (milliseconds): short enough that
/// a session whose end the node could not write (a fault) is gone before
/// the end-of-run audit gives up (twice the workers' ttl + 5 s).
pub const GHOST_TTL_MS: u64 = 10_000;

/// A path of the lease rule that a worker drives (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LeasePath {
    /// `Lock` + `SetSessionTtl` around the end of the count.
    TtlEnd,
    /// `Lock` + an early `SetSessionTtl` to a shorter ttl.
    TtlShorter,
    /// `Lock` retried with its nonce while held.
    Retry,
    /// The same across a leadership transfer.
    RetryFailover,
    /// A session ending with its process on flapping `KeepAlive` streams.
    Streams,
    /// `Lock` + one-shot `KeepAlive`s.
    Renewals,
    /// The Rust client's atomic multi-lock.
    Multi,
    /// The Rust client's upgrade and downgrade.
    Upgrade,
    /// The operator revoking workers' sessions.
    Revoke,
    /// A waiter whose process dies just before the hand-off.
    Ghost,
}

/// Every path, in order.
pub const ALL_PATHS: [LeasePath; 10] = [
    LeasePath::TtlEnd,
    LeasePath::TtlShorter,
    LeasePath::Retry,
    LeasePath::RetryFailover,
    LeasePath::Streams,
    LeasePath::Renewals,
    LeasePath::Multi,
    LeasePath::Upgrade,
    LeasePath::Revoke,
    LeasePath::Ghost,
];

impl LeasePath {
    /// As `--lease-paths` spells it.
    pub fn name(self) -> &'static str {
        match self {
            LeasePath::TtlEnd => "ttl-end",
            LeasePath::TtlShorter => "ttl-shorter",
            LeasePath::Retry => "retry",
            LeasePath::RetryFailover => "retry-failover",
            LeasePath::Streams => "streams",
            LeasePath::Renewals => "renewals",
            LeasePath::Multi => "multi",
            LeasePath::Upgrade => "upgrade",
            LeasePath::Revoke => "revoke",
            LeasePath::Ghost => "ghost",
        }
    }

    /// Parses `ttl-end,retry,...` (`all`: every path).
    pub fn parse_list(s: &str) -> anyhow::Result<Vec<LeasePath>> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "all" {
                out.extend(ALL_PATHS);
                continue;
            }
            match ALL_PATHS.iter().find(|p| p.name() == part) {
                Some(p) => out.push(*p),
                None => anyhow::bail!(
                    "unknown lease path {part:?} (expected {} or all)",
                    ALL_PATHS.map(LeasePath::name).join(", ")
                ),
            }
        }
        out.sort();
        out.dedup();
        anyhow::ensure!(!out.is_empty(), "--lease-paths names no path");
        Ok(out)
    }
}

/// Settings of the workload.
#[derive(Clone)]
pub struct LeaseOptions {
    /// The nodes' addresses when the run starts.
    pub addrs: ClusterAddrs,
    /// The client links, when the client-link nemesis runs.
    pub links: Option<Arc<ClientLinks>>,
    /// The client token, when the cluster has access control.
    pub token: Option<String>,
    /// The run's seed.
    pub seed: u64,
    /// Workers.
    pub concurrency: u64,
    /// The paths the workers drive (and whether the operator revokes).
    pub paths: Vec<LeasePath>,
    /// Where the cluster is (it moves after a restore).
    pub moved: watch::Receiver<ClusterAddrs>,
}

/// What the workload's tasks share.
struct Shared {
    rec: Recorder,
    opts: LeaseOptions,
    creds: Creds,
    stop: Arc<AtomicBool>,
    /// Sessions some worker holds a grant in now, by (generation,
    /// session): the operator revokes among them.
    holding: Mutex<BTreeMap<(u64, u64), u32>>,
    /// Process numbers of `belief` records.
    beliefs: AtomicU64,
}

impl Shared {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

// ---------------------------------------------------------------------
// Calls: one attempt after another at the node that leads.

/// How one attempt ended.
enum Reply<T> {
    /// Answered.
    Ok(T),
    /// Not the leader (not applied); the leader's id, if known.
    NotLeader(Option<u64>),
    /// Refused by the node with this code (the outcome is known).
    Refused(tonic::Code, String),
    /// No answer, or a transport failure: the outcome is unknown.
    Unknown(String),
}

impl<T> Reply<T> {
    /// The answer made into another.
    fn map<U>(self, f: impl FnOnce(T) -> U) -> Reply<U> {
        match self {
            Reply::Ok(t) => Reply::Ok(f(t)),
            Reply::NotLeader(h) => Reply::NotLeader(h),
            Reply::Refused(c, m) => Reply::Refused(c, m),
            Reply::Unknown(e) => Reply::Unknown(e),
        }
    }
}

type Attempt<T> = Pin<Box<dyn Future<Output = Reply<T>> + Send>>;

/// Where one attempt goes.
#[derive(Clone)]
struct Target {
    addr: String,
    channel: Channel,
    creds: Creds,
    token: Option<String>,
    within: Duration,
}

impl Target {
    fn locks(&self) -> LocksClient<crate::raw::Conn> {
        crate::raw::locks(self.channel.clone(), &self.creds)
    }

    fn cluster(&self) -> ClusterClient<crate::raw::Conn> {
        crate::raw::cluster(self.channel.clone(), &self.creds)
    }

    /// `POST /v1/locks/{rpc}` with `body`.
    async fn post(&self, rpc: &str, body: Value) -> Reply<Value> {
        let answer = crate::http::post(
            &self.addr,
            &format!("/v1/locks/{rpc}"),
            &body,
            self.token.as_deref(),
            self.within,
        )
        .await;
        from_http(answer)
    }
}

/// The codes with which a node refuses a request it did not apply (or
/// whose outcome the code tells).
fn refusal(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::NotFound
            | tonic::Code::InvalidArgument
            | tonic::Code::FailedPrecondition
            | tonic::Code::ResourceExhausted
            | tonic::Code::Aborted
            | tonic::Code::PermissionDenied
            | tonic::Code::Unauthenticated
            | tonic::Code::OutOfRange
            | tonic::Code::AlreadyExists
    )
}

fn from_grpc<T>(r: Result<tonic::Response<T>, tonic::Status>) -> Reply<T> {
    match r {
        Ok(r) => Reply::Ok(r.into_inner()),
        Err(s) if s.metadata().get(raftlock_proto::NOT_LEADER_KEY).is_some() => Reply::NotLeader(
            s.metadata()
                .get(raftlock_proto::LEADER_ID_KEY)
                .and_then(|v| v.to_str().ok()?.parse().ok()),
        ),
        Err(s) if refusal(s.code()) => Reply::Refused(s.code(), s.message().to_string()),
        Err(s) => Reply::Unknown(format!("{:?}: {}", s.code(), s.message())),
    }
}

/// A gRPC code from its name in an HTTP error body.
fn code_named(name: &str) -> Option<tonic::Code> {
    Some(match name {
        "NOT_FOUND" => tonic::Code::NotFound,
        "INVALID_ARGUMENT" => tonic::Code::InvalidArgument,
        "FAILED_PRECONDITION" => tonic::Code::FailedPrecondition,
        "RESOURCE_EXHAUSTED" => tonic::Code::ResourceExhausted,
        "ABORTED" => tonic::Code::Aborted,
        "PERMISSION_DENIED" => tonic::Code::PermissionDenied,
        "UNAUTHENTICATED" => tonic::Code::Unauthenticated,
        "OUT_OF_RANGE" => tonic::Code::OutOfRange,
        "ALREADY_EXISTS" => tonic::Code::AlreadyExists,
        _ => return None,
    })
}

fn from_http(r: Result<crate::http::Answer, String>) -> Reply<Value> {
    let a = match r {
        Ok(a) => a,
        Err(e) => return Reply::Unknown(e),
    };
    if a.status == 200 {
        return Reply::Ok(a.body);
    }
    if a.header(raftlock_proto::NOT_LEADER_KEY).is_some() {
        return Reply::NotLeader(
            a.header(raftlock_proto::LEADER_ID_KEY)
                .and_then(|v| v.parse().ok()),
        );
    }
    let message = a.body["message"].as_str().unwrap_or("").to_string();
    match a.body["code"].as_str().and_then(code_named) {
        Some(code) => Reply::Refused(code, message),
        None => Reply::Unknown(format!("HTTP {}: {}", a.status, a.body)),
    }
}

/// How a call ended: the last attempt's reply, the send time (ns) and
/// node of that attempt.
struct Called<T> {
    reply: Reply<T>,
    sent: u64,
    node: u64,
}

/// A task's way to the nodes of one cluster generation.
struct Conn {
    gen: u64,
    nodes: Vec<u64>,
    /// Node → the address this task dials (a client-link proxy, or the
    /// node itself).
    via: BTreeMap<u64, String>,
    channels: BTreeMap<u64, Channel>,
    creds: Creds,
    token: Option<String>,
    leader: Option<u64>,
    turn: usize,
}

impl Conn {
    async fn new(sh: &Shared, end: u64, addrs: &ClusterAddrs) -> Conn {
        let via = match &sh.opts.links {
            Some(l) => match l.via(end, addrs).await {
                Ok(via) => via,
                Err(e) => {
                    eprintln!("raftlock-jepsen: lease client {end} has no client links: {e:#}");
                    addrs.nodes.clone()
                }
            },
            None => addrs.nodes.clone(),
        };
        Conn {
            gen: addrs.gen,
            nodes: addrs.nodes.keys().copied().collect(),
            via,
            channels: BTreeMap::new(),
            creds: sh.creds.clone(),
            token: sh.opts.token.clone(),
            leader: None,
            turn: 0,
        }
    }

    fn target(&mut self, node: u64, within: Duration) -> Target {
        let addr = self.via.get(&node).cloned().unwrap_or_default();
        let channel = self
            .channels
            .entry(node)
            .or_insert_with(|| crate::raw::client_channel(&addr))
            .clone();
        Target {
            addr,
            channel,
            creds: self.creds.clone(),
            token: self.token.clone(),
            within,
        }
    }

    /// The node to try next: the leader if known, else the next in turn.
    fn next_node(&mut self) -> u64 {
        if let Some(l) = self.leader.filter(|l| self.nodes.contains(l)) {
            return l;
        }
        let n = self.nodes[self.turn % self.nodes.len()];
        self.turn += 1;
        n
    }

    /// Sends `attempt` to the node that leads, following "not the
    /// leader" answers and retrying after unknown outcomes (the requests
    /// sent this way are idempotent: a seq, a nonce, or none needed),
    /// until one is answered or refused or `budget` is spent. Each
    /// attempt is an operation `f` of `p`: `invoke` plus the node, and
    /// what `outcome` makes of an answer.
    #[allow(clippy::too_many_arguments)]
    async fn call<T>(
        &mut self,
        p: &mut Proc,
        f: &'static str,
        invoke: Value,
        budget: Duration,
        within: Duration,
        mut attempt: impl FnMut(Target) -> Attempt<T>,
        outcome: impl Fn(&T) -> (Type, Value),
    ) -> Called<T> {
        let deadline = tokio::time::Instant::now() + budget;
        loop {
            let node = self.next_node();
            let target = self.target(node, within);
            let mut value = invoke.clone();
            value["node"] = json!(node);
            value["gen"] = json!(self.gen);
            let sent = p.invoke(f, value);
            let reply = match tokio::time::timeout(within, attempt(target)).await {
                Ok(r) => r,
                Err(_) => Reply::Unknown(format!("no answer within {within:?}")),
            };
            let mut pause = Duration::ZERO;
            match &reply {
                Reply::Ok(t) => {
                    let (kind, v) = outcome(t);
                    p.complete(kind, v);
                    self.leader = Some(node);
                }
                Reply::Refused(code, message) => {
                    p.complete(
                        Type::Fail,
                        json!({"error": message, "code": format!("{code:?}")}),
                    );
                    self.leader = Some(node);
                }
                Reply::NotLeader(hint) => {
                    p.complete(
                        Type::Fail,
                        json!({"error": "not the leader", "leader": hint}),
                    );
                    self.leader = hint.filter(|h| *h != node);
                    if self.leader.is_none() {
                        pause = Duration::from_millis(50);
                    }
                }
                Reply::Unknown(e) => {
                    p.complete(Type::Info, json!({ "error": e }));
                    self.leader = None;
                    pause = Duration::from_millis(50);
                }
            }
            let last = matches!(reply, Reply::Ok(_) | Reply::Refused(..));
            if last || tokio::time::Instant::now() + pause >= deadline {
                return Called { reply, sent, node };
            }
            tokio::time::sleep(pause).await;
        }
    }
}

/// A task's process number (Jepsen's rule: after an unknown outcome the
/// task goes on under a new number) and its operation in flight.
struct Proc {
    rec: Recorder,
    process: u64,
    step: u64,
    open: String,
}

impl Proc {
    fn new(rec: &Recorder, process: u64, step: u64) -> Proc {
        Proc {
            rec: rec.clone(),
            process,
            step,
            open: String::new(),
        }
    }

    /// Records the invocation of `f`; the time it was recorded.
    fn invoke(&mut self, f: &str, value: Value) -> u64 {
        self.open = f.to_string();
        self.rec
            .record(Process::Client(self.process), Type::Invoke, f, value)
    }

    /// Records how the operation in flight ended.
    fn complete(&mut self, kind: Type, value: Value) {
        self.rec
            .record(Process::Client(self.process), kind, &self.open, value);
        if kind == Type::Info {
            self.process += self.step;
        }
    }
}

// ---------------------------------------------------------------------
// Beliefs.

/// A grant a client believes it holds, and its count.
struct Holding {
    lock: String,
    held: Held,
    session: u64,
    fence: u64,
    gen: u64,
    path: &'static str,
    /// Spans that ended when the count ran out (later restored).
    lapsed: Vec<(u64, u64)>,
    /// When the current span began.
    since: u64,
    /// The end of the count.
    until: u64,
}

impl Holding {
    /// A grant answered at `now` by a request sent at `sent` that started
    /// a lease of `length_ns`; `None` if that count had run out by the
    /// time the answer came (held up on the way: never believed).
    #[allow(clippy::too_many_arguments)]
    fn new(
        path: &'static str,
        lock: &str,
        held: Held,
        session: u64,
        fence: u64,
        gen: u64,
        sent: u64,
        length_ns: u64,
        now: u64,
    ) -> Option<Holding> {
        (sent + length_ns > now).then(|| Holding {
            lock: lock.to_string(),
            held,
            session,
            fence,
            gen,
            path,
            lapsed: Vec::new(),
            since: now,
            until: sent + length_ns,
        })
    }

    fn runs(&self, now: u64) -> bool {
        now < self.until
    }

    /// A lease-starting answer, arriving at `now`, to a request sent at
    /// `sent`, for a lease of `length_ns`: it extends the count, or, if
    /// the count had run out, restores the belief from `now`.
    fn answered(&mut self, sent: u64, length_ns: u64, now: u64) {
        let end = sent + length_ns;
        if now < self.until {
            self.until = self.until.max(end);
        } else if end > now {
            self.lapsed.push((self.since, self.until));
            self.since = now;
            self.until = end;
        }
    }

    /// A `SetSessionTtl` to a shorter ttl is about to be sent (at `now` or
    /// later): the count ends at `now + length_ns` at the latest.
    fn cut(&mut self, now: u64, length_ns: u64) {
        self.until = self.until.min((now + length_ns).max(self.since));
    }

    /// The belief ends at `end` (or where the count ran out, if sooner):
    /// recorded as a `belief` operation of process `process`.
    fn finish(self, sh: &Shared, process: u64, end: u64, why: &str) {
        let mut spans = self.lapsed.clone();
        spans.push((self.since, end.min(self.until).max(self.since)));
        let spans: Vec<Value> = spans.iter().map(|(a, b)| json!([a, b])).collect();
        let n = sh.beliefs.fetch_add(1, Ordering::Relaxed);
        let mut p = Proc::new(&sh.rec, BELIEF_PROCESS_BASE + n, 0);
        p.invoke(
            "belief",
            json!({"lock": self.lock, "mode": self.held.as_str(), "session": self.session,
                   "fence": self.fence, "gen": self.gen, "path": self.path, "process": process,
                   "spans": spans, "end": why}),
        );
        p.complete(Type::Ok, json!({}));
    }
}

/// Nanoseconds in `ms` milliseconds.
fn ms_ns(ms: u64) -> u64 {
    ms * 1_000_000
}

// ---------------------------------------------------------------------
// The requests.

fn mode_name(held: Held) -> &'static str {
    match held {
        Held::Exclusive => "MODE_EXCLUSIVE",
        Held::Shared => "MODE_SHARED",
    }
}

/// A `LockResponse` from its JSON.
fn lock_response(a: &Value) -> pb::LockResponse {
    use crate::http::n;
    pb::LockResponse {
        acquired: a["acquired"].as_bool().unwrap_or(false),
        fence: n(&a["fence"]),
        session_id: n(&a["session_id"]),
        ttl_ms: n(&a["ttl_ms"]),
        next_seq: n(&a["next_seq"]),
    }
}

fn lock_attempt(
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
struct Actor {
    sh: Arc<Shared>,
    /// Its link end (client-link proxies).
    end: u64,
    p: Proc,
    conn: Conn,
    rng: StdRng,
}

/// A grant taken with a one-call `Lock`.
struct Taken {
    h: Holding,
    nonce: u64,
    req: pb::LockRequest,
    http: bool,
}

impl Actor {
    fn now(&self) -> u64 {
        self.sh.rec.now_ns()
    }

    /// Moves to the restored cluster, if the restore nemesis moved it.
    async fn follow_moves(&mut self) {
        let addrs = self.sh.opts.moved.borrow().clone();
        if addrs.gen != self.conn.gen {
            self.conn = Conn::new(&self.sh, self.end, &addrs).await;
        }
    }

    async fn sleep_until_ns(&self, at: u64) {
        let now = self.now();
        if at > now {
            tokio::time::sleep(Duration::from_nanos(at - now)).await;
        }
    }

    fn hold(&self, h: &Holding) {
        *self
            .sh
            .holding
            .lock()
            .expect("holding lock poisoned")
            .entry((h.gen, h.session))
            .or_default() += 1;
    }

    fn let_go(&self, h: Holding, end: u64, why: &str) {
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
    async fn take(
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
    async fn unlock(&mut self, session: u64, name: &str, fence: u64, http: bool) {
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
    async fn hold_then_unlock(&mut self, h: Holding, http: bool) {
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

    // -----------------------------------------------------------------
    // The paths.

    async fn ttl_change(&mut self, name: &str, http: bool, at_the_end: bool) {
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
    async fn ghost(&mut self, slot: u64, http: bool) {
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

    async fn lock_retry(&mut self, name: &str, http: bool, failover: bool) {
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

    async fn renewals(&mut self, name: &str, http: bool) {
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

    async fn transfer(&mut self, to: u64) -> Option<u64> {
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

    /// A session that ends with its process, on flapping streams.
    async fn streams(&mut self, name: &str) {
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
async fn keep_alive_once(
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

fn keep_alive_outcome(a: &pb::KeepAliveResponse) -> (Type, Value) {
    let renewed = !a.expired && a.ttl_ms > 0;
    (
        Type::Ok,
        json!({"session": a.session_id, "renewed": renewed, "expired": a.expired,
               "ttl_ms": a.ttl_ms, "ask_id": a.ask_id}),
    )
}

// ---------------------------------------------------------------------
// The Rust client's paths.

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
    async fn multi(&mut self, client: &Client) {
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
    async fn upgrade(&mut self, client: &Client, name: &str) {
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

// ---------------------------------------------------------------------
// The tasks.

/// A worker: one of the enabled paths after another until told to stop.
async fn worker(sh: Arc<Shared>, slot: u64) -> Leftover {
    let addrs = sh.opts.moved.borrow().clone();
    let end = crate::clientlink::worker_end(slot);
    let conn = Conn::new(&sh, end, &addrs).await;
    let mut a = Actor {
        p: Proc::new(&sh.rec, slot, sh.opts.concurrency),
        rng: StdRng::seed_from_u64(sh.opts.seed.wrapping_mul(1_000_003).wrapping_add(slot)),
        sh: sh.clone(),
        end,
        conn,
    };
    let paths: Vec<LeasePath> = sh
        .opts
        .paths
        .iter()
        .copied()
        .filter(|p| *p != LeasePath::Revoke)
        .collect();
    let library = paths
        .iter()
        .any(|p| matches!(p, LeasePath::Multi | LeasePath::Upgrade));
    let mut client: Option<(u64, Client)> = None;
    while !sh.stopped() && !paths.is_empty() {
        a.follow_moves().await;
        if library && client.as_ref().is_none_or(|(g, _)| *g != a.conn.gen) {
            let addrs = sh.opts.moved.borrow().clone();
            match super::client_via(&sh.opts.links, sh.opts.token.clone(), end, &addrs).await {
                Ok(c) => client = Some((addrs.gen, c)),
                Err(e) => eprintln!("raftlock-jepsen: lease worker {slot}: no client: {e:#}"),
            }
        }
        let name = NAMES[a.rng.random_range(0..NAMES.len())];
        let http = a.rng.random_bool(0.4);
        let path = paths[a.rng.random_range(0..paths.len())];
        match path {
            LeasePath::TtlEnd => a.ttl_change(name, http, true).await,
            LeasePath::TtlShorter => a.ttl_change(name, http, false).await,
            LeasePath::Retry => a.lock_retry(name, http, false).await,
            LeasePath::RetryFailover => a.lock_retry(name, http, true).await,
            LeasePath::Streams => a.streams(name).await,
            LeasePath::Renewals => a.renewals(name, http).await,
            LeasePath::Multi | LeasePath::Upgrade => {
                let Some((_, c)) = client.clone() else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                if path == LeasePath::Multi {
                    a.multi(&c).await;
                } else {
                    a.upgrade(&c, name).await;
                }
            }
            LeasePath::Ghost => a.ghost(slot, http).await,
            LeasePath::Revoke => {}
        }
        tokio::time::sleep(Duration::from_millis(a.rng.random_range(1..=40))).await;
    }
    Leftover {
        process: a.p.process,
        session: None,
        rec: sh.rec.clone(),
    }
}

/// A contender: takes a name with a one-call `Lock` as soon as it can and
/// lets go at once, over and over.
async fn contender(sh: Arc<Shared>, k: u64) {
    let addrs = sh.opts.moved.borrow().clone();
    let end = CONTENDER_END_BASE + k;
    let conn = Conn::new(&sh, end, &addrs).await;
    let mut a = Actor {
        p: Proc::new(&sh.rec, CONTENDER_PROCESS_BASE + k, 100),
        rng: StdRng::seed_from_u64(sh.opts.seed ^ (0x636f << 16) ^ k),
        sh: sh.clone(),
        end,
        conn,
    };
    while !sh.stopped() {
        a.follow_moves().await;
        let name = NAMES[a.rng.random_range(0..NAMES.len())];
        let http = a.rng.random_bool(0.3);
        match a.take("contender", name, 2_000, 1_500, http).await {
            Some(t) => {
                tokio::time::sleep(Duration::from_millis(a.rng.random_range(1..=30))).await;
                let (session, fence) = (t.h.session, t.h.fence);
                let end = a.now();
                a.let_go(t.h, end, "unlock");
                a.unlock(session, name, fence, http).await;
            }
            None => {
                tokio::time::sleep(Duration::from_millis(a.rng.random_range(5..=50))).await;
            }
        }
    }
}

/// The operator: every 1-3 s, revokes a session some worker holds a grant
/// in now.
async fn operator(sh: Arc<Shared>) {
    let addrs = sh.opts.moved.borrow().clone();
    let end = CONTENDER_END_BASE + CONTENDERS;
    let conn = Conn::new(&sh, end, &addrs).await;
    let mut a = Actor {
        p: Proc::new(&sh.rec, OPERATOR_PROCESS_BASE, 1),
        rng: StdRng::seed_from_u64(sh.opts.seed ^ (0x6f70 << 16)),
        sh: sh.clone(),
        end,
        conn,
    };
    while !sh.stopped() {
        tokio::time::sleep(Duration::from_millis(a.rng.random_range(1_000..=3_000))).await;
        a.follow_moves().await;
        let gen = a.conn.gen;
        let sessions: Vec<u64> = sh
            .holding
            .lock()
            .expect("holding lock poisoned")
            .keys()
            .filter(|(g, _)| *g == gen)
            .map(|(_, s)| *s)
            .collect();
        if sessions.is_empty() {
            continue;
        }
        let session = sessions[a.rng.random_range(0..sessions.len())];
        a.conn
            .call(
                &mut a.p,
                "revoke",
                json!({ "session": session }),
                Duration::from_secs(15),
                Duration::from_secs(12),
                move |t: Target| -> Attempt<pb::RevokeSessionResponse> {
                    Box::pin(async move {
                        from_grpc(
                            t.cluster()
                                .revoke_session(pb::RevokeSessionRequest {
                                    session_id: session,
                                })
                                .await,
                        )
                    })
                },
                |r: &pb::RevokeSessionResponse| (Type::Ok, json!({"released": r.released})),
            )
            .await;
    }
}

/// Follows `Watch` of [`PREFIX`] on one node and records every event.
async fn watcher(
    sh: Arc<Shared>,
    node: u64,
    addr: String,
    gen: u64,
    events: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
) {
    while !done.load(Ordering::SeqCst) {
        let mut locks = crate::raw::locks(crate::raw::fresh_channel(&addr), &sh.creds);
        let opened = tokio::time::timeout(
            Duration::from_secs(1),
            locks.watch(pb::WatchRequest {
                name: String::new(),
                prefix: PREFIX.into(),
            }),
        )
        .await;
        if let Ok(Ok(stream)) = opened {
            let mut stream = stream.into_inner();
            loop {
                let next = tokio::time::timeout(Duration::from_millis(500), stream.message()).await;
                match next {
                    Ok(Ok(Some(e))) => {
                        let kind = super::keepalive::event_kind_name(e.kind);
                        let mode = match pb::Mode::try_from(e.mode) {
                            Ok(pb::Mode::Shared) => "shared",
                            Ok(pb::Mode::Semaphore) => "semaphore",
                            _ => "exclusive",
                        };
                        let mut p = Proc::new(
                            &sh.rec,
                            WATCH_PROCESS_BASE + events.fetch_add(1, Ordering::Relaxed),
                            0,
                        );
                        p.invoke("watch", json!({"node": node, "gen": gen}));
                        p.complete(
                            Type::Ok,
                            json!({"kind": kind, "name": e.name, "session": e.session_id,
                                   "fence": e.fence, "mode": mode, "index": e.index}),
                        );
                    }
                    Ok(_) => break,
                    Err(_) if done.load(Ordering::SeqCst) => return,
                    Err(_) => {}
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The watchers of every node of each cluster generation, until `stop`.
async fn watchers(sh: Arc<Shared>) {
    let events = Arc::new(AtomicU64::new(0));
    let mut moved = sh.opts.moved.clone();
    loop {
        let addrs = moved.borrow_and_update().clone();
        let done = Arc::new(AtomicBool::new(false));
        let mut tasks = tokio::task::JoinSet::new();
        for (&node, addr) in &addrs.nodes {
            tasks.spawn(watcher(
                sh.clone(),
                node,
                addr.clone(),
                addrs.gen,
                events.clone(),
                done.clone(),
            ));
        }
        let changed = loop {
            tokio::select! {
                c = moved.changed() => break c.is_ok(),
                _ = tokio::time::sleep(Duration::from_millis(200)) => {
                    if sh.stopped() {
                        break false;
                    }
                }
            }
        };
        done.store(true, Ordering::SeqCst);
        tasks.shutdown().await;
        if !changed {
            return;
        }
    }
}

/// The workload's tasks: the workers' handles (what the run waits for),
/// and a handle of the rest (contenders, operator, watchers), which stop
/// with `stop`.
pub struct Running {
    /// The workers.
    pub workers: Vec<tokio::task::JoinHandle<Leftover>>,
    /// Contenders, operator and watchers.
    pub others: tokio::task::JoinHandle<()>,
}

/// Starts the workload.
pub fn spawn(rec: &Recorder, opts: LeaseOptions, creds: Creds, stop: Arc<AtomicBool>) -> Running {
    let sh = Arc::new(Shared {
        rec: rec.clone(),
        creds,
        stop,
        holding: Mutex::new(BTreeMap::new()),
        beliefs: AtomicU64::new(0),
        opts,
    });
    let workers = (0..sh.opts.concurrency)
        .map(|slot| tokio::spawn(worker(sh.clone(), slot)))
        .collect();
    let others = tokio::spawn(async move {
        let mut set = tokio::task::JoinSet::new();
        for k in 0..CONTENDERS {
            set.spawn(contender(sh.clone(), k));
        }
        if sh.opts.paths.contains(&LeasePath::Revoke) {
            set.spawn(operator(sh.clone()));
        }
        set.spawn(watchers(sh.clone()));
        while set.join_next().await.is_some() {}
    });
    Running { workers, others }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_parse_and_all_means_every_one() {
        assert_eq!(
            LeasePath::parse_list("all").expect("parses"),
            ALL_PATHS.to_vec()
        );
        assert_eq!(
            LeasePath::parse_list("retry, ttl-end,retry").expect("parses"),
            vec![LeasePath::TtlEnd, LeasePath::Retry]
        );
        assert!(LeasePath::parse_list("retries").is_err());
        assert!(LeasePath::parse_list("").is_err());
    }

    fn holding(sent: u64, len: u64, now: u64) -> Option<Holding> {
        Holding::new("t", "x", Held::Exclusive, 1, 2, 0, sent, len, now)
    }

    #[test]
    fn a_count_runs_from_the_send_and_is_restored_from_the_answer() {
        assert!(
            holding(0, 100, 100).is_none(),
            "answered as the count ran out"
        );
        let mut h = holding(0, 100, 10).expect("counted");
        assert_eq!((h.since, h.until), (10, 100));
        // A renewal sent earlier than the last never shortens the count.
        h.answered(50, 100, 60);
        h.answered(20, 100, 70);
        assert_eq!(h.until, 150);
        // Answered after the count ran out: restored from its arrival.
        h.answered(140, 100, 160);
        assert_eq!(h.lapsed, vec![(10, 150)]);
        assert_eq!((h.since, h.until), (160, 240));
        // An answer whose count had run out when it came restores nothing.
        h.answered(100, 100, 250);
        assert_eq!((h.since, h.until), (160, 240));
    }
}
