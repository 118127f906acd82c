//! HTTP/JSON on every node's client port, spoken as a PHP or shell client
//! would: HTTP/1.1 over a plain TCP connection, JSON bodies.

use std::time::Duration;

use raftlock_testkit::{eventually, TestCluster};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

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
    assert_eq!(get.status, 405);
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

/// A follower that does not forward a request (here: one another node
/// already forwarded, `raftlock-forwarded-by`; also one identified by its
/// client certificate alone) answers 503 naming the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_that_does_not_forward_answers_503_naming_the_leader() {
    let cluster = TestCluster::start(3).await;
    let (leader_id, follower) = cluster.leader_and_follower().await;
    let answer = http(
        &cluster.addr(follower),
        "POST",
        "/v1/locks/Lock",
        &[
            ("Content-Type", "application/json"),
            (raftlock_proto::FORWARDED_KEY, "99"),
        ],
        r#"{"name": "http/f", "ttl_ms": 10000}"#,
    )
    .await;
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert_eq!(answer.body["code"], "UNAVAILABLE");
    let leader = cluster.addr(leader_id);
    assert_eq!(answer.header("raftlock-leader"), Some(leader.as_str()));
    assert_eq!(answer.body["leader"], leader);
    assert_eq!(answer.header("raftlock-not-leader"), Some("1"));
    cluster.shutdown().await;
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watch_streams_newline_delimited_json() {
    let cluster = TestCluster::start(3).await;
    let leader = cluster.leader_addr().await;
    let body = r#"{"prefix": "http/w"}"#;
    let (mut reader, headers) = open_ndjson(
        &leader,
        format!(
            "POST /v1/locks/Watch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await;
    assert!(
        headers
            .iter()
            .any(|h| h.starts_with("content-type") && h.contains("application/x-ndjson")),
        "{headers:?}"
    );
    let lock = post(
        &leader,
        "/v1/locks/Lock",
        r#"{"name": "http/w1", "ttl_ms": 10000}"#,
    )
    .await;
    assert_eq!(lock.status, 200);
    let next_event = async {
        loop {
            let v = next_ndjson(&mut reader).await;
            if v["kind"] == "EVENT_KIND_GRANTED" {
                return v;
            }
        }
    };
    let event = tokio::time::timeout(Duration::from_secs(10), next_event)
        .await
        .expect("a granted event within 10 s");
    assert_eq!(event["name"], "http/w1");
    cluster.shutdown().await;
}

/// A worker killed right after it sent a waiting `Lock` (its connection
/// closes while the node is still writing the request) leaves nothing
/// queued: the session the request opened is closed as soon as it is
/// written, long before its 60 s ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lock_whose_connection_closes_while_it_is_written_leaves_nothing_queued() {
    use futures::StreamExt;
    use raftlock_client::EventKind;

    let cluster = TestCluster::start(3).await;
    let leader = cluster.leader_addr().await;
    let client = cluster.client().await;
    let mut events = client.watch("http/gone", false).await.expect("watch");
    let held = post(
        &leader,
        "/v1/locks/Lock",
        r#"{"name": "http/gone", "ttl_ms": 60000, "nonce": 40}"#,
    )
    .await;
    assert_eq!(held.body["acquired"], true, "{}", held.body);
    // Some of these the node drops before writing them (it sees the close
    // first), which leaves nothing either; the others it writes, and then
    // their callers are gone. How many it writes depends on timing: send
    // rounds of 20 until one is seen queued.
    let mut queued = std::collections::BTreeSet::new();
    let mut seen = 0;
    let note = |event: raftlock_client::WatchEvent,
                queued: &mut std::collections::BTreeSet<_>,
                seen: &mut usize| match (event.kind, event.session) {
        (EventKind::Queued, Some(session)) => {
            queued.insert(session);
            *seen += 1;
        }
        (EventKind::Cancelled | EventKind::Expired, Some(session)) => {
            queued.remove(&session);
        }
        _ => {}
    };
    for round in 0..10u64 {
        for k in 0..20u64 {
            let nonce = 41 + round * 20 + k;
            let body = format!(
                r#"{{"name": "http/gone", "ttl_ms": 60000, "wait": true, "nonce": {nonce}}}"#
            );
            let mut conn = TcpStream::connect(&leader).await.expect("connect");
            conn.write_all(
                format!(
                    "POST /v1/locks/Lock HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            )
            .await
            .expect("write");
            drop(conn);
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while let Some(event) = events.next().await {
                note(event.expect("an event"), &mut queued, &mut seen);
                if seen > 0 {
                    return;
                }
            }
        })
        .await;
        if seen > 0 {
            break;
        }
    }
    assert!(seen > 0, "in 200 closed requests the node never queued one");
    // Every wait that was queued is withdrawn.
    let settled = tokio::time::timeout(Duration::from_secs(10), async {
        while !queued.is_empty() {
            match events.next().await {
                Some(event) => note(event.expect("an event"), &mut queued, &mut seen),
                None => return,
            }
        }
    })
    .await;
    drop(events);
    assert!(
        settled.is_ok(),
        "{seen} waits queued, still queued 10 s after their connections closed: {queued:?}"
    );
    // Those written after that are withdrawn too.
    eventually("no waiter left", Duration::from_secs(10), || {
        let client = client.clone();
        async move {
            let info = client.describe("http/gone").await.ok()??;
            (info.holders.len() == 1 && info.waiters.is_empty()).then_some(())
        }
    })
    .await;
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

/// Sends `request` (a head, and a body if it has one) on a new connection
/// and reads the answer's head, which must be a 200: the connection past
/// the head, and the head's header lines in lower case.
async fn open_ndjson(addr: &str, request: &[u8]) -> (BufReader<TcpStream>, Vec<String>) {
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    conn.write_all(request).await.expect("write");
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    reader.read_line(&mut line).await.expect("status");
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).await.expect("header");
        if line == "\r\n" {
            return (reader, headers);
        }
        headers.push(line.trim_end().to_ascii_lowercase());
    }
}

/// The next line of a chunked newline-delimited JSON answer: a size line,
/// then the line.
async fn next_ndjson(conn: &mut BufReader<TcpStream>) -> serde_json::Value {
    loop {
        let mut size = String::new();
        conn.read_line(&mut size).await.expect("chunk size");
        if size.trim().is_empty() {
            continue;
        }
        let mut text = String::new();
        conn.read_line(&mut text).await.expect("line");
        return serde_json::from_str(text.trim()).expect("json");
    }
}

/// Opens a streaming `KeepAlive` (`application/x-ndjson`, chunked) at
/// `addr`; the connection, past the answer's head.
async fn open_keep_alive_stream(addr: &str) -> BufReader<TcpStream> {
    open_ndjson(
        addr,
        b"POST /v1/locks/KeepAlive HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n",
    )
    .await
    .0
}

/// Writes `text` as one chunk of the request body.
async fn send_chunk(conn: &mut BufReader<TcpStream>, text: &str) {
    let chunk = format!("{:x}\r\n{text}\r\n", text.len());
    conn.get_mut()
        .write_all(chunk.as_bytes())
        .await
        .expect("write a chunk");
}

/// Asks to renew `session` (ask `ask`) on a streaming `KeepAlive` and
/// reads its answer, which must be for that session and ask.
async fn renew_on(conn: &mut BufReader<TcpStream>, session: u64, ask: u64) -> serde_json::Value {
    send_chunk(
        conn,
        &format!("{{\"session_id\": \"{session}\", \"ask_id\": {ask}}}\n"),
    )
    .await;
    let answer = next_line(conn).await;
    assert_eq!(n(&answer["session_id"]), session, "{answer}");
    assert_eq!(n(&answer["ask_id"]), ask, "{answer}");
    answer
}

/// Reads the next line of the streamed answer (a chunk of one line).
async fn next_line(conn: &mut BufReader<TcpStream>) -> serde_json::Value {
    tokio::time::timeout(Duration::from_secs(10), next_ndjson(conn))
        .await
        .expect("an answer line within 10 s")
}

/// Issue 44, item 4: a follower forwards HTTP/JSON requests to the leader
/// (HTTP/1.1 in, HTTP/2 to the leader) and passes the leader's answer
/// back with the leader's address in `raftlock-leader`; a streamed
/// `KeepAlive` through it carries its session as on the leader (it ends a
/// grace after the client's connection drops); a `stale` read is answered
/// by the follower itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_forwards_http_requests_and_streams_to_the_leader() {
    let cluster = TestCluster::start(3).await;
    let (leader_id, follower) = cluster.leader_and_follower().await;
    let leader = cluster.addr(leader_id);
    let node = cluster.addr(follower);
    let lock = post(
        &node,
        "/v1/locks/Lock",
        r#"{"name": "http/fwd", "ttl_ms": 30000, "end_on_disconnect_ms": 500}"#,
    )
    .await;
    assert_eq!(lock.status, 200, "{}", lock.body);
    assert_eq!(lock.body["acquired"], true, "{}", lock.body);
    assert_eq!(lock.header("raftlock-leader"), Some(leader.as_str()));
    let leader_id_text = leader_id.to_string();
    assert_eq!(
        lock.header("raftlock-leader-id"),
        Some(leader_id_text.as_str())
    );
    let session = n(&lock.body["session_id"]);
    let fence = n(&lock.body["fence"]);
    let read = post(&node, "/v1/locks/Describe", r#"{"name": "http/fwd"}"#).await;
    assert_eq!(read.status, 200, "{}", read.body);
    assert_eq!(n(&read.body["info"]["holders"][0]["fence"]), fence);
    assert_eq!(read.header("raftlock-leader"), Some(leader.as_str()));
    eventually(
        "a stale read at the follower sees the grant",
        Duration::from_secs(60),
        || {
            let node = node.clone();
            async move {
                let stale = post(
                    &node,
                    "/v1/locks/Describe",
                    r#"{"name": "http/fwd", "stale": true}"#,
                )
                .await;
                assert_eq!(
                    stale.header("raftlock-leader"),
                    None,
                    "stale reads are the follower's own"
                );
                (stale.body["info"]["holders"][0]["fence"] != serde_json::Value::Null).then_some(())
            }
        },
    )
    .await;

    let mut stream = open_keep_alive_stream(&node).await;
    for ask in 1..=10u64 {
        let answer = renew_on(&mut stream, session, ask).await;
        assert_ne!(answer["expired"], true, "{answer}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let held = post(&leader, "/v1/locks/Describe", r#"{"name": "http/fwd"}"#).await;
    assert_eq!(
        n(&held.body["info"]["holders"][0]["session_id"]),
        session,
        "{}",
        held.body
    );
    drop(stream);
    let dropped = std::time::Instant::now();
    let next = post(
        &node,
        "/v1/locks/Lock",
        r#"{"name": "http/fwd", "ttl_ms": 30000, "timeout_ms": 20000}"#,
    )
    .await;
    assert_eq!(next.body["acquired"], true, "{}", next.body);
    let waited = dropped.elapsed();
    println!(
        "granted through the follower {waited:?} after the forwarded stream's connection closed"
    );
    assert!(
        waited < Duration::from_secs(20),
        "the session outlived its stream: {waited:?}"
    );
    let unlock = post(
        &node,
        "/v1/locks/Unlock",
        &format!("{{\"session_id\": \"{}\"}}", n(&next.body["session_id"])),
    )
    .await;
    assert_eq!(unlock.status, 200, "{}", unlock.body);
    cluster.shutdown().await;
}

/// Issue 44, item 1: `KeepAlive` over HTTP as a stream (newline-delimited
/// JSON both ways) renews a session that ends with its process and carries
/// it as a gRPC stream does: the session lives on past its grace while the
/// stream renews it, and ends a grace after the connection drops, long
/// before its ttl. A line that is no ask ends the stream with an error
/// line.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_keep_alive_stream_over_http_carries_a_session_that_ends_with_its_process() {
    let cluster = TestCluster::start(3).await;
    let leader = cluster.leader_addr().await;
    let lock = post(
        &leader,
        "/v1/locks/Lock",
        r#"{"name": "http/ka", "ttl_ms": 30000, "end_on_disconnect_ms": 500}"#,
    )
    .await;
    assert_eq!(lock.status, 200, "{}", lock.body);
    assert_eq!(lock.body["acquired"], true);
    let session = n(&lock.body["session_id"]);
    let mut stream = open_keep_alive_stream(&leader).await;
    // Four graces of renewals, every 150 ms: without the stream the
    // session would have ended 500 ms after the Lock answered.
    let until = std::time::Instant::now() + Duration::from_secs(2);
    let mut ask = 0;
    while std::time::Instant::now() < until {
        ask += 1;
        let answer = renew_on(&mut stream, session, ask).await;
        assert_eq!(n(&answer["ttl_ms"]), 30_000, "{answer}");
        assert_ne!(answer["expired"], true, "{answer}");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let held = post(&leader, "/v1/locks/Describe", r#"{"name": "http/ka"}"#).await;
    assert_eq!(
        n(&held.body["info"]["holders"][0]["session_id"]),
        session,
        "still held by the streamed session: {}",
        held.body
    );
    // The process dies: its connection closes. The next waiter gets the
    // lock a grace later, not a ttl later.
    drop(stream);
    let dropped = std::time::Instant::now();
    let next = post(
        &leader,
        "/v1/locks/Lock",
        r#"{"name": "http/ka", "ttl_ms": 30000, "timeout_ms": 20000}"#,
    )
    .await;
    assert_eq!(next.body["acquired"], true, "{}", next.body);
    let waited = dropped.elapsed();
    println!("granted to the next waiter {waited:?} after the stream's connection closed");
    assert!(
        waited < Duration::from_secs(20),
        "the session outlived its stream: {waited:?}"
    );

    // A line that is no ask: an error line, and the stream ends.
    let mut bad = open_keep_alive_stream(&leader).await;
    send_chunk(&mut bad, "{\"session_id\": [1]}\n").await;
    let answer = next_line(&mut bad).await;
    assert_eq!(answer["code"], "INVALID_ARGUMENT", "{answer}");
    // The last chunk (size 0) ends the answer.
    let end = async {
        loop {
            let mut line = String::new();
            if bad.read_line(&mut line).await.expect("read") == 0 || line.trim() == "0" {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), end)
        .await
        .expect("the stream ends after its error line");
    cluster.shutdown().await;
}
