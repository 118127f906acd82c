//! The operator's console: one page at `/ui` on the metrics listener, and
//! the JSON it reads.
//!
//! * `GET /ui`: the page (HTML, CSS and JavaScript compiled into the
//!   binary; no build step, nothing fetched from elsewhere). It holds no
//!   data; it reads the endpoints below with the bearer token typed into
//!   its login field (kept in the tab's `sessionStorage`).
//! * `GET /ui/api/state?prefix=P`: this node's view of the cluster, the
//!   lock table (names starting with `P`, at most [`MAX_CONSOLE_LOCKS`]),
//!   the sessions (at most [`MAX_CONSOLE_SESSIONS`]) and the latest events
//!   on names starting with `P` (of the last [`MAX_CONSOLE_EVENTS`] this
//!   node applied). Needs `read` on every name (the
//!   empty prefix) when access control is on.
//! * `POST /ui/api/revoke?session=ID`: `Cluster.RevokeSession` for the
//!   caller. Needs `admin`.
//!
//! Served by every node from what that node has applied (a follower's
//! table may lag the leader's by the entries it has not applied yet; the
//! page shows the node's role and applied index). A revoke sent to a
//! follower is refused with the leader's id and address, as the RPC is.
//!
//! "Since when" is a side table beside the state, never in `state/` and
//! never an input to a decision: this node notes its own wall-clock time
//! when it applies a grant or a queued request (and when it applies any
//! event, for the tail). After a restart, what the node re-applies from
//! its log is noted when it re-applies it; what a snapshot installed, and
//! what was live when this side table fell behind the applied events (a
//! lagged broadcast), has no time (`null`).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Serialize;

use crate::api::Api;
use crate::auth::{Permission, AUTHORIZATION};
use crate::error::Error;
use crate::raft::WatchReceiver as _;
use crate::state::{LockInfo, Mode};

mod notes;

pub use notes::{follow, Notes, TailEvent};

/// Most locks one state answer lists (the rest: `"locks_truncated": true`;
/// narrow the prefix).
pub const MAX_CONSOLE_LOCKS: usize = 500;

/// Most sessions one state answer lists.
pub const MAX_CONSOLE_SESSIONS: usize = 500;

/// Events the console keeps for its tail.
pub const MAX_CONSOLE_EVENTS: usize = 200;

/// The page.
const PAGE: &str = include_str!("index.html");

/// The value a link's `&confirm=` must carry for the page to confirm the
/// revoke it asks about (`?revoke=ID`) without a click: random per
/// process and written into the page it serves, so only the page itself
/// (same-origin) and code in the node's process (scripted checks) know it.
/// A link from another site cannot confirm a revoke in a tab that holds a
/// token.
pub fn confirm_token() -> &'static str {
    static TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TOKEN.get_or_init(|| format!("{:016x}", crate::random::next_u64()))
}

/// The console's routes, to merge into the metrics listener's router.
pub fn router(api: Api, notes: Arc<Notes>) -> Router {
    Router::new()
        .route("/ui", get(page))
        .route("/ui/", get(page))
        .route("/ui/api/state", get(state))
        .route("/ui/api/revoke", post(revoke))
        .with_state(Console { api, notes })
}

#[derive(Clone)]
struct Console {
    api: Api,
    notes: Arc<Notes>,
}

/// Milliseconds since the Unix epoch by this node's wall clock.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        PAGE.replace("__RAFTLOCK_CONFIRM_TOKEN__", confirm_token()),
    )
        .into_response()
}

/// An error as the page reads it: the HTTP status grpc-gateway uses for
/// the code, and `{"code": "...", "message": "..."}`.
fn refused(e: Error) -> Response {
    let status = tonic::Status::from(e);
    let http = match status.code() {
        tonic::Code::InvalidArgument => StatusCode::BAD_REQUEST,
        tonic::Code::NotFound => StatusCode::NOT_FOUND,
        tonic::Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        tonic::Code::PermissionDenied => StatusCode::FORBIDDEN,
        tonic::Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        tonic::Code::FailedPrecondition => StatusCode::BAD_REQUEST,
        tonic::Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let body = serde_json::json!({
        "code": grpc_name(status.code()),
        "message": status.message(),
    });
    json(http, &body)
}

/// `value` as a JSON answer with `status`.
fn json(status: StatusCode, value: &impl Serialize) -> Response {
    match serde_json::to_string(value) {
        Ok(body) => (
            status,
            [
                (header::CONTENT_TYPE, "application/json"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            body,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// The value of `key` in a URL query string (percent-decoded, `+` as a
/// space); `None` if absent or not UTF-8.
fn query_param(query: Option<&str>, key: &str) -> Option<String> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == key).then(|| percent_decode(v)).flatten()
    })
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b'%' => return None,
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

fn grpc_name(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        tonic::Code::NotFound => "NOT_FOUND",
        tonic::Code::Unauthenticated => "UNAUTHENTICATED",
        tonic::Code::PermissionDenied => "PERMISSION_DENIED",
        tonic::Code::Unavailable => "UNAVAILABLE",
        tonic::Code::FailedPrecondition => "FAILED_PRECONDITION",
        tonic::Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        _ => "INTERNAL",
    }
}

/// The caller named by the request's `Authorization` header.
fn caller(api: &Api, headers: &HeaderMap) -> Result<crate::auth::Caller, Error> {
    let mut req = tonic::Request::new(());
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        let value = value
            .to_str()
            .ok()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| Error::Unauthenticated("malformed Authorization header".into()))?;
        req.metadata_mut().insert(AUTHORIZATION, value);
    }
    Ok(api.0.auth.caller(&req)?)
}

