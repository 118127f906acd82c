//! `report`: merges the JSON of every run (rounds of the same workload and
//! target are merged exactly, histogram by histogram), the failover rounds
//! and the scale runs into one document, prints the side-by-side table
//! with ratios, and checks the targets.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use serde_json::{json, Map, Value};

use crate::failover::FailoverResult;
use crate::scale::ScaleResult;
use crate::stats::{round3, Latencies, RunResult, Summary};
use crate::targets::Workload;
use crate::write_json;

/// `raftlock-bench report` arguments.
#[derive(Args)]
pub struct ReportArgs {
    /// Folder of `run --json` files.
    #[arg(long)]
    runs: PathBuf,
    /// Folder of `failover --json` files.
    #[arg(long)]
    failover: Option<PathBuf>,
    /// `scale --json` files.
    #[arg(long, value_delimiter = ',')]
    scale: Vec<PathBuf>,
    /// `run --trace-stages --json` files (raftlock, one client per run):
    /// where a single write's time goes.
    #[arg(long, value_delimiter = ',')]
    stages: Vec<PathBuf>,
    /// Extra machine facts as KEY=VALUE (disk, fsync probe, …).
    #[arg(long = "machine")]
    machine: Vec<String>,
    /// The round trip `compare.sh --rtt` added to every link (client to
    /// node, node to node), in milliseconds, half each way through
    /// `raftlock-bench proxy`; without it the run was on plain loopback.
    #[arg(long)]
    rtt_ms: Option<f64>,
    /// Write the merged document here.
    #[arg(long)]
    out: PathBuf,
}

fn read_dir_json<T: serde::de::DeserializeOwned>(dir: &Path) -> anyhow::Result<Vec<T>> {
    let mut out = Vec::new();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    for p in paths {
        let text = std::fs::read_to_string(&p)?;
        out.push(serde_json::from_str(&text).with_context(|| format!("parse {}", p.display()))?);
    }
    Ok(out)
}

/// `path` parsed as JSON, or `None` if it cannot be read (a step that did
/// not run leaves no file); a file that is there but does not parse is an
/// error.
fn read_json_if_present<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<Option<T>> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(None);
    };
    let value = serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
    Ok(Some(value))
}

fn first_line_value(path: &str, key: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().and_then(|t| {
        t.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split(':').nth(1))
            .map(|v| v.trim().to_string())
    })
}

fn machine(extra: &[String]) -> Value {
    let mut m = Map::new();
    m.insert(
        "nproc".into(),
        json!(std::thread::available_parallelism().map_or(0, |n| n.get())),
    );
    m.insert(
        "cpu".into(),
        json!(first_line_value("/proc/cpuinfo", "model name").unwrap_or_default()),
    );
    let mem_kib: u64 = first_line_value("/proc/meminfo", "MemTotal")
        .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0);
    m.insert(
        "memory_gib".into(),
        json!(round3(mem_kib as f64 / 1024.0 / 1024.0)),
    );
    m.insert(
        "kernel".into(),
        json!(std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()),
    );
    for kv in extra {
        if let Some((k, v)) = kv.split_once('=') {
            m.insert(k.trim().to_string(), json!(v.trim()));
        }
    }
    Value::Object(m)
}

/// What the links of the run were: loopback, or loopback with a round
/// trip added by the proxies.
fn network(rtt_ms: Option<f64>) -> Value {
    match rtt_ms {
        None => json!({
            "rtt_ms_added": 0.0,
            "links": "127.0.0.1 directly, no proxy",
        }),
        Some(rtt) => json!({
            "rtt_ms_added": rtt,
            "links": format!(
                "every client-node and node-node link through raftlock-bench proxy, \
                 {rtt} ms added per round trip ({} ms each way)",
                rtt / 2.0
            ),
        }),
    }
}

/// Merged rounds of one (workload, target).
struct Merged {
    ops: u64,
    secs: f64,
    errors: u64,
    clients: usize,
    rounds: usize,
    latencies: Latencies,
    handoff: Latencies,
    note: String,
    loads: Vec<String>,
    /// CPU seconds of the servers and of the load generator over every
    /// round's window; `None` when a round did not measure it.
    server_cpu_s: Option<f64>,
    bench_cpu_s: Option<f64>,
}

