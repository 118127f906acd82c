//! raftlock-sim: a whole raftlock cluster in one process, on turmoil's
//! simulated time and network and an in-memory simulated disk, every run
//! decided by one seed. See docs/testing/simulator.md.

// The unit tests are the checkers' (belief, oracle, shared) and the
// clock's. The simulation and its driver stay out of the test build: with
// them, `cargo test --release` compiled the whole simulation a second time
// (about 2 minutes of one core, on CI's critical path).
#![cfg_attr(test, allow(dead_code))]

#[cfg(not(tokio_unstable))]
compile_error!(
    "raftlock-sim needs `--cfg tokio_unstable` (turmoil seeds tokio's scheduler with it): build \
     it from jepsen/sim, whose .cargo/config.toml sets it"
);

mod belief;
mod oracle;
mod shared;
#[cfg(not(test))]
mod sim;
mod wall_clock;

#[cfg(not(test))]
use std::process::{Command, ExitCode};

#[cfg(not(test))]
use sim::Settings;

#[cfg(not(test))]
const USAGE: &str = "\
usage: raftlock-sim [OPTIONS]
  --seed S                 run one seed (default 1)
  --seeds A..B             run seeds A to B-1, stop at the first failure
  --seeds-file FILE        run every seed FILE lists (one per line, maybe with flags of its own
                           after it; `#` starts a comment)
  --for-seconds S          with --seeds: start no seed after S seconds of real time
  --keep-going             with --seeds or --seeds-file: run every seed, list the failed ones at the end
  --jobs J                 with --seeds or --seeds-file: run J seeds at a time (default 1)
  --reproduce S            run seed S and print its whole trace
  --check-determinism N    run seeds 1..=N twice each, in fresh processes, and compare trace hashes
                           (the second run with --stall-real-time); with --seeds-file, run the
                           file's first N seeds (with their flags) a second time that way instead
  --duration-ms MS         simulated milliseconds of faults and load (default 20000)
  --workers N              lock workers (default 3)
  --nodes N                nodes in the cluster: 3 (default) or 5
  --no-faults              no faults (a baseline)
  --lying-disks            plant a defect: disks acknowledge syncs and keep nothing
  --stranded-follower      plant a defect: when the faults stop, one follower is cut off for good
                           (the catch-up oracle must fail the run)
  --paths P,Q,...          the lease paths the belief clients drive (default all: ttl, retry,
                           streams, renewals, ghost, revoke, transfer, bound, library)
  --stall-real-time        sleep 0-3 ms of real time between some steps (the run must not change)
  --hash-only              print only the trace hash (used by --check-determinism)";

