//! `raftlock-bench`: drives raftlock, etcd or Redis with the same lock
//! workloads and reports throughput and latency percentiles.
//!
//! ```text
//! raftlock-bench run --target raftlock --workload contended --endpoints 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103 --clients 64 --duration 20 --json out.json
//! raftlock-bench failover --target raftlock --endpoints … --pids 101,102,103 --json f.json
//! raftlock-bench scale --kind locks --endpoints … --pids … --steps 1000,10000,100000,1000000
//! raftlock-bench report --runs DIR --out bench/results/latest.json
//! raftlock-bench proxy --route 127.0.0.1:7201=127.0.0.1:7101 --delay-us 100
//! ```
//!
//! `bench/compare.sh` starts all three systems and runs everything; see
//! `docs/performance/README.md` for what the figures mean and what limits
//! them, and `docs/performance/reproduce.md` for how to run them.

mod cpu;
mod driver;
mod failover;
mod progress;
mod proxy;
mod report;
mod scale;
mod stages;
mod stats;
mod targets;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};

use crate::driver::{Ctx, Plan, Worker};
use crate::progress::Goal;
use crate::stats::{load_avg, round3, RunResult, Summary};
use crate::targets::{Opts, Target, Workload};

#[derive(Parser)]
#[command(
    name = "raftlock-bench",
    version,
    about = "side-by-side lock benchmark: raftlock, etcd, Redis"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Drive one target with one workload and report.
    Run(RunArgs),
    /// Kill the leader under the contended workload; measure the gap until
    /// the next successful acquire.
    Failover(failover::FailoverArgs),
    /// raftlock with many held locks or open sessions: throughput and node
    /// RSS at each step.
    Scale(scale::ScaleArgs),
    /// Wait until the target grants and releases a lock.
    Wait(WaitArgs),
    /// Merge run results into one JSON and print the comparison table.
    Report(report::ReportArgs),
    /// TCP proxies that add the same delay to every chunk, both ways
    /// (`compare.sh --rtt`).
    Proxy(proxy::ProxyArgs),
}

/// Where the target is and how the clients behave.
#[derive(Args, Clone)]
pub struct TargetArgs {
    /// System to drive.
    #[arg(long, value_enum)]
    target: Target,
    /// Node addresses, comma-separated (host:port).
    #[arg(long, value_delimiter = ',', required = true)]
    endpoints: Vec<String>,
    /// Session / lease / key ttl in seconds.
    #[arg(long, default_value_t = 10)]
    ttl: u64,
    /// Semaphore capacity K.
    #[arg(long, default_value_t = 8)]
    capacity: u32,
    /// Polling targets (Redis, etcd semaphore): first pause between polls,
    /// in ms; doubles up to --poll-max-ms with ±50% jitter.
    #[arg(long, default_value_t = 1.0)]
    poll_first_ms: f64,
    /// Largest pause between polls, in ms.
    #[arg(long, default_value_t = 16.0)]
    poll_max_ms: f64,
}

impl TargetArgs {
    fn opts(&self, workload: Workload) -> Opts {
        Opts {
            endpoints: self.endpoints.clone(),
            workload,
            capacity: self.capacity.max(1),
            ttl: Duration::from_secs(self.ttl.max(1)),
            prefix: format!("bench-{:08x}", rand::random::<u32>()),
            poll_backoff: (
                Duration::from_secs_f64(self.poll_first_ms.max(0.01) / 1e3),
                Duration::from_secs_f64(self.poll_max_ms.max(0.01) / 1e3),
            ),
        }
    }
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Workload.
    #[arg(long, value_enum)]
    workload: Workload,
    /// Concurrent clients.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Seconds to measure (after warm-up).
    #[arg(long, default_value_t = 20.0, conflicts_with = "ops")]
    duration: f64,
    /// Measure this many cycles instead of a duration.
    #[arg(long)]
    ops: Option<u64>,
    /// Seconds of unrecorded warm-up.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Write the result here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// raftlock only: the nodes' metrics addresses (host:port, comma-
    /// separated); prints where a write's time goes, stage by stage, from
    /// their `/debug/stages` (emptied when the window starts).
    #[arg(long, value_delimiter = ',')]
    trace_stages: Vec<String>,
    /// The server processes (comma-separated pids): the CPU time they all
    /// use over the measured window is reported per 1,000 operations,
    /// beside this load generator's own.
    #[arg(long, value_delimiter = ',')]
    pids: Vec<i32>,
}

