//! raftlock through the client crate: one `Client` (and so one HTTP/2
//! connection to the leader) and one session per simulated client.

use std::time::{Duration, Instant};

use anyhow::Context;
use raftlock_client::{Client, ClientOptions, Mode, Session, SessionOptions};

use super::{Opts, Workload};
use crate::driver::{Ctx, Worker};

/// Semaphore cycles use this as their description.
pub const NOTE_SEMAPHORE: &str = "native semaphore, 1 permit per cycle";

/// A connected client.
pub async fn client(endpoints: &[String]) -> anyhow::Result<Client> {
    let options = ClientOptions {
        // A failover is part of what is measured: keep retrying through it.
        retry_deadline: Duration::from_secs(30),
        ..ClientOptions::default()
    };
    Ok(Client::with_options(endpoints.iter().cloned(), options)?)
}

/// Opens a session only its ttl ends (`end_on_disconnect` off), as every
/// figure in docs/performance/ was measured: the client's default grace
/// (0.75 s) adds a keep-alive at once after each open and one every
/// 0.25 s per session.
pub async fn session(client: &Client, ttl: Duration) -> raftlock_client::Result<Session> {
    client
        .session_with(SessionOptions {
            ttl,
            end_on_disconnect: None,
            ..SessionOptions::default()
        })
        .await
}

/// One simulated raftlock client.
pub struct RaftlockWorker {
    opts: Opts,
    id: usize,
    i: u64,
    client: Client,
    session: Option<Session>,
}

impl RaftlockWorker {
    /// Connects and (except for `sessions`) opens the client's session.
    pub async fn new(opts: &Opts, id: usize) -> anyhow::Result<Self> {
        let client = client(&opts.endpoints).await?;
        let session = match opts.workload {
            Workload::Sessions | Workload::Oneshot => None,
            _ => Some(session(&client, opts.ttl).await.context("open session")?),
        };
        Ok(RaftlockWorker {
            opts: opts.clone(),
            id,
            i: 0,
            client,
            session,
        })
    }

    async fn session(&mut self) -> anyhow::Result<Session> {
        if let Some(s) = &self.session {
            if s.is_valid() {
                return Ok(s.clone());
            }
        }
        // Lost (e.g. across a long failover): start a new one.
        let s = session(&self.client, self.opts.ttl).await?;
        self.session = Some(s.clone());
        Ok(s)
    }
}

impl Worker for RaftlockWorker {
    async fn cycle(&mut self, ctx: &Ctx) -> anyhow::Result<Option<Duration>> {
        let name = self.opts.name(self.id, self.i, '/');
        self.i += 1;
        match self.opts.workload {
            Workload::Uncontended | Workload::Contended => {
                let session = self.session().await?;
                let t0 = Instant::now();
                let guard = session.lock(&name).await?;
                let handoff = ctx.granted();
                if self.opts.workload == Workload::Uncontended {
                    // A contended lock's latency is mostly its wait.
                    ctx.write(t0.elapsed());
                }
                ctx.releasing();
                let t1 = Instant::now();
                guard.release().await?;
                ctx.write(t1.elapsed());
                Ok(handoff)
            }
            Workload::Semaphore => {
                let session = self.session().await?;
                let guard = session
                    .semaphore(&name, self.opts.capacity)
                    .acquire(1)
                    .await?;
                ctx.granted();
                guard.release().await?;
                Ok(None)
            }
            Workload::Oneshot => {
                let lock = self
                    .client
                    .lock_once(&name, self.opts.ttl, None)
                    .await?
                    .ok_or_else(|| anyhow::anyhow!("{name} not granted"))?;
                ctx.granted();
                lock.unlock().await?;
                Ok(None)
            }
            Workload::Multi => {
                let names = self.opts.multi_names('/');
                let locks: Vec<(&str, Mode)> = names
                    .iter()
                    .map(|n| (n.as_str(), Mode::Exclusive))
                    .collect();
                let session = self.session().await?;
                let guards = session.lock_all(&locks, None).await?;
                let handoff = ctx.granted();
                ctx.releasing();
                for g in guards {
                    g.release().await?;
                }
                Ok(handoff)
            }
            Workload::Sessions => {
                let session = session(&self.client, self.opts.ttl).await?;
                let guard = session.lock(&name).await?;
                ctx.granted();
                // Closing the session releases the lock with it.
                std::mem::forget(guard);
                session.close().await?;
                Ok(None)
            }
        }
    }

    async fn finish(self) {
        if let Some(s) = self.session {
            let _ = s.close().await;
        }
    }
}
