//! A 5-node cluster survives losing any two nodes — here the leader and
//! then another — under a steady stream of contended acquires: no
//! acknowledged grant is lost and fences never go backwards on a name.

use std::time::Duration;

use raftlock_testkit::workload::Contenders;
use raftlock_testkit::{eventually, TestCluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_two_of_five_loses_no_acknowledged_grant() {
    const NAMES: [&str; 2] = ["five/0", "five/1"];
    let mut cluster = TestCluster::start(5).await;
    let load = Contenders::start(&cluster, &NAMES, 3, Duration::from_secs(15)).await;
    load.progress(10, "5 nodes").await;

    let leader = cluster.leader().await;
    cluster.kill(leader).await;
    load.progress(10, "after losing the leader").await;
    let second = cluster.running()[0];
    cluster.kill(second).await;
    load.progress(10, "with two of five down").await;
    let acked = load.finish().await;

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
                fences.push(client.node_status(&addr).await.ok()?.last_fence?.get());
            }
            (fences.iter().all(|f| *f == fences[0] && *f >= max_fence)).then_some(())
        },
    )
    .await;
    cluster.shutdown().await;
}
