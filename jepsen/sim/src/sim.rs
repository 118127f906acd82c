//! One simulated run: three raftlock nodes (the real `raftlock-node` on an
//! in-memory simulated disk) and lock workers (the real
//! `raftlock-client`), on turmoil's network and clock in 1 ms ticks, with
//! faults drawn from the seed; oracles checked every tick and at the end.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use raftlock_client::ClientOptions;
use raftlock_node::node::Node;
use raftlock_node::raft::log_store::MemDisk;
use raftlock_node::transport::{Conn, Connector};
use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng as _};

use crate::belief;
use crate::oracle::{self, Grant, Renewal, Serving};
use crate::shared;

mod believers;
mod clients;
mod faults;
mod holders;
mod host;
mod operator;
mod watch;

use clients::{health_prober, hostile_peer, keepalive_asker, probe, session_opener, worker};
use faults::{apply_undo, crash, inject, replace, Down, Undo};
use host::start_host;
use operator::restorer;
use watch::Watch;

/// The port every node serves on (each node is its own simulated host).
const PORT: u16 = 7001;
/// Nodes build a snapshot every this many applied entries.
const SNAPSHOT_EVERY: u64 = 100;
/// Entries kept behind a snapshot: more than a node lags in most
/// downtimes, fewer than in the longest (and than a fresh node lacks).
/// With 20, openraft 0.10.0-alpha.37's replication tripped its own
/// assertion about once in 600 seeds (a purge racing a restarted
/// stream: docs/testing/simulator.md, "openraft's replication reads a
/// range a purge just removed", worked around since), which says
/// nothing about raftlock.
const LOGS_TO_KEEP: u64 = 200;
/// The lock every worker contends for.
const LOCK: &str = "L";
/// Sessions' lease.
const SESSION_TTL: Duration = Duration::from_secs(2);
/// The longest a message takes on a calm link (the shortest: 0.2 ms).
const MAX_LATENCY: Duration = Duration::from_millis(5);
/// How long the liveness phase may take to grant the lock, once every
/// fault is healed (simulated).
pub const LIVENESS_BOUND: Duration = Duration::from_secs(30);

/// How long every running member may take, from the liveness probe's grant
/// on, to apply what the leader had committed then: a follower that stops
/// getting entries for good (a replication stream looping on a stale
/// payload, say) fails the run instead of going unseen while a quorum
/// without it grants.
pub const CATCH_UP_BOUND: Duration = Duration::from_secs(10);
thread_local! {
    /// Nodes in the cluster of the run in progress (`Settings::nodes`).
    static NODES: std::cell::Cell<u64> = const { std::cell::Cell::new(3) };
}

/// Nodes in the cluster of the run in progress: `n1`..`nN`.
fn nodes() -> u64 {
    NODES.with(|n| n.get())
}
/// Keep-alive probers that open sessions and abandon them (each node has
/// its asker besides).
const PROBERS: usize = 2;
/// The probers' session ttl (the smallest the server accepts).
const PROBE_TTL_MS: u64 = 1_000;
/// How long after an abandoned session's lease lapsed (counted from the
/// open's answer) the askers start: the leader's expiry is proposed by
/// then, so renewals before the end is applied are rare.
const PROBE_GRACE_MS: u64 = 30;
/// How long a prober keeps asking to renew a session it abandoned.
const PROBE_ASKS_FOR_MS: u64 = 2_500;
/// How often an asker asks its node, and the health prober every node.
const PROBE_EVERY_MS: u64 = 20;
/// Believers (`believers`): raw protocol clients on every lease path.
const BELIEVERS: usize = 2;
/// The host of the holder whose session ends with its process.
const BOUND_HOLDER: &str = "e0";
/// The names clients record beliefs on; the driver records every grant
/// of them.
const BELIEF_NAMES: [&str; 7] = [LOCK, "B0", "B1", "E", "M1", "M2", "U"];

