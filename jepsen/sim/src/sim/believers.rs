//! Clients that drive every path of the lease rule (docs/concepts/sessions-and-leases.md, "The lease
//! rule") and record what they believe, for the belief oracle
//! (`crate::belief`).
//!
//! Each believer speaks the `Locks` protocol itself, over gRPC or
//! HTTP/JSON, and keeps its lease count exactly as the duties say, with no
//! margin (clocks agree in the simulation, and the rule holds with any
//! margin of at least 0): a zero margin makes every count as long as the
//! rule allows, so a leader that ends a lease early is caught. Paths:
//!
//! * a one-call `Lock`, then a `SetSessionTtl` sent just before the count
//!   runs out (over gRPC or HTTP);
//! * a one-call `Lock` retried with its nonce while held (gRPC or HTTP);
//! * a session that ends with its process, kept alive on one or two
//!   `KeepAlive` streams (gRPC, or HTTP's newline-delimited JSON), one of
//!   which may end (a flap) while the other
//!   goes on, across the operator's leadership round trips;
//! * a session kept alive by one-shot `KeepAlive`s (HTTP's way);
//!
//! and besides them an operator who moves the leadership away and back
//! (`TransferLeader`), and one who revokes believers' sessions.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::RngExt as _;

use raftlock_proto::v1 as pb;
use raftlock_proto::v1::cluster_client::ClusterClient;
use raftlock_proto::v1::locks_client::LocksClient;

use super::clients::until_ready;
use super::host::channel;
use super::{addr, note, now_ms, Shared};
use crate::belief::{counted_length_us, Belief, Count, Held};

mod keep_alive;
mod one_call;

use keep_alive::{one_shot_renewals, streams};
use one_call::{ghost, lock_retry, ttl_change};

/// The names believers contend for.
pub(super) const NAMES: [&str; 2] = ["B0", "B1"];

/// How long one call may take before the believer gives up on it (its
/// outcome unknown: it counts nothing from it).
const CALL: Duration = Duration::from_millis(600);

/// Simulated microseconds since the start.
pub(super) fn now_us() -> u64 {
    turmoil::sim_elapsed().map_or_else(|| now_ms() * 1_000, |d| d.as_micros() as u64)
}

/// What a believer saw of one call.
enum Answer<T> {
    /// Answered.
    Ok(T),
    /// Refused with this gRPC code (the request changed nothing, or its
    /// outcome is known from the code).
    Refused(tonic::Code),
    /// No answer in time, or the connection failed: outcome unknown.
    Unknown,
}

/// The node the believer asks first: the leader the driver saw last, else
/// a member.
fn target(record: &Shared, rng: &mut StdRng) -> u64 {
    let r = record.borrow();
    match r.leader.filter(|l| r.members.contains(l)) {
        Some(l) if rng.random_bool(0.9) => l,
        _ => r.members[rng.random_range(0..r.members.len())],
    }
}

/// `call` at the node that leads: the driver's leader first, then every
/// other member, as a client follows "not the leader" answers. The
/// answer, and the node that gave it.
async fn at_leader<T, F, Fut>(record: &Shared, rng: &mut StdRng, call: F) -> (Answer<T>, u64)
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = Answer<T>>,
{
    let first = target(record, rng);
    let mut ids = vec![first];
    ids.extend(
        record
            .borrow()
            .members
            .iter()
            .copied()
            .filter(|m| *m != first),
    );
    let mut last = (Answer::Unknown, first);
    for id in ids {
        match call(id).await {
            Answer::Refused(tonic::Code::Unavailable) => {
                last = (Answer::Refused(tonic::Code::Unavailable), id);
            }
            answer => return (answer, id),
        }
    }
    last
}

/// One unary call at `id` with `f`, within [`CALL`].
async fn grpc<T, F, Fut>(id: u64, f: F) -> Answer<T>
where
    F: FnOnce(LocksClient<tonic::transport::Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    grpc_within(CALL, id, f).await
}

