//! Scale: how raftlock behaves as the table grows. Fill the cluster up to
//! each step (held locks, or open sessions), then measure the uncontended
//! workload on other names and read every node's RSS from
//! `/proc/PID/status`.
//!
//! Held locks are spread over enough holder sessions to stay under the
//! per-session limit; sessions and holders use the longest ttl (1 h) so no
//! keep-alive traffic blurs the figure.
//!
//! `sessions-held` (alias `live-sessions`) is the opposite: sessions with
//! a short ttl (`--live-ttl`, 10 s) that the client library keeps alive in
//! the background (a keep-alive every ttl/3 each, all of one client's on
//! one stream), so the figure is what the keep-alive load of N live
//! sessions does to lock operations. With `--target etcd` the same with
//! etcd leases, kept alive as etcd's Go client does (one stream, every
//! ttl/3; see `targets::etcd_leases`). Each step also reports the nodes'
//! CPU during the measurement, the keep-alives answered per second
//! (raftlock: the nodes' `raftlock_keepalives_total`, with `--metrics`;
//! etcd: answers on the stream) and how many sessions or leases lapsed.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use raftlock_client::{Client, Session};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::driver::{Ctx, Plan};
use crate::progress::Goal;
use crate::stats::{load_avg, round3};
use crate::targets::{Opts, Target, Workload};
use crate::{drive, write_json};

/// Longest session ttl raftlock accepts.
const HOLDER_TTL: Duration = Duration::from_secs(3600);
/// Held locks per holder session (the server allows 10,000).
const LOCKS_PER_HOLDER: u64 = 8_000;

/// What grows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Held locks.
    Locks,
    /// Open sessions.
    Sessions,
    /// Open sessions with a short ttl, kept alive by the client library
    /// (etcd: leases kept alive on one stream).
    #[value(alias = "live-sessions")]
    #[serde(rename = "sessions-held", alias = "live-sessions")]
    SessionsHeld,
}

/// `raftlock-bench scale` arguments.
#[derive(Args)]
pub struct ScaleArgs {
    /// Node addresses (host:port), comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    endpoints: Vec<String>,
    /// System: raftlock, or etcd (`sessions-held` only; needs the `etcd`
    /// feature).
    #[arg(long, value_enum, default_value = "raftlock")]
    target: Target,
    /// raftlock nodes' metrics addresses (host:port), to count the
    /// keep-alives they answer.
    #[arg(long, value_delimiter = ',')]
    metrics: Vec<String>,
    /// raftlockd pids whose RSS to read.
    #[arg(long, value_delimiter = ',')]
    pids: Vec<i32>,
    /// What to grow.
    #[arg(long, value_enum)]
    kind: Kind,
    /// Sizes to measure at, ascending.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1000,10000,100000,1000000"
    )]
    steps: Vec<u64>,
    /// Seconds of uncontended load measured at each step.
    #[arg(long, default_value_t = 8.0)]
    secs: f64,
    /// Session (lease) ttl of `sessions-held`, in seconds.
    #[arg(long, default_value_t = 10)]
    live_ttl: u64,
    /// Clients of the measured load.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Concurrent requests while filling.
    #[arg(long, default_value_t = 256)]
    fill_concurrency: usize,
    /// Leave everything held/open at the end (the caller discards the
    /// cluster).
    #[arg(long)]
    no_cleanup: bool,
    /// Write the result here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

/// Memory of one process.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Rss {
    /// Pid.
    pub pid: i32,
    /// Resident set now, KiB.
    pub rss_kib: u64,
    /// Peak resident set, KiB.
    pub hwm_kib: u64,
}

/// Reads `VmRSS` and `VmHWM` of `pid`.
pub fn rss(pid: i32) -> Rss {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Rss {
        pid,
        rss_kib: field("VmRSS:"),
        hwm_kib: field("VmHWM:"),
    }
}

