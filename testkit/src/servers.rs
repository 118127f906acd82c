//! Real database servers for tests and the harness: PostgreSQL and Redis
//! from Debian's packages, each started in a temporary directory of its own
//! on a free loopback port, and stopped (its directory removed) when the
//! handle is dropped.
//!
//! Never a mock: what fences a store must keep is tested against the
//! stores themselves.
//!
//! * A missing server is installed with `apt-get` (Debian's `postgresql`,
//!   `redis-server`) when this process runs as root; the install never
//!   starts the packages' own system services (a `policy-rc.d` that says no
//!   is in place while it runs).
//! * PostgreSQL refuses to run as root: as root, `initdb` and `postgres`
//!   run as the `postgres` user the package creates, in a directory handed
//!   to that user.
//! * Only where a server can be neither found nor installed (not root, no
//!   `apt-get`) does [`Postgres::start`] or [`Redis::start`] answer
//!   [`Unavailable`]; tests then skip with that message — unless `CI` is
//!   `true` or `RAFTLOCK_REQUIRE_SERVERS` is `1`, where [`require`] turns a
//!   skip into a failure, so CI never passes by skipping.
//! * A server is started and stopped by a thread of its own that lives as
//!   long as its handle, and gets `PR_SET_PDEATHSIG`: if the process is
//!   killed and never drops the handle, the server dies with it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// How long a server may take to start before we give up.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a server gets to shut down cleanly before it is killed.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts at a free port (another process may take the one we picked
/// between our probe and the server's bind).
const PORT_ATTEMPTS: usize = 5;

/// No server can be had on this machine; the message says why and what to
/// do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unavailable {}

/// Whether this run must not skip: `CI=true` or
/// `RAFTLOCK_REQUIRE_SERVERS=1`.
pub fn servers_required() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
        || std::env::var("RAFTLOCK_REQUIRE_SERVERS").is_ok_and(|v| v == "1")
}

/// The server, or `None` after printing why the test is skipped. Panics
/// instead of skipping where [`servers_required`].
pub fn require<T>(what: &str, started: Result<T, Unavailable>) -> Option<T> {
    match started {
        Ok(s) => Some(s),
        Err(e) if servers_required() => {
            panic!("{what} is required here (CI=true or RAFTLOCK_REQUIRE_SERVERS=1): {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED: no {what} on this machine: {e}");
            None
        }
    }
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Serializes installs within this process (dpkg's own lock, waited on
/// with `DPkg::Lock::Timeout`, covers other processes).
static APT: Mutex<bool> = Mutex::new(false);

/// Installs Debian packages as root, without letting them start services
/// (for tests that need a tool or server from Debian: they call this when
/// it is missing, and skip or fail with the message otherwise).
pub fn apt_install(packages: &[&str]) -> Result<(), Unavailable> {
    if !is_root() {
        return Err(Unavailable(format!(
            "Debian's {} is not installed and this process is not root, so it cannot install it \
             (run `apt-get install {}` as root, or run the tests as root)",
            packages.join(", "),
            packages.join(" ")
        )));
    }
    if Command::new("apt-get").arg("--version").output().is_err() {
        return Err(Unavailable(format!(
            "{} is not installed and there is no apt-get to install it with",
            packages.join(", ")
        )));
    }
    let mut updated = APT.lock().unwrap_or_else(|p| p.into_inner());
    let apt = |args: &[&str]| -> Result<(), Unavailable> {
        let out = Command::new("apt-get")
            .args(["-o", "DPkg::Lock::Timeout=600", "-qq"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Unavailable(format!("apt-get did not run: {e}")))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(Unavailable(format!(
                "apt-get {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    };
    if !*updated {
        apt(&["update"])?;
        *updated = true;
    }
    // Debian's maintainer scripts ask invoke-rc.d before starting a
    // service; a policy-rc.d that exits 101 makes the answer "no", so the
    // install leaves no system PostgreSQL or Redis running.
    let policy = Path::new("/usr/sbin/policy-rc.d");
    let placed = !policy.exists() && std::fs::write(policy, "#!/bin/sh\nexit 101\n").is_ok();
    if placed {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(policy, std::fs::Permissions::from_mode(0o755));
    }
    let mut args = vec!["install", "-y", "--no-install-recommends"];
    args.extend_from_slice(packages);
    let result = apt(&args);
    if placed {
        let _ = std::fs::remove_file(policy);
    }
    result
}

/// A user's uid and gid from `/etc/passwd`.
fn user_ids(name: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.len() > 3 && f[0] == name).then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))?
    })
}

/// Makes the child die with the thread that started it.
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec the closure makes one
    // async-signal-safe system call (prctl) and allocates nothing.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            Ok(())
        });
    }
}