/// One unary call at `id` with `f`, within `patience`.
async fn grpc_within<T, F, Fut>(patience: Duration, id: u64, f: F) -> Answer<T>
where
    F: FnOnce(LocksClient<tonic::transport::Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    match tokio::time::timeout(patience, f(LocksClient::new(channel(id)))).await {
        Ok(Ok(r)) => Answer::Ok(r.into_inner()),
        Ok(Err(s))
            if s.code() == tonic::Code::Unavailable
                && s.metadata().get("raftlock-not-leader").is_some() =>
        {
            Answer::Refused(tonic::Code::Unavailable)
        }
        Ok(Err(s))
            if matches!(
                s.code(),
                tonic::Code::NotFound
                    | tonic::Code::InvalidArgument
                    | tonic::Code::FailedPrecondition
                    | tonic::Code::ResourceExhausted
                    | tonic::Code::Aborted
            ) =>
        {
            Answer::Refused(s.code())
        }
        _ => Answer::Unknown,
    }
}

/// One HTTP/1.1 `POST /v1/locks/{rpc}` at node `id` with a JSON body, on a
/// connection of its own (as curl or a PHP client does it), within
/// [`CALL`]: the status and the JSON answer.
async fn http_post(
    id: u64,
    rpc: &str,
    body: serde_json::Value,
) -> Option<(u16, serde_json::Value)> {
    http_post_within(CALL, id, rpc, body).await
}

/// As [`http_post`], within `patience`.
async fn http_post_within(
    patience: Duration,
    id: u64,
    rpc: &str,
    body: serde_json::Value,
) -> Option<(u16, serde_json::Value)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let exchange = async {
        let mut conn = turmoil::net::TcpStream::connect(addr(id)).await.ok()?;
        let body = body.to_string();
        let req = format!(
            "POST /v1/locks/{rpc} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            addr(id),
            body.len()
        );
        conn.write_all(req.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = conn.read(&mut buf).await.ok()?;
            if n == 0 {
                break;
            }
            raw.extend_from_slice(&buf[..n]);
            if let Some(head_end) = find(&raw, b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok());
                if length.is_some_and(|len| raw.len() >= head_end + 4 + len) {
                    break;
                }
            }
        }
        let text = String::from_utf8_lossy(&raw).into_owned();
        let status = text.split(' ').nth(1)?.parse().ok()?;
        let json = serde_json::from_str(text.split_once("\r\n\r\n")?.1).ok()?;
        Some((status, json))
    };
    tokio::time::timeout(patience, exchange)
        .await
        .ok()
        .flatten()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A JSON 64-bit integer (proto3 JSON writes them as strings).
fn n(v: &serde_json::Value) -> u64 {
    match v {
        serde_json::Value::String(s) => s.parse().unwrap_or(0),
        serde_json::Value::Number(n) => n.as_u64().unwrap_or(0),
        _ => 0,
    }
}

