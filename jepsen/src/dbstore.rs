//! The fenced-counter workload's counters in a real store: PostgreSQL or
//! Redis (`--store postgres|redis`), every read and write through the fence
//! check a user would run (`raftlock_fenced`: `raftlock.check_fence` in the
//! transaction, or the fenced Lua script).
//!
//! Without `--store-url` the harness starts a server of its own on
//! loopback in a temporary directory (the test kit's servers: Debian's
//! packages, installed as root when missing) and stops it at the end. With
//! a URL it uses that database, and at the start resets what it owns
//! there: the schema `raftlock_jepsen` (PostgreSQL), the keys
//! `raftlock-jepsen:*` it uses (Redis), and the remembered fences of its
//! resources `raftlock-jepsen/fc/*` (a new cluster's fences start at 1).
//!
//! `store.jsonl` is written at the end, one entry per decided write, in
//! the order the store decided them per key (what the checkers need):
//!
//! * PostgreSQL: each accepted write inserts its entry into
//!   `raftlock_jepsen.decisions` inside its own transaction, after the
//!   fence check has locked the key's row, so the entry exists exactly if
//!   the write committed, and its `seq` (a sequence) follows the commit
//!   order of the key's writes.
//! * Redis: each write is `MULTI`, the fenced script, `INCR
//!   raftlock-jepsen:decisions`, `EXEC`; the number is the write's place
//!   in Redis' execution order. A write whose reply never arrived (the
//!   store did not answer within 5 s) is an unknown outcome in the
//!   history but has no entry.
//!
//! Refusals are entries with `"accepted": false`, placed by the time they
//! were answered. `--broken-store` (the demonstration only) leaves the
//! check out of reads and writes.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use raftlock_client::Fence;
use raftlock_fenced::redis::FencedRedis;
use raftlock_fenced::{postgres, Error};
use serde_json::{json, Value};

use crate::history::Recorder;
use crate::store::StoreReply;

/// Where the fenced-counter workload keeps its counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StoreKind {
    /// The harness's own in-memory store (the client crate's
    /// `FenceChecker` behind a loopback socket).
    Memory,
    /// PostgreSQL, through `raftlock.check_fence`.
    Postgres,
    /// Redis, through the fenced Lua script.
    Redis,
}

/// How long one store call may take before its outcome counts as unknown.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// The prefix of every resource (PostgreSQL) and key (Redis) the harness
/// uses in the store.
const PREFIX_PG: &str = "raftlock-jepsen/";
const PREFIX_REDIS: &str = "raftlock-jepsen:";
const REDIS_SEQ: &str = "raftlock-jepsen:decisions";

const PG_SETUP: &str = "
    DROP SCHEMA IF EXISTS raftlock_jepsen CASCADE;
    CREATE SCHEMA raftlock_jepsen;
    CREATE TABLE raftlock_jepsen.counters (key text PRIMARY KEY, value bigint NOT NULL);
    CREATE TABLE raftlock_jepsen.decisions (
        seq bigserial PRIMARY KEY,
        key text NOT NULL,
        fence bigint NOT NULL,
        value bigint NOT NULL,
        time_ns bigint NOT NULL
    );
    DELETE FROM raftlock.fences WHERE resource LIKE 'raftlock-jepsen/%';
";

enum Server {
    Postgres(raftlock_testkit::servers::Postgres),
    Redis(raftlock_testkit::servers::Redis),
}

/// A real store for one run.
pub struct DbStore {
    kind: StoreKind,
    /// PostgreSQL connection string or Redis URL.
    url: String,
    broken: bool,
    keys: usize,
    clock: Recorder,
    fenced: FencedRedis,
    /// Refused writes, as `store.jsonl` entries.
    refused: Mutex<Vec<Value>>,
    /// Accepted Redis writes with their place in Redis' order.
    accepted: Mutex<Vec<(u64, Value)>>,
    /// The server the harness started, stopped on drop.
    server: Option<Server>,
}

