//! Fences in PostgreSQL: `raftlock.check_fence` and a transaction helper.
//!
//! Install the schema once per database, from any client:
//! `psql -v ON_ERROR_STOP=1 -f client/fenced/sql/raftlock_fence.sql`, or
//! [`install`] (the same file, [`SCHEMA_SQL`]). Then every write a lock
//! protects goes through [`with_fence`]:
//!
//! ```no_run
//! # async fn demo(db: &mut tokio_postgres::Client, guard: &raftlock_client::Guard)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! use raftlock_fenced::{postgres, Error};
//!
//! let res = postgres::with_fence(db, "accounts/42", guard.fence(), async |tx| {
//!     let row = tx.query_one("SELECT balance FROM accounts WHERE id = 42", &[]).await?;
//!     let balance: i64 = row.get(0);
//!     tx.execute("UPDATE accounts SET balance = $1 WHERE id = 42", &[&(balance + 10)]).await?;
//!     Ok::<_, tokio_postgres::Error>(balance + 10)
//! })
//! .await;
//! match res {
//!     Ok(new_balance) => println!("committed: {new_balance}"),
//!     // A newer holder has written: this holder lost the lock. Nothing
//!     // of the transaction was kept; give the work up.
//!     Err(Error::Stale(stale)) => println!("refused: {stale}"),
//!     Err(e) => return Err(e.into()),
//! }
//! # Ok(()) }
//! ```
//!
//! Why tokio-postgres: it is the asynchronous driver of the rust-postgres
//! project, the one the synchronous `postgres` crate and the
//! deadpool/bb8 pools are built on; it has no macros and needs no database
//! at compile time, and its `Transaction` is the unit the check must live
//! in.

use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Transaction};

use crate::{store_fence, Error, Fence, StaleFence};

/// `raftlock_fence.sql`: creates (or upgrades to) schema version
/// [`SCHEMA_VERSION`]. Idempotent, one transaction.
pub const SCHEMA_SQL: &str = include_str!("../sql/raftlock_fence.sql");

/// The schema version [`SCHEMA_SQL`] installs.
pub const SCHEMA_VERSION: i32 = 1;

/// The SQLSTATE of a refused (stale) fence.
pub const STALE_FENCE_SQLSTATE: &str = "RL001";

/// The longest resource name `raftlock.check_fence` takes, in bytes (a
/// lock name's limit, so every lock name fits); names are at least 1 byte.
pub const MAX_RESOURCE_BYTES: usize = 512;

/// Where the largest accepted fence is in the `DETAIL` of a refusal.
const DETAIL_PREFIX: &str = "latest accepted fence: ";

/// Runs [`SCHEMA_SQL`] on `client`'s database: installs the schema, or
/// upgrades an older version; changes nothing if it is current. Fails
/// (changing nothing) if a newer version is installed. The file is its own
/// transaction: call this outside of one.
pub async fn install(client: &Client) -> Result<(), tokio_postgres::Error> {
    let result = client.batch_execute(SCHEMA_SQL).await;
    if result.is_err() {
        // The file's BEGIN left a failed transaction open on this
        // connection; end it so the connection stays usable.
        let _ = client.batch_execute("ROLLBACK").await;
    }
    result
}

/// The installed schema version (`None`: not installed).
pub async fn schema_version(client: &Client) -> Result<Option<i32>, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT to_regprocedure('raftlock.fence_schema_version()') IS NOT NULL",
            &[],
        )
        .await?;
    if !row.get::<_, bool>(0) {
        return Ok(None);
    }
    let row = client
        .query_one("SELECT raftlock.fence_schema_version()", &[])
        .await?;
    Ok(Some(row.get(0)))
}

/// Checks `fence` for `resource` inside `tx`: records it if it is the
/// largest so far, accepts it if it equals the largest, refuses it with
/// [`Error::Stale`] if a larger one was accepted. The resource's row stays
/// locked until `tx` ends, so call this first, before reading what you will
/// write back. After a refusal the transaction is aborted: roll it back.
pub async fn check_fence(tx: &Transaction<'_>, resource: &str, fence: Fence) -> Result<(), Error> {
    let f = store_fence(fence)?;
    tx.execute_typed(
        "SELECT raftlock.check_fence($1, $2)",
        &[(&resource, Type::TEXT), (&f, Type::INT8)],
    )
    .await
    .map(drop)
    .map_err(|e| map_error(e, fence))
}

/// `e` as a [`StaleFence`] if it is `raftlock.check_fence`'s refusal of
/// `fence`, else as [`Error::Postgres`].
pub fn map_error<E>(e: tokio_postgres::Error, fence: Fence) -> Error<E> {
    let latest = (e.code() == Some(&SqlState::from_code(STALE_FENCE_SQLSTATE)))
        .then(|| {
            e.as_db_error()?
                .detail()?
                .strip_prefix(DETAIL_PREFIX)?
                .parse::<u64>()
                .ok()
        })
        .flatten();
    match latest {
        Some(latest) => Error::Stale(StaleFence {
            fence,
            latest: Fence::new(latest),
        }),
        None => Error::Postgres(e),
    }
}

/// Runs `work` in a transaction on `client` that starts with
/// [`check_fence`] of `fence` for `resource`, and commits it only if the
/// check and the work succeeded.
///
/// * refused (a newer holder has written): [`Error::Stale`], `work` never
///   runs, the transaction is rolled back;
/// * `work` fails: [`Error::Work`], the transaction is rolled back;
/// * otherwise the transaction commits and `work`'s value is returned. A
///   failed commit is [`Error::Postgres`]; if the connection broke during
///   it, whether it committed is unknown.
///
/// The transaction uses the session's default isolation level (READ
/// COMMITTED unless configured otherwise).
pub async fn with_fence<T, E, F>(
    client: &mut Client,
    resource: &str,
    fence: Fence,
    work: F,
) -> Result<T, Error<E>>
where
    F: AsyncFnOnce(&Transaction<'_>) -> Result<T, E>,
{
    let f = store_fence(fence)?;
    let tx = client.transaction().await.map_err(Error::Postgres)?;
    if let Err(e) = tx
        .execute_typed(
            "SELECT raftlock.check_fence($1, $2)",
            &[(&resource, Type::TEXT), (&f, Type::INT8)],
        )
        .await
    {
        // The refusal already aborted the transaction; what matters is
        // why, not whether the rollback got through.
        let _ = tx.rollback().await;
        return Err(map_error(e, fence));
    }
    match work(&tx).await {
        Ok(v) => {
            tx.commit().await.map_err(Error::Postgres)?;
            Ok(v)
        }
        Err(e) => {
            // Not committed either way: a rollback that fails because the
            // connection broke leaves the server to abort the transaction.
            let _ = tx.rollback().await;
            Err(Error::Work(e))
        }
    }
}
