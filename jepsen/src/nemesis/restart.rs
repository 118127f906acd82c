//! The `restart-fast` nemesis: `kill -9` and start again within 10-200 ms.
//!
//! A node back that fast is inside its followers' lease: none of them has
//! campaigned yet, and a leader comes back in its old term (openraft
//! 0.10's leader restore) with whatever its disk says it had committed,
//! which may lag what it acknowledged. The `leader-after-expiry` variant
//! waits (up to 3 s) for the leader to apply a session expiry (a `Watch`
//! event) and kills it at once, so that expiry is among the last things it
//! committed before the crash: the review's scenario for a renewal after
//! expiry.

use std::sync::Arc;
use std::time::Duration;

use raftlock_proto::v1 as pb;
use rand::rngs::StdRng;
use rand::RngExt;
use serde_json::json;
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::{Active, Started};
use crate::cluster::Cluster;

/// Shortest and longest time a node stays down.
pub const DOWN_MS: std::ops::RangeInclusive<u64> = 10..=200;

/// How long `leader-after-expiry` waits for an expiry before it kills the
/// leader anyway.
const EXPIRY_WAIT: Duration = Duration::from_secs(3);

/// Waits until node `addr` applies a session expiry (a `Watch` event of
/// kind `EXPIRED` on any name), or `within` passes; returns the event.
async fn next_expiry(
    addr: &str,
    creds: &crate::raw::Creds,
    within: Duration,
) -> Option<pb::WatchEvent> {
    let mut locks = crate::raw::locks(crate::raw::fresh_channel(addr), creds);
    let deadline = Instant::now() + within;
    let stream = tokio::time::timeout_at(
        deadline,
        locks.watch(pb::WatchRequest {
            name: String::new(),
            prefix: String::new(),
        }),
    )
    .await
    .ok()?
    .ok()?
    .into_inner();
    let mut stream = stream;
    let expired = async move {
        while let Ok(Some(e)) = stream.message().await {
            if e.kind == pb::EventKind::Expired as i32 {
                return Some(e);
            }
        }
        None
    };
    tokio::time::timeout_at(deadline, expired)
        .await
        .ok()
        .flatten()
}

/// Kills and restarts the leader (most often), a follower, or the leader
/// and a follower together.
pub(super) async fn restart_fast(
    cluster: &Arc<Mutex<Cluster>>,
    members: &[u64],
    leader: Option<u64>,
    rng: &mut StdRng,
) -> anyhow::Result<Started> {
    let l = leader.unwrap_or(members[0]);
    let follower = members.iter().copied().find(|&m| m != l);
    let roll = rng.random_range(0..100);
    let variant = match (roll, follower) {
        (0..=39, _) | (_, None) => "leader",
        (40..=69, _) => "leader-after-expiry",
        (70..=84, _) => "follower",
        _ => "leader-and-follower",
    };
    let targets: Vec<u64> = match variant {
        "follower" => vec![follower.expect("a follower")],
        "leader-and-follower" => vec![l, follower.expect("a follower")],
        _ => vec![l],
    };
    let down = Duration::from_millis(rng.random_range(DOWN_MS));
    let mut trigger = serde_json::Value::Null;
    if variant == "leader-after-expiry" {
        let (addr, creds) = {
            let c = cluster.lock().await;
            (c.addr(l), crate::raw::Creds::new(c.token().as_deref()))
        };
        let waited = Instant::now();
        let event = next_expiry(&addr, &creds, EXPIRY_WAIT).await;
        trigger = json!({
            "waited_ms": waited.elapsed().as_millis() as u64,
            "expired": event.map(|e| json!({"index": e.index, "name": e.name, "session": e.session_id})),
        });
    }
    let mut c = cluster.lock().await;
    for &t in &targets {
        c.kill(t).await?;
    }
    tokio::time::sleep(down).await;
    for &t in &targets {
        c.start_node(t)?;
    }
    let mut back_ms = Vec::new();
    let back = Instant::now();
    for &t in &targets {
        c.wait_serving(t, Duration::from_secs(30)).await?;
        back_ms.push(json!({"node": t, "answered_ms": back.elapsed().as_millis() as u64}));
    }
    Ok((
        variant.to_string(),
        targets,
        json!({"down_ms": down.as_millis() as u64, "trigger": trigger, "back": back_ms}),
        Active::Done,
    ))
}
