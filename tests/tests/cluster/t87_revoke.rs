//! Revoking a session (`Cluster.RevokeSession`, `raftlock session
//! revoke`): an administrator's expiry through the log.

use std::time::Duration;

use futures::StreamExt;
use raftlock_client::{Client, ClientOptions, Error, EventKind, SessionOptions, WatchEvent};
use raftlock_testkit::{eventually, http, TestCluster};

/// The next REVOKED event of `events` (within 5 s).
async fn next_revoked(events: &mut raftlock_client::WatchStream) -> WatchEvent {
    let found = async {
        while let Some(e) = events.next().await {
            let e = e.expect("watch event");
            if e.kind == EventKind::Revoked {
                return Some(e);
            }
        }
        None
    };
    tokio::time::timeout(Duration::from_secs(5), found)
        .await
        .expect("a revoked event within 5 s")
        .expect("the watch stream ended first")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revoking_a_holder_hands_the_lock_to_its_waiter_and_the_holder_learns_it() {
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let mut events = client.watch("rv/", true).await.expect("watch");
    let holder = client
        .session(Duration::from_secs(6))
        .await
        .expect("holder session");
    let held = holder.lock("rv/x").await.expect("holder locks");
    let waiter = client
        .session(Duration::from_secs(10))
        .await
        .expect("waiter session");
    let waiting = tokio::spawn(async move {
        let g = waiter.lock("rv/x").await;
        (waiter, g)
    });
    eventually("the waiter queued", Duration::from_secs(10), || async {
        let info = client.describe("rv/x").await.ok().flatten()?;
        (info.waiters.len() == 1).then_some(())
    })
    .await;

    let released = client
        .revoke_session(holder.id().get())
        .await
        .expect("revoke");
    assert_eq!(released, 1);

    // The waiter gets the lock, with a larger fence.
    let (_waiter, got) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter is granted")
        .expect("task");
    let got = got.expect("the waiter's lock");
    assert!(
        got.fence() > held.fence(),
        "{:?} after {:?}",
        got.fence(),
        held.fence()
    );
    assert!(!client
        .check_fence("rv/x", held.fence())
        .await
        .expect("check fence"));
    assert!(client
        .check_fence("rv/x", got.fence())
        .await
        .expect("check fence"));

    // The revoked client's guard learns it lost the lock at its next
    // keep-alive (a third of the 6 s ttl), long before the ttl would end.
    tokio::time::timeout(Duration::from_secs(4), holder.lost())
        .await
        .expect("the revoked session is reported lost");
    assert!(!held.is_held());

    // The event stream says who (no access control: "") and when.
    let revoked = next_revoked(&mut events).await;
    assert_eq!(revoked.session, Some(holder.id()));
    assert_eq!(revoked.fence, Some(held.fence()));
    let (by, at) = revoked.revoked.expect("who and when");
    assert_eq!(by, "");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    assert!(at <= now_ms && at > now_ms - 60_000, "{at} vs now {now_ms}");

    // A second revoke of the same session changes nothing: NOT_FOUND.
    let before = client.status().await.expect("status");
    match client.revoke_session(holder.id().get()).await {
        Err(Error::SessionNotFound(_)) => {}
        other => panic!("second revoke: expected SessionNotFound, got {other:?}"),
    }
    // An unknown session: NOT_FOUND; id 0: INVALID_ARGUMENT.
    match client.revoke_session(1 << 40).await {
        Err(Error::SessionNotFound(_)) => {}
        other => panic!("unknown session: expected SessionNotFound, got {other:?}"),
    }
    match client.revoke_session(0).await {
        Err(Error::InvalidArgument(msg)) => assert!(msg.contains("non-zero"), "{msg}"),
        other => panic!("session 0: expected InvalidArgument, got {other:?}"),
    }
    let after = client.status().await.expect("status");
    assert_eq!(
        (after.sessions, after.grants, after.last_fence),
        (before.sessions, before.grants, before.last_fence)
    );
    assert!(got.is_held());

    // The HTTP/JSON route is the same RPC: an empty body is session 0.
    let leader = cluster.leader_addr().await;
    let (code, body) = http(&leader, "POST", "/v1/cluster/RevokeSession", &[])
        .await
        .expect("an answer");
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("INVALID_ARGUMENT"), "{body}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revoked_session_with_lock_delay_keeps_its_lock_delayed() {
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let holder = client
        .session_with(SessionOptions {
            ttl: Duration::from_secs(10),
            lock_delay: Duration::from_secs(2),
            ..SessionOptions::default()
        })
        .await
        .expect("holder");
    let held = holder.lock("rvd/x").await.expect("lock");
    client
        .revoke_session(holder.id().get())
        .await
        .expect("revoke");
    let info = client
        .describe("rvd/x")
        .await
        .expect("describe")
        .expect("entry");
    assert!(info.lock_delayed, "lock-delay applies after a revoke");
    assert!(info.holders.is_empty());
    // Then the name is free again, with a larger fence.
    let other = client
        .session(Duration::from_secs(10))
        .await
        .expect("other");
    let g = tokio::time::timeout(Duration::from_secs(10), other.lock("rvd/x"))
        .await
        .expect("granted after the delay")
        .expect("lock");
    assert!(g.fence() > held.fence());
    cluster.shutdown().await;
}

const ACL: &str = r#"
peer_token = "test-peer-token-0123456789"

[[token]]
identity = "app"
token = "tok-app"

[[token]]
identity = "ops"
token = "tok-ops"

[[rule]]
identity = "app"
allow = "lock"
prefix = ""

[[rule]]
identity = "ops"
allow = "admin"
"#;

fn client_as(cluster: &TestCluster, token: &str) -> Client {
    Client::with_options(
        cluster.addrs(),
        ClientOptions {
            token: Some(token.into()),
            retry_deadline: Duration::from_secs(10),
            ..ClientOptions::default()
        },
    )
    .expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revoking_needs_admin_and_the_event_names_who_revoked() {
    let cluster = TestCluster::start_acl(3, ACL, None).await;
    let app = client_as(&cluster, "tok-app");
    let ops = client_as(&cluster, "tok-ops");
    let s = app.session(Duration::from_secs(10)).await.expect("session");
    let g = s.lock("acl/x").await.expect("lock");
    let mut events = ops.watch("acl/", true).await.expect("watch");

    // `lock` (even on every name, even the session's own identity) is not
    // `admin`: refused, nothing changes.
    match app.revoke_session(s.id().get()).await {
        Err(Error::PermissionDenied(_)) => {}
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
    match client_as(&cluster, "tok-wrong")
        .revoke_session(s.id().get())
        .await
    {
        Err(Error::Unauthenticated(_)) => {}
        other => panic!("expected Unauthenticated, got {other:?}"),
    }
    assert!(ops.check_fence("acl/x", g.fence()).await.expect("check"));

    assert_eq!(ops.revoke_session(s.id().get()).await.expect("revoke"), 1);
    let revoked = next_revoked(&mut events).await;
    assert_eq!(revoked.revoked.map(|(by, _)| by).as_deref(), Some("ops"));
    assert!(!ops.check_fence("acl/x", g.fence()).await.expect("check"));
    cluster.shutdown().await;
}
