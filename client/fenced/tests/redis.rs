//! `fenced_write.lua` and the Rust helper against a real Redis (Debian's
//! `redis-server`, started by each test in a temporary directory on a
//! loopback port; see `raftlock_testkit::servers`).

mod common;

use std::collections::HashMap;

use raftlock_fenced::redis::{fence_key, map_error, FencedRedis, SCRIPT, STALE_FENCE_CODE};
use raftlock_fenced::{Error, Fence, StaleFence, MAX_FENCE};
use redis::AsyncCommands;

fn f(n: u64) -> Fence {
    Fence::new(n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn larger_and_equal_fences_write_a_smaller_one_is_refused_and_changes_nothing() {
    let Some(server) = common::redis().await else {
        return;
    };
    let mut con = common::redis_connection(&server).await;
    let fenced = FencedRedis::new();

    fenced
        .set(&mut con, "account:42", f(5), "A1")
        .await
        .expect("first");
    fenced
        .set(&mut con, "account:42", f(5), "A2")
        .await
        .expect("equal");
    fenced
        .set(&mut con, "account:42", f(9), "B")
        .await
        .expect("larger");
    let stale = fenced
        .set(&mut con, "account:42", f(8), "late A")
        .await
        .expect_err("stale");
    assert!(
        matches!(stale, Error::Stale(StaleFence { fence, latest }) if fence == f(8) && latest == f(9)),
        "{stale:?}"
    );
    let v: String = con.get("account:42").await.unwrap();
    assert_eq!(v, "B");
    assert_eq!(
        fenced.latest(&mut con, "account:42").await.unwrap(),
        Some(f(9))
    );
    let kept: String = con.get(fence_key("account:42")).await.unwrap();
    assert_eq!(kept, "9");

    // Reads record the fence: a holder that read after B cannot be
    // overtaken by B's late write.
    let v: Option<String> = fenced.get(&mut con, "account:42", f(11)).await.unwrap();
    assert_eq!(v.as_deref(), Some("B"));
    let e = fenced
        .set(&mut con, "account:42", f(9), "B again")
        .await
        .expect_err("B is stale now");
    assert!(matches!(e, Error::Stale(s) if s.latest == f(11)), "{e:?}");
    assert!(fenced
        .get::<_, String>(&mut con, "account:42", f(10))
        .await
        .is_err());

    // Hashes.
    let added = fenced
        .hset(
            &mut con,
            "user:7",
            f(3),
            &[("name", "ann"), ("plan", "free")],
        )
        .await
        .unwrap();
    assert_eq!(added, 2);
    fenced
        .hset(&mut con, "user:7", f(4), &[("plan", "pro")])
        .await
        .unwrap();
    let e = fenced
        .hset(&mut con, "user:7", f(3), &[("plan", "free")])
        .await
        .expect_err("stale");
    assert!(e.stale().is_some());
    let all: HashMap<String, String> = fenced.hgetall(&mut con, "user:7", f(4)).await.unwrap();
    assert_eq!(all["plan"], "pro");
    assert_eq!(all.len(), 2);

    // Delete keeps the fence, so a stale holder cannot bring the key back.
    assert!(fenced.del(&mut con, "user:7", f(6)).await.unwrap());
    assert!(!fenced.del(&mut con, "user:7", f(6)).await.unwrap());
    let e = fenced
        .hset(&mut con, "user:7", f(5), &[("plan", "free")])
        .await
        .expect_err("stale");
    assert!(e.stale().is_some());
    let exists: bool = con.exists("user:7").await.unwrap();
    assert!(!exists);
    assert_eq!(fenced.latest(&mut con, "user:7").await.unwrap(), Some(f(6)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_script_runs_by_sha_and_is_reloaded_after_noscript() {
    let Some(server) = common::redis().await else {
        return;
    };
    let mut con = common::redis_connection(&server).await;
    let fenced = FencedRedis::new();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(SCRIPT)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(sha, fenced.sha());
    fenced.set(&mut con, "k", f(1), "v1").await.unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut con)
        .await
        .unwrap();
    let cached: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(fenced.sha())
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(cached, vec![false]);
    fenced
        .set(&mut con, "k", f(2), "v2")
        .await
        .expect("reloaded after NOSCRIPT");
    let cached: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(fenced.sha())
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(cached, vec![true]);

    // The bare command (for MULTI and pipelines) runs by SHA too.
    let mut cmd = fenced.command("k", f(1), "set").unwrap();
    cmd.arg("late");
    let e = cmd.query_async::<()>(&mut con).await.expect_err("stale");
    assert_eq!(e.code(), Some(STALE_FENCE_CODE));
    assert!(matches!(map_error(e, f(1)), Error::Stale(s) if s.latest == f(2)));
    let v: String = con.get("k").await.unwrap();
    assert_eq!(v, "v2");

    // Inside MULTI ... EXEC the refusal is one of the transaction's
    // results; map_error still finds it.
    let mut late = fenced.command("k", f(1), "set").unwrap();
    late.arg("late again");
    let mut pipe = redis::pipe();
    pipe.atomic().add_command(late).cmd("INCR").arg("counter");
    let e = pipe
        .query_async::<(redis::Value, u64)>(&mut con)
        .await
        .expect_err("stale inside MULTI");
    let mapped = map_error(e, f(1));
    assert!(
        matches!(mapped, Error::Stale(s) if s.latest == f(2) && s.fence == f(1)),
        "{mapped:?}"
    );
    let v: String = con.get("k").await.unwrap();
    assert_eq!(v, "v2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_fences_near_the_bound() {
    let Some(server) = common::redis().await else {
        return;
    };
    let mut con = common::redis_connection(&server).await;
    let fenced = FencedRedis::new();
    fenced.load(&mut con).await.unwrap();
    // Digits compared as text, not as Lua's doubles (2^63 - 2 and 2^63 - 1
    // are the same double).
    fenced
        .set(&mut con, "edge", f(MAX_FENCE - 1), "a")
        .await
        .expect("2^63 - 2");
    fenced
        .set(&mut con, "edge", f(MAX_FENCE), "b")
        .await
        .expect("the bound");
    let e = fenced
        .set(&mut con, "edge", f(MAX_FENCE - 1), "c")
        .await
        .expect_err("below");
    assert!(
        matches!(e, Error::Stale(s) if s.latest == f(MAX_FENCE)),
        "{e:?}"
    );
    // Shorter numbers are smaller, whatever their first digit.
    fenced.set(&mut con, "len", f(9), "a").await.unwrap();
    fenced
        .set(&mut con, "len", f(10), "b")
        .await
        .expect("10 > 9");
    assert!(fenced.set(&mut con, "len", f(9), "c").await.is_err());
    for bad in [0, MAX_FENCE + 1, u64::MAX] {
        let e = fenced
            .set(&mut con, "edge", f(bad), "x")
            .await
            .expect_err("out of range");
        assert!(matches!(e, Error::InvalidFence(x) if x == f(bad)), "{e:?}");
    }

    // Raw EVALSHA with what other languages might send.
    let raw = async |con: &mut redis::aio::MultiplexedConnection, args: &[&str]| {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(fenced.sha())
            .arg(2)
            .arg("raw")
            .arg(fence_key("raw"));
        for a in args {
            cmd.arg(*a);
        }
        cmd.query_async::<redis::Value>(con).await
    };
    for (args, says) in [
        (&["0", "set", "v"][..], "a fence is a decimal integer"),
        (&["-1", "set", "v"][..], "a fence is a decimal integer"),
        (&["007", "set", "v"][..], "a fence is a decimal integer"),
        (&["1.5", "set", "v"][..], "a fence is a decimal integer"),
        (
            &["9223372036854775808", "set", "v"][..],
            "a fence is a decimal integer",
        ),
        (
            &["99999999999999999999", "set", "v"][..],
            "a fence is a decimal integer",
        ),
        (&["5", "set"][..], "set takes one value"),
        (&["5", "hset", "f"][..], "hset takes field value pairs"),
        (&["5", "get", "x"][..], "get takes no arguments"),
        (&["5", "incr"][..], "unknown operation incr"),
    ] {
        let e = raw(&mut con, args).await.expect_err("refused");
        let text = e.to_string();
        assert!(
            text.contains("raftlock:") && text.contains(says),
            "{args:?}: {text}"
        );
    }
    let none: Option<String> = con.get(fence_key("raw")).await.unwrap();
    assert_eq!(none, None, "nothing recorded by refused calls");
    raw(&mut con, &["5", "set", "v"]).await.expect("valid");

    // One key only: refused before anything is read.
    let e = redis::cmd("EVALSHA")
        .arg(fenced.sha())
        .arg(1)
        .arg("raw")
        .arg("6")
        .arg("del")
        .query_async::<redis::Value>(&mut con)
        .await
        .expect_err("one key");
    assert!(e.to_string().contains("pass two keys"), "{e}");

    // The operation fails (a hash operation on a string): no fence kept.
    let e = fenced
        .hset(&mut con, "raw", f(8), &[("a", "b")])
        .await
        .expect_err("WRONGTYPE");
    assert!(
        matches!(&e, Error::Redis(r) if r.code() == Some("WRONGTYPE")),
        "{e:?}"
    );
    assert_eq!(fenced.latest(&mut con, "raw").await.unwrap(), Some(f(5)));
    // Garbage where the fence is kept is refused, not compared.
    let _: () = con.set(fence_key("g"), "lots").await.unwrap();
    let e = fenced
        .set(&mut con, "g", f(1), "v")
        .await
        .expect_err("garbage fence");
    assert!(e.to_string().contains("not a fence"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_holders_never_lose_an_update_nor_accept_a_smaller_fence() {
    let Some(server) = common::redis().await else {
        return;
    };
    let fenced = FencedRedis::new();
    // 24 writers, fences in a scrambled order, 6 connections at once, each
    // a fenced read-modify-write of one counter.
    let fences: Vec<u64> = (1..=24u64).map(|i| (i * 7) % 25).collect();
    let mut tasks = Vec::new();
    for chunk in fences.chunks(4) {
        let chunk = chunk.to_vec();
        let mut con = common::redis_connection(&server).await;
        let fenced = fenced.clone();
        tasks.push(tokio::spawn(async move {
            let mut accepted = Vec::new();
            for fence in chunk {
                let Ok(v) = fenced.get::<_, u64>(&mut con, "n", f(fence)).await else {
                    continue;
                };
                let v = v.unwrap_or(0);
                if fenced.set(&mut con, "n", f(fence), v + 1).await.is_ok() {
                    accepted.push(fence);
                }
            }
            accepted
        }));
    }
    let mut accepted = Vec::new();
    for t in tasks {
        accepted.extend(t.await.unwrap());
    }
    let mut con = common::redis_connection(&server).await;
    let n: u64 = con.get("n").await.unwrap();
    assert_eq!(
        n as usize,
        accepted.len(),
        "one increment per accepted write"
    );
    assert_eq!(
        fenced.latest(&mut con, "n").await.unwrap(),
        accepted.iter().max().map(|m| f(*m))
    );
}
