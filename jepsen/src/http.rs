//! A minimal HTTP/1.1 client for the nodes' HTTP/JSON API
//! (docs/http.md): one `POST` with a JSON body on a connection of its own,
//! as curl or a PHP client sends it, and the status, the headers and the
//! JSON answer. Enough for the `leases` workload's HTTP clients; no
//! keep-alive, no TLS.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// An HTTP answer.
#[derive(Clone, Debug)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// Header names (lower case) and values.
    pub headers: Vec<(String, String)>,
    /// The body as JSON (`Null` if it was empty or not JSON).
    pub body: Value,
}

impl Answer {
    /// The first header named `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `POST path` to `addr` (`host:port`) with `body` as
/// `Content-Type: application/json` (and `Authorization: Bearer TOKEN`
/// with a token), within `within`. `Err` when no whole answer came in
/// time (the request may or may not have been acted on).
pub async fn post(
    addr: &str,
    path: &str,
    body: &Value,
    token: Option<&str>,
    within: Duration,
) -> Result<Answer, String> {
    let exchange = async {
        let mut conn = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let _ = conn.set_nodelay(true);
        conn.write_all(request(addr, path, body, token).as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut raw = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            let n = conn
                .read(&mut buf)
                .await
                .map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                break;
            }
            raw.extend_from_slice(&buf[..n]);
            if complete(&raw) {
                break;
            }
        }
        parse(&raw)
    };
    tokio::time::timeout(within, exchange)
        .await
        .map_err(|_| format!("no answer within {within:?}"))?
}

/// `POST path` with `body` as JSON (and the bearer token), on a connection
/// that closes after the answer.
fn request(addr: &str, path: &str, body: &Value, token: Option<&str>) -> String {
    let body = body.to_string();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n{auth}Connection: close\r\n\r\n{body}",
        body.len()
    )
}

/// How a [`post_until_killed`] exchange ended.
#[derive(Clone, Debug)]
pub enum Killed {
    /// The whole answer had arrived when the kill came.
    Answered(Answer),
    /// The kill came first (the connection half-closed), and the node
    /// answered all the same: it wrote the answer before it saw the
    /// connection's end.
    AnsweredAfterKill(Answer),
    /// The kill came first, and the node closed the connection (or let 5 s
    /// pass) without answering.
    Unanswered,
    /// The exchange failed before the kill (connect, write, or the node
    /// closed the connection).
    Failed(String),
}

/// `POST path` as [`post`] does, by a client process that dies when
/// `kill` fires: its connection is half-closed at once (the FIN a killed
/// process's socket sends), and whatever the node still writes is read,
/// to tell a node that answered before it saw the end (nothing a node can
/// do about that) from one that went on without answering.
pub async fn post_until_killed(
    addr: &str,
    path: &str,
    body: &Value,
    token: Option<&str>,
    kill: tokio::sync::oneshot::Receiver<()>,
) -> Killed {
    let mut conn = match tokio::net::TcpStream::connect(addr).await {
        Ok(c) => c,
        Err(e) => return Killed::Failed(format!("connect: {e}")),
    };
    let _ = conn.set_nodelay(true);
    if let Err(e) = conn
        .write_all(request(addr, path, body, token).as_bytes())
        .await
    {
        return Killed::Failed(format!("write: {e}"));
    }
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    tokio::pin!(kill);
    loop {
        tokio::select! {
            biased;
            _ = &mut kill => break,
            read = conn.read(&mut buf) => match read {
                Ok(0) => return Killed::Failed("the node closed the connection".into()),
                Ok(n) => {
                    raw.extend_from_slice(&buf[..n]);
                    if complete(&raw) {
                        return parse(&raw).map_or_else(Killed::Failed, Killed::Answered);
                    }
                }
                Err(e) => return Killed::Failed(format!("read: {e}")),
            },
        }
    }
    // Bytes already here arrived before the kill.
    while let Ok(n) = conn.try_read(&mut buf) {
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
    }
    if complete(&raw) {
        return parse(&raw).map_or_else(Killed::Failed, Killed::Answered);
    }
    let _ = conn.shutdown().await;
    let rest = async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => {
                    raw.extend_from_slice(&buf[..n]);
                    if complete(&raw) {
                        return true;
                    }
                }
            }
        }
    };
    match tokio::time::timeout(Duration::from_secs(5), rest).await {
        Ok(true) => parse(&raw).map_or(Killed::Unanswered, Killed::AnsweredAfterKill),
        _ => Killed::Unanswered,
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Whether `raw` holds a whole answer with a `Content-Length` (an answer
/// without one ends when the node closes the connection).
fn complete(raw: &[u8]) -> bool {
    let Some(head_end) = find(raw, b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
    head.lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .is_some_and(|len| raw.len() >= head_end + 4 + len)
}

/// Parses a whole HTTP/1.1 answer (a chunked body too).
fn parse(raw: &[u8]) -> Result<Answer, String> {
    let head_end = find(raw, b"\r\n\r\n").ok_or("the answer ended inside its head")?;
    let head = String::from_utf8_lossy(&raw[..head_end]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or("no status line")?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| {
            let (n, v) = l.split_once(':')?;
            Some((n.trim().to_ascii_lowercase(), v.trim().to_string()))
        })
        .collect();
    let mut body = raw[head_end + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
    if chunked {
        body = dechunk(&body).ok_or("a broken chunked body")?;
    } else if let Some(len) = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok())
    {
        if body.len() < len {
            return Err("the answer ended inside its body".into());
        }
        body.truncate(len);
    }
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    Ok(Answer {
        status,
        headers,
        body,
    })
}

fn dechunk(mut raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = find(raw, b"\r\n")?;
        let size_text = String::from_utf8_lossy(&raw[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        raw = &raw[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        if raw.len() < size + 2 {
            return None;
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

/// A JSON 64-bit integer (proto3 JSON writes them as strings): 0 if absent.
pub fn n(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_u64().unwrap_or(0),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answers_with_a_length_or_chunks_are_read_whole() {
        let raw = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
            raftlock-leader-id: 2\r\ncontent-length: 28\r\n\r\n{\"code\":\"UNAVAILABLE\",\"x\":1}";
        assert!(!complete(&raw[..raw.len() - 1]));
        assert!(complete(raw));
        let a = parse(raw).expect("parses");
        assert_eq!(a.status, 503);
        assert_eq!(a.header("raftlock-leader-id"), Some("2"));
        assert_eq!(a.body["code"], json!("UNAVAILABLE"));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
            5\r\n{\"a\":\r\n4\r\n\"7\"}\r\n0\r\n\r\n";
        let a = parse(chunked).expect("parses");
        assert_eq!(n(&a.body["a"]), 7);
        assert!(parse(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n{}").is_err());
    }
}
