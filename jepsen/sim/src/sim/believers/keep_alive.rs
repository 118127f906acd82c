//! Believers whose sessions are kept alive by `KeepAlive`: on one or two
//! streams (gRPC, or HTTP's newline-delimited JSON) that end with the
//! process, across the operator's leadership round trips; or by one-shot
//! asks, HTTP's way.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::RngExt as _;

use raftlock_proto::v1 as pb;
use raftlock_proto::v1::locks_client::LocksClient;

use super::{
    addr, at_leader, channel, find, grpc, keep_alive_once, n, note, now_us, round_trip,
    round_trip_allowed, take, unlock, Answer, Holding, Shared, CALL,
};
use crate::belief::{counted_length_us, Count};

/// A session that ends with its process: `OpenSession` + `Acquire`, kept
/// alive on a `KeepAlive` stream (and often a second one, on a connection
/// of its own), renewing every third of its grace; one stream may end
/// (a flap) and another open, while the operator moves the leadership.
pub(super) async fn streams(client: &str, name: &str, rng: &mut StdRng, record: &Shared) {
    let ttl = rng.random_range(2_000..5_000);
    let grace = rng.random_range(300..800);
    let sent = now_us();
    let open = pb::OpenSessionRequest {
        ttl_ms: ttl,
        end_on_disconnect_ms: grace,
        nonce: 0,
        ..Default::default()
    };
    let (opened, id) = at_leader(record, rng, |id| {
        grpc(id, move |mut c| async move { c.open_session(open).await })
    })
    .await;
    let opened = match opened {
        Answer::Ok(opened) => opened,
        Answer::Refused(code) => {
            note(
                record,
                format!("{client}: open refused at node {id}: {code:?}"),
            );
            return;
        }
        Answer::Unknown => {
            note(record, format!("{client}: open at node {id}: no answer"));
            return;
        }
    };
    let session = opened.session_id;
    let mut count = Count::default();
    let length = counted_length_us(ttl, grace);
    count.answered(sent, length, 0.0);
    let Answer::Ok(got) = grpc(id, |mut c| async move {
        c.acquire(pb::AcquireRequest {
            session_id: session,
            seq: 1,
            name: name.into(),
            timeout_ms: 1_000,
            ..Default::default()
        })
        .await
    })
    .await
    else {
        let _ = grpc(id, |mut c| async move {
            c.close_session(pb::CloseSessionRequest {
                session_id: session,
                seq: 2,
            })
            .await
        })
        .await;
        return;
    };
    let from = now_us();
    if !got.acquired || !count.runs(from) {
        note(
            record,
            format!(
                "{client}: {name} not acquired in session {session} (acquired {})",
                got.acquired
            ),
        );
        let _ = grpc(id, |mut c| async move {
            c.close_session(pb::CloseSessionRequest {
                session_id: session,
                seq: 2,
            })
            .await
        })
        .await;
        return;
    }
    record.borrow_mut().holding.insert(session, id);
    let mut h = Holding {
        client: client.into(),
        path: "KeepAlive streams",
        name: name.into(),
        session,
        fence: got.fence,
        from,
        since: from,
        lapsed: Vec::new(),
        count,
    };
    // Up to two streams, each on a connection of its own to `id`.
    let mut opened = 0u64;
    let mut streams: Vec<Stream> = vec![open_noted(record, client, id, session, &mut opened).await];
    if rng.random_bool(0.5) {
        // Across a leadership round trip: the first stream renews, the
        // leadership goes from this node to another and back (the
        // believer asks for it itself, between two renewals, as an
        // operator's planned maintenance that changed its mind), the first
        // stream renews again, a second opens and renews, and the first
        // ends.
        let mut ask = 1u64;
        let sent = now_us();
        if let Some(true) = streams[0].renew(session, ask).await {
            h.answered(sent, length, now_us());
            let others: Vec<u64> = record
                .borrow()
                .members
                .iter()
                .copied()
                .filter(|m| *m != id)
                .collect();
            if let (true, Some(to)) = (round_trip_allowed(record), others.first().copied()) {
                if round_trip(record, id, to).await {
                    note(
                        record,
                        format!("{client}: session {session}: renewing across a round trip"),
                    );
                    if rng.random_bool(0.5) {
                        // Its process dies now: the stream that renewed it
                        // in this term ends, and nothing closes it. The
                        // leader must end it a grace later (the driver
                        // checks), not at its ttl.
                        ask += 1;
                        let sent = now_us();
                        if let Some(true) = streams[0].renew(session, ask).await {
                            h.answered(sent, length, now_us());
                            drop(streams);
                            let gone = now_us();
                            note(
                                record,
                                format!(
                                    "{client}: the process of session {session} dies at {gone} us"
                                ),
                            );
                            record.borrow_mut().dead.push((session, gone, grace));
                            h.end(record, gone);
                            return;
                        }
                    }
                    streams.push(open_noted(record, client, id, session, &mut opened).await);
                    for which in [0, 1] {
                        ask += 1;
                        let sent = now_us();
                        if let Some(true) = streams[which].renew(session, ask).await {
                            h.answered(sent, length, now_us());
                        }
                    }
                    streams.remove(0);
                    note(
                        record,
                        format!("{client}: the first KeepAlive stream of session {session} ends"),
                    );
                }
            }
        }
    } else if rng.random_bool(0.6) {
        streams.push(open_noted(record, client, id, session, &mut opened).await);
    }
    let hold = rng.random_range(300..4_000) * 1_000;
    let mut ask = 0u64;
    let mut ended = None;
    while now_us() < h.from + hold && h.count.runs(now_us()) {
        // A flap: a stream ends (its connection closes) and, sometimes, a
        // new one takes its place.
        if streams.len() > 1 && rng.random_bool(0.05) {
            let gone = rng.random_range(0..streams.len());
            streams.remove(gone);
            note(
                record,
                format!("{client}: a KeepAlive stream of session {session} ends"),
            );
        } else if streams.len() < 2 && rng.random_bool(0.03) {
            streams.push(open_noted(record, client, id, session, &mut opened).await);
        }
        let which = rng.random_range(0..streams.len());
        ask += 1;
        let sent = now_us();
        match streams[which].renew(session, ask).await {
            Some(true) => h.answered(sent, length, now_us()),
            Some(false) => {
                ended = Some(now_us());
                break;
            }
            None => {
                // Not the leader any more, or the stream broke: a new
                // stream next time (at the same node; the session is
                // counted by its ttl until a stream renews it there).
                streams[which] = open_noted(record, client, id, session, &mut opened).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(grace / 3)).await;
    }
    let end = ended.unwrap_or_else(now_us);
    h.end(record, end);
    drop(streams);
    let _ = grpc(id, |mut c| async move {
        c.close_session(pb::CloseSessionRequest {
            session_id: session,
            seq: 2,
        })
        .await
    })
    .await;
}

/// One open `KeepAlive` stream: gRPC, or HTTP's newline-delimited JSON
/// (chunked HTTP/1.1 both ways, as the Go client's).
enum Stream {
    Grpc {
        asks: tokio::sync::mpsc::Sender<pb::KeepAliveRequest>,
        answers: Option<tonic::Streaming<pb::KeepAliveResponse>>,
    },
    /// The connection past the answer's head (`None`: it did not open),
    /// and what was read of the body and not yet used.
    Http {
        conn: Option<turmoil::net::TcpStream>,
        read: Vec<u8>,
    },
}

impl Stream {
    /// The `nth` stream of `session` to node `id`: over HTTP for two in
    /// five (decided from the session id, not the believer's random
    /// numbers, so that every seed's other choices stay what they were).
    async fn open(id: u64, session: u64, nth: &mut u64) -> Stream {
        *nth += 1;
        let h =
            (session ^ nth.wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_mul(0xff51_afd7_ed55_8ccd);
        if (h >> 33) % 5 < 2 {
            return Stream::open_http(id).await;
        }
        let (asks, rx) = tokio::sync::mpsc::channel(4);
        let answers = tokio::time::timeout(CALL, async {
            LocksClient::new(channel(id))
                .keep_alive(tokio_stream_from(rx))
                .await
        })
        .await
        .ok()
        .and_then(Result::ok)
        .map(tonic::Response::into_inner);
        Stream::Grpc { asks, answers }
    }

    async fn open_http(id: u64) -> Stream {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let open = async {
            let mut conn = turmoil::net::TcpStream::connect(addr(id)).await.ok()?;
            let head = format!(
                "POST /v1/locks/KeepAlive HTTP/1.1\r\nHost: {}\r\n\
                 Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n",
                addr(id)
            );
            conn.write_all(head.as_bytes()).await.ok()?;
            let mut read = Vec::new();
            let mut buf = [0u8; 1024];
            let end = loop {
                if let Some(end) = find(&read, b"\r\n\r\n") {
                    break end;
                }
                let n = conn.read(&mut buf).await.ok()?;
                if n == 0 {
                    return None;
                }
                read.extend_from_slice(&buf[..n]);
            };
            let ok = read.starts_with(b"HTTP/1.1 200");
            read.drain(..end + 4);
            ok.then_some((conn, read))
        };
        match tokio::time::timeout(CALL, open).await.ok().flatten() {
            Some((conn, read)) => Stream::Http {
                conn: Some(conn),
                read,
            },
            None => Stream::Http {
                conn: None,
                read: Vec::new(),
            },
        }
    }

    /// One renewal: `Some(true)` renewed, `Some(false)` expired, `None`
    /// no answer (the stream is then useless).
    async fn renew(&mut self, session: u64, ask: u64) -> Option<bool> {
        match self {
            Stream::Grpc { asks, answers } => {
                let answers = answers.as_mut()?;
                asks.send(pb::KeepAliveRequest {
                    session_id: session,
                    ask_id: ask,
                })
                .await
                .ok()?;
                let a = tokio::time::timeout(CALL, answers.message())
                    .await
                    .ok()?
                    .ok()??;
                (a.ask_id == ask).then_some(!a.expired)
            }
            Stream::Http { conn, read } => {
                let answer =
                    tokio::time::timeout(CALL, http_renew(conn.as_mut()?, read, session, ask))
                        .await
                        .ok()
                        .flatten();
                if answer.is_none() {
                    // Broken or late: never read from it again.
                    *conn = None;
                }
                answer
            }
        }
    }
}

/// One ask on an HTTP `KeepAlive` stream and its answer line (chunked:
/// each answer line comes in a chunk of its own).
async fn http_renew(
    conn: &mut turmoil::net::TcpStream,
    read: &mut Vec<u8>,
    session: u64,
    ask: u64,
) -> Option<bool> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let line = format!("{{\"session_id\": \"{session}\", \"ask_id\": {ask}}}\n");
    let chunk = format!("{:x}\r\n{line}\r\n", line.len());
    conn.write_all(chunk.as_bytes()).await.ok()?;
    let mut buf = [0u8; 1024];
    loop {
        // A chunk: its size line, then that many bytes and CRLF.
        if let Some(size_end) = find(read, b"\r\n") {
            let size = usize::from_str_radix(String::from_utf8_lossy(&read[..size_end]).trim(), 16)
                .ok()?;
            if size == 0 {
                return None;
            }
            if read.len() >= size_end + 2 + size + 2 {
                let body: Vec<u8> = read[size_end + 2..size_end + 2 + size].to_vec();
                read.drain(..size_end + 2 + size + 2);
                let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
                if v.get("code").is_some() {
                    return None;
                }
                return (n(&v["ask_id"]) == ask && n(&v["session_id"]) == session)
                    .then_some(v["expired"] != serde_json::Value::Bool(true));
            }
        }
        let got = conn.read(&mut buf).await.ok()?;
        if got == 0 {
            return None;
        }
        read.extend_from_slice(&buf[..got]);
    }
}

/// [`Stream::open`], noted in the trace with its kind and whether it
/// opened.
async fn open_noted(
    record: &Shared,
    client: &str,
    id: u64,
    session: u64,
    opened: &mut u64,
) -> Stream {
    let stream = Stream::open(id, session, opened).await;
    let (kind, up) = match &stream {
        Stream::Grpc { answers, .. } => ("gRPC", answers.is_some()),
        Stream::Http { conn, .. } => ("HTTP", conn.is_some()),
    };
    note(
        record,
        format!("{client}: session {session}: a {kind} KeepAlive stream to node {id} (open: {up})"),
    );
    stream
}

/// The asks of a stream as the body of a `KeepAlive` call.
fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<pb::KeepAliveRequest>,
) -> impl futures::Stream<Item = pb::KeepAliveRequest> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// `Lock`, kept alive by one-shot `KeepAlive`s (one ask, one answer, as
/// over HTTP) every third of the ttl.
pub(super) async fn one_shot_renewals(
    client: &str,
    name: &str,
    http: bool,
    rng: &mut StdRng,
    record: &Shared,
) {
    let ttl = rng.random_range(1_000..3_000);
    let path = if http {
        "Lock+KeepAlive over HTTP"
    } else {
        "Lock+KeepAlive"
    };
    let Some((mut h, id, _)) = take(client, path, name, http, ttl, 0, rng, record).await else {
        return;
    };
    let hold = rng.random_range(200..5_000) * 1_000;
    let mut ask = 0;
    let mut ended = None;
    while now_us() < h.from + hold && h.count.runs(now_us()) {
        tokio::time::sleep(Duration::from_millis(ttl / 3)).await;
        ask += 1;
        let sent = now_us();
        let session = h.session;
        let (renewed, _) = at_leader(record, rng, |id| async move {
            match keep_alive_once(id, http, session, ask).await {
                Some(renewed) => Answer::Ok(renewed),
                None => Answer::Refused(tonic::Code::Unavailable),
            }
        })
        .await;
        let renewed = match renewed {
            Answer::Ok(r) => Some(r),
            _ => None,
        };
        match renewed {
            Some(true) => h.answered(sent, ttl * 1_000, now_us()),
            Some(false) => {
                ended = Some(now_us());
                break;
            }
            None => {}
        }
    }
    let end = ended.unwrap_or_else(now_us);
    let session = h.session;
    h.end(record, end);
    unlock(id, http, session).await;
}
