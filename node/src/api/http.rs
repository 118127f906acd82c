//! HTTP/JSON beside gRPC on the client port: every `Locks` RPC at
//! `POST /v1/locks/{Rpc}` and `Status`, `Members` and `RevokeSession` at
//! `POST /v1/cluster/{Rpc}`, taking and returning the proto3 JSON mapping of
//! their messages. Each route builds the same request a gRPC call would
//! (headers as metadata, the connection's TLS identity as extensions) and
//! calls the very same service method: one implementation of each request,
//! two encodings.
//!
//! * Before a byte of the body is read: a browser's cross-site request
//!   (an `Origin` that is not this node's, or `Sec-Fetch-Site` other than
//!   `same-origin` or `none`) is refused `403`, whether or not access
//!   control is on; the credentials are checked from the headers (`401`);
//!   a body that is not labelled `Content-Type: application/json` (`415`:
//!   a cross-site form or a "simple" `fetch` cannot send that label without
//!   a preflight, which the node never answers yes to), or longer than the
//!   route's messages need (64 KiB for every route), is refused.
//! * Request bodies: JSON; an empty body (no `Content-Type` needed) is the
//!   empty message. Field names in snake_case or lowerCamelCase;
//!   64-bit integers as numbers or strings; enums by name or number.
//! * Answers: `200` with the response message (field names as in the
//!   .proto, 64-bit integers as strings, as proto3 JSON writes them), or
//!   the gRPC status as `{"code": "INVALID_ARGUMENT", "message": "..."}`
//!   with the HTTP status grpc-gateway uses for that code (and `405` with
//!   `Allow: POST`, code `UNIMPLEMENTED`, for a route's path called with
//!   another method). The leader hints
//!   of a "not the leader" answer come as headers (`raftlock-leader`,
//!   `raftlock-leader-id`, `raftlock-not-leader`) and as `"leader"` in the
//!   body.
//! * `KeepAlive` with a JSON body is one ask and one answer; with a body
//!   labelled `Content-Type: application/x-ndjson` it is a stream, as the
//!   gRPC one: asks, one per line, as the client writes them, answered one
//!   line each as they are made, for as long as the request lasts, and
//!   counted by `end_on_disconnect` (see [`keep_alive_stream`]). `Watch`
//!   answers with newline-delimited JSON, one event per line, until the
//!   client goes away. An error ends either stream with one error object
//!   line.

use std::future::Future;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, post};
use axum::Router;
use futures::StreamExt;
use raftlock_proto::v1 as pb;
use raftlock_proto::v1::cluster_server::Cluster;
use raftlock_proto::v1::locks_server::Locks;
use raftlock_proto::{LEADER_ADDR_KEY, LEADER_ID_KEY, NOT_LEADER_KEY};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Code, Status};

use super::Api;

/// The media type of request and response bodies.
pub const JSON: &str = "application/json";

/// The media type of `Watch`'s streamed answer.
pub const NDJSON: &str = "application/x-ndjson";

/// The routes, to be merged beside the gRPC services.
pub fn router(api: Api) -> Router {
    Router::new()
        .route("/v1/locks/{rpc}", post(locks).fallback(not_post))
        .route("/v1/cluster/{rpc}", post(cluster).fallback(not_post))
        .route("/v1/{*rest}", any(not_found))
        .with_state(api)
}

/// Why `headers` (of a request to `uri`) look like a browser's request
/// from another site, which this node never acts on: an `Origin` other
/// than the node's own address (its `Host`, or the authority of an HTTP/2
/// request), or `Sec-Fetch-Site` other than `same-origin` or `none`.
/// Clients that are not browsers (curl, the first-party clients) send
/// neither header.
pub(crate) fn cross_site(headers: &HeaderMap, uri: &axum::http::Uri) -> Option<String> {
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = site.to_str().unwrap_or("?");
        if !matches!(site, "same-origin" | "none") {
            return Some(format!("Sec-Fetch-Site: {site}"));
        }
    }
    let origin = headers.get(header::ORIGIN)?;
    let origin = origin.to_str().unwrap_or("?");
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| uri.authority().map(|a| a.as_str()))
        .unwrap_or("");
    let same = origin
        .split_once("://")
        .is_some_and(|(_, authority)| !host.is_empty() && authority.eq_ignore_ascii_case(host));
    (!same).then(|| format!("Origin: {origin}"))
}

