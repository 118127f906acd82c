//! Access control over the wire: who may open sessions, lock, read and
//! change membership; sessions bound to their identity; the Raft service
//! only for peers; identities from tokens and from client certificates.

use std::time::Duration;

use raftlock_client::{Client, ClientOptions, ClientTls, Error, Fence};
use raftlock_proto::v1 as pb;
use raftlock_proto::v1::raft_client::RaftClient;
use raftlock_testkit::{channel, cluster_at, locks_at, TestCluster};
use tonic::{Code, Request};

mod certificates;
mod reloads;

const PEER_TOKEN: &str = "test-peer-token-0123456789";

fn acl() -> String {
    format!(
        r#"
peer_token = "{PEER_TOKEN}"

[[token]]
identity = "billing"
token = "tok-billing"

[[token]]
identity = "intruder"
token = "tok-intruder"

[[token]]
identity = "auditor"
token = "tok-auditor"

[[token]]
identity = "ops"
token = "tok-ops"

[[token]]
identity = "nobody"
token = "tok-nobody"

[[rule]]
identity = "billing"
allow = "lock"
prefix = "billing/"

# Another identity that may lock the same names: it still cannot use
# billing's sessions.
[[rule]]
identity = "intruder"
allow = "lock"
prefix = "billing/"

[[rule]]
identity = "auditor"
allow = "read"
prefix = "billing/"

[[rule]]
identity = "ops"
allow = "admin"
"#
    )
}

fn client_with(cluster: &TestCluster, token: Option<&str>, tls: Option<ClientTls>) -> Client {
    Client::with_options(
        cluster.addrs(),
        ClientOptions {
            token: token.map(str::to_string),
            tls,
            retry_deadline: Duration::from_secs(10),
            ..ClientOptions::default()
        },
    )
    .expect("client")
}

fn client(cluster: &TestCluster, token: Option<&str>) -> Client {
    client_with(cluster, token, None)
}

/// `msg` with a bearer token attached.
fn as_token<T>(msg: T, token: &str) -> Request<T> {
    let mut req = Request::new(msg);
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ascii"),
    );
    req
}

fn denied<T>(r: Result<T, Error>) {
    match r {
        Err(Error::PermissionDenied(_)) => {}
        Err(e) => panic!("expected PermissionDenied, got {e:?}"),
        Ok(_) => panic!("expected PermissionDenied, got success"),
    }
}

