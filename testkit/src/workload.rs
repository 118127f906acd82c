//! Load that tests run while they break the cluster: contending workers
//! that record every grant they were acknowledged, and the checks on what
//! they recorded.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use raftlock_client::{Client, Error, LockInfo};
use tokio::task::JoinHandle;

use crate::{eventually, TestCluster};

/// How long [`Contenders::progress`] waits for its grants: a deadline for
/// a cluster that stopped granting, not a rate.
pub const PROGRESS_WITHIN: Duration = Duration::from_secs(120);

/// Workers that take turns on a few names, each recording `(name, fence)`
/// while it holds the grant (so per name the records are in grant order)
/// and asserting that every release finds its grant still there (a lost
/// acknowledged grant would fail the release).
pub struct Contenders {
    acked: Arc<Mutex<Vec<(String, u64)>>>,
    stop: Arc<AtomicBool>,
    workers: Vec<JoinHandle<()>>,
    /// What each worker is doing, and since when (said when progress
    /// stalls).
    doing: Arc<Mutex<Vec<(Instant, String)>>>,
}

/// Records that worker `w` now does `what`.
fn doing(at: &Mutex<Vec<(Instant, String)>>, w: usize, what: String) {
    at.lock().expect("lock")[w] = (Instant::now(), what);
}

impl Contenders {
    /// Starts `workers` workers on `names`, each with its own client (which
    /// knows the cluster's nodes at this moment and finds later ones through
    /// leader hints) and session. Each acquire waits at most `wait`; one
    /// that is not granted in time is simply tried again.
    pub async fn start(
        cluster: &TestCluster,
        names: &'static [&'static str],
        workers: usize,
        wait: Duration,
    ) -> Contenders {
        let acked: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let states = Arc::new(Mutex::new(vec![
            (Instant::now(), "starting".to_string());
            workers
        ]));
        let mut handles = Vec::new();
        for w in 0..workers {
            let client = cluster.client().await;
            let acked = acked.clone();
            let stop = stop.clone();
            let states = states.clone();
            handles.push(tokio::spawn(async move {
                doing(&states, w, "opening its session".into());
                let session = client
                    .session(Duration::from_secs(10))
                    .await
                    .expect("worker session");
                let mut i = w;
                while !stop.load(Ordering::SeqCst) {
                    let name = names[i % names.len()];
                    i += 1;
                    doing(&states, w, format!("acquiring {name}"));
                    let g = match session.lock_timeout(name, wait).await {
                        Ok(g) => g,
                        Err(Error::NotAcquired(_)) => {
                            doing(&states, w, format!("timed out acquiring {name}"));
                            continue;
                        }
                        Err(e) => panic!("worker acquire of {name} failed: {e:?}"),
                    };
                    acked
                        .lock()
                        .expect("lock")
                        .push((name.to_string(), g.fence().get()));
                    doing(
                        &states,
                        w,
                        format!("releasing {name} (fence {})", g.fence()),
                    );
                    assert!(
                        g.release().await.expect("worker releases"),
                        "grant {} on {name} was lost before its release",
                        g.fence()
                    );
                }
                doing(&states, w, "closing its session".into());
                session.close().await.expect("close");
                doing(&states, w, "done".into());
            }));
        }
        Contenders {
            acked,
            stop,
            workers: handles,
            doing: states,
        }
    }

    /// Grants acknowledged so far.
    pub fn count(&self) -> usize {
        self.acked.lock().expect("lock").len()
    }

    /// Waits ([`PROGRESS_WITHIN`] at most) for `more` grants after the ones
    /// so far; if they do not come, panics saying what each worker is
    /// doing. How long they took is printed: a performance figure, not
    /// something this bounds (it bounded 20 s before; a few seconds on an
    /// idle machine, more with nodes down on a loaded one).
    pub async fn progress(&self, more: usize, phase: &str) {
        let start = self.count();
        let started = Instant::now();
        let deadline = started + PROGRESS_WITHIN;
        while self.count() < start + more {
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if self.count() < start + more {
            let now = Instant::now();
            let workers: Vec<String> = self
                .doing
                .lock()
                .expect("lock")
                .iter()
                .enumerate()
                .map(|(w, (since, what))| format!("worker {w}: {what} for {:?}", now - *since))
                .collect();
            panic!(
                "timed out after {PROGRESS_WITHIN:?} waiting for {more} more grants ({phase}): \
                 {} of them came; {}",
                self.count() - start,
                workers.join("; ")
            );
        }
        eprintln!(
            "progress: {more} grants in {:?} ({phase})",
            started.elapsed()
        );
    }

    /// Stops the workers, checks they ended cleanly, and returns every
    /// acknowledged grant after checking no fence was handed out twice and
    /// fences only grew on each name.
    pub async fn finish(self) -> Vec<(String, u64)> {
        self.stop.store(true, Ordering::SeqCst);
        for w in self.workers {
            w.await.expect("worker ran cleanly");
        }
        let acked = self.acked.lock().expect("lock").clone();
        let mut last: BTreeMap<&str, u64> = BTreeMap::new();
        let mut fences = HashSet::new();
        for (name, fence) in &acked {
            assert!(fences.insert(*fence), "fence {fence} handed out twice");
            if let Some(prev) = last.insert(name, *fence) {
                assert!(*fence > prev, "{name}: fence {fence} after {prev}");
            }
        }
        acked
    }
}

/// Polls `Describe` of `name` until the lock exists and `check` holds
/// (20 s at most); returns what it saw.
pub async fn describe_until(
    client: &Client,
    name: &str,
    what: &str,
    check: impl Fn(&LockInfo) -> bool,
) -> LockInfo {
    eventually(what, Duration::from_secs(20), || async {
        client
            .describe(name)
            .await
            .ok()
            .flatten()
            .filter(|info| check(info))
    })
    .await
}
