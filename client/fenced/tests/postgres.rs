//! `raftlock_fence.sql` and the Rust helper against a real PostgreSQL
//! (Debian's, started by each test in a temporary directory on a loopback
//! port; see `raftlock_testkit::servers`).

mod common;

use std::time::Duration;

use raftlock_fenced::postgres::{self, MAX_RESOURCE_BYTES, SCHEMA_VERSION, STALE_FENCE_SQLSTATE};
use raftlock_fenced::{Error, Fence, StaleFence, MAX_FENCE};
use raftlock_testkit::eventually;
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

fn f(n: u64) -> Fence {
    Fence::new(n)
}

async fn latest(db: &Client, resource: &str) -> Option<i64> {
    db.query_opt(
        "SELECT fence FROM raftlock.fences WHERE resource = $1",
        &[&resource],
    )
    .await
    .expect("select")
    .map(|r| r.get(0))
}

async fn balance(db: &Client) -> Option<i64> {
    db.query_opt("SELECT balance FROM accounts WHERE id = 42", &[])
        .await
        .expect("select")
        .map(|r| r.get(0))
}

/// A server with the schema installed and an `accounts` table.
async fn setup() -> Option<(raftlock_testkit::servers::Postgres, Client)> {
    let pg = common::postgres().await?;
    let db = common::connect(&pg).await;
    postgres::install(&db).await.expect("install");
    db.batch_execute("CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL)")
        .await
        .expect("accounts");
    Some((pg, db))
}

