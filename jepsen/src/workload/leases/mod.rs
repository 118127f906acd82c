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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::Leftover;
use crate::clientlink::{ClientLinks, ClusterAddrs};
use crate::history::Recorder;
use crate::raw::Creds;
use tasks::{contender, operator, watchers, worker};

mod calls;
mod holding;
mod library;
mod paths;
mod requests;
mod streams;
mod tasks;
#[cfg(test)]
mod tests;

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
