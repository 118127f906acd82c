//! Connections: NDJSON watch streams, chunked keep-alive streams, a
//! connection that closes mid-request, and followers that forward to the
//! leader (or answer 503).

use std::time::Duration;

use raftlock_testkit::{eventually, TestCluster};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::{http, n, post};

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
