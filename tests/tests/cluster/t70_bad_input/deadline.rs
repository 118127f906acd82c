//! A client deadline passing during a blocking call, sent over a bare
//! HTTP/2 connection: answered `DEADLINE_EXCEEDED`, never `CANCELLED`.

use raftlock_testkit::{locks_at, TestCluster};

/// One gRPC call of `method` with `message`, sent over a bare HTTP/2
/// connection with `grpc-timeout: timeout` (no client library, so nothing
/// but the server decides what the deadline's passing is answered): the
/// `grpc-status` and `grpc-message` it ends with.
async fn raw_grpc_call(
    addr: &str,
    method: &str,
    message: impl prost::Message,
    timeout: &str,
) -> (String, String) {
    use http_body_util::BodyExt;
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .expect("an HTTP/2 connection");
    tokio::spawn(conn);
    let bytes = message.encode_to_vec();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    frame.extend_from_slice(&bytes);
    let req = hyper::Request::post(format!("http://{addr}{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", timeout)
        .body(http_body_util::Full::new(hyper::body::Bytes::from(frame)))
        .expect("a request");
    let resp = send.send_request(req).await.expect("an answer");
    let (parts, body) = resp.into_parts();
    let collected = body.collect().await.expect("the body");
    // A refusal without a message comes as headers only ("trailers only").
    let trailers = collected.trailers().cloned().unwrap_or(parts.headers);
    let get = |k: &str| {
        trailers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    (get("grpc-status"), get("grpc-message"))
}

/// A client deadline that passes during a blocking call is answered
/// `DEADLINE_EXCEEDED` (grpc-status 4), as the .proto documents, never
/// `CANCELLED` (1) "Timeout expired" (review 2026-11-29: 6 of 16), which a
/// client takes for its own cancel.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_passing_deadline_is_answered_deadline_exceeded() {
    use raftlock_proto::v1 as pb;
    let cluster = TestCluster::start(1).await;
    let addr = cluster.leader_addr().await;
    let mut locks = locks_at(&addr);
    let held = locks
        .lock(pb::LockRequest {
            name: "deadline/x".into(),
            ttl_ms: 30_000,
            nonce: 1,
            ..Default::default()
        })
        .await
        .expect("lock")
        .into_inner();
    assert!(held.acquired);
    let tries = (0..16u64).map(|i| {
        let addr = addr.clone();
        async move {
            raw_grpc_call(
                &addr,
                "/raftlock.v1.Locks/Lock",
                pb::LockRequest {
                    name: "deadline/x".into(),
                    ttl_ms: 30_000,
                    nonce: 100 + i,
                    wait: true,
                    ..Default::default()
                },
                &format!("{}m", 50 + 25 * i),
            )
            .await
        }
    });
    let answers = futures::future::join_all(tries).await;
    for answer in &answers {
        assert_eq!(answer.0, "4", "{answer:?}");
    }
    cluster.shutdown().await;
}