/// One step's figures.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Step {
    /// Held locks or open sessions in the cluster.
    pub count: u64,
    /// Seconds it took to fill from the previous step.
    pub fill_secs: f64,
    /// Fill rate (acquires or session opens per second).
    pub fill_per_sec: f64,
    /// Uncontended acquire+release cycles per second at this size.
    pub ops_per_sec: f64,
    /// Median cycle latency.
    pub p50_ms: f64,
    /// 99th percentile cycle latency.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Failed attempts during the measurement.
    pub errors: u64,
    /// Each node's memory after the measurement.
    pub rss: Vec<Rss>,
    /// Largest RSS of any node, MiB.
    pub max_rss_mib: f64,
    /// `/proc/loadavg` after the measurement.
    pub load_avg: String,
    /// Each node's CPU use during the measurement, in percent of one core.
    #[serde(default)]
    pub cpu_percent: Vec<f64>,
    /// `sessions-held`: the keep-alives the sessions need per second
    /// (count / (ttl / 3)).
    #[serde(default)]
    pub keepalives_per_sec: f64,
    /// `sessions-held`: keep-alives answered per second during the
    /// measurement (0: not counted, raftlock without `--metrics`).
    #[serde(default)]
    pub keepalives_answered_per_sec: f64,
    /// `sessions-held`: sessions (leases) that lapsed by the end of the
    /// step.
    #[serde(default)]
    pub sessions_lost: u64,
}

/// The JSON `scale` writes.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ScaleResult {
    /// `locks`, `sessions` or `sessions-held`.
    pub kind: String,
    /// `raftlock` or `etcd`.
    #[serde(default = "raftlock_name")]
    pub target: String,
    /// Clients of the measured load.
    pub clients: usize,
    /// Node memory before filling.
    pub baseline_rss: Vec<Rss>,
    /// One entry per step.
    pub steps: Vec<Step>,
}

fn raftlock_name() -> String {
    "raftlock".into()
}

/// What is held open so the table keeps its size.
enum Holdings {
    Locks {
        holders: Vec<Session>,
    },
    Sessions {
        open: Vec<Session>,
        ttl: Duration,
    },
    #[cfg(feature = "etcd")]
    Leases {
        client: Box<etcd_client::Client>,
        leases: crate::targets::etcd_leases::HeldLeases,
    },
}

impl Holdings {
    /// Sessions or leases that lapsed (0 where nothing can lapse).
    fn lost(&self) -> u64 {
        match self {
            Holdings::Locks { .. } => 0,
            Holdings::Sessions { open, .. } => open.iter().filter(|s| !s.is_valid()).count() as u64,
            #[cfg(feature = "etcd")]
            Holdings::Leases { leases, .. } => leases.lost(),
        }
    }

    /// How many are held.
    fn len(&self) -> usize {
        match self {
            Holdings::Locks { holders } => holders.len(),
            Holdings::Sessions { open, .. } => open.len(),
            #[cfg(feature = "etcd")]
            Holdings::Leases { leases, .. } => leases.len(),
        }
    }
}

