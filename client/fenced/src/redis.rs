//! Fences in Redis: a Lua script that runs an operation on a key only if
//! the fence is at least the one kept beside the key, atomically.
//!
//! ```no_run
//! # async fn demo(guard: &raftlock_client::Guard) -> Result<(), Box<dyn std::error::Error>> {
//! use raftlock_fenced::redis::FencedRedis;
//! use raftlock_fenced::Error;
//!
//! let client = redis::Client::open("redis://127.0.0.1/")?;
//! let mut con = client.get_multiplexed_async_connection().await?;
//! let fenced = FencedRedis::new();
//! match fenced.set(&mut con, "account:42", guard.fence(), "balance=10").await {
//!     Ok(()) => {}
//!     // A newer holder has written: this holder lost the lock.
//!     Err(Error::Stale(stale)) => println!("refused: {stale}"),
//!     Err(e) => return Err(e.into()),
//! }
//! # Ok(()) }
//! ```
//!
//! The script ([`SCRIPT`], `lua/fenced_write.lua`) is sent once per server
//! (`SCRIPT LOAD`, on the first `NOSCRIPT`) and run by its SHA1 after
//! that; when the server answers `NOSCRIPT` (restarted, `SCRIPT FLUSH`) it
//! is loaded again and the call repeated. The fence of key `K` is kept at
//! `K:raftlock-fence` ([`fence_key`]); on Redis Cluster give `K` a hash tag
//! (`{account:42}`) so both share a slot.
//!
//! **Durability.** Redis keeps the fence as well as it keeps any write, and
//! a fence it forgets lets an older holder's write in. With
//! `appendonly yes` and `appendfsync always` an acknowledged fence survives
//! a crash. With `appendfsync everysec` (Redis' default when the
//! append-only file is on) a crash can lose the last second of writes: the
//! fence rolls back and a stale holder can write once more. With RDB
//! snapshots only, or no persistence, a restart can forget every fence.
//! Asynchronous replication likewise: a failover to a replica that had not
//! received the newest fence rolls it back (`WAIT` narrows, but does not
//! close, that window). The check is only as strong as the store.
//!
//! Why redis-rs (the `redis` crate): it is the Redis project's own Rust
//! client; only its tokio connection and `Script` (EVALSHA, reloading on
//! NOSCRIPT) are used here.

use redis::aio::ConnectionLike;
use redis::{FromRedisValue, RedisError, Script, ToRedisArgs};

use crate::{store_fence, Error, Fence, StaleFence};

/// `fenced_write.lua`.
pub const SCRIPT: &str = include_str!("../lua/fenced_write.lua");

/// What [`fence_key`] appends to a key.
pub const FENCE_KEY_SUFFIX: &str = ":raftlock-fence";

/// The error code (first word of the error reply) of a refused fence.
pub const STALE_FENCE_CODE: &str = "STALEFENCE";

/// Where the fence of `key` is kept: `key` + [`FENCE_KEY_SUFFIX`].
pub fn fence_key(key: &str) -> String {
    format!("{key}{FENCE_KEY_SUFFIX}")
}

/// `e` as a [`StaleFence`] if it is the script's refusal of `fence` (a
/// reply of its own, or one of a pipeline's or `MULTI`'s results), else as
/// [`Error::Redis`].
pub fn map_error(e: RedisError, fence: Fence) -> Error {
    let latest = e.clone().into_server_errors().and_then(|errors| {
        errors.iter().find_map(|(_, s)| {
            (s.code() == STALE_FENCE_CODE)
                .then(|| s.details()?.split_whitespace().next()?.parse::<u64>().ok())
                .flatten()
        })
    });
    match latest {
        Some(latest) => Error::Stale(StaleFence {
            fence,
            latest: Fence::new(latest),
        }),
        None => Error::Redis(e),
    }
}

/// The fenced script, ready to run on any connection. Cheap to clone.
#[derive(Clone, Debug)]
pub struct FencedRedis {
    script: Script,
}

impl Default for FencedRedis {
    fn default() -> Self {
        Self::new()
    }
}

impl FencedRedis {
    /// The script (its SHA1 computed here; nothing is sent yet).
    pub fn new() -> Self {
        FencedRedis {
            script: Script::new(SCRIPT),
        }
    }

