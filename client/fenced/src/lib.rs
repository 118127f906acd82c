//! Fences checked where the data lives.
//!
//! raftlock hands every lock grant a fencing token ([`Fence`]): strictly
//! larger for every grant. A holder that was paused past its lease, cut
//! off, or expired still believes it holds the lock, and only the store it
//! writes to can stop it: the store keeps the largest fence it accepted per
//! resource and refuses smaller ones. This crate is that check inside two
//! stores, done atomically with the write it guards:
//!
//! * [`postgres`] (feature `postgres`): `raftlock_fence.sql` creates
//!   `raftlock.check_fence(resource, fence)`, which locks the resource's
//!   row for the rest of the caller's transaction and refuses a smaller
//!   fence with SQLSTATE `RL001`; [`postgres::with_fence`] runs your work
//!   in a transaction that starts with the check and commits only if it
//!   passed.
//! * [`redis`] (feature `redis`): a Lua script that runs a set, get,
//!   delete, hash-set or hash-get-all of a key only if the fence is at least
//!   the one kept beside the key; [`redis::FencedRedis`] runs it by its
//!   SHA and reloads it when the server answers `NOSCRIPT`.
//!
//! Both features are on by default; a program that uses one store takes
//! only that store's driver with `default-features = false, features =
//! ["postgres"]` (or `["redis"]`).
//!
//! The SQL file and the Lua script work from any language: they are
//! plain files in this crate (`sql/raftlock_fence.sql`,
//! `lua/fenced_write.lua`), also as [`postgres::SCHEMA_SQL`] and
//! [`redis::SCRIPT`]. A refusal is [`Error::Stale`] with the
//! [`StaleFence`] the client crate's in-memory checker uses: the holder
//! lost the lock and a newer holder has written; give up this work.
//!
//! A store keeps a fence only as well as it keeps its own writes: a
//! PostgreSQL with `fsync = off`, or a Redis whose last second of writes
//! (`appendfsync everysec`) or whole dataset (no persistence) can be lost
//! in a crash, can forget a fence and then accept an older one.

pub use raftlock_client::fence::StaleFence;
pub use raftlock_client::Fence;

#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;

/// The largest fence a store here can keep: 2^63 - 1, PostgreSQL's
/// `bigint` maximum. It is also raftlock's fence bound (the node's
/// `limits::MAX_FENCE`, which a test checks it equals): the server never
/// grants a larger fence. Fences start at 1.
pub const MAX_FENCE: u64 = i64::MAX as u64;

/// What a fenced operation can fail with. `E` is the error of your own
/// work inside a fenced PostgreSQL transaction (none for Redis).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error<E = std::convert::Infallible> {
    /// Refused: a newer holder has written. Nothing of this operation (or
    /// its transaction) was kept. Do not retry with the same fence.
    #[error(transparent)]
    Stale(StaleFence),
    /// The fence is 0 or above [`MAX_FENCE`]: no grant carries it, and a
    /// store could not keep it. Nothing was sent.
    #[error("fence {0} is outside 1..={MAX_FENCE}, the fences raftlock grants and a store keeps")]
    InvalidFence(Fence),
    /// PostgreSQL failed: a connection or server error, bad input refused
    /// by `raftlock.check_fence` (SQLSTATE 22004 or 22023), or the commit
    /// failed. If the connection broke during the commit, whether the
    /// transaction committed is unknown.
    #[cfg(feature = "postgres")]
    #[error("postgres: {0}")]
    Postgres(#[source] tokio_postgres::Error),
    /// Redis failed: a connection or server error, or bad input refused by
    /// the script (an error starting with `ERR raftlock:`).
    #[cfg(feature = "redis")]
    #[error("redis: {0}")]
    Redis(#[source] ::redis::RedisError),
    /// Your work inside the fenced transaction failed; the transaction was
    /// rolled back.
    #[error("{0}")]
    Work(E),
}

impl<E> Error<E> {
    /// The refusal, if this is one.
    pub fn stale(&self) -> Option<&StaleFence> {
        match self {
            Error::Stale(s) => Some(s),
            _ => None,
        }
    }
}

/// The fence as a store keeps it, or [`Error::InvalidFence`].
fn store_fence<E>(fence: Fence) -> Result<i64, Error<E>> {
    match i64::try_from(fence.get()) {
        Ok(f) if f >= 1 => Ok(f),
        _ => Err(Error::InvalidFence(fence)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_outside_the_bound_are_refused_before_anything_is_sent() {
        assert_eq!(store_fence::<()>(Fence::new(1)).ok(), Some(1));
        assert_eq!(
            store_fence::<()>(Fence::new(MAX_FENCE)).ok(),
            Some(i64::MAX)
        );
        for bad in [0, MAX_FENCE + 1, u64::MAX] {
            assert!(
                matches!(store_fence::<()>(Fence::new(bad)), Err(Error::InvalidFence(f)) if f.get() == bad),
                "{bad}"
            );
        }
    }
}
