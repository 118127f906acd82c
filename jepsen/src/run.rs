//! One test run: start the cluster and the store, run the workload under
//! the nemesis for the time limit, heal, let the cluster recover, stop,
//! check, and write `results.json` and `report.html`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{json, Value};

use crate::checker::{self, CheckInput};
use crate::clientlink::{ClientLinks, ClusterAddrs};
use crate::cluster::{self, Cluster, ClusterOptions};
use crate::dbstore::{DbStore, StoreKind, Target};
use crate::history::{self, Process, Recorder, Type};
use crate::nemesis::{self, CutMode, NemesisKind, NemesisOptions, Window};
use crate::store::Store;
use crate::workload::{self, WorkloadKind, WorkloadOptions};

/// Everything `raftlock-jepsen run` takes.
#[derive(Clone, Debug, clap::Args)]
pub struct RunArgs {
    /// Initial cluster size (3 or 5).
    #[arg(long, default_value_t = 3)]
    pub nodes: u64,
    /// Seconds of workload under faults (healing and recovery come after).
    #[arg(long, default_value_t = 60)]
    pub time_limit: u64,
    /// Faults: comma-separated kill, pause, partition, clock, membership,
    /// restore, lose-unsynced, slow-disk (disk = both), restart-fast,
    /// disk-error, client-link, hostile-peer, long-partition, rot,
    /// lost-disk, or all (every kind but long-partition, rot and
    /// lost-disk) / none.
    #[arg(long, default_value = "kill,pause,partition")]
    pub nemesis: String,
    /// fenced-counter, lock, semaphore, clients or leases.
    #[arg(long, value_enum, default_value = "fenced-counter")]
    pub workload: WorkloadKind,
    /// The paths the leases workload drives: comma-separated ttl-end,
    /// ttl-shorter, retry, retry-failover, streams, renewals, multi,
    /// upgrade, revoke, or all.
    #[arg(long, default_value = "all")]
    pub lease_paths: String,
    /// Client workers.
    #[arg(long, default_value_t = 4)]
    pub concurrency: u64,
    /// Seed of every random choice (workers and nemesis).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output directory (created; a previous run's output there is
    /// replaced).
    #[arg(long)]
    pub out: PathBuf,
    /// The raftlockd binary (default: next to this executable).
    #[arg(long)]
    pub raftlockd: Option<PathBuf>,
    /// Session ttl of the workers, in milliseconds (pauses last longer).
    #[arg(long, default_value_t = 3000)]
    pub ttl_ms: u64,
    /// Counters (and locks) of the fenced-counter workload.
    #[arg(long, default_value_t = 2)]
    pub keys: usize,
    /// Capacity of the semaphore workload.
    #[arg(long, default_value_t = 3)]
    pub capacity: u32,
    /// Fraction of fenced-counter cycles in which the holder "pauses" past
    /// its lease and then writes with its old fence.
    #[arg(long, default_value_t = 0.05)]
    pub client_pauses: f64,
    /// How partitions cut connections.
    #[arg(long, value_enum, default_value = "mixed")]
    pub cut_mode: CutMode,
    /// Seconds of fault-free workload after healing.
    #[arg(long, default_value_t = 5)]
    pub recovery: u64,
    /// Time budget of the linearizability search per lock, in seconds.
    #[arg(long, default_value_t = 60)]
    pub linearizability_timeout: u64,
    /// TEST ONLY: the store skips its fence check, so stale holders' writes
    /// land. The run must then come out invalid.
    #[arg(long)]
    pub broken_store: bool,
    /// Where fenced-counter keeps its counters: the harness's in-memory
    /// store, or a real PostgreSQL or Redis (every read and write through
    /// raftlock's fence check there).
    #[arg(long, value_enum, default_value = "memory")]
    pub store: crate::dbstore::StoreKind,
    /// The PostgreSQL connection string or Redis URL of `--store`
    /// (default: a server the harness starts on loopback and stops at the
    /// end). The harness resets what it owns there at the start.
    #[arg(long)]
    pub store_url: Option<String>,
    /// Run the nodes with peer authentication (an ACL file with a peer
    /// token; the workers use a client token). The hostile peer must then
    /// be refused with UNAUTHENTICATED.
    #[arg(long)]
    pub peer_auth: bool,
    /// The network between the nodes: `proxy` (loopback, a TCP proxy per
    /// link) or `netns` (a network namespace per node on a bridge, faults
    /// as nft packet drops; needs root).
    #[arg(long, value_enum, default_value = "proxy")]
    pub net: NetMode,
}