/// What a run is made of.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Decides everything.
    pub seed: u64,
    /// Simulated milliseconds of load and faults (then the liveness phase).
    pub duration_ms: u64,
    /// Lock workers.
    pub workers: usize,
    /// Nodes in the cluster (3 or 5).
    pub nodes: u64,
    /// Inject faults.
    pub faults: bool,
    /// The nodes' disks acknowledge syncs without keeping anything (a
    /// planted defect: the oracles must catch what crashes then lose).
    pub lying_disks: bool,
    /// When the faults stop, one follower is cut off from every node for
    /// good (a planted defect: a quorum without it still grants, and the
    /// catch-up oracle must fail the run).
    pub stranded_follower: bool,
    /// The paths of the lease rule the belief clients drive (see
    /// [`PATHS`]): all of them unless told otherwise.
    pub paths: Vec<String>,
    /// Stall the driver's thread for short stretches of real time between
    /// steps, at moments no seed decides. A run of a seed must not change:
    /// the determinism check runs its second copy this way, so a read of
    /// the machine's clock somewhere in the stack shows up on an idle
    /// machine, not only under load. (Not a setting of the run: `flags`
    /// leaves it out.)
    pub stall_real_time: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            seed: 1,
            duration_ms: 20_000,
            workers: 3,
            nodes: 3,
            faults: true,
            lying_disks: false,
            stranded_follower: false,
            paths: PATHS.iter().map(|p| p.to_string()).collect(),
            stall_real_time: false,
        }
    }
}

/// The paths of the lease rule the belief clients can drive:
/// `ttl` (a `SetSessionTtl` at the end of a lease), `retry` (a `Lock`
/// retried with its nonce), `streams` (sessions that end with their
/// process, on one or two `KeepAlive` streams), `renewals` (one-shot
/// `KeepAlive`s), `ghost` (a waiting `Lock` whose caller goes away just
/// before the hand-off), `revoke` (an operator revoking holders),
/// `transfer` (an operator moving the leadership away and back), `bound`
/// (the Rust client's process-bound sessions, their links cut at times),
/// `library` (the Rust client's atomic requests, upgrades and downgrades).
pub const PATHS: [&str; 9] = [
    "ttl", "retry", "streams", "renewals", "ghost", "revoke", "transfer", "bound", "library",
];

impl Settings {
    /// Whether the belief clients drive `path`.
    pub fn drives(&self, path: &str) -> bool {
        self.paths.iter().any(|p| p == path)
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
        if self.nodes != d.nodes {
            flags += &format!(" --nodes {}", self.nodes);
        }
        if !self.faults {
            flags += " --no-faults";
        }
        if self.lying_disks {
            flags += " --lying-disks";
        }
        if self.stranded_follower {
            flags += " --stranded-follower";
        }
        if self.paths != d.paths {
            flags += &format!(" --paths {}", self.paths.join(","));
        }
        flags
    }
}

