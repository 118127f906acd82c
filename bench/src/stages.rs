//! `run --trace-stages`: where a raftlock write's time goes, per stage.
//!
//! Every raftlockd keeps a histogram per stage of a write (see the node's
//! `metrics::stages`) and serves them at `GET /debug/stages` on its metrics
//! port. The bench empties them when its measured window starts
//! (`POST /debug/stages/reset`), reads them when it ends, and prints one
//! table: the client's own latency of a single write (a lock or a release,
//! measured around the call), then the leader's stages in the order a
//! write meets them, then the followers' (merged over every follower).
//!
//! The stages are intervals on one node's monotonic clock, so they add up
//! only roughly to the client's figure: percentiles of parts are not parts
//! of a percentile, and the client's figure also holds the gRPC transport
//! both ways (`client - server_total`).

use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::stats::{round3, Latencies};

/// One stage of one node, as the node reports it.
#[derive(Clone, Debug, Deserialize)]
struct NodeStage {
    stage: String,
    count: u64,
    buckets: Vec<(u64, u64)>,
}

/// Stages the followers report; the rest are the leader's.
const FOLLOWER_STAGES: [&str; 3] = ["follower_queue", "follower_append_sync", "follower_reply"];

/// One row of the table.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StageRow {
    /// `client` or the node's stage name.
    pub stage: String,
    /// Which side measured it: `client`, `leader` or `followers`.
    pub side: String,
    /// Samples.
    pub count: u64,
    /// Median, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
}

impl StageRow {
    fn new(stage: &str, side: &str, h: &Latencies) -> Self {
        StageRow {
            stage: stage.into(),
            side: side.into(),
            count: h.count(),
            p50_ms: round3(h.quantile_ms(0.5)),
            p99_ms: round3(h.quantile_ms(0.99)),
        }
    }
}

/// A one-shot HTTP/1.1 request to a node's metrics port; the body.
pub async fn http(addr: &str, method: &str, path: &str) -> anyhow::Result<String> {
    let connect = TcpStream::connect(addr);
    let mut conn = tokio::time::timeout(Duration::from_secs(5), connect)
        .await
        .with_context(|| format!("connect to {addr}: timed out"))?
        .with_context(|| format!("connect to {addr}"))?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    conn.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut raw))
        .await
        .with_context(|| format!("{method} {path} at {addr}: timed out"))??;
    let text = String::from_utf8(raw).context("non-UTF-8 answer")?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("no HTTP answer from {addr}"))?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!(
            "{method} {path} at {addr}: {}",
            head.lines().next().unwrap_or("")
        );
    }
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return dechunk(body);
    }
    Ok(body.to_string())
}

/// The body of a chunked HTTP answer.
fn dechunk(mut rest: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n").context("bad chunk")?;
        let size = usize::from_str_radix(size.trim(), 16).context("bad chunk size")?;
        if size == 0 {
            return Ok(out);
        }
        out.push_str(after.get(..size).context("short chunk")?);
        rest = after.get(size + 2..).context("short chunk")?;
    }
}

/// Empties the stage histograms of every node at `metrics` (host:port).
pub async fn reset(metrics: &[String]) -> anyhow::Result<()> {
    for addr in metrics {
        http(addr, "POST", "/debug/stages/reset").await?;
    }
    Ok(())
}

/// Reads every node's stages and builds the table, with `client` (one
/// write's latency as the client saw it) on top.
pub async fn collect(metrics: &[String], client: &Latencies) -> anyhow::Result<Vec<StageRow>> {
    let mut nodes = Vec::new();
    for addr in metrics {
        let body = http(addr, "GET", "/debug/stages").await?;
        let stages: Vec<NodeStage> =
            serde_json::from_str(&body).with_context(|| format!("stages of {addr}"))?;
        nodes.push(stages);
    }
    Ok(table(&nodes, client))
}

fn table(nodes: &[Vec<NodeStage>], client: &Latencies) -> Vec<StageRow> {
    let mut rows = vec![StageRow::new("client", "client", client)];
    // The leader is the node that served the writes.
    let served = |n: &Vec<NodeStage>| {
        n.iter()
            .find(|s| s.stage == "server_total")
            .map_or(0, |s| s.count)
    };
    let Some(leader) = nodes.iter().max_by_key(|n| served(n)) else {
        return rows;
    };
    for s in leader {
        if !FOLLOWER_STAGES.contains(&s.stage.as_str()) {
            rows.push(StageRow::new(&s.stage, "leader", &histogram(&[s])));
        }
    }
    for name in FOLLOWER_STAGES {
        let parts: Vec<&NodeStage> = nodes
            .iter()
            .flatten()
            .filter(|s| s.stage == name && s.count > 0)
            .collect();
        rows.push(StageRow::new(name, "followers", &histogram(&parts)));
    }
    rows
}

fn histogram(parts: &[&NodeStage]) -> Latencies {
    let pairs: Vec<[u64; 2]> = parts
        .iter()
        .flat_map(|s| s.buckets.iter().map(|&(v, n)| [v, n]))
        .collect();
    Latencies::from_pairs(&pairs)
}

/// Prints the table.
pub fn print(rows: &[StageRow]) {
    println!(
        "{:<24} {:<9} {:>9} {:>9} {:>9}",
        "stage", "side", "count", "p50 ms", "p99 ms"
    );
    for r in rows {
        println!(
            "{:<24} {:<9} {:>9} {:>9.3} {:>9.3}",
            r.stage, r.side, r.count, r.p50_ms, r.p99_ms
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(name: &str, samples: &[(u64, u64)]) -> NodeStage {
        NodeStage {
            stage: name.into(),
            count: samples.iter().map(|s| s.1).sum(),
            buckets: samples.to_vec(),
        }
    }

    #[test]
    fn the_leader_is_who_served_and_followers_are_merged() {
        let leader = vec![
            stage("server_total", &[(1000, 10)]),
            stage("leader_append_sync", &[(300, 10)]),
            stage("follower_append_sync", &[(9000, 1)]),
        ];
        let f1 = vec![
            stage("server_total", &[]),
            stage("follower_append_sync", &[(200, 5)]),
        ];
        let f2 = vec![stage("follower_append_sync", &[(400, 5)])];
        let mut client = Latencies::default();
        client.record(Duration::from_micros(1500));
        let rows = table(&[f1, leader, f2], &client);
        let row = |name: &str| rows.iter().find(|r| r.stage == name).expect(name).clone();
        assert_eq!(row("client").count, 1);
        assert_eq!(row("server_total").count, 10);
        assert_eq!(row("leader_append_sync").p50_ms, 0.3);
        // Merged over followers (and the old leader's stale one counts too).
        let f = row("follower_append_sync");
        assert_eq!(f.side, "followers");
        assert_eq!(f.count, 11);
    }

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(
            dechunk("4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n").expect("ok"),
            "Wikipedia"
        );
        assert!(dechunk("zz\r\n").is_err());
    }
}