/// The state answer.
#[derive(Serialize)]
struct StateAnswer {
    node: NodeView,
    members: Vec<MemberView>,
    locks: Vec<LockView>,
    locks_truncated: bool,
    sessions: Vec<SessionView>,
    sessions_truncated: bool,
    events: Vec<TailEvent>,
}

#[derive(Serialize)]
struct NodeView {
    id: u64,
    addr: String,
    role: &'static str,
    term: u64,
    leader_id: u64,
    leader_addr: String,
    commit_index: u64,
    applied_index: u64,
    last_log_index: u64,
    last_fence: u64,
    /// Whose clock the times on the page are: this node's wall clock.
    clock: String,
    now_unix_ms: u64,
}

#[derive(Serialize)]
struct MemberView {
    id: u64,
    addr: String,
    voter: bool,
    /// "leader", "this node", "following" (the leader heard from it within
    /// the last second), "not answering", or "unknown" (this node does
    /// not lead, so it has no record).
    health: String,
    /// As seen by the leader: the log index it knows the member has
    /// (`null` elsewhere).
    matched_index: Option<u64>,
    /// Entries the leader has that the member is not known to have.
    lag_entries: Option<u64>,
    /// Milliseconds since the member last answered the leader.
    since_contact_ms: Option<u64>,
}

#[derive(Serialize)]
struct LockView {
    name: String,
    /// "lock" or "semaphore".
    kind: &'static str,
    capacity: Option<u32>,
    lock_delayed: bool,
    holders: Vec<HolderView>,
    waiters: Vec<WaiterView>,
}

#[derive(Serialize)]
struct HolderView {
    session: u64,
    fence: u64,
    mode: &'static str,
    weight: u32,
    /// The log index of the grant.
    index: u64,
    since_unix_ms: Option<u64>,
    held_ms: Option<u64>,
}

#[derive(Serialize)]
struct WaiterView {
    position: usize,
    session: u64,
    mode: &'static str,
    weight: u32,
    since_unix_ms: Option<u64>,
    waited_ms: Option<u64>,
    /// How long the leader lets it wait (ms).
    timeout_ms: u64,
}

#[derive(Serialize)]
struct SessionView {
    id: u64,
    ttl_ms: u64,
    lock_delay_ms: u64,
    /// The identity that opened it ("" without access control).
    owner: String,
    /// As leader: ms since its lease was last restarted here (a
    /// keep-alive, its open, or this node taking the leadership).
    since_keepalive_ms: Option<u64>,
    holds: Vec<String>,
    waits: Vec<String>,
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Exclusive => "exclusive",
        Mode::Shared => "shared",
        Mode::Semaphore { .. } => "permits",
    }
}

