use raftlock_client::proto::StatusRequest;
use raftlock_tests::{cluster_at, TestCluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scratch() {
    let mut cluster = TestCluster::start(3).await;
    let leader = cluster.leader().await;
    let mut old = cluster_at(&cluster.addr(leader));
    let s = old.status(StatusRequest {}).await.expect("status before");
    println!("before: role {}", s.into_inner().role);
    cluster.kill(leader).await;
    let r = old.status(StatusRequest {}).await;
    println!(
        "after kill, existing connection: {:?}",
        r.map(|r| r.into_inner().role)
    );
    let r = cluster_at(&cluster.addr(leader))
        .status(StatusRequest {})
        .await;
    println!(
        "after kill, new connection: {:?}",
        r.map(|r| r.into_inner().role).map_err(|e| e.code())
    );
    cluster.shutdown().await;
}
