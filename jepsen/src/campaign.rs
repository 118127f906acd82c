//! `raftlock-jepsen campaign`: a seeded matrix of runs, one after another,
//! summarized in `DIR/summary.json` and `DIR/summary.html` (rewritten
//! after every run, so a campaign in progress can be watched).
//!
//! The matrix is every combination of `--workloads` × `--nemesis` ×
//! `--nodes`, in that order; run `i` takes combination `i mod count` and
//! seed `--seed + i`, so `--runs` at least the number of combinations
//! covers each at least once. In `--nemesis`, commas separate the choices
//! and `+` combines faults within one run: `kill,pause+partition,all` is
//! three choices.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::{json, Value};

use crate::nemesis::{CutMode, NemesisKind};
use crate::report::esc;
use crate::run::{self, NetMode, RunArgs};
use crate::workload::WorkloadKind;

/// Everything `raftlock-jepsen campaign` takes.
#[derive(Clone, Debug, clap::Args)]
pub struct CampaignArgs {
    /// Number of runs.
    #[arg(long, default_value_t = 10)]
    pub runs: u64,
    /// Cluster sizes to use, comma-separated.
    #[arg(long, default_value = "3,5")]
    pub nodes: String,
    /// Workloads to use, comma-separated.
    #[arg(long, default_value = "fenced-counter,lock,semaphore,clients")]
    pub workloads: String,
    /// Fault choices, comma-separated; `+` combines faults in one run.
    #[arg(long, default_value = "kill,pause,partition,membership,all")]
    pub nemesis: String,
    /// Seconds of workload under faults per run.
    #[arg(long, default_value_t = 60)]
    pub time_limit: u64,
    /// Seed of the first run (run i uses seed + i).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Client workers per run.
    #[arg(long, default_value_t = 4)]
    pub concurrency: u64,
    /// Output directory: one subdirectory per run, plus the summaries.
    #[arg(long)]
    pub out: PathBuf,
    /// The raftlockd binary (default: next to this executable).
    #[arg(long)]
    pub raftlockd: Option<PathBuf>,
    /// Networks to use, comma-separated: `proxy`, `netns` (see `run
    /// --net`).
    #[arg(long, default_value = "proxy")]
    pub net: String,
    /// Every run with peer authentication (see `run --peer-auth`).
    #[arg(long)]
    pub peer_auth: bool,
}

/// One combination of the matrix.
#[derive(Clone, Debug)]
struct Cell {
    workload: WorkloadKind,
    nemesis: String,
    nodes: u64,
    net: NetMode,
}

