//! ACL reloads (issue 31, item 6): a revoked token's streams end at once
//! and its sessions expire a ttl later; the peer token rotates without a
//! leader loss.

use std::time::Duration;

use raftlock_client::Error;
use raftlock_proto::v1 as pb;
use raftlock_proto::v1::raft_client::RaftClient;
use raftlock_testkit::{channel, TestCluster};
use tonic::Code;

use super::{acl, as_token, client, PEER_TOKEN};

/// Issue 31, item 6: revoking a token (an ACL reload without it) ends the
/// streams opened with it at once, `UNAUTHENTICATED`: the session's
/// keep-alive stream (so its client reports the lease lost at once, instead
/// of keeping the lock until the next failover, as on 108a1e9) and a
/// `Watch`. The sessions themselves are not closed by the reload: they are
/// no longer renewed, and expire one ttl after their last keep-alive,
/// which frees their locks; nothing waits for a failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revoking_a_token_ends_its_streams_at_once_and_its_sessions_expire_one_ttl_later() {
    use futures::StreamExt as _;
    let mut cluster = TestCluster::start_acl(3, &acl(), None).await;
    let term = |c: &TestCluster| c.node(1).leadership.view().term;
    let billing = client(&cluster, Some("tok-billing"));
    // "At once" is told apart from "when the lease runs out" by a bound
    // (AT_ONCE) far above the milliseconds it takes on an idle machine and
    // far below the ttl.
    let ttl = Duration::from_secs(12);
    const AT_ONCE: Duration = Duration::from_secs(6);
    let session = billing.session(ttl).await.expect("session");
    let guard = session.lock("billing/held").await.expect("lock");
    let auditor = client(&cluster, Some("tok-auditor"));
    let mut watch = auditor.watch("billing/", true).await.expect("watch");
    let ops = client(&cluster, Some("tok-ops"));
    let term_before = term(&cluster);

    // New tokens for both identities; the old ones are gone.
    let rotated = acl()
        .replace("\"tok-billing\"", "\"tok-billing-2\"")
        .replace("\"tok-auditor\"", "\"tok-auditor-2\"");
    for id in 1..=3 {
        cluster.reload_acl(id, &rotated);
    }
    let revoked_at = std::time::Instant::now();
    tokio::time::timeout(AT_ONCE, session.lost())
        .await
        .expect("the client reports the lease lost at once");
    eprintln!(
        "t98: lost() fired {:?} after the reload",
        revoked_at.elapsed()
    );
    let end = tokio::time::timeout(AT_ONCE, watch.next())
        .await
        .expect("the watch ends at once");
    eprintln!(
        "t98: the watch ended {:?} after the reload",
        revoked_at.elapsed()
    );
    assert!(
        matches!(&end, Some(Err(Error::Unauthenticated(m))) if m.contains("revoked")),
        "{end:?}"
    );
    // The session is not closed by the reload...
    let held = ops
        .describe("billing/held")
        .await
        .expect("describe")
        .expect("still held right after the reload");
    assert_eq!(held.holders[0].session, session.id());
    // ...it expires one ttl after its last keep-alive, freeing the lock
    // (the deadline is generous; about one ttl on an idle machine, printed).
    raftlock_testkit::eventually("the revoked session to expire", ttl * 5, || {
        let ops = ops.clone();
        async move {
            ops.describe("billing/held")
                .await
                .ok()
                .and_then(|i| i.is_none().then_some(()))
        }
    })
    .await;
    eprintln!(
        "t98: freed {:?} after the revocation (ttl {ttl:?})",
        revoked_at.elapsed()
    );
    assert_eq!(term(&cluster), term_before, "no failover was needed");
    drop(guard);
    cluster.shutdown().await;
}

/// Issue 31, item 6: the peer token rotates without a leader loss. Every
/// node accepts the tokens in `accept_peer_tokens` besides its own
/// `peer_token`; the runbook's three passes (accept the new one
/// everywhere; send the new one, one node at a time, accepting the old;
/// drop the old) keep every node's token acceptable to every other at
/// every step. On 108a1e9 the file could hold one peer token only (the
/// review lost its leader for 0.5 s rotating it), so the first pass's file
/// did not even parse.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_peer_token_rotates_without_a_leader_loss() {
    let mut cluster = TestCluster::start_acl(3, &acl(), None).await;
    let ops = client(&cluster, Some("tok-ops"));
    let leader = cluster.wait_for_leader().await;
    let term = cluster.node(leader).leadership.view().term;
    let new = "the-new-peer-token-9876543210";
    let pass1 = acl().replace(
        &format!("peer_token = \"{PEER_TOKEN}\""),
        &format!("peer_token = \"{PEER_TOKEN}\"\naccept_peer_tokens = [\"{new}\"]"),
    );
    let pass2 = acl().replace(
        &format!("peer_token = \"{PEER_TOKEN}\""),
        &format!("peer_token = \"{new}\"\naccept_peer_tokens = [\"{PEER_TOKEN}\"]"),
    );
    let pass3 = acl().replace(
        &format!("peer_token = \"{PEER_TOKEN}\""),
        &format!("peer_token = \"{new}\""),
    );
    let writes = |n: usize| {
        let ops = ops.clone();
        async move {
            let s = ops.session(Duration::from_secs(10)).await.expect("session");
            for i in 0..n {
                let g = s.lock(&format!("rotation/{i}")).await.expect("lock");
                g.release().await.expect("release");
            }
            s.close().await.expect("close");
        }
    };
    // Leader last in the second pass, as a rolling change would go.
    let mut order: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    order.push(leader);
    for (pass, text) in [(1, &pass1), (2, &pass2), (3, &pass3)] {
        for &id in &order {
            cluster.reload_acl(id, text);
            writes(3).await;
            // Replication to every node goes on with the mixed tokens.
            let leader_applied = cluster.applied(leader);
            for other in 1..=3 {
                cluster.wait_applied(other, leader_applied).await;
            }
            let now = cluster.node(leader).leadership.view();
            assert_eq!(
                (now.term, now.working_leader()),
                (term, true),
                "pass {pass}, node {id}: the leader lost its leadership"
            );
        }
    }
    // The old token is refused now.
    let mut raft = RaftClient::new(channel(&cluster.addr(1)));
    let refused = raft
        .vote(as_token(pb::RaftMessage::default(), PEER_TOKEN))
        .await
        .expect_err("old peer token");
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    cluster.shutdown().await;
}
