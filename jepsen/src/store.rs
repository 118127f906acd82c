//! The downstream system raftlock protects: a tiny key → counter store that
//! checks fencing tokens with the client crate's
//! [`FenceChecker`](raftlock_client::fence::FenceChecker).
//!
//! It runs inside the harness on a loopback port and speaks one JSON object
//! per line:
//!
//! * `{"op":"read","key":K,"fence":F}` → `{"ok":true,"value":V}`
//! * `{"op":"write","key":K,"fence":F,"value":V}` → `{"ok":true}`
//! * either → `{"ok":false,"error":"stale fence ...","latest":L}` when a
//!   larger fence was already seen for K
//! * `{"op":"dump"}` → `{"ok":true,"values":{K:V,...}}`
//!
//! Reads are fenced too: a read registers its fence, so a holder that read
//! before it was superseded cannot write back a value computed from a stale
//! read (without that, fencing would still lose updates whenever the stale
//! holder writes first). Every write, accepted or rejected, is appended to
//! `store.jsonl` in the order the store decided it.
//!
//! `broken` skips the fence check: the test-only fault that proves the
//! checkers catch a store that trusts stale holders.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use raftlock_client::fence::FenceChecker;
use raftlock_client::Fence;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::history::Recorder;

struct StoreState {
    values: BTreeMap<String, u64>,
    log: BufWriter<File>,
}

/// The running store.
pub struct Store {
    addr: String,
    state: Arc<Mutex<StoreState>>,
    task: JoinHandle<()>,
}

struct Shared {
    state: Arc<Mutex<StoreState>>,
    fences: FenceChecker,
    broken: bool,
    clock: Recorder,
}