/// The answer refusing a cross-site request (see [`cross_site`]).
pub(crate) fn cross_site_refused(why: &str) -> Response {
    error(
        StatusCode::FORBIDDEN,
        "PERMISSION_DENIED",
        &format!(
            "a browser's cross-site request is refused ({why}): raftlock acts only on requests \
             from its own pages or from clients that are not browsers"
        ),
        None,
    )
}

async fn not_found(method: Method, uri: axum::http::Uri) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "NOT_FOUND",
        &format!("no route {method} {}", uri.path()),
        None,
    )
}

/// A route's path called with a method other than POST: 405, `Allow: POST`,
/// and the JSON error every other refusal has.
async fn not_post(method: Method, uri: axum::http::Uri) -> Response {
    let mut answer = error(
        StatusCode::METHOD_NOT_ALLOWED,
        "UNIMPLEMENTED",
        &format!("{} takes POST, not {method}", uri.path()),
        None,
    );
    answer
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    answer
}

/// The HTTP status grpc-gateway answers for `code`, and the code's name.
pub fn http_status(code: Code) -> (StatusCode, &'static str) {
    match code {
        Code::Ok => (StatusCode::OK, "OK"),
        Code::Cancelled => (
            StatusCode::from_u16(499).expect("a valid status"),
            "CANCELLED",
        ),
        Code::Unknown => (StatusCode::INTERNAL_SERVER_ERROR, "UNKNOWN"),
        Code::InvalidArgument => (StatusCode::BAD_REQUEST, "INVALID_ARGUMENT"),
        Code::DeadlineExceeded => (StatusCode::GATEWAY_TIMEOUT, "DEADLINE_EXCEEDED"),
        Code::NotFound => (StatusCode::NOT_FOUND, "NOT_FOUND"),
        Code::AlreadyExists => (StatusCode::CONFLICT, "ALREADY_EXISTS"),
        Code::PermissionDenied => (StatusCode::FORBIDDEN, "PERMISSION_DENIED"),
        Code::ResourceExhausted => (StatusCode::TOO_MANY_REQUESTS, "RESOURCE_EXHAUSTED"),
        Code::FailedPrecondition => (StatusCode::BAD_REQUEST, "FAILED_PRECONDITION"),
        Code::Aborted => (StatusCode::CONFLICT, "ABORTED"),
        Code::OutOfRange => (StatusCode::BAD_REQUEST, "OUT_OF_RANGE"),
        Code::Unimplemented => (StatusCode::NOT_IMPLEMENTED, "UNIMPLEMENTED"),
        Code::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL"),
        Code::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE"),
        Code::DataLoss => (StatusCode::INTERNAL_SERVER_ERROR, "DATA_LOSS"),
        Code::Unauthenticated => (StatusCode::UNAUTHORIZED, "UNAUTHENTICATED"),
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    code: &'a str,
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    leader: Option<&'a str>,
}

fn error(status: StatusCode, code: &str, message: &str, leader: Option<&str>) -> Response {
    let body = serde_json::to_vec(&ErrorBody {
        code,
        message,
        leader,
    })
    .expect("an error body serializes");
    (status, [(header::CONTENT_TYPE, JSON)], body).into_response()
}

/// A gRPC status as an HTTP answer, its leader hints as headers too.
pub(crate) fn status_response(status: &Status) -> Response {
    let (http, code) = http_status(status.code());
    let leader = status
        .metadata()
        .get(LEADER_ADDR_KEY)
        .and_then(|v| v.to_str().ok());
    let mut response = error(http, code, status.message(), leader);
    for key in [LEADER_ADDR_KEY, LEADER_ID_KEY, NOT_LEADER_KEY] {
        if let Some(value) = status
            .metadata()
            .get(key)
            .and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok())
        {
            response.headers_mut().insert(key, value);
        }
    }
    response
}

fn json<T: Serialize>(message: &T) -> Response {
    match serde_json::to_vec(message) {
        Ok(body) => (StatusCode::OK, [(header::CONTENT_TYPE, JSON)], body).into_response(),
        Err(e) => status_response(&Status::internal(format!("cannot encode the answer: {e}"))),
    }
}