/// The gRPC code grpc-gateway's HTTP status stands for (the ones a
/// believer tells apart).
fn code_of(status: u16, body: &serde_json::Value) -> Option<tonic::Code> {
    match (status, body["code"].as_str()) {
        (404, _) => Some(tonic::Code::NotFound),
        (503, _)
            if body.get("leader").is_some()
                || body["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("not the leader")) =>
        {
            Some(tonic::Code::Unavailable)
        }
        (400, Some("INVALID_ARGUMENT" | "FAILED_PRECONDITION")) => {
            Some(tonic::Code::FailedPrecondition)
        }
        (429, _) => Some(tonic::Code::ResourceExhausted),
        _ => None,
    }
}

/// A one-call `Lock`, over gRPC or HTTP.
async fn lock(id: u64, http: bool, req: pb::LockRequest) -> Answer<pb::LockResponse> {
    lock_within(CALL, id, http, req).await
}

/// A one-call `Lock`, over gRPC or HTTP, within `patience`.
async fn lock_within(
    patience: Duration,
    id: u64,
    http: bool,
    req: pb::LockRequest,
) -> Answer<pb::LockResponse> {
    if !http {
        return grpc_within(patience, id, |mut c| async move { c.lock(req).await }).await;
    }
    let body = serde_json::json!({
        "name": req.name, "ttl_ms": req.ttl_ms, "timeout_ms": req.timeout_ms,
        "nonce": req.nonce.to_string(), "end_on_disconnect_ms": req.end_on_disconnect_ms,
    });
    match http_post_within(patience, id, "Lock", body).await {
        Some((200, a)) => Answer::Ok(pb::LockResponse {
            acquired: a["acquired"].as_bool().unwrap_or(false),
            fence: n(&a["fence"]),
            session_id: n(&a["session_id"]),
            ttl_ms: n(&a["ttl_ms"]),
            next_seq: n(&a["next_seq"]),
        }),
        Some((status, a)) => code_of(status, &a).map_or(Answer::Unknown, Answer::Refused),
        None => Answer::Unknown,
    }
}

/// `SetSessionTtl`, over gRPC or HTTP.
async fn set_ttl(id: u64, http: bool, req: pb::SetSessionTtlRequest) -> Answer<u64> {
    if !http {
        return match grpc(id, |mut c| async move { c.set_session_ttl(req).await }).await {
            Answer::Ok(r) => Answer::Ok(r.ttl_ms),
            Answer::Refused(c) => Answer::Refused(c),
            Answer::Unknown => Answer::Unknown,
        };
    }
    let body = serde_json::json!({
        "session_id": req.session_id.to_string(), "seq": req.seq, "ttl_ms": req.ttl_ms,
    });
    match http_post(id, "SetSessionTtl", body).await {
        Some((200, a)) => Answer::Ok(n(&a["ttl_ms"])),
        Some((status, a)) => code_of(status, &a).map_or(Answer::Unknown, Answer::Refused),
        None => Answer::Unknown,
    }
}

/// A one-shot `KeepAlive` (HTTP's way, or a one-message gRPC stream):
/// `Some(true)` renewed, `Some(false)` expired, `None` unknown.
async fn keep_alive_once(id: u64, http: bool, session: u64, ask: u64) -> Option<bool> {
    if http {
        let body = serde_json::json!({"session_id": session.to_string(), "ask_id": ask});
        return match http_post(id, "KeepAlive", body).await {
            Some((200, a)) if n(&a["ask_id"]) == ask => {
                Some(!a["expired"].as_bool().unwrap_or(false))
            }
            _ => None,
        };
    }
    let req = pb::KeepAliveRequest {
        session_id: session,
        ask_id: ask,
    };
    let answer = tokio::time::timeout(CALL, async {
        let mut c = LocksClient::new(channel(id));
        let mut answers = c
            .keep_alive(futures::stream::iter([req]))
            .await?
            .into_inner();
        answers.message().await
    })
    .await;
    match answer {
        Ok(Ok(Some(a))) if a.ask_id == ask && a.session_id == session => Some(!a.expired),
        _ => None,
    }
}

/// `Unlock` (gRPC or HTTP); the answer does not matter to the belief
/// (it ended when this was sent).
async fn unlock(id: u64, http: bool, session: u64) {
    if http {
        let _ = http_post(
            id,
            "Unlock",
            serde_json::json!({"session_id": session.to_string()}),
        )
        .await;
    } else {
        let _ = grpc(id, |mut c| async move {
            c.unlock(pb::UnlockRequest {
                session_id: session,
            })
            .await
        })
        .await;
    }
}

/// One believer's record of a grant it holds.
struct Holding {
    client: String,
    path: &'static str,
    name: String,
    session: u64,
    fence: u64,
    /// When the grant was answered.
    from: u64,
    /// When the current span of belief began (the grant's answer, or an
    /// answer that restored a lapsed belief).
    since: u64,
    /// Spans of belief that ended when the count ran out.
    lapsed: Vec<(u64, u64)>,
    count: Count,
}

impl Holding {
    /// A lease-starting answer, arriving at `now`, to a request sent at
    /// `sent` for a lease of `length_us`: it extends the count, or, if the
    /// count had run out, restores the belief from `now` (the session was
    /// never ended, so nobody else held its grant meanwhile).
    fn answered(&mut self, sent: u64, length_us: u64, now: u64) {
        if self.count.runs(now) {
            self.count.answered(sent, length_us, 0.0);
        } else if sent + length_us > now {
            self.lapsed.push((self.since, self.count.until));
            self.since = now;
            self.count = Count::default();
            self.count.answered(sent, length_us, 0.0);
        }
    }

    /// The belief ends at `end` (or where the count ran out, if sooner).
    fn end(self, record: &Shared, end: u64) {
        let until = end.min(self.count.until);
        note(
            record,
            format!(
                "{}: {} believed {} fence {} (session {}) until {} us{}",
                self.client,
                self.path,
                self.name,
                self.fence,
                self.session,
                until,
                if self.lapsed.is_empty() {
                    String::new()
                } else {
                    format!(" (lapsed and restored {} times)", self.lapsed.len())
                }
            ),
        );
        let mut r = record.borrow_mut();
        r.holding.remove(&self.session);
        for (from, until) in self.lapsed.into_iter().chain([(self.since, until)]) {
            r.beliefs.push(Belief {
                client: self.client.clone(),
                path: self.path.into(),
                name: self.name.clone(),
                session: self.session,
                fence: self.fence,
                held: Held::Exclusive,
                from,
                until,
            });
        }
    }
}

/// Sleeps until `at` (simulated microseconds).
async fn sleep_until_us(at: u64) {
    let now = now_us();
    if at > now {
        tokio::time::sleep(Duration::from_micros(at - now)).await;
    }
}

/// The paths a believer drives itself (the others are the operators' and
/// the library holders').
pub(super) const RAW_PATHS: [&str; 5] = ["ttl", "retry", "streams", "renewals", "ghost"];

/// A believer: one of `paths` after another until `stop_ms`.
pub(super) async fn believer(
    n: usize,
    stop_ms: u64,
    paths: Vec<&'static str>,
    mut rng: StdRng,
    record: Shared,
) -> turmoil::Result {
    until_ready(&record).await;
    let client = format!("believer {n}");
    while now_ms() < stop_ms {
        let name = NAMES[rng.random_range(0..NAMES.len())].to_string();
        let http = rng.random_bool(0.4);
        let path = paths[rng.random_range(0..paths.len())];
        note(&record, format!("{client}: {path} on {name}"));
        match path {
            "ttl" => ttl_change(&client, &name, http, &mut rng, &record).await,
            "retry" => lock_retry(&client, &name, http, &mut rng, &record).await,
            "streams" => streams(&client, &name, &mut rng, &record).await,
            "ghost" => ghost(&client, &name, http, &mut rng, &record).await,
            _ => one_shot_renewals(&client, &name, http, &mut rng, &record).await,
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(1..40))).await;
    }
    Ok(())
}

