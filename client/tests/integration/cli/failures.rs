//! Failing fast and saying why: unreachable or unresolvable endpoints, TLS
//! mistakes.

use std::process::Stdio;
use std::time::Duration;

use raftlock_testkit::TestCluster;

use super::raftlock;

/// Review (safety, 2026-11-25, item 5): against nodes that refuse the
/// connection, the CLI waited out the whole retry deadline (15 s) and
/// printed only "unavailable: retry deadline reached". It names every
/// endpoint it tried with its last error, and gives up on refused
/// connections everywhere much sooner.
/// "At once", for a `raftlock` that must give up rather than wait out
/// its client's 15 s retry deadline: far above the tenth of a second it
/// takes on an idle machine, under that deadline.
const AT_ONCE: Duration = Duration::from_secs(12);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_everywhere_fail_fast_naming_each_endpoint() {
    // Held refusing for the whole test: a port merely closed again could
    // be given to a node another test starts meanwhile.
    let closed = || raftlock_testkit::RefusingAddr::new().expect("hold a port");
    let (held_a, held_b) = (closed(), closed());
    let (a, b) = (held_a.addr(), held_b.addr());
    let endpoints = format!("{a},{b}");
    for args in [&["status"][..], &["lock", "x", "--", "true"][..]] {
        let started = std::time::Instant::now();
        let out = raftlock(&endpoints)
            .args(args)
            .output()
            .await
            .expect("runs");
        let took = started.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        for addr in [&a, &b] {
            assert!(
                stderr.contains(&format!("{addr}: connection refused")),
                "{args:?}: the error names {addr} and why: {stderr}"
            );
        }
        eprintln!("cli: {args:?} gave up after {took:?}");
        assert!(
            took < AT_ONCE,
            "{args:?}: gave up after {took:?} on nodes that refuse connections: {stderr}"
        );
    }
}

/// Seed-user walk, 2026-11-29: an endpoint whose name does not resolve
/// was retried for the whole deadline and, for a write, reported as an
/// unknown outcome, although nothing can have been sent. Like a refused
/// connection, it gives up at once with UNAVAILABLE, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_does_not_resolve_fails_fast_and_says_so() {
    let endpoints = "no-such-host.invalid:7101";
    for args in [&["status"][..], &["lock", "x", "--", "true"][..]] {
        let started = std::time::Instant::now();
        let out = raftlock(endpoints).args(args).output().await.expect("runs");
        let took = started.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("no-such-host.invalid:7101: the name does not resolve"),
            "{args:?}: the error names the endpoint and why: {stderr}"
        );
        assert!(
            !stderr.contains("outcome unknown"),
            "{args:?}: nothing was sent: {stderr}"
        );
        eprintln!("cli: {args:?} gave up after {took:?}");
        assert!(
            took < AT_ONCE,
            "{args:?}: gave up after {took:?} on a name that does not resolve: {stderr}"
        );
    }
}

/// Issue 31, item 5: the CLI never dies silently. Without `--ca` against a
/// TLS node it exits 1 within a few seconds saying the node speaks TLS and
/// naming it (on 108a1e9 it died of SIGPIPE, exit 141, with no output); with
/// another CA it names the handshake problem within a few seconds (on
/// 108a1e9: 15 s, then `unavailable: retry deadline reached`-style text).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cli_explains_tls_failures_quickly_and_never_dies_silently() {
    use raftlock_testkit::certs::Ca;
    let ca = Ca::new("cli test CA");
    let cluster = TestCluster::start_tls(1, ca.node_tls(&["127.0.0.1"], false)).await;
    let endpoints = cluster.addrs().join(",");
    let dir = tempfile::tempdir().expect("dir");

    let started = std::time::Instant::now();
    let out = raftlock(&endpoints)
        .arg("status")
        .env_remove("RAFTLOCK_CA")
        .output()
        .await
        .expect("runs");
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "status {:?}: {stderr}",
        out.status
    );
    eprintln!("cli: status gave up after {took:?}");
    assert!(took < AT_ONCE, "took {took:?}: {stderr}");
    assert!(stderr.contains("speaks TLS"), "{stderr}");
    assert!(stderr.contains(&cluster.addr(1)), "{stderr}");

    let rogue = dir.path().join("rogue.pem");
    std::fs::write(&rogue, Ca::new("someone else's CA").pem()).expect("write");
    let started = std::time::Instant::now();
    let out = raftlock(&endpoints)
        .arg("status")
        .arg("--ca")
        .arg(&rogue)
        .output()
        .await
        .expect("runs");
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "status {:?}: {stderr}",
        out.status
    );
    eprintln!("cli: status gave up after {took:?}");
    assert!(took < AT_ONCE, "took {took:?}: {stderr}");
    assert!(stderr.contains("TLS handshake"), "{stderr}");
    assert!(stderr.contains("not signed by the CA"), "{stderr}");
    assert!(stderr.contains(&cluster.addr(1)), "{stderr}");

    // stdout closed early (`| head`) still ends quietly, as other tools do.
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).expect("write");
    let mut child = raftlock(&endpoints)
        .args(["list"])
        .arg("--ca")
        .arg(&ca_file)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    drop(child.stdout.take());
    let status = child.wait().await.expect("waits");
    assert!(
        status.success() || status.code().is_none(),
        "a closed stdout: {status:?}"
    );
    cluster.shutdown().await;
}
