//! Leader election: candidates campaign with their address; followers read
//! and observe the leader.
//!
//! `cargo run -p raftlock-client --example election` (needs `raftlockd dev`).

use std::time::Duration;

use futures::StreamExt;
use raftlock_client::{Client, Election};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let endpoints = std::env::var("RAFTLOCK_ENDPOINTS")
        .unwrap_or_else(|_| "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103".into());
    let client = Client::connect(endpoints.split(',')).await?;

    let observer = Election::new(
        client.session(Duration::from_secs(10)).await?,
        "elections/api",
    );
    let mut changes = Box::pin(observer.observe().await?);

    let mut a = Election::new(
        client.session(Duration::from_secs(10)).await?,
        "elections/api",
    );
    let fence = a.campaign("10.0.0.1:8080").await?;
    println!("A leads with fence {fence}");

    let mut b = Election::new(
        client.session(Duration::from_secs(10)).await?,
        "elections/api",
    );
    let b_task = tokio::spawn(async move {
        let fence = b.campaign("10.0.0.2:8080").await?;
        println!("B leads with fence {fence}");
        b.resign().await?;
        Ok::<_, raftlock_client::Error>(())
    });

    tokio::time::sleep(Duration::from_millis(200)).await;
    a.resign().await?;
    b_task.await??;
    for _ in 0..3 {
        if let Some(change) = changes.next().await {
            match change? {
                Some((value, fence)) => println!(
                    "leader: {} (fence {fence})",
                    String::from_utf8_lossy(&value)
                ),
                None => println!("no leader"),
            }
        }
    }
    Ok(())
}
