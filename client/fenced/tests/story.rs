//! The whole story with a real raftlock cluster (in-process nodes on
//! loopback ports) and real PostgreSQL and Redis: a holder paused past its
//! lease writes too late and both stores refuse it; a cluster restored from
//! a backup (its fences bumped) keeps working against the same table and
//! keys; fences the cluster grants next to the bound are kept exactly.

mod common;

use std::time::Duration;

use raftlock_client::{Client, Fence};
use raftlock_fenced::redis::FencedRedis;
use raftlock_fenced::{postgres, Error, MAX_FENCE};
use raftlock_node::state::limits::DEFAULT_RESTORE_FENCE_BUMP;
use raftlock_testkit::servers::{Postgres, Redis};
use raftlock_testkit::TestCluster;
use tokio_postgres::Client as Db;

const TTL: Duration = Duration::from_secs(1);
const WAIT: Duration = Duration::from_secs(30);

/// Writes `value` as the balance of account 42 under `fence`, in both
/// stores; what each said.
async fn write_both(
    db: &mut Db,
    con: &mut redis::aio::MultiplexedConnection,
    fence: Fence,
    value: &str,
) -> (Result<(), Error<tokio_postgres::Error>>, Result<(), Error>) {
    let pg = postgres::with_fence(db, "accounts/42", fence, async |tx| {
        tx.execute(
            "INSERT INTO accounts VALUES (42, $1)
             ON CONFLICT (id) DO UPDATE SET owner = excluded.owner",
            &[&value],
        )
        .await
        .map(drop)
    })
    .await;
    let rd = FencedRedis::new()
        .set(con, "accounts/42", fence, value)
        .await;
    (pg, rd)
}

async fn owner(db: &Db, con: &mut redis::aio::MultiplexedConnection) -> (String, String) {
    let pg: String = db
        .query_one("SELECT owner FROM accounts WHERE id = 42", &[])
        .await
        .expect("row")
        .get(0);
    let rd: String = redis::cmd("GET")
        .arg("accounts/42")
        .query_async(con)
        .await
        .expect("key");
    (pg, rd)
}

async fn stores() -> Option<(Postgres, Redis, Db, redis::aio::MultiplexedConnection)> {
    let pg = common::postgres().await?;
    let rd = common::redis().await?;
    let db = common::connect(&pg).await;
    postgres::install(&db).await.expect("install");
    db.batch_execute("CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL)")
        .await
        .expect("table");
    let con = common::redis_connection(&rd).await;
    Some((pg, rd, db, con))
}

fn assert_stale<E: std::fmt::Debug>(r: &Result<(), Error<E>>, fence: Fence, latest: Fence) {
    match r {
        Err(Error::Stale(s)) => assert_eq!((s.fence, s.latest), (fence, latest)),
        other => panic!("expected stale fence {fence} (latest {latest}), got {other:?}"),
    }
}

