//! HTTP/JSON on every node's client port, spoken as a PHP or shell client
//! would: HTTP/1.1 over a plain TCP connection, JSON bodies.

use raftlock_testkit::TestCluster;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod access;
mod connections;

/// An HTTP/1.1 answer: status, headers (lower-case names), body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: serde_json::Value,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one request (`Connection: close`) and reads the whole answer.
async fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    conn.write_all(req.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).await.expect("read");
    let text = String::from_utf8(raw).expect("utf-8");
    let (head, rest) = text.split_once("\r\n\r\n").expect("a head");
    let mut lines = head.lines();
    let status = lines
        .next()
        .expect("status line")
        .split(' ')
        .nth(1)
        .expect("code");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Answer {
        status: status.parse().expect("a number"),
        body: serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body)),
        headers,
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

async fn post(addr: &str, path: &str, body: &str) -> Answer {
    http(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body,
    )
    .await
}

/// A JSON 64-bit integer, written as a string by proto3 JSON.
fn n(v: &serde_json::Value) -> u64 {
    match v {
        serde_json::Value::String(s) => s.parse().expect("a number in a string"),
        serde_json::Value::Number(n) => n.as_u64().expect("u64"),
        serde_json::Value::Null => 0,
        other => panic!("not a number: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_whole_lock_cycle_over_http_json() {
    let cluster = TestCluster::start(3).await;
    let leader = cluster.leader_addr().await;
    // One-call lock and unlock.
    let lock = post(
        &leader,
        "/v1/locks/Lock",
        r#"{"name": "http/a", "ttl_ms": 10000, "nonce": 5}"#,
    )
    .await;
    assert_eq!(lock.status, 200, "{}", lock.body);
    assert_eq!(lock.header("content-type"), Some("application/json"));
    assert_eq!(lock.body["acquired"], true);
    let (session, fence) = (n(&lock.body["session_id"]), n(&lock.body["fence"]));
    assert!(session > 0 && fence > 0);
    // lowerCamelCase, numbers as strings, enums by name.
    let info = post(&leader, "/v1/locks/Describe", r#"{"name": "http/a"}"#).await;
    assert_eq!(info.status, 200);
    assert_eq!(n(&info.body["info"]["holders"][0]["session_id"]), session);
    let ka = post(
        &leader,
        "/v1/locks/KeepAlive",
        &format!(r#"{{"sessionId": "{session}", "askId": 9}}"#),
    )
    .await;
    assert_eq!(ka.status, 200, "{}", ka.body);
    assert_eq!((n(&ka.body["ttl_ms"]), n(&ka.body["ask_id"])), (10_000, 9));
    let busy = post(
        &leader,
        "/v1/locks/Lock",
        r#"{"name": "http/a", "ttlMs": "10000", "nonce": 6, "mode": "MODE_EXCLUSIVE"}"#,
    )
    .await;
    assert_eq!(
        (busy.status, &busy.body["acquired"]),
        (200, &serde_json::Value::Null)
    );
    let unlock = post(
        &leader,
        "/v1/locks/Unlock",
        &format!(r#"{{"session_id": {session}}}"#),
    )
    .await;
    assert_eq!(
        (unlock.status, &unlock.body["released"]),
        (200, &serde_json::json!(1))
    );
    // The session API too: open, acquire (wait without a timeout), release.
    let open = post(&leader, "/v1/locks/OpenSession", r#"{"ttl_ms": 10000}"#).await;
    let s = n(&open.body["session_id"]);
    let acq = post(
        &leader,
        "/v1/locks/Acquire",
        &format!(r#"{{"session_id": {s}, "seq": 1, "name": "http/b", "wait": true}}"#),
    )
    .await;
    assert_eq!(acq.body["acquired"], true, "{}", acq.body);
    assert!(n(&acq.body["fence"]) > fence);
    let status = post(&leader, "/v1/cluster/Status", "").await;
    assert_eq!(status.status, 200);
    assert_eq!(status.body["role"], "leader");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acquire_all_over_http_json() {
    let cluster = TestCluster::start(3).await;
    let leader = cluster.leader_addr().await;
    let open = post(&leader, "/v1/locks/OpenSession", r#"{"ttl_ms": 10000}"#).await;
    let s = n(&open.body["session_id"]);
    let all = post(
        &leader,
        "/v1/locks/AcquireAll",
        &format!(
            r#"{{"session_id": {s}, "seq": 1, "locks": [{{"name": "http/o"}}, {{"name": "http/s", "mode": "MODE_SEMAPHORE", "weight": 2, "capacity": 5}}]}}"#
        ),
    )
    .await;
    assert_eq!(all.status, 200, "{}", all.body);
    assert_eq!(all.body["acquired"], true, "{}", all.body);
    let grants = all.body["grants"].as_array().expect("grants");
    assert_eq!(grants.len(), 2);
    assert_eq!(grants[0]["name"], "http/o");
    assert_eq!(grants[1]["mode"], "MODE_SEMAPHORE");
    assert!(n(&grants[1]["fence"]) > n(&grants[0]["fence"]));
    // An empty request is refused, saying why.
    let none = post(
        &leader,
        "/v1/locks/AcquireAll",
        &format!(r#"{{"session_id": {s}, "seq": 2, "locks": []}}"#),
    )
    .await;
    assert_eq!(none.status, 400, "{}", none.body);
    assert!(
        none.body.to_string().contains("1..=64 locks"),
        "{}",
        none.body
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upgrade_and_downgrade_over_http_json() {
    let cluster = TestCluster::start(3).await;
    let leader = cluster.leader_addr().await;
    let open = post(&leader, "/v1/locks/OpenSession", r#"{"ttl_ms": 10000}"#).await;
    let s = n(&open.body["session_id"]);
    let read = post(
        &leader,
        "/v1/locks/Acquire",
        &format!(r#"{{"session_id": {s}, "seq": 1, "name": "http/up", "mode": "MODE_SHARED"}}"#),
    )
    .await;
    assert_eq!(read.body["acquired"], true, "{}", read.body);
    let shared = n(&read.body["fence"]);
    let up = post(
        &leader,
        "/v1/locks/Upgrade",
        &format!(r#"{{"session_id": {s}, "seq": 2, "name": "http/up", "fence": {shared}}}"#),
    )
    .await;
    assert_eq!(up.status, 200, "{}", up.body);
    assert_eq!(up.body["acquired"], true, "{}", up.body);
    // MODE_EXCLUSIVE is the enum's zero, which proto3 JSON leaves out.
    assert!(up.body.get("mode").is_none(), "{}", up.body);
    let exclusive = n(&up.body["fence"]);
    assert!(exclusive > shared);
    // The shared grant is gone: upgrading it again is refused, and says why.
    let again = post(
        &leader,
        "/v1/locks/Upgrade",
        &format!(r#"{{"session_id": {s}, "seq": 3, "name": "http/up", "fence": {shared}}}"#),
    )
    .await;
    assert_eq!(again.status, 400, "{}", again.body);
    assert!(
        again.body.to_string().contains("does not hold"),
        "{}",
        again.body
    );
    let down = post(
        &leader,
        "/v1/locks/Downgrade",
        &format!(r#"{{"session_id": {s}, "seq": 4, "name": "http/up", "fence": {exclusive}}}"#),
    )
    .await;
    assert_eq!(down.status, 200, "{}", down.body);
    assert_eq!(n(&down.body["fence"]), exclusive);
    let info = post(&leader, "/v1/locks/Describe", r#"{"name": "http/up"}"#).await;
    assert_eq!(info.body["info"]["holders"][0]["mode"], "MODE_SHARED");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_requests_get_json_errors_and_change_nothing() {
    let cluster = TestCluster::start(3).await;
    let leader = cluster.leader_addr().await;
    let state = || async {
        let status = post(&cluster.leader_addr().await, "/v1/cluster/Status", "").await;
        let list = post(&cluster.leader_addr().await, "/v1/locks/List", "{}").await;
        (n(&status.body["sessions"]), list.body["locks"].clone())
    };
    let before = state().await;
    let bad = post(&leader, "/v1/locks/Lock", r#"{"name": "x", "#).await;
    assert_eq!(
        (bad.status, &bad.body["code"]),
        (400, &serde_json::json!("INVALID_ARGUMENT"))
    );
    let bad = post(&leader, "/v1/locks/Lock", r#"{"name": "x", "ttl_ms": 5}"#).await;
    assert_eq!(
        (bad.status, &bad.body["code"]),
        (400, &serde_json::json!("INVALID_ARGUMENT"))
    );
    assert!(bad.body["message"]
        .as_str()
        .expect("message")
        .contains("ttl"));
    let unknown = post(&leader, "/v1/locks/Frobnicate", "{}").await;
    assert_eq!(
        (unknown.status, &unknown.body["code"]),
        (404, &serde_json::json!("NOT_FOUND"))
    );
    let unknown = post(&leader, "/v1/nothing", "{}").await;
    assert_eq!(unknown.status, 404);
    let get = http(&leader, "GET", "/v1/locks/Lock", &[], "").await;
    assert_eq!(
        (get.status, &get.body["code"], get.header("allow")),
        (405, &serde_json::json!("UNIMPLEMENTED"), Some("POST")),
        "a known route with another method than POST: {}",
        get.body
    );
    assert!(get.body["message"]
        .as_str()
        .is_some_and(|m| m.contains("GET") && m.contains("POST")));
    let grpc = http(
        &leader,
        "POST",
        "/v1/locks/Lock",
        &[("Content-Type", "application/grpc")],
        "{}",
    )
    .await;
    assert_eq!(grpc.status, 415);
    let big = format!(r#"{{"name": "{}"}}"#, "x".repeat(70 * 1024));
    let big = post(&leader, "/v1/locks/Describe", &big).await;
    assert_eq!(
        (big.status, &big.body["code"]),
        (400, &serde_json::json!("OUT_OF_RANGE"))
    );
    let gone = post(&leader, "/v1/locks/Unlock", r#"{"session_id": 777}"#).await;
    assert_eq!(
        (gone.status, &gone.body["code"]),
        (404, &serde_json::json!("NOT_FOUND"))
    );
    assert_eq!(state().await, before, "no session, no lock");
    cluster.shutdown().await;
}
