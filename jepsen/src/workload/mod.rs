//! Client workloads. Each of `concurrency` workers runs its own
//! [`Client`] and [`Session`] against the nodes' real addresses and records
//! every operation in the history.
//!
//! * `fenced-counter`: acquire lock `fc/K`, read counter K from the fenced
//!   store with the fence, write it back plus one with the fence, release.
//!   A fraction of cycles (`--client-pauses`) emulates a holder that
//!   pauses past its lease: its session is ended behind its back while it
//!   "sleeps" (its locks go to the next waiter), then it wakes and writes
//!   with its old fence, as a GC-paused process would. The store must
//!   refuse that write.
//! * `lock`: acquire (exclusive or shared, try or bounded wait), hold,
//!   release and describe over a few names, for the linearizability
//!   checker; atomic requests for 2 or 3 of the names at once
//!   (`AcquireAll`); and reads upgraded to exclusive, half of them then
//!   downgraded back to shared, before the release.
//! * `semaphore`: weighted permits of one semaphore of capacity K.
//! * `clients`: what real applications do to a lock client besides
//!   acquire-and-release, over `cl/0..2` and the election `cl/leader`: drop
//!   a `lock()` future while it is queued, drop a guard and lock the same
//!   name again at once, lock one name from two tasks sharing a session,
//!   resign (drop) an election campaign while queued, and give up on short
//!   bounded waits (100–300 ms) across leader changes. Dropped waits are
//!   `acquire` operations that end in `info` with `{"abandoned": true}`;
//!   dropped guards are `release` operations that end in `info` with
//!   `{"dropped": true}`. What such abandoned work leaves behind is found by
//!   the end-of-run audit (`crate::audit`).
//! * `leases`: every path of the lease rule (`Lock` + `SetSessionTtl` at
//!   the end of the count, `Lock` retried with its nonce, sessions that end
//!   with their process on flapping `KeepAlive` streams, one-shot
//!   keep-alives, revokes, the Rust client's multi-locks and upgrades),
//!   over gRPC and HTTP/JSON, each client recording what it believed
//!   (see [`leases`] and `crate::beliefs`).
//!
//! Operation values (history `value` field):
//! `acquire` {lock, mode, weight, session} → ok {fence};
//! `acquire-all` {locks: [{lock, mode}], session, timeout_ms} → ok
//! {session, grants: [{lock, mode, fence}]} (in the request's order);
//! `upgrade` {lock, fence, session, timeout_ms, lease_until_ns} → ok
//! {lock, session, from_fence, fence, mode: "exclusive"} (`fence` is the
//! exclusive grant's new one; `fail` leaves the shared grant held);
//! `downgrade` {lock, fence, session, lease_until_ns} → ok {lock, session,
//! fence, mode: "shared"};
//! `release` {lock, fence, session, lease_until_ns} → ok {released};
//! `describe` {lock} → ok {holders: [{session, fence, mode, weight}]};
//! `read` {key, fence} → ok {value} | fail {latest};
//! `write` {key, fence, value} → ok | fail {latest};
//! `open` {} → ok {session}; `close` {session} → ok.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use raftlock_client::{Client, ClientOptions, Error, Guard, LeaseState, LockInfo, Mode, Session};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::{json, Value};

mod clients;
mod cycles;
pub mod keepalive;
pub mod leases;

use crate::clientlink::{ClientLinks, ClusterAddrs};
use crate::dbstore::AnyClient;
use crate::history::{Process, Recorder, Type};

/// The workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    /// Lock-protected read-modify-write of counters in the fenced store.
    FencedCounter,
    /// Exclusive and shared locks with describes (linearizability).
    Lock,
    /// A weighted semaphore.
    Semaphore,
    /// Abandoned waits, dropped guards, shared sessions, resigned
    /// campaigns.
    Clients,
    /// Every path of the lease rule, with what each client believed
    /// (see [`leases`]).
    Leases,
}

/// Lock names of the `lock` workload.
pub const LOCK_NAMES: [&str; 3] = ["lk/0", "lk/1", "lk/2"];
/// The semaphore of the `semaphore` workload.
pub const SEMAPHORE_NAME: &str = "sem/0";
/// Lock names of the `clients` workload.
pub const CLIENT_NAMES: [&str; 3] = ["cl/0", "cl/1", "cl/2"];
/// The election of the `clients` workload.
pub const ELECTION_NAME: &str = "cl/leader";

