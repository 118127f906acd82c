//! A pool of workers that never runs more than 3 jobs at once, cluster-wide,
//! guarded by a semaphore.
//!
//! `cargo run -p raftlock-client --example worker_pool` (needs `raftlockd dev`).

use std::time::Duration;

use raftlock_client::Client;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let endpoints = std::env::var("RAFTLOCK_ENDPOINTS")
        .unwrap_or_else(|_| "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103".into());
    let client = Client::connect(endpoints.split(',')).await?;
    let mut workers = Vec::new();
    for w in 0..8 {
        let client = client.clone();
        workers.push(tokio::spawn(async move {
            // One session per worker: each is its own thread of control.
            let session = client.session(Duration::from_secs(10)).await?;
            let permit = session.semaphore("pools/render", 3).acquire(1).await?;
            println!("worker {w} running with fence {}", permit.fence());
            tokio::time::sleep(Duration::from_millis(200)).await;
            permit.release().await?;
            session.close().await?;
            Ok::<_, raftlock_client::Error>(())
        }));
    }
    for w in workers {
        w.await??;
    }
    Ok(())
}