#[derive(Args)]
struct WaitArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
}

/// Builds one worker per client, connecting them concurrently.
pub async fn workers<W, F, Fut>(clients: usize, make: F) -> anyhow::Result<Vec<W>>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<W>>,
{
    let made = futures::future::join_all((0..clients).map(make)).await;
    made.into_iter().collect()
}

/// Runs `clients` workers of `target` under `plan`.
pub async fn drive(
    target: Target,
    opts: &Opts,
    clients: usize,
    plan: &Plan,
    ctx: Arc<Ctx>,
) -> anyhow::Result<driver::Measured> {
    async fn go<W: Worker>(ws: Vec<W>, plan: &Plan, ctx: Arc<Ctx>) -> driver::Measured {
        driver::run(ws, plan, ctx).await
    }
    Ok(match target {
        Target::Raftlock => {
            let ws = workers(clients, |i| targets::raftlock::RaftlockWorker::new(opts, i)).await?;
            go(ws, plan, ctx).await
        }
        Target::Redis => {
            let ws = workers(clients, |i| targets::redis::RedisWorker::new(opts, i)).await?;
            go(ws, plan, ctx).await
        }
        #[cfg(feature = "etcd")]
        Target::Etcd => {
            let ws = workers(clients, |i| targets::etcd::EtcdWorker::new(opts, i)).await?;
            go(ws, plan, ctx).await
        }
        #[cfg(not(feature = "etcd"))]
        Target::Etcd => bail!("this raftlock-bench was built without the `etcd` feature"),
    })
}

