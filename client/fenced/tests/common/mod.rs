//! What the fenced-store tests share: real servers, connections.

#![allow(dead_code)]

use raftlock_testkit::servers::{self, Postgres, Redis};

/// A PostgreSQL server of the test's own, or `None` (skipped, said why).
pub async fn postgres() -> Option<Postgres> {
    let started = tokio::task::spawn_blocking(Postgres::start)
        .await
        .expect("start task");
    servers::require("PostgreSQL", started)
}

/// A Redis server of the test's own, or `None` (skipped, said why).
pub async fn redis() -> Option<Redis> {
    let started = tokio::task::spawn_blocking(Redis::start)
        .await
        .expect("start task");
    servers::require("Redis", started)
}

/// A connection to database `postgres` of `pg`.
pub async fn connect(pg: &Postgres) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&pg.conn_str("postgres"), tokio_postgres::NoTls)
        .await
        .expect("connect to the test PostgreSQL");
    tokio::spawn(conn);
    client
}

/// A multiplexed connection to `r`.
pub async fn redis_connection(r: &Redis) -> redis::aio::MultiplexedConnection {
    redis::Client::open(r.url())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the test Redis")
}
