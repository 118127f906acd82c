//! The Rust client against a real 3-node cluster: guards, lease loss,
//! failover while holding, functional and all-or-nothing forms, elections.

use std::time::Duration;

use futures::StreamExt;
use raftlock_client::{Election, Error, LeaseState};
use raftlock_testkit::{eventually, TestCluster};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropped_guards_release_and_release_is_idempotent() {
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let a = client.session(Duration::from_secs(10)).await.expect("a");
    let g = a.lock("drop-me").await.expect("lock");
    let fence = g.fence();
    let g2 = g.clone();
    drop(g);
    assert!(
        client.check_fence("drop-me", fence).await.expect("check"),
        "a clone still holds it"
    );
    drop(g2);
    eventually(
        "the dropped guard to be released",
        Duration::from_secs(10),
        || {
            let client = client.clone();
            async move {
                client
                    .describe("drop-me")
                    .await
                    .ok()
                    .filter(Option::is_none)
            }
        },
    )
    .await;

    let g = a.lock("twice").await.expect("lock");
    assert!(g.release().await.expect("first release"));
    assert!(!g.release().await.expect("second release"));
    assert!(!g.release().await.expect("third release"));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn holder_keeps_its_lock_across_a_leader_failover() {
    let mut cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    // A ttl of three election timeouts (the recommended minimum) rides out
    // the election, for a session only its ttl ends (with the default
    // end-on-disconnect grace the count is 0.75 s, and a failover is
    // jeopardy, never loss: t82_keepalive).
    let session = client
        .session_with(raftlock_client::SessionOptions {
            ttl: Duration::from_secs(3),
            end_on_disconnect: None,
            ..Default::default()
        })
        .await
        .expect("session");
    let g = session.lock("keep").await.expect("lock");
    let leader = cluster.leader().await;
    cluster.kill(leader).await;
    let new_leader = cluster.wait_for_leader().await;
    assert_ne!(leader, new_leader);
    // Well past two ttls of keep-alives through the new leader.
    let until = Instant::now() + Duration::from_secs(5);
    eventually(
        "5 s to pass with the lock held",
        Duration::from_secs(15),
        || async {
            assert!(
                session.is_valid(),
                "the client's lease view lapsed during failover"
            );
            (Instant::now() >= until).then_some(())
        },
    )
    .await;
    assert!(
        client.check_fence("keep", g.fence()).await.expect("check"),
        "lock lost in failover"
    );
    let b = client.session(Duration::from_secs(2)).await.expect("b");
    assert!(b.try_lock("keep").await.expect("try").is_none());
    g.release().await.expect("release");
    let g2 = b.lock("keep").await.expect("b gets it");
    assert!(g2.fence() > g.fence());
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_fires_when_the_cluster_is_unreachable_past_the_ttl() {
    let mut cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let session = client
        .session(Duration::from_secs(2))
        .await
        .expect("session");
    let _g = session.lock("gone").await.expect("lock");
    let mut lease = session.lease();
    let work = tokio::spawn(async { 41 + 1 });
    let cut = Instant::now();
    for id in cluster.running() {
        cluster.kill(id).await;
    }
    let killed = Instant::now();
    // No answer can come after the kills, and every answer that came was
    // to a keep-alive sent before them: the view never runs past a ttl
    // after the last kill. That is what the client promises; when `lost()`
    // wakes its holder is a timer, which a loaded machine runs late (it
    // was bounded at the ttl, 2 s, before; at about the ttl less the
    // margin on an idle machine), so it is printed.
    let mut latest = None;
    let follow = async {
        loop {
            match *lease.borrow_and_update() {
                LeaseState::Valid(until) => latest = Some(until),
                _ => break,
            }
            if lease.changed().await.is_err() {
                break;
            }
        }
    };
    tokio::time::timeout(
        Duration::from_secs(30),
        futures::future::join(session.lost(), follow),
    )
    .await
    .expect("lost() fires");
    let after = cut.elapsed();
    let latest = latest.expect("the lease was valid before the cut");
    eprintln!(
        "t80: lost() fired {after:?} after the cluster was killed; the view ran until {:?} \
         after it (ttl 2 s)",
        latest - cut
    );
    assert!(
        latest <= killed + Duration::from_secs(2),
        "the lease view ran until {:?} after the cut, past the ttl",
        latest - cut
    );
    assert!(!session.is_valid());
    assert_eq!(*lease.borrow(), LeaseState::Lost);
    // The holder's own work was not cancelled.
    assert_eq!(work.await.expect("work ran"), 42);
    // And nothing new is granted on a lapsed lease.
    assert!(matches!(
        session.try_lock("other").await,
        Err(Error::LeaseLost)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_lock_acquire_all_and_deadlock_refusal() {
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let a = client.session(Duration::from_secs(10)).await.expect("a");
    let b = client.session(Duration::from_secs(10)).await.expect("b");
    let out = a
        .with_lock("fn", |fence| async move { fence.get() * 2 })
        .await
        .expect("with_lock");
    assert!(out > 0);
    assert!(
        client.describe("fn").await.expect("describe").is_none(),
        "released after the closure"
    );

    let all = a
        .acquire_all(&["z", "x", "y"], Duration::from_secs(5))
        .await
        .expect("all");
    let names: Vec<&str> = all.iter().map(|g| g.name()).collect();
    assert_eq!(names, ["x", "y", "z"], "taken in sorted order");
    // b cannot get them all: it gets none (all or nothing).
    let err = b
        .acquire_all(&["w", "x"], Duration::from_millis(300))
        .await
        .expect_err("busy");
    assert!(matches!(err, Error::NotAcquired(_)), "{err:?}");
    assert!(
        client.describe("w").await.expect("describe").is_none(),
        "w was given back"
    );
    for g in all {
        g.release().await.expect("release");
    }

    // A real cycle: a holds p, b holds q, b waits for p, a asks for q.
    let p = a.lock("p").await.expect("p");
    let q = b.lock("q").await.expect("q");
    let b_wait = tokio::spawn({
        let b = b.clone();
        async move { b.lock_timeout("p", Duration::from_secs(10)).await }
    });
    eventually("b to queue on p", Duration::from_secs(10), || {
        let client = client.clone();
        async move {
            client
                .describe("p")
                .await
                .ok()
                .flatten()
                .filter(|i| !i.waiters.is_empty())
        }
    })
    .await;
    let err = a.lock("q").await.expect_err("deadlock refused");
    match &err {
        Error::Deadlock(msg) => {
            assert!(msg.contains(&format!("session {}", a.id())), "{msg}");
            assert!(msg.contains(&format!("session {}", b.id())), "{msg}");
        }
        other => panic!("expected a deadlock, got {other:?}"),
    }
    p.release().await.expect("release p");
    let bp = b_wait.await.expect("join").expect("b gets p");
    bp.release().await.expect("release");
    q.release().await.expect("release");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn election_campaign_observe_resign() {
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let observer = Election::new(
        client.session(Duration::from_secs(10)).await.expect("s"),
        "elect",
    );
    assert_eq!(observer.leader().await.expect("leader"), None);
    let mut changes = Box::pin(observer.observe().await.expect("observe"));
    assert_eq!(changes.next().await.expect("first").expect("ok"), None);

    let mut a = Election::new(
        client.session(Duration::from_secs(10)).await.expect("s"),
        "elect",
    );
    let fa = a.campaign("node-a").await.expect("a leads");
    assert!(a.is_leader());
    assert_eq!(
        observer.leader().await.expect("leader"),
        Some((b"node-a".to_vec(), fa))
    );
    let seen = changes.next().await.expect("change").expect("ok");
    assert_eq!(seen, Some((b"node-a".to_vec(), fa)));

    let mut b = Election::new(
        client.session(Duration::from_secs(10)).await.expect("s"),
        "elect",
    );
    let b_task = tokio::spawn(async move {
        let f = b.campaign("node-b").await.expect("b leads");
        (b, f)
    });
    eventually("b to queue", Duration::from_secs(10), || {
        let client = client.clone();
        async move {
            client
                .describe("elect")
                .await
                .ok()
                .flatten()
                .filter(|i| !i.waiters.is_empty())
        }
    })
    .await;
    a.resign().await.expect("resign");
    assert!(!a.is_leader());
    let (mut b, fb) = b_task.await.expect("join");
    assert!(fb > fa);
    assert_eq!(
        observer.leader().await.expect("leader"),
        Some((b"node-b".to_vec(), fb))
    );
    b.resign().await.expect("resign");
    cluster.shutdown().await;
}

/// A holder stops believing when it sends the release: a release that
/// failed (here: no node reachable) leaves `is_held()` false, though the
/// guard can still be released again, and the retry releases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_release_ends_the_holders_belief_and_can_be_retried() {
    let mut cluster = TestCluster::start(3).await;
    let client = raftlock_client::Client::with_options(
        cluster.addrs(),
        raftlock_client::ClientOptions {
            retry_deadline: Duration::from_secs(1),
            ..Default::default()
        },
    )
    .expect("client");
    let session = client
        .session(Duration::from_secs(60))
        .await
        .expect("session");
    let g = session.lock("release/fails").await.expect("lock");
    assert!(g.is_held());
    let ids = cluster.running();
    for id in &ids {
        cluster.kill(*id).await;
    }
    let failed = g.release().await.expect_err("no node to release at");
    println!("the release failed: {failed}");
    // Not lost: a failed attempt ends no session (in jeopardy at most: the
    // default grace's count, 0.675 s, may have run out meanwhile).
    assert!(
        matches!(
            *session.lease().borrow(),
            raftlock_client::LeaseState::Valid(_)
        ),
        "the lease view outlives the attempt"
    );
    assert!(
        !g.is_held(),
        "still believed held after its release was sent"
    );
    for id in &ids {
        cluster.restart(*id).await;
    }
    cluster.wait_for_leader().await;
    let released = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match g.release().await {
                Ok(r) => break r,
                Err(e) => {
                    println!("release again: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    })
    .await
    .expect("the retried release is answered");
    assert!(released, "the retry released the grant");
    assert!(!g.is_held());
    cluster.shutdown().await;
}

/// Another gRPC service on a dead node's port (a port taken again by
/// another process, an older raftlock that lacks the call): it answers
/// UNIMPLEMENTED, as does an HTTP/2 server that is not gRPC (tonic maps
/// its 404 to UNIMPLEMENTED, "grpc-status header missing"). The client asks
/// the other endpoints; only when every endpoint answers so does it give
/// up, at once. (In a cluster run a killed node's port was taken by
/// another test's server, and a `describe` failed with "Unimplemented:
/// grpc-status header missing, mapped from HTTP status code 404".)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_endpoint_that_does_not_serve_the_call_is_passed_over() {
    let cluster = TestCluster::start(3).await;
    // A gRPC server with the health service only.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let other = listener.local_addr().expect("addr").to_string();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let options = || raftlock_client::ClientOptions {
        retry_deadline: Duration::from_secs(20),
        ..Default::default()
    };
    let mut endpoints = vec![other.clone()];
    endpoints.extend(cluster.addrs());
    let client = raftlock_client::Client::with_options(endpoints, options()).expect("client");
    assert_eq!(
        client.describe("unserved/x").await.expect("describe"),
        None,
        "asked a node after the other service"
    );
    let session = client
        .session(Duration::from_secs(10))
        .await
        .expect("session");
    let held = session.lock("unserved/x").await.expect("lock");
    held.release().await.expect("release");
    session.close().await.expect("close");

    // Given up long before its retry deadline (2 minutes here): the
    // answer is the server's word, not a failure worth waiting out.
    let alone = raftlock_client::Client::with_options(
        vec![other],
        raftlock_client::ClientOptions {
            retry_deadline: Duration::from_secs(120),
            ..Default::default()
        },
    )
    .expect("client");
    let started = Instant::now();
    let err = alone
        .describe("unserved/x")
        .await
        .expect_err("nothing serves it");
    assert!(err.to_string().contains("Unimplemented"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "given up at once, not at the retry deadline ({:?})",
        started.elapsed()
    );
    server.abort();
    cluster.shutdown().await;
}