fn ops_per_sec(m: &Merged) -> f64 {
    m.ops as f64 / m.secs.max(1e-9)
}

/// Server CPU seconds per 1,000 operations.
fn server_cpu_per_kop(m: &Merged) -> Option<f64> {
    crate::cpu::per_kop(m.server_cpu_s?, m.ops)
}

fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Some(v[v.len() / 2])
}

/// Builds the report.
pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    let runs: Vec<RunResult> = read_dir_json(&args.runs)?;
    let mut merged: BTreeMap<(String, String), Merged> = BTreeMap::new();
    for r in runs {
        let m = merged
            .entry((r.workload.clone(), r.target.clone()))
            .or_insert_with(|| Merged {
                ops: 0,
                secs: 0.0,
                errors: 0,
                clients: r.clients,
                rounds: 0,
                latencies: Latencies::default(),
                handoff: Latencies::default(),
                note: r.note.clone(),
                loads: Vec::new(),
                server_cpu_s: Some(0.0),
                bench_cpu_s: Some(0.0),
            });
        let add = |total: Option<f64>, round: Option<f64>| Some(total? + round?);
        m.server_cpu_s = add(m.server_cpu_s, r.server_cpu_s);
        m.bench_cpu_s = add(m.bench_cpu_s, r.bench_cpu_s);
        m.ops += r.ops;
        m.secs += r.secs;
        m.errors += r.errors;
        m.rounds += 1;
        m.latencies.merge(&Latencies::from_pairs(&r.histogram));
        m.handoff
            .merge(&Latencies::from_pairs(&r.handoff_histogram));
        m.loads.push(r.load_avg.clone());
    }

    let mut workloads = Map::new();
    let network = network(args.rtt_ms);
    println!("\nnetwork: {}", network["links"].as_str().unwrap_or("?"));
    println!(
        "\n{:<12} {:<9} {:>10} {:>9} {:>9} {:>9} {:>7} {:>10}  {:>13} {:>13}",
        "workload",
        "target",
        "ops/s",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "errors",
        "CPU s/1k",
        "vs etcd",
        "vs redis"
    );
    let workload_names: Vec<&str> = Workload::ALL.iter().map(|w| w.name()).collect();
    for w in &workload_names {
        let mut per_target = Map::new();
        let get = |t: &str| merged.get(&(w.to_string(), t.to_string()));
        let base = get("raftlock").map(ops_per_sec);
        for t in ["raftlock", "etcd", "redis"] {
            let Some(m) = get(t) else { continue };
            let s = Summary::from(&m.latencies);
            let ops = ops_per_sec(m);
            let mut entry = json!({
                "ops_per_sec": round3(ops),
                "p50_ms": s.p50_ms,
                "p99_ms": s.p99_ms,
                "p999_ms": s.p999_ms,
                "max_ms": s.max_ms,
                "errors": m.errors,
                "clients": m.clients,
                "rounds": m.rounds,
                "secs": round3(m.secs),
                "load_avg": m.loads,
            });
            if !m.note.is_empty() {
                entry["note"] = json!(m.note);
            }
            let cpu = server_cpu_per_kop(m);
            if let Some(c) = cpu {
                entry["server_cpu_s_per_1k_ops"] = json!(round3(c));
            }
            if let Some(c) = m.bench_cpu_s.and_then(|b| crate::cpu::per_kop(b, m.ops)) {
                entry["bench_cpu_s_per_1k_ops"] = json!(round3(c));
            }
            if m.handoff.count() > 0 {
                let h = Summary::from(&m.handoff);
                entry["handoff_p50_ms"] = json!(h.p50_ms);
                entry["handoff_p99_ms"] = json!(h.p99_ms);
            }
            let ratio = |other: &str| -> String {
                if t != "raftlock" {
                    return String::new();
                }
                match (base, get(other).map(ops_per_sec)) {
                    (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
                    _ => "-".into(),
                }
            };
            println!(
                "{:<12} {:<9} {:>10.0} {:>9.2} {:>9.2} {:>9.2} {:>7} {:>10}  {:>13} {:>13}",
                w,
                t,
                ops,
                s.p50_ms,
                s.p99_ms,
                s.p999_ms,
                m.errors,
                cpu.map_or("-".into(), |c| format!("{c:.3}")),
                ratio("etcd"),
                ratio("redis")
            );
            per_target.insert(t.to_string(), entry);
        }
        if let Some(base) = base {
            let mut ratios = Map::new();
            for other in ["etcd", "redis"] {
                if let Some(o) = get(other) {
                    let ops = ops_per_sec(o);
                    if ops > 0.0 {
                        ratios.insert(format!("raftlock/{other}"), json!(round3(base / ops)));
                    }
                    // Server CPU per operation, raftlock's over the other's
                    // (below 1: raftlock spends less per lock).
                    let cpu = get("raftlock").and_then(server_cpu_per_kop);
                    if let (Some(a), Some(b)) = (cpu, server_cpu_per_kop(o)) {
                        if b > 0.0 {
                            ratios.insert(format!("cpu raftlock/{other}"), json!(round3(a / b)));
                        }
                    }
                }
            }
            if !ratios.is_empty() {
                per_target.insert("ratios".into(), Value::Object(ratios));
            }
        }
        if !per_target.is_empty() {
            workloads.insert(w.to_string(), Value::Object(per_target));
        }
    }

    // Failover rounds.
    let mut failover = Map::new();
    if let Some(dir) = &args.failover {
        let rounds: Vec<FailoverResult> = read_dir_json(dir).unwrap_or_default();
        let mut by_target: BTreeMap<String, Vec<FailoverResult>> = BTreeMap::new();
        for r in rounds {
            by_target.entry(r.target.clone()).or_default().push(r);
        }
        println!();
        for (t, rs) in by_target {
            let mut gaps: Vec<f64> = rs.iter().filter_map(|r| r.gap_ms).collect();
            let failed = rs.len() - gaps.len();
            let med = median(&mut gaps);
            let max = gaps
                .iter()
                .copied()
                .fold(None, |a: Option<f64>, g| Some(a.map_or(g, |a| a.max(g))));
            println!(
                "failover {t:<9} rounds {}  gap median {} ms  max {} ms{}",
                rs.len(),
                med.map_or("-".into(), |g| format!("{g:.0}")),
                max.map_or("-".into(), |g| format!("{g:.0}")),
                if failed > 0 {
                    format!("  ({failed} rounds without recovery)")
                } else {
                    String::new()
                }
            );
            failover.insert(
                t,
                json!({
                    "gaps_ms": gaps,
                    "median_ms": med,
                    "max_ms": max,
                    "rounds_without_recovery": failed,
                    "load_avg": rs.iter().map(|r| r.load_avg.clone()).collect::<Vec<_>>(),
                }),
            );
        }
    }

    // Scale.
    let mut scale = Map::new();
    for p in &args.scale {
        let Some(s) = read_json_if_present::<ScaleResult>(p)? else {
            continue;
        };
        if s.kind == "sessions-held" {
            // Both systems: scale["sessions-held"]["raftlock" | "etcd"].
            let by_target = scale.entry(s.kind.clone()).or_insert_with(|| json!({}));
            by_target[s.target.as_str()] = serde_json::to_value(&s)?;
        } else {
            scale.insert(s.kind.clone(), serde_json::to_value(&s)?);
        }
    }

    // Stage breakdowns, by workload and client count.
    let mut stages = Map::new();
    for p in &args.stages {
        let Some(r) = read_json_if_present::<RunResult>(p)? else {
            continue;
        };
        stages.insert(
            format!("{}-{}", r.workload, r.clients),
            json!({
                "ops_per_sec": r.ops_per_sec,
                "load_avg": r.load_avg,
                "stages": r.stages,
            }),
        );
    }

    let doc = json!({
        "machine": machine(&args.machine),
        "network": network,
        "workloads": workloads,
        "failover": failover,
        "scale": scale,
        "stages": stages,
    });
    print_targets(&doc);
    write_json(&args.out, &doc)?;
    println!("\nwrote {}", args.out.display());
    Ok(())
}

