//! One simulated run: three raftlock nodes (the real `raftlock-node` on an
//! in-memory simulated disk) and lock workers (the real
//! `raftlock-client`), on turmoil's network and clock in 1 ms ticks, with
//! faults drawn from the seed; oracles checked every tick and at the end.
//! [`run`] goes in steps: the nodes' hosts (`host`), the clients
//! (`clients`, `operator`, `believers`, `holders`), and a loop of ticks
//! that judges (`watch`) and injects faults (`faults`).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use raftlock_client::ClientOptions;
use raftlock_node::node::Node;
use raftlock_node::raft::log_store::MemDisk;
use raftlock_node::transport::{Conn, Connector};
use rand::rngs::StdRng;
use rand::SeedableRng as _;

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

use clients::{start_believers, start_hostile_and_probe, start_workers};
use faults::{
    crash_at_a_moment, faults_off, hold_bound_links, maybe_inject, replace_or_fill, replacements,
    supervise, undo_due, Down, Faults,
};
use host::start_host;
use operator::start_restorer;
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

/// The longest a message sent between nodes may still be on its way: a
/// held link keeps it up to 1,500 ms (a latency spike, up to 300 ms), and
/// a cut drops what is on its way (the ghost check).
const CANCEL_IN_FLIGHT: Duration = Duration::from_millis(1_500);

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
    /// Every link the faults cut (partitioned, both ways or one way), for
    /// the ghost check.
    cuts: Vec<Cut>,
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
    /// The node its `Lock` was sent to (a follower forwards it to the
    /// leader).
    via: u64,
    /// When its `Lock` was sent.
    sent: u64,
    /// When its caller went away.
    gone: u64,
}

/// A link the faults cut: from one host to the other,
/// from when until when (simulated ms; `None` while it is cut). turmoil
/// drops what is sent over a cut link, and its TCP never sends it again:
/// every later segment on that connection, in that direction, waits
/// behind the gap for good, so the receiver hears nothing more on it
/// until its HTTP/2 keep-alive closes the connection.
struct Cut {
    hosts: (String, String),
    from: u64,
    until: Option<u64>,
}

impl Record {
    /// Records that the link from host `a` to host `b` is cut from `now`
    /// (ms), and from `b` to `a` too if `both`.
    fn cut(&mut self, a: &str, b: &str, both: bool, now: u64) {
        let ways: &[(&str, &str)] = if both { &[(a, b), (b, a)] } else { &[(a, b)] };
        for (x, y) in ways {
            self.cuts.push(Cut {
                hosts: (x.to_string(), y.to_string()),
                from: now,
                until: None,
            });
        }
    }

    /// Records that the link between `a` and `b` is whole again at `now`
    /// (ms): both ways, or only `a -> b` if `oneway` (a one-way cut of
    /// `b -> a` stays).
    fn mend(&mut self, a: &str, b: &str, oneway: bool, now: u64) {
        for c in self.cuts.iter_mut().filter(|c| c.until.is_none()) {
            let (x, y) = (c.hosts.0.as_str(), c.hosts.1.as_str());
            if (x, y) == (a, b) || (!oneway && (x, y) == (b, a)) {
                c.until = Some(now);
            }
        }
    }

    /// Whether the link from node `a` to node `b` was cut at any time from
    /// `from` to `to` (ms).
    fn was_cut(&self, a: u64, b: u64, from: u64, to: u64) -> bool {
        let (a, b) = (host(a), host(b));
        self.cuts.iter().any(|c| {
            c.hosts.0 == a && c.hosts.1 == b && c.from <= to && c.until.is_none_or(|u| u >= from)
        })
    }
}

/// The simulated cluster the driver runs: turmoil's simulation (the
/// nodes' hosts and the clients), what the run records, and the nodes'
/// disks.
struct Cluster<'a> {
    sim: turmoil::Sim<'a>,
    record: Shared,
    disks: BTreeMap<u64, MemDisk>,
}