impl DbStore {
    /// Connects to `url`, or starts a server of its own, and resets the
    /// harness's tables or keys there.
    pub async fn start(
        kind: StoreKind,
        url: Option<&str>,
        broken: bool,
        keys: usize,
        clock: Recorder,
    ) -> anyhow::Result<Arc<DbStore>> {
        let (server, url) = match (kind, url) {
            (StoreKind::Memory, _) => anyhow::bail!("the memory store is crate::store::Store"),
            (_, Some(u)) => (None, u.to_string()),
            (StoreKind::Postgres, None) => {
                let pg = tokio::task::spawn_blocking(raftlock_testkit::servers::Postgres::start)
                    .await?
                    .map_err(|e| anyhow::anyhow!("cannot start PostgreSQL: {e}"))?;
                let url = pg.conn_str("postgres");
                (Some(Server::Postgres(pg)), url)
            }
            (StoreKind::Redis, None) => {
                let r = tokio::task::spawn_blocking(raftlock_testkit::servers::Redis::start)
                    .await?
                    .map_err(|e| anyhow::anyhow!("cannot start Redis: {e}"))?;
                let url = r.url();
                (Some(Server::Redis(r)), url)
            }
        };
        let store = DbStore {
            kind,
            url,
            broken,
            keys,
            clock,
            fenced: FencedRedis::new(),
            refused: Mutex::new(Vec::new()),
            accepted: Mutex::new(Vec::new()),
            server,
        };
        match kind {
            StoreKind::Postgres => {
                let db = store.pg().await?;
                postgres::install(&db)
                    .await
                    .context("installing raftlock_fence.sql")?;
                db.batch_execute(PG_SETUP)
                    .await
                    .context("creating raftlock_jepsen")?;
            }
            StoreKind::Redis => {
                let mut con = store.redis().await?;
                let mut del = redis::cmd("DEL");
                del.arg(REDIS_SEQ);
                for k in 0..keys {
                    let key = redis_key(&crate::workload::counter_key(k));
                    del.arg(raftlock_fenced::redis::fence_key(&key)).arg(key);
                }
                del.query_async::<()>(&mut con).await?;
                store.fenced.load(&mut con).await?;
            }
            StoreKind::Memory => unreachable!(),
        }
        Ok(Arc::new(store))
    }

    /// The server's address (and directory, if the harness started it).
    pub fn describe(&self) -> String {
        let dir = match &self.server {
            Some(Server::Postgres(p)) => format!(" (started in {})", p.dir().display()),
            Some(Server::Redis(r)) => format!(" (started in {})", r.dir().display()),
            None => String::new(),
        };
        format!("{:?} at {}{dir}", self.kind, self.url)
    }

    async fn pg(&self) -> anyhow::Result<tokio_postgres::Client> {
        let (client, conn) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .with_context(|| format!("connecting to PostgreSQL at {}", self.url))?;
        tokio::spawn(conn);
        Ok(client)
    }

    async fn redis(&self) -> anyhow::Result<redis::aio::MultiplexedConnection> {
        redis::Client::open(self.url.as_str())?
            .get_multiplexed_async_connection()
            .await
            .with_context(|| format!("connecting to Redis at {}", self.url))
    }

    fn refuse(&self, key: &str, fence: Fence, value: u64) {
        self.refused.lock().expect("store log").push(json!({
            "key": key, "fence": fence, "value": value, "accepted": false,
            "time_ns": self.clock.now_ns(),
        }));
    }

    /// The final value of every counter.
    pub async fn values(&self) -> anyhow::Result<BTreeMap<String, u64>> {
        let mut out = BTreeMap::new();
        match self.kind {
            StoreKind::Postgres => {
                let db = self.pg().await?;
                for row in db
                    .query("SELECT key, value FROM raftlock_jepsen.counters", &[])
                    .await?
                {
                    out.insert(row.get(0), row.get::<_, i64>(1) as u64);
                }
            }
            StoreKind::Redis => {
                let mut con = self.redis().await?;
                for k in 0..self.keys {
                    let key = crate::workload::counter_key(k);
                    let v: Option<u64> = redis::cmd("GET")
                        .arg(redis_key(&key))
                        .query_async(&mut con)
                        .await?;
                    if let Some(v) = v {
                        out.insert(key, v);
                    }
                }
            }
            StoreKind::Memory => unreachable!(),
        }
        Ok(out)
    }

