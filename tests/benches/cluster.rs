//! Whole-cluster figures (a benchmark, not a test; the last the README
//! quoted are in docs/history/2026-11-27-readme-performance.md):
//!
//! * throughput and latency of uncontended acquire+release pairs through a
//!   3-node cluster on loopback, fsync on, from N concurrent clients;
//! * failover: time from killing the leader to the next successful acquire.
//!
//! `cargo bench -p raftlock-tests --bench cluster [-- --clients 64 --secs 10 --failovers 5]`

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use raftlock_node::node::RaftTiming;
use raftlock_node::raft::WatchReceiver as _;
use raftlock_testkit::TestCluster;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn throughput(clients: u64, secs: u64) {
    let cluster = TestCluster::start_with(3, RaftTiming::default()).await;
    let client = cluster.client().await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in 0..clients {
        let client = client.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let session = client
                .session(Duration::from_secs(30))
                .await
                .expect("session");
            let mut lat = Vec::new();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("bench/{c}/{}", i % 100);
                i += 1;
                let t = Instant::now();
                let g = session.lock(&name).await.expect("lock");
                g.release().await.expect("release");
                lat.push(t.elapsed());
            }
            session.close().await.ok();
            lat
        }));
    }
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("client task"));
    }
    let elapsed = start.elapsed();
    all.sort();
    println!(
        "uncontended acquire+release, 3 nodes, {clients} clients, {secs} s: {:.0} pairs/s, p50 {:.2} ms, p99 {:.2} ms",
        all.len() as f64 / elapsed.as_secs_f64(),
        percentile(&all, 0.50).as_secs_f64() * 1e3,
        percentile(&all, 0.99).as_secs_f64() * 1e3,
    );
    cluster.shutdown().await;
}

async fn failover(rounds: u64) {
    let mut gaps = Vec::new();
    let mut elections = Vec::new();
    for _ in 0..rounds {
        let mut cluster = TestCluster::start_with(3, RaftTiming::default()).await;
        let client = cluster.client().await;
        let session = client
            .session(Duration::from_secs(30))
            .await
            .expect("session");
        // Warm up: the client knows the leader.
        session
            .lock("failover")
            .await
            .expect("lock")
            .release()
            .await
            .expect("release");
        let leader = cluster.leader().await;
        let killed = Instant::now();
        cluster.kill(leader).await;
        let survivors: Vec<_> = cluster
            .running()
            .iter()
            .map(|id| cluster.node(*id).raft.clone())
            .collect();
        let elected = tokio::spawn(async move {
            loop {
                let l = survivors.iter().find_map(|r| {
                    let m = r.metrics().borrow_watched().clone();
                    (m.state == openraft::ServerState::Leader).then_some(())
                });
                if l.is_some() {
                    return killed.elapsed();
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        loop {
            match session.lock("failover").await {
                Ok(g) => {
                    gaps.push(killed.elapsed());
                    g.release().await.ok();
                    break;
                }
                Err(e) => assert!(e.is_retryable(), "unexpected error {e}"),
            }
        }
        elections.push(elected.await.expect("elected"));
        cluster.shutdown().await;
    }
    gaps.sort();
    elections.sort();
    println!(
        "failover (kill leader -> next successful acquire), {rounds} rounds: median {:.0} ms, max {:.0} ms \
         (new leader elected after median {:.0} ms)",
        percentile(&gaps, 0.5).as_secs_f64() * 1e3,
        gaps.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
        percentile(&elections, 0.5).as_secs_f64() * 1e3,
    );
}

fn main() {
    if std::env::var_os("RUST_LOG").is_none() {
        std::env::set_var("RUST_LOG", "off");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        if arg("--secs", 10) > 0 {
            throughput(arg("--clients", 64), arg("--secs", 10)).await;
        }
        failover(arg("--failovers", 5)).await;
    });
}