/// A contender: takes a believer name with a one-call `Lock` as soon as
/// it can and lets go at once, over and over, so that a name a believer's
/// session loses too early is granted to someone, where the belief oracle
/// sees it.
pub(super) async fn contender(stop_ms: u64, mut rng: StdRng, record: Shared) -> turmoil::Result {
    until_ready(&record).await;
    let client = "contender";
    while now_ms() < stop_ms {
        let name = NAMES[rng.random_range(0..NAMES.len())];
        let http = rng.random_bool(0.3);
        if let Some((h, id, _)) =
            take(client, "Lock", name, http, 2_000, 0, &mut rng, &record).await
        {
            tokio::time::sleep(Duration::from_millis(rng.random_range(1..30))).await;
            let (end, session) = (now_us(), h.session);
            h.end(&record, end);
            unlock(id, http, session).await;
        } else {
            tokio::time::sleep(Duration::from_millis(rng.random_range(5..50))).await;
        }
    }
    Ok(())
}

/// The ttl of a ghost's `Lock`: the driver tells a ghost's session from
/// every other by it.
pub(super) const GHOST_TTL_MS: u64 = 29_999;

/// Takes `name` with a one-call `Lock` (waiting up to 1.5 s), counting
/// from its send; `None` if not granted.
#[allow(clippy::too_many_arguments)]
async fn take(
    client: &str,
    path: &'static str,
    name: &str,
    http: bool,
    ttl_ms: u64,
    grace_ms: u64,
    rng: &mut StdRng,
    record: &Shared,
) -> Option<(Holding, u64, u64)> {
    let nonce = rng.random::<u64>() | 1;
    let req = pb::LockRequest {
        name: name.into(),
        ttl_ms,
        timeout_ms: 1_500,
        nonce,
        end_on_disconnect_ms: grace_ms,
        ..Default::default()
    };
    let sent = now_us();
    let (answer, id) = at_leader(record, rng, |id| lock(id, http, req.clone())).await;
    let held = match answer {
        Answer::Ok(held) if held.acquired => held,
        Answer::Ok(_) => {
            note(
                record,
                format!("{client}: {path}: {name} not granted in time"),
            );
            return None;
        }
        Answer::Refused(code) => {
            note(
                record,
                format!("{client}: {path}: {name} refused at node {id}: {code:?}"),
            );
            return None;
        }
        Answer::Unknown => {
            note(
                record,
                format!("{client}: {path}: {name} at node {id}: no answer"),
            );
            return None;
        }
    };
    let mut count = Count::default();
    count.answered(sent, counted_length_us(ttl_ms, grace_ms), 0.0);
    let from = now_us();
    if !count.runs(from) {
        return None;
    }
    record.borrow_mut().holding.insert(held.session_id, id);
    Some((
        Holding {
            client: client.into(),
            path,
            name: name.into(),
            session: held.session_id,
            fence: held.fence,
            from,
            since: from,
            lapsed: Vec::new(),
            count,
        },
        id,
        nonce,
    ))
}