/// How the nodes are networked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NetMode {
    /// Every node on 127.0.0.1, every link through a proxy of the harness.
    Proxy,
    /// Every node in a network namespace of its own ([`crate::netns`]).
    Netns,
}

/// What a run produced.
pub struct Outcome {
    /// results.json.
    pub results: Value,
    /// Overall verdict.
    pub valid: bool,
}

fn prepare_out(dir: &Path) -> anyhow::Result<()> {
    if dir.exists() {
        let mut entries = std::fs::read_dir(dir)?;
        let empty = entries.next().is_none();
        if !empty {
            anyhow::ensure!(
                dir.join("history.jsonl").exists(),
                "{} is not empty and does not hold a previous run; choose another --out",
                dir.display()
            );
            std::fs::remove_dir_all(dir)
                .with_context(|| format!("cannot clear {}", dir.display()))?;
        }
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(())
}

/// Runs the test described by `args`.
pub async fn run(args: RunArgs) -> anyhow::Result<Outcome> {
    anyhow::ensure!(
        (1..=7).contains(&args.nodes),
        "--nodes must be between 1 and 7 (3 or 5 are the useful sizes)"
    );
    anyhow::ensure!(args.concurrency >= 1, "--concurrency must be at least 1");
    anyhow::ensure!(
        args.ttl_ms >= 1000,
        "--ttl-ms must be at least 1000 (the server's minimum)"
    );
    anyhow::ensure!(
        args.keys >= 1 && args.capacity >= 1,
        "--keys and --capacity must be at least 1"
    );
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.client_pauses),
        "--client-pauses is a fraction in 0..=1"
    );
    let lease_paths = workload::leases::LeasePath::parse_list(&args.lease_paths)?;
    let mut kinds = NemesisKind::parse_list(&args.nemesis)?;
    if args.workload == WorkloadKind::Lock && kinds.contains(&NemesisKind::Restore) {
        // The lock model has no restore (holders from a backup reappear);
        // fence-order, the store and the audit check restores elsewhere.
        eprintln!("raftlock-jepsen: the lock workload does not run the restore nemesis");
        kinds.retain(|k| *k != NemesisKind::Restore);
    }
    let raftlockd = cluster::find_raftlockd(args.raftlockd.as_deref())?;
    if args.net == NetMode::Netns {
        crate::netns::check_available()?;
    }
    let disk_faults = kinds.iter().any(|k| k.needs_disk_layer());
    anyhow::ensure!(
        !disk_faults || crate::lazyfs::available(),
        "the lose-unsynced and slow-disk nemeses need FUSE (/dev/fuse), which this machine \
         does not have; leave them out (`all` includes them)"
    );
    let libfaketime = if kinds.contains(&NemesisKind::Clock) {
        Some(cluster::find_libfaketime()?)
    } else {
        None
    };
    prepare_out(&args.out)?;
    let out = args.out.canonicalize()?;
    let started = Instant::now();
    let rec = Recorder::create(&out.join("history.jsonl"), started)?;
    let ttl = Duration::from_millis(args.ttl_ms);

    eprintln!(
        "raftlock-jepsen: {} nodes ({:?} network), workload {:?}, nemesis {:?}, {} s, seed {}, output in {}",
        args.nodes,
        args.net,
        args.workload,
        kinds,
        args.time_limit,
        args.seed,
        out.display()
    );
    let spares = if kinds.contains(&NemesisKind::Membership) {
        2
    } else {
        0
    };
    let insecure_peers_flag = cluster::raftlockd_has_flag(&raftlockd, "--insecure-peers");
    let acl = if args.peer_auth {
        Some(cluster::Acl::write(&out)?)
    } else {
        None
    };
    let (exits_tx, exits) = tokio::sync::mpsc::unbounded_channel();
    let hooks = cluster::Hooks {
        exits: Some(exits_tx),
        ..Default::default()
    };
    let roster = hooks.roster.subscribe();
    let cluster = Cluster::start(ClusterOptions {
        raftlockd,
        dir: out.clone(),
        nodes: args.nodes,
        spares,
        libfaketime,
        disk_faults,
        acl,
        insecure_peers_flag,
        hooks,
        netns: args.net == NetMode::Netns,
    })
    .await?;
    eprintln!(
        "raftlock-jepsen: cluster up in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let addrs = ClusterAddrs {
        gen: 0,
        nodes: cluster.addrs(),
    };
    let token = cluster.token();
    let creds = crate::raw::Creds::new(token.as_deref());
    let links = kinds
        .contains(&NemesisKind::ClientLink)
        .then(|| Arc::new(ClientLinks::new()));
    let cluster = Arc::new(tokio::sync::Mutex::new(cluster));
    let supervisor = tokio::spawn(crate::supervise::supervisor(
        cluster.clone(),
        rec.clone(),
        exits,
    ));
    let sampling = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn(crate::supervise::sampler(
        roster,
        rec.clone(),
        creds.clone(),
        sampling.clone(),
    ));

    let fenced_counter = args.workload == WorkloadKind::FencedCounter;
    let store = if fenced_counter && args.store == StoreKind::Memory {
        Some(Store::start(&out.join("store.jsonl"), args.broken_store, rec.clone()).await?)
    } else {
        None
    };
    let db = if fenced_counter && args.store != StoreKind::Memory {
        let db = DbStore::start(
            args.store,
            args.store_url.as_deref(),
            args.broken_store,
            args.keys,
            rec.clone(),
        )
        .await?;
        eprintln!("raftlock-jepsen: store {}", db.describe());
        Some(db)
    } else {
        None
    };
    let target = match (&store, &db) {
        (Some(s), _) => Some(Target::Memory(s.addr().to_string())),
        (_, Some(d)) => Some(Target::Db(d.clone())),
        _ => None,
    };

    let stop = Arc::new(AtomicBool::new(false));
    // Held here until the workers and probers have stopped: the nemesis
    // drops its end when its time is up, and they keep moving to restored
    // clusters through the recovery period.
    let (moved_tx, moved) = tokio::sync::watch::channel(addrs.clone());
    let moved_tx = Arc::new(moved_tx);
    let wopts = WorkloadOptions {
        kind: args.workload,
        addrs,
        links: links.clone(),
        token,
        ttl,
        keys: args.keys,
        capacity: args.capacity,
        client_pauses: args.client_pauses,
        store: target,
        concurrency: args.concurrency,
        seed: args.seed,
        moved: moved.clone(),
    };
    let (mut workers, lease_tasks) = if args.workload == WorkloadKind::Leases {
        let running = workload::leases::spawn(
            &rec,
            workload::leases::LeaseOptions {
                addrs: wopts.addrs.clone(),
                links: links.clone(),
                token: wopts.token.clone(),
                seed: args.seed,
                concurrency: args.concurrency,
                paths: lease_paths.clone(),
                moved: moved.clone(),
            },
            creds.clone(),
            stop.clone(),
        );
        (running.workers, Some(running.others))
    } else {
        (
            workload::spawn_workers(&wopts, &rec, stop.clone()).await?,
            None,
        )
    };
    // The raw keep-alive probers of the clients workload.
    let probers = (args.workload == WorkloadKind::Clients).then(|| {
        tokio::spawn(workload::keepalive::run(
            rec.clone(),
            workload::keepalive::ProberOptions {
                creds: creds.clone(),
                seed: args.seed,
            },
            links.clone(),
            moved,
            stop.clone(),
        ))
    });

    let until = tokio::time::Instant::now() + Duration::from_secs(args.time_limit);
    let windows: Vec<Window> = nemesis::run(
        cluster.clone(),
        rec.clone(),
        NemesisOptions {
            kinds: kinds.clone(),
            seed: args.seed,
            ttl,
            cut_mode: args.cut_mode,
            nodes: args.nodes,
            out: out.clone(),
            addrs: Some(moved_tx.clone()),
            links: links.clone(),
        },
        until,
    )
    .await;
    tokio::time::sleep_until(until).await;

    // Heal everything and give the cluster time to recover under load.
    {
        if let Some(l) = &links {
            l.heal().await;
        }
        let mut c = cluster.lock().await;
        let healed = c.heal_all().await;
        rec.record(
            Process::NEMESIS,
            Type::Info,
            "heal",
            json!({"ok": healed.is_ok(), "error": healed.err().map(|e| e.to_string())}),
        );
    }
    eprintln!("raftlock-jepsen: healed; {} s of recovery", args.recovery);
    tokio::time::sleep(Duration::from_secs(args.recovery)).await;
    stop.store(true, Ordering::SeqCst);
    let mut leftovers = Vec::new();
    let drain = async {
        for w in workers.iter_mut() {
            if let Ok(l) = w.await {
                leftovers.push(l);
            }
        }
    };
    if tokio::time::timeout(Duration::from_secs(30), drain)
        .await
        .is_err()
    {
        eprintln!("raftlock-jepsen: some workers did not stop within 30 s; their last operations count as unknown");
    }
    for w in &workers {
        w.abort();
    }
    if let Some(others) = lease_tasks {
        // The contenders finish their lock, the operator its revoke (which
        // waits out its session's lease).
        let abort = others.abort_handle();
        if tokio::time::timeout(Duration::from_secs(20), others)
            .await
            .is_err()
        {
            eprintln!("raftlock-jepsen: the lease contenders and operator did not stop in time");
            abort.abort();
        }
    }
    if let Some(p) = probers {
        // They stop after probing what they abandoned last.
        let deadline = workload::keepalive::PROBE_FOR + Duration::from_secs(5);
        if tokio::time::timeout(deadline, p).await.is_err() {
            eprintln!("raftlock-jepsen: the keep-alive probers did not stop in time");
        }
    }
    drop(moved_tx);

    // The end-of-run audit, while the workers' sessions are still alive.
    let believed: Vec<(u64, u64)> = leftovers
        .iter()
        .filter_map(|l| Some((l.process, l.session.as_ref()?.id().get())))
        .collect();
    let audit_client = {
        let c = cluster.lock().await;
        raftlock_client::Client::with_options(
            c.client_endpoints(),
            raftlock_client::ClientOptions {
                request_timeout: Duration::from_secs(2),
                retry_deadline: Duration::from_secs(10),
                token: c.token(),
                ..Default::default()
            },
        )?
    };
    let audit =
        crate::audit::collect(&audit_client, &believed, 2 * ttl + Duration::from_secs(5)).await;
    std::fs::write(
        out.join("audit.json"),
        serde_json::to_string_pretty(&audit)?,
    )?;
    eprintln!(
        "raftlock-jepsen: audit after {} ms: {} names still held or queued",
        audit["waited_ms"],
        audit["locks"].as_array().map_or(0, Vec::len)
    );
    // The sampler's last rounds are the end-of-run check of every node.
    sampling.store(true, Ordering::SeqCst);
    let _ = tokio::time::timeout(Duration::from_secs(5), sampler).await;
    futures::future::join_all(leftovers.into_iter().map(|l| l.close())).await;

    let mut store_values = store.as_ref().map(Store::values).unwrap_or_default();
    if let Some(s) = &store {
        s.stop();
    }
    if let Some(d) = &db {
        store_values = d.values().await.context("reading the final counters")?;
        d.write_log(&out.join("store.jsonl"))
            .await
            .context("writing store.jsonl")?;
    }
    // Stops the server the harness started, if any.
    drop(db);
    rec.flush();
    cluster.lock().await.stop_all().await;
    supervisor.abort();
    if let Some(l) = &links {
        l.shutdown().await;
    }
    let wall = started.elapsed();

    let store_log = read_jsonl(&out.join("store.jsonl"));
    std::fs::write(
        out.join("store-final.json"),
        serde_json::to_string_pretty(&store_values)?,
    )?;
    let events = rec.events();
    let ops = history::pair_ops(&events);
    let checked = checker::check(&CheckInput {
        ops: &ops,
        events: &events,
        windows: &windows,
        workload: args.workload,
        store_log: &store_log,
        store_values: &store_values,
        capacity: args.capacity,
        linear_timeout: Duration::from_secs(args.linearizability_timeout),
        out_dir: &out,
        audit: Some(&audit),
    });
    let valid = checked.valid();
    let results = json!({
        "valid": valid,
        "checkers": checked.checkers,
        "anomalies": checked.anomalies,
        "ops": ops.len(),
        "nemesis": windows,
        "availability": crate::availability::table(&ops, &events, &windows),
        "run": {
            "nodes": args.nodes,
            "workload": args.workload,
            "lease_paths": (args.workload == WorkloadKind::Leases).then_some(&lease_paths),
            "nemesis": kinds,
            "time_limit_s": args.time_limit,
            "concurrency": args.concurrency,
            "seed": args.seed,
            "ttl_ms": args.ttl_ms,
            "broken_store": args.broken_store,
            "store": args.store,
            "net": args.net,
            "peer_auth": args.peer_auth,
            "wall_s": wall.as_secs_f64(),
            "ok_ops": ops.iter().filter(|o| o.kind == Type::Ok).count(),
            "fail_ops": ops.iter().filter(|o| o.kind == Type::Fail).count(),
            "info_ops": ops.iter().filter(|o| o.kind == Type::Info).count(),
        },
    });
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    let title = format!(
        "raftlock-jepsen: {:?}, {} nodes, nemesis {}, seed {}",
        args.workload, args.nodes, args.nemesis, args.seed
    );
    std::fs::write(
        out.join("report.html"),
        crate::report::render(&results, &ops, &windows, args.concurrency, &title),
    )?;
    Ok(Outcome { results, valid })
}

