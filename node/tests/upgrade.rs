//! A rolling upgrade, not only a rolling restart: a three-node cluster of
//! the previous release's `raftlockd` is upgraded to this build one node at
//! a time (followers first, the leader last, each stopped with SIGTERM as
//! the guide's "Rolling upgrade" says), while clients take and release
//! locks through the Rust client; no lock fails, every node rejoins and
//! catches up on the new binary, and the fences keep rising.
//!
//! It needs the previous release's `raftlockd`, which takes a build of
//! another commit: `scripts/upgrade-test.sh` builds it (from the commit in
//! `deploy/upgrade-from`, or one it is given) and runs this test with
//! `RAFTLOCK_PREVIOUS_RAFTLOCKD` set. `cargo test` leaves it out
//! (`#[ignore]`); asked for without the variable, it fails.

mod procs;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use procs::{eventually, status, Procs};

/// How long a node may take to exit after SIGTERM, and to come back and
/// catch up: deadlines for a hang, not figures (each takes well under a
/// second on an idle machine).
const STEP_WITHIN: Duration = Duration::from_secs(60);

/// Clients taking and releasing locks while the nodes are replaced.
const WORKERS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the previous release's raftlockd: scripts/upgrade-test.sh builds it and runs this"]
async fn a_rolling_upgrade_from_the_previous_release_fails_no_lock() {
    let old = PathBuf::from(std::env::var("RAFTLOCK_PREVIOUS_RAFTLOCKD").expect(
        "RAFTLOCK_PREVIOUS_RAFTLOCKD: the previous release's raftlockd (scripts/upgrade-test.sh)",
    ));
    assert!(old.is_file(), "no raftlockd at {}", old.display());
    let mut procs = Procs::start_binary(3, &[], &old);
    procs.leader().await;
    let addrs: Vec<String> = (1..=3).map(|id| procs.addr(id)).collect();

    // The load: each worker takes and releases its own name in a session
    // of its own, through the client (which follows the leader and
    // retries as docs/clients/writing-a-client.md duties say). A failure is any error the
    // client hands back.
    let client = raftlock_client::Client::connect(addrs.clone())
        .await
        .expect("client");
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let errors = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (client, ok, failed, errors, stopped) = (
            client.clone(),
            ok.clone(),
            failed.clone(),
            errors.clone(),
            stopped.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut last_fence = 0;
            while !*stopped.borrow() {
                let cycle = async {
                    let session = client.session(Duration::from_secs(10)).await?;
                    let guard = session.lock(&format!("upgrade/{w}")).await?;
                    let fence = guard.fence().get();
                    guard.release().await?;
                    session.close().await?;
                    Ok::<u64, raftlock_client::Error>(fence)
                };
                match cycle.await {
                    Ok(fence) => {
                        assert!(
                            fence > last_fence,
                            "worker {w}: fence {fence} after {last_fence}"
                        );
                        last_fence = fence;
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        errors
                            .lock()
                            .expect("errors")
                            .push(format!("worker {w}: {e}"));
                    }
                }
            }
        }));
    }
    let granted = |n: u64| {
        let ok = ok.clone();
        async move {
            eventually("grants go on", STEP_WITHIN, || {
                let ok = ok.clone();
                async move { (ok.load(Ordering::Relaxed) > n).then_some(()) }
            })
            .await
        }
    };
    granted(10).await;

    // Followers first, then the leader (whose SIGTERM hands the
    // leadership over).
    let leader = procs.leader().await;
    let order: Vec<u64> = (1..=3).filter(|id| *id != leader).chain([leader]).collect();
    for id in order {
        procs.signal(id, "TERM");
        let exited = procs.exited(id, STEP_WITHIN).await;
        assert!(
            exited.is_some_and(|s| s.success()),
            "node {id} (previous release) did not exit cleanly after SIGTERM: {exited:?}\n{}",
            procs.read_log(id)
        );
        procs.set_binary(id, None);
        procs.spawn(id, false);
        // Back on the new binary, following a leader and caught up with
        // what was committed while it was down.
        let addr = procs.addr(id);
        let others: Vec<String> = addrs.iter().filter(|a| **a != addr).cloned().collect();
        eventually(
            &format!("node {id} rejoins on this build and catches up"),
            STEP_WITHIN,
            || {
                let (addr, others) = (addr.clone(), others.clone());
                async move {
                    let mine = status(&addr).await?;
                    let mut commit = 0;
                    for other in &others {
                        if let Some(s) = status(other).await {
                            commit = commit.max(s.commit_index);
                        }
                    }
                    (mine.leader_id != 0 && commit > 0 && mine.applied_index >= commit)
                        .then_some(())
                }
            },
        )
        .await;
        let before = ok.load(Ordering::Relaxed);
        granted(before + 5).await;
        eprintln!(
            "upgrade: node {id} runs this build; {} lock cycles so far, {} failed",
            ok.load(Ordering::Relaxed),
            failed.load(Ordering::Relaxed)
        );
    }
    procs.leader().await;
    let _ = stop.send(true);
    for w in workers {
        w.await.expect("worker");
    }
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!("upgrade: {ok} lock cycles, {failed} failed");
    assert_eq!(
        failed,
        0,
        "lock cycles failed during the rolling upgrade: {:?}",
        errors.lock().expect("errors")
    );
    assert!(ok > 0);
}
