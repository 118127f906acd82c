//! Identities from client certificates: the CN names the identity, a
//! token overrides it, and a forwarded request is identified by its
//! token only, never by the certificate on its connection.

use std::time::Duration;

use raftlock_client::ClientTls;
use raftlock_node::tls::TlsOptions;
use raftlock_testkit::certs::Ca;
use raftlock_testkit::TestCluster;
use tonic::{Code, Request};

use super::{acl, as_token, client_with, denied};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_certificate_names_its_identity() {
    let ca = Ca::new("raftlock test CA");
    let node = ca.issue("raftlock node", &["127.0.0.1", "localhost"]);
    let tls = TlsOptions {
        cert_pem: node.cert_pem,
        key_pem: node.key_pem,
        ca_pem: ca.pem(),
        client_auth: true,
    };
    let cluster = TestCluster::start_acl(3, &acl(), Some(tls)).await;
    let with_cert = |cn: &str, token: Option<&str>| {
        let leaf = ca.issue(cn, &[cn]);
        client_with(
            &cluster,
            token,
            Some(ClientTls {
                ca_pem: ca.pem(),
                identity: Some((leaf.cert_pem, leaf.key_pem)),
            }),
        )
    };

    // CN=billing is the identity "billing".
    let billing = with_cert("billing", None);
    let s = billing
        .session(Duration::from_secs(10))
        .await
        .expect("open");
    let g = s.lock("billing/a").await.expect("inside its prefix");
    denied(s.lock("shipping/a").await);
    // A certificate whose CN no rule names gets nothing.
    let stranger = with_cert("stranger", None);
    denied(stranger.session(Duration::from_secs(10)).await);
    denied(stranger.describe("billing/a").await);
    // A token overrides the certificate's CN.
    let as_ops = with_cert("stranger", Some("tok-ops"));
    assert_eq!(as_ops.list("").await.expect("ops lists").len(), 1);
    // The identity is bound to the session: CN=intruder cannot release
    // billing's grant even with the right session id and fence.
    let intruder = with_cert("intruder", None);
    let si = intruder
        .session(Duration::from_secs(10))
        .await
        .expect("intruder has its own sessions");
    assert_ne!(si.id(), s.id());
    assert!(g.release().await.expect("owner releases"));

    // Forwarding (issue 44, item 4): a request another node forwarded is
    // identified by its bearer token only, never by the certificate on its
    // connection (the forwarding node's), so a request that claims to be
    // forwarded gets nothing from a certificate...
    let raw = |addr: String, cn: &str| {
        let leaf = ca.issue(cn, &[cn]);
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(ca.pem()))
            .identity(tonic::transport::Identity::from_pem(
                leaf.cert_pem,
                leaf.key_pem,
            ))
            .domain_name("localhost");
        let channel = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
            .expect("endpoint")
            .tls_config(tls)
            .expect("tls")
            .connect_lazy();
        raftlock_proto::v1::locks_client::LocksClient::new(channel)
    };
    let open = || raftlock_proto::v1::OpenSessionRequest {
        ttl_ms: 10_000,
        ..Default::default()
    };
    let mut claimed = Request::new(open());
    claimed.metadata_mut().insert(
        raftlock_proto::FORWARDED_KEY,
        tonic::metadata::MetadataValue::from_static("2"),
    );
    let leader = cluster.leader().await;
    let refused = raw(cluster.addr(leader), "billing")
        .open_session(claimed)
        .await
        .expect_err("a certificate does not identify a forwarded request");
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    // ... and a follower forwards what carries a token (the leader
    // identifies it by the token), but answers a certificate-identified
    // request itself, naming the leader.
    let follower = cluster
        .running()
        .into_iter()
        .find(|id| *id != leader)
        .expect("a follower");
    let by_token = raw(cluster.addr(follower), "stranger")
        .open_session(as_token(open(), "tok-billing"))
        .await
        .expect("a token is forwarded");
    assert_eq!(
        by_token
            .metadata()
            .get(raftlock_proto::LEADER_ADDR_KEY)
            .and_then(|v| v.to_str().ok()),
        Some(cluster.addr(leader).as_str())
    );
    let by_cert = raw(cluster.addr(follower), "billing")
        .open_session(open())
        .await
        .expect_err("a certificate identity is not forwarded");
    assert_eq!(by_cert.code(), Code::Unavailable, "{by_cert:?}");
    assert_eq!(
        by_cert
            .metadata()
            .get(raftlock_proto::NOT_LEADER_KEY)
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    cluster.shutdown().await;
}