#[test]
fn the_stores_bound_is_the_servers_fence_bound() {
    assert_eq!(MAX_FENCE, raftlock_node::state::limits::MAX_FENCE);
    assert_eq!(MAX_FENCE, i64::MAX as u64, "PostgreSQL's bigint");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_paused_past_its_ttl_is_refused_by_both_stores() {
    let Some((pg, rd, mut db, mut con)) = stores().await else {
        return;
    };
    let cluster = TestCluster::start(3).await;

    // Holder A runs in a runtime of its own on its own thread, so that
    // blocking that thread stops everything A does — its keep-alives
    // included — as a GC pause or SIGSTOP of A's process would.
    let (got_fence, fence_a) = std::sync::mpsc::channel::<Fence>();
    let (wake_a, woken) = std::sync::mpsc::channel::<()>();
    let (addrs, conn_str, url) = (cluster.addrs(), pg.conn_str("postgres"), rd.url());
    let a = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("A's runtime");
        rt.block_on(async move {
            let client = Client::connect(addrs).await.expect("A connects");
            let session = client.session(TTL).await.expect("A's session");
            let guard = session.lock("accounts/42").await.expect("A locks");
            let (mut db, conn) = tokio_postgres::connect(&conn_str, tokio_postgres::NoTls)
                .await
                .expect("A's database");
            tokio::spawn(conn);
            let mut con = redis::Client::open(url)
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .expect("A's redis");
            let (p, r) = write_both(&mut db, &mut con, guard.fence(), "A").await;
            p.expect("A's first write");
            r.expect("A's first write");
            got_fence.send(guard.fence()).unwrap();
            // The pause: this thread stops, and with it A's whole runtime.
            woken.recv().unwrap();
            // A wakes believing it still holds the lock, and writes.
            write_both(&mut db, &mut con, guard.fence(), "late A").await
        })
    });
    let fence_a = fence_a.recv_timeout(WAIT).expect("A holds the lock");
    assert_eq!(owner(&db, &mut con).await, ("A".into(), "A".into()));

    // A's lease runs out on the leader; B gets the lock, with a larger
    // fence, and writes.
    let b = cluster.client().await;
    let session = b
        .session(Duration::from_secs(10))
        .await
        .expect("B's session");
    let guard = tokio::time::timeout(WAIT, session.lock("accounts/42"))
        .await
        .expect("B is granted once A's lease has expired")
        .expect("B locks");
    let fence_b = guard.fence();
    assert!(fence_b > fence_a);
    let (p, r) = write_both(&mut db, &mut con, fence_b, "B").await;
    p.expect("B writes");
    r.expect("B writes");

    wake_a.send(()).unwrap();
    let (p, r) = tokio::task::spawn_blocking(move || a.join().expect("A's thread"))
        .await
        .unwrap();
    assert_stale(&p, fence_a, fence_b);
    assert_stale(&r, fence_a, fence_b);
    assert_eq!(owner(&db, &mut con).await, ("B".into(), "B".into()));
    guard.release().await.expect("release");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restored_cluster_keeps_working_against_the_same_stores_up_to_the_fence_bound() {
    let Some((_pg, _rd, mut db, mut con)) = stores().await else {
        return;
    };
    // The old cluster: a holder writes, a backup is taken, and the old
    // cluster goes on granting after it (what the bump is for).
    let old = TestCluster::start(1).await;
    let old_client = old.client().await;
    let s = old_client.session(TTL).await.expect("session");
    let g = s.lock("accounts/42").await.expect("lock");
    let f1 = g.fence();
    let (p, r) = write_both(&mut db, &mut con, f1, "old 1").await;
    p.expect("the old holder writes");
    r.expect("the old holder writes");
    let backup = old_client.backup().await.expect("backup");
    g.release().await.expect("release");
    let g = s.lock("accounts/42").await.expect("after the backup");
    let f2 = g.fence();
    let (p, r) = write_both(&mut db, &mut con, f2, "old 2").await;
    p.expect("a grant after the backup writes");
    r.expect("a grant after the backup writes");

    // Restored elsewhere, default bump: the restored holder's session
    // expires there, and a new holder writes above everything the old
    // cluster granted.
    let new = TestCluster::start(1).await;
    let new_client = new.client().await;
    let restored = new_client
        .restore(backup.snapshot.clone())
        .await
        .expect("restore");
    // By default 2^32 above the restore's time in microseconds, far
    // above the backup's counter.
    assert!(restored.last_fence.get() > f1.get() + DEFAULT_RESTORE_FENCE_BUMP);
    let s2 = new_client
        .session(Duration::from_secs(10))
        .await
        .expect("session");
    let g2 = tokio::time::timeout(WAIT, s2.lock("accounts/42"))
        .await
        .expect("the restored holder expires")
        .expect("lock");
    let f3 = g2.fence();
    assert!(f3.get() > f1.get() + DEFAULT_RESTORE_FENCE_BUMP);
    let (p, r) = write_both(&mut db, &mut con, f3, "new").await;
    p.expect("the restored cluster's holder writes to the same table");
    r.expect("the restored cluster's holder writes to the same key");
    // The old cluster's holder, still holding there, is refused.
    let (p, r) = write_both(&mut db, &mut con, f2, "old 3").await;
    assert_stale(&p, f2, f3);
    assert_stale(&r, f2, f3);
    assert_eq!(owner(&db, &mut con).await, ("new".into(), "new".into()));
    g2.release().await.expect("release");

    // A restore whose bump leaves the counter just below the bound: the
    // grants after it carry 2^63 - 3, 2^63 - 2 and 2^63 - 1 (the bound),
    // and both stores keep them exactly.
    let backup2 = new_client
        .backup()
        .await
        .expect("backup of the new cluster");
    let last = backup2.last_fence.expect("fences granted").get();
    let edge = TestCluster::start(1).await;
    let edge_client = edge.client().await;
    let r = edge_client
        .restore_with(backup2.snapshot, Some(MAX_FENCE - 3 - last))
        .await
        .expect("restore next to the bound");
    assert_eq!(r.last_fence.get(), MAX_FENCE - 3);
    let s3 = edge_client
        .session(Duration::from_secs(10))
        .await
        .expect("session");
    let mut fences = Vec::new();
    for _ in 0..3 {
        let g = s3.lock("accounts/42").await.expect("lock");
        fences.push(g.fence());
        let (p, r) = write_both(&mut db, &mut con, g.fence(), "edge").await;
        p.expect("a fence next to the bound is kept");
        r.expect("a fence next to the bound is kept");
        g.release().await.expect("release");
    }
    assert_eq!(
        fences,
        [MAX_FENCE - 2, MAX_FENCE - 1, MAX_FENCE].map(Fence::new)
    );
    let (p, r) = write_both(&mut db, &mut con, f3, "new again").await;
    assert_stale(&p, f3, Fence::new(MAX_FENCE));
    assert_stale(&r, f3, Fence::new(MAX_FENCE));
    old.shutdown().await;
    new.shutdown().await;
    edge.shutdown().await;
}
