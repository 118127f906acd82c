//! Calls: one attempt after another at the node that leads, and a task's
//! process numbers.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use raftlock_proto::v1::cluster_client::ClusterClient;
use raftlock_proto::v1::locks_client::LocksClient;
use serde_json::{json, Value};
use tonic::transport::Channel;

use super::Shared;
use crate::clientlink::ClusterAddrs;
use crate::history::{Process, Recorder, Type};
use crate::raw::Creds;

/// How one attempt ended.
pub(super) enum Reply<T> {
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
    pub(super) fn map<U>(self, f: impl FnOnce(T) -> U) -> Reply<U> {
        match self {
            Reply::Ok(t) => Reply::Ok(f(t)),
            Reply::NotLeader(h) => Reply::NotLeader(h),
            Reply::Refused(c, m) => Reply::Refused(c, m),
            Reply::Unknown(e) => Reply::Unknown(e),
        }
    }
}

pub(super) type Attempt<T> = Pin<Box<dyn Future<Output = Reply<T>> + Send>>;

/// Where one attempt goes.
#[derive(Clone)]
pub(super) struct Target {
    pub(super) addr: String,
    channel: Channel,
    pub(super) creds: Creds,
    token: Option<String>,
    within: Duration,
}

impl Target {
    pub(super) fn locks(&self) -> LocksClient<crate::raw::Conn> {
        crate::raw::locks(self.channel.clone(), &self.creds)
    }

    pub(super) fn cluster(&self) -> ClusterClient<crate::raw::Conn> {
        crate::raw::cluster(self.channel.clone(), &self.creds)
    }

    /// `POST /v1/locks/{rpc}` with `body`.
    pub(super) async fn post(&self, rpc: &str, body: Value) -> Reply<Value> {
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

pub(super) fn from_grpc<T>(r: Result<tonic::Response<T>, tonic::Status>) -> Reply<T> {
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
pub(super) struct Called<T> {
    pub(super) reply: Reply<T>,
    pub(super) sent: u64,
    pub(super) node: u64,
}

/// A task's way to the nodes of one cluster generation.
pub(super) struct Conn {
    pub(super) gen: u64,
    nodes: Vec<u64>,
    /// Node → the address this task dials (a client-link proxy, or the
    /// node itself).
    via: BTreeMap<u64, String>,
    channels: BTreeMap<u64, Channel>,
    creds: Creds,
    token: Option<String>,
    pub(super) leader: Option<u64>,
    turn: usize,
}

impl Conn {
    pub(super) async fn new(sh: &Shared, end: u64, addrs: &ClusterAddrs) -> Conn {
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

    pub(super) fn target(&mut self, node: u64, within: Duration) -> Target {
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
    pub(super) async fn call<T>(
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
pub(super) struct Proc {
    rec: Recorder,
    pub(super) process: u64,
    step: u64,
    open: String,
}

impl Proc {
    pub(super) fn new(rec: &Recorder, process: u64, step: u64) -> Proc {
        Proc {
            rec: rec.clone(),
            process,
            step,
            open: String::new(),
        }
    }

    /// Records the invocation of `f`; the time it was recorded.
    pub(super) fn invoke(&mut self, f: &str, value: Value) -> u64 {
        self.open = f.to_string();
        self.rec
            .record(Process::Client(self.process), Type::Invoke, f, value)
    }

    /// Records how the operation in flight ended.
    pub(super) fn complete(&mut self, kind: Type, value: Value) {
        self.rec
            .record(Process::Client(self.process), kind, &self.open, value);
        if kind == Type::Info {
            self.process += self.step;
        }
    }
}
