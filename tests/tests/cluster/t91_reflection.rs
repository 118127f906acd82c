//! Server reflection in both versions: `grpc.reflection.v1` and the older
//! `v1alpha` that stock Python, older grpcurl and GUI clients speak
//! (black-box 11d: v1alpha answered UNIMPLEMENTED).

use raftlock_testkit::{channel, TestCluster};
use tonic_reflection::pb::{v1, v1alpha};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reflection_answers_in_v1_and_v1alpha() {
    let cluster = TestCluster::start(1).await;
    let addr = cluster.addr(1);

    let mut alpha = v1alpha::server_reflection_client::ServerReflectionClient::new(channel(&addr));
    let req = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut answers = alpha
        .server_reflection_info(tokio_stream::iter([req]))
        .await
        .expect("v1alpha is served")
        .into_inner();
    let answer = answers.message().await.expect("answer").expect("one");
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        answer.message_response
    else {
        panic!("not a service list: {answer:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for service in [
        "raftlock.v1.Locks",
        "raftlock.v1.Cluster",
        "grpc.health.v1.Health",
    ] {
        assert!(names.iter().any(|n| n == service), "{service}: {names:?}");
    }

    let mut v1c = v1::server_reflection_client::ServerReflectionClient::new(channel(&addr));
    let req = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut answers = v1c
        .server_reflection_info(tokio_stream::iter([req]))
        .await
        .expect("v1 is served")
        .into_inner();
    assert!(answers.message().await.expect("answer").is_some());
    // What grpcurl asks before it calls grpc.health.v1.Health/Check: the
    // file that defines the service (the review found it missing).
    let req = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1::server_reflection_request::MessageRequest::FileContainingSymbol(
                "grpc.health.v1.Health".into(),
            ),
        ),
    };
    let answer = v1c
        .server_reflection_info(tokio_stream::iter([req]))
        .await
        .expect("v1 is served")
        .into_inner()
        .message()
        .await
        .expect("answer")
        .expect("one");
    assert!(
        matches!(
            answer.message_response,
            Some(v1::server_reflection_response::MessageResponse::FileDescriptorResponse(ref f))
                if !f.file_descriptor_proto.is_empty()
        ),
        "{answer:?}"
    );
    cluster.shutdown().await;
}