    /// Writes `store.jsonl`: accepted writes in the store's order, refused
    /// ones placed by the time they were answered.
    pub async fn write_log(&self, path: &Path) -> anyhow::Result<()> {
        let mut accepted: Vec<(u64, Value)> = match self.kind {
            StoreKind::Postgres => self
                .pg()
                .await?
                .query(
                    "SELECT seq, key, fence, value, time_ns FROM raftlock_jepsen.decisions ORDER BY seq",
                    &[],
                )
                .await?
                .iter()
                .map(|r| {
                    let seq = r.get::<_, i64>(0) as u64;
                    (
                        seq,
                        json!({"key": r.get::<_, String>(1), "fence": r.get::<_, i64>(2),
                               "value": r.get::<_, i64>(3), "accepted": true,
                               "time_ns": r.get::<_, i64>(4), "seq": seq}),
                    )
                })
                .collect(),
            _ => self.accepted.lock().expect("store log").clone(),
        };
        accepted.sort_by_key(|(seq, _)| *seq);
        let mut refused = self.refused.lock().expect("store log").clone();
        refused.sort_by_key(|e| e["time_ns"].as_u64());
        let mut refused = refused.into_iter().peekable();
        let mut text = String::new();
        for (_, a) in accepted {
            while let Some(r) = refused.next_if(|r| r["time_ns"].as_u64() < a["time_ns"].as_u64()) {
                text.push_str(&format!("{r}\n"));
            }
            text.push_str(&format!("{a}\n"));
        }
        for r in refused {
            text.push_str(&format!("{r}\n"));
        }
        std::fs::write(path, text)?;
        Ok(())
    }
}

fn pg_resource(key: &str) -> String {
    format!("{PREFIX_PG}{key}")
}

fn redis_key(key: &str) -> String {
    format!("{PREFIX_REDIS}{key}")
}

enum Conn {
    Pg(tokio_postgres::Client),
    Redis(redis::aio::MultiplexedConnection),
}

/// One worker's connection to the store (made on first use, again after
/// an unknown outcome).
pub struct DbClient {
    store: Arc<DbStore>,
    conn: Option<Conn>,
}

impl DbClient {
    /// A client of `store`.
    pub fn new(store: Arc<DbStore>) -> DbClient {
        DbClient { store, conn: None }
    }

    async fn conn(&mut self) -> anyhow::Result<&mut Conn> {
        if self.conn.is_none() {
            self.conn = Some(match self.store.kind {
                StoreKind::Postgres => Conn::Pg(self.store.pg().await?),
                _ => Conn::Redis(self.store.redis().await?),
            });
        }
        Ok(self.conn.as_mut().expect("connected"))
    }

    /// Runs `call` under the timeout; an error or no answer is an unknown
    /// outcome and drops the connection.
    async fn bounded(
        &mut self,
        call: impl AsyncFnOnce(&mut DbClient) -> anyhow::Result<StoreReply>,
    ) -> StoreReply {
        let reply = match tokio::time::timeout(CALL_TIMEOUT, call(self)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => StoreReply::Unknown(format!("{e:#}")),
            Err(_) => StoreReply::Unknown(format!("store did not answer within {CALL_TIMEOUT:?}")),
        };
        if matches!(reply, StoreReply::Unknown(_)) {
            self.conn = None;
        }
        reply
    }

    /// Reads `key` under `fence` (the read records the fence).
    pub async fn read(&mut self, key: &str, fence: Fence) -> StoreReply {
        let key = key.to_string();
        self.bounded(async move |c| {
            let (broken, fenced) = (c.store.broken, c.store.fenced.clone());
            match c.conn().await? {
                Conn::Pg(db) => {
                    let select = async |tx: &tokio_postgres::Transaction<'_>| {
                        let row = tx
                            .query_opt(
                                "SELECT value FROM raftlock_jepsen.counters WHERE key = $1",
                                &[&key],
                            )
                            .await?;
                        Ok::<_, tokio_postgres::Error>(row.map_or(0, |r| r.get::<_, i64>(0) as u64))
                    };
                    if broken {
                        let tx = db.transaction().await?;
                        let v = select(&tx).await?;
                        tx.commit().await?;
                        return Ok(StoreReply::Ok(v));
                    }
                    pg_reply(postgres::with_fence(db, &pg_resource(&key), fence, select).await)
                }
                Conn::Redis(con) => {
                    let got = if broken {
                        redis::cmd("GET")
                            .arg(redis_key(&key))
                            .query_async(con)
                            .await
                            .map_err(Error::Redis)
                    } else {
                        fenced.get::<_, u64>(con, &redis_key(&key), fence).await
                    };
                    match got {
                        Ok(v) => Ok(StoreReply::Ok(v.unwrap_or(0))),
                        Err(Error::Stale(s)) => Ok(StoreReply::Stale {
                            latest: s.latest.get(),
                        }),
                        Err(e) => Err(e.into()),
                    }
                }
            }
        })
        .await
    }

    /// Writes `value` to `key` under `fence`.
    pub async fn write(&mut self, key: &str, fence: Fence, value: u64) -> StoreReply {
        let key = key.to_string();
        self.bounded(async move |c| {
            let store = c.store.clone();
            let f = fence.get() as i64;
            let reply = match c.conn().await? {
                Conn::Pg(db) => {
                    let now = store.clock.now_ns() as i64;
                    let write = async |tx: &tokio_postgres::Transaction<'_>| {
                        tx.execute(
                            "INSERT INTO raftlock_jepsen.counters VALUES ($1, $2)
                             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                            &[&key, &(value as i64)],
                        )
                        .await?;
                        tx.execute(
                            "INSERT INTO raftlock_jepsen.decisions (key, fence, value, time_ns)
                             VALUES ($1, $2, $3, $4)",
                            &[&key, &f, &(value as i64), &now],
                        )
                        .await
                        .map(|_| 0)
                    };
                    if store.broken {
                        let tx = db.transaction().await?;
                        write(&tx).await?;
                        tx.commit().await?;
                        StoreReply::Ok(0)
                    } else {
                        pg_reply(postgres::with_fence(db, &pg_resource(&key), fence, write).await)?
                    }
                }
                Conn::Redis(con) => {
                    let now = store.clock.now_ns();
                    match redis_write(&store, con, &key, fence, value).await {
                        Ok(seq) => {
                            store.accepted.lock().expect("store log").push((
                                seq,
                                json!({"key": key, "fence": fence, "value": value,
                                       "accepted": true, "time_ns": now, "seq": seq}),
                            ));
                            StoreReply::Ok(0)
                        }
                        Err(Error::Stale(s)) => StoreReply::Stale {
                            latest: s.latest.get(),
                        },
                        Err(e) => return Err(e.into()),
                    }
                }
            };
            if let StoreReply::Stale { .. } = reply {
                store.refuse(&key, fence, value);
            }
            Ok(reply)
        })
        .await
    }
}

