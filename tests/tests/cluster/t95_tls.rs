//! TLS for clients and peers; mTLS rejects clients without a certificate
//! from the cluster's CA.

use std::time::Duration;

use raftlock_client::{Client, ClientOptions, ClientTls, Error};
use raftlock_node::tls::TlsOptions;
use raftlock_testkit::certs::Ca;
use raftlock_testkit::TestCluster;

fn node_tls(ca: &Ca, client_auth: bool) -> TlsOptions {
    let node = ca.issue("raftlock node", &["127.0.0.1", "localhost"]);
    TlsOptions {
        cert_pem: node.cert_pem,
        key_pem: node.key_pem,
        ca_pem: ca.pem(),
        client_auth,
    }
}

fn client(cluster: &TestCluster, tls: Option<ClientTls>) -> Client {
    Client::with_options(
        cluster.addrs(),
        ClientOptions {
            tls,
            retry_deadline: Duration::from_secs(3),
            request_timeout: Duration::from_secs(2),
            ..ClientOptions::default()
        },
    )
    .expect("client")
}

async fn works(c: &Client) -> Result<u64, Error> {
    let s = c.session(Duration::from_secs(5)).await?;
    let g = s.lock("tls").await?;
    let fence = g.fence();
    g.release().await?;
    s.close().await?;
    Ok(fence.get())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_cluster_serves_tls_clients_and_refuses_plaintext() {
    let ca = Ca::new("raftlock test CA");
    // Peers replicate over TLS too: the cluster only elects a leader and
    // commits if node-to-node TLS works.
    let cluster = TestCluster::start_tls(3, node_tls(&ca, false)).await;
    let tls = client(
        &cluster,
        Some(ClientTls {
            ca_pem: ca.pem(),
            identity: None,
        }),
    );
    assert!(works(&tls).await.expect("TLS client works") > 0);

    let plain = client(&cluster, None);
    assert!(
        works(&plain).await.is_err(),
        "a plaintext client must not get in"
    );

    let rogue = Ca::new("someone else's CA");
    let wrong_ca = client(
        &cluster,
        Some(ClientTls {
            ca_pem: rogue.pem(),
            identity: None,
        }),
    );
    assert!(
        works(&wrong_ca).await.is_err(),
        "the client must not trust an unknown server cert"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mtls_rejects_clients_without_a_certificate_from_the_ca() {
    let ca = Ca::new("raftlock test CA");
    let cluster = TestCluster::start_tls(3, node_tls(&ca, true)).await;

    let good = ca.issue("svc-a", &["svc-a"]);
    let with_cert = client(
        &cluster,
        Some(ClientTls {
            ca_pem: ca.pem(),
            identity: Some((good.cert_pem, good.key_pem)),
        }),
    );
    assert!(
        works(&with_cert)
            .await
            .expect("client with a CA-signed certificate works")
            > 0
    );

    let no_cert = client(
        &cluster,
        Some(ClientTls {
            ca_pem: ca.pem(),
            identity: None,
        }),
    );
    let refused = works(&no_cert)
        .await
        .expect_err("a client without a certificate must be refused");
    // Issue 31, item 5: and told why.
    assert!(
        refused.to_string().contains("needs a client certificate"),
        "{refused}"
    );

    let rogue = Ca::new("someone else's CA");
    let bad = rogue.issue("mallory", &["mallory"]);
    let unknown = client(
        &cluster,
        Some(ClientTls {
            ca_pem: ca.pem(),
            identity: Some((bad.cert_pem, bad.key_pem)),
        }),
    );
    assert!(
        works(&unknown).await.is_err(),
        "a certificate from an unknown CA must be refused"
    );
    cluster.shutdown().await;
}

/// A client with the library's defaults (a 15 s retry deadline), and TLS
/// settings `tls`.
/// The retry deadline of the clients that must give up at once: so long
/// that a client waiting it out is told apart from one that gives up at
/// once by a bound ([`AT_ONCE`]) no loaded machine reaches.
const RETRY_DEADLINE: Duration = Duration::from_secs(600);

/// "At once": far under [`RETRY_DEADLINE`]; the client gives up in
/// milliseconds on an idle machine (the time is printed).
const AT_ONCE: Duration = Duration::from_secs(60);

fn default_client(cluster: &TestCluster, tls: Option<ClientTls>) -> Client {
    Client::with_options(
        cluster.addrs(),
        ClientOptions {
            tls,
            retry_deadline: RETRY_DEADLINE,
            ..ClientOptions::default()
        },
    )
    .expect("client")
}

/// Checks that a failing call gave up at once rather than waiting out
/// its retry deadline, printing how long it took.
fn gave_up_at_once(what: &str, took: Duration, msg: &str) {
    eprintln!("t95: {what}: gave up after {took:?}");
    assert!(
        took < AT_ONCE,
        "{what}: took {took:?} of its {RETRY_DEADLINE:?} retry deadline: {msg}"
    );
}

/// Issue 31, item 5: a client without TLS settings against a TLS node is
/// told, within a few seconds, that the node speaks TLS, with the
/// endpoint; on 108a1e9 it retried until its 15 s deadline and reported an
/// HTTP/2 error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plaintext_client_is_told_at_once_that_the_node_speaks_tls() {
    let ca = Ca::new("raftlock test CA");
    let cluster = TestCluster::start_tls(1, node_tls(&ca, false)).await;
    let plain = default_client(&cluster, None);
    let started = std::time::Instant::now();
    let err = plain.status().await.expect_err("plaintext");
    let took = started.elapsed();
    let msg = err.to_string();
    gave_up_at_once("a plaintext client", took, &msg);
    assert!(msg.contains(&cluster.addr(1)), "names the endpoint: {msg}");
    assert!(msg.contains("speaks TLS"), "says why: {msg}");
    cluster.shutdown().await;
}

/// Issue 31, item 5: a client that does not trust the node's certificate
/// (another CA), or dials a name the certificate does not carry, gets the
/// handshake error and the endpoint within a few seconds, in words that
/// say what to fix; on 108a1e9 it waited out its 15 s retry deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handshake_failure_is_reported_at_once_in_words_that_say_what_to_fix() {
    let ca = Ca::new("raftlock test CA");
    let rogue = Ca::new("someone else's CA");
    let cluster = TestCluster::start_tls(1, node_tls(&ca, false)).await;
    let wrong_ca = default_client(
        &cluster,
        Some(ClientTls {
            ca_pem: rogue.pem(),
            identity: None,
        }),
    );
    let started = std::time::Instant::now();
    let err = wrong_ca.status().await.expect_err("unknown CA");
    let took = started.elapsed();
    let msg = err.to_string();
    gave_up_at_once("a client of another CA", took, &msg);
    assert!(msg.contains(&cluster.addr(1)), "names the endpoint: {msg}");
    assert!(msg.contains("TLS handshake"), "{msg}");
    assert!(
        msg.contains("not signed by the CA"),
        "says what is wrong: {msg}"
    );
    cluster.shutdown().await;

    // A node whose certificate lacks the name clients dial: started with
    // a certificate for 127.0.0.1 only, dialled as "localhost".
    let cluster = TestCluster::start_tls(1, ca.node_tls(&["127.0.0.1"], false)).await;
    let port = cluster
        .addr(1)
        .rsplit_once(':')
        .expect("port")
        .1
        .to_string();
    let by_name = Client::with_options(
        [format!("localhost:{port}")],
        ClientOptions {
            tls: Some(ClientTls {
                ca_pem: ca.pem(),
                identity: None,
            }),
            retry_deadline: RETRY_DEADLINE,
            ..ClientOptions::default()
        },
    )
    .expect("client");
    let started = std::time::Instant::now();
    let err = by_name
        .status()
        .await
        .expect_err("name not in the certificate");
    let took = started.elapsed();
    let msg = err.to_string();
    gave_up_at_once("a client dialling a name the certificate lacks", took, &msg);
    assert!(msg.contains("not valid for the name"), "{msg}");
    cluster.shutdown().await;
}

/// Issue 31, item 5: a node refuses at start, before it touches its data
/// directory, a certificate that its peers or clients would refuse at the
/// handshake, naming the problem: no SAN for its advertised address, not
/// v3, expired, a key that does not match, signed by another CA, and (with
/// mTLS, where it is also a client of its peers) no clientAuth usage. On
/// 108a1e9 all of these started; the key mismatch only after bootstrapping.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_refuses_at_start_a_certificate_its_peers_would_refuse() {
    use raftlock_testkit::certs::Flaw;
    let ca = Ca::new("raftlock test CA");
    let rogue = Ca::new("someone else's CA");
    let names = ["127.0.0.1", "localhost"];
    let good = ca.issue("node", &names);
    let other = ca.issue("node", &names);
    let cases = vec![
        (
            "no SAN for the advertised address",
            ca.node_tls_with(ca.issue("node", &["elsewhere.example"]), false),
            "not valid for 127.0.0.1",
        ),
        (
            "a CN and no SAN",
            ca.node_tls_with(ca.issue("127.0.0.1", &[]), false),
            "not valid for 127.0.0.1",
        ),
        (
            "X.509 v1",
            ca.node_tls_with(ca.issue_flawed("node", &names, Flaw::V1), false),
            "not an X.509 v3 certificate",
        ),
        (
            "expired",
            ca.node_tls_with(ca.issue_flawed("node", &names, Flaw::Expired), false),
            "expired",
        ),
        (
            "a key that does not match",
            ca.node_tls_with(
                raftlock_testkit::certs::Leaf {
                    cert_pem: good.cert_pem.clone(),
                    key_pem: other.key_pem.clone(),
                },
                false,
            ),
            "does not match",
        ),
        (
            "another CA",
            ca.node_tls_with(rogue.issue("node", &names), false),
            "not signed by the CA",
        ),
        (
            "mTLS without clientAuth",
            ca.node_tls_with(ca.issue_flawed("node", &names, Flaw::ServerAuthOnly), true),
            "clientAuth",
        ),
    ];
    let dir = tempfile::tempdir().expect("dir");
    for (what, tls, says) in cases {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let data_dir = dir.path().join(what.replace(' ', "-"));
        let opts = raftlock_node::node::NodeOptions {
            id: 1,
            advertise: addr.clone(),
            peer_advertise: None,
            data_dir: data_dir.clone(),
            peers: [(1, raftlock_node::raft::NodeAddrs::shared(addr))].into(),
            init: true,
            timing: raftlock_testkit::test_timing(),
            dial: Default::default(),
            tls: Some(tls),
            auth: Default::default(),
            storage_faults: Default::default(),
            prefix_labels: Default::default(),
            connector: None,
            storage: Default::default(),
            join: Vec::new(),
        };
        let err = match raftlock_node::node::Node::start(opts, listener).await {
            Ok(node) => {
                node.shutdown().await;
                panic!("{what}: the node started");
            }
            Err(e) => format!("{e:#}"),
        };
        assert!(err.contains(says), "{what}: {err}");
        assert!(!data_dir.exists(), "{what}: the data directory was touched");
    }
    // The good certificate starts.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let opts = raftlock_node::node::NodeOptions {
        id: 1,
        advertise: addr.clone(),
        peer_advertise: None,
        data_dir: dir.path().join("good"),
        peers: [(1, raftlock_node::raft::NodeAddrs::shared(addr))].into(),
        init: true,
        timing: raftlock_testkit::test_timing(),
        dial: Default::default(),
        tls: Some(ca.node_tls_with(good, true)),
        auth: Default::default(),
        storage_faults: Default::default(),
        prefix_labels: Default::default(),
        connector: None,
        storage: Default::default(),
        join: Vec::new(),
    };
    raftlock_node::node::Node::start(opts, listener)
        .await
        .expect("a good certificate starts")
        .shutdown()
        .await;
}