#[cfg(not(test))]
fn main() -> ExitCode {
    // Before anything reads a clock: see wall_clock.
    wall_clock::init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Ok(filter) = std::env::var("RUST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .without_time()
            .try_init();
    }
    let mut settings = Settings::default();
    let mut seeds = settings.seed..settings.seed + 1;
    let mut reproduce = false;
    let mut hash_only = false;
    let mut determinism = None;
    let mut listed: Option<Vec<(u64, Vec<String>)>> = None;
    let mut for_seconds: Option<u64> = None;
    let mut keep_going = false;
    let mut jobs = 1usize;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| -> Result<String, String> {
            it.next().cloned().ok_or(format!("{name} needs a value"))
        };
        let parsed: Result<(), String> = (|| {
            match arg.as_str() {
                "--seed" | "--reproduce" => {
                    let s = num(&value(arg)?)?;
                    seeds = s..s + 1;
                    reproduce = arg == "--reproduce";
                }
                "--seeds" => {
                    let v = value(arg)?;
                    let (a, b) = v.split_once("..").ok_or("--seeds takes A..B")?;
                    seeds = num(a)?..num(b)?;
                }
                "--check-determinism" => determinism = Some(num(&value(arg)?)?),
                "--duration-ms" => settings.duration_ms = num(&value(arg)?)?,
                "--workers" => settings.workers = num(&value(arg)?)? as usize,
                "--nodes" => {
                    settings.nodes = num(&value(arg)?)?;
                    if settings.nodes != 3 && settings.nodes != 5 {
                        return Err("--nodes takes 3 or 5".into());
                    }
                }
                "--no-faults" => settings.faults = false,
                "--lying-disks" => settings.lying_disks = true,
                "--stranded-follower" => settings.stranded_follower = true,
                "--paths" => {
                    let v = value(arg)?;
                    let paths: Vec<String> = v.split(',').map(|p| p.trim().to_string()).collect();
                    if let Some(bad) = paths.iter().find(|p| !sim::PATHS.contains(&p.as_str())) {
                        return Err(format!(
                            "--paths: unknown path {bad:?} (known: {})",
                            sim::PATHS.join(",")
                        ));
                    }
                    settings.paths = paths;
                }
                "--stall-real-time" => settings.stall_real_time = true,
                "--hash-only" => hash_only = true,
                "--seeds-file" => listed = Some(seeds_file(&value(arg)?)?),
                "--for-seconds" => for_seconds = Some(num(&value(arg)?)?),
                "--keep-going" => keep_going = true,
                "--jobs" => jobs = num(&value(arg)?)?.max(1) as usize,
                "-h" | "--help" => return Err(String::new()),
                other => return Err(format!("unknown argument {other:?}")),
            }
            Ok(())
        })();
        if let Err(e) = parsed {
            if !e.is_empty() {
                eprintln!("{e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    }
    if let (Some(n), None) = (determinism, &listed) {
        return check_determinism(n, &settings);
    }
    // A panic anywhere in the simulated cluster (a node's Raft core, say)
    // takes the whole process down (turmoil shuts a host's runtime down on
    // a task's panic, and unwinding through it aborts): say which run it
    // was before that.
    let default_hook = std::panic::take_hook();
    let reported = std::sync::atomic::AtomicBool::new(false);
    std::panic::set_hook(Box::new(move |info| {
        let first = !reported.swap(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(settings) = sim::current().filter(|_| first) {
            eprintln!(
                "FAILED: a panic in the simulated cluster at {} ms: {info}",
                sim::now_ms()
            );
            eprintln!(
                "seed {} ({settings:?}) at commit {}; replay: raftlock-sim --reproduce {}{}",
                settings.seed,
                commit(),
                settings.seed,
                settings.flags()
            );
        }
        default_hook(info);
    }));
    // The machine's clock, on purpose: seeds per minute of real time
    // (std's clocks are the simulated ones in this binary).
    let started = wall_clock::real_time();
    let run = Sweep {
        for_seconds,
        keep_going,
        jobs,
        twice: determinism.unwrap_or(0) as usize,
    };
    if let Some(list) = listed {
        return sweep(list.into_iter(), &settings, started, run);
    }
    if seeds.end > seeds.start + 1 {
        let seeds = seeds.map(|s| (s, Vec::new()));
        return sweep(seeds, &settings, started, run);
    }
    for seed in seeds {
        let settings = Settings {
            seed,
            ..settings.clone()
        };
        if reproduce && !hash_only {
            // Printed as it happens: a run that ends in a panic (an
            // assertion in a node) shows its trace up to there.
            sim::echo_trace();
        }
        let outcome = sim::run(&settings);
        if hash_only {
            println!("hash={:016x}", outcome.hash);
        }
        if let Err(why) = &outcome.verdict {
            eprintln!("FAILED: {why}");
            eprintln!(
                "seed {} ({settings:?}) at commit {}; replay: raftlock-sim --reproduce {}{}",
                settings.seed,
                commit(),
                settings.seed,
                settings.flags()
            );
            return ExitCode::FAILURE;
        }
        if !hash_only {
            println!(
                "seed {seed}: ok ({} grants, {} faults, hash {:016x})",
                outcome.grants, outcome.faults, outcome.hash
            );
        }
    }
    ExitCode::SUCCESS
}

/// Runs each seed of `seeds` in a fresh process (`--seed S`), so that a
/// seed's run is the same as `--reproduce S` gives (some state a run
/// leaves in the process changed the next run: seed 3 gave another hash
/// after seeds 1 and 2 in one process), `jobs` at a time; stops starting
/// seeds at the first failure unless `keep_going`. The first `twice`
/// seeds run a second time with `--stall-real-time` and must give the
/// same trace hash (the determinism check, on the listed seeds and their
/// flags rather than on seeds 1..=N).
#[cfg(not(test))]
fn sweep(
    seeds: impl Iterator<Item = (u64, Vec<String>)> + Send,
    settings: &Settings,
    started: std::time::Duration,
    run: Sweep,
) -> ExitCode {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("cannot find this binary: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Each seed's run, then (for the first `twice`) its stalled rerun.
    let twice = run.twice;
    let jobs = Mutex::new(seeds.enumerate().flat_map(move |(i, (seed, flags))| {
        let again = (i < twice).then(|| (seed, flags.clone(), true));
        std::iter::once((seed, flags, false)).chain(again)
    }));
    let stop = AtomicBool::new(false);
    // (seed, flags, stalled) and the hash its run printed, if it passed.
    type Done = (u64, Vec<String>, bool, Option<String>);
    let done: Mutex<Vec<Done>> = Mutex::new(Vec::new());
    let worker = || loop {
        if stop.load(Ordering::SeqCst)
            || run
                .for_seconds
                .is_some_and(|limit| (wall_clock::real_time() - started).as_secs() >= limit)
        {
            return;
        }
        let Some((seed, flags, stalled)) = jobs.lock().expect("jobs").next() else {
            return;
        };
        // The child's report is printed whole once it ends (jobs run side
        // by side); its stderr, where a failure's trace goes, as it comes.
        let out = Command::new(&exe)
            .args(stalled.then_some("--stall-real-time"))
            .arg("--seed")
            .arg(seed.to_string())
            .args(settings.flags().split_whitespace())
            .args(&flags)
            .stderr(std::process::Stdio::inherit())
            .output();
        let hash = match out {
            Ok(out) => {
                let text = String::from_utf8_lossy(&out.stdout);
                if stalled && !text.is_empty() {
                    print!("(again, stalling) ");
                }
                print!("{text}");
                out.status
                    .success()
                    .then(|| {
                        text.rsplit_once("hash ")
                            .map(|(_, h)| h.trim_end().trim_end_matches(')').to_string())
                    })
                    .flatten()
            }
            Err(e) => {
                eprintln!("cannot run seed {seed}: {e}");
                None
            }
        };
        if hash.is_none() && !run.keep_going {
            stop.store(true, Ordering::SeqCst);
        }
        done.lock()
            .expect("done")
            .push((seed, flags, stalled, hash));
    };
    std::thread::scope(|s| {
        for _ in 0..run.jobs.max(1) {
            s.spawn(worker);
        }
    });
    let done = done.into_inner().expect("done");
    let first: Vec<_> = done.iter().filter(|d| !d.2).collect();
    let failed: Vec<u64> = first
        .iter()
        .filter(|d| d.3.is_none())
        .map(|d| d.0)
        .collect();
    let secs = (wall_clock::real_time() - started).as_secs_f64();
    println!(
        "{} seeds in {secs:.1} s ({:.1} seeds/minute), {} failed{}",
        first.len(),
        first.len() as f64 * 60.0 / secs,
        failed.len(),
        if failed.is_empty() {
            String::new()
        } else {
            format!(
                ": {}",
                failed
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(" ")
            )
        }
    );
    let mut differ = 0;
    let mut checked = 0;
    for again in done.iter().filter(|d| d.2) {
        let Some(once) = first.iter().find(|d| d.0 == again.0 && d.1 == again.1) else {
            continue;
        };
        checked += 1;
        match (&once.3, &again.3) {
            (Some(a), Some(b)) if a == b => {}
            (Some(a), Some(b)) => {
                println!("seed {}: NOT DETERMINISTIC: {a} then {b}", again.0);
                differ += 1;
            }
            _ => {
                println!("seed {}: no hash to compare (a run failed)", again.0);
                differ += 1;
            }
        }
    }
    if twice > 0 {
        println!(
            "{} of {checked} seeds gave the same trace hash twice (the second run stalling for real time)",
            checked - differ
        );
    }
    if failed.is_empty() && differ == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// How [`sweep`] runs its seeds.
#[cfg(not(test))]
struct Sweep {
    for_seconds: Option<u64>,
    keep_going: bool,
    jobs: usize,
    twice: usize,
}

/// The seeds a file lists: one per line, optionally followed by the flags
/// of its run (`21 --paths bound`); `#` starts a comment.
#[cfg(not(test))]
fn seeds_file(path: &str) -> Result<Vec<(u64, Vec<String>)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let mut seeds = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let mut words = line.split_whitespace();
        if let Some(seed) = words.next() {
            seeds.push((num(seed)?, words.map(str::to_string).collect()));
        }
    }
    if seeds.is_empty() {
        return Err(format!("{path} lists no seed"));
    }
    Ok(seeds)
}

#[cfg(not(test))]
fn num(s: &str) -> Result<u64, String> {
    s.trim().parse().map_err(|_| format!("not a number: {s:?}"))
}

/// The commit this binary was built from, for failure reports (recorded
/// by build.rs).
#[cfg(not(test))]
fn commit() -> String {
    env!("RAFTLOCK_SIM_COMMIT").to_string()
}

/// Runs seeds 1..=n twice each, every run in a fresh process, and compares
/// their trace hashes.
#[cfg(not(test))]
fn check_determinism(n: u64, settings: &Settings) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("cannot find this binary: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The second run of each seed stalls for real time at random moments:
    // a result that depends on the machine's clock (or its load) differs.
    let hash = |seed: u64, stall: bool| -> Result<String, String> {
        let out = Command::new(&exe)
            .args(stall.then_some("--stall-real-time"))
            .arg("--seed")
            .arg(seed.to_string())
            .arg("--hash-only")
            .args(settings.flags().split_whitespace())
            .output()
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .find_map(|l| l.strip_prefix("hash="))
            .map(str::to_string)
            .ok_or_else(|| {
                format!(
                    "no hash from seed {seed}: {}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
    };
    let mut differ = 0;
    for seed in 1..=n {
        match (hash(seed, false), hash(seed, true)) {
            (Ok(a), Ok(b)) if a == b => println!("seed {seed}: {a} twice"),
            (Ok(a), Ok(b)) => {
                println!("seed {seed}: NOT DETERMINISTIC: {a} then {b}");
                differ += 1;
            }
            (Err(e), _) | (_, Err(e)) => {
                println!("seed {seed}: {e}");
                differ += 1;
            }
        }
    }
    println!("{} of {n} seeds gave the same trace hash twice", n - differ);
    if differ == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
