//! Losing a majority (issue 45, item 1), with real processes: a three-node
//! cluster loses two nodes with their disks. The survivor, stopped, is
//! exported offline (`raftlockd export`), then started with
//! `raftlockd run --force-new-cluster` as the only voter of a new cluster:
//! every lock it had committed is still held by the same session with the
//! same fence, new fences are above every old one, and two new nodes make
//! it three voters again. The drill's steps are the guide's block ("Losing
//! a majority" in docs/operations/backup-and-recovery.md), run as written. Along the way: export refuses a data directory a
//! node runs on and a file that exists, and the flag refuses to act while
//! another voter of the node's cluster still answers.

mod procs;

use std::time::Duration;

use procs::{describe, eventually, locks, status, Procs};
use raftlock_proto::v1 as pb;
use raftlock_proto::v1::cluster_client::ClusterClient;

const HELD: usize = 12;

fn export(data_dir: &std::path::Path, out: &std::path::Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_raftlockd"))
        .arg("export")
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--out")
        .arg(out)
        .output()
        .expect("raftlockd runs")
}

/// The holders of `name` at `addr`: (session, fence) pairs.
async fn holders(addr: &str, name: &str) -> Option<Vec<(u64, u64)>> {
    let info = describe(addr, name).await?;
    Some(
        info.holders
            .iter()
            .map(|h| (h.session_id, h.fence))
            .collect(),
    )
}

/// Runs the guide's drill steps as an operator would, under `sh -eu` in a
/// directory of its own: this build's `raftlock` and `raftlockd` first on
/// the PATH, except that `raftlockd run` (step 3, whose `...` stands for
/// the node's usual flags) only writes its arguments down for the test to
/// start the node with, and `systemctl stop raftlockd` sends the survivor
/// SIGTERM. `/var/lib/raftlock` is the survivor's data directory;
/// `RAFTLOCK_ENDPOINTS` its address.
struct Drill {
    dir: std::path::PathBuf,
    data_dir: String,
    endpoints: String,
}