/// Runs one simulation.
pub fn run(settings: &Settings) -> Outcome {
    seed_thread(settings);
    let faults_rng = StdRng::seed_from_u64(settings.seed ^ 0x5eed_fa17);
    let sim = build_sim(settings);
    let mut cluster = start_hosts(settings, sim);
    // Membership changes, snapshot damage and full disks on every node
    // draw from a stream of their own.
    let mut ops_rng = StdRng::seed_from_u64(settings.seed ^ 0x0e7a_70b5);
    start_restorer(settings, &mut cluster, &mut ops_rng);
    let replacing: Option<(u64, u64)> = None;
    let next_id = nodes() + 1;
    let stop_ms = settings.duration_ms;
    start_workers(settings, &mut cluster);
    start_believers(settings, &mut cluster);
    // The bound holder's links to the nodes are held at times (a network
    // cut between a client and the cluster), drawn from a stream of their
    // own so that the other faults stay as they were.
    let links_rng = StdRng::seed_from_u64(settings.seed ^ 0x11_4c5);
    let links_held_until = 0u64;
    start_hostile_and_probe(settings, &mut cluster);
    let mut watch = Watch::default();
    let mut faults = Faults {
        faults_rng,
        ops_rng,
        links_rng,
        links_held_until,
        undo: Vec::new(),
        down: Down::default(),
        count: 0,
        probing: false,
        replacing,
        next_id,
        stop_ms,
    };
    let verdict = loop {
        // The crashes of the last round, before any process runs again.
        if let Err(e) = watch.judge_crashes(&cluster.record, &cluster.disks) {
            break Err(e);
        }
        match cluster.sim.step() {
            Ok(true) => break Ok(()),
            Ok(false) => {}
            Err(e) => break Err(format!("a simulated host or client failed: {e}")),
        }
        if settings.stall_real_time {
            stall_real_time();
        }
        let now = now_ms_of(&cluster.sim);
        DRIVER_NOW.with(|n| n.set(now));
        crate::wall_clock::set_ms(now);
        let ended_on_leader = match watch.judge(&cluster.record, &cluster.disks, now) {
            Ok(e) => e,
            Err(e) => break Err(e),
        };
        if let Err(e) = removed_nodes(&mut cluster, &watch, now) {
            break Err(e);
        }
        replacements(&mut cluster, &mut faults);
        supervise(&mut cluster, &mut faults, now);
        let leader = watch.leader;
        crash_at_a_moment(
            settings,
            &mut cluster,
            &mut faults,
            leader,
            &ended_on_leader,
            now,
        );
        undo_due(&mut cluster, &mut faults, now);
        faults_off(settings, &mut cluster, &mut faults, leader, now);
        hold_bound_links(settings, &mut cluster, &mut faults, now);
        maybe_inject(settings, &mut cluster, &mut faults, leader, now);
        replace_or_fill(settings, &mut cluster, &mut faults, leader, now);
    };
    let (verdict, trace, grants) = final_checks(verdict, &mut watch, &cluster.record);
    let hash = trace_hash(&trace);
    tear_down(cluster);
    Outcome {
        verdict,
        hash,
        grants,
        faults: faults.count,
    }
}

/// Sets this thread up for the run: its settings, its clocks at 0, and
/// every random choice of the node and client code seeded.
fn seed_thread(settings: &Settings) {
    // Every run's wall clock starts at the same instant.
    crate::wall_clock::set_ms(0);
    // Every random choice of the node and client code on this thread (ids,
    // nonces, jitter), of turmoil (latencies, tokio's scheduler), and of
    // the run's faults (`faults`), comes from the seed.
    CURRENT.with(|c| *c.borrow_mut() = Some(settings.clone()));
    NODES.with(|n| n.set(settings.nodes));
    raftlock_node::random::seed(settings.seed);
    // Blocking work (checking a snapshot sent in, say) inline: a pool
    // thread would finish at a time no seed decides.
    raftlock_node::blocking::run_inline();
    raftlock_client::random::seed(settings.seed.wrapping_add(1));
}

/// turmoil's simulation of the run: seeded, in 1 ms ticks, long enough
/// for the load, the liveness phase and the catch-up.
fn build_sim<'a>(settings: &Settings) -> turmoil::Sim<'a> {
    let total = Duration::from_millis(settings.duration_ms) + LIVENESS_BOUND * 2;
    turmoil::Builder::new()
        .rng_seed(settings.seed)
        .tick_duration(Duration::from_millis(1))
        .simulation_duration(total + Duration::from_secs(10))
        .min_message_latency(Duration::from_micros(200))
        .max_message_latency(MAX_LATENCY)
        .tcp_capacity(1 << 16)
        .build()
}

/// The first nodes, each on a fresh simulated disk (one that lies about
/// its syncs with `lying_disks`), their hosts started in `sim`.
fn start_hosts<'a>(settings: &Settings, mut sim: turmoil::Sim<'a>) -> Cluster<'a> {
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
    Cluster { sim, record, disks }
}

/// Removed nodes: one that cannot learn of its removal is stopped by hand,
/// the others must exit by themselves.
fn removed_nodes(cluster: &mut Cluster<'_>, watch: &Watch, now: u64) -> Result<(), String> {
    let Cluster { sim, record, .. } = cluster;
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
            record,
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
    let r = record.borrow();
    oracle::removed_nodes_exit(&r.removed_at, |id| r.nodes.contains_key(&id), now)
}

/// The checks at the end of the run, after the loop's `verdict`: the last
/// tick's answers, a restore's fence bump, a probe refused for want of
/// fences, and the checkers of the whole run. Returns the verdict, the
/// trace and the workers' grants.
fn final_checks(
    verdict: Result<(), String>,
    watch: &mut Watch,
    record: &Shared,
) -> (Result<(), String>, Vec<String>, usize) {
    // The answers of the last tick, if the run ended before they were
    // judged; a violation among them comes before the run's own failure
    // (a run that fails its liveness probe because a node lied about its
    // health is failed by the lie).
    let verdict = match watch.judge_answers(record) {
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
    (verdict, trace, grants.len())
}

/// The trace's hash: equal for two runs of one seed.
fn trace_hash(trace: &[String]) -> u64 {
    let mut hash = FNV_START;
    for line in trace {
        hash = fnv(line.as_bytes(), hash);
        hash = fnv(b"\n", hash);
    }
    hash
}

/// Lets go of the run: its nodes (and their tasks) before the next run,
/// its data directory, its settings.
fn tear_down(cluster: Cluster<'_>) {
    // Let go of the nodes (and their tasks) before the next run.
    cluster.record.borrow_mut().nodes.clear();
    drop(cluster.sim);
    let _ = std::fs::remove_dir_all(data_root());
    CURRENT.with(|c| *c.borrow_mut() = None);
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