async fn state(
    State(c): State<Console>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let prefix = query_param(query.as_deref(), "prefix").unwrap_or_default();
    let who = match caller(&c.api, &headers) {
        Ok(who) => who,
        Err(e) => return refused(e),
    };
    if let Err(e) = who.require_prefix(Permission::Read, "") {
        return refused(e.into());
    }
    let api = &c.api.0;
    let m = api.raft.metrics().borrow_watched().clone();
    let view = api.leadership.view();
    let now = now_ms();
    // Read before the table's lock is taken (no lock inside another).
    let renewed = api.shared.leases.since_renewal();
    let (locks, sessions, stats, applied_index) = api.shared.read(|applied| {
        let table = &applied.table;
        let locks = table.list(&prefix, None, MAX_CONSOLE_LOCKS + 1);
        let sessions: Vec<SessionView> = table
            .sessions()
            .take(MAX_CONSOLE_SESSIONS + 1)
            .map(|s| {
                let names = |v: Vec<&crate::state::LockName>| {
                    v.into_iter().map(|n| n.as_str().to_string()).collect()
                };
                let (holds, waits) = table
                    .session_names(s.session)
                    .map(|(h, w)| (names(h), names(w)))
                    .unwrap_or_default();
                SessionView {
                    id: s.session.0,
                    ttl_ms: s.ttl_ms,
                    lock_delay_ms: s.lock_delay_ms,
                    owner: table.session_owner(s.session).unwrap_or("").to_string(),
                    since_keepalive_ms: renewed.get(&s.session).map(|d| d.as_millis() as u64),
                    holds,
                    waits,
                }
            })
            .collect();
        (locks, sessions, table.stats(), applied.index())
    });
    let leader_addr = view
        .leader
        .and_then(|l| {
            m.membership_config
                .membership()
                .get_node(&l)
                .map(|n| n.addr.clone())
        })
        .unwrap_or_default();
    let last_log = m.last_log_index.unwrap_or(0);
    let voters: std::collections::BTreeSet<u64> =
        m.membership_config.membership().voter_ids().collect();
    let members = m
        .membership_config
        .membership()
        .nodes()
        .map(|(id, node)| {
            let matched = m
                .replication
                .as_ref()
                .and_then(|r| r.get(id).cloned())
                .map(|at| at.map_or(0, |l| l.index));
            let since_contact = m
                .heartbeat
                .as_ref()
                .and_then(|h| h.get(id).cloned().flatten())
                .map(|at| openraft::Instant::elapsed(&*at).as_millis() as u64);
            let health = if *id == api.id {
                if view.working_leader() {
                    "leader (this node)".to_string()
                } else {
                    format!("{} (this node)", view.status_role())
                }
            } else if Some(*id) == view.leader {
                "leader".to_string()
            } else if m.replication.is_none() {
                "unknown (ask the leader's console)".to_string()
            } else {
                match since_contact {
                    Some(ms) if ms <= 1_000 => "following".to_string(),
                    Some(ms) => format!("not answering for {ms} ms"),
                    None => "not answering".to_string(),
                }
            };
            MemberView {
                id: *id,
                addr: node.addr.clone(),
                voter: voters.contains(id),
                health,
                matched_index: matched.filter(|_| *id != api.id),
                lag_entries: matched
                    .filter(|_| *id != api.id)
                    .map(|at| last_log.saturating_sub(at)),
                since_contact_ms: since_contact.filter(|_| *id != api.id),
            }
        })
        .collect();

    let sessions_truncated = sessions.len() > MAX_CONSOLE_SESSIONS;
    let sessions = sessions.into_iter().take(MAX_CONSOLE_SESSIONS).collect();
    let locks_truncated = locks.len() > MAX_CONSOLE_LOCKS;
    let locks = locks
        .into_iter()
        .take(MAX_CONSOLE_LOCKS)
        .map(|l| lock_view(&c.notes, l, now))
        .collect();
    let answer = StateAnswer {
        node: NodeView {
            id: api.id,
            addr: api.addr.clone(),
            role: view.status_role(),
            term: view.term,
            leader_id: view.leader.unwrap_or(0),
            leader_addr,
            commit_index: api
                .shared
                .committed
                .load(std::sync::atomic::Ordering::Relaxed),
            applied_index,
            last_log_index: last_log,
            last_fence: stats.last_fence,
            clock: format!(
                "node {}'s wall clock (times are when node {} applied the entry)",
                api.id, api.id
            ),
            now_unix_ms: now,
        },
        members,
        locks,
        locks_truncated,
        sessions,
        sessions_truncated,
        events: c
            .notes
            .tail()
            .into_iter()
            .filter(|e| e.name.starts_with(&prefix))
            .collect(),
    };
    json(StatusCode::OK, &answer)
}

fn lock_view(notes: &Notes, l: LockInfo, now: u64) -> LockView {
    let name = l.name.as_str().to_string();
    LockView {
        kind: if l.capacity.is_some() {
            "semaphore"
        } else {
            "lock"
        },
        capacity: l.capacity,
        lock_delayed: l.lock_delayed,
        holders: l
            .holders
            .iter()
            .map(|h| {
                let since = notes.grant_since(&name, h.fence.0);
                HolderView {
                    session: h.session.0,
                    fence: h.fence.0,
                    mode: mode_name(h.mode),
                    weight: h.mode.weight(),
                    index: h.index,
                    since_unix_ms: since,
                    held_ms: since.map(|s| now.saturating_sub(s)),
                }
            })
            .collect(),
        waiters: l
            .waiters
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let since = notes.wait_since(w.session.0, &name, w.seq);
                WaiterView {
                    position: i + 1,
                    session: w.session.0,
                    mode: mode_name(w.mode),
                    weight: w.mode.weight(),
                    since_unix_ms: since,
                    waited_ms: since.map(|s| now.saturating_sub(s)),
                    timeout_ms: w.timeout_ms,
                }
            })
            .collect(),
        name,
    }
}

async fn revoke(
    State(c): State<Console>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    // The page's own `fetch` is same-origin; a page of another site (a
    // form, a "simple" request) is refused, with or without access
    // control.
    if let Some(why) = crate::api::http::cross_site(&headers, &uri) {
        return crate::api::http::cross_site_refused(&why);
    }
    let asked = query_param(query.as_deref(), "session");
    let who = match caller(&c.api, &headers) {
        Ok(who) => who,
        Err(e) => return refused(e),
    };
    if let Err(e) = who.require_admin() {
        return refused(e.into());
    }
    let Some(session) = asked.as_deref().and_then(|s| s.trim().parse::<u64>().ok()) else {
        return refused(Error::InvalidArgument(format!(
            "session must be a session id (a non-negative integer), got {:?}",
            asked.unwrap_or_default()
        )));
    };
    match c.api.revoke(session, who.identity.clone()).await {
        Ok(released) => json(
            StatusCode::OK,
            &serde_json::json!({ "session_id": session, "released": released }),
        ),
        Err(e) => refused(e),
    }
}

#[cfg(test)]
mod tests;