/// A started server process with its log, stopped on drop.
///
/// The child is spawned, watched and stopped by a keeper thread that lives
/// exactly as long as this handle: `PR_SET_PDEATHSIG` fires when the
/// *thread* that forked the child ends, so the child must not be forked by
/// a thread that may end first (a test's, or one of tokio's blocking
/// threads, which end after 10 s idle). If the process dies, the keeper
/// dies with it and the server gets SIGKILL.
struct Running {
    log: PathBuf,
    /// Dropping it tells the keeper to stop the server.
    stop: Option<mpsc::Sender<()>>,
    keeper: Option<std::thread::JoinHandle<()>>,
}

/// How the keeper's start went.
enum Started {
    Ready,
    PortTaken,
    Failed(Unavailable),
}

impl Running {
    /// Spawns `cmd` (stdout and stderr to `log`) and waits until the log
    /// shows `ready` and `port` accepts connections. `Ok(None)`: the port
    /// was taken before the server could bind it (try another). `signal`
    /// asks the server for a quick clean shutdown.
    fn spawn(
        mut cmd: Command,
        log: PathBuf,
        port: u16,
        ready: &str,
        signal: Signal,
    ) -> Result<Option<Running>, Unavailable> {
        let out = File::create(&log).map_err(|e| Unavailable(format!("log file: {e}")))?;
        let err = out
            .try_clone()
            .map_err(|e| Unavailable(format!("log file: {e}")))?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        die_with_parent(&mut cmd);
        let (started_tx, started) = mpsc::channel();
        let (stop, stopped) = mpsc::channel::<()>();
        let (ready, log_path) = (ready.to_string(), log.clone());
        let keeper = std::thread::Builder::new()
            .name(format!("server-keeper-{port}"))
            .spawn(move || {
                let mut child = match cmd.spawn() {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = started_tx.send(Started::Failed(Unavailable(format!(
                            "cannot start {cmd:?}: {e}"
                        ))));
                        return;
                    }
                };
                let outcome = wait_ready(&mut child, &log_path, port, &ready);
                let ok = matches!(outcome, Started::Ready);
                let _ = started_tx.send(outcome);
                if ok {
                    // Until the handle is dropped (or sends).
                    let _ = stopped.recv();
                }
                stop_child(&mut child, signal);
            })
            .map_err(|e| Unavailable(format!("cannot start a keeper thread: {e}")))?;
        let running = Running {
            log,
            stop: Some(stop),
            keeper: Some(keeper),
        };
        match started.recv() {
            Ok(Started::Ready) => Ok(Some(running)),
            Ok(Started::PortTaken) => Ok(None),
            Ok(Started::Failed(e)) => Err(e),
            Err(_) => Err(Unavailable("the keeper thread died while starting".into())),
        }
    }
}

/// Polls until the log shows `ready` and `port` answers.
fn wait_ready(child: &mut Child, log: &Path, port: u16, ready: &str) -> Started {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Ok(Some(status)) = child.try_wait() {
            if text.contains("Address already in use") || text.contains("could not bind") {
                return Started::PortTaken;
            }
            return Started::Failed(Unavailable(format!(
                "the server exited ({status}) while starting; its log:\n{text}"
            )));
        }
        if text.contains(ready) && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Started::Ready;
        }
        if Instant::now() > deadline {
            return Started::Failed(Unavailable(format!(
                "the server was not ready within {START_TIMEOUT:?}; its log:\n{text}"
            )));
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Asks the child to stop with `signal`, then kills it after
/// [`STOP_TIMEOUT`].
fn stop_child(child: &mut Child, signal: Signal) {
    if let Ok(None) = child.try_wait() {
        let _ = kill(Pid::from_raw(child.id() as i32), signal);
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
    }
    let _ = child.wait();
}

impl Drop for Running {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(k) = self.keeper.take() {
            let _ = k.join();
        }
    }
}