fn pg_reply(r: Result<u64, Error<tokio_postgres::Error>>) -> anyhow::Result<StoreReply> {
    match r {
        Ok(v) => Ok(StoreReply::Ok(v)),
        Err(Error::Stale(s)) => Ok(StoreReply::Stale {
            latest: s.latest.get(),
        }),
        Err(e) => Err(e.into()),
    }
}

/// `MULTI`, the fenced set (or a plain `SET` when broken), `INCR` of the
/// decision counter, `EXEC`: the write's place in Redis' order.
async fn redis_write(
    store: &DbStore,
    con: &mut redis::aio::MultiplexedConnection,
    key: &str,
    fence: Fence,
    value: u64,
) -> Result<u64, Error> {
    let rkey = redis_key(key);
    for attempt in 0..2 {
        let mut write = if store.broken {
            redis::cmd("SET")
        } else {
            store.fenced.command(&rkey, fence, "set")?
        };
        if store.broken {
            write.arg(&rkey);
        }
        write.arg(value);
        let mut pipe = redis::pipe();
        pipe.atomic().add_command(write).cmd("INCR").arg(REDIS_SEQ);
        match pipe.query_async::<(redis::Value, u64)>(con).await {
            Ok((_, seq)) => return Ok(seq),
            Err(e) => match raftlock_fenced::redis::map_error(e, fence) {
                // Restarted or flushed: load the script and repeat (the
                // refused EVALSHA changed nothing).
                Error::Redis(e)
                    if attempt == 0
                        && e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    store.fenced.load(con).await?;
                }
                other => return Err(other),
            },
        }
    }
    unreachable!("the second attempt returns")
}

/// Where the workers find the store.
#[derive(Clone)]
pub enum Target {
    /// The in-memory store at this loopback address.
    Memory(String),
    /// A real store.
    Db(Arc<DbStore>),
}

/// A worker's client of either store.
pub enum AnyClient {
    /// The in-memory store.
    Memory(crate::store::StoreClient),
    /// A real store.
    Db(DbClient),
}

impl AnyClient {
    /// A client of `target` (connects on first use).
    pub fn new(target: &Target) -> AnyClient {
        match target {
            Target::Memory(addr) => AnyClient::Memory(crate::store::StoreClient::new(addr)),
            Target::Db(store) => AnyClient::Db(DbClient::new(store.clone())),
        }
    }

    /// Reads `key` under `fence`.
    pub async fn read(&mut self, key: &str, fence: Fence) -> StoreReply {
        match self {
            AnyClient::Memory(c) => c.read(key, fence).await,
            AnyClient::Db(c) => c.read(key, fence).await,
        }
    }

    /// Writes `value` to `key` under `fence`.
    pub async fn write(&mut self, key: &str, fence: Fence, value: u64) -> StoreReply {
        match self {
            AnyClient::Memory(c) => c.write(key, fence, value).await,
            AnyClient::Db(c) => c.write(key, fence, value).await,
        }
    }
}