fn matrix(args: &CampaignArgs) -> anyhow::Result<Vec<Cell>> {
    let nodes: Vec<u64> = args
        .nodes
        .split(',')
        .map(|n| n.trim().parse::<u64>())
        .collect::<Result<_, _>>()
        .map_err(|_| anyhow::anyhow!("--nodes takes sizes like 3,5, got {:?}", args.nodes))?;
    let workloads: Vec<WorkloadKind> = args
        .workloads
        .split(',')
        .map(|w| {
            <WorkloadKind as clap::ValueEnum>::from_str(w.trim(), false)
                .map_err(|e| anyhow::anyhow!("--workloads: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut nemeses = Vec::new();
    for choice in args.nemesis.split(',').map(str::trim) {
        let set = choice.replace('+', ",");
        NemesisKind::parse_list(&set)?;
        nemeses.push(set);
    }
    anyhow::ensure!(
        !nodes.is_empty() && !workloads.is_empty() && !nemeses.is_empty(),
        "the matrix is empty"
    );
    let nets: Vec<NetMode> = args
        .net
        .split(',')
        .map(|n| {
            <NetMode as clap::ValueEnum>::from_str(n.trim(), false)
                .map_err(|e| anyhow::anyhow!("--net: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut cells = Vec::new();
    for w in &workloads {
        for n in &nemeses {
            for size in &nodes {
                for net in &nets {
                    cells.push(Cell {
                        workload: *w,
                        nemesis: n.clone(),
                        nodes: *size,
                        net: *net,
                    });
                }
            }
        }
    }
    Ok(cells)
}

fn run_args(args: &CampaignArgs, cell: &Cell, seed: u64, out: PathBuf) -> RunArgs {
    RunArgs {
        nodes: cell.nodes,
        time_limit: args.time_limit,
        nemesis: cell.nemesis.clone(),
        workload: cell.workload,
        lease_paths: "all".into(),
        concurrency: args.concurrency,
        seed,
        out,
        raftlockd: args.raftlockd.clone(),
        ttl_ms: 3000,
        keys: 2,
        capacity: 3,
        client_pauses: 0.05,
        cut_mode: CutMode::Mixed,
        recovery: 5,
        linearizability_timeout: 60,
        broken_store: false,
        peer_auth: args.peer_auth,
        net: cell.net,
        store: crate::dbstore::StoreKind::Memory,
        store_url: None,
    }
}

fn kebab(w: WorkloadKind) -> String {
    serde_json::to_value(w)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Runs the campaign; the summary's `valid` is false if any run was
/// invalid or could not run.
pub async fn campaign(args: CampaignArgs) -> anyhow::Result<run::Outcome> {
    anyhow::ensure!(args.runs >= 1, "--runs must be at least 1");
    let cells = matrix(&args)?;
    std::fs::create_dir_all(&args.out)?;
    let started = Instant::now();
    let mut rows: Vec<Value> = Vec::new();
    let mut availability: Vec<Value> = Vec::new();
    for i in 0..args.runs {
        let cell = &cells[(i % cells.len() as u64) as usize];
        let seed = args.seed + i;
        let name = format!(
            "run-{i:03}-{}-{}-{}n{}",
            kebab(cell.workload),
            cell.nemesis.replace(',', "+"),
            cell.nodes,
            if cell.net == NetMode::Netns {
                "-netns"
            } else {
                ""
            }
        );
        eprintln!(
            "raftlock-jepsen campaign: run {}/{}: {name}, seed {seed}",
            i + 1,
            args.runs
        );
        let out = args.out.join(&name);
        let t = Instant::now();
        let row = match run::run(run_args(&args, cell, seed, out)).await {
            Ok(outcome) => {
                let r = &outcome.results;
                let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
                for w in r["nemesis"].as_array().into_iter().flatten() {
                    *kinds
                        .entry(w["kind"].as_str().unwrap_or("?").into())
                        .or_default() += 1;
                }
                availability.push(r["availability"].clone());
                json!({
                    "run": i, "dir": name, "seed": seed, "nodes": cell.nodes,
                    "workload": cell.workload, "nemesis": cell.nemesis, "net": cell.net,
                    "time_limit_s": args.time_limit, "peer_auth": args.peer_auth,
                    "faults_by_kind": kinds,
                    "ops": r["ops"], "faults": r["nemesis"].as_array().map_or(0, Vec::len),
                    "anomalies": r["anomalies"].as_array().map_or(0, Vec::len),
                    "verdict": if outcome.valid { "valid" } else { "INVALID" },
                    "wall_s": t.elapsed().as_secs_f64(),
                })
            }
            Err(e) => json!({
                "run": i, "dir": name, "seed": seed, "nodes": cell.nodes,
                "workload": cell.workload, "nemesis": cell.nemesis, "net": cell.net,
                "time_limit_s": args.time_limit,
                "ops": 0, "faults": 0, "anomalies": 0,
                "verdict": "error", "error": format!("{e:#}"),
                "wall_s": t.elapsed().as_secs_f64(),
            }),
        };
        eprintln!(
            "raftlock-jepsen campaign: run {}: {} ({} ops, {} faults)",
            i + 1,
            row["verdict"],
            row["ops"],
            row["faults"]
        );
        rows.push(row);
        write_summary(
            &args.out,
            &rows,
            &availability,
            started.elapsed().as_secs_f64(),
        )?;
    }
    let summary = write_summary(
        &args.out,
        &rows,
        &availability,
        started.elapsed().as_secs_f64(),
    )?;
    let valid = summary["valid"].as_bool() == Some(true);
    Ok(run::Outcome {
        results: summary,
        valid,
    })
}

fn write_summary(
    dir: &Path,
    rows: &[Value],
    availability: &[Value],
    wall_s: f64,
) -> anyhow::Result<Value> {
    let count = |v: &str| rows.iter().filter(|r| r["verdict"] == v).count();
    let sum = |k: &str| rows.iter().map(|r| r[k].as_u64().unwrap_or(0)).sum::<u64>();
    let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
    for r in rows {
        for (k, n) in r["faults_by_kind"].as_object().into_iter().flatten() {
            *kinds.entry(k.clone()).or_default() += n.as_u64().unwrap_or(0);
        }
    }
    let summary = json!({
        "faults_by_kind": kinds,
        "recovery": crate::availability::merge(availability),
        "valid": count("valid") == rows.len(),
        "runs": rows.len(),
        "valid_runs": count("valid"),
        "invalid_runs": count("INVALID"),
        "error_runs": count("error"),
        "ops": sum("ops"),
        "faults": sum("faults"),
        "anomalies": sum("anomalies"),
        "wall_s": wall_s,
        "table": rows,
    });
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_string_pretty(&summary)?,
    )?;
    std::fs::write(dir.join("summary.html"), render(&summary))?;
    Ok(summary)
}

fn render(summary: &Value) -> String {
    let mut html = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>raftlock-jepsen campaign</title>\
         <style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}\
         td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}\
         .valid{background:#dfd}.INVALID{background:#fbb}.error{background:#fe9}</style></head><body>",
    );
    html.push_str(&format!(
        "<h1>raftlock-jepsen campaign: {}</h1><p>{} runs: {} valid, {} invalid, {} could not run; \
         {} operations, {} faults injected, {} anomalies; {:.0} s.</p>",
        if summary["valid"] == true {
            "VALID"
        } else {
            "NOT VALID"
        },
        summary["runs"],
        summary["valid_runs"],
        summary["invalid_runs"],
        summary["error_runs"],
        summary["ops"],
        summary["faults"],
        summary["anomalies"],
        summary["wall_s"].as_f64().unwrap_or(0.0),
    ));
    html.push_str(
        "<h2>Faults and recovery by kind</h2><p>Recovery: from the end of a fault to the first \
         grant answered after it; rejoin: until the nodes it touched had caught up.</p><table>\
         <tr><th>kind</th><th>faults</th><th>median</th><th>worst</th><th>never recovered</th>\
         <th>rejoin median</th><th>rejoin worst</th></tr>",
    );
    let ms = |v: &Value| v.as_f64().map_or("-".into(), |m| format!("{m:.0} ms"));
    for (kind, k) in summary["recovery"].as_object().into_iter().flatten() {
        html.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(kind),
            k["faults"],
            ms(&k["median_ms"]),
            ms(&k["worst_ms"]),
            k["unrecovered"],
            ms(&k["rejoin_median_ms"]),
            ms(&k["rejoin_worst_ms"]),
        ));
    }
    html.push_str("</table><h2>Runs</h2>");
    html.push_str(
        "<table><tr><th>run</th><th>seed</th><th>nodes</th><th>workload</th><th>nemesis</th>\
         <th>ops</th><th>faults</th><th>anomalies</th><th>verdict</th><th>wall s</th><th>report</th></tr>",
    );
    for r in summary["table"].as_array().into_iter().flatten() {
        let verdict = r["verdict"].as_str().unwrap_or("?");
        let dir = r["dir"].as_str().unwrap_or("");
        let detail = r["error"]
            .as_str()
            .map(|e| format!(" title=\"{}\"", esc(e)))
            .unwrap_or_default();
        html.push_str(&format!(
            "<tr class=\"{verdict}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td{detail}>{}</td><td>{:.0}</td>\
             <td><a href=\"{d}/report.html\">report</a> · <a href=\"{d}/results.json\">results</a></td></tr>",
            r["run"],
            r["seed"],
            r["nodes"],
            esc(r["workload"].as_str().unwrap_or("")),
            esc(r["nemesis"].as_str().unwrap_or("")),
            r["ops"],
            r["faults"],
            r["anomalies"],
            esc(verdict),
            r["wall_s"].as_f64().unwrap_or(0.0),
            d = esc(dir),
        ));
    }
    html.push_str("</table></body></html>\n");
    html
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(nodes: &str, workloads: &str, nemesis: &str) -> CampaignArgs {
        CampaignArgs {
            runs: 1,
            nodes: nodes.into(),
            workloads: workloads.into(),
            nemesis: nemesis.into(),
            time_limit: 1,
            seed: 1,
            concurrency: 1,
            out: "/nonexistent".into(),
            raftlockd: None,
            net: "proxy".into(),
            peer_auth: false,
        }
    }

    #[test]
    fn the_matrix_is_every_combination() {
        let cells = matrix(&args("3,5", "lock,clients", "kill,pause+partition")).unwrap();
        assert_eq!(cells.len(), 8);
        assert_eq!(cells[0].workload, WorkloadKind::Lock);
        assert_eq!(cells[1].nodes, 5);
        assert_eq!(cells[2].nemesis, "pause,partition");
        assert!(matrix(&args("3", "nope", "kill")).is_err());
        assert!(matrix(&args("x", "lock", "kill")).is_err());
        assert!(matrix(&args("3", "lock", "kill+bogus")).is_err());
    }

    #[test]
    fn the_summary_counts_and_links_every_run() {
        let dir = tempfile::tempdir().unwrap();
        let rows = vec![
            json!({"run": 0, "dir": "run-000", "seed": 1, "nodes": 3, "workload": "lock",
                   "nemesis": "kill", "ops": 10, "faults": 2, "anomalies": 0, "verdict": "valid", "wall_s": 1.0}),
            json!({"run": 1, "dir": "run-001", "seed": 2, "nodes": 5, "workload": "clients",
                   "nemesis": "all", "ops": 5, "faults": 1, "anomalies": 3, "verdict": "INVALID", "wall_s": 1.0}),
        ];
        let s = write_summary(dir.path(), &rows, &[], 2.0).unwrap();
        assert_eq!(s["valid"], json!(false));
        assert_eq!(s["ops"], json!(15));
        assert_eq!(s["invalid_runs"], json!(1));
        let html = std::fs::read_to_string(dir.path().join("summary.html")).unwrap();
        assert!(html.contains("run-001/report.html") && html.contains("NOT VALID"));
        let back: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("summary.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(back["table"].as_array().unwrap().len(), 2);
    }
}