/// Settings shared by every worker.
#[derive(Clone)]
pub struct WorkloadOptions {
    /// Which workload.
    pub kind: WorkloadKind,
    /// The nodes' addresses when the run starts.
    pub addrs: ClusterAddrs,
    /// The client links, when the client-link nemesis runs: each worker
    /// then reaches the nodes through its own proxies.
    pub links: Option<Arc<ClientLinks>>,
    /// The client token, when the cluster has access control.
    pub token: Option<String>,
    /// Session ttl.
    pub ttl: Duration,
    /// Counters (fenced-counter).
    pub keys: usize,
    /// Semaphore capacity.
    pub capacity: u32,
    /// Fraction of fenced-counter cycles that emulate a paused holder.
    pub client_pauses: f64,
    /// The fenced store (fenced-counter).
    pub store: Option<crate::dbstore::Target>,
    /// Number of workers (process numbers advance by this on `info`).
    pub concurrency: u64,
    /// The run's seed.
    pub seed: u64,
    /// The client addresses of the cluster to use; changes when the
    /// restore nemesis has moved everything to a restored cluster.
    pub moved: tokio::sync::watch::Receiver<ClusterAddrs>,
}

/// The lock name guarding counter `k`.
pub fn counter_key(k: usize) -> String {
    format!("fc/{k}")
}

/// One worker: a process number, a client, a session.
struct Worker {
    rec: Recorder,
    opts: WorkloadOptions,
    /// The worker's slot (its first process number).
    slot: u64,
    process: u64,
    /// The cluster generation (restores moved through) the client talks to.
    gen: u64,
    client: Client,
    session: Option<Session>,
    rng: StdRng,
    stop: Arc<AtomicBool>,
    store: Option<AnyClient>,
}

/// An operation in flight.
struct PendingOp<'a> {
    w: &'a mut Worker,
    f: &'static str,
}

impl PendingOp<'_> {
    fn complete(self, kind: Type, value: Value) {
        self.w
            .rec
            .record(Process::Client(self.w.process), kind, self.f, value);
        if kind == Type::Info {
            // Jepsen's rule: a process with an operation of unknown outcome
            // never invokes again; its work continues under a new number.
            self.w.process += self.w.opts.concurrency;
        }
    }
}

/// How a client error ends an operation.
fn classify(e: &Error) -> Type {
    match e {
        // May have been applied. A session found gone may have been gone
        // only by the time of a retry: an earlier attempt of the same
        // request may have been applied (and what it got ended with the
        // session).
        Error::Unknown(_) | Error::Internal(_) | Error::LeaseLost | Error::SessionNotFound(_) => {
            Type::Info
        }
        // Definitely not applied (the client says so for Unavailable).
        _ => Type::Fail,
    }
}

/// A lock mode as the history spells it.
fn mode_str(m: Mode) -> &'static str {
    match m {
        Mode::Exclusive => "exclusive",
        Mode::Shared => "shared",
        Mode::Semaphore { .. } => "semaphore",
    }
}

fn err_value(e: &Error) -> Value {
    json!({ "error": e.to_string() })
}

fn holders_value(info: &Option<LockInfo>) -> Value {
    let holders: Vec<Value> = info
        .iter()
        .flat_map(|i| i.holders.iter())
        .map(|h| {
            json!({
                "session": h.session,
                "fence": h.fence,
                "mode": h.mode.as_str(),
                "weight": h.weight,
            })
        })
        .collect();
    Value::Array(holders)
}