/// `SELECT raftlock.check_fence(...)` in a transaction of its own, with
/// a write before it; the error's SQLSTATE if refused.
async fn raw_check(
    db: &mut Client,
    resource: &str,
    fence: &str,
) -> Result<(), tokio_postgres::Error> {
    let tx = db.transaction().await.expect("begin");
    tx.batch_execute(&format!("SELECT raftlock.check_fence({resource}, {fence})"))
        .await?;
    tx.commit().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_file_installs_with_psql_idempotently_and_never_downgrades() {
    let Some(pg) = common::postgres().await else {
        return;
    };
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/sql/raftlock_fence.sql");
    for run in 0..2 {
        let out = pg
            .psql("postgres")
            .args(["-f", file])
            .output()
            .expect("psql runs");
        assert!(
            out.status.success(),
            "psql -f, run {run}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut db = common::connect(&pg).await;
    assert_eq!(
        postgres::schema_version(&db).await.unwrap(),
        Some(SCHEMA_VERSION)
    );
    // A fence recorded survives a re-install (the Rust installer runs the
    // same file).
    raw_check(&mut db, "'r'", "5").await.expect("check");
    postgres::install(&db).await.expect("install again");
    assert_eq!(latest(&db, "r").await, Some(5));

    // The function is not PUBLIC's: a role needs the documented grants.
    db.batch_execute("CREATE ROLE app LOGIN").await.unwrap();
    let (app, conn) = tokio_postgres::connect(
        &format!("{} user=app", pg.conn_str("postgres")),
        tokio_postgres::NoTls,
    )
    .await
    .expect("app connects");
    tokio::spawn(conn);
    let denied = app
        .batch_execute("SELECT raftlock.check_fence('r', 6)")
        .await
        .expect_err("no grant yet");
    assert_eq!(
        denied.code(),
        Some(&SqlState::INSUFFICIENT_PRIVILEGE),
        "{denied}"
    );
    db.batch_execute(
        "GRANT USAGE ON SCHEMA raftlock TO app;
         GRANT EXECUTE ON FUNCTION raftlock.check_fence(text, bigint) TO app;",
    )
    .await
    .unwrap();
    app.batch_execute("SELECT raftlock.check_fence('r', 6)")
        .await
        .expect("granted: the check runs with its owner's rights");
    assert_eq!(latest(&db, "r").await, Some(6));
    let table = app
        .batch_execute("UPDATE raftlock.fences SET fence = 1")
        .await
        .expect_err("the table itself stays the owner's");
    assert_eq!(table.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE));

    // A newer installed version: the file refuses and changes nothing.
    db.batch_execute(
        "CREATE OR REPLACE FUNCTION raftlock.fence_schema_version() RETURNS integer
         LANGUAGE sql AS 'SELECT 2'",
    )
    .await
    .unwrap();
    let out = pg
        .psql("postgres")
        .args(["-f", file])
        .output()
        .expect("psql runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("version 2 is installed, newer than this file (version 1)"),
        "{stderr}"
    );
    let e = postgres::install(&db).await.expect_err("downgrade refused");
    assert_eq!(e.code(), Some(&SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE));
    assert_eq!(postgres::schema_version(&db).await.unwrap(), Some(2));
    assert_eq!(latest(&db, "r").await, Some(6));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn larger_and_equal_fences_are_accepted_a_smaller_one_refused_and_nothing_of_its_transaction_kept(
) {
    let Some((_pg, mut db)) = setup().await else {
        return;
    };
    db.execute("INSERT INTO accounts VALUES (42, 0)", &[])
        .await
        .unwrap();
    let add = |n: i64| {
        async move |tx: &tokio_postgres::Transaction<'_>| {
            tx.execute(
                "UPDATE accounts SET balance = balance + $1 WHERE id = 42",
                &[&n],
            )
            .await
            .map(drop)
        }
    };
    postgres::with_fence(&mut db, "accounts/42", f(5), add(1))
        .await
        .expect("first");
    postgres::with_fence(&mut db, "accounts/42", f(5), add(10))
        .await
        .expect("equal");
    postgres::with_fence(&mut db, "accounts/42", f(9), add(100))
        .await
        .expect("larger");
    postgres::with_fence(&mut db, "other", f(1), add(1000))
        .await
        .expect("another resource");
    assert_eq!(balance(&db).await, Some(1111));

    let mut ran = false;
    let stale = postgres::with_fence(&mut db, "accounts/42", f(8), async |tx| {
        ran = true;
        tx.execute("UPDATE accounts SET balance = -1", &[])
            .await
            .map(drop)
    })
    .await
    .expect_err("stale");
    assert!(!ran, "the work of a refused fence never runs");
    assert!(
        matches!(stale, Error::Stale(StaleFence { fence, latest }) if fence == f(8) && latest == f(9)),
        "{stale:?}"
    );
    assert_eq!(
        stale.to_string(),
        "stale fence 8: the resource has already accepted fence 9"
    );
    assert_eq!(balance(&db).await, Some(1111));
    assert_eq!(latest(&db, "accounts/42").await, Some(9));

    // In raw SQL, a write made before the check is rolled back with it,
    // and the refusal says what happened.
    let tx = db.transaction().await.unwrap();
    tx.execute("UPDATE accounts SET balance = -1 WHERE id = 42", &[])
        .await
        .unwrap();
    let e = tx
        .execute("SELECT raftlock.check_fence('accounts/42', 3)", &[])
        .await
        .expect_err("stale");
    drop(tx);
    let db_err = e.as_db_error().expect("a server error");
    assert_eq!(db_err.code().code(), STALE_FENCE_SQLSTATE);
    assert_eq!(
        db_err.message(),
        "stale fence 3 for resource 'accounts/42': fence 9 was already accepted"
    );
    assert_eq!(db_err.detail(), Some("latest accepted fence: 9"));
    assert!(db_err.hint().unwrap_or("").contains("lost the lock"));
    assert_eq!(balance(&db).await, Some(1111));

    // The work's own failure rolls everything back, the fence included.
    let failed = postgres::with_fence(&mut db, "accounts/42", f(12), async |tx| {
        tx.execute("UPDATE accounts SET balance = 0", &[]).await?;
        tx.execute("SELECT 1/0", &[]).await.map(drop)
    })
    .await
    .expect_err("division by zero");
    assert!(matches!(failed, Error::Work(_)), "{failed:?}");
    assert_eq!(balance(&db).await, Some(1111));
    assert_eq!(latest(&db, "accounts/42").await, Some(9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_a_clear_error_and_changes_nothing() {
    let Some((_pg, mut db)) = setup().await else {
        return;
    };
    raw_check(&mut db, "'r'", "5").await.expect("first");
    let code = |r: Result<(), tokio_postgres::Error>| r.expect_err("refused").code().cloned();
    let invalid = Some(SqlState::INVALID_PARAMETER_VALUE);
    assert_eq!(
        code(raw_check(&mut db, "NULL", "5").await),
        Some(SqlState::NULL_VALUE_NOT_ALLOWED)
    );
    assert_eq!(
        code(raw_check(&mut db, "'r'", "NULL").await),
        Some(SqlState::NULL_VALUE_NOT_ALLOWED)
    );
    assert_eq!(code(raw_check(&mut db, "'r'", "0").await), invalid);
    assert_eq!(code(raw_check(&mut db, "'r'", "-7").await), invalid);
    assert_eq!(code(raw_check(&mut db, "''", "5").await), invalid);
    // One past bigint: PostgreSQL itself refuses to make it a bigint.
    assert_eq!(
        code(raw_check(&mut db, "'r'", "'9223372036854775808'::bigint").await),
        Some(SqlState::NUMERIC_VALUE_OUT_OF_RANGE)
    );
    // The resource bound, in bytes, at its edge (é is two bytes).
    let at = "é".repeat(MAX_RESOURCE_BYTES / 2);
    raw_check(&mut db, &format!("'{at}'"), "1")
        .await
        .expect("512 bytes");
    let over = format!("'{at}x'");
    let e = raw_check(&mut db, &over, "1").await.expect_err("513 bytes");
    assert_eq!(e.code(), invalid.as_ref());
    assert_eq!(
        e.as_db_error().unwrap().message(),
        "raftlock.check_fence: a resource is 1 to 512 bytes, this one is 513"
    );
    assert_eq!(latest(&db, "r").await, Some(5));
    let n: i64 = db
        .query_one("SELECT count(*) FROM raftlock.fences", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 2, "only 'r' and the 512-byte resource");

    // The Rust helper refuses fences no grant carries before sending.
    for bad in [0, MAX_FENCE + 1, u64::MAX] {
        let e = postgres::with_fence(&mut db, "r", f(bad), async |_| Ok::<_, ()>(()))
            .await
            .expect_err("out of range");
        assert!(matches!(e, Error::InvalidFence(x) if x == f(bad)), "{e:?}");
    }
    assert_eq!(latest(&db, "r").await, Some(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_near_the_bound_compare_exactly() {
    let Some((_pg, mut db)) = setup().await else {
        return;
    };
    let ok = async |db: &mut Client, n: u64| {
        postgres::with_fence(db, "edge", f(n), async |_| Ok::<_, ()>(())).await
    };
    ok(&mut db, MAX_FENCE - 1).await.expect("2^63 - 2");
    ok(&mut db, MAX_FENCE).await.expect("2^63 - 1, the bound");
    ok(&mut db, MAX_FENCE)
        .await
        .expect("the bound again, same holder");
    let e = ok(&mut db, MAX_FENCE - 1).await.expect_err("one below");
    assert!(
        matches!(e, Error::Stale(s) if s.latest == f(MAX_FENCE) && s.fence == f(MAX_FENCE - 1)),
        "{e:?}"
    );
    assert_eq!(latest(&db, "edge").await, Some(i64::MAX));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_check_waits_for_the_newer_holders_transaction_and_is_then_refused() {
    let Some((pg, mut newer)) = setup().await else {
        return;
    };
    let mut older = common::connect(&pg).await;
    let watcher = common::connect(&pg).await;
    newer
        .execute("INSERT INTO accounts VALUES (42, 0)", &[])
        .await
        .unwrap();
    raw_check(&mut newer, "'accounts/42'", "5").await.unwrap();

    // The newer holder (fence 7) checks and, inside its still open
    // transaction, reads and writes.
    let tx = newer.transaction().await.unwrap();
    postgres::check_fence(&tx, "accounts/42", f(7))
        .await
        .expect("newer");
    // The older holder (fence 6, larger than what was committed so far)
    // checks meanwhile: it must wait on the row lock, not pass.
    let older_task = tokio::spawn(async move {
        let r = postgres::with_fence(&mut older, "accounts/42", f(6), async |tx| {
            tx.execute("UPDATE accounts SET balance = 666 WHERE id = 42", &[])
                .await
                .map(drop)
        })
        .await;
        (r, older)
    });
    eventually(
        "the older check to wait on the row lock",
        Duration::from_secs(20),
        || {
            let w = &watcher;
            async move {
                let waiting: i64 = w
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity
                     WHERE wait_event_type = 'Lock' AND query LIKE '%check_fence%'",
                        &[],
                    )
                    .await
                    .unwrap()
                    .get(0);
                (waiting == 1).then_some(())
            }
        },
    )
    .await;
    assert!(!older_task.is_finished());
    tx.execute("UPDATE accounts SET balance = 7 WHERE id = 42", &[])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let (r, _older) = older_task.await.unwrap();
    let e = r.expect_err("refused once the newer holder committed");
    assert!(matches!(e, Error::Stale(s) if s.latest == f(7)), "{e:?}");
    assert_eq!(balance(&newer).await, Some(7));
    assert_eq!(latest(&newer, "accounts/42").await, Some(7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_holders_never_lose_an_update_nor_accept_a_smaller_fence() {
    let Some((pg, db)) = setup().await else {
        return;
    };
    db.execute("INSERT INTO accounts VALUES (42, 0)", &[])
        .await
        .unwrap();
    db.batch_execute("CREATE TABLE accepted (seq bigserial, fence bigint)")
        .await
        .unwrap();
    // 24 writers with fences in a scrambled order, 6 connections at once,
    // each a read-modify-write of one balance.
    let fences: Vec<u64> = (1..=24u64).map(|i| (i * 7) % 25).collect();
    let mut tasks = Vec::new();
    for chunk in fences.chunks(4) {
        let chunk = chunk.to_vec();
        let mut c = common::connect(&pg).await;
        tasks.push(tokio::spawn(async move {
            let mut accepted = 0;
            for fence in chunk {
                let r = postgres::with_fence(&mut c, "accounts/42", f(fence), async |tx| {
                    let b: i64 = tx
                        .query_one("SELECT balance FROM accounts WHERE id = 42", &[])
                        .await?
                        .get(0);
                    tx.execute(
                        "UPDATE accounts SET balance = $1 WHERE id = 42",
                        &[&(b + 1)],
                    )
                    .await?;
                    tx.execute(
                        "INSERT INTO accepted (fence) VALUES ($1)",
                        &[&(fence as i64)],
                    )
                    .await
                    .map(drop)
                })
                .await;
                match r {
                    Ok(()) => accepted += 1,
                    Err(Error::Stale(s)) => assert!(s.latest > s.fence),
                    Err(e) => panic!("{e}"),
                }
            }
            accepted
        }));
    }
    let mut accepted = 0;
    for t in tasks {
        accepted += t.await.unwrap();
    }
    assert!(accepted >= 1);
    assert_eq!(
        balance(&db).await,
        Some(accepted),
        "one increment per accepted write"
    );
    let order: Vec<i64> = db
        .query("SELECT fence FROM accepted ORDER BY seq", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(order.len() as i64, accepted);
    assert!(
        order.windows(2).all(|w| w[0] <= w[1]),
        "accepted fences in commit order must not decrease: {order:?}"
    );
    assert_eq!(latest(&db, "accounts/42").await, order.last().copied());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_repeatable_read_a_concurrent_check_aborts_with_a_serialization_failure() {
    let Some((pg, mut a)) = setup().await else {
        return;
    };
    let mut b = common::connect(&pg).await;
    raw_check(&mut a, "'r'", "5").await.unwrap();
    let tx = a
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .start()
        .await
        .unwrap();
    // The snapshot is taken at the first statement.
    tx.execute("SELECT 1", &[]).await.unwrap();
    raw_check(&mut b, "'r'", "7")
        .await
        .expect("b commits fence 7");
    let e = postgres::check_fence(&tx, "r", f(9))
        .await
        .expect_err("serialization failure");
    assert!(
        matches!(&e, Error::Postgres(p) if p.code() == Some(&SqlState::T_R_SERIALIZATION_FAILURE)),
        "{e:?}"
    );
    drop(tx);
    // Retried, as any 40001 is, it goes through.
    let tx = a
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .start()
        .await
        .unwrap();
    postgres::check_fence(&tx, "r", f(9)).await.expect("retry");
    tx.commit().await.unwrap();
    assert_eq!(latest(&a, "r").await, Some(9));
}
