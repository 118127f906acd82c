//! Redis, single instance, the pattern its documentation gives for one
//! node:
//!
//! * acquire: `SET key token NX PX ttl`; if taken, poll again after a
//!   jittered exponential backoff (Redis has no queue and no notification);
//! * release: a Lua script that deletes the key only if it still holds our
//!   token (`EVALSHA`, loaded once per connection).
//!
//! There are no sessions and no fencing tokens. `semaphore` uses the usual
//! sorted-set recipe (expire old entries, `ZADD` if `ZCARD < K`, in one
//! script); `sessions` opens a new connection per cycle, the nearest thing
//! Redis has to a session.

use std::time::Duration;

use anyhow::bail;

use super::resp::{Conn, Value};
use super::{Backoff, Opts, Workload};
use crate::driver::{Ctx, Worker};

const RELEASE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
     return redis.call('del', KEYS[1]) else return 0 end";

const SEM_ACQUIRE: &str = "local t = redis.call('TIME') \
     local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
     redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now) \
     if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then \
       redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2]) return 1 end \
     return 0";

/// How this target implements each workload, for the run's note.
pub fn note(w: Workload) -> &'static str {
    match w {
        Workload::Uncontended | Workload::Contended => {
            "SET NX PX + compare-and-delete script; polling with backoff; no fencing"
        }
        Workload::Semaphore => "sorted-set semaphore script (ZCARD < K then ZADD), polling",
        Workload::Oneshot => "SET NX PX + compare-and-delete script per cycle",
        Workload::Sessions => "no sessions: new connection + SET NX PX + release per cycle",
        Workload::Multi => "no multi-lock: 4 SET NX PX in sorted order (polling), then 4 releases",
    }
}

/// Loaded script hashes of one connection.
struct Scripts {
    release: String,
    sem_acquire: String,
}

