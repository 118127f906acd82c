//! A downstream store that refuses stale writers.
//!
//! Run against a local cluster (`raftlockd dev`):
//! `cargo run -p raftlock-client --example fenced_store`
//!
//! Writer A takes the lock and is then "paused" (a GC pause, a stalled VM):
//! its session ends while it is not looking, writer B gets the lock with a
//! larger fence and writes. When A wakes up it still believes it holds the
//! lock and writes with its old fence — and the store refuses it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use raftlock_client::fence::{FenceChecker, StaleFence};
use raftlock_client::{Client, Fence};

/// A toy key-value store that checks fences on every write.
#[derive(Default)]
struct Store {
    fences: FenceChecker,
    data: Mutex<HashMap<String, String>>,
}

impl Store {
    fn write(&self, key: &str, value: &str, fence: Fence) -> Result<(), StaleFence> {
        self.fences.guarded(key, fence, || {
            self.data
                .lock()
                .expect("store lock")
                .insert(key.to_string(), value.to_string());
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let endpoints = std::env::var("RAFTLOCK_ENDPOINTS")
        .unwrap_or_else(|_| "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103".into());
    let client = Client::connect(endpoints.split(',')).await?;
    let store = Store::default();

    let a = client.session(Duration::from_secs(5)).await?;
    let guard_a = a.lock("accounts/42").await?;
    store.write("accounts/42", "written by A", guard_a.fence())?;
    println!("A holds accounts/42 with fence {}", guard_a.fence());

    // A pauses; meanwhile its session ends (here: closed behind its back,
    // which is what expiry does) and B takes over.
    a.close().await?;
    let b = client.session(Duration::from_secs(5)).await?;
    let guard_b = b.lock("accounts/42").await?;
    store.write("accounts/42", "written by B", guard_b.fence())?;
    println!("B holds accounts/42 with fence {}", guard_b.fence());

    // A wakes up and writes with its old fence.
    match store.write("accounts/42", "late write by A", guard_a.fence()) {
        Err(stale) => println!("store refused A's late write: {stale}"),
        Ok(()) => panic!("a stale write was accepted"),
    }
    assert_eq!(
        store.data.lock().expect("store lock")["accounts/42"],
        "written by B"
    );
    guard_b.release().await?;
    b.close().await?;
    Ok(())
}
