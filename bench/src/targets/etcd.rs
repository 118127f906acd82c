//! etcd through its lease + lock API, i.e. what `etcdctl lock` does: a
//! lease with keep-alives stands for the session, `Lock(name, lease)` waits
//! server-side for the name and returns an ownership key, `Unlock(key)`
//! releases. Every client connects to all endpoints (as `etcdctl
//! --endpoints` does); followers forward to the leader.
//!
//! etcd has no semaphore; `semaphore` uses K slot keys taken with a
//! create-if-absent transaction bound to the lease, polling with backoff
//! when all K are taken (the usual recipe). `sessions` is one
//! `etcdctl lock` invocation: grant a lease, lock, revoke the lease (which
//! deletes the ownership key).

use std::time::Duration;

use anyhow::Context;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, LockOptions, PutOptions, Txn, TxnOp,
};
use tokio::task::JoinHandle;

use super::{Backoff, Opts, Workload};
use crate::driver::{Ctx, Worker};

/// How this target implements each workload, for the run's note.
pub fn note(w: Workload) -> &'static str {
    match w {
        Workload::Uncontended | Workload::Contended => "v3lock Lock/Unlock with a lease per client",
        Workload::Semaphore => "no native semaphore: K slot keys, create-if-absent txn, polling",
        Workload::Sessions => "lease grant + Lock + lease revoke per cycle (one `etcdctl lock`)",
        Workload::Oneshot => "lease grant + Lock (with the lease) + lease revoke per cycle",
        Workload::Multi => "no multi-lock: 4 v3lock Locks in sorted order, then 4 Unlocks",
    }
}

/// Connects to all `endpoints`.
pub async fn connect(endpoints: &[String]) -> anyhow::Result<Client> {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(Duration::from_secs(30));
    Client::connect(endpoints, Some(options))
        .await
        .context("connect to etcd")
}

/// Connects to the endpoints that accept a TCP connection now (all of
/// them if none does). etcd-client balances with tonic's power of two
/// choices, which keeps sending calls to a dead member: they fail at once,
/// so it looks the least loaded. etcd's Go client stops using a member
/// whose connection failed; a worker does the same by reconnecting after a
/// failed call.
async fn connect_live(endpoints: &[String]) -> anyhow::Result<Client> {
    let mut live = Vec::new();
    for ep in endpoints {
        let probe = tokio::net::TcpStream::connect(ep.as_str());
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(200), probe).await {
            live.push(ep.clone());
        }
    }
    connect(if live.is_empty() { endpoints } else { &live }).await
}

/// Index into `endpoints` of the current leader.
pub async fn leader_index(endpoints: &[String]) -> anyhow::Result<usize> {
    let mut leader = None;
    let mut ids = Vec::new();
    for ep in endpoints {
        let mut c = connect(std::slice::from_ref(ep)).await?;
        let s = c
            .status()
            .await
            .with_context(|| format!("status of {ep}"))?;
        leader = leader.or(Some(s.leader()).filter(|l| *l != 0));
        ids.push(s.header().map(|h| h.member_id()).unwrap_or(0));
    }
    let leader = leader.context("no etcd leader known")?;
    ids.iter()
        .position(|id| *id == leader)
        .context("the etcd leader is not among the endpoints")
}

/// A lease kept alive in the background.
struct Lease {
    id: i64,
    keeper: JoinHandle<()>,
}

