//! The fence check from another language: `client/examples/fenced_postgres.py`
//! (psycopg) and `fenced_redis.py` (redis-py) run under `raftlock lock`
//! against a real cluster, a real PostgreSQL and a real Redis, and a stale
//! fence passed to them is refused by the store.
//!
//! The packages in `client/examples/requirements.txt` are installed from
//! PyPI into a virtualenv under cargo's target directory, once (again when
//! the file changes).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use raftlock_testkit::servers::{self, Postgres, Redis, Unavailable};
use raftlock_testkit::TestCluster;
use tokio::process::Command;

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");

/// The virtualenv's python, with the examples' requirements installed.
fn python() -> Result<PathBuf, Unavailable> {
    servers::python_venv(
        &Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-examples-venv"),
        &Path::new(EXAMPLES).join("requirements.txt"),
    )
}

/// Python, and a server of type `S` from `start`, or `None` (skipped).
async fn setup<S: Send + 'static>(
    what: &str,
    start: fn() -> Result<S, Unavailable>,
) -> Option<(PathBuf, S)> {
    let python = servers::require(
        "Python 3 with the examples' packages",
        tokio::task::spawn_blocking(python).await.unwrap(),
    )?;
    let server = servers::require(what, tokio::task::spawn_blocking(start).await.unwrap())?;
    Some((python, server))
}

/// `raftlock lock NAME -- python SCRIPT ARGS...`.
fn locked(endpoints: &str, name: &str, python: &Path, script: &str, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_raftlock"));
    c.env("RAFTLOCK_ENDPOINTS", endpoints)
        .args(["lock", name, "--"])
        .arg(python)
        .arg(Path::new(EXAMPLES).join(script))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// The script run directly, as a holder that still has an old fence.
fn unlocked(name: &str, fence: u64, python: &Path, script: &str, args: &[&str]) -> Command {
    let mut c = Command::new(python);
    c.arg(Path::new(EXAMPLES).join(script))
        .args(args)
        .env("RAFTLOCK_NAME", name)
        .env("RAFTLOCK_FENCE", fence.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Runs `cmd`; its exit code, stdout and stderr.
async fn run(cmd: &mut Command) -> (Option<i32>, String, String) {
    let out = cmd.output().await.expect("runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The number after "fence " in what an example printed.
fn fence_in(stdout: &str) -> u64 {
    stdout
        .split("fence ")
        .nth(1)
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no fence in {stdout:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_psycopg_example_writes_under_the_lock_and_a_stale_fence_is_refused() {
    let Some((python, pg)) = setup("PostgreSQL", Postgres::start).await else {
        return;
    };
    let sql = concat!(env!("CARGO_MANIFEST_DIR"), "/fenced/sql/raftlock_fence.sql");
    let out = pg
        .psql("postgres")
        .args(["-f", sql])
        .output()
        .expect("psql");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cluster = TestCluster::start(1).await;
    let endpoints = cluster.addrs().join(",");
    let url = pg.url("postgres");
    let balance = || {
        let out = pg
            .psql("postgres")
            .args(["-At", "-c", "SELECT balance FROM accounts WHERE id = 42"])
            .output()
            .expect("psql");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };

    let mut fences = Vec::new();
    for expected in ["10", "20"] {
        let (code, stdout, stderr) = run(locked(
            &endpoints,
            "accounts/42",
            &python,
            "fenced_postgres.py",
            &[],
        )
        .env("DATABASE_URL", &url))
        .await;
        assert_eq!(code, Some(0), "{stdout}{stderr}");
        assert!(stdout.contains(&format!("balance {expected}")), "{stdout}");
        fences.push(fence_in(&stdout));
    }
    let (old, latest) = (fences[0], fences[1]);
    assert!(latest > old);

    let (code, stdout, stderr) =
        run(
            unlocked("accounts/42", old, &python, "fenced_postgres.py", &[])
                .env("DATABASE_URL", &url),
        )
        .await;
    assert_eq!(code, Some(3), "{stdout}{stderr}");
    assert!(
        stderr.contains(&format!(
            "refused: stale fence {old} for resource 'accounts/42': fence {latest} was already \
             accepted (latest accepted fence: {latest})"
        )),
        "{stderr}"
    );
    assert_eq!(balance(), "20", "nothing of the refused transaction kept");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_py_example_writes_under_the_lock_and_a_stale_fence_is_refused() {
    let Some((python, redis)) = setup("Redis", Redis::start).await else {
        return;
    };
    let cluster = TestCluster::start(1).await;
    let endpoints = cluster.addrs().join(",");
    let url = redis.url();
    let get = |key: &str| {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &redis.port().to_string(), "GET", key])
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };

    let mut fences = Vec::new();
    for value in ["first", "second"] {
        let (code, stdout, stderr) = run(locked(
            &endpoints,
            "accounts/42",
            &python,
            "fenced_redis.py",
            &[value],
        )
        .env("REDIS_URL", &url))
        .await;
        assert_eq!(code, Some(0), "{stdout}{stderr}");
        fences.push(fence_in(&stdout));
        assert_eq!(get("accounts/42"), value);
    }
    let (old, latest) = (fences[0], fences[1]);
    assert_eq!(get("accounts/42:raftlock-fence"), latest.to_string());

    let (code, stdout, stderr) =
        run(
            unlocked("accounts/42", old, &python, "fenced_redis.py", &["late"])
                .env("REDIS_URL", &url),
        )
        .await;
    assert_eq!(code, Some(3), "{stdout}{stderr}");
    assert!(
        stderr.contains(&format!(
            "STALEFENCE {latest} stale fence {old} for accounts/42"
        )),
        "{stderr}"
    );
    assert_eq!(get("accounts/42"), "second");
    cluster.shutdown().await;
}
