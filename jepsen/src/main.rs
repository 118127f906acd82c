//! `raftlock-jepsen`: runs raftlock under faults and checks what clients
//! saw. See `docs/testing/harness.md`.
//!
//! * `raftlock-jepsen run --nodes 3 --time-limit 60 --nemesis kill,pause,partition
//!   --workload fenced-counter --concurrency 4 --seed 1 --out DIR`
//! * `raftlock-jepsen check --out DIR --workload NAME` re-checks a finished
//!   run.
//! * `raftlock-jepsen campaign --runs N --nodes 3,5 --workloads ... --nemesis
//!   ... --time-limit S --out DIR` runs a seeded matrix and writes
//!   `DIR/summary.html` and `DIR/summary.json`.
//!
//! Exit codes: 0 valid, 1 invalid, 2 the harness itself failed (bad
//! arguments, no raftlockd, the cluster never came up), 130 interrupted.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use raftlock_jepsen::campaign::{self, CampaignArgs};
use raftlock_jepsen::run::{self, RunArgs};
use raftlock_jepsen::workload::WorkloadKind;

#[derive(Parser)]
#[command(
    name = "raftlock-jepsen",
    version,
    about = "fault-injection harness for raftlock: real nodes, a nemesis, a history, checkers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a test and check it.
    Run(RunArgs),
    /// Run a seeded matrix of runs and summarize them.
    Campaign(CampaignArgs),
    /// Re-check a finished run's history.
    Check {
        /// The run's output directory.
        #[arg(long)]
        out: PathBuf,
        /// The workload that ran.
        #[arg(long, value_enum, default_value = "fenced-counter")]
        workload: WorkloadKind,
        /// Semaphore capacity of the run.
        #[arg(long, default_value_t = 3)]
        capacity: u32,
        /// Linearizability search budget per lock, in seconds.
        #[arg(long, default_value_t = 60)]
        linearizability_timeout: u64,
    },
}

/// How many anomalies `results` reports: a run's `results.json` lists
/// them; a campaign's summary counts them.
fn anomaly_count(results: &serde_json::Value) -> usize {
    let a = &results["anomalies"];
    a.as_array()
        .map(Vec::len)
        .or_else(|| a.as_u64().and_then(|n| usize::try_from(n).ok()))
        .unwrap_or(0)
}

fn summarize(results: &serde_json::Value) {
    if let Some(checkers) = results["checkers"].as_object() {
        for (name, c) in checkers {
            eprintln!(
                "  {name:<18} {}",
                if c["valid"].as_bool() == Some(false) {
                    "INVALID"
                } else {
                    "ok"
                }
            );
        }
    }
    let anomalies = anomaly_count(results);
    for a in results["anomalies"]
        .as_array()
        .into_iter()
        .flatten()
        .take(5)
    {
        eprintln!("  anomaly: {}", a["message"].as_str().unwrap_or("?"));
    }
    eprintln!(
        "raftlock-jepsen: {} ({} ops, {} anomalies)",
        if results["valid"].as_bool() == Some(true) {
            "VALID"
        } else {
            "INVALID"
        },
        results["ops"],
        anomalies
    );
}

async fn interrupted() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

fn main() {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = runtime.block_on(async {
        let result = match cli.command {
            Command::Run(args) => {
                let out = args.out.clone();
                tokio::select! {
                    r = run::run(args) => r.inspect(|_| {
                        eprintln!("raftlock-jepsen: results in {}", out.join("results.json").display());
                    }),
                    _ = interrupted() => {
                        eprintln!("raftlock-jepsen: interrupted; stopping every node");
                        return 130;
                    }
                }
            }
            Command::Campaign(args) => {
                let out = args.out.clone();
                tokio::select! {
                    r = campaign::campaign(args) => r.inspect(|o| {
                        eprintln!(
                            "raftlock-jepsen campaign: {} of {} runs valid; summary in {}",
                            o.results["valid_runs"], o.results["runs"],
                            out.join("summary.html").display()
                        );
                    }),
                    _ = interrupted() => {
                        eprintln!("raftlock-jepsen: interrupted; stopping every node");
                        return 130;
                    }
                }
            }
            Command::Check {
                out,
                workload,
                capacity,
                linearizability_timeout,
            } => run::recheck(
                &out,
                workload,
                capacity,
                Duration::from_secs(linearizability_timeout),
            ),
        };
        match result {
            Ok(outcome) => {
                summarize(&outcome.results);
                if outcome.valid {
                    0
                } else {
                    1
                }
            }
            Err(e) => {
                eprintln!("raftlock-jepsen: {e:#}");
                2
            }
        }
    });
    // Dropping the runtime drops every task, and with them the cluster,
    // whose Drop kills every node still running.
    drop(runtime);
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use super::anomaly_count;
    use serde_json::json;

    #[test]
    fn the_last_line_counts_a_runs_and_a_campaigns_anomalies() {
        assert_eq!(anomaly_count(&json!({"anomalies": [{}, {}]})), 2);
        // A campaign's summary.json counts them (one invalid run of 64
        // once printed "INVALID (390695 ops, 0 anomalies)").
        assert_eq!(anomaly_count(&json!({"anomalies": 1, "valid": false})), 1);
        assert_eq!(anomaly_count(&json!({"valid": true})), 0);
    }
}
