//! The tasks: workers, contenders, the operator and the watchers.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use raftlock_client::Client;
use raftlock_proto::v1 as pb;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::json;

use super::super::Leftover;
use super::calls::{from_grpc, Attempt, Conn, Proc, Target};
use super::requests::Actor;
use super::{
    LeasePath, Shared, CONTENDERS, CONTENDER_END_BASE, CONTENDER_PROCESS_BASE, NAMES,
    OPERATOR_PROCESS_BASE, PREFIX, WATCH_PROCESS_BASE,
};
use crate::history::Type;

/// A worker: one of the enabled paths after another until told to stop.
pub(super) async fn worker(sh: Arc<Shared>, slot: u64) -> Leftover {
    let addrs = sh.opts.moved.borrow().clone();
    let end = crate::clientlink::worker_end(slot);
    let conn = Conn::new(&sh, end, &addrs).await;
    let mut a = Actor {
        p: Proc::new(&sh.rec, slot, sh.opts.concurrency),
        rng: StdRng::seed_from_u64(sh.opts.seed.wrapping_mul(1_000_003).wrapping_add(slot)),
        sh: sh.clone(),
        end,
        conn,
    };
    let paths: Vec<LeasePath> = sh
        .opts
        .paths
        .iter()
        .copied()
        .filter(|p| *p != LeasePath::Revoke)
        .collect();
    let library = paths
        .iter()
        .any(|p| matches!(p, LeasePath::Multi | LeasePath::Upgrade));
    let mut client: Option<(u64, Client)> = None;
    while !sh.stopped() && !paths.is_empty() {
        a.follow_moves().await;
        if library && client.as_ref().is_none_or(|(g, _)| *g != a.conn.gen) {
            let addrs = sh.opts.moved.borrow().clone();
            match super::super::client_via(&sh.opts.links, sh.opts.token.clone(), end, &addrs).await
            {
                Ok(c) => client = Some((addrs.gen, c)),
                Err(e) => eprintln!("raftlock-jepsen: lease worker {slot}: no client: {e:#}"),
            }
        }
        let name = NAMES[a.rng.random_range(0..NAMES.len())];
        let http = a.rng.random_bool(0.4);
        let path = paths[a.rng.random_range(0..paths.len())];
        match path {
            LeasePath::TtlEnd => a.ttl_change(name, http, true).await,
            LeasePath::TtlShorter => a.ttl_change(name, http, false).await,
            LeasePath::Retry => a.lock_retry(name, http, false).await,
            LeasePath::RetryFailover => a.lock_retry(name, http, true).await,
            LeasePath::Streams => a.streams(name).await,
            LeasePath::Renewals => a.renewals(name, http).await,
            LeasePath::Multi | LeasePath::Upgrade => {
                let Some((_, c)) = client.clone() else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                if path == LeasePath::Multi {
                    a.multi(&c).await;
                } else {
                    a.upgrade(&c, name).await;
                }
            }
            LeasePath::Ghost => a.ghost(slot, http).await,
            LeasePath::Revoke => {}
        }
        tokio::time::sleep(Duration::from_millis(a.rng.random_range(1..=40))).await;
    }
    Leftover {
        process: a.p.process,
        session: None,
        rec: sh.rec.clone(),
    }
}

/// A contender: takes a name with a one-call `Lock` as soon as it can and
/// lets go at once, over and over.
pub(super) async fn contender(sh: Arc<Shared>, k: u64) {
    let addrs = sh.opts.moved.borrow().clone();
    let end = CONTENDER_END_BASE + k;
    let conn = Conn::new(&sh, end, &addrs).await;
    let mut a = Actor {
        p: Proc::new(&sh.rec, CONTENDER_PROCESS_BASE + k, 100),
        rng: StdRng::seed_from_u64(sh.opts.seed ^ (0x636f << 16) ^ k),
        sh: sh.clone(),
        end,
        conn,
    };
    while !sh.stopped() {
        a.follow_moves().await;
        let name = NAMES[a.rng.random_range(0..NAMES.len())];
        let http = a.rng.random_bool(0.3);
        match a.take("contender", name, 2_000, 1_500, http).await {
            Some(t) => {
                tokio::time::sleep(Duration::from_millis(a.rng.random_range(1..=30))).await;
                let (session, fence) = (t.h.session, t.h.fence);
                let end = a.now();
                a.let_go(t.h, end, "unlock");
                a.unlock(session, name, fence, http).await;
            }
            None => {
                tokio::time::sleep(Duration::from_millis(a.rng.random_range(5..=50))).await;
            }
        }
    }
}