impl Store {
    /// Starts the store on a loopback port, logging writes to `log`.
    pub async fn start(log: &Path, broken: bool, clock: Recorder) -> anyhow::Result<Store> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let state = Arc::new(Mutex::new(StoreState {
            values: BTreeMap::new(),
            log: BufWriter::new(File::create(log)?),
        }));
        let shared = Arc::new(Shared {
            state: state.clone(),
            fences: FenceChecker::new(),
            broken,
            clock,
        });
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        if let Ok((socket, _)) = accepted {
                            conns.spawn(serve(socket, shared.clone()));
                        }
                    }
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
        });
        Ok(Store { addr, state, task })
    }

    /// The store's address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The final value of every key.
    pub fn values(&self) -> BTreeMap<String, u64> {
        self.state.lock().expect("store lock").values.clone()
    }

    /// Stops serving and flushes the log.
    pub fn stop(&self) {
        self.task.abort();
        let _ = self.state.lock().expect("store lock").log.flush();
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn serve(socket: TcpStream, shared: Arc<Shared>) {
    let _ = socket.set_nodelay(true);
    let (r, mut w) = socket.into_split();
    let mut lines = BufReader::new(r).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let reply = match serde_json::from_str::<Value>(&line) {
            Ok(req) => handle(&shared, &req),
            Err(e) => json!({"ok": false, "error": format!("bad request: {e}")}),
        };
        let mut out = reply.to_string();
        out.push('\n');
        if w.write_all(out.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn handle(shared: &Shared, req: &Value) -> Value {
    let key = req.get("key").and_then(Value::as_str).unwrap_or_default();
    let fence = req.get("fence").and_then(Value::as_u64).unwrap_or(0);
    // One lock around check + read/write + log: the check and the write it
    // guards must not interleave with another writer's.
    let mut st = shared.state.lock().expect("store lock");
    let check = if shared.broken {
        Ok(())
    } else {
        shared.fences.check(key, Fence::new(fence))
    };
    match req.get("op").and_then(Value::as_str) {
        Some("read") => match check {
            Ok(()) => json!({"ok": true, "value": st.values.get(key).copied().unwrap_or(0)}),
            Err(e) => json!({"ok": false, "error": e.to_string(), "latest": e.latest}),
        },
        Some("write") => {
            let value = req.get("value").and_then(Value::as_u64).unwrap_or(0);
            let accepted = check.is_ok();
            if accepted {
                st.values.insert(key.to_string(), value);
            }
            let entry = json!({
                "key": key,
                "fence": fence,
                "value": value,
                "accepted": accepted,
                "time_ns": shared.clock.now_ns(),
            });
            let _ = writeln!(st.log, "{entry}");
            match check {
                Ok(()) => json!({"ok": true}),
                Err(e) => json!({"ok": false, "error": e.to_string(), "latest": e.latest}),
            }
        }
        Some("dump") => json!({"ok": true, "values": st.values}),
        _ => json!({"ok": false, "error": "unknown op"}),
    }
}

/// A connection to the store.
pub struct StoreClient {
    addr: String,
    conn: Option<(
        tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
        tokio::net::tcp::OwnedWriteHalf,
    )>,
}

/// What the store answered.
#[derive(Debug)]
pub enum StoreReply {
    /// Accepted (with the value, for reads).
    Ok(u64),
    /// Refused: a larger fence was seen.
    Stale {
        /// The store's largest fence for the key.
        latest: u64,
    },
    /// No answer in time, or the connection broke: unknown outcome.
    Unknown(String),
}

impl StoreClient {
    /// A client of the store at `addr` (connects on first use).
    pub fn new(addr: &str) -> StoreClient {
        StoreClient {
            addr: addr.to_string(),
            conn: None,
        }
    }

    async fn call(&mut self, req: Value) -> StoreReply {
        let attempt = async {
            if self.conn.is_none() {
                let s = TcpStream::connect(&self.addr).await?;
                s.set_nodelay(true)?;
                let (r, w) = s.into_split();
                self.conn = Some((BufReader::new(r).lines(), w));
            }
            let (lines, w) = self.conn.as_mut().expect("connected");
            let mut out = req.to_string();
            out.push('\n');
            w.write_all(out.as_bytes()).await?;
            let line = lines
                .next_line()
                .await?
                .ok_or_else(|| std::io::Error::other("store closed the connection"))?;
            Ok::<Value, std::io::Error>(serde_json::from_str(&line)?)
        };
        match tokio::time::timeout(Duration::from_secs(5), attempt).await {
            Ok(Ok(v)) => {
                if v.get("ok").and_then(Value::as_bool) == Some(true) {
                    StoreReply::Ok(v.get("value").and_then(Value::as_u64).unwrap_or(0))
                } else {
                    StoreReply::Stale {
                        latest: v.get("latest").and_then(Value::as_u64).unwrap_or(0),
                    }
                }
            }
            Ok(Err(e)) => {
                self.conn = None;
                StoreReply::Unknown(e.to_string())
            }
            Err(_) => {
                self.conn = None;
                StoreReply::Unknown("store did not answer within 5 s".into())
            }
        }
    }

    /// Reads `key` under `fence`.
    pub async fn read(&mut self, key: &str, fence: Fence) -> StoreReply {
        self.call(json!({"op": "read", "key": key, "fence": fence}))
            .await
    }

    /// Writes `value` to `key` under `fence`.
    pub async fn write(&mut self, key: &str, fence: Fence, value: u64) -> StoreReply {
        self.call(json!({"op": "write", "key": key, "fence": fence, "value": value}))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stale_fences_are_refused_on_reads_and_writes_and_logged() {
        let dir = tempfile::tempdir().unwrap();
        let rec = Recorder::create(&dir.path().join("h"), std::time::Instant::now()).unwrap();
        let log = dir.path().join("store.jsonl");
        let store = Store::start(&log, false, rec.clone()).await.unwrap();
        let mut c = StoreClient::new(store.addr());
        assert!(matches!(
            c.read("k", Fence::new(5)).await,
            StoreReply::Ok(0)
        ));
        assert!(matches!(
            c.write("k", Fence::new(5), 1).await,
            StoreReply::Ok(_)
        ));
        assert!(matches!(
            c.read("k", Fence::new(7)).await,
            StoreReply::Ok(1)
        ));
        assert!(matches!(
            c.write("k", Fence::new(5), 2).await,
            StoreReply::Stale { latest: 7 }
        ));
        assert!(matches!(
            c.read("k", Fence::new(6)).await,
            StoreReply::Stale { .. }
        ));
        assert_eq!(store.values().get("k"), Some(&1));
        store.stop();
        let text = std::fs::read_to_string(&log).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1]["accepted"], json!(false));
        assert_eq!(lines[1]["fence"], json!(5));

        // The broken store accepts the stale write.
        let broken = Store::start(&dir.path().join("b.jsonl"), true, rec)
            .await
            .unwrap();
        let mut c = StoreClient::new(broken.addr());
        assert!(matches!(
            c.write("k", Fence::new(9), 1).await,
            StoreReply::Ok(_)
        ));
        assert!(matches!(
            c.write("k", Fence::new(3), 2).await,
            StoreReply::Ok(_)
        ));
    }
}
