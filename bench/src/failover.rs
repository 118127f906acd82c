//! Failover: under the contended workload, SIGKILL the leader and measure
//! the gap from the kill to the next grant any client sees.
//!
//! The leader is found through the target's own status API and killed by
//! pid (`--pids`, in `--endpoints` order); restarting it is the caller's
//! business (`compare.sh` does it between rounds). The gap includes
//! everything a user waits for: failure detection, election, the clients
//! finding the new leader, and the previous holder's release (or the
//! queue's hand-off) going through it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::driver::{Ctx, Plan};
use crate::progress::Goal;
use crate::stats::{load_avg, round3};
use crate::targets::{Target, Workload};
use crate::{drive, write_json, TargetArgs};

/// `raftlock-bench failover` arguments.
#[derive(Args)]
pub struct FailoverArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Pids of the nodes, in the order of --endpoints.
    #[arg(long, value_delimiter = ',', required = true)]
    pids: Vec<i32>,
    /// Concurrent clients contending for one name.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Seconds of load before the kill.
    #[arg(long, default_value_t = 3.0)]
    before: f64,
    /// Give up waiting for the next grant after this many seconds.
    #[arg(long, default_value_t = 30.0)]
    timeout: f64,
    /// Write the result here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// What one failover round measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FailoverResult {
    /// `raftlock` or `etcd`.
    pub target: String,
    /// Index into the endpoints of the node killed.
    pub killed_index: usize,
    /// Its pid.
    pub killed_pid: i32,
    /// Kill → first grant seen after it (`null` if none within the
    /// timeout).
    pub gap_ms: Option<f64>,
    /// Largest gap between consecutive grants in the second before the
    /// kill (the steady-state baseline).
    pub steady_max_gap_ms: f64,
    /// Grants in the run before and after the kill.
    pub grants_before: usize,
    /// Grants after the kill.
    pub grants_after: usize,
    /// Clients.
    pub clients: usize,
    /// `/proc/loadavg` at the end.
    pub load_avg: String,
}

async fn leader_index(target: Target, endpoints: &[String]) -> anyhow::Result<usize> {
    match target {
        Target::Raftlock => {
            let client = crate::targets::raftlock::client(endpoints).await?;
            let status = client.status().await.context("raftlock status")?;
            let leader = status.leader.map(|(_, addr)| addr).unwrap_or_default();
            endpoints
                .iter()
                .position(|e| *e == leader)
                .with_context(|| format!("raftlock leader {leader:?} is not among the endpoints"))
        }
        #[cfg(feature = "etcd")]
        Target::Etcd => crate::targets::etcd::leader_index(endpoints).await,
        #[cfg(not(feature = "etcd"))]
        Target::Etcd => bail!("built without the `etcd` feature"),
        Target::Redis => bail!("redis is a single instance: no failover to measure"),
    }
}

/// Runs one failover round.
pub async fn run(args: FailoverArgs) -> anyhow::Result<()> {
    let target = args.target.target;
    anyhow::ensure!(
        args.pids.len() == args.target.endpoints.len(),
        "--pids must list one pid per endpoint, in the same order"
    );
    let opts = args.target.opts(Workload::Contended);
    let ctx = Ctx::new(true);
    let total = Duration::from_secs_f64(args.before + args.timeout + 5.0);
    let plan = Plan {
        goal: Goal::Time(total),
        warmup: Duration::ZERO,
        label: format!("{}/failover", target.name()),
        quiet: true,
    };
    let load = {
        let ctx = ctx.clone();
        let opts = opts.clone();
        let clients = args.clients;
        tokio::spawn(async move { drive(target, &opts, clients, &plan, ctx).await })
    };
    tokio::time::sleep(Duration::from_secs_f64(args.before)).await;
    if ctx.grants().is_empty() {
        ctx.stop();
        let _ = load.await;
        bail!("no grants before the kill: is the target up?");
    }
    let index = leader_index(target, &args.target.endpoints).await?;
    let pid = args.pids[index];
    let rc = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    let killed_at = Instant::now();
    if let Err(e) = rc {
        ctx.stop();
        let _ = load.await;
        bail!("kill -9 {pid} failed: {e}");
    }
    eprintln!(
        "raftlock-bench: killed {} leader #{index} ({}, pid {pid})",
        target.name(),
        args.target.endpoints[index]
    );
    let limit = killed_at + Duration::from_secs_f64(args.timeout);
    let first_after = loop {
        if let Some(t) = ctx.grants().into_iter().find(|t| *t > killed_at) {
            break Some(t);
        }
        if Instant::now() >= limit {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    // A little steady state after recovery, then stop.
    tokio::time::sleep(Duration::from_secs(1)).await;
    ctx.stop();
    load.await.context("load task")??;
    let grants = ctx.grants();
    let before: Vec<Instant> = grants.iter().copied().filter(|t| *t <= killed_at).collect();
    let steady_max_gap = before
        .windows(2)
        .filter(|w| w[1] + Duration::from_secs(1) >= killed_at)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    let result = FailoverResult {
        target: target.name().into(),
        killed_index: index,
        killed_pid: pid,
        gap_ms: first_after.map(|t| round3((t - killed_at).as_secs_f64() * 1e3)),
        steady_max_gap_ms: round3(steady_max_gap.as_secs_f64() * 1e3),
        grants_before: before.len(),
        grants_after: grants.len() - before.len(),
        clients: args.clients,
        load_avg: load_avg(),
    };
    match result.gap_ms {
        Some(g) => println!(
            "{} failover: kill leader -> next grant {g:.0} ms (steady-state max gap {:.1} ms, load {})",
            result.target, result.steady_max_gap_ms, result.load_avg
        ),
        None => println!(
            "{} failover: no grant within {} s of killing the leader",
            result.target, args.timeout
        ),
    }
    if let Some(path) = &args.json {
        write_json(path, &result)?;
    }
    Ok(())
}
