//! Who may ask, and how much: credentials as over gRPC, checked before the
//! body, bounded bodies, cross-site requests.

use std::time::Duration;

use raftlock_testkit::TestCluster;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::{http, post};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_credentials_as_grpc() {
    let acl = r#"
peer_token = "http-peer-token-0123456789"

[[token]]
identity = "app"
token = "tok-app"

[[rule]]
identity = "app"
allow = "lock"
prefix = "app/"
"#;
    let cluster = TestCluster::start_acl(3, acl, None).await;
    let leader = cluster.leader_addr().await;
    let body = r#"{"name": "app/x", "ttl_ms": 10000}"#;
    let none = post(&leader, "/v1/locks/Lock", body).await;
    assert_eq!(
        (none.status, &none.body["code"]),
        (401, &serde_json::json!("UNAUTHENTICATED"))
    );
    let auth = [
        ("Content-Type", "application/json"),
        ("Authorization", "Bearer tok-app"),
    ];
    let ok = http(&leader, "POST", "/v1/locks/Lock", &auth, body).await;
    assert_eq!(
        (ok.status, &ok.body["acquired"]),
        (200, &serde_json::json!(true))
    );
    let other = http(
        &leader,
        "POST",
        "/v1/locks/Lock",
        &auth,
        r#"{"name": "billing/x", "ttl_ms": 10000}"#,
    )
    .await;
    assert_eq!(other.status, 403);
    cluster.shutdown().await;
}

/// Sends only the head of a request whose body would be `length` bytes
/// and reads the answer, if one comes before any body was sent.
async fn answer_to_head(
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
    length: u64,
) -> Option<u16> {
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    let mut req = format!("POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {length}\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    conn.write_all(req.as_bytes()).await.expect("write");
    let mut reader = BufReader::new(conn);
    let mut status = String::new();
    tokio::time::timeout(Duration::from_secs(5), reader.read_line(&mut status))
        .await
        .ok()?
        .ok()?;
    status.split(' ').nth(1)?.parse().ok()
}

/// Credentials are checked from the headers before a body is read, and
/// each route reads no more than its messages need (review 2026-11-29
/// #1: a 256 MiB body without credentials was read whole, then 401).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn credentials_are_checked_before_the_body_and_bodies_are_bounded() {
    let acl = r#"
peer_token = "http-peer-token-0123456789"

[[token]]
identity = "app"
token = "tok-app"

[[rule]]
identity = "app"
allow = "lock"
prefix = "app/"
"#;
    let cluster = TestCluster::start_acl(1, acl, None).await;
    let leader = cluster.leader_addr().await;
    let json = ("Content-Type", "application/json");
    for path in [
        "/v1/cluster/Status",
        "/v1/cluster/RevokeSession",
        "/v1/locks/Lock",
    ] {
        assert_eq!(
            answer_to_head(&leader, path, &[json], 256 << 20).await,
            Some(401),
            "{path}: an unauthenticated request with a 256 MiB body is refused from its head"
        );
    }
    // The streaming KeepAlive too (its body is a stream, bounded per line).
    let ndjson = ("Content-Type", "application/x-ndjson");
    assert_eq!(
        answer_to_head(&leader, "/v1/locks/KeepAlive", &[ndjson], 256 << 20).await,
        Some(401),
        "an unauthenticated KeepAlive stream is refused from its head"
    );
    // With credentials, a body past what the route's messages need is
    // refused from its length, before it is read (64 KiB for both).
    let auth = ("Authorization", "Bearer tok-app");
    for path in ["/v1/cluster/Status", "/v1/locks/Lock"] {
        let status = answer_to_head(&leader, path, &[json, auth], 256 << 20).await;
        assert!(
            matches!(status, Some(400 | 413)),
            "{path}: a 256 MiB body is refused from its head, got {status:?}"
        );
    }
    cluster.shutdown().await;
}

/// A browser page on another site cannot make a node's HTTP gateway or
/// its console act (review 2026-11-29 #7): writes need a JSON body
/// (`Content-Type: application/json`, which a cross-site form or a
/// "simple" fetch cannot send without a preflight the node refuses) and a
/// request whose `Origin` is another site is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cross_site_requests_are_refused_without_an_acl_too() {
    let cluster = TestCluster::start(1).await;
    let leader = cluster.leader_addr().await;
    let body = r#"{"name": "csrf/x", "ttl_ms": 10000}"#;
    for content_type in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        let answer = http(
            &leader,
            "POST",
            "/v1/locks/Lock",
            &[("Content-Type", content_type)],
            body,
        )
        .await;
        assert_eq!(answer.status, 415, "{content_type}: {}", answer.body);
    }
    let cross = http(
        &leader,
        "POST",
        "/v1/locks/Lock",
        &[
            ("Content-Type", "application/json"),
            ("Origin", "http://evil.example"),
        ],
        body,
    )
    .await;
    assert_eq!(cross.status, 403, "{}", cross.body);
    let fetched = http(
        &leader,
        "POST",
        "/v1/cluster/RevokeSession",
        &[
            ("Content-Type", "application/json"),
            ("Sec-Fetch-Site", "cross-site"),
        ],
        r#"{"session_id": "1"}"#,
    )
    .await;
    assert_eq!(fetched.status, 403, "{}", fetched.body);
    // The console's revoke.
    let console = cluster.metrics_addr(1);
    let revoke = http(
        &console,
        "POST",
        "/ui/api/revoke?session=1",
        &[
            ("Origin", "http://evil.example"),
            ("Content-Type", "text/plain"),
        ],
        "",
    )
    .await;
    assert_eq!(revoke.status, 403, "{}", revoke.body);
    // Nothing was taken.
    let free = post(&leader, "/v1/locks/Describe", r#"{"name": "csrf/x"}"#).await;
    assert_eq!(
        free.body["exists"],
        serde_json::Value::Null,
        "{}",
        free.body
    );
    // Same-origin and non-browser callers (no Origin) go through.
    let ok = http(
        &leader,
        "POST",
        "/v1/locks/Lock",
        &[
            ("Content-Type", "application/json"),
            ("Origin", &format!("http://{leader}")),
        ],
        body,
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    cluster.shutdown().await;
}