/// Sum of `raftlock_keepalives_total` over the nodes at `metrics`.
async fn keepalives_answered(metrics: &[String]) -> anyhow::Result<u64> {
    let mut total = 0;
    for addr in metrics {
        let body = crate::stages::http(addr, "GET", "/metrics").await?;
        total += body
            .lines()
            .find_map(|l| l.strip_prefix("raftlock_keepalives_total "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(total)
}

/// Fills from `from` to `to` with `concurrency` requests in flight.
async fn fill(
    client: &Client,
    holdings: &mut Holdings,
    prefix: &str,
    from: u64,
    to: u64,
    concurrency: usize,
) -> anyhow::Result<()> {
    #[cfg(feature = "etcd")]
    if let Holdings::Leases { client, leases } = holdings {
        return leases.grow(client, to as usize, concurrency).await;
    }
    let next = Arc::new(AtomicU64::new(from));
    let errors = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency.max(1) {
        let next = next.clone();
        let errors = errors.clone();
        let client = client.clone();
        let (holders, ttl) = match holdings {
            Holdings::Locks { holders } => (holders.clone(), HOLDER_TTL),
            Holdings::Sessions { ttl, .. } => (Vec::new(), *ttl),
            #[cfg(feature = "etcd")]
            Holdings::Leases { .. } => unreachable!("leases are granted above"),
        };
        let prefix = prefix.to_string();
        tasks.push(tokio::spawn(async move {
            let mut opened = Vec::new();
            loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= to {
                    return opened;
                }
                loop {
                    let done = if holders.is_empty() {
                        match crate::targets::raftlock::session(&client, ttl).await {
                            Ok(s) => {
                                opened.push(s);
                                true
                            }
                            Err(_) => false,
                        }
                    } else {
                        let holder = &holders[(k % holders.len() as u64) as usize];
                        match holder.try_lock(&format!("{prefix}/held/{k}")).await {
                            Ok(Some(guard)) => {
                                // Held until the holder session closes; the
                                // guard must not release it on drop.
                                std::mem::forget(guard);
                                true
                            }
                            Ok(None) | Err(_) => false,
                        }
                    };
                    if done {
                        break;
                    }
                    if errors.fetch_add(1, Ordering::Relaxed) > 10_000 {
                        return opened;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }));
    }
    for t in tasks {
        let opened = t.await.context("fill task")?;
        if let Holdings::Sessions { open, .. } = holdings {
            open.extend(opened);
        }
    }
    let e = errors.load(Ordering::Relaxed);
    anyhow::ensure!(e <= 10_000, "filling failed {e} times; giving up");
    Ok(())
}

/// What raftlock holds for `kind` up to `top`.
async fn raftlock_holdings(
    client: &Client,
    kind: Kind,
    top: u64,
    live_ttl: Duration,
) -> anyhow::Result<Holdings> {
    Ok(match kind {
        Kind::Locks => {
            let n = top.div_ceil(LOCKS_PER_HOLDER).max(1) as usize;
            let mut holders = Vec::with_capacity(n);
            for _ in 0..n {
                holders.push(
                    crate::targets::raftlock::session(client, HOLDER_TTL)
                        .await
                        .context("holder session")?,
                );
            }
            Holdings::Locks { holders }
        }
        Kind::Sessions => Holdings::Sessions {
            open: Vec::new(),
            ttl: HOLDER_TTL,
        },
        Kind::SessionsHeld => Holdings::Sessions {
            open: Vec::new(),
            ttl: live_ttl,
        },
    })
}

/// Keep-alives answered so far: raftlock's nodes' counters (with
/// `--metrics`), or the etcd keeper's; `None` if not counted.
async fn answered(holdings: &Holdings, metrics: &[String]) -> Option<u64> {
    match holdings {
        #[cfg(feature = "etcd")]
        Holdings::Leases { leases, .. } => Some(leases.answered()),
        _ if metrics.is_empty() => None,
        _ => keepalives_answered(metrics).await.ok(),
    }
}

/// Runs the scale benchmark.
pub async fn run(args: ScaleArgs) -> anyhow::Result<()> {
    let mut steps = args.steps.clone();
    steps.sort_unstable();
    steps.dedup();
    let top = steps.last().copied().unwrap_or(0);
    let client = crate::targets::raftlock::client(&args.endpoints).await?;
    let prefix = format!("scale-{:08x}", rand::random::<u32>());
    let live_ttl = Duration::from_secs(args.live_ttl.max(1));
    let mut holdings = match (args.target, args.kind) {
        (Target::Raftlock, _) => raftlock_holdings(&client, args.kind, top, live_ttl).await?,
        #[cfg(feature = "etcd")]
        (Target::Etcd, Kind::SessionsHeld) => Holdings::Leases {
            client: Box::new(crate::targets::etcd::connect(&args.endpoints).await?),
            // Keep-alives go to the leader, as raftlock's client sends
            // them: a follower of etcd 3.4 forwards each one to the leader
            // as an HTTP request of its own, one at a time per stream.
            leases: crate::targets::etcd_leases::HeldLeases::new(
                &args.endpoints[crate::targets::etcd::leader_index(&args.endpoints).await?],
                live_ttl,
            ),
        },
        (t, k) => anyhow::bail!(
            "scale --kind {k:?} runs against raftlock only, not {} (etcd: sessions-held, with the `etcd` feature)",
            t.name()
        ),
    };
    let mut result = ScaleResult {
        kind: match args.kind {
            Kind::Locks => "locks",
            Kind::Sessions => "sessions",
            Kind::SessionsHeld => "sessions-held",
        }
        .to_string(),
        target: args.target.name().to_string(),
        clients: args.clients,
        baseline_rss: args.pids.iter().map(|p| rss(*p)).collect(),
        steps: Vec::new(),
    };
    let mut have = 0;
    for &step in &steps {
        let t = Instant::now();
        if !args.quiet {
            eprintln!("raftlock-bench: scale: filling to {step} {}", result.kind);
        }
        fill(
            &client,
            &mut holdings,
            &prefix,
            have,
            step,
            args.fill_concurrency,
        )
        .await?;
        let fill_secs = t.elapsed().as_secs_f64();
        let filled = step - have;
        have = step;
        let opts = Opts {
            endpoints: args.endpoints.clone(),
            workload: Workload::Uncontended,
            capacity: 1,
            ttl: Duration::from_secs(10),
            prefix: format!("{prefix}/load{step}"),
            poll_backoff: (Duration::from_millis(1), Duration::from_millis(16)),
        };
        let plan = Plan {
            goal: Goal::Time(Duration::from_secs_f64(args.secs)),
            warmup: Duration::from_secs(1),
            label: format!("raftlock/scale {step} {}", result.kind),
            quiet: args.quiet,
            cpu_pids: Vec::new(),
        };
        let cpu_before: Vec<u64> = args.pids.iter().map(|p| crate::cpu::ticks(*p)).collect();
        let answered_before = answered(&holdings, &args.metrics).await;
        let measured = Instant::now();
        let m = drive(args.target, &opts, args.clients, &plan, Ctx::new(false)).await?;
        let wall = measured.elapsed().as_secs_f64().max(1e-9);
        let answered_after = answered(&holdings, &args.metrics).await;
        let cpu_percent = args
            .pids
            .iter()
            .zip(&cpu_before)
            .map(|(p, before)| {
                round3(
                    crate::cpu::ticks(*p).saturating_sub(*before) as f64
                        / crate::cpu::TICKS_PER_SEC
                        / wall
                        * 100.0,
                )
            })
            .collect();
        let (keepalives_per_sec, keepalives_answered_per_sec, sessions_lost) = match args.kind {
            Kind::SessionsHeld => (
                round3(holdings.len() as f64 / (live_ttl.as_secs_f64() / 3.0)),
                match (answered_before, answered_after) {
                    (Some(b), Some(a)) => round3(a.saturating_sub(b) as f64 / wall),
                    _ => 0.0,
                },
                holdings.lost(),
            ),
            _ => (0.0, 0.0, 0),
        };
        let rss: Vec<Rss> = args.pids.iter().map(|p| rss(*p)).collect();
        let max_rss = rss.iter().map(|r| r.rss_kib).max().unwrap_or(0);
        let s = Step {
            count: step,
            fill_secs: round3(fill_secs),
            fill_per_sec: round3(filled as f64 / fill_secs.max(1e-9)),
            ops_per_sec: round3(m.ops as f64 / m.window.as_secs_f64().max(1e-9)),
            p50_ms: round3(m.latencies.quantile_ms(0.5)),
            p99_ms: round3(m.latencies.quantile_ms(0.99)),
            p999_ms: round3(m.latencies.quantile_ms(0.999)),
            errors: m.errors,
            rss,
            max_rss_mib: round3(max_rss as f64 / 1024.0),
            load_avg: load_avg(),
            cpu_percent,
            keepalives_per_sec,
            keepalives_answered_per_sec,
            sessions_lost,
        };
        println!(
            "scale {:<8} {:>8} {:<13}  fill {:>8.0}/s  load {:>8.0} ops/s  p99 {:>7.2} ms  max node RSS {:>7.1} MiB  node CPU {:?} %  keep-alives {:.0}/s needed, {:.0}/s answered  lost {}  (load avg {})",
            result.target, s.count, result.kind, s.fill_per_sec, s.ops_per_sec, s.p99_ms, s.max_rss_mib, s.cpu_percent, s.keepalives_per_sec, s.keepalives_answered_per_sec, s.sessions_lost, s.load_avg
        );
        result.steps.push(s);
        if let Some(path) = &args.json {
            write_json(path, &result)?;
        }
    }
    if !args.no_cleanup {
        let sessions = match holdings {
            Holdings::Locks { holders } => holders,
            Holdings::Sessions { open, .. } => open,
            #[cfg(feature = "etcd")]
            Holdings::Leases { .. } => Vec::new(),
        };
        let closes = futures::future::join_all(sessions.iter().map(|s| s.close()));
        let _ = tokio::time::timeout(Duration::from_secs(60), closes).await;
    }
    Ok(())
}
