//! Held etcd leases for `scale --kind sessions-held`: N leases granted,
//! then kept alive the way etcd's own Go client (`clientv3`) does it: one
//! `LeaseKeepAlive` stream for all of them, a keep-alive for each lease
//! every ttl/3. (etcd-client's Rust `keep_alive` opens a stream per lease,
//! which is not how a service holding many leases talks to etcd; the
//! stream is driven here through tonic, with the two messages it needs
//! declared below as etcd's `rpc.proto` has them.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic_prost::ProstCodec;

/// etcd's `LeaseKeepAliveRequest` (`etcdserverpb`, rpc.proto).
#[derive(Clone, PartialEq, prost::Message)]
struct LeaseKeepAliveRequest {
    /// The lease to keep alive.
    #[prost(int64, tag = "1")]
    id: i64,
}

/// etcd's `LeaseKeepAliveResponse`, without its header (field 1).
#[derive(Clone, PartialEq, prost::Message)]
struct LeaseKeepAliveResponse {
    /// The lease kept alive.
    #[prost(int64, tag = "2")]
    id: i64,
    /// Its new ttl in seconds; 0 or less: the lease has expired.
    #[prost(int64, tag = "3")]
    ttl: i64,
}

/// The held leases and their keeper.
pub struct HeldLeases {
    /// Lease ids, in grant order.
    ids: Vec<i64>,
    /// Each lease's index in `ids`.
    index: Arc<HashMap<i64, usize>>,
    /// Leases etcd answered as expired (TTL 0).
    expired: Arc<Vec<AtomicBool>>,
    /// Keep-alive answers received.
    answered: Arc<AtomicU64>,
    /// The keeper task (replaced when leases are added).
    keeper: Option<JoinHandle<()>>,
    ttl: Duration,
    endpoint: String,
}

impl HeldLeases {
    /// No leases yet; keep-alives will go to `endpoint` (host:port).
    pub fn new(endpoint: &str, ttl: Duration) -> Self {
        HeldLeases {
            ids: Vec::new(),
            index: Arc::default(),
            expired: Arc::default(),
            answered: Arc::default(),
            keeper: None,
            ttl,
            endpoint: endpoint.to_string(),
        }
    }

    /// Grants leases until `to` are held, `concurrency` grants at a time,
    /// and (re)starts the keeper for all of them.
    pub async fn grow(
        &mut self,
        client: &etcd_client::Client,
        to: usize,
        concurrency: usize,
    ) -> anyhow::Result<()> {
        let need = to.saturating_sub(self.ids.len());
        let ttl = self.ttl.as_secs().max(1) as i64;
        let next = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..concurrency.max(1) {
            let (next, mut client) = (next.clone(), client.clone());
            tasks.push(tokio::spawn(async move {
                let mut granted = Vec::new();
                while (next.fetch_add(1, Ordering::Relaxed) as usize) < need {
                    let mut tries = 0;
                    loop {
                        match client.lease_grant(ttl, None).await {
                            Ok(r) => {
                                granted.push(r.id());
                                break;
                            }
                            Err(e) if tries < 50 => {
                                tries += 1;
                                let _ = e;
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            Err(e) => return Err(anyhow::anyhow!("etcd lease grant: {e}")),
                        }
                    }
                }
                Ok(granted)
            }));
        }
        for t in tasks {
            self.ids.extend(t.await.context("grant task")??);
        }
        self.restart_keeper();
        Ok(())
    }

    /// Leases held.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Leases etcd has answered as expired.
    pub fn lost(&self) -> u64 {
        self.expired
            .iter()
            .filter(|e| e.load(Ordering::Relaxed))
            .count() as u64
    }

    /// Keep-alive answers so far.
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    fn restart_keeper(&mut self) {
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
        let mut expired: Vec<AtomicBool> = Vec::with_capacity(self.ids.len());
        for (i, _) in self.ids.iter().enumerate() {
            let was = self
                .expired
                .get(i)
                .is_some_and(|e| e.load(Ordering::Relaxed));
            expired.push(AtomicBool::new(was));
        }
        self.expired = Arc::new(expired);
        self.index = Arc::new(
            self.ids
                .iter()
                .enumerate()
                .map(|(i, id)| (*id, i))
                .collect(),
        );
        self.keeper = Some(tokio::spawn(keep(
            self.endpoint.clone(),
            self.ids.clone(),
            self.ttl,
            self.index.clone(),
            self.expired.clone(),
            self.answered.clone(),
        )));
    }
}

impl Drop for HeldLeases {
    fn drop(&mut self) {
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
    }
}

/// How finely the keeper spreads a period's keep-alives.
const SLICE: Duration = Duration::from_millis(10);

/// The keeper: one stream; every ttl/3 a keep-alive for each lease,
/// spread evenly over the period; reopened if it breaks.
async fn keep(
    endpoint: String,
    ids: Vec<i64>,
    ttl: Duration,
    index: Arc<HashMap<i64, usize>>,
    expired: Arc<Vec<AtomicBool>>,
    answered: Arc<AtomicU64>,
) {
    let period = ttl / 3;
    loop {
        let Ok(channel) = tonic::transport::Endpoint::from_shared(format!("http://{endpoint}"))
            .map(|e| e.tcp_nodelay(true).connect_lazy())
        else {
            return;
        };
        let mut grpc = tonic::client::Grpc::new(channel);
        if grpc.ready().await.is_err() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let (tx, rx) = mpsc::channel::<LeaseKeepAliveRequest>(4096);
        let codec: ProstCodec<LeaseKeepAliveRequest, LeaseKeepAliveResponse> =
            ProstCodec::default();
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(
            "/etcdserverpb.Lease/LeaseKeepAlive",
        );
        let call = grpc.streaming(tonic::Request::new(ReceiverStream::new(rx)), path, codec);
        let sender = {
            let ids = ids.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(period);
                loop {
                    tick.tick().await;
                    let start = tokio::time::Instant::now();
                    // Spread over the period, as a client's timers would
                    // be, one slice per SLICE (tokio's timers tick once a
                    // millisecond: one sleep per lease would cap the rate
                    // at ~1,000 keep-alives/s).
                    let slices = (period.as_millis() / SLICE.as_millis()).max(1) as usize;
                    let per_slice = ids.len().div_ceil(slices).max(1);
                    for (k, chunk) in ids.chunks(per_slice).enumerate() {
                        tokio::time::sleep_until(start + SLICE * k as u32).await;
                        for id in chunk {
                            if tx.send(LeaseKeepAliveRequest { id: *id }).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            })
        };
        if let Ok(resp) = call.await {
            let mut inbound = resp.into_inner();
            while let Ok(Some(r)) = inbound.message().await {
                answered.fetch_add(1, Ordering::Relaxed);
                if r.ttl <= 0 {
                    if let Some(&i) = index.get(&r.id) {
                        expired[i].store(true, Ordering::Relaxed);
                    }
                }
            }
        }
        sender.abort();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
