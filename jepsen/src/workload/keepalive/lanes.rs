//! Keep-alive lanes (one stream per node, and the asks on it) and the
//! probes of abandoned sessions.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use raftlock_proto::v1 as pb;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::prober::StatusSource;
use super::{OneOp, Processes, ASK_TIMEOUT, PROBE_EVERY, PROBE_FOR};
use crate::history::{Recorder, Type};
use crate::raw::Creds;

/// An ask a lane must send.
pub(super) struct Ask {
    pub(super) session: u64,
}

/// The keep-alive stream to one node, and the asks on it.
#[allow(clippy::too_many_arguments)]
pub(super) async fn lane(
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

/// A prober's abandoned sessions: waiting for their expiry, then probed
/// until a deadline.
#[derive(Default)]
pub(super) struct ProbeSet {
    pub(super) abandoned: BTreeSet<u64>,
    probed: BTreeMap<u64, Instant>,
}

/// Probes a prober's abandoned sessions once their expiry has been applied
/// (from the watchers' `expired` events), every [`PROBE_EVERY`] for
/// [`PROBE_FOR`], on every node. Ends once `quit` says so and nothing is
/// left to probe (or [`PROBE_FOR`] after `quit`).
pub(super) async fn probe(
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
pub(super) fn self_ask(lanes: &BTreeMap<u64, mpsc::UnboundedSender<Ask>>, session: u64) {
    for lane in lanes.values() {
        let _ = lane.send(Ask { session });
    }
}