fn note(target: Target, workload: Workload) -> String {
    match target {
        Target::Raftlock => match workload {
            Workload::Semaphore => targets::raftlock::NOTE_SEMAPHORE.to_string(),
            Workload::Sessions => "open session + lock + close session per cycle".to_string(),
            Workload::Oneshot => "Lock + Unlock per cycle (two writes)".to_string(),
            Workload::Multi => "AcquireAll of 4 names (one write) + 4 releases".to_string(),
            _ => String::new(),
        },
        Target::Redis => targets::redis::note(workload).to_string(),
        #[cfg(feature = "etcd")]
        Target::Etcd => targets::etcd::note(workload).to_string(),
        #[cfg(not(feature = "etcd"))]
        Target::Etcd => String::new(),
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let opts = args.target.opts(args.workload);
    let target = args.target.target;
    let goal = match args.ops {
        Some(n) => Goal::Ops(n),
        None => Goal::Time(Duration::from_secs_f64(args.duration.max(0.1))),
    };
    let plan = Plan {
        goal,
        warmup: Duration::from_secs_f64(args.warmup.max(0.0)),
        label: format!("{}/{}", target.name(), args.workload.name()),
        quiet: args.quiet,
        cpu_pids: args.pids.clone(),
    };
    if !args.trace_stages.is_empty() && target != Target::Raftlock {
        bail!("--trace-stages reads raftlockd's stage histograms: raftlock only");
    }
    let ctx = Ctx::new(false);
    let resetting = (!args.trace_stages.is_empty()).then(|| {
        let (ctx, nodes) = (ctx.clone(), args.trace_stages.clone());
        tokio::spawn(async move {
            ctx.window_started().await;
            stages::reset(&nodes).await
        })
    });
    let m = drive(target, &opts, args.clients, &plan, ctx.clone()).await?;
    let stage_rows = match resetting {
        Some(reset) => {
            reset.await.context("reset stages")??;
            Some(stages::collect(&args.trace_stages, &ctx.writes()).await?)
        }
        None => None,
    };
    let secs = m.window.as_secs_f64();
    let mut result = RunResult {
        target: target.name().into(),
        workload: args.workload.name().into(),
        clients: args.clients,
        secs: round3(secs),
        ops: m.ops,
        ops_per_sec: round3(m.ops as f64 / secs.max(1e-9)),
        errors: m.errors,
        note: note(target, args.workload),
        load_avg: load_avg(),
        server_cpu_s: m.cpu.map(|c| round3(c.servers_s)),
        bench_cpu_s: m.cpu.map(|c| round3(c.own_s)),
        ..RunResult::default()
    };
    result.set_latencies(&m.latencies);
    if args.workload == Workload::Contended && m.handoff.count() > 0 {
        result.handoff = Some(Summary::from(&m.handoff));
        result.handoff_histogram = m.handoff.to_pairs();
    }
    print_run(&result);
    if let Some(rows) = stage_rows {
        stages::print(&rows);
        result.stages = Some(rows);
    }
    if let Some(path) = &args.json {
        write_json(path, &result)?;
    }
    Ok(())
}

fn print_run(r: &RunResult) {
    println!(
        "{:<9} {:<12} clients {:>3}  {:>10.0} ops/s  p50 {:>8.2} ms  p99 {:>8.2} ms  p99.9 {:>8.2} ms  errors {}  (load {})",
        r.target, r.workload, r.clients, r.ops_per_sec, r.p50_ms, r.p99_ms, r.p999_ms, r.errors, r.load_avg
    );
    if let Some(h) = &r.handoff {
        println!(
            "{:<9} {:<12} hand-off (release sent -> next grant seen): p50 {:.2} ms  p99 {:.2} ms",
            r.target, r.workload, h.p50_ms, h.p99_ms
        );
    }
    if let (Some(server), Some(own)) = (r.server_cpu_s, r.bench_cpu_s) {
        let kop = |s| crate::cpu::per_kop(s, r.ops).map_or("-".into(), |v| format!("{v:.3}"));
        println!(
            "{:<9} {:<12} CPU s per 1,000 ops: servers {}  load generator {}  (servers used {:.2} cores)",
            r.target,
            r.workload,
            kop(server),
            kop(own),
            server / r.secs.max(1e-9)
        );
    }
}

/// Writes `value` as pretty JSON to `path`.
pub fn write_json<T: serde::Serialize>(path: &std::path::Path, value: &T) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("write {}", path.display()))
}

async fn wait(args: WaitArgs) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);
    let opts = args.target.opts(Workload::Uncontended);
    let plan = Plan {
        goal: Goal::Ops(1),
        warmup: Duration::ZERO,
        label: String::new(),
        quiet: true,
        cpu_pids: Vec::new(),
    };
    let mut last = String::new();
    while tokio::time::Instant::now() < deadline {
        let attempt = tokio::time::timeout(
            Duration::from_secs(10),
            drive(args.target.target, &opts, 1, &plan, Ctx::new(false)),
        )
        .await;
        match attempt {
            Ok(Ok(m)) if m.ops >= 1 => return Ok(()),
            Ok(Ok(_)) => last = "no cycle completed".into(),
            Ok(Err(e)) => last = format!("{e:#}"),
            Err(_) => last = "timed out".into(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!(
        "{} not ready after {} s: {last}",
        args.target.target.name(),
        args.timeout
    )
}

fn main() {
    let cli = Cli::parse();
    let rt = match &cli.command {
        Command::Proxy(a) if a.threads() == 1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Command::Proxy(a) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(a.threads())
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
    }
    .expect("tokio runtime");
    let result = rt.block_on(async move {
        match cli.command {
            Command::Run(a) => run(a).await,
            Command::Failover(a) => failover::run(a).await,
            Command::Scale(a) => scale::run(a).await,
            Command::Wait(a) => wait(a).await,
            Command::Report(a) => report::run(a),
            Command::Proxy(a) => proxy::run(a).await,
        }
    });
    // Client tasks (keep-alives) may still be parked; do not wait for them.
    rt.shutdown_timeout(Duration::from_millis(200));
    if let Err(e) = result {
        eprintln!("raftlock-bench: {e:#}");
        std::process::exit(1);
    }
}