fn unauthenticated<T>(r: Result<T, Error>) {
    match r {
        Err(Error::Unauthenticated(_)) => {}
        Err(e) => panic!("expected Unauthenticated, got {e:?}"),
        Ok(_) => panic!("expected Unauthenticated, got success"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_valid_credentials_nothing_is_allowed() {
    let cluster = TestCluster::start_acl(3, &acl(), None).await;
    // The nodes replicate (peer token) and elect a leader.
    let ops = client(&cluster, Some("tok-ops"));
    let owner = ops
        .session(Duration::from_secs(10))
        .await
        .expect("ops opens");
    let held = owner.lock("billing/x").await.expect("ops locks");
    let before = ops.status().await.expect("status");

    for c in [client(&cluster, None), client(&cluster, Some("tok-wrong"))] {
        unauthenticated(c.session(Duration::from_secs(10)).await);
        unauthenticated(c.describe("billing/x").await);
        unauthenticated(c.list("").await);
        unauthenticated(c.check_fence("billing/x", held.fence()).await);
        unauthenticated(c.status().await);
        unauthenticated(c.members().await);
        unauthenticated(c.backup().await);
        unauthenticated(c.add_node(9, "127.0.0.1:1", true).await);
        unauthenticated(c.remove_node(2).await);
        unauthenticated(c.transfer_leader(None).await);
    }
    // A malformed authorization header is refused the same way.
    let leader = cluster.leader_addr().await;
    let status = locks_at(&leader)
        .describe({
            let mut req = Request::new(pb::DescribeRequest {
                name: "billing/x".into(),
                stale: false,
            });
            req.metadata_mut().insert(
                "authorization",
                "Basic b3BzOm9wcw==".parse().expect("ascii"),
            );
            req
        })
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    // Releasing someone's grant needs credentials too.
    let status = locks_at(&leader)
        .release(pb::ReleaseRequest {
            session_id: owner.id().get(),
            seq: 1_000,
            name: "billing/x".into(),
            fence: held.fence().get(),
        })
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::Unauthenticated);

    // Nothing changed: same sessions and grants, the grant still held.
    let after = ops.status().await.expect("status");
    assert_eq!(
        (after.sessions, after.grants, after.last_fence),
        (before.sessions, before.grants, before.last_fence)
    );
    assert!(held.release().await.expect("release"));

    // Health checking needs no credentials (load balancers, kubelets).
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel(&leader));
    let serving = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health answers")
        .into_inner();
    assert_eq!(
        serving.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rules_bound_what_each_identity_may_do() {
    let cluster = TestCluster::start_acl(3, &acl(), None).await;

    // `lock` on billing/: sessions, locks and reads inside the prefix only.
    let billing = client(&cluster, Some("tok-billing"));
    let s = billing
        .session(Duration::from_secs(10))
        .await
        .expect("billing opens a session");
    let g = s
        .lock("billing/invoice-1")
        .await
        .expect("inside the prefix");
    assert!(g.fence().get() > 0);
    denied(s.lock("shipping/parcel").await);
    denied(s.try_lock("billing").await); // the prefix is "billing/"
    denied(s.semaphore("shipping/pool", 3).try_acquire(1).await);
    assert!(billing
        .describe("billing/invoice-1")
        .await
        .expect("reads inside")
        .is_some());
    denied(billing.describe("shipping/parcel").await);
    assert_eq!(
        billing.list("billing/").await.expect("list inside").len(),
        1
    );
    denied(billing.list("").await);
    denied(billing.list("bill").await);
    denied(billing.watch("", true).await);
    denied(billing.watch("shipping/parcel", false).await);
    assert!(billing.watch("billing/", true).await.is_ok());
    assert!(billing.status().await.is_ok(), "any rule allows status");
    // No admin: no membership changes, no backup or restore.
    denied(billing.add_node(9, "127.0.0.1:1", true).await);
    denied(billing.remove_node(2).await);
    denied(billing.transfer_leader(None).await);
    denied(billing.backup().await);
    denied(billing.restore(vec![1, 2, 3]).await);

    // `read` on billing/: reads inside, but no sessions at all.
    let auditor = client(&cluster, Some("tok-auditor"));
    denied(auditor.session(Duration::from_secs(10)).await);
    let info = auditor
        .describe("billing/invoice-1")
        .await
        .expect("reads")
        .expect("exists");
    assert_eq!(info.holders[0].fence, g.fence());
    assert!(auditor
        .check_fence("billing/invoice-1", g.fence())
        .await
        .expect("checks fences inside"));
    denied(auditor.check_fence("shipping/parcel", Fence::new(1)).await);
    denied(auditor.describe("shipping/parcel").await);

    // An identity with no rules is known but may do nothing.
    let nobody = client(&cluster, Some("tok-nobody"));
    denied(nobody.session(Duration::from_secs(10)).await);
    denied(nobody.describe("billing/invoice-1").await);
    denied(nobody.status().await);

    // `admin` on everything: locks anywhere, membership, backup.
    let ops = client(&cluster, Some("tok-ops"));
    let so = ops.session(Duration::from_secs(10)).await.expect("ops");
    let _held = so
        .lock("shipping/parcel")
        .await
        .expect("admin locks anywhere");
    assert_eq!(ops.list("").await.expect("lists everything").len(), 2);
    assert!(ops.backup().await.expect("backup").last_fence >= Some(Fence::new(2)));
    assert_eq!(ops.members().await.expect("members").len(), 3);
    // Past the permission check, the request itself is judged.
    assert!(matches!(
        ops.remove_node(42).await,
        Err(Error::SessionNotFound(_)) // NOT_FOUND: no such member
    ));

    assert!(g.release().await.expect("release"));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_is_usable_only_by_its_identity() {
    let cluster = TestCluster::start_acl(3, &acl(), None).await;
    let billing = client(&cluster, Some("tok-billing"));
    let s = billing
        .session(Duration::from_secs(10))
        .await
        .expect("open");
    let g = s.lock("billing/ledger").await.expect("lock");
    let leader = cluster.leader_addr().await;
    let mut locks = locks_at(&leader);

    // The intruder may lock billing/ names itself, but not through
    // billing's session: release, acquire, close and keep-alive are refused.
    let release = pb::ReleaseRequest {
        session_id: s.id().get(),
        seq: 10_000,
        name: "billing/ledger".into(),
        fence: g.fence().get(),
    };
    let status = locks
        .release(as_token(release.clone(), "tok-intruder"))
        .await
        .expect_err("not the owner");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    let status = locks
        .acquire(as_token(
            pb::AcquireRequest {
                session_id: s.id().get(),
                seq: 10_001,
                name: "billing/other".into(),
                ..Default::default()
            },
            "tok-intruder",
        ))
        .await
        .expect_err("not the owner");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    let status = locks
        .close_session(as_token(
            pb::CloseSessionRequest {
                session_id: s.id().get(),
                seq: 10_002,
            },
            "tok-intruder",
        ))
        .await
        .expect_err("not the owner");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(pb::KeepAliveRequest {
        session_id: s.id().get(),
        ask_id: 1,
    })
    .await
    .expect("queued");
    let mut replies = locks
        .keep_alive(as_token(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            "tok-intruder",
        ))
        .await
        .expect("stream opens")
        .into_inner();
    let status = replies.message().await.expect_err("not the owner");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");

    // The grant is untouched.
    let info = billing
        .describe("billing/ledger")
        .await
        .expect("describe")
        .expect("held");
    assert_eq!((info.holders.len(), info.holders[0].session), (1, s.id()));

    // Even the same identity cannot release another session's grant: the
    // release names a grant that session does not hold, and nothing ends.
    let other = billing
        .session(Duration::from_secs(10))
        .await
        .expect("open");
    let status = locks
        .release(as_token(
            pb::ReleaseRequest {
                session_id: other.id().get(),
                // Far from the seqs `other`'s own client uses: a close
                // under a seq a release used is refused as a reused seq.
                seq: 1_000,
                name: "billing/ledger".into(),
                fence: g.fence().get(),
            },
            "tok-billing",
        ))
        .await
        .expect("answered")
        .into_inner();
    assert!(!status.released);
    assert!(g.is_held());
    assert_eq!(
        billing
            .describe("billing/ledger")
            .await
            .expect("describe")
            .expect("held")
            .holders[0]
            .fence,
        g.fence()
    );

    // The owner still can.
    assert!(g.release().await.expect("owner releases"));
    s.close().await.expect("owner closes");
    other.close().await.expect("close");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_raft_service_is_only_for_peers() {
    let cluster = TestCluster::start_acl(3, &acl(), None).await;
    let leader = cluster.leader_addr().await;
    let garbage = pb::RaftMessage {
        data: vec![0xff; 16],
        error: Vec::new(),
        ..Default::default()
    };
    let mut raft = RaftClient::new(channel(&leader));
    for token in [None, Some("tok-ops"), Some("tok-wrong")] {
        let req = match token {
            None => Request::new(garbage.clone()),
            Some(t) => as_token(garbage.clone(), t),
        };
        let status = raft.vote(req).await.expect_err("refused");
        assert_eq!(
            status.code(),
            Code::Unauthenticated,
            "{token:?}: {status:?}"
        );
        let req = match token {
            None => Request::new(garbage.clone()),
            Some(t) => as_token(garbage.clone(), t),
        };
        let status = raft.append_entries(req).await.expect_err("refused");
        assert_eq!(
            status.code(),
            Code::Unauthenticated,
            "{token:?}: {status:?}"
        );
    }
    // With the peer token the request gets past the gate (and is then
    // judged on its bytes).
    let status = raft
        .vote(as_token(garbage.clone(), PEER_TOKEN))
        .await
        .expect_err("garbage");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    // The membership and AddNode of a node joining by itself are there
    // for peers only too, and answered with the peer token.
    let status = raft
        .members(as_token(pb::MembersRequest {}, "tok-ops"))
        .await
        .expect_err("not a peer");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let status = raft
        .add_node(as_token(pb::AddNodeRequest::default(), "tok-ops"))
        .await
        .expect_err("not a peer");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let members = raft
        .members(as_token(pb::MembersRequest {}, PEER_TOKEN))
        .await
        .expect("a peer reads the membership")
        .into_inner();
    assert_eq!(members.members.len(), 3, "{members:?}");
    assert_ne!(members.leader_id, 0, "{members:?}");
    let status = raft
        .add_node(as_token(pb::AddNodeRequest::default(), PEER_TOKEN))
        .await
        .expect_err("node id 0");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    // And the peer token is not a client identity: not for the status,
    // nor for the membership or AddNode on the client port (which the
    // clients' network reaches).
    let mut client_port = cluster_at(&leader);
    let status = client_port
        .status(as_token(pb::StatusRequest {}, PEER_TOKEN))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::Unauthenticated);
    let status = client_port
        .members(as_token(pb::MembersRequest {}, PEER_TOKEN))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::Unauthenticated);
    let status = client_port
        .add_node(as_token(pb::AddNodeRequest::default(), PEER_TOKEN))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::Unauthenticated);
    cluster.shutdown().await;
}

/// `POST /debug/stages/reset` empties what the node measured: with access
/// control on, only an admin may, and everyone else is refused (`401`
/// without valid credentials, `403` without `admin`) and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_an_admin_resets_the_stage_breakdown() {
    let cluster = TestCluster::start_acl(1, &acl(), None).await;
    let ops = client(&cluster, Some("tok-ops"));
    let session = ops
        .session(Duration::from_secs(10))
        .await
        .expect("ops opens");
    let held = session.lock("billing/stages").await.expect("ops locks");
    held.release().await.expect("release");
    let metrics = cluster.metrics_addr(1);
    let recorded = || async {
        let (code, body) = raftlock_testkit::http(&metrics, "GET", "/debug/stages", &[])
            .await
            .expect("stages answer");
        assert_eq!(code, 200, "{body}");
        let json: serde_json::Value = serde_json::from_str(&body).expect("json");
        json.as_array()
            .expect("a list of stages")
            .iter()
            .find(|s| s["stage"] == "server_total")
            .and_then(|s| s["count"].as_u64())
            .expect("server_total count")
    };
    let before = recorded().await;
    assert!(before >= 2, "the writes were timed: {before}");
    let reset = |authorization: Option<&'static str>| {
        let metrics = metrics.clone();
        async move {
            let headers: Vec<(&str, &str)> = authorization
                .map(|a| vec![("Authorization", a)])
                .unwrap_or_default();
            raftlock_testkit::http(&metrics, "POST", "/debug/stages/reset", &headers)
                .await
                .expect("reset answers")
        }
    };
    for (authorization, code) in [
        (None, 401),
        (Some("Bearer tok-wrong"), 401),
        (Some("Basic b3BzOnRvay1vcHM="), 401),
        (Some("Bearer tok-auditor"), 403),
        (Some("Bearer tok-billing"), 403),
    ] {
        let (got, body) = reset(authorization).await;
        assert_eq!(got, code, "{authorization:?}: {body}");
        assert!(!body.trim().is_empty(), "{authorization:?}: says why");
        assert_eq!(recorded().await, before, "{authorization:?} reset it");
    }
    let (got, body) = reset(Some("Bearer tok-ops")).await;
    assert_eq!(got, 200, "{body}");
    assert_eq!(recorded().await, 0, "an admin's reset empties it");
    session.close().await.expect("close");
}
