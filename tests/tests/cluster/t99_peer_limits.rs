//! The Raft service and large messages (review finding 3): credentials are
//! checked before a body is decoded, and no service decodes more than it
//! needs.

use raftlock_proto::v1 as pb;
use raftlock_proto::v1::raft_client::RaftClient;
use raftlock_testkit::{channel, TestCluster};
use tonic::{Code, Request};
use tonic_prost::ProstCodec;

const PEER_TOKEN: &str = "limits-peer-token-0123456789";

fn acl() -> String {
    format!(
        r#"
peer_token = "{PEER_TOKEN}"

[[token]]
identity = "app"
token = "tok-app"

[[rule]]
identity = "app"
allow = "lock"
"#
    )
}

fn with_token<T>(msg: T, token: &str) -> Request<T> {
    let mut req = Request::new(msg);
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ascii"),
    );
    req
}

/// A client of the cluster with the application's token.
fn app_client(cluster: &TestCluster) -> raftlock_client::Client {
    raftlock_client::Client::with_options(
        cluster.addrs(),
        raftlock_client::ClientOptions {
            token: Some("tok-app".into()),
            ..Default::default()
        },
    )
    .expect("client")
}

/// Sends `msg` (any protobuf message) to `path`, answered as a RaftMessage.
async fn raw<M: prost::Message + Send + Sync + 'static>(
    addr: &str,
    path: &'static str,
    req: Request<M>,
) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(channel(addr));
    grpc.ready().await.expect("ready");
    let codec: ProstCodec<M, pb::RaftMessage> = ProstCodec::default();
    grpc.unary(
        req,
        tonic::codegen::http::uri::PathAndQuery::from_static(path),
        codec,
    )
    .await
    .expect_err("refused")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn credentials_are_checked_before_a_body_is_decoded() {
    let cluster = TestCluster::start_acl(3, &acl(), None).await;
    let leader = cluster.leader_addr().await;
    // Not a RaftMessage at all (field 1 as a varint): a node that decodes
    // before it authenticates answers with a decode error; one that
    // authenticates first never looks at it.
    let malformed = pb::StatusResponse {
        id: 5,
        ..Default::default()
    };
    for path in [
        "/raftlock.v1.Raft/AppendEntries",
        "/raftlock.v1.Raft/StreamAppend",
        "/raftlock.v1.Raft/Vote",
        "/raftlock.v1.Raft/InstallSnapshot",
    ] {
        let status = raw(&leader, path, Request::new(malformed.clone())).await;
        assert_eq!(status.code(), Code::Unauthenticated, "{path}: {status:?}");
        let status = raw(&leader, path, with_token(malformed.clone(), "tok-app")).await;
        assert_eq!(status.code(), Code::Unauthenticated, "{path}: {status:?}");
    }
    // The Cluster service too: no credentials, no decoding.
    let status = raw(
        &leader,
        "/raftlock.v1.Cluster/Restore",
        Request::new(malformed.clone()),
    )
    .await;
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_raft_message_larger_than_replication_needs_is_refused() {
    let cluster = TestCluster::start_acl(3, &acl(), None).await;
    let leader = cluster.leader_addr().await;
    let mut raft = RaftClient::new(channel(&leader))
        .max_encoding_message_size(usize::MAX)
        .max_decoding_message_size(usize::MAX);
    let huge = pb::RaftMessage {
        data: vec![0; raftlock_node::raft::MAX_RAFT_MESSAGE_BYTES + 1],
        error: Vec::new(),
        ..Default::default()
    };
    let status = raft
        .append_entries(with_token(huge, PEER_TOKEN))
        .await
        .expect_err("too large");
    assert!(
        matches!(status.code(), Code::OutOfRange | Code::ResourceExhausted),
        "{status:?}"
    );
    // The cluster is unharmed.
    let client = app_client(&cluster);
    let s = client
        .session(std::time::Duration::from_secs(10))
        .await
        .expect("session");
    s.lock("limits/x")
        .await
        .expect("lock")
        .release()
        .await
        .expect("release");
    cluster.shutdown().await;
}

/// The streamed Raft calls refuse what is not an openraft message with
/// INVALID_ARGUMENT (after the answers to what came before it), and the
/// node goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_streamed_raft_messages_are_refused() {
    let cluster = TestCluster::start_acl(3, &acl(), None).await;
    let leader = cluster.leader_addr().await;
    let mut raft = RaftClient::new(channel(&leader));
    let garbage = || pb::RaftMessage {
        data: vec![0xff; 7],
        error: Vec::new(),
        ..Default::default()
    };
    let mut answers = raft
        .stream_append(with_token(tokio_stream::iter([garbage()]), PEER_TOKEN))
        .await
        .expect("the stream opens")
        .into_inner();
    let status = answers.message().await.expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let status = raft
        .install_snapshot(with_token(tokio_stream::iter([garbage()]), PEER_TOKEN))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let status = raft
        .install_snapshot(with_token(
            tokio_stream::iter(Vec::<pb::RaftMessage>::new()),
            PEER_TOKEN,
        ))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let client = app_client(&cluster);
    let s = client
        .session(std::time::Duration::from_secs(10))
        .await
        .expect("the cluster still writes");
    s.close().await.expect("close");
    cluster.shutdown().await;
}

/// An AcquireRequest whose `name` is raw bytes (not UTF-8).
#[derive(Clone, PartialEq, prost::Message)]
struct RawAcquire {
    #[prost(uint64, tag = "1")]
    session_id: u64,
    #[prost(uint64, tag = "2")]
    seq: u64,
    #[prost(bytes = "vec", tag = "3")]
    name: Vec<u8>,
}

/// Black-box 4.06/4.26: what the .proto header says a name that is not
/// UTF-8, or a message that is not protobuf, gets: INTERNAL "failed to
/// decode Protobuf message", and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn undecodable_requests_get_the_documented_status() {
    let cluster = TestCluster::start(1).await;
    let addr = cluster.addr(1);
    let mut grpc = tonic::client::Grpc::new(channel(&addr));
    grpc.ready().await.expect("ready");
    let codec: ProstCodec<RawAcquire, pb::AcquireResponse> = ProstCodec::default();
    let status = grpc
        .unary(
            Request::new(RawAcquire {
                session_id: 1,
                seq: 1,
                name: vec![0xff, 0xfe, 0xc0, 0x80],
            }),
            tonic::codegen::http::uri::PathAndQuery::from_static("/raftlock.v1.Locks/Acquire"),
            codec,
        )
        .await
        .expect_err("not UTF-8");
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(
        status
            .message()
            .starts_with("failed to decode Protobuf message"),
        "{status:?}"
    );
    let malformed = pb::StatusResponse {
        id: 5,
        ..Default::default()
    };
    let status = raw(
        &addr,
        "/raftlock.v1.Locks/Describe",
        Request::new(malformed),
    )
    .await;
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(
        status
            .message()
            .starts_with("failed to decode Protobuf message"),
        "{status:?}"
    );
    cluster.shutdown().await;
}