impl Worker {
    fn op(&mut self, f: &'static str, value: Value) -> PendingOp<'_> {
        self.rec
            .record(Process::Client(self.process), Type::Invoke, f, value);
        PendingOp { w: self, f }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// The client's own view of when its lease ends, in run time (0 if it
    /// believes the lease is gone).
    fn lease_until_ns(&self) -> u64 {
        let Some(s) = &self.session else { return 0 };
        match *s.lease().borrow() {
            LeaseState::Valid(until) => {
                let until: std::time::Instant = until.into_std();
                until.saturating_duration_since(self.rec.start()).as_nanos() as u64
            }
            _ => 0,
        }
    }

    /// A valid session, opening one if needed (ending a lost one first).
    async fn session(&mut self) -> Option<Session> {
        if let Some(s) = &self.session {
            if s.is_valid() {
                return Some(s.clone());
            }
            self.end_session().await;
        }
        let op = self.op("open", json!({}));
        match op.w.client.session(op.w.opts.ttl).await {
            Ok(s) => {
                let id = s.id();
                op.w.session = Some(s.clone());
                op.complete(Type::Ok, json!({ "session": id }));
                Some(s)
            }
            Err(e) => {
                op.complete(classify(&e), err_value(&e));
                // Do not spin against an unavailable cluster.
                tokio::time::sleep(Duration::from_millis(100)).await;
                None
            }
        }
    }

    /// The cluster was restored elsewhere: abandon the old session (it lives
    /// on in the restored cluster until its lease runs out) and talk to the
    /// new cluster from now on.
    async fn move_to_restored(&mut self) {
        let addrs = self.opts.moved.borrow_and_update().clone();
        self.gen = addrs.gen;
        if let Some(s) = self.session.take() {
            let sid = s.id();
            self.rec.record(
                Process::Client(self.process),
                Type::Invoke,
                "close",
                json!({ "session": sid }),
            );
            self.rec.record(
                Process::Client(self.process),
                Type::Info,
                "close",
                json!({ "session": sid, "moved": true }),
            );
            self.process += self.opts.concurrency;
        }
        match worker_client(&self.opts, self.slot, &addrs).await {
            Ok(c) => self.client = c,
            Err(e) => eprintln!("raftlock-jepsen: worker cannot reach the restored cluster: {e:#}"),
        }
    }

    /// Closes the current session (releasing whatever it holds). `ok` means
    /// it ended by now; `info` that it ends at some unknown time (it will
    /// expire: nobody keeps it alive any more).
    async fn end_session(&mut self) {
        let Some(s) = self.session.take() else { return };
        let op = self.op("close", json!({ "session": s.id() }));
        match s.close().await {
            Ok(()) => op.complete(Type::Ok, json!({ "session": s.id() })),
            Err(e) => op.complete(Type::Info, err_value(&e)),
        }
    }

    async fn acquire(
        &mut self,
        session: &Session,
        name: &str,
        mode: &'static str,
        weight: u32,
        timeout: Duration,
    ) -> Option<Guard> {
        let sid = session.id();
        let op = self.op(
            "acquire",
            json!({"lock": name, "mode": mode, "weight": weight, "session": sid,
                   "timeout_ms": timeout.as_millis() as u64}),
        );
        let result = match mode {
            "semaphore" => {
                session
                    .semaphore(name, op.w.opts.capacity)
                    .acquire_timeout(weight, timeout)
                    .await
            }
            m => {
                session
                    .lock_with(name, m == "shared", Some(timeout), Vec::new())
                    .await
            }
        };
        match result {
            Ok(g) => {
                op.complete(
                    Type::Ok,
                    json!({"lock": name, "mode": mode, "weight": weight, "session": sid, "fence": g.fence()}),
                );
                Some(g)
            }
            Err(e) => {
                let kind = classify(&e);
                op.complete(kind, err_value(&e));
                // A grant we may hold but do not know of, or a session that
                // is gone: end the session so nothing stays held.
                if kind == Type::Info || matches!(e, Error::SessionNotFound(_)) {
                    self.end_session().await;
                }
                None
            }
        }
    }

    async fn release(&mut self, g: Guard) {
        let lease_until_ns = self.lease_until_ns();
        let op = self.op(
            "release",
            json!({"lock": g.name(), "fence": g.fence(), "session": g.session().id(),
                   "lease_until_ns": lease_until_ns}),
        );
        match g.release().await {
            Ok(released) => op.complete(Type::Ok, json!({ "released": released })),
            Err(e) => {
                let kind = classify(&e);
                op.complete(kind, err_value(&e));
                // The grant may still be held and the guard will not send
                // again: end the session.
                self.end_session().await;
            }
        }
    }

    async fn describe(&mut self, name: &str) {
        let op = self.op("describe", json!({ "lock": name }));
        match op.w.client.describe(name).await {
            Ok(info) => op.complete(
                Type::Ok,
                json!({"lock": name, "holders": holders_value(&info)}),
            ),
            Err(e) => op.complete(Type::Fail, err_value(&e)),
        }
    }

    async fn sleep_ms(&mut self, lo: u64, hi: u64) {
        let ms = self.rng.random_range(lo..=hi);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    /// Runs cycles until told to stop, then hands back the session it
    /// still has (holding nothing), for the end-of-run audit.
    async fn run(mut self) -> Leftover {
        while !self.stopped() {
            if restore_pending(&self.opts.moved, self.gen) {
                self.move_to_restored().await;
            }
            let Some(session) = self.session().await else {
                continue;
            };
            match self.opts.kind {
                WorkloadKind::Lock => self.lock_cycle(&session).await,
                WorkloadKind::Semaphore => self.semaphore_cycle(&session).await,
                WorkloadKind::FencedCounter => self.counter_cycle(&session).await,
                WorkloadKind::Clients => self.clients_cycle(&session).await,
                // Its own tasks run it (`leases::spawn`).
                WorkloadKind::Leases => break,
            }
        }
        Leftover {
            process: self.process,
            session: self.session.take(),
            rec: self.rec.clone(),
        }
    }
}

/// What a worker hands back when it stops: the session it still believes
/// it has (holding nothing), to be audited and then closed.
pub struct Leftover {
    /// The worker's last process number.
    pub process: u64,
    /// Its session, if it has one.
    pub session: Option<Session>,
    rec: Recorder,
}

impl Leftover {
    /// Closes the session, recording it.
    pub async fn close(mut self) {
        let Some(s) = self.session.take() else { return };
        let p = Process::Client(self.process);
        self.rec.record(
            p.clone(),
            Type::Invoke,
            "close",
            json!({ "session": s.id() }),
        );
        match s.close().await {
            Ok(()) => self
                .rec
                .record(p, Type::Ok, "close", json!({ "session": s.id() })),
            Err(e) => self.rec.record(p, Type::Info, "close", err_value(&e)),
        };
    }
}

fn worker_client_options() -> ClientOptions {
    ClientOptions {
        request_timeout: Duration::from_secs(2),
        retry_deadline: Duration::from_secs(4),
        ..ClientOptions::default()
    }
}

/// The client of worker `slot` for the cluster at `addrs`: straight to the
/// nodes, or through the worker's own client-link proxies (its endpoints,
/// and where leader hints are sent).
async fn worker_client(
    opts: &WorkloadOptions,
    slot: u64,
    addrs: &ClusterAddrs,
) -> anyhow::Result<Client> {
    client_via(
        &opts.links,
        opts.token.clone(),
        crate::clientlink::worker_end(slot),
        addrs,
    )
    .await
}

/// A client of link end `end` for the cluster at `addrs` (see
/// [`worker_client`]).
async fn client_via(
    links: &Option<Arc<ClientLinks>>,
    token: Option<String>,
    end: u64,
    addrs: &ClusterAddrs,
) -> anyhow::Result<Client> {
    let mut options = ClientOptions {
        token,
        ..worker_client_options()
    };
    let endpoints: Vec<String> = match links {
        Some(links) => {
            let via = links.via(end, addrs).await?;
            options.address_map = addrs
                .nodes
                .iter()
                .filter_map(|(id, direct)| Some((direct.clone(), via.get(id)?.clone())))
                .collect();
            via.into_values().collect()
        }
        None => addrs.nodes.values().cloned().collect(),
    };
    Ok(Client::with_options(endpoints, options)?)
}

/// Whether the restore nemesis has moved the cluster since the worker
/// moved to generation `gen`. By generation, not by the channel's
/// `has_changed`: that is an error (read as "no") once the nemesis has
/// ended and dropped its end, which loses a move it made near its end.
fn restore_pending(moved: &tokio::sync::watch::Receiver<ClusterAddrs>, gen: u64) -> bool {
    moved.borrow().gen != gen
}

/// Starts `concurrency` workers; they run until `stop` is set, then hand
/// back the sessions they still have (see [`Leftover`]).
pub async fn spawn_workers(
    opts: &WorkloadOptions,
    rec: &Recorder,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<Leftover>>> {
    let mut handles = Vec::new();
    for slot in 0..opts.concurrency {
        let client = worker_client(opts, slot, &opts.addrs).await?;
        let worker = Worker {
            rec: rec.clone(),
            opts: opts.clone(),
            slot,
            process: slot,
            gen: opts.addrs.gen,
            client,
            session: None,
            rng: StdRng::seed_from_u64(opts.seed.wrapping_mul(1_000_003).wrapping_add(slot)),
            stop: stop.clone(),
            store: opts.store.as_ref().map(AnyClient::new),
        };
        handles.push(tokio::spawn(worker.run()));
    }
    Ok(handles)
}

#[cfg(test)]
mod tests;
