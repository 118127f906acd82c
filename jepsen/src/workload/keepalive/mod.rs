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

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use raftlock_proto::v1 as pb;
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::clientlink::{prober_end, ClientLinks, ClusterAddrs};
use crate::history::{Process, Recorder, Type};
use crate::raw::Creds;
use lanes::{probe, ProbeSet};
use prober::Prober;

mod lanes;
mod prober;

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