/// How a run went.
pub struct Outcome {
    /// `Err` with the first violation found.
    pub verdict: Result<(), String>,
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
    /// The workers' operations, for the harness's checkers (`shared`).
    history: shared::History,
    /// Running nodes, by id: the node and its incarnation.
    nodes: BTreeMap<u64, (Rc<Node>, u64)>,
    /// The liveness probe got the lock.
    probe_granted: Option<u64>,
    /// The catch-up check, from the liveness probe's grant on.
    catch_up: Option<CatchUp>,
    /// Nodes whose process ended (fail-stop) and that the supervisor has
    /// not restarted yet.
    exited: Vec<u64>,
    /// Sessions the keep-alive probers opened and abandoned, and when
    /// their open was answered.
    abandoned: BTreeMap<u64, u64>,
    /// "Renewed" answers to the probers, not judged yet.
    renewals: Vec<Renewal>,
    /// SERVING answers to the health prober, not judged yet.
    servings: Vec<Serving>,
    /// The leader the driver saw last.
    leader: Option<u64>,
    /// The cluster's members as the operator left them (node ids; each
    /// runs on host `n<id>`): the first nodes, less those removed, plus
    /// those added.
    members: Vec<u64>,
    /// Nodes whose snapshot file the driver tore or corrupted while they
    /// were down: they must refuse to start.
    damaged: BTreeMap<u64, String>,
    /// Nodes that refused their damaged snapshot file, or their log, at
    /// start (the operator replaces them).
    refused: Vec<u64>,
    /// Nodes whose newest durable log writes the driver took back while
    /// they were down, not judged yet: how.
    log_damage: BTreeMap<u64, String>,
    /// Nodes whose log was ever damaged so (a refusal of the log is right
    /// only there).
    log_damaged_ever: std::collections::BTreeSet<u64>,
    /// Nodes whose damaged log forgot what they had acknowledged: they
    /// must refuse to start. How, and what they forgot.
    lost_log: BTreeMap<u64, String>,
    /// Nodes removed from the cluster: never started again.
    retired: std::collections::BTreeSet<u64>,
    /// The operator's replacements finished: (removed, added).
    replaced: Vec<(u64, u64)>,
    /// When the operator's removal of each node was answered.
    removed_at: BTreeMap<u64, u64>,
    /// A violation found inside a host (a node that loaded a damaged
    /// snapshot file).
    violation: Option<String>,
    /// The workers may start: the cluster is up, and restored if the run
    /// restores a backup first.
    ready: bool,
    /// The run restored a backup with this fence counter after it.
    restored_fence: Option<u64>,
    /// The liveness probe was refused because fences ran out.
    probe_exhausted: bool,
    /// What every client believed it held, and when (the belief oracle).
    beliefs: Vec<belief::Belief>,
    /// Every grant of the names clients record beliefs on, as first seen
    /// applied on a node.
    granted: belief::Grants,
    /// The sessions believers hold grants in now (for the revoker).
    holding: believers::Holdings,
    /// Ghost waiters: the name each waited for, when its `Lock` was sent
    /// and when its caller went away (us).
    ghosts: Vec<Ghost>,
    /// Leadership round trips the operator completed.
    round_trips: u64,
    /// Sessions that end with their process whose process died: the
    /// session, when its last stream ended (simulated microseconds) and
    /// its grace (ms); not judged yet.
    dead: Vec<(u64, u64, u64)>,
    /// True while the operator is moving the leadership.
    transferring: bool,
    /// The operator's leadership round trips are part of this run
    /// (`--paths` has `transfer`).
    round_trips_allowed: bool,
    /// True while the bound holder whose links get cut holds its name.
    bound_holding: bool,
}

impl Record {
    /// The incarnation of node `id` now running, if it runs.
    fn incarnation(&self, id: u64) -> Option<u64> {
        self.nodes.get(&id).map(|(_, inc)| *inc)
    }
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

thread_local! {
    /// Print each trace line as it is noted (`--reproduce`: a run that
    /// ends in a panic still shows what led to it).
    static ECHO: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Prints every trace line as it is noted, from now on, on this thread.
pub fn echo_trace() {
    ECHO.with(|e| e.set(true));
}

/// Where the nodes' data directories are (they hold nothing: the log is on
/// a `MemDisk`, but a node makes its directory and looks for a restore
/// there). Named by the process, so that runs in parallel do not share
/// it; the trace names it `<data>`, so that two runs of a seed compare
/// equal.
fn data_root() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("raftlock-sim-{}", std::process::id()))
}

