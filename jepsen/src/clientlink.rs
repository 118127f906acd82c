//! Client links: with the `client-link` nemesis, one proxy (the same
//! proxy as the node links, [`crate::proxy`]) between every client worker
//! and every node, so the nemesis can stall, reset, drop or delay what a
//! worker and a node send each other, one direction or both.
//!
//! A worker is given its proxies as its endpoints, as a real client is
//! given a list of addresses; the client library then follows leader hints,
//! which name the nodes' own addresses, and its `address_map` sends those
//! through the same worker's proxies (as a client behind NAT maps the
//! addresses a cluster announces). The raw keep-alive probers dial their
//! proxies directly. The link of worker `w` to node `n` is `(worker_end(w),
//! n)` for the bytes the worker sends and `(n, worker_end(w))` for the
//! answers.

use std::collections::{BTreeMap, BTreeSet};

use tokio::sync::Mutex;

use crate::proxy::{Delay, Link, Net};

/// The client workers and probers, as link ends: worker slot `w` is
/// `WORKER_END_BASE + w`, prober `k` is `PROBER_END_BASE + k` (node ids are
/// small).
pub const WORKER_END_BASE: u64 = 1_000;
/// See [`WORKER_END_BASE`].
pub const PROBER_END_BASE: u64 = 2_000;

/// The link end of worker slot `w`.
pub fn worker_end(w: u64) -> u64 {
    WORKER_END_BASE + w
}

/// The link end of prober `k`.
pub fn prober_end(k: u64) -> u64 {
    PROBER_END_BASE + k
}

/// The node addresses of the cluster the workers use: it changes when the
/// restore nemesis moves them to a restored cluster (`gen` counts those).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterAddrs {
    /// Restores so far.
    pub gen: u64,
    /// Node id → client address.
    pub nodes: BTreeMap<u64, String>,
}

/// Every client link of the run.
#[derive(Default)]
pub struct ClientLinks {
    net: Mutex<Net>,
    /// Proxy address by (cluster generation, worker end, node).
    proxies: Mutex<BTreeMap<(u64, u64, u64), String>>,
}

impl std::fmt::Debug for ClientLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientLinks")
    }
}

impl ClientLinks {
    /// No links yet.
    pub fn new() -> ClientLinks {
        ClientLinks::default()
    }

    /// The proxies of worker end `end` to every node of `addrs` (node id →
    /// proxy address), started on first use.
    pub async fn via(
        &self,
        end: u64,
        addrs: &ClusterAddrs,
    ) -> anyhow::Result<BTreeMap<u64, String>> {
        let mut out = BTreeMap::new();
        let mut proxies = self.proxies.lock().await;
        for (&node, target) in &addrs.nodes {
            let key = (addrs.gen, end, node);
            let addr = match proxies.get(&key) {
                Some(a) => a.clone(),
                None => {
                    let a = self
                        .net
                        .lock()
                        .await
                        .add_proxy(end, node, target.clone())
                        .await?;
                    proxies.insert(key, a.clone());
                    a
                }
            };
            out.insert(node, addr);
        }
        Ok(out)
    }

    /// The worker ends that have links.
    pub async fn ends(&self) -> Vec<u64> {
        let ends: BTreeSet<u64> = self.proxies.lock().await.keys().map(|k| k.1).collect();
        ends.into_iter().collect()
    }

    /// Holds the bytes of these directions (delivered on heal); with
    /// `reset`, resets their connections first.
    pub async fn cut(&self, links: &[Link], reset: bool) {
        self.net.lock().await.cut(links, reset);
    }

    /// Throws away the bytes of these directions until healed.
    pub async fn drop_bytes(&self, links: &[Link]) {
        self.net.lock().await.drop_bytes(links);
    }

    /// Delays these directions until healed.
    pub async fn delay(&self, links: &[Link], delay: Delay) {
        self.net.lock().await.delay(links, delay);
    }

    /// Heals every client link.
    pub async fn heal(&self) {
        self.net.lock().await.heal();
    }

    /// Stops every proxy.
    pub async fn shutdown(&self) {
        self.net.lock().await.shutdown();
    }
}
