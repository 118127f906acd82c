//! One simulated run: three raftlock nodes (the real `raftlock-node` on an
//! in-memory simulated disk) and lock workers (the real
//! `raftlock-client`), on turmoil's network and clock in 1 ms ticks, with
//! faults drawn from the seed; oracles checked every tick and at the end.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use raftlock_client::{Client, ClientOptions};
use raftlock_node::node::{Listeners, Node, NodeOptions, RaftTiming};
use raftlock_node::raft::backend::Storage;
use raftlock_node::raft::mem_log::MemDisk;
use raftlock_node::raft::{NodeAddrs, WatchReceiver as _};
use raftlock_node::transport::{Conn, Connector, Listener};
use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng as _};

use crate::oracle::{self, Grant};

/// The port every node serves on (each node is its own simulated host).
const PORT: u16 = 7001;
/// The lock every worker contends for.
const LOCK: &str = "L";
/// Sessions' lease.
const SESSION_TTL: Duration = Duration::from_secs(2);
/// How long the liveness phase may take to grant the lock, once every
/// fault is healed (simulated).
pub const LIVENESS_BOUND: Duration = Duration::from_secs(30);
/// Nodes in the cluster.
const NODES: u64 = 3;

/// What a run is made of.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Decides everything.
    pub seed: u64,
    /// Simulated milliseconds of load and faults (then the liveness phase).
    pub duration_ms: u64,
    /// Lock workers.
    pub workers: usize,
    /// Inject faults.
    pub faults: bool,
    /// The nodes' disks acknowledge syncs without keeping anything (a
    /// planted defect: the oracles must catch what crashes then lose).
    pub lying_disks: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            seed: 1,
            duration_ms: 20_000,
            workers: 3,
            faults: true,
            lying_disks: false,
        }
    }
}

impl Settings {
    /// The flags that give these settings (besides the seed).
    pub fn flags(&self) -> String {
        let d = Settings::default();
        let mut flags = String::new();
        if self.duration_ms != d.duration_ms {
            flags += &format!(" --duration-ms {}", self.duration_ms);
        }
        if self.workers != d.workers {
            flags += &format!(" --workers {}", self.workers);
        }
        if !self.faults {
            flags += " --no-faults";
        }
        if self.lying_disks {
            flags += " --lying-disks";
        }
        flags
    }
}

/// How a run went.
pub struct Outcome {
    /// `Err` with the first violation found.
    pub verdict: Result<(), String>,
    /// Every event, in order (for `--reproduce`).
    pub trace: Vec<String>,
    /// A hash of the trace: equal for two runs of one seed.
    pub hash: u64,
    /// Grants the workers were given.
    pub grants: usize,
    /// Faults injected.
    pub faults: usize,
}

/// What the run records as it goes; shared by the hosts, the workers and
/// the driver (all on one thread).
#[derive(Default)]
struct Record {
    trace: Vec<String>,
    grants: Vec<Grant>,
    /// Running nodes, by id: the node and its incarnation.
    nodes: BTreeMap<u64, (Rc<Node>, u64)>,
    /// The liveness probe got the lock.
    probe_granted: Option<u64>,
}

type Shared = Rc<RefCell<Record>>;