/// Prints each of the targets as met / missed / not measured.
fn print_targets(doc: &Value) {
    let w = &doc["workloads"];
    let f = |v: &Value| v.as_f64();
    let mut lines = Vec::new();
    for name in ["uncontended", "contended", "semaphore", "sessions"] {
        let r = &w[name]["raftlock"];
        let e = &w[name]["etcd"];
        match (f(&r["ops_per_sec"]), f(&e["ops_per_sec"])) {
            (Some(a), Some(b)) if b > 0.0 => {
                lines.push((
                    format!("{name}: raftlock >= 3x etcd ops/s"),
                    a >= 3.0 * b,
                    format!("{:.2}x", a / b),
                ));
            }
            _ => {}
        }
        if !matches!(name, "uncontended" | "contended") {
            continue;
        }
        if let (Some(a), Some(b)) = (f(&r["p99_ms"]), f(&e["p99_ms"])) {
            lines.push((
                format!("{name}: raftlock p99 <= etcd p99"),
                a <= b,
                format!("{a:.2} ms vs {b:.2} ms"),
            ));
        }
    }
    let one_write = doc["stages"]["uncontended-1"]["stages"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["stage"] == "client"))
        .and_then(|r| f(&r["p50_ms"]));
    if let Some(p50) = one_write {
        lines.push((
            "1 client: one lock or release p50 <= 0.5 ms".into(),
            p50 <= 0.5,
            format!("{p50:.3} ms"),
        ));
    }
    if let Some(h) = f(&w["contended"]["raftlock"]["handoff_p50_ms"]) {
        lines.push((
            "contended hand-off p50 <= 1 ms".into(),
            h <= 1.0,
            format!("{h:.2} ms"),
        ));
    }
    if let Some(h) = f(&w["contended"]["raftlock"]["handoff_p99_ms"]) {
        lines.push((
            "contended hand-off p99 <= 5 ms".into(),
            h <= 5.0,
            format!("{h:.2} ms"),
        ));
    }
    if let Some(steps) = doc["scale"]["sessions-held"]["raftlock"]["steps"].as_array() {
        let idle = steps.first().and_then(|s| f(&s["p99_ms"]));
        let top = steps.last();
        if let (Some(idle), Some(top)) = (idle, top) {
            let n = top["count"].as_u64().unwrap_or(0);
            if let (Some(p99), true) = (f(&top["p99_ms"]), n >= 100_000) {
                lines.push((
                    format!("{n} live sessions: lock-op p99 within 2x of idle"),
                    p99 <= 2.0 * idle && top["sessions_lost"].as_u64() == Some(0),
                    format!(
                        "{p99:.1} ms vs {idle:.1} ms idle ({:.2}x), {} lost",
                        p99 / idle.max(1e-9),
                        top["sessions_lost"]
                    ),
                ));
            }
        }
    }
    let fo = &doc["failover"];
    if let Some(r) = f(&fo["raftlock"]["median_ms"]) {
        lines.push((
            "failover gap <= 1.5 s (median)".into(),
            r <= 1500.0,
            format!("{r:.0} ms"),
        ));
        if let Some(e) = f(&fo["etcd"]["median_ms"]) {
            lines.push((
                "failover gap no worse than etcd (median)".into(),
                r <= e,
                format!("{r:.0} ms vs {e:.0} ms"),
            ));
        }
    }
    if let Some(steps) = doc["scale"]["locks"]["steps"].as_array() {
        let at = |n: u64| steps.iter().find(|s| s["count"].as_u64() == Some(n));
        if let Some(top) = at(1_000_000) {
            if let Some(mib) = f(&top["max_rss_mib"]) {
                lines.push((
                    "1M held locks: RSS <= 1 GiB per node".into(),
                    mib <= 1024.0,
                    format!("{mib:.0} MiB"),
                ));
            }
            if let (Some(a), Some(b)) = (
                f(&top["ops_per_sec"]),
                at(1_000).and_then(|s| f(&s["ops_per_sec"])),
            ) {
                lines.push((
                    "throughput at 1M held within 20% of at 1k".into(),
                    a >= 0.8 * b,
                    format!("{a:.0} vs {b:.0} ops/s ({:.0}%)", 100.0 * a / b.max(1e-9)),
                ));
            }
        }
    }
    if lines.is_empty() {
        return;
    }
    println!("\ntargets:");
    for (what, ok, detail) in lines {
        println!("  [{}] {what}: {detail}", if ok { "met" } else { "MISSED" });
    }
}
