//! Any node accepts any request (issue 44, item 4): a follower forwards
//! `Locks` and `Cluster` requests to the leader over gRPC, streams
//! included, and the answer is the leader's, with the leader's address
//! added so a client can go there next time. `Status` and `stale` reads
//! are answered where they arrive. A forward cut off from the leader is
//! not answered as done. (HTTP/JSON through a follower: t84_http/connections.rs; a
//! request already forwarded, which is never forwarded again, is refused
//! naming the leader: t70_bad_input.)

use std::time::Duration;

use raftlock_client::proto::{
    AcquireRequest, CloseSessionRequest, DescribeRequest, KeepAliveRequest, MembersRequest,
    OpenSessionRequest, StatusRequest,
};
use raftlock_testkit::{cluster_at, eventually, locks_at, TestCluster};
use tonic::Code;

/// The leader hints of an answer: (address, id).
fn hints(md: &tonic::metadata::MetadataMap) -> (Option<String>, Option<String>) {
    let get = |k: &str| md.get(k).and_then(|v| v.to_str().ok()).map(str::to_string);
    (
        get(raftlock_proto::LEADER_ADDR_KEY),
        get(raftlock_proto::LEADER_ID_KEY),
    )
}

fn acquire(session_id: u64, seq: u64, name: &str) -> AcquireRequest {
    AcquireRequest {
        session_id,
        seq,
        name: name.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_forwards_writes_reads_and_keep_alive_streams_to_the_leader() {
    let cluster = TestCluster::start(3).await;
    let (leader, follower) = cluster.leader_and_follower().await;
    let leader_addr = cluster.addr(leader);
    let mut locks = locks_at(&cluster.addr(follower));

    // A session and a lock, through the follower alone.
    let opened = locks
        .open_session(OpenSessionRequest {
            ttl_ms: 30_000,
            end_on_disconnect_ms: 500,
            ..Default::default()
        })
        .await
        .expect("open through a follower");
    assert_eq!(
        hints(opened.metadata()),
        (Some(leader_addr.clone()), Some(leader.to_string())),
        "a forwarded answer names the leader"
    );
    let session = opened.into_inner().session_id;
    let granted = locks
        .acquire(acquire(session, 1, "fwd/a"))
        .await
        .expect("acquire through a follower")
        .into_inner();
    assert!(granted.acquired, "{granted:?}");
    assert!(granted.fence > 0);

    // A linearizable read goes to the leader; a stale one is this node's.
    let read = locks
        .describe(DescribeRequest {
            name: "fwd/a".into(),
            stale: false,
        })
        .await
        .expect("describe through a follower");
    assert_eq!(hints(read.metadata()).0, Some(leader_addr.clone()));
    assert_eq!(
        read.into_inner().info.expect("held").holders[0].fence,
        granted.fence
    );
    let stale = eventually(
        "the follower applied the grant",
        Duration::from_secs(60),
        || {
            let mut locks = locks.clone();
            async move {
                let stale = locks
                    .describe(DescribeRequest {
                        name: "fwd/a".into(),
                        stale: true,
                    })
                    .await
                    .expect("stale describe");
                let local = hints(stale.metadata()).0.is_none();
                stale
                    .into_inner()
                    .info
                    .filter(|i| !i.holders.is_empty())
                    .map(|_| local)
            }
        },
    )
    .await;
    assert!(stale, "a stale read is answered by the follower itself");

    // Status describes the node asked; Members is the leader's.
    let status = cluster_at(&cluster.addr(follower))
        .status(StatusRequest {})
        .await
        .expect("status")
        .into_inner();
    assert_eq!(status.id, follower, "Status is never forwarded");
    let members = cluster_at(&cluster.addr(follower))
        .members(MembersRequest {})
        .await
        .expect("members through a follower")
        .into_inner();
    assert_eq!(members.members.len(), 3);
    assert_eq!(members.leader_id, leader);

    // A keep-alive stream through the follower renews the session past
    // its grace for as long as it is open...
    let (asks, rx) = tokio::sync::mpsc::channel(4);
    let mut answers = locks
        .keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("a keep-alive stream through a follower")
        .into_inner();
    for ask in 1..=10u64 {
        asks.send(KeepAliveRequest {
            session_id: session,
            ask_id: ask,
        })
        .await
        .expect("ask");
        let answer = tokio::time::timeout(Duration::from_secs(10), answers.message())
            .await
            .expect("an answer within 10 s")
            .expect("the stream stays open")
            .expect("an answer");
        assert_eq!((answer.session_id, answer.ask_id), (session, ask));
        assert!(!answer.expired, "{answer:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let held = cluster
        .client()
        .await
        .describe("fwd/a")
        .await
        .expect("describe")
        .expect("still held after four graces");
    assert_eq!(held.holders[0].fence.get(), granted.fence);

    // ... and once the client goes away (its stream and connection to the
    // follower end), the leader ends the session a grace later, not a ttl
    // later.
    drop((asks, answers, locks));
    let gone = std::time::Instant::now();
    let client = cluster.client().await;
    eventually(
        "the session ended with its stream",
        Duration::from_secs(20),
        || {
            let client = client.clone();
            async move {
                client
                    .describe("fwd/a")
                    .await
                    .expect("describe")
                    .is_none()
                    .then_some(())
            }
        },
    )
    .await;
    println!(
        "the lock was freed {:?} after the forwarded stream ended",
        gone.elapsed()
    );
    cluster.shutdown().await;
}

/// A follower cut off from the leader cannot forward: the request is not
/// answered as done, and nothing is granted while the link is cut (the
/// forward goes over the same links as the nodes' Raft traffic).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forward_cut_off_from_the_leader_is_not_answered_as_done() {
    let cluster = TestCluster::start_partitionable(3).await;
    let (_, follower) = cluster.leader_and_follower().await;
    let mut locks = locks_at(&cluster.addr(follower));
    let opened = locks
        .open_session(OpenSessionRequest {
            ttl_ms: 30_000,
            ..Default::default()
        })
        .await
        .expect("open through a follower")
        .into_inner();
    cluster.isolate(follower);
    let mut req = tonic::Request::new(acquire(opened.session_id, 1, "fwd/cut"));
    req.set_timeout(Duration::from_secs(3));
    let refused = locks.acquire(req).await.expect_err("no leader reachable");
    assert!(
        matches!(
            refused.code(),
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled
        ),
        "{refused:?}"
    );
    let client = cluster.client().await;
    assert!(
        client
            .describe("fwd/cut")
            .await
            .expect("describe at the leader")
            .is_none(),
        "granted through a cut link"
    );
    cluster.heal();
    // Once healed the session is usable through the follower again (the
    // cut acquire, whose outcome was unknown, is retried with its seq).
    let granted = eventually("forwarding works again", Duration::from_secs(60), || {
        let mut locks = locks.clone();
        async move {
            let mut req = tonic::Request::new(acquire(opened.session_id, 1, "fwd/cut"));
            req.set_timeout(Duration::from_secs(5));
            locks.acquire(req).await.ok().map(|r| r.into_inner())
        }
    })
    .await;
    assert!(granted.acquired, "{granted:?}");
    locks
        .close_session(CloseSessionRequest {
            session_id: opened.session_id,
            seq: 2,
        })
        .await
        .expect("close through the follower");
    cluster.shutdown().await;
}

/// The Rust client goes to the leader a forwarded answer names: a client
/// given only a follower's address keeps working once that follower is
/// stopped, because after its first answer it talks to the leader itself
/// (before, it stayed on the follower: with it gone, nothing answered).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_rust_client_moves_to_the_leader_a_forwarded_answer_names() {
    let mut cluster = TestCluster::start(3).await;
    let (_, follower) = cluster.leader_and_follower().await;
    let client = raftlock_client::Client::with_options(
        vec![cluster.addr(follower)],
        raftlock_client::ClientOptions {
            retry_deadline: Duration::from_secs(5),
            ..Default::default()
        },
    )
    .expect("client");
    let first = client
        .describe("fwd/rust")
        .await
        .expect("through the follower");
    assert!(first.is_none());
    cluster.stop(follower).await;
    // The leader may move when a follower stops (it should not: two of
    // three remain); the client follows hints from there on.
    let second = client
        .describe("fwd/rust")
        .await
        .expect("answered by the leader the first answer named");
    assert!(second.is_none());
    cluster.shutdown().await;
}

/// A `stale` read that a follower serves itself is read before it is
/// served: the largest message the node takes (64 KiB) is read and served
/// (here refused for its over-long name, as the service refuses it), one
/// byte more is refused `OUT_OF_RANGE`, as the service refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_read_at_a_follower_is_read_up_to_the_message_limit() {
    use prost::Message as _;
    let cluster = TestCluster::start(3).await;
    let (_, follower) = cluster.leader_and_follower().await;
    let mut locks = locks_at(&cluster.addr(follower));
    let limit = raftlock_node::MAX_MESSAGE_BYTES;
    let at = |len: usize| DescribeRequest {
        name: "x".repeat(len),
        stale: true,
    };
    // The name's length prefix takes 3 bytes here, its tag 1, `stale` 2.
    let largest = at(limit - 6);
    assert_eq!(largest.encoded_len(), limit);
    let refused = locks
        .describe(largest)
        .await
        .expect_err("a 64 KiB name is too long");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("name") && !refused.message().contains("cannot read"),
        "refused by the service for its name, not before it was read: {refused:?}"
    );
    let over = at(limit - 5);
    assert_eq!(over.encoded_len(), limit + 1);
    let refused = locks
        .describe(over)
        .await
        .expect_err("one byte over the limit");
    assert_eq!(refused.code(), Code::OutOfRange, "{refused:?}");
    cluster.shutdown().await;
}