async fn lease(client: &mut Client, ttl: Duration) -> anyhow::Result<Lease> {
    let ttl_s = ttl.as_secs().max(2) as i64;
    let id = client.lease_grant(ttl_s, None).await?.id();
    let mut c = client.clone();
    let keeper = tokio::spawn(async move {
        loop {
            if let Ok((mut keeper, mut stream)) = c.lease_keep_alive(id).await {
                loop {
                    if keeper.keep_alive().await.is_err() {
                        break;
                    }
                    if !matches!(stream.message().await, Ok(Some(_))) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_secs(ttl_s as u64) / 3).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    Ok(Lease { id, keeper })
}

/// One simulated etcd client.
pub struct EtcdWorker {
    opts: Opts,
    id: usize,
    i: u64,
    client: Client,
    lease: Option<Lease>,
}

impl EtcdWorker {
    /// Connects and (except for `sessions`) grants the client's lease.
    pub async fn new(opts: &Opts, id: usize) -> anyhow::Result<Self> {
        let mut client = connect(&opts.endpoints).await?;
        let lease = match opts.workload {
            Workload::Sessions | Workload::Oneshot => None,
            _ => Some(lease(&mut client, opts.ttl).await?),
        };
        Ok(EtcdWorker {
            opts: opts.clone(),
            id,
            i: 0,
            client,
            lease,
        })
    }
}

impl EtcdWorker {
    /// A failed `Lock` call may have left its ownership key queued on the
    /// server (it is created before the wait). It would block the name
    /// until the lease expires, so give it up with the lease and start a
    /// new one, as a careful client does.
    async fn drop_orphans(&mut self) {
        if let Ok(c) = connect_live(&self.opts.endpoints).await {
            self.client = c;
        }
        if let Some(old) = self.lease.take() {
            old.keeper.abort();
            // Through a failover the revoke may fail for a while; keep
            // trying (bounded), or the key would block the name until the
            // lease runs out.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            loop {
                match self.client.lease_revoke(old.id).await {
                    Ok(_) => break,
                    Err(e) if e.to_string().contains("not found") => break,
                    Err(_) if tokio::time::Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(50)).await
                    }
                    Err(_) => break,
                }
            }
        }
        match lease(&mut self.client, self.opts.ttl).await {
            Ok(l) => self.lease = Some(l),
            Err(e) => eprintln!("raftlock-bench: etcd lease grant failed: {e:#}"),
        }
    }
}

impl Worker for EtcdWorker {
    async fn cycle(&mut self, ctx: &Ctx) -> anyhow::Result<Option<Duration>> {
        let name = self.opts.name(self.id, self.i, '/');
        self.i += 1;
        if self.lease.is_none()
            && !matches!(self.opts.workload, Workload::Sessions | Workload::Oneshot)
        {
            self.lease = Some(lease(&mut self.client, self.opts.ttl).await?);
        }
        let lease_id = self.lease.as_ref().map(|l| l.id).unwrap_or(0);
        match self.opts.workload {
            Workload::Multi => {
                let mut keys = Vec::with_capacity(super::MULTI_NAMES);
                for name in self.opts.multi_names('/') {
                    match self
                        .client
                        .lock(name, Some(LockOptions::new().with_lease(lease_id)))
                        .await
                    {
                        Ok(r) => keys.push(r.key().to_vec()),
                        Err(e) => {
                            // Give back what it took, and any queued key.
                            for k in keys {
                                let _ = self.client.unlock(k).await;
                            }
                            self.drop_orphans().await;
                            return Err(e.into());
                        }
                    }
                }
                let handoff = ctx.granted();
                ctx.releasing();
                for k in keys {
                    if let Err(e) = self.client.unlock(k).await {
                        self.drop_orphans().await;
                        return Err(e.into());
                    }
                }
                Ok(handoff)
            }
            Workload::Uncontended | Workload::Contended => {
                let r = match self
                    .client
                    .lock(name, Some(LockOptions::new().with_lease(lease_id)))
                    .await
                {
                    Ok(r) => r,
                    Err(e) => {
                        self.drop_orphans().await;
                        return Err(e.into());
                    }
                };
                let handoff = ctx.granted();
                ctx.releasing();
                if let Err(e) = self.client.unlock(r.key()).await {
                    // Still held: give it up with the lease.
                    self.drop_orphans().await;
                    return Err(e.into());
                }
                Ok(handoff)
            }
            Workload::Semaphore => {
                let mut backoff = Backoff::new(self.opts.poll_backoff);
                let first = rand::random_range(0..self.opts.capacity);
                let slot = 'taken: loop {
                    for k in 0..self.opts.capacity {
                        let key = format!("{name}/slot/{}", (first + k) % self.opts.capacity);
                        let txn = Txn::new()
                            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                            .and_then([TxnOp::put(
                                key.clone(),
                                self.id.to_string(),
                                Some(PutOptions::new().with_lease(lease_id)),
                            )]);
                        if self.client.txn(txn).await?.succeeded() {
                            break 'taken key;
                        }
                    }
                    backoff.wait().await;
                };
                ctx.granted();
                self.client.delete(slot, None).await?;
                Ok(None)
            }
            Workload::Sessions | Workload::Oneshot => {
                let ttl_s = self.opts.ttl.as_secs().max(2) as i64;
                let lease = self.client.lease_grant(ttl_s, None).await?.id();
                self.client
                    .lock(name, Some(LockOptions::new().with_lease(lease)))
                    .await?;
                ctx.granted();
                self.client.lease_revoke(lease).await?;
                Ok(None)
            }
        }
    }

    async fn finish(mut self) {
        if let Some(l) = self.lease.take() {
            l.keeper.abort();
            let _ = self.client.lease_revoke(l.id).await;
        }
    }
}