impl Drill {
    fn new(dir: &std::path::Path, procs: &Procs, survivor: u64) -> Drill {
        use std::os::unix::fs::PermissionsExt as _;
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).expect("bin");
        std::os::unix::fs::symlink(procs::raftlock_cli(), bin.join("raftlock")).expect("raftlock");
        let stand_in = format!(
            "#!/bin/sh\n\
             if [ \"$1\" = run ]; then printf '%s\\n' \"$@\" > '{}'; exit 0; fi\n\
             exec '{}' \"$@\"\n",
            dir.join("run-args").display(),
            env!("CARGO_BIN_EXE_raftlockd"),
        );
        let systemctl = format!(
            "#!/bin/sh\n\
             [ \"$*\" = 'stop raftlockd' ] || {{ echo \"systemctl $*: not in the drill\" >&2; exit 2; }}\n\
             kill -TERM {}\n",
            procs.pid(survivor)
        );
        let scripts = [("raftlockd", stand_in), ("systemctl", systemctl)];
        for (name, text) in scripts {
            std::fs::write(bin.join(name), text).expect("script");
            std::fs::set_permissions(bin.join(name), std::fs::Permissions::from_mode(0o755))
                .expect("chmod");
        }
        Drill {
            dir: dir.to_path_buf(),
            data_dir: procs.data_dir(survivor).display().to_string(),
            endpoints: procs.addr(survivor),
        }
    }

    /// Runs `step`; its standard output. Panics with its output if it fails.
    fn run(&self, step: &str) -> String {
        let script = step.replace("/var/lib/raftlock", &self.data_dir);
        let path = format!(
            "{}:{}",
            self.dir.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let out = std::process::Command::new("sh")
            .args(["-eu", "-c", &script])
            .current_dir(&self.dir)
            .env("PATH", path)
            .env("RAFTLOCK_ENDPOINTS", &self.endpoints)
            .output()
            .expect("sh runs");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "the drill's step failed:\n{script}\n{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// The arguments step 3's `raftlockd run` was given.
    fn run_args(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("run-args"))
            .expect("step 3 ran raftlockd run")
            .lines()
            .map(str::to_string)
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_survivor_of_a_lost_majority_restarts_the_cluster_with_everything_it_had() {
    let mut procs = Procs::start(3, &[]);
    let leader = procs.leader().await;
    let addr = procs.addr(leader);
    let mut c = locks(&addr);
    let session = c
        .open_session(pb::OpenSessionRequest {
            ttl_ms: 60_000,
            nonce: 1,
            ..Default::default()
        })
        .await
        .expect("session")
        .into_inner()
        .session_id;
    let mut held = Vec::new();
    for i in 0..HELD {
        let name = format!("held/{i}");
        let g = c
            .acquire(pb::AcquireRequest {
                session_id: session,
                seq: 1 + i as u64,
                name: name.clone(),
                mode: pb::Mode::Exclusive as i32,
                ..Default::default()
            })
            .await
            .expect("acquire")
            .into_inner();
        assert!(g.acquired, "{name}");
        held.push((name, g.fence));
    }
    // Grants released since, so the fence counter is past the held ones.
    let mut last_fence = 0;
    for n in 0..20 {
        last_fence = procs::lock_cycle(&addr, "cycled", 100 + n)
            .await
            .expect("a lock cycle");
    }
    // The survivor: node 1 (the guide's `--id 1`), once it has applied
    // everything.
    let survivor = 1;
    let committed = status(&addr).await.expect("status").applied_index;
    eventually(
        "the survivor applies everything",
        Duration::from_secs(60),
        || {
            let a = procs.addr(survivor);
            async move { (status(&a).await?.applied_index >= committed).then_some(()) }
        },
    )
    .await;
    let dir = tempfile::tempdir().expect("dir");
    let backup = dir.path().join("survivor.backup");
    // Refused while the node runs on its data.
    let out = export(&procs.data_dir(survivor), &backup);
    assert!(!out.status.success(), "export of a running node's data");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("stop it first"), "{stderr}");
    assert!(!backup.exists());

    // The majority goes, with its disks.
    for id in (1..=3).filter(|id| *id != survivor) {
        procs.kill(id).await;
        std::fs::remove_dir_all(procs.data_dir(id)).expect("delete its data");
    }

    // The rest is the guide's drill ("Losing a majority"), each step run
    // as written, with the survivor's data directory for
    // /var/lib/raftlock and the new nodes' addresses for 10.0.0.4/5.
    let drill = Drill::new(dir.path(), &procs, survivor);
    let steps = raftlock_testkit::guide::steps(&raftlock_testkit::guide::block("majority-drill"));
    let numbers: Vec<u32> = steps.iter().map(|(n, _)| *n).collect();
    assert_eq!(numbers, [1, 2, 3, 4], "the drill's steps");

    // 1. `systemctl stop raftlockd`: SIGTERM; the survivor stops cleanly.
    drill.run(&steps[0].1);
    let exit = procs
        .exited(survivor, Duration::from_secs(60))
        .await
        .expect("the survivor stops");
    assert!(exit.success(), "stopped by SIGTERM: {exit}");

    // 2. The offline backup (`raftlockd export`), checked by `raftlock
    // snapshot inspect`: every held lock and the last fence.
    let stdout = drill.run(&steps[1].1);
    println!("{}", stdout.trim());
    assert!(stdout.contains("checksum:    ok"), "{stdout}");
    let bytes = std::fs::read(&backup).expect("backup");
    let checked = raftlock_node::api::backup::check(&bytes).expect("a checksummed backup");
    let stats = checked.table.stats();
    assert_eq!(stats.grants, HELD as u64, "{stats:?}");
    assert_eq!(stats.last_fence, last_fence, "{stats:?}");
    // Never overwritten.
    let again = export(&procs.data_dir(survivor), &backup);
    assert!(!again.status.success(), "export over an existing file");

    // 3. The survivor starts a new cluster of itself alone: the step's
    // command line, with the node's own flags for its `...`.
    drill.run(&steps[2].1);
    let data_dir = procs.data_dir(survivor).display().to_string();
    assert_eq!(
        drill.run_args(),
        [
            "run",
            "--id",
            "1",
            "--data-dir",
            &data_dir,
            "...",
            "--force-new-cluster"
        ],
        "the step's raftlockd command"
    );
    procs.spawn_with(survivor, false, &["--force-new-cluster"]);
    let at = procs.addr(survivor);
    eventually("the survivor leads alone", Duration::from_secs(60), || {
        let a = at.clone();
        async move {
            let s = status(&a).await?;
            (s.leader_id == survivor && s.role == "leader").then_some(())
        }
    })
    .await;
    for (name, fence) in &held {
        let h = eventually("the restored table", Duration::from_secs(60), || {
            let (a, n) = (at.clone(), name.clone());
            async move { holders(&a, &n).await.filter(|h| !h.is_empty()) }
        })
        .await;
        assert_eq!(h, vec![(session, *fence)], "{name}");
    }
    let fresh = procs::lock_cycle(&at, "after", 500)
        .await
        .expect("a grant in the new cluster");
    assert!(fresh > last_fence, "new fence {fresh} <= old {last_fence}");
    let aside = std::fs::read_dir(procs.data_dir(survivor))
        .expect("data dir")
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("before-force-new-cluster-")
        })
        .count();
    assert_eq!(aside, 1, "the old data is kept aside");

    // 4. Three voters again: two new nodes, started empty, added with
    // `raftlock members add`.
    procs.add(4);
    procs.add(5);
    let step = steps[3]
        .1
        .replace("10.0.0.4:7101", &procs.addr(4))
        .replace("10.0.0.5:7101", &procs.addr(5));
    assert_ne!(step, steps[3].1, "step 4 adds 10.0.0.4 and 10.0.0.5");
    drill.run(&step);
    let mut admin = ClusterClient::new(procs::channel(&at));
    let members = admin
        .members(pb::MembersRequest {})
        .await
        .expect("members")
        .into_inner()
        .members;
    let mut voters: Vec<u64> = members.iter().filter(|m| m.voter).map(|m| m.id).collect();
    voters.sort();
    assert_eq!(voters, vec![survivor, 4, 5], "{members:?}");

    // The flag left on: refused while the other voters answer; the node
    // does not start a second cluster.
    procs.kill(survivor).await;
    procs.spawn_with(survivor, false, &["--force-new-cluster"]);
    let exit = procs
        .exited(survivor, Duration::from_secs(60))
        .await
        .expect("refused, it exits");
    assert!(!exit.success());
    let log = procs.read_log(survivor);
    assert!(log.contains("--force-new-cluster refused"), "{log}");
    // Without the flag it rejoins its (new) cluster.
    procs.spawn(survivor, false);
    let leader = procs.leader().await;
    assert!(procs::lock_cycle(&procs.addr(leader), "rejoined", 600)
        .await
        .is_some());
}