thread_local! {
    /// The simulated time, as the driver last saw it (outside a host,
    /// turmoil has no clock to ask).
    static DRIVER_NOW: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

thread_local! {
    /// The run in progress on this thread, for the panic report.
    static CURRENT: RefCell<Option<Settings>> = const { RefCell::new(None) };
}

/// The settings of the run in progress on this thread, if any.
pub fn current() -> Option<Settings> {
    CURRENT.with(|c| c.borrow().clone())
}

/// Simulated milliseconds since the start, in a host or in the driver.
pub fn now_ms() -> u64 {
    turmoil::sim_elapsed().map_or_else(|| DRIVER_NOW.with(|n| n.get()), |d| d.as_millis() as u64)
}

fn note(record: &Shared, line: String) {
    record
        .borrow_mut()
        .trace
        .push(format!("{:>7} {line}", now_ms()));
}

fn host(id: u64) -> String {
    format!("n{id}")
}

fn addr(id: u64) -> String {
    format!("{}:{PORT}", host(id))
}

/// Dials over turmoil's simulated TCP.
fn node_connector() -> Connector {
    Connector::new(|addr: String| async move {
        turmoil::net::TcpStream::connect(addr).await.map(Conn::new)
    })
}

fn client_options() -> ClientOptions {
    ClientOptions {
        connector: Some(raftlock_client::Connector::new(|addr: String| async move {
            turmoil::net::TcpStream::connect(addr).await
        })),
        ..ClientOptions::default()
    }
}

/// Starts node `id` on the current simulated host over `disk`, registers
/// it, and runs until its core fails.
async fn run_node(id: u64, disk: MemDisk, record: Shared, incarnation: u64) -> turmoil::Result {
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", PORT)).await?;
    let conns = futures::stream::unfold(listener, |l| async move {
        let next = l.accept().await.map(|(s, _)| Conn::new(s));
        Some((next, l))
    })
    .boxed();
    let peers = (1..=NODES)
        .map(|n| (n, NodeAddrs::shared(addr(n))))
        .collect();
    let opts = NodeOptions {
        id,
        advertise: addr(id),
        peer_advertise: None,
        data_dir: std::env::temp_dir().join(format!("raftlock-sim-{}/n{id}", std::process::id())),
        peers,
        init: id == 1,
        timing: RaftTiming {
            heartbeat: Duration::from_millis(100),
            election_timeout: (Duration::from_millis(300), Duration::from_millis(500)),
            // Snapshots are not simulated yet (kept in memory, lost with
            // the process): never take one.
            snapshot_every: u64::MAX / 2,
        },
        dial: BTreeMap::new(),
        tls: None,
        auth: Arc::new(raftlock_node::auth::Auth::new(None)),
        storage_faults: Default::default(),
        prefix_labels: Default::default(),
        connector: Some(node_connector()),
        storage: Storage::Memory(disk),
    };
    let node = match Node::start_with(opts, Listeners::client(Listener::Custom(conns))).await {
        Ok(node) => Rc::new(node),
        Err(e) => {
            note(&record, format!("node {id} failed to start: {e}"));
            return Err(e.to_string().into());
        }
    };
    note(
        &record,
        format!("node {id} started (incarnation {incarnation})"),
    );
    record
        .borrow_mut()
        .nodes
        .insert(id, (node.clone(), incarnation));
    let why = node.failed().await;
    note(&record, format!("node {id} failed: {why}"));
    record.borrow_mut().nodes.remove(&id);
    Err(why.into())
}

/// A worker: sessions, and in each, lock / hold / release until `stop_ms`.
async fn worker(n: usize, stop_ms: u64, mut rng: StdRng, record: Shared) -> turmoil::Result {
    let endpoints: Vec<String> = (1..=NODES).map(addr).collect();
    let client = Client::with_options(endpoints, client_options())?;
    while now_ms() < stop_ms {
        let session = match client.session(SESSION_TTL).await {
            Ok(s) => s,
            Err(e) => {
                note(&record, format!("worker {n}: no session: {e}"));
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        while now_ms() < stop_ms && session.is_valid() {
            let invoked = now_ms();
            match session.lock_timeout(LOCK, Duration::from_secs(3)).await {
                Ok(guard) => {
                    let granted = now_ms();
                    let fence = u64::from(guard.fence());
                    let hold = rng.random_range(1..60);
                    tokio::time::sleep(Duration::from_millis(hold)).await;
                    let until = now_ms();
                    let valid = session.is_valid();
                    note(
                        &record,
                        format!(
                            "worker {n}: fence {fence} asked {invoked} granted {granted} until \
                             {until} valid {valid}"
                        ),
                    );
                    record.borrow_mut().grants.push(Grant {
                        worker: n,
                        fence,
                        invoked,
                        granted,
                        until,
                        valid,
                    });
                    let _ = guard.release().await;
                }
                Err(e) => {
                    note(&record, format!("worker {n}: lock failed: {e}"));
                    tokio::time::sleep(Duration::from_millis(rng.random_range(5..50))).await;
                }
            }
        }
        let _ = session.close().await;
    }
    // Keep the client (and its connections) until the probe is done: a
    // client torn down meanwhile closed its connections at times that
    // varied from run to run of one seed.
    while record.borrow().probe_granted.is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// The liveness probe: once faults are off, a fresh session gets the lock
/// within [`LIVENESS_BOUND`].
async fn probe(start_ms: u64, record: Shared) -> turmoil::Result {
    tokio::time::sleep(Duration::from_millis(start_ms.saturating_sub(now_ms()))).await;
    let endpoints: Vec<String> = (1..=NODES).map(addr).collect();
    let client = Client::with_options(endpoints, client_options())?;
    let started = now_ms();
    let deadline = tokio::time::Instant::now() + LIVENESS_BOUND;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err("liveness: no grant within the bound".into());
        }
        let attempt = async {
            let session = client.session(SESSION_TTL).await?;
            let guard = session.lock_timeout(LOCK, left).await?;
            Ok::<_, raftlock_client::Error>(u64::from(guard.fence()))
        };
        match tokio::time::timeout(left, attempt).await {
            Ok(Ok(fence)) => {
                note(
                    &record,
                    format!("probe: fence {fence} after {} ms", now_ms() - started),
                );
                record.borrow_mut().probe_granted = Some(fence);
                return Ok(());
            }
            Ok(Err(e)) => {
                note(&record, format!("probe: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(_) => return Err("liveness: no grant within the bound".into()),
        }
    }
}

/// A fault in force, to be undone at a time.
enum Undo {
    Repair(String, String),
    Release(String, String),
    Bounce(u64),
}

/// FNV-1a, 64 bits: a stable hash of the trace across processes.
fn fnv(bytes: &[u8], mut h: u64) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// Oracles checked every tick on the running nodes.
#[derive(Default)]
struct Watch {
    leaders: oracle::Leaders,
    committed: oracle::Committed,
    fences: oracle::Fences,
    /// Per node and incarnation: applied entries already checked.
    checked: BTreeMap<(u64, u64), u64>,
    /// The last (term, leader) each node reported, to trace changes.
    seen: BTreeMap<u64, (u64, Option<u64>)>,
}

impl Watch {
    fn tick(&mut self, record: &Shared, disks: &BTreeMap<u64, MemDisk>) -> Result<(), String> {
        let nodes: Vec<(u64, Rc<Node>, u64)> = record
            .borrow()
            .nodes
            .iter()
            .map(|(id, (n, inc))| (*id, n.clone(), *inc))
            .collect();
        for (id, node, incarnation) in nodes {
            let m = node.raft.metrics().borrow_watched().clone();
            if self.seen.get(&id) != Some(&(m.current_term, m.current_leader)) {
                self.seen.insert(id, (m.current_term, m.current_leader));
                note(
                    record,
                    format!(
                        "node {id}: term {} leader {:?} ({:?})",
                        m.current_term, m.current_leader, m.state
                    ),
                );
            }
            if m.state == openraft::ServerState::Leader {
                self.leaders.observe(m.current_term, id)?;
            }
            let applied = m.last_applied.map_or(0, |l| l.index);
            let from = self.checked.get(&(id, incarnation)).map_or(1, |c| c + 1);
            for index in from..=applied {
                let Some(bytes) = disks[&id].log_entry(index) else {
                    continue;
                };
                self.committed.observe(id, index, fnv(&bytes, FNV_START))?;
            }
            self.checked
                .insert((id, incarnation), applied.max(from - 1));
            let fence = node.shared.read(|a| a.table.stats().last_fence);
            self.fences.observe(id, incarnation, fence)?;
        }
        Ok(())
    }
}

/// Runs one simulation.
pub fn run(settings: &Settings) -> Outcome {
    // Every random choice of the node and client code on this thread (ids,
    // nonces, jitter), of turmoil (latencies, tokio's scheduler), and of
    // the faults below, comes from the seed.
    CURRENT.with(|c| *c.borrow_mut() = Some(settings.clone()));
    raftlock_node::random::seed(settings.seed);
    raftlock_client::random::seed(settings.seed.wrapping_add(1));
    let mut faults_rng = StdRng::seed_from_u64(settings.seed ^ 0x5eed_fa17);
    let total = Duration::from_millis(settings.duration_ms) + LIVENESS_BOUND * 2;
    let mut sim = turmoil::Builder::new()
        .rng_seed(settings.seed)
        .tick_duration(Duration::from_millis(1))
        .simulation_duration(total + Duration::from_secs(10))
        .min_message_latency(Duration::from_micros(200))
        .max_message_latency(Duration::from_millis(5))
        .tcp_capacity(1 << 16)
        .build();
    let record: Shared = Rc::default();
    let mut disks = BTreeMap::new();
    let mut incarnations: BTreeMap<u64, Rc<RefCell<u64>>> = BTreeMap::new();
    for id in 1..=NODES {
        let disk = MemDisk::new();
        if settings.lying_disks {
            disk.lie_about_syncs();
        }
        disks.insert(id, disk.clone());
        let incarnation = Rc::new(RefCell::new(0u64));
        incarnations.insert(id, incarnation.clone());
        let record = record.clone();
        sim.host(host(id), move || {
            let inc = {
                let mut i = incarnation.borrow_mut();
                *i += 1;
                *i
            };
            run_node(id, disk.clone(), record.clone(), inc)
        });
    }
    let stop_ms = settings.duration_ms;
    for n in 0..settings.workers {
        let rng = StdRng::seed_from_u64(settings.seed.wrapping_mul(31).wrapping_add(n as u64));
        sim.client(format!("w{n}"), worker(n, stop_ms, rng, record.clone()));
    }
    // Registered now (it waits for the end of the faults): the run ends
    // when every client has.
    sim.client("probe", probe(stop_ms, record.clone()));
    let mut watch = Watch::default();
    let mut undo: Vec<(u64, Undo)> = Vec::new();
    let mut down: Option<u64> = None;
    let mut faults = 0usize;
    let mut probing = false;
    let verdict = loop {
        match sim.step() {
            Ok(true) => break Ok(()),
            Ok(false) => {}
            Err(e) => break Err(format!("a simulated host or client failed: {e}")),
        }
        let now = now_ms_of(&sim);
        DRIVER_NOW.with(|n| n.set(now));
        if let Err(e) = watch.tick(&record, &disks) {
            break Err(e);
        }
        // Undo faults that are due.
        let mut i = 0;
        while i < undo.len() {
            if undo[i].0 <= now {
                let (_, u) = undo.remove(i);
                apply_undo(&mut sim, &record, u, &mut down);
            } else {
                i += 1;
            }
        }
        if now >= stop_ms && !probing {
            // Faults off: heal everything, then the liveness probe.
            for (_, u) in undo.drain(..) {
                apply_undo(&mut sim, &record, u, &mut down);
            }
            note(&record, "faults off; the liveness probe starts".into());
            probing = true;
        }
        if settings.faults && !probing && faults_rng.random_bool(0.002) {
            faults += 1;
            inject(
                &mut sim,
                &mut faults_rng,
                &record,
                &disks,
                &mut undo,
                &mut down,
                now,
            );
        }
    };
    let (trace, grants, probe_granted) = {
        let r = record.borrow();
        (r.trace.clone(), r.grants.clone(), r.probe_granted)
    };
    let verdict = verdict
        .and_then(|()| oracle::mutual_exclusion(&grants))
        .and_then(|()| oracle::fence_order(&grants))
        .and_then(|()| match probe_granted {
            Some(_) => Ok(()),
            None => Err("liveness: the probe never got the lock".into()),
        });
    let mut hash = FNV_START;
    for line in &trace {
        hash = fnv(line.as_bytes(), hash);
        hash = fnv(b"\n", hash);
    }
    // Let go of the nodes (and their tasks) before the next run.
    record.borrow_mut().nodes.clear();
    drop(sim);
    CURRENT.with(|c| *c.borrow_mut() = None);
    Outcome {
        verdict,
        trace,
        hash,
        grants: grants.len(),
        faults,
    }
}

fn now_ms_of(sim: &turmoil::Sim<'_>) -> u64 {
    sim.elapsed().as_millis() as u64
}

fn apply_undo(sim: &mut turmoil::Sim<'_>, record: &Shared, u: Undo, down: &mut Option<u64>) {
    match u {
        Undo::Repair(a, b) => {
            note(record, format!("repair {a} <-> {b}"));
            sim.repair(a.as_str(), b.as_str());
        }
        Undo::Release(a, b) => {
            note(record, format!("release {a} <-> {b}"));
            sim.release(a.as_str(), b.as_str());
        }
        Undo::Bounce(id) => {
            note(record, format!("restart node {id}"));
            sim.bounce(host(id));
            *down = None;
        }
    }
}

/// One fault, drawn from `rng`: a partition of a node from the others, a
/// held link, or a crash (losing a random prefix of the disk's unsynced
/// writes) with a restart after 0-300 ms or after a long downtime.
#[allow(clippy::too_many_arguments)]
fn inject(
    sim: &mut turmoil::Sim<'_>,
    rng: &mut StdRng,
    record: &Shared,
    disks: &BTreeMap<u64, MemDisk>,
    undo: &mut Vec<(u64, Undo)>,
    down: &mut Option<u64>,
    now: u64,
) {
    let id = rng.random_range(1..=NODES);
    match rng.random_range(0..3) {
        0 => {
            let other = (id % NODES) + 1;
            let (a, b) = (host(id), host(other));
            let lasts = rng.random_range(100..3_000);
            note(record, format!("partition {a} <-> {b} for {lasts} ms"));
            sim.partition(a.as_str(), b.as_str());
            undo.push((now + lasts, Undo::Repair(a, b)));
        }
        1 => {
            let other = (id % NODES) + 1;
            let (a, b) = (host(id), host(other));
            let lasts = rng.random_range(50..1_500);
            note(record, format!("hold {a} <-> {b} for {lasts} ms"));
            sim.hold(a.as_str(), b.as_str());
            undo.push((now + lasts, Undo::Release(a, b)));
        }
        _ => {
            if down.is_some() {
                return;
            }
            let disk = &disks[&id];
            let pending = disk.pending_writes();
            let keep = rng.random_range(0..=pending);
            let after = if rng.random_bool(0.7) {
                rng.random_range(0..=300)
            } else {
                rng.random_range(1_000..8_000)
            };
            note(
                record,
                format!(
                    "crash node {id} (keeps {keep} of {pending} unsynced writes), restart in \
                     {after} ms"
                ),
            );
            record.borrow_mut().nodes.remove(&id);
            sim.crash(host(id));
            disk.crash(keep);
            *down = Some(id);
            undo.push((now + after, Undo::Bounce(id)));
        }
    }
}