/// Runs `f` with a free port ([`crate::ports`]) until the server binds one
/// (a process that does not ask `ports` may still take a port between our
/// probe and the server's bind).
fn on_a_free_port<T>(
    mut f: impl FnMut(u16) -> Result<Option<T>, Unavailable>,
) -> Result<T, Unavailable> {
    for _ in 0..PORT_ATTEMPTS {
        let port = crate::ports::free_port();
        if let Some(t) = f(port)? {
            return Ok(t);
        }
    }
    Err(Unavailable(format!(
        "every one of {PORT_ATTEMPTS} free ports was taken before the server could bind it"
    )))
}

/// The directory with PostgreSQL's `initdb` and `postgres`: from
/// `RAFTLOCK_PG_BINDIR`, else Debian's newest `/usr/lib/postgresql/*/bin`,
/// else `PATH`.
pub fn postgres_bin_dir() -> Option<PathBuf> {
    let has = |d: &Path| d.join("initdb").is_file() && d.join("postgres").is_file();
    if let Some(d) = std::env::var_os("RAFTLOCK_PG_BINDIR").map(PathBuf::from) {
        return has(&d).then_some(d);
    }
    let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            has(&bin).then_some((v, bin))
        })
        .collect();
    debian.sort();
    if let Some((_, bin)) = debian.pop() {
        return Some(bin);
    }
    std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).find(|d| has(d)))
}

/// A PostgreSQL server of this process's own, on `127.0.0.1`, with one
/// superuser `postgres` (trust authentication, loopback only) and the
/// database `postgres`. Stopped (fast shutdown) and deleted on drop.
pub struct Postgres {
    running: Running,
    port: u16,
    bin: PathBuf,
    // Dropped after `running`: the server stops before its files go.
    dir: tempfile::TempDir,
}

impl Postgres {
    /// Finds (or, as root, installs) PostgreSQL, runs `initdb` in a
    /// temporary directory and starts the server on a free port.
    pub fn start() -> Result<Postgres, Unavailable> {
        let bin = match postgres_bin_dir() {
            Some(b) => b,
            None => {
                apt_install(&["postgresql"])?;
                postgres_bin_dir().ok_or_else(|| {
                    Unavailable("postgresql installed, but no initdb/postgres found".into())
                })?
            }
        };
        // As root, the server runs as the package's `postgres` user.
        let ids = if is_root() {
            Some(user_ids("postgres").ok_or_else(|| {
                Unavailable(
                    "running as root, but there is no `postgres` user to run PostgreSQL as".into(),
                )
            })?)
        } else {
            None
        };
        let dir = tempfile::Builder::new()
            .prefix("raftlock-pg-")
            .tempdir()
            .map_err(|e| Unavailable(format!("temporary directory: {e}")))?;
        if let Some((uid, gid)) = ids {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .map_err(|e| Unavailable(format!("chown of {}: {e}", dir.path().display())))?;
        }
        let as_user = |cmd: &mut Command| {
            use std::os::unix::process::CommandExt;
            if let Some((uid, gid)) = ids {
                cmd.uid(uid).gid(gid);
            }
            // A directory the server's user can read, whatever ours is.
            cmd.current_dir(dir.path());
        };
        let data = dir.path().join("data");
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C"])
            .arg("--no-sync");
        as_user(&mut initdb);
        let out = initdb
            .output()
            .map_err(|e| Unavailable(format!("cannot run initdb: {e}")))?;
        if !out.status.success() {
            return Err(Unavailable(format!(
                "initdb failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let (running, port) = on_a_free_port(|port| {
            let mut cmd = Command::new(bin.join("postgres"));
            cmd.arg("-D")
                .arg(&data)
                .arg("-p")
                .arg(port.to_string())
                .args(["-c", "listen_addresses=127.0.0.1"])
                // No Unix socket: nothing but loopback TCP.
                .args(["-c", "unix_socket_directories="])
                .args(["-c", "max_connections=200"]);
            as_user(&mut cmd);
            // SIGINT: fast shutdown (roll back open transactions, stop).
            Ok(Running::spawn(
                cmd,
                dir.path().join("postgres.log"),
                port,
                "ready to accept connections",
                Signal::SIGINT,
            )?
            .map(|r| (r, port)))
        })?;
        Ok(Postgres {
            running,
            port,
            bin,
            dir,
        })
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A libpq key-value connection string for database `db` (what
    /// `tokio_postgres::connect` and psycopg take).
    pub fn conn_str(&self, db: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={db}",
            self.port
        )
    }

    /// A `postgres://` URL for database `db`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The directory of the server's binaries (`psql` is there too).
    pub fn bin_dir(&self) -> &Path {
        &self.bin
    }

    /// `psql` against database `db`, stopping at the first error.
    pub fn psql(&self, db: &str) -> Command {
        let mut cmd = Command::new(self.bin.join("psql"));
        cmd.args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d"])
            .arg(self.conn_str(db));
        cmd
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.running.log).unwrap_or_default()
    }

    /// The temporary directory everything lives in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// `redis-server` on `PATH` or where Debian puts it.
pub fn redis_server_bin() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).find(|d| d.join("redis-server").is_file()))
    {
        return Some(d.join("redis-server"));
    }
    let debian = PathBuf::from("/usr/bin/redis-server");
    debian.is_file().then_some(debian)
}