/// The request message of `req`, as a gRPC request with its headers and
/// connection extensions, or the answer that refuses it. Everything that
/// can be decided from the head (cross-site, credentials, media type,
/// length) is, before a byte of the body is read.
async fn decode<T: DeserializeOwned + Default>(
    api: &Api,
    req: axum::http::Request<Body>,
    limit: usize,
) -> Result<tonic::Request<T>, Response> {
    let (parts, body) = req.into_parts();
    caller_from_head(api, &parts)?;
    let length = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let has_body = length.map_or_else(
        || parts.headers.contains_key(header::TRANSFER_ENCODING),
        |n| n > 0,
    );
    if !json_content(&parts.headers, has_body) {
        return Err(error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "INVALID_ARGUMENT",
            "a request body must be JSON, labelled `Content-Type: application/json`",
            None,
        ));
    }
    let too_large = || {
        status_response(&Status::out_of_range(format!(
            "the request body is larger than the {limit} bytes this service accepts"
        )))
    };
    if length.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let bytes: Bytes = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| too_large())?;
    let message = if bytes.iter().all(u8::is_ascii_whitespace) {
        T::default()
    } else {
        serde_json::from_slice(&bytes).map_err(|e| {
            status_response(&Status::invalid_argument(format!(
                "the body is not a valid JSON message of this method: {e}"
            )))
        })?
    };
    Ok(tonic::Request::from_http(axum::http::Request::from_parts(
        parts, message,
    )))
}

/// The caller of a request, from its head alone (the headers and the
/// connection's client certificate), or the answer that refuses it: a
/// browser's cross-site request, or credentials that do not hold.
// The error is the answer itself, handed straight back to axum.
#[allow(clippy::result_large_err)]
fn caller_from_head(
    api: &Api,
    parts: &axum::http::request::Parts,
) -> Result<crate::auth::Caller, Response> {
    if let Some(why) = cross_site(&parts.headers, &parts.uri) {
        return Err(cross_site_refused(&why));
    }
    let mut head = axum::http::Request::new(());
    *head.headers_mut() = parts.headers.clone();
    *head.extensions_mut() = parts.extensions.clone();
    api.caller(&tonic::Request::from_http(head))
        .map_err(|e| status_response(&Status::from(e)))
}

/// Whether the body may be read as JSON: labelled `application/json` (or
/// `+json`), or no label on an empty body.
fn json_content(headers: &HeaderMap, has_body: bool) -> bool {
    match headers.get(header::CONTENT_TYPE) {
        None => !has_body,
        Some(v) => v.to_str().is_ok_and(|v| {
            let t = v
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            t == JSON || (t.starts_with("application/") && t.ends_with("+json"))
        }),
    }
}

