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
    assert!(
        works(&no_cert).await.is_err(),
        "a client without a certificate must be refused"
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