async fn load(conn: &mut Conn) -> anyhow::Result<Scripts> {
    let sha = |v: Value| match v {
        Value::Bulk(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
        other => bail!("SCRIPT LOAD answered {other:?}"),
    };
    let release = sha(conn.call(&[b"SCRIPT", b"LOAD", RELEASE.as_bytes()]).await?)?;
    let sem_acquire = sha(conn
        .call(&[b"SCRIPT", b"LOAD", SEM_ACQUIRE.as_bytes()])
        .await?)?;
    Ok(Scripts {
        release,
        sem_acquire,
    })
}

/// One simulated Redis client.
pub struct RedisWorker {
    opts: Opts,
    id: usize,
    i: u64,
    conn: Option<Conn>,
    scripts: Scripts,
    ttl_ms: String,
}

impl RedisWorker {
    /// Connects and loads the scripts.
    pub async fn new(opts: &Opts, id: usize) -> anyhow::Result<Self> {
        let addr = opts
            .endpoints
            .first()
            .ok_or_else(|| anyhow::anyhow!("redis needs an endpoint"))?;
        let mut conn = Conn::connect(addr).await?;
        let scripts = load(&mut conn).await?;
        Ok(RedisWorker {
            opts: opts.clone(),
            id,
            i: 0,
            conn: Some(conn),
            scripts,
            ttl_ms: opts.ttl.as_millis().to_string(),
        })
    }

    async fn conn(&mut self) -> anyhow::Result<&mut Conn> {
        if self.conn.is_none() {
            self.conn = Some(Conn::connect(&self.opts.endpoints[0]).await?);
        }
        Ok(self.conn.as_mut().expect("just connected"))
    }

    /// `SET NX PX` until it succeeds.
    async fn lock(
        conn: &mut Conn,
        key: &str,
        token: &str,
        ttl_ms: &str,
        mut backoff: Backoff,
    ) -> anyhow::Result<()> {
        loop {
            let r = conn
                .call(&[
                    b"SET",
                    key.as_bytes(),
                    token.as_bytes(),
                    b"NX",
                    b"PX",
                    ttl_ms.as_bytes(),
                ])
                .await?;
            match r {
                Value::Status(s) if s == "OK" => return Ok(()),
                Value::Nil => backoff.wait().await,
                other => bail!("SET NX answered {other:?}"),
            }
        }
    }

    async fn unlock(conn: &mut Conn, sha: &str, key: &str, token: &str) -> anyhow::Result<()> {
        match conn
            .call(&[
                b"EVALSHA",
                sha.as_bytes(),
                b"1",
                key.as_bytes(),
                token.as_bytes(),
            ])
            .await?
        {
            Value::Int(1) => Ok(()),
            // Our key expired and maybe someone else holds it now: the
            // hazard of a ttl lock without fencing. Counted as an error.
            Value::Int(_) => bail!("released a lock that had expired ({key})"),
            other => bail!("release answered {other:?}"),
        }
    }

    async fn cycle_inner(&mut self, ctx: &Ctx) -> anyhow::Result<Option<Duration>> {
        let key = self.opts.name(self.id, self.i, ':');
        self.i += 1;
        let token = format!("{}-{}-{}", self.id, self.i, rand::random::<u32>());
        let backoff = Backoff::new(self.opts.poll_backoff);
        let ttl_ms = self.ttl_ms.clone();
        let release = self.scripts.release.clone();
        match self.opts.workload {
            Workload::Uncontended | Workload::Contended | Workload::Oneshot => {
                let conn = self.conn().await?;
                Self::lock(conn, &key, &token, &ttl_ms, backoff).await?;
                let handoff = ctx.granted();
                ctx.releasing();
                Self::unlock(conn, &release, &key, &token).await?;
                Ok(handoff)
            }
            Workload::Multi => {
                let keys = self.opts.multi_names(':');
                let poll = self.opts.poll_backoff;
                let conn = self.conn().await?;
                let mut held = Vec::with_capacity(keys.len());
                for key in &keys {
                    let backoff = Backoff::new(poll);
                    if let Err(e) = Self::lock(conn, key, &token, &ttl_ms, backoff).await {
                        for k in held {
                            let _ = Self::unlock(conn, &release, k, &token).await;
                        }
                        return Err(e);
                    }
                    held.push(key);
                }
                let handoff = ctx.granted();
                ctx.releasing();
                for k in held {
                    Self::unlock(conn, &release, k, &token).await?;
                }
                Ok(handoff)
            }
            Workload::Semaphore => {
                let sha = self.scripts.sem_acquire.clone();
                let cap = self.opts.capacity.to_string();
                let conn = self.conn().await?;
                let mut backoff = backoff;
                loop {
                    let r = conn
                        .call(&[
                            b"EVALSHA",
                            sha.as_bytes(),
                            b"1",
                            key.as_bytes(),
                            cap.as_bytes(),
                            token.as_bytes(),
                            ttl_ms.as_bytes(),
                        ])
                        .await?;
                    match r {
                        Value::Int(1) => break,
                        Value::Int(0) => backoff.wait().await,
                        other => bail!("semaphore script answered {other:?}"),
                    }
                }
                ctx.granted();
                conn.call(&[b"ZREM", key.as_bytes(), token.as_bytes()])
                    .await?;
                Ok(None)
            }
            Workload::Sessions => {
                let mut conn = Conn::connect(&self.opts.endpoints[0]).await?;
                Self::lock(&mut conn, &key, &token, &ttl_ms, backoff).await?;
                ctx.granted();
                Self::unlock(&mut conn, &release, &key, &token).await?;
                Ok(None)
            }
        }
    }
}

impl Worker for RedisWorker {
    async fn cycle(&mut self, ctx: &Ctx) -> anyhow::Result<Option<Duration>> {
        let r = self.cycle_inner(ctx).await;
        if r.is_err() {
            // The connection may be in the middle of a reply: start afresh.
            self.conn = None;
        }
        r
    }

    async fn finish(self) {}
}