/// The operator: every 1-3 s, revokes a session some worker holds a grant
/// in now.
pub(super) async fn operator(sh: Arc<Shared>) {
    let addrs = sh.opts.moved.borrow().clone();
    let end = CONTENDER_END_BASE + CONTENDERS;
    let conn = Conn::new(&sh, end, &addrs).await;
    let mut a = Actor {
        p: Proc::new(&sh.rec, OPERATOR_PROCESS_BASE, 1),
        rng: StdRng::seed_from_u64(sh.opts.seed ^ (0x6f70 << 16)),
        sh: sh.clone(),
        end,
        conn,
    };
    while !sh.stopped() {
        tokio::time::sleep(Duration::from_millis(a.rng.random_range(1_000..=3_000))).await;
        a.follow_moves().await;
        let gen = a.conn.gen;
        let sessions: Vec<u64> = sh
            .holding
            .lock()
            .expect("holding lock poisoned")
            .keys()
            .filter(|(g, _)| *g == gen)
            .map(|(_, s)| *s)
            .collect();
        if sessions.is_empty() {
            continue;
        }
        let session = sessions[a.rng.random_range(0..sessions.len())];
        a.conn
            .call(
                &mut a.p,
                "revoke",
                json!({ "session": session }),
                Duration::from_secs(15),
                Duration::from_secs(12),
                move |t: Target| -> Attempt<pb::RevokeSessionResponse> {
                    Box::pin(async move {
                        from_grpc(
                            t.cluster()
                                .revoke_session(pb::RevokeSessionRequest {
                                    session_id: session,
                                })
                                .await,
                        )
                    })
                },
                |r: &pb::RevokeSessionResponse| (Type::Ok, json!({"released": r.released})),
            )
            .await;
    }
}

/// Follows `Watch` of [`PREFIX`] on one node and records every event.
async fn watcher(
    sh: Arc<Shared>,
    node: u64,
    addr: String,
    gen: u64,
    events: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
) {
    while !done.load(Ordering::SeqCst) {
        let mut locks = crate::raw::locks(crate::raw::fresh_channel(&addr), &sh.creds);
        let opened = tokio::time::timeout(
            Duration::from_secs(1),
            locks.watch(pb::WatchRequest {
                name: String::new(),
                prefix: PREFIX.into(),
            }),
        )
        .await;
        if let Ok(Ok(stream)) = opened {
            let mut stream = stream.into_inner();
            loop {
                let next = tokio::time::timeout(Duration::from_millis(500), stream.message()).await;
                match next {
                    Ok(Ok(Some(e))) => {
                        let kind = super::super::keepalive::event_kind_name(e.kind);
                        let mode = match pb::Mode::try_from(e.mode) {
                            Ok(pb::Mode::Shared) => "shared",
                            Ok(pb::Mode::Semaphore) => "semaphore",
                            _ => "exclusive",
                        };
                        let mut p = Proc::new(
                            &sh.rec,
                            WATCH_PROCESS_BASE + events.fetch_add(1, Ordering::Relaxed),
                            0,
                        );
                        p.invoke("watch", json!({"node": node, "gen": gen}));
                        p.complete(
                            Type::Ok,
                            json!({"kind": kind, "name": e.name, "session": e.session_id,
                                   "fence": e.fence, "mode": mode, "index": e.index}),
                        );
                    }
                    Ok(_) => break,
                    Err(_) if done.load(Ordering::SeqCst) => return,
                    Err(_) => {}
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The watchers of every node of each cluster generation, until `stop`.
pub(super) async fn watchers(sh: Arc<Shared>) {
    let events = Arc::new(AtomicU64::new(0));
    let mut moved = sh.opts.moved.clone();
    loop {
        let addrs = moved.borrow_and_update().clone();
        let done = Arc::new(AtomicBool::new(false));
        let mut tasks = tokio::task::JoinSet::new();
        for (&node, addr) in &addrs.nodes {
            tasks.spawn(watcher(
                sh.clone(),
                node,
                addr.clone(),
                addrs.gen,
                events.clone(),
                done.clone(),
            ));
        }
        let changed = loop {
            tokio::select! {
                c = moved.changed() => break c.is_ok(),
                _ = tokio::time::sleep(Duration::from_millis(200)) => {
                    if sh.stopped() {
                        break false;
                    }
                }
            }
        };
        done.store(true, Ordering::SeqCst);
        tasks.shutdown().await;
        if !changed {
            return;
        }
    }
}