/// Re-checks a finished run's directory (history, store log and final
/// values) without running anything.
pub fn recheck(
    out: &Path,
    workload: WorkloadKind,
    capacity: u32,
    linear_timeout: Duration,
) -> anyhow::Result<Outcome> {
    let events = history::read_history(&out.join("history.jsonl"))?;
    let ops = history::pair_ops(&events);
    let store_log = read_jsonl(&out.join("store.jsonl"));
    let store_values = std::fs::read_to_string(out.join("store-final.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    let audit: Option<Value> = std::fs::read_to_string(out.join("audit.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let windows = nemesis::windows_from_history(&events);
    let checked = checker::check(&CheckInput {
        ops: &ops,
        events: &events,
        windows: &windows,
        workload,
        store_log: &store_log,
        store_values: &store_values,
        capacity,
        linear_timeout,
        out_dir: out,
        audit: audit.as_ref(),
    });
    let valid = checked.valid();
    let previous: Option<Value> = std::fs::read_to_string(out.join("results.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let run = previous
        .as_ref()
        .map(|p| p["run"].clone())
        .unwrap_or(Value::Null);
    // Without the run's own record, one timeline row per process number
    // seen (workers retired after an unknown outcome get their own rows).
    let concurrency = run["concurrency"]
        .as_u64()
        .unwrap_or_else(|| ops.iter().map(|o| o.process + 1).max().unwrap_or(1));
    let results = json!({
        "valid": valid,
        "checkers": checked.checkers,
        "anomalies": checked.anomalies,
        "ops": ops.len(),
        "nemesis": windows,
        "availability": crate::availability::table(&ops, &events, &windows),
        "run": run,
    });
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    let title = format!("raftlock-jepsen re-check: {workload:?}");
    std::fs::write(
        out.join("report.html"),
        crate::report::render(&results, &ops, &windows, concurrency, &title),
    )?;
    Ok(Outcome { results, valid })
}

fn read_jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .map(|t| {
            t.lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect()
        })
        .unwrap_or_default()
}