    /// The script's SHA1, what `EVALSHA` names it by.
    pub fn sha(&self) -> &str {
        self.script.get_hash()
    }

    /// Loads the script into the server now (`SCRIPT LOAD`), rather than
    /// at the first `NOSCRIPT`.
    pub async fn load<C: ConnectionLike>(&self, con: &mut C) -> Result<(), Error> {
        self.script
            .load_async(con)
            .await
            .map(drop)
            .map_err(Error::Redis)
    }

    /// The bare `EVALSHA` of operation `op` on `key` under `fence`, for a
    /// pipeline or a `MULTI`; append the operation's arguments to it. It
    /// does not reload the script on `NOSCRIPT` (call [`load`](Self::load)
    /// then, and repeat); map its error with [`map_error`].
    pub fn command(&self, key: &str, fence: Fence, op: &str) -> Result<redis::Cmd, Error> {
        let f = store_fence(fence)?;
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.sha())
            .arg(2)
            .arg(key)
            .arg(fence_key(key))
            .arg(f)
            .arg(op);
        Ok(cmd)
    }

    async fn run<T: FromRedisValue, C: ConnectionLike>(
        &self,
        con: &mut C,
        key: &str,
        fence: Fence,
        op: &str,
        args: impl FnOnce(&mut redis::ScriptInvocation<'_>),
    ) -> Result<T, Error> {
        let f = store_fence(fence)?;
        let mut inv = self.script.prepare_invoke();
        inv.key(key).key(fence_key(key)).arg(f).arg(op);
        args(&mut inv);
        inv.invoke_async(con).await.map_err(|e| map_error(e, fence))
    }

    /// `SET key value` under `fence`.
    pub async fn set<C: ConnectionLike, V: ToRedisArgs>(
        &self,
        con: &mut C,
        key: &str,
        fence: Fence,
        value: V,
    ) -> Result<(), Error> {
        self.run::<(), C>(con, key, fence, "set", |i| {
            i.arg(value);
        })
        .await
    }

    /// `GET key` under `fence`. A read records the fence too: a holder that
    /// read before a newer holder is refused when it writes back.
    pub async fn get<C: ConnectionLike, V: FromRedisValue>(
        &self,
        con: &mut C,
        key: &str,
        fence: Fence,
    ) -> Result<Option<V>, Error> {
        self.run(con, key, fence, "get", |_| {}).await
    }

    /// `DEL key` under `fence`; whether the key existed. The fence stays.
    pub async fn del<C: ConnectionLike>(
        &self,
        con: &mut C,
        key: &str,
        fence: Fence,
    ) -> Result<bool, Error> {
        self.run::<u64, C>(con, key, fence, "del", |_| {})
            .await
            .map(|n| n > 0)
    }

    /// `HSET key field value ...` under `fence`; the number of fields
    /// added (not counting those overwritten). At least one pair.
    pub async fn hset<C: ConnectionLike, F: ToRedisArgs, V: ToRedisArgs>(
        &self,
        con: &mut C,
        key: &str,
        fence: Fence,
        fields: &[(F, V)],
    ) -> Result<u64, Error> {
        self.run(con, key, fence, "hset", |i| {
            for (f, v) in fields {
                i.arg(f).arg(v);
            }
        })
        .await
    }

    /// `HGETALL key` under `fence` (records the fence, like [`get`](Self::get)).
    pub async fn hgetall<C: ConnectionLike, V: FromRedisValue>(
        &self,
        con: &mut C,
        key: &str,
        fence: Fence,
    ) -> Result<V, Error> {
        self.run(con, key, fence, "hgetall", |_| {}).await
    }

    /// The largest fence accepted for `key` so far (`None`: none yet).
    pub async fn latest<C: ConnectionLike>(
        &self,
        con: &mut C,
        key: &str,
    ) -> Result<Option<Fence>, Error> {
        let v: Option<u64> = redis::cmd("GET")
            .arg(fence_key(key))
            .query_async(con)
            .await
            .map_err(Error::Redis)?;
        Ok(v.map(Fence::new))
    }
}
