//! A minimal Redis (RESP2) client: one connection, one command at a time.
//! The lock pattern needs four commands (`SET`, `EVALSHA`, `SCRIPT LOAD`,
//! `PING`), which do not justify a client library and its dependencies.

use anyhow::{anyhow, bail, Context};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// `+OK`
    Status(String),
    /// `:1`
    Int(i64),
    /// `$n` bulk string.
    Bulk(Vec<u8>),
    /// `$-1` / `*-1`.
    Nil,
    /// `*n`
    Array(Vec<Value>),
}

/// One connection.
pub struct Conn {
    stream: BufReader<TcpStream>,
    out: Vec<u8>,
}

impl Conn {
    /// Connects to `addr` (`host:port`).
    pub async fn connect(addr: &str) -> anyhow::Result<Conn> {
        let tcp = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connect to redis at {addr}"))?;
        tcp.set_nodelay(true)?;
        Ok(Conn {
            stream: BufReader::new(tcp),
            out: Vec::with_capacity(256),
        })
    }

    /// Sends one command and reads its reply; a Redis error reply is an
    /// error.
    pub async fn call(&mut self, args: &[&[u8]]) -> anyhow::Result<Value> {
        self.out.clear();
        encode(&mut self.out, args);
        self.stream.get_mut().write_all(&self.out).await?;
        read_value(&mut self.stream).await
    }
}

/// Encodes a command as a RESP array of bulk strings.
pub fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

async fn read_line(r: &mut BufReader<TcpStream>) -> anyhow::Result<String> {
    let mut line = String::new();
    if r.read_line(&mut line).await? == 0 {
        bail!("redis closed the connection");
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

fn read_value(
    r: &mut BufReader<TcpStream>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<Value>> + Send + '_>> {
    Box::pin(async move {
        let line = read_line(r).await?;
        let (kind, rest) = line.split_at(line.len().min(1));
        match kind {
            "+" => Ok(Value::Status(rest.to_string())),
            "-" => Err(anyhow!("redis error: {rest}")),
            ":" => Ok(Value::Int(rest.parse().context("bad integer reply")?)),
            "$" => {
                let n: i64 = rest.parse().context("bad bulk length")?;
                if n < 0 {
                    return Ok(Value::Nil);
                }
                let mut buf = vec![0; n as usize + 2];
                r.read_exact(&mut buf).await?;
                buf.truncate(n as usize);
                Ok(Value::Bulk(buf))
            }
            "*" => {
                let n: i64 = rest.parse().context("bad array length")?;
                if n < 0 {
                    return Ok(Value::Nil);
                }
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(read_value(r).await?);
                }
                Ok(Value::Array(items))
            }
            _ => Err(anyhow!("unexpected reply line {line:?}")),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_encode_as_bulk_arrays() {
        let mut out = Vec::new();
        encode(&mut out, &[b"SET", b"k", b"v"]);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n");
    }
}