/// Decodes, calls `method` with the gRPC request, encodes its answer.
async fn unary<T, R, F, Fut>(
    api: &Api,
    req: axum::http::Request<Body>,
    limit: usize,
    method: F,
) -> Response
where
    T: DeserializeOwned + Default,
    R: Serialize,
    F: FnOnce(tonic::Request<T>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<R>, Status>>,
{
    let request = match decode::<T>(api, req, limit).await {
        Ok(r) => r,
        Err(refused) => return refused,
    };
    match method(request).await {
        Ok(answer) => json(answer.get_ref()),
        Err(status) => status_response(&status),
    }
}

async fn locks(
    State(api): State<Api>,
    Path(rpc): Path<String>,
    req: axum::http::Request<Body>,
) -> Response {
    let limit = crate::MAX_MESSAGE_BYTES;
    let api = &api;
    match rpc.as_str() {
        "OpenSession" => unary(api, req, limit, |r| api.open_session(r)).await,
        "KeepAlive" if is_ndjson(req.headers()) => keep_alive_stream(api, req).await,
        "KeepAlive" => unary(api, req, limit, |r| api.keep_alive_once(r)).await,
        "CloseSession" => unary(api, req, limit, |r| api.close_session(r)).await,
        "Acquire" => unary(api, req, limit, |r| api.acquire(r)).await,
        "Release" => unary(api, req, limit, |r| api.release(r)).await,
        "Cancel" => unary(api, req, limit, |r| api.cancel(r)).await,
        "Describe" => unary(api, req, limit, |r| api.describe(r)).await,
        "List" => unary(api, req, limit, |r| api.list(r)).await,
        "CheckFence" => unary(api, req, limit, |r| api.check_fence(r)).await,
        "Lock" => unary(api, req, limit, |r| api.lock(r)).await,
        "Unlock" => unary(api, req, limit, |r| api.unlock(r)).await,
        "SetSessionTtl" => unary(api, req, limit, |r| api.set_session_ttl(r)).await,
        "Upgrade" => unary(api, req, limit, |r| api.upgrade(r)).await,
        "Downgrade" => unary(api, req, limit, |r| api.downgrade(r)).await,
        "AcquireAll" => unary(api, req, limit, |r| api.acquire_all(r)).await,
        "Watch" => watch(api, req, limit).await,
        other => {
            not_found(
                Method::POST,
                format!("/v1/locks/{other}").parse().expect("a path"),
            )
            .await
        }
    }
}

async fn cluster(
    State(api): State<Api>,
    Path(rpc): Path<String>,
    req: axum::http::Request<Body>,
) -> Response {
    // None of Status, Members and RevokeSession needs more than a few
    // bytes; backups and restores are gRPC only.
    let limit = crate::MAX_MESSAGE_BYTES;
    let api = &api;
    match rpc.as_str() {
        "Status" => {
            unary(api, req, limit, |r: tonic::Request<pb::StatusRequest>| {
                api.status(r)
            })
            .await
        }
        "Members" => {
            unary(api, req, limit, |r: tonic::Request<pb::MembersRequest>| {
                api.members(r)
            })
            .await
        }
        "RevokeSession" => {
            unary(
                api,
                req,
                limit,
                |r: tonic::Request<pb::RevokeSessionRequest>| api.revoke_session(r),
            )
            .await
        }
        other => {
            not_found(
                Method::POST,
                format!("/v1/cluster/{other}").parse().expect("a path"),
            )
            .await
        }
    }
}

/// The longest line of a KeepAlive stream's request body (an ask is a few
/// dozen bytes); a longer one ends the stream with `INVALID_ARGUMENT`.
pub const MAX_KEEP_ALIVE_LINE: usize = 1024;

/// Whether the request body is labelled newline-delimited JSON.
fn is_ndjson(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .eq_ignore_ascii_case(NDJSON)
        })
}

/// `KeepAlive` as a stream: asks as newline-delimited JSON in the request
/// body, as they come, and the answers, one line each, in the response
/// body as they are made, for as long as the request lasts. It carries the
/// sessions it renews as the gRPC stream does (`end_on_disconnect`): the
/// end of the request body, or of its connection, ends it. The credentials
/// are checked from the headers before a byte of the body is read.
async fn keep_alive_stream(api: &Api, req: axum::http::Request<Body>) -> Response {
    let (parts, body) = req.into_parts();
    // Subscribed before the credentials are checked, so a reload between
    // the two is seen.
    let acl_changes = api.0.auth.changes();
    let caller = match caller_from_head(api, &parts) {
        Ok(caller) => caller,
        Err(refused) => return refused,
    };
    let asks = Box::pin(ndjson_lines(body, MAX_KEEP_ALIVE_LINE).map(|line| {
        let line = line?;
        serde_json::from_slice::<pb::KeepAliveRequest>(&line).map_err(|e| {
            Status::invalid_argument(format!("a line is not a valid KeepAliveRequest: {e}"))
        })
    }));
    ndjson_response(api.keep_alive_stream(caller, acl_changes, asks))
}

/// The non-blank lines of `body`, as they arrive: `INVALID_ARGUMENT` for a
/// line longer than `max` (and nothing after it), `CANCELLED` if the body
/// fails (its connection dropped).
fn ndjson_lines(
    body: Body,
    max: usize,
) -> impl futures::Stream<Item = Result<Bytes, Status>> + Send + 'static {
    let state = (body.into_data_stream(), Vec::<u8>::new(), false);
    futures::stream::unfold(state, move |(mut data, mut buf, done)| async move {
        if done {
            return None;
        }
        loop {
            if let Some(end) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=end).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Some((Ok(Bytes::from(line)), (data, buf, false)));
            }
            if buf.len() > max {
                let e = Status::invalid_argument(format!(
                    "a line of the request body is longer than {max} bytes"
                ));
                return Some((Err(e), (data, buf, true)));
            }
            match data.next().await {
                Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
                Some(Err(e)) => {
                    let e = Status::cancelled(format!("the request body failed: {e}"));
                    return Some((Err(e), (data, buf, true)));
                }
                None if buf.iter().all(u8::is_ascii_whitespace) => return None,
                None => {
                    let line = Bytes::from(std::mem::take(&mut buf));
                    return Some((Ok(line), (data, buf, true)));
                }
            }
        }
    })
}