/// Whether the operator's round trips are part of this run.
fn round_trip_allowed(record: &Shared) -> bool {
    record.borrow().round_trips_allowed
}

/// Hands the leadership from node `from` to node `to` and back; true if
/// both transfers answered.
async fn round_trip(record: &Shared, from: u64, to: u64) -> bool {
    let ask = |at: u64, to: u64| async move {
        tokio::time::timeout(
            Duration::from_secs(3),
            ClusterClient::new(channel(at)).transfer_leader(pb::TransferLeaderRequest { to }),
        )
        .await
    };
    record.borrow_mut().transferring = true;
    let mut done = false;
    if let Ok(Ok(_)) = ask(from, to).await {
        note(record, format!("operator: leadership {from} -> {to}"));
        if let Ok(Ok(_)) = ask(to, from).await {
            note(
                record,
                format!("operator: leadership {to} -> {from} (round trip)"),
            );
            record.borrow_mut().round_trips += 1;
            done = true;
        }
    }
    record.borrow_mut().transferring = false;
    done
}

/// The operator's leadership round trips: every 1-4 s, hand the leadership
/// from the leader to another member, and back as soon as that is done
/// (planned maintenance that changed its mind): a node leads again in a
/// later term with its clients' streams still open.
pub(super) async fn transferer(stop_ms: u64, mut rng: StdRng, record: Shared) -> turmoil::Result {
    until_ready(&record).await;
    while now_ms() < stop_ms {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..4_000))).await;
        let (leader, members) = {
            let r = record.borrow();
            (r.leader, r.members.clone())
        };
        let Some(from) = leader.filter(|l| members.contains(l)) else {
            continue;
        };
        let others: Vec<u64> = members.iter().copied().filter(|m| *m != from).collect();
        if others.is_empty() {
            continue;
        }
        let to = others[rng.random_range(0..others.len())];
        round_trip(&record, from, to).await;
    }
    Ok(())
}

/// The operator revoking believers' sessions: every 1-3 s, one session a
/// believer holds a grant in now.
pub(super) async fn revoker(stop_ms: u64, mut rng: StdRng, record: Shared) -> turmoil::Result {
    until_ready(&record).await;
    while now_ms() < stop_ms {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..3_000))).await;
        let holding: Vec<u64> = record.borrow().holding.keys().copied().collect();
        if holding.is_empty() {
            continue;
        }
        let session = holding[rng.random_range(0..holding.len())];
        note(&record, format!("operator: revoke session {session}"));
        let (answer, at) = at_leader(&record, &mut rng, |at| async move {
            let asked = tokio::time::timeout(
                Duration::from_secs(10),
                ClusterClient::new(channel(at)).revoke_session(pb::RevokeSessionRequest {
                    session_id: session,
                }),
            )
            .await;
            match asked {
                Ok(Ok(r)) => Answer::Ok(r.into_inner().released),
                Ok(Err(s))
                    if s.code() == tonic::Code::Unavailable
                        && s.metadata().get("raftlock-not-leader").is_some() =>
                {
                    Answer::Refused(tonic::Code::Unavailable)
                }
                Ok(Err(s)) => Answer::Refused(s.code()),
                Err(_) => Answer::Unknown,
            }
        })
        .await;
        let said = match answer {
            Answer::Ok(released) => format!("{released} released at node {at}"),
            Answer::Refused(code) => format!("{code:?} at node {at}"),
            Answer::Unknown => "no answer".into(),
        };
        note(
            &record,
            format!("operator: revoke of session {session}: {said}"),
        );
    }
    Ok(())
}

/// Sessions believers hold grants in now, and the node they opened them
/// at (for the revoker).
pub(super) type Holdings = BTreeMap<u64, u64>;
