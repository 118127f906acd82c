//! The command's process and `raftlock`'s own: the command dies with it,
//! killed holders and waiters free their locks.

use std::time::Duration;

use raftlock_client::Client;
use raftlock_testkit::TestCluster;

use super::raftlock;

/// If `raftlock` itself dies (SIGKILL, OOM), the command it runs must not
/// go on running without the lock: it gets SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_command_dies_with_raftlock() {
    let cluster = TestCluster::start(3).await;
    let dir = tempfile::tempdir().expect("dir");
    let pid_file = dir.path().join("pid");
    let script = format!(
        "echo $$ > {}.tmp; mv {0}.tmp {0}; exec sleep 30",
        pid_file.display()
    );
    let mut child = raftlock(&cluster.addrs().join(","))
        .args(["lock", "orphan", "--", "sh", "-c", &script])
        .spawn()
        .expect("spawn");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let pid = loop {
        if let Ok(text) = std::fs::read_to_string(&pid_file) {
            break text.trim().parse::<i32>().expect("pid");
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "command never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    child.start_kill().expect("kill -9 raftlock");
    let _ = child.wait().await;
    // Gone (or a zombie nobody has reaped yet) within a second.
    let running = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim().to_string()))
            .is_some_and(|rest| !rest.starts_with('Z'))
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    while running(pid) {
        if tokio::time::Instant::now() > deadline {
            kill_leftover(pid);
            panic!("the command (pid {pid}) still runs after raftlock was killed");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.shutdown().await;
}

/// Cleans up after a failed check.
fn kill_leftover(pid: i32) {
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status();
}

/// Waits (at most `limit`) until `path` exists; its contents.
async fn file_appears(path: &std::path::Path, limit: Duration) -> Option<String> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if !text.is_empty() {
                return Some(text);
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The median of three figures.
fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// A holder process killed with SIGKILL frees its lock a grace after its
/// keep-alive stream closes, long before its 30 s ttl: the next waiter,
/// another process, runs at once. At the defaults (the Rust client's
/// `end_on_disconnect`, 0.75 s): three rounds, their figures printed
/// (docs/clients/rust.md quotes them).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_holder_frees_its_lock_long_before_its_ttl() {
    let cluster = TestCluster::start(3).await;
    let endpoints = cluster.addrs().join(",");
    let client = Client::connect(cluster.addrs()).await.expect("client");
    let dir = tempfile::tempdir().expect("dir");
    let mut figures = Vec::new();
    for round in 0..3 {
        let name = format!("killed/holder/{round}");
        let held = dir.path().join(format!("held{round}"));
        let got = dir.path().join(format!("got{round}"));
        let mut holder = raftlock(&endpoints)
            .args(["lock", &name, "--ttl", "30", "--", "sh", "-c"])
            .arg(format!(
                "echo $RAFTLOCK_FENCE > {}; exec sleep 60",
                held.display()
            ))
            .spawn()
            .expect("holder");
        file_appears(&held, Duration::from_secs(20))
            .await
            .expect("the holder runs");
        let mut waiter = raftlock(&endpoints)
            .args(["lock", &name, "--ttl", "30", "--", "sh", "-c"])
            .arg(format!("echo $RAFTLOCK_FENCE > {}", got.display()))
            .spawn()
            .expect("waiter");
        raftlock_testkit::eventually("the waiter queued", Duration::from_secs(20), || {
            let (client, name) = (client.clone(), name.clone());
            async move {
                let info = client.describe(&name).await.ok()??;
                (info.waiters.len() == 1).then_some(())
            }
        })
        .await;
        let killed = std::time::Instant::now();
        holder.start_kill().expect("kill -9 the holder's raftlock");
        let _ = holder.wait().await;
        let fence = file_appears(&got, Duration::from_secs(25))
            .await
            .expect("the waiter got the lock");
        let took = killed.elapsed();
        // About the 0.75 s grace on an idle machine; the ttl is 30 s.
        eprintln!("cli at its defaults: the waiter ran {took:?} after the holder was killed");
        assert!(
            took < Duration::from_secs(20),
            "the waiter ran {took:?} after the holder was killed (ttl 30 s)"
        );
        let old: u64 = std::fs::read_to_string(&held)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(fence.trim().parse::<u64>().unwrap() > old);
        assert!(waiter.wait().await.expect("waiter exits").success());
        figures.push(took);
    }
    eprintln!(
        "cli at its defaults, killed holder to the next grant: {figures:?}, median {:?}",
        median(figures.clone())
    );
    cluster.shutdown().await;
}

/// A queued waiter process killed with SIGKILL does not take the lock for
/// the rest of its ttl: on release, the waiter behind it gets it within
/// about the dead one's grace. At the defaults, three rounds, figures
/// printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_waiter_does_not_hold_up_the_waiter_behind_it() {
    let cluster = TestCluster::start(3).await;
    let endpoints = cluster.addrs().join(",");
    let client = Client::connect(cluster.addrs()).await.expect("client");
    let mut figures = Vec::new();
    for round in 0..3 {
        let name = format!("killed/waiter/{round}");
        let holder = client
            .session(Duration::from_secs(30))
            .await
            .expect("holder");
        let guard = holder.lock(&name).await.expect("lock");
        let mut dead = raftlock(&endpoints)
            .args(["lock", &name, "--ttl", "30", "--", "sleep", "60"])
            .spawn()
            .expect("waiter process");
        let queued = |n: usize| {
            let (client, name) = (client.clone(), name.clone());
            move || {
                let (client, name) = (client.clone(), name.clone());
                async move {
                    let info = client.describe(&name).await.ok()??;
                    (info.waiters.len() == n).then_some(())
                }
            }
        };
        raftlock_testkit::eventually("the process queued", Duration::from_secs(20), queued(1))
            .await;
        let behind = client
            .session(Duration::from_secs(30))
            .await
            .expect("behind");
        let next = tokio::spawn({
            let name = name.clone();
            async move { behind.lock(&name).await }
        });
        raftlock_testkit::eventually(
            "the second waiter queued",
            Duration::from_secs(20),
            queued(2),
        )
        .await;
        let killed = std::time::Instant::now();
        dead.start_kill().expect("kill -9 the waiting raftlock");
        let _ = dead.wait().await;
        guard.release().await.expect("release");
        let granted = tokio::time::timeout(Duration::from_secs(25), next)
            .await
            .expect("granted before the dead waiter's ttl")
            .expect("join")
            .expect("lock");
        let took = killed.elapsed();
        // Under a second on an idle machine; the dead waiter's ttl is 30 s.
        eprintln!("cli at its defaults: granted {took:?} after the waiter ahead was killed");
        assert!(
            took < Duration::from_secs(20),
            "granted {took:?} after the kill (the dead waiter's ttl is 30 s)"
        );
        assert!(granted.fence() > guard.fence());
        figures.push(took);
    }
    eprintln!(
        "cli at its defaults, killed waiter to the grant behind it: {figures:?}, median {:?}",
        median(figures.clone())
    );
    cluster.shutdown().await;
}