/// A Redis server of this process's own on `127.0.0.1` (no persistence:
/// these tests never restart it). Stopped and deleted on drop.
pub struct Redis {
    running: Running,
    port: u16,
    // Dropped after `running`.
    dir: tempfile::TempDir,
}

impl Redis {
    /// Finds (or, as root, installs) `redis-server` and starts it on a free
    /// port in a temporary directory.
    pub fn start() -> Result<Redis, Unavailable> {
        let bin = match redis_server_bin() {
            Some(b) => b,
            None => {
                apt_install(&["redis-server"])?;
                redis_server_bin()
                    .ok_or_else(|| Unavailable("redis-server installed, but not found".into()))?
            }
        };
        let dir = tempfile::Builder::new()
            .prefix("raftlock-redis-")
            .tempdir()
            .map_err(|e| Unavailable(format!("temporary directory: {e}")))?;
        let (running, port) = on_a_free_port(|port| {
            let mut cmd = Command::new(&bin);
            cmd.args(["--bind", "127.0.0.1", "--port"])
                .arg(port.to_string())
                .arg("--dir")
                .arg(dir.path())
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .args(["--logfile", ""]);
            Ok(Running::spawn(
                cmd,
                dir.path().join("redis.log"),
                port,
                "Ready to accept connections",
                Signal::SIGTERM,
            )?
            .map(|r| (r, port)))
        })?;
        Ok(Redis { running, port, dir })
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A `redis://` URL of the server.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.running.log).unwrap_or_default()
    }

    /// The temporary directory the server runs in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// The program `program` from `PATH`, installing Debian's `package` (as
/// root) if it is not there (for tests that run a tool: `openssl`,
/// `systemd-analyze`, ...).
pub fn debian_tool(program: &str, package: &str) -> Result<PathBuf, Unavailable> {
    let find = || {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(program))
                .find(|p| p.is_file())
        })
    };
    if let Some(found) = find() {
        return Ok(found);
    }
    apt_install(&[package])?;
    find().ok_or_else(|| {
        Unavailable(format!(
            "Debian's {package} was installed but {program} is not on PATH"
        ))
    })
}