fn note(record: &Shared, line: String) {
    let root = data_root();
    let line = line.replace(&*root.to_string_lossy(), "<data>");
    let line = format!("{:>7} {line}", now_ms());
    if ECHO.with(|e| e.get()) {
        println!("{line}");
    }
    record.borrow_mut().trace.push(line);
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

/// FNV-1a, 64 bits: a stable hash of the trace across processes.
fn fnv(bytes: &[u8], mut h: u64) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// The catch-up check (see [`CATCH_UP_BOUND`]).
#[derive(Clone, Copy)]
struct CatchUp {
    /// The leader's commit index at the liveness probe's grant.
    target: u64,
    /// By when (ms) every running member must have applied it.
    by: u64,
    /// Every running member has.
    done: bool,
}

/// A ghost waiter not judged yet (simulated microseconds).
struct Ghost {
    /// The name it waited for.
    name: String,
    /// When its `Lock` was sent.
    sent: u64,
    /// When its caller went away.
    gone: u64,
}

/// Runs one simulation.
pub fn run(settings: &Settings) -> Outcome {
    // Every run's wall clock starts at the same instant.
    crate::wall_clock::set_ms(0);
    // Every random choice of the node and client code on this thread (ids,
    // nonces, jitter), of turmoil (latencies, tokio's scheduler), and of
    // the faults below, comes from the seed.
    CURRENT.with(|c| *c.borrow_mut() = Some(settings.clone()));
    NODES.with(|n| n.set(settings.nodes));
    raftlock_node::random::seed(settings.seed);
    // Blocking work (checking a snapshot sent in, say) inline: a pool
    // thread would finish at a time no seed decides.
    raftlock_node::blocking::run_inline();
    raftlock_client::random::seed(settings.seed.wrapping_add(1));
    let mut faults_rng = StdRng::seed_from_u64(settings.seed ^ 0x5eed_fa17);
    let total = Duration::from_millis(settings.duration_ms) + LIVENESS_BOUND * 2;
    let mut sim = turmoil::Builder::new()
        .rng_seed(settings.seed)
        .tick_duration(Duration::from_millis(1))
        .simulation_duration(total + Duration::from_secs(10))
        .min_message_latency(Duration::from_micros(200))
        .max_message_latency(MAX_LATENCY)
        .tcp_capacity(1 << 16)
        .build();
    let record: Shared = Rc::default();
    record.borrow_mut().members = (1..=nodes()).collect();
    let mut disks = BTreeMap::new();
    for id in 1..=nodes() {
        let disk = MemDisk::new();
        if settings.lying_disks {
            disk.lie_about_syncs();
        }
        disks.insert(id, disk.clone());
        start_host(&mut sim, id, disk, &record);
    }
    // Membership changes, snapshot damage and full disks on every node
    // draw from a stream of their own.
    let mut ops_rng = StdRng::seed_from_u64(settings.seed ^ 0x0e7a_70b5);
    // A quarter of the runs start from a restored backup whose fence
    // counter is near the bound: a few hundred fences left (the run may
    // use them all: grants must then be refused, never wrap or pass it),
    // or up to a few hundred thousand.
    if settings.faults && ops_rng.random_bool(0.25) {
        let left = if ops_rng.random_bool(0.5) {
            ops_rng.random_range(1..400)
        } else {
            ops_rng.random_range(400..300_000)
        };
        sim.client(
            "restorer",
            restorer(left, settings.duration_ms, record.clone()),
        );
    } else {
        record.borrow_mut().ready = true;
    }
    let mut replacing: Option<(u64, u64)> = None;
    let mut next_id = nodes() + 1;
    let stop_ms = settings.duration_ms;
    for n in 0..settings.workers {
        let rng = StdRng::seed_from_u64(settings.seed.wrapping_mul(31).wrapping_add(n as u64));
        sim.client(
            format!("w{n}"),
            worker(n, settings.workers, stop_ms, rng, record.clone()),
        );
    }
    for n in 0..PROBERS {
        sim.client(
            format!("opener{n}"),
            session_opener(n, stop_ms, record.clone()),
        );
    }
    for id in 1..=nodes() {
        sim.client(
            format!("asker{id}"),
            keepalive_asker(id, stop_ms, record.clone()),
        );
    }
    sim.client("health", health_prober(stop_ms, record.clone()));
    // The clients of the belief oracle: every path of the lease rule.
    let paths: Vec<&'static str> = PATHS
        .iter()
        .copied()
        .filter(|p| settings.drives(p))
        .collect();
    let raw: Vec<&'static str> = paths
        .iter()
        .copied()
        .filter(|p| believers::RAW_PATHS.contains(p))
        .collect();
    if !raw.is_empty() {
        sim.client(
            "contender",
            believers::contender(
                stop_ms,
                StdRng::seed_from_u64(settings.seed ^ 0xc0_e7e4),
                record.clone(),
            ),
        );
        for n in 0..BELIEVERS {
            let rng = StdRng::seed_from_u64(settings.seed ^ (0xbe11_e7e0 + n as u64));
            sim.client(
                format!("b{n}"),
                believers::believer(n, stop_ms, raw.clone(), rng, record.clone()),
            );
        }
    }
    record.borrow_mut().round_trips_allowed = settings.drives("transfer");
    if settings.drives("transfer") {
        sim.client(
            "transferer",
            believers::transferer(
                stop_ms,
                StdRng::seed_from_u64(settings.seed ^ 0x7a45_fe7e),
                record.clone(),
            ),
        );
    }
    if settings.drives("revoke") {
        sim.client(
            "revoker",
            believers::revoker(
                stop_ms,
                StdRng::seed_from_u64(settings.seed ^ 0x7e70_6e7e),
                record.clone(),
            ),
        );
    }
    if settings.drives("bound") {
        // Two, so that one's session ending passes the name to the other;
        // only the first one's links are cut.
        for (n, name) in [BOUND_HOLDER, "e1"].into_iter().enumerate() {
            sim.client(
                name,
                holders::bound_holder(
                    name,
                    stop_ms,
                    StdRng::seed_from_u64(settings.seed ^ (0xb0_0d + n as u64)),
                    record.clone(),
                ),
            );
        }
    }
    if settings.drives("library") {
        sim.client(
            "p0",
            holders::path_holder(
                0,
                stop_ms,
                StdRng::seed_from_u64(settings.seed ^ 0x9a_7400),
                record.clone(),
            ),
        );
    }
    // The bound holder's links to the nodes are held at times (a network
    // cut between a client and the cluster), drawn from a stream of their
    // own so that the other faults stay as they were.
    let mut links_rng = StdRng::seed_from_u64(settings.seed ^ 0x11_4c5);
    let mut links_held_until = 0u64;
    let hostile_rng = StdRng::seed_from_u64(settings.seed ^ 0x0bad_9ee4);
    sim.client(
        "hostile",
        hostile_peer(stop_ms, hostile_rng, record.clone()),
    );
    // Registered now (it waits for the end of the faults): the run ends
    // when every client has.
    sim.client("probe", probe(stop_ms, record.clone()));
    // Keeps the run going until every running member has caught up (the
    // driver fails the run past CATCH_UP_BOUND).
    sim.client("catch-up", {
        let record = record.clone();
        async move {
            while !record.borrow().catch_up.is_some_and(|c| c.done) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok(())
        }
    });
    let mut watch = Watch::default();
    let mut undo: Vec<(u64, Undo)> = Vec::new();
    let mut down = Down::default();
    let mut faults = 0usize;
    let mut probing = false;
    let verdict = loop {
        // The crashes of the last round, before any process runs again.
        if let Err(e) = watch.judge_crashes(&record, &disks) {
            break Err(e);
        }
        match sim.step() {
            Ok(true) => break Ok(()),
            Ok(false) => {}
            Err(e) => break Err(format!("a simulated host or client failed: {e}")),
        }
        if settings.stall_real_time {
            stall_real_time();
        }
        let now = now_ms_of(&sim);
        DRIVER_NOW.with(|n| n.set(now));
        crate::wall_clock::set_ms(now);
        let ended_on_leader = match watch.tick(&record, &disks, now) {
            Ok(e) => e,
            Err(e) => break Err(e),
        };
        // The probers' answers so far, against what the nodes had applied
        // (an answer is judged by its ask's send time, and everything the
        // driver saw up to then is known by now).
        if let Err(e) = watch.judge_answers(&record) {
            break Err(e);
        }
        if let Err(e) = watch.judge_ghosts(&record, now) {
            break Err(e);
        }
        if let Err(e) = watch.judge_dead(&record, now) {
            break Err(e);
        }
        if let Some(v) = record.borrow_mut().violation.take() {
            break Err(v);
        }
        // A removed node that never had itself among the voters of the
        // membership it uses (cut off since its first start, it never
        // received the cluster's membership) never asks for a vote, so it
        // cannot learn of its removal: docs/operations/membership.md ("Remove a node")
        // has the operator stop it by hand, as a learner that never
        // caught up.
        let unaware: Vec<u64> = {
            let r = record.borrow();
            r.removed_at
                .keys()
                .copied()
                .filter(|id| r.nodes.contains_key(id) && !watch.knew_voter.contains(id))
                .collect()
        };
        for id in unaware {
            note(
                &record,
                format!(
                    "operator: node {id} never had the cluster's membership, so it cannot learn \
                     of its removal: stopped by hand"
                ),
            );
            record.borrow_mut().nodes.remove(&id);
            sim.crash(host(id));
        }
        // A removed node exits by itself (README), within the bound
        // node/tests/removed_node.rs gives it.
        let lingering = {
            let r = record.borrow();
            oracle::removed_nodes_exit(&r.removed_at, |id| r.nodes.contains_key(&id), now)
        };
        if let Err(e) = lingering {
            break Err(e);
        }
        // A node that refused its damaged snapshot file is replaced.
        let refused: Vec<u64> = record.borrow_mut().refused.drain(..).collect();
        for old in refused {
            if record.borrow().retired.contains(&old) {
                continue;
            }
            if replacing.is_some() {
                // One replacement at a time: this one waits its turn.
                record.borrow_mut().refused.push(old);
                continue;
            }
            replacing = Some(replace(
                &mut sim,
                &record,
                &mut disks,
                old,
                &mut next_id,
                stop_ms,
                "its data cannot be trusted",
            ));
        }
        let replaced: Vec<(u64, u64)> = record.borrow_mut().replaced.drain(..).collect();
        for (old, new) in replaced {
            note(&record, format!("operator: node {new} replaced node {old}"));
            down.crashed.remove(&old);
            replacing = None;
        }
        // The supervisor: a node whose process ended is restarted after
        // 100-1000 ms (it may fail again at once if its disk still fails).
        let exited: Vec<u64> = record.borrow_mut().exited.drain(..).collect();
        for id in exited {
            if record.borrow().retired.contains(&id) {
                note(
                    &record,
                    format!("node {id} exited; it was removed: not restarted"),
                );
                sim.crash(host(id));
                continue;
            }
            let disk = &disks[&id];
            let pending = disk.pending_writes();
            let keep = faults_rng.random_range(0..=pending);
            let after = faults_rng.random_range(100..=1_000);
            note(
                &record,
                format!(
                    "node {id} exited (keeps {keep} of {pending} unsynced writes); the supervisor \
                     restarts it in {after} ms"
                ),
            );
            sim.crash(host(id));
            disk.crash(keep);
            down.crashed.insert(id);
            undo.push((now + after, Undo::Bounce(id)));
        }
        // A moment worth a crash: the leader has just applied the end of a
        // session a prober is about to ask it to renew.
        if settings.faults && !probing && !ended_on_leader.is_empty() && down.is_empty() {
            let member = |l: &u64| record.borrow().members.contains(l);
            if let Some(leader) = watch
                .leader
                .filter(|_| faults_rng.random_bool(0.5))
                .filter(member)
            {
                faults += 1;
                let after = faults_rng.random_range(0..=300);
                crash(
                    &mut sim,
                    &mut faults_rng,
                    &mut ops_rng,
                    &record,
                    &disks[&leader],
                    leader,
                    after,
                    &mut undo,
                    &mut down,
                    now,
                );
            }
        }
        // Undo faults that are due.
        let mut i = 0;
        while i < undo.len() {
            if undo[i].0 <= now {
                let (_, u) = undo.remove(i);
                apply_undo(&mut sim, &record, &disks, u, &mut down);
            } else {
                i += 1;
            }
        }
        if now >= stop_ms && !probing {
            // Faults off: heal everything, then the liveness probe.
            for (_, u) in undo.drain(..) {
                apply_undo(&mut sim, &record, &disks, u, &mut down);
            }
            note(&record, "faults off; the liveness probe starts".into());
            probing = true;
            if settings.stranded_follower {
                let stranded = {
                    let r = record.borrow();
                    r.members
                        .iter()
                        .rev()
                        .find(|id| Some(**id) != watch.leader && r.nodes.contains_key(id))
                        .copied()
                };
                if let Some(f) = stranded {
                    for other in record.borrow().members.clone() {
                        if other != f {
                            sim.partition(host(f).as_str(), host(other).as_str());
                        }
                    }
                    note(
                        &record,
                        format!("planted: node {f} is cut off from every node for good"),
                    );
                }
            }
        }
        // While the bound holder holds its name, its links to every node
        // are sometimes cut (held) for 11-14 s, past the ~10 s in which a
        // node's HTTP/2 pings give its connection up: the leader may then
        // end the session a grace later, long before its ttl.
        let bound_holding = record.borrow().bound_holding;
        if settings.faults
            && !probing
            && bound_holding
            && now >= links_held_until
            && now + 14_000 < stop_ms
            && links_rng.random_bool(0.005)
        {
            let lasts = links_rng.random_range(11_000..14_000);
            links_held_until = now + lasts;
            note(
                &record,
                format!("hold {BOUND_HOLDER} <-> every node for {lasts} ms"),
            );
            for id in record.borrow().members.clone() {
                sim.hold(BOUND_HOLDER, host(id).as_str());
                undo.push((now + lasts, Undo::Release(BOUND_HOLDER.into(), host(id))));
            }
        }
        if settings.faults && !probing && faults_rng.random_bool(0.002) {
            faults += 1;
            inject(
                &mut sim,
                &mut faults_rng,
                &mut ops_rng,
                &record,
                &disks,
                &mut undo,
                &mut down,
                watch.leader,
                now,
            );
        }
        // About once in 10 s: a member (the leader a third of the time)
        // replaced by a fresh node while it runs; about once in 20 s: every
        // node's disk full at once (the same workload fills every
        // replica).
        if settings.faults && !probing && down.is_empty() && replacing.is_none() {
            if ops_rng.random_bool(0.000_1) {
                faults += 1;
                let members = record.borrow().members.clone();
                let old = match watch.leader {
                    Some(l) if ops_rng.random_bool(0.33) => l,
                    _ => members[ops_rng.random_range(0..members.len())],
                };
                down.crashed.insert(old);
                replacing = Some(replace(
                    &mut sim,
                    &record,
                    &mut disks,
                    old,
                    &mut next_id,
                    stop_ms,
                    "a planned replacement",
                ));
            } else if ops_rng.random_bool(0.000_05) {
                faults += 1;
                let lasts = ops_rng.random_range(200..1_500);
                note(
                    &record,
                    format!("every node's disk is full (writes fail with ENOSPC) for {lasts} ms"),
                );
                for id in record.borrow().members.clone() {
                    disks[&id].fill();
                    down.sick_disks.insert(id);
                    undo.push((now + lasts, Undo::Heal(id)));
                }
            }
        }
    };
    // The answers of the last tick, if the run ended before they were
    // judged; a violation among them comes before the run's own failure
    // (a run that fails its liveness probe because a node lied about its
    // health is failed by the lie).
    let verdict = match watch.judge_answers(&record) {
        Err(e) => Err(e),
        Ok(()) => verdict,
    };
    let (trace, grants, probe_granted, probe_exhausted, history) = {
        let mut r = record.borrow_mut();
        (
            r.trace.clone(),
            r.grants.clone(),
            r.probe_granted,
            r.probe_exhausted,
            std::mem::take(&mut r.history),
        )
    };
    // A restore's fence bump holds: every grant after it (the workers
    // start once it is done) has a larger fence.
    let verdict = verdict.and_then(|()| {
        let restored = record.borrow().restored_fence;
        match (restored, grants.iter().find(|g| Some(g.fence) <= restored)) {
            (Some(r), Some(g)) => Err(format!(
                "restore: worker {} was granted fence {} after a restore that left the counter at \
                 {r}",
                g.worker, g.fence
            )),
            _ => Ok(()),
        }
    });
    // A probe refused for want of fences is right only if they had run
    // out.
    let verdict = verdict.and_then(|()| {
        let highest = watch.fences.highest();
        let max = raftlock_node::state::limits::MAX_FENCE;
        if probe_exhausted && highest != max {
            Err(format!(
                "liveness: the probe was refused for want of fences, but the highest fence seen \
                 is {highest}, below the bound {max}"
            ))
        } else {
            Ok(())
        }
    });
    // The harness's checkers on the workers' history (not in the trace
    // or its hash).
    let (beliefs, granted) = {
        let r = record.borrow();
        (r.beliefs.clone(), r.granted.clone())
    };
    let verdict = verdict
        .and_then(|()| oracle::mutual_exclusion(&grants))
        .and_then(|()| belief::no_overlap(&beliefs))
        .and_then(|()| belief::none_past_a_grant(&beliefs, &granted))
        .and_then(|()| shared::check(history.events(), shared::LINEARIZABILITY_BUDGET))
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
    let _ = std::fs::remove_dir_all(data_root());
    CURRENT.with(|c| *c.borrow_mut() = None);
    Outcome {
        verdict,
        hash,
        grants: grants.len(),
        faults,
    }
}

/// Now and then (about one step in 40) sleeps 0-3 ms of real time, both
/// drawn from std's per-process random hash keys, never from the seed (and
/// not from the wall clock, which is the simulated one here).
fn stall_real_time() {
    use std::hash::{BuildHasher, Hasher};
    let draw = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    if draw.is_multiple_of(40) {
        std::thread::sleep(Duration::from_micros(draw / 40 % 3_000));
    }
}

fn now_ms_of(sim: &turmoil::Sim<'_>) -> u64 {
    sim.elapsed().as_millis() as u64
}
