//! A 5-node cluster survives losing any two nodes — here the leader and
//! then another — under a steady stream of contended acquires: no
//! acknowledged grant is lost and fences never go backwards on a name.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use raftlock_tests::{eventually, TestCluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_two_of_five_loses_no_acknowledged_grant() {
    const NAMES: [&str; 2] = ["five/0", "five/1"];
    let mut cluster = TestCluster::start(5).await;
    let acked: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..3 {
        let client = cluster.client().await;
        let acked = acked.clone();
        let stop = stop.clone();
        workers.push(tokio::spawn(async move {
            let session = client
                .session(Duration::from_secs(10))
                .await
                .expect("session");
            let mut i = w;
            while !stop.load(Ordering::SeqCst) {
                let name = NAMES[i % NAMES.len()];
                i += 1;
                let g = session
                    .lock_timeout(name, Duration::from_secs(15))
                    .await
                    .expect("acquire");
                acked
                    .lock()
                    .expect("lock")
                    .push((name.to_string(), g.fence()));
                // A lost grant would show up here: the release finds nothing.
                assert!(
                    g.release().await.expect("release"),
                    "grant {} on {name} was lost",
                    g.fence()
                );
            }
            session.close().await.expect("close");
        }));
    }
    let count = || acked.lock().expect("lock").len();
    eventually("10 grants", Duration::from_secs(20), || async {
        (count() >= 10).then_some(())
    })
    .await;

    let leader = cluster.leader().await;
    cluster.kill(leader).await;
    let at = count();
    eventually(
        "progress after losing the leader",
        Duration::from_secs(20),
        || async { (count() >= at + 10).then_some(()) },
    )
    .await;
    let second = cluster.running()[0];
    cluster.kill(second).await;
    let at = count();
    eventually(
        "progress with two of five down",
        Duration::from_secs(20),
        || async { (count() >= at + 10).then_some(()) },
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.expect("worker ran cleanly");
    }

    let acked = acked.lock().expect("lock").clone();
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    let mut seen = HashSet::new();
    for (name, fence) in &acked {
        assert!(seen.insert(*fence), "fence {fence} handed out twice");
        if let Some(prev) = last.insert(name, *fence) {
            assert!(*fence > prev, "{name}: fence {fence} after {prev}");
        }
    }

    // The two come back from disk and agree with the rest.
    cluster.restart(leader).await;
    cluster.restart(second).await;
    let max_fence = acked.iter().map(|(_, f)| *f).max().expect("some grants");
    eventually(
        "all five to agree on the last fence",
        Duration::from_secs(20),
        || async {
            let client = cluster.client().await;
            let mut fences = Vec::new();
            for addr in cluster.addrs() {
                fences.push(client.node_status(&addr).await.ok()?.last_fence);
            }
            (fences.iter().all(|f| *f == fences[0] && *f >= max_fence)).then_some(())
        },
    )
    .await;
    cluster.shutdown().await;
}
