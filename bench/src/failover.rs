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

/// Grants seen in the last half second that count as "flowing again".
const RECOVERED_GRANTS: usize = 3;

/// The grant that ends the outage: of the grants after `killed_at`, the
/// one with the longest wait since the grant before it (which may be
/// before the kill). `grants` is sorted.
fn outage_end(grants: &[Instant], killed_at: Instant) -> Option<Instant> {
    grants
        .windows(2)
        .filter(|w| w[1] > killed_at)
        .max_by_key(|w| w[1] - w[0])
        .map(|w| w[1])
        .or_else(|| grants.iter().copied().find(|t| *t > killed_at))
}

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
    /// Kill → the end of the outage: the first grant after the longest
    /// stretch without grants that ends after the kill (`null` if grants
    /// did not flow again within the timeout).
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
        cpu_pids: Vec::new(),
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
    // Wait until grants flow again (a few in the last half second). The
    // first grant seen after the kill is not the end of the outage: an
    // answer the dead leader sent just before it died can arrive after.
    let recovered = loop {
        let now = Instant::now();
        let recent = ctx
            .grants()
            .into_iter()
            .filter(|t| *t > killed_at && now - *t <= Duration::from_millis(500))
            .count();
        if recent >= RECOVERED_GRANTS {
            break true;
        }
        if now >= limit {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    // A little steady state after recovery, then stop.
    tokio::time::sleep(Duration::from_secs(1)).await;
    ctx.stop();
    load.await.context("load task")??;
    let mut grants = ctx.grants();
    grants.sort();
    let before: Vec<Instant> = grants.iter().copied().filter(|t| *t <= killed_at).collect();
    let steady_max_gap = before
        .windows(2)
        .filter(|w| w[1] + Duration::from_secs(1) >= killed_at)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    let first_after = recovered.then(|| outage_end(&grants, killed_at)).flatten();
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
            "{} failover: kill leader -> grants flow again after {g:.0} ms (steady-state max gap {:.1} ms, load {})",
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: &[u64]) -> Vec<Instant> {
        ms.iter()
            .map(|m| base + Duration::from_millis(*m))
            .collect()
    }

    #[test]
    fn the_outage_ends_at_the_grant_after_the_longest_silence() {
        let base = Instant::now();
        let kill = base + Duration::from_millis(100);
        // Steady grants, the kill, then grants again after ~1.1 s.
        let g = at(base, &[90, 95, 99, 1_200, 1_202, 1_205]);
        assert_eq!(
            outage_end(&g, kill),
            Some(base + Duration::from_millis(1_200))
        );
        // An answer the dead leader sent just before the kill arrives
        // right after it: it does not end the outage.
        let g = at(base, &[90, 95, 99, 100, 101, 1_200, 1_202]);
        assert_eq!(
            outage_end(&g, kill),
            Some(base + Duration::from_millis(1_200))
        );
        // A kill that stopped nothing: the outage is the ordinary gap.
        let g = at(base, &[90, 95, 99, 103, 105]);
        assert_eq!(
            outage_end(&g, kill),
            Some(base + Duration::from_millis(103))
        );
        // Nothing after the kill: no end.
        assert_eq!(outage_end(&at(base, &[90, 95]), kill), None);
    }
}