/// Issue 31, item 5: the openssl recipe in docs/operations/tls-and-acl.md ("TLS"), run
/// as it is written there (only the SANs changed to loopback), makes a CA,
/// a node certificate the node accepts at start for an mTLS cluster of
/// three, and a client certificate that cluster lets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_guides_openssl_recipe_makes_certificates_an_mtls_cluster_accepts() {
    use raftlock_testkit::servers::{debian_tool, require};
    let Some(_) = require("openssl", debian_tool("openssl", "openssl")) else {
        return;
    };
    let block = raftlock_testkit::guide::block("tls-recipe");
    let guide_sans = r#"sans="DNS:raftlock-1.example.internal,IP:10.0.0.1""#;
    assert!(block.contains(guide_sans), "the recipe sets {guide_sans}");
    let script = block.replace(guide_sans, r#"sans="IP:127.0.0.1,DNS:localhost""#);
    let dir = tempfile::tempdir().expect("dir");
    let out = std::process::Command::new("sh")
        .args(["-eu", "-c", &script])
        .current_dir(dir.path())
        .output()
        .expect("sh runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the recipe failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.matches("node1.pem: OK").count(), 2, "{stdout}");
    let read = |name: &str| std::fs::read(dir.path().join(name)).expect(name);
    let tls = TlsOptions {
        cert_pem: read("node1.pem"),
        key_pem: read("node1-key.pem"),
        ca_pem: read("ca.pem"),
        client_auth: true,
    };
    let cluster = TestCluster::start_tls(3, tls).await;
    let billing = client(
        &cluster,
        Some(ClientTls {
            ca_pem: read("ca.pem"),
            identity: Some((read("billing.pem"), read("billing-key.pem"))),
        }),
    );
    assert!(works(&billing).await.expect("the recipe's client gets in") > 0);
    cluster.shutdown().await;
}

/// Issue 31, item 6: the CA rotates in three reloads, no restart, with
/// mTLS between the nodes, as the guide's runbook says: every node trusts
/// both CAs; then each node gets a certificate from the new CA; then every
/// node trusts the new CA only. Writes keep replicating to every node
/// through each step (peer connections made after a reload use the new
/// material both ways), and at the end a client that trusts only the old
/// CA is refused while one that trusts the new CA gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_ca_rotates_in_three_reloads_without_a_restart() {
    let old_ca = Ca::new("old CA");
    let new_ca = Ca::new("new CA");
    let names = ["127.0.0.1", "localhost"];
    let old_leaf = old_ca.issue("raftlock-node", &names);
    let new_leaf = new_ca.issue("raftlock-node", &names);
    let bundle = [old_ca.pem(), new_ca.pem()].concat();
    let tls = |leaf: &raftlock_testkit::certs::Leaf, ca_pem: &[u8]| TlsOptions {
        cert_pem: leaf.cert_pem.clone(),
        key_pem: leaf.key_pem.clone(),
        ca_pem: ca_pem.to_vec(),
        client_auth: true,
    };
    let cluster = TestCluster::start_tls(3, tls(&old_leaf, &old_ca.pem())).await;
    let client_for = |ca: &Ca, ca_pem: Vec<u8>| {
        let me = ca.issue("svc", &["svc"]);
        client(
            &cluster,
            Some(ClientTls {
                ca_pem,
                identity: Some((me.cert_pem, me.key_pem)),
            }),
        )
    };
    let replicated = async |cluster: &TestCluster, c: &Client| {
        works(c).await.expect("writes go on");
        let leader = cluster.leader().await;
        let index = cluster.applied(leader);
        for id in 1..=3 {
            cluster.wait_applied(id, index).await;
        }
    };
    // 1. Every node trusts both CAs.
    for id in 1..=3 {
        cluster
            .node(id)
            .reload_tls(tls(&old_leaf, &bundle))
            .expect("pass 1");
    }
    let during = client_for(&old_ca, bundle.clone());
    replicated(&cluster, &during).await;
    // 2. Each node gets its certificate from the new CA.
    for id in 1..=3 {
        cluster
            .node(id)
            .reload_tls(tls(&new_leaf, &bundle))
            .expect("pass 2");
        replicated(&cluster, &during).await;
    }
    // 3. The old CA goes.
    for id in 1..=3 {
        cluster
            .node(id)
            .reload_tls(tls(&new_leaf, &new_ca.pem()))
            .expect("pass 3");
    }
    let after = client_for(&new_ca, new_ca.pem());
    replicated(&cluster, &after).await;
    let stale = client_for(&old_ca, old_ca.pem());
    assert!(works(&stale).await.is_err(), "the old CA is no longer used");
    // A reload the node would refuse at start changes nothing.
    let wrong = new_ca.issue("raftlock-node", &["elsewhere.example"]);
    let refused = cluster
        .node(1)
        .reload_tls(tls(&wrong, &new_ca.pem()))
        .expect_err("no SAN for the node's address");
    assert!(refused.contains("not valid for 127.0.0.1"), "{refused}");
    replicated(&cluster, &after).await;
    cluster.shutdown().await;
}