/// A Python virtual environment under `dir` with the packages of the pip
/// requirements file `requirements` installed (from PyPI), made once and
/// again whenever the file changes; its `python`. Calls in one process
/// take turns.
pub fn python_venv(dir: &Path, requirements: &Path) -> Result<PathBuf, Unavailable> {
    static ONCE: Mutex<()> = Mutex::new(());
    let _one_at_a_time = ONCE.lock().unwrap_or_else(|p| p.into_inner());
    let wanted = std::fs::read_to_string(requirements)
        .map_err(|e| Unavailable(format!("cannot read {}: {e}", requirements.display())))?;
    let python = dir.join("bin").join("python");
    let marker = dir.join("raftlock-requirements.txt");
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(wanted.as_str()) {
        return Ok(python);
    }
    let _ = std::fs::remove_dir_all(dir);
    let run = |cmd: &mut Command, what: &str| -> Result<(), Unavailable> {
        let out = cmd
            .output()
            .map_err(|e| Unavailable(format!("{what} did not run: {e}")))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(Unavailable(format!(
                "{what} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    };
    run(
        Command::new("python3").args(["-m", "venv"]).arg(dir),
        "python3 -m venv",
    )?;
    run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(requirements),
        &format!("pip install -r {}", requirements.display()),
    )?;
    std::fs::write(&marker, wanted).map_err(|e| Unavailable(e.to_string()))?;
    Ok(python)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls until nothing listens on `port` any more.
    fn port_closes(port: u16) -> bool {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    #[test]
    fn servers_stop_on_drop_and_outlive_the_thread_that_started_them() {
        let Some(pg) = require("PostgreSQL", Postgres::start()) else {
            return;
        };
        let (port, dir) = (pg.port(), pg.dir().to_path_buf());
        drop(pg);
        assert!(port_closes(port), "PostgreSQL still listens after drop");
        assert!(!dir.exists(), "its directory is removed");

        // Started on a thread that ends (as tokio's blocking threads do
        // after 10 s idle), the server lives on as long as its handle.
        let pg = std::thread::spawn(|| Postgres::start().expect("started once already"))
            .join()
            .unwrap();
        // What is checked is an absence, so it takes a window: a second
        // in which the server must keep answering (the parent-death
        // signal of a finished thread arrives within milliseconds).
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until {
            assert!(
                std::net::TcpStream::connect(("127.0.0.1", pg.port())).is_ok(),
                "PostgreSQL died with the thread that started it; its log:\n{}",
                pg.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(pg);

        let Some(r) = require("Redis", Redis::start()) else {
            return;
        };
        let port = r.port();
        drop(r);
        assert!(port_closes(port), "Redis still listens after drop");
    }

    /// Not a test of its own: the child process of
    /// `a_server_dies_with_the_process_that_started_it`.
    #[test]
    #[ignore = "run by a_server_dies_with_the_process_that_started_it"]
    fn start_a_server_and_wait_to_be_killed() {
        if std::env::var_os("RAFTLOCK_SERVERS_CHILD").is_none() {
            return;
        }
        let pg = Postgres::start().expect("PostgreSQL");
        println!("port={} dir={}", pg.port(), pg.dir().display());
        loop {
            std::thread::park();
        }
    }

    #[test]
    fn a_server_dies_with_the_process_that_started_it() {
        if require("PostgreSQL", Postgres::start()).is_none() {
            return;
        }
        use std::io::{BufRead, BufReader};
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "servers::tests::start_a_server_and_wait_to_be_killed",
                "--ignored",
                "--nocapture",
            ])
            .env("RAFTLOCK_SERVERS_CHILD", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = lines
            .find_map(|l| l.ok().filter(|l| l.starts_with("port=")))
            .expect("the child started a server");
        let (port, dir) = line.split_once(' ').unwrap();
        let port: u16 = port["port=".len()..].parse().unwrap();
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(port_closes(port), "an orphaned PostgreSQL lives on");
        let _ = std::fs::remove_dir_all(&dir["dir=".len()..]);
    }

    #[test]
    fn a_user_is_read_from_passwd() {
        assert_eq!(user_ids("root"), Some((0, 0)));
        assert_eq!(user_ids("no-such-user-here"), None);
    }

    #[test]
    fn a_skip_is_a_failure_only_where_servers_are_required() {
        let gone: Result<(), Unavailable> = Err(Unavailable("test".into()));
        if servers_required() {
            assert!(std::panic::catch_unwind(|| require("x", gone)).is_err());
        } else {
            assert_eq!(require("x", gone), None);
        }
    }
}
