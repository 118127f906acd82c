//! End-to-end runs of the harness against real `raftlockd` processes:
//! a short healthy run must come out valid, and the same run with the
//! test-only broken store (it skips the fence check) must come out invalid
//! — proof that the checkers can fail. The same pair runs with the
//! counters in a real PostgreSQL and a real Redis (`--store`).
//!
//! `raftlockd` belongs to another package, so there is no
//! `CARGO_BIN_EXE_raftlockd`: the tests run `cargo build -p raftlock-node
//! --bin raftlockd` into the same target directory as the harness binary
//! (`target/<profile>/raftlockd`; a no-op when it is up to date) and use
//! that.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn harness() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_raftlock-jepsen"))
}

/// `target/<profile>/raftlockd`, brought up to date with cargo once per
/// test binary (a no-op when it is fresh), so the run never tests a stale
/// server. `RAFTLOCK_JEPSEN_RAFTLOCKD` overrides it.
fn raftlockd() -> PathBuf {
    raftlock_testkit::bins::workspace_bin(
        "raftlock-node",
        "raftlockd",
        &harness(),
        "RAFTLOCK_JEPSEN_RAFTLOCKD",
        true,
    )
}

fn run(out: &Path, extra: &[&str]) -> (i32, Value) {
    run_for(out, "14", extra)
}

fn run_for(out: &Path, seconds: &str, extra: &[&str]) -> (i32, Value) {
    let output = Command::new(harness())
        .args([
            "run",
            "--nodes",
            "3",
            "--time-limit",
            seconds,
            "--recovery",
            "2",
        ])
        .args([
            "--workload",
            "fenced-counter",
            "--concurrency",
            "3",
            "--seed",
            "7",
        ])
        .args(["--client-pauses", "0.2", "--nemesis", "kill,pause"])
        .arg("--out")
        .arg(out)
        .arg("--raftlockd")
        .arg(raftlockd())
        .args(extra)
        .output()
        .expect("harness runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let results: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("results.json"))
            .unwrap_or_else(|e| panic!("no results.json ({e}); harness said:\n{stderr}")),
    )
    .expect("results.json is JSON");
    (output.status.code().unwrap_or(-1), results)
}

#[test]
fn a_healthy_run_is_valid() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("healthy");
    let (code, results) = run(&out, &[]);
    assert_eq!(results["valid"], Value::Bool(true), "{results:#}");
    assert_eq!(code, 0);
    assert!(results["ops"].as_u64().unwrap_or(0) > 50, "{results:#}");
    // Fencing had something to refuse: the paused holders' late writes.
    assert!(
        results["checkers"]["fenced-store"]["rejected_stale"]
            .as_u64()
            .unwrap_or(0)
            > 0,
        "{results:#}"
    );
    for f in ["history.jsonl", "store.jsonl", "report.html"] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
}

#[test]
fn a_store_that_skips_the_fence_check_is_caught() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("broken");
    let (code, results) = run(&out, &["--broken-store"]);
    assert_eq!(results["valid"], Value::Bool(false), "{results:#}");
    assert_eq!(code, 1);
    assert_eq!(
        results["checkers"]["fenced-store"]["valid"],
        Value::Bool(false)
    );
    assert!(!results["anomalies"]
        .as_array()
        .expect("anomalies")
        .is_empty());
}

/// Whether `start` can give this machine a server (a skip message if not;
/// a failure where servers are required, as in CI).
fn have<T>(what: &str, start: fn() -> Result<T, raftlock_testkit::servers::Unavailable>) -> bool {
    raftlock_testkit::servers::require(what, start()).is_some()
}

/// The same run (8 s of faults, to keep CI short) against a real store:
/// with the check, valid and with stale writes refused by the store
/// itself; without it (the demonstration flag), lost updates.
fn real_store(store: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join(store);
    let (code, results) = run_for(&out, "8", &["--store", store]);
    assert_eq!(results["valid"], Value::Bool(true), "{results:#}");
    assert_eq!(code, 0);
    assert_eq!(results["run"]["store"], Value::from(store));
    assert!(
        results["checkers"]["fenced-store"]["rejected_stale"]
            .as_u64()
            .unwrap_or(0)
            > 0,
        "{results:#}"
    );
    let broken = dir.path().join(format!("{store}-unchecked"));
    let (code, results) = run_for(&broken, "8", &["--store", store, "--broken-store"]);
    assert_eq!(code, 1, "{results:#}");
    assert!(
        results["checkers"]["counter"]["lost_updates"]
            .as_u64()
            .unwrap_or(0)
            > 0,
        "{results:#}"
    );
}

#[test]
fn a_postgres_store_keeps_the_fence_and_loses_updates_without_it() {
    if have("PostgreSQL", raftlock_testkit::servers::Postgres::start) {
        real_store("postgres");
    }
}

#[test]
fn a_redis_store_keeps_the_fence_and_loses_updates_without_it() {
    if have("Redis", raftlock_testkit::servers::Redis::start) {
        real_store("redis");
    }
}
