//! A node of another cluster among the peers does not flood the logs.
//!
//! On 6bd3e3c a node 1 that had lost its data and bootstrapped a new
//! cluster (`--init` on an empty directory) next to its old peers made them
//! refuse each other's Raft RPCs as fast as they were sent: node 1 logged
//! 38,657 ERROR lines in about 10 s (operator review 2026-11-25, §4). The
//! refusals stay (the cluster id keeps the two apart), but each node says
//! so a handful of times, and the senders back off.

mod procs;

use std::time::Duration;

use procs::{eventually, status, Procs};

/// How long the foreign node runs beside the cluster.
const WATCH: Duration = Duration::from_secs(10);

/// Most WARN and ERROR lines all three nodes together may write meanwhile.
const MAX_LINES: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_another_cluster_is_refused_without_flooding_the_logs() {
    // raftlockd's own default log filter, as in production.
    let mut procs = Procs::start_logging(3, &[], "");
    procs.leader().await;
    // Node 1 loses its data and bootstraps a cluster of its own.
    procs.kill(1).await;
    std::fs::remove_dir_all(procs.data_dir(1)).expect("wipe node 1");
    let before: Vec<usize> = (1..=3)
        .map(|id| procs.read_log(id).lines().count())
        .collect();
    procs.spawn(1, true);
    let addr = procs.addr(1);
    eventually("node 1 answers", Duration::from_secs(30), || {
        let addr = addr.clone();
        async move { status(&addr).await }
    })
    .await;
    tokio::time::sleep(WATCH).await;

    let mut noisy = Vec::new();
    let mut refused = false;
    for id in 1..=3 {
        let log = procs.read_log(id);
        for line in log.lines().skip(before[id as usize - 1]) {
            refused |= line.contains("another cluster");
            if line.contains("ERROR") || line.contains("WARN") {
                noisy.push(format!("node {id}: {line}"));
            }
        }
    }
    assert!(refused, "the nodes say they refuse the other cluster");
    assert!(
        noisy.len() <= MAX_LINES,
        "{} WARN/ERROR lines in {WATCH:?}; the first ones:\n{}",
        noisy.len(),
        noisy[..noisy.len().min(20)].join("\n")
    );
    // The two nodes of the old cluster still have a leader.
    let s = status(&procs.addr(2)).await.expect("node 2 answers");
    assert_ne!(s.leader_id, 0, "nodes 2 and 3 keep a leader: {s:?}");
    assert_ne!(s.leader_id, 1);
}
