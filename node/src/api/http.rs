//! HTTP/JSON beside gRPC on the client port: every `Locks` RPC at
//! `POST /v1/locks/{Rpc}` and `Status`, `Members` and `RevokeSession` at
//! `POST /v1/cluster/{Rpc}`, taking and returning the proto3 JSON mapping of
//! their messages. Each route builds the same request a gRPC call would
//! (headers as metadata, the connection's TLS identity as extensions) and
//! calls the very same service method: one implementation of each request,
//! two encodings.
//!
//! * Request bodies: JSON (`Content-Type: application/json`, or none or
//!   another non-gRPC type: curl's `-d` calls JSON a form), at
//!   most the gRPC limit of the service (64 KiB for `Locks`); an empty body
//!   is the empty message. Field names in snake_case or lowerCamelCase;
//!   64-bit integers as numbers or strings; enums by name or number.
//! * Answers: `200` with the response message (field names as in the
//!   .proto, 64-bit integers as strings, as proto3 JSON writes them), or
//!   the gRPC status as `{"code": "INVALID_ARGUMENT", "message": "..."}`
//!   with the HTTP status grpc-gateway uses for that code. The leader hints
//!   of a "not the leader" answer come as headers (`raftlock-leader`,
//!   `raftlock-leader-id`, `raftlock-not-leader`) and as `"leader"` in the
//!   body.
//! * `KeepAlive` is one ask and one answer; `Watch` answers with
//!   newline-delimited JSON, one event per line, until the client goes
//!   away (an error ends it with one error object line).

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
pub fn router(api: Api, max_cluster_body: usize) -> Router {
    Router::new()
        .route("/v1/locks/{rpc}", post(locks))
        .route(
            "/v1/cluster/{rpc}",
            post(move |state, path, req| cluster(state, path, req, max_cluster_body)),
        )
        .route("/v1/{*rest}", any(not_found))
        .with_state(api)
}

async fn not_found(method: Method, uri: axum::http::Uri) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "NOT_FOUND",
        &format!("no route {method} {}", uri.path()),
        None,
    )
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
fn status_response(status: &Status) -> Response {
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
/// connection extensions, or the answer that refuses it.
async fn decode<T: DeserializeOwned + Default>(
    req: axum::http::Request<Body>,
    limit: usize,
) -> Result<tonic::Request<T>, Response> {
    let (parts, body) = req.into_parts();
    if !json_content(&parts.headers) {
        return Err(error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "INVALID_ARGUMENT",
            "the body must be JSON (Content-Type: application/json), not gRPC or protobuf",
            None,
        ));
    }
    let bytes: Bytes = axum::body::to_bytes(body, limit).await.map_err(|_| {
        status_response(&Status::out_of_range(format!(
            "the request body is larger than the {limit} bytes this service accepts"
        )))
    })?;
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

/// Whether the body may be read as JSON: anything but a gRPC or protobuf
/// body (curl's `-d` labels JSON as a form; it is still read as JSON).
fn json_content(headers: &HeaderMap) -> bool {
    match headers.get(header::CONTENT_TYPE) {
        None => true,
        Some(v) => v.to_str().is_ok_and(|v| {
            let t = v
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            !(t.starts_with("application/grpc") || t.contains("protobuf"))
        }),
    }
}

/// Decodes, calls `method` with the gRPC request, encodes its answer.
async fn unary<T, R, F, Fut>(req: axum::http::Request<Body>, limit: usize, method: F) -> Response
where
    T: DeserializeOwned + Default,
    R: Serialize,
    F: FnOnce(tonic::Request<T>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<R>, Status>>,
{
    let request = match decode::<T>(req, limit).await {
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
        "OpenSession" => unary(req, limit, |r| api.open_session(r)).await,
        "KeepAlive" => unary(req, limit, |r| api.keep_alive_once(r)).await,
        "CloseSession" => unary(req, limit, |r| api.close_session(r)).await,
        "Acquire" => unary(req, limit, |r| api.acquire(r)).await,
        "Release" => unary(req, limit, |r| api.release(r)).await,
        "Cancel" => unary(req, limit, |r| api.cancel(r)).await,
        "Describe" => unary(req, limit, |r| api.describe(r)).await,
        "List" => unary(req, limit, |r| api.list(r)).await,
        "CheckFence" => unary(req, limit, |r| api.check_fence(r)).await,
        "Lock" => unary(req, limit, |r| api.lock(r)).await,
        "Unlock" => unary(req, limit, |r| api.unlock(r)).await,
        "SetSessionTtl" => unary(req, limit, |r| api.set_session_ttl(r)).await,
        "Upgrade" => unary(req, limit, |r| api.upgrade(r)).await,
        "Downgrade" => unary(req, limit, |r| api.downgrade(r)).await,
        "AcquireAll" => unary(req, limit, |r| api.acquire_all(r)).await,
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
    limit: usize,
) -> Response {
    let api = &api;
    match rpc.as_str() {
        "Status" => {
            unary(req, limit, |r: tonic::Request<pb::StatusRequest>| {
                api.status(r)
            })
            .await
        }
        "Members" => {
            unary(req, limit, |r: tonic::Request<pb::MembersRequest>| {
                api.members(r)
            })
            .await
        }
        "RevokeSession" => {
            unary(req, limit, |r: tonic::Request<pb::RevokeSessionRequest>| {
                api.revoke_session(r)
            })
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

/// `Watch` as newline-delimited JSON.
async fn watch(api: &Api, req: axum::http::Request<Body>, limit: usize) -> Response {
    let request = match decode::<pb::WatchRequest>(req, limit).await {
        Ok(r) => r,
        Err(refused) => return refused,
    };
    let events = match api.watch(request).await {
        Ok(stream) => stream.into_inner(),
        Err(status) => return status_response(&status),
    };
    let lines = events.map(|item| {
        let mut line = match item {
            Ok(event) => serde_json::to_vec(&event),
            Err(status) => {
                let (_, code) = http_status(status.code());
                serde_json::to_vec(&ErrorBody {
                    code,
                    message: status.message(),
                    leader: None,
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
    fn bodies_are_json_unless_labelled_grpc_or_protobuf() {
        let mut h = HeaderMap::new();
        assert!(json_content(&h));
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        );
        assert!(json_content(&h));
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        );
        assert!(json_content(&h), "curl -d");
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        assert!(!json_content(&h));
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-protobuf"),
        );
        assert!(!json_content(&h));
    }
}