/// A stream of answers as a newline-delimited JSON response: one message
/// per line; an error is the last line, as an error object.
fn ndjson_response<T: Serialize + Send + 'static>(
    answers: impl futures::Stream<Item = Result<T, Status>> + Send + 'static,
) -> Response {
    let lines = answers.map(|item| {
        let mut line = match item {
            Ok(message) => serde_json::to_vec(&message),
            Err(status) => {
                let (_, code) = http_status(status.code());
                serde_json::to_vec(&ErrorBody {
                    code,
                    message: status.message(),
                    leader: status
                        .metadata()
                        .get(LEADER_ADDR_KEY)
                        .and_then(|v| v.to_str().ok()),
                })
            }
        }
        .unwrap_or_default();
        line.push(b'\n');
        Ok::<_, std::convert::Infallible>(Bytes::from(line))
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, NDJSON)],
        Body::from_stream(lines),
    )
        .into_response()
}

/// `Watch` as newline-delimited JSON.
async fn watch(api: &Api, req: axum::http::Request<Body>, limit: usize) -> Response {
    let request = match decode::<pb::WatchRequest>(api, req, limit).await {
        Ok(r) => r,
        Err(refused) => return refused,
    };
    match api.watch(request).await {
        Ok(stream) => ndjson_response(stream.into_inner()),
        Err(status) => status_response(&status),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_grpc_gateways_status_and_its_name() {
        assert_eq!(
            http_status(Code::InvalidArgument),
            (StatusCode::BAD_REQUEST, "INVALID_ARGUMENT")
        );
        assert_eq!(
            http_status(Code::Unavailable).0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(http_status(Code::Aborted).0, StatusCode::CONFLICT);
        assert_eq!(
            http_status(Code::ResourceExhausted).0,
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(
            http_status(Code::Unauthenticated).0,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(http_status(Code::Cancelled).0.as_u16(), 499);
    }

    #[test]
    fn bodies_must_be_labelled_json() {
        let mut h = HeaderMap::new();
        assert!(json_content(&h, false), "no body, no label");
        assert!(!json_content(&h, true), "a body without a label");
        for (label, ok) in [
            ("application/json", true),
            ("application/json; charset=utf-8", true),
            ("Application/JSON", true),
            ("application/merge-patch+json", true),
            ("application/x-www-form-urlencoded", false),
            ("text/plain", false),
            ("multipart/form-data; boundary=x", false),
            ("application/grpc", false),
            ("application/x-protobuf", false),
        ] {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(label));
            assert_eq!(json_content(&h, true), ok, "{label}");
        }
    }

    #[test]
    fn cross_site_requests_are_told_apart_from_same_origin_and_non_browser_ones() {
        let uri: axum::http::Uri = "/v1/locks/Lock".parse().expect("uri");
        let mut h = HeaderMap::new();
        assert_eq!(cross_site(&h, &uri), None, "curl: no Origin");
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:7101"));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:7101"),
        );
        assert_eq!(cross_site(&h, &uri), None, "same origin");
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:9101"),
        );
        assert!(
            cross_site(&h, &uri).is_some(),
            "another port is another origin"
        );
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(cross_site(&h, &uri).is_some(), "an opaque origin");
        h.remove(header::ORIGIN);
        for (site, ok) in [
            ("same-origin", true),
            ("none", true),
            ("same-site", false),
            ("cross-site", false),
        ] {
            h.insert("sec-fetch-site", HeaderValue::from_static(site));
            assert_eq!(cross_site(&h, &uri).is_none(), ok, "{site}");
        }
        // HTTP/2: the authority instead of Host.
        let h2: axum::http::Uri = "https://node1:7101/v1/locks/Lock".parse().expect("uri");
        let mut h = HeaderMap::new();
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://node1:7101"),
        );
        assert_eq!(cross_site(&h, &h2), None);
    }
}