/// A node stopped after it bootstrapped its new cluster but before it
/// proposed the backup waiting in its data directory (`raftlockd restore`
/// + `--init`, or `--force-new-cluster`) proposes it on its next start:
/// the cluster is empty and the backup still waits, so it is not done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_left_pending_by_a_stop_after_bootstrap_is_applied_on_the_next_start() {
    use raftlock_node::state::{cmd, Command, LockName, LockTable, Mode, SessionId};
    let mut procs = Procs::start(1, &[]);
    procs.leader().await;
    procs.kill(1).await;
    // The state such a stop leaves: a bootstrapped, empty cluster and the
    // backup still in place.
    let mut table = LockTable::new();
    table.apply(
        1,
        Command::OpenSessionV0(cmd::OpenSessionV0 {
            ttl_ms: 60_000,
            lock_delay_ms: 0,
            nonce: 7,
            owner: String::new(),
        }),
    );
    table.apply(
        2,
        Command::Acquire(cmd::Acquire {
            session: SessionId(1),
            seq: 1,
            name: LockName::new("pending/restore").expect("a name"),
            mode: Mode::Exclusive,
            timeout_ms: 0,
            value: Vec::new(),
            caller: String::new(),
        }),
    );
    let backup = raftlock_node::api::backup::write(&table, 2, 0xfeed, 1_764_000_000);
    let dir = procs.data_dir(1);
    std::fs::write(dir.join(raftlock_node::node::RESTORE_FILE), backup).expect("place it");
    procs.spawn(1, true);
    let at = procs.addr(1);
    let h = eventually(
        "the pending backup restored",
        Duration::from_secs(60),
        || {
            let a = at.clone();
            async move {
                holders(&a, "pending/restore")
                    .await
                    .filter(|h| !h.is_empty())
            }
        },
    )
    .await;
    assert_eq!(h.len(), 1, "{h:?}");
    assert!(dir.join("restore.applied").exists());
}
