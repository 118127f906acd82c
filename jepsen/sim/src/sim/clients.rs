//! The simulated cluster's clients: the lock workers (the real Rust
//! client), the keep-alive probers and the health prober (speaking the
//! protocol themselves), the hostile peer, and the liveness probe; and
//! the steps of a run that start them.

use std::collections::BTreeMap;
use std::time::Duration;

use raftlock_client::Client;
use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng as _};

use raftlock_proto::v1 as pb;
use raftlock_proto::v1::locks_client::LocksClient;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use raftlock_check::history::Type;
use serde_json::json;

use super::host::{channel, Channels};
use super::{
    addr, believers, client_options, holders, nodes, note, now_ms, Cluster, Settings, Shared,
    BELIEVERS, BOUND_HOLDER, LIVENESS_BOUND, LOCK, PATHS, PROBERS, PROBE_ASKS_FOR_MS,
    PROBE_EVERY_MS, PROBE_GRACE_MS, PROBE_TTL_MS, SESSION_TTL,
};
use crate::belief::Held;
use crate::oracle::{Grant, Renewal, Serving};
use crate::shared;

/// A keep-alive prober's opener, speaking the protocol itself: it opens a
/// session with the smallest ttl on whichever node leads and abandons it
/// at once (as a crashed holder would); the askers then ask every node to
/// renew it.
pub(super) async fn session_opener(n: usize, stop_ms: u64, record: Shared) -> turmoil::Result {
    until_ready(&record).await;
    let mut chans = Channels::default();
    while now_ms() < stop_ms {
        let mut opened = None;
        for (id, ch) in chans.of_members(&record) {
            let req = pb::OpenSessionRequest {
                ttl_ms: PROBE_TTL_MS,
                ..Default::default()
            };
            let mut c = LocksClient::new(ch.clone());
            if let Ok(Ok(r)) =
                tokio::time::timeout(Duration::from_millis(300), c.open_session(req)).await
            {
                opened = Some((id, r.into_inner().session_id));
                break;
            }
        }
        let Some((by, session)) = opened else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        note(
            &record,
            format!("opener {n}: session {session} opened on node {by}, abandoned"),
        );
        record.borrow_mut().abandoned.insert(session, now_ms());
        // The next one once this one's lease has lapsed.
        tokio::time::sleep(Duration::from_millis(PROBE_TTL_MS)).await;
    }
    Ok(())
}

/// A keep-alive asker for one node: once an abandoned session's lease has
/// lapsed (its ttl and [`PROBE_GRACE_MS`] after the open was answered), it
/// asks node `id` to
/// renew it every [`PROBE_EVERY_MS`] for [`PROBE_ASKS_FOR_MS`]. A
/// "renewed" answer is recorded with its ask's send time; the keep-alive
/// oracle judges it against the ends the nodes applied. One asker per
/// node, so a node that is down does not slow the asks to the others.
pub(super) async fn keepalive_asker(id: u64, stop_ms: u64, record: Shared) -> turmoil::Result {
    let ch = channel(id);
    let mut ask = 0u64;
    while now_ms() < stop_ms {
        let now = now_ms();
        let due: Vec<u64> = record
            .borrow()
            .abandoned
            .iter()
            .filter(|(_, opened)| {
                now >= *opened + PROBE_TTL_MS + PROBE_GRACE_MS
                    && now < *opened + PROBE_TTL_MS + PROBE_GRACE_MS + PROBE_ASKS_FOR_MS
            })
            .map(|(s, _)| *s)
            .collect();
        for session in due {
            ask += 1;
            let sent = now_ms();
            let req = pb::KeepAliveRequest {
                session_id: session,
                ask_id: ask,
            };
            let mut c = LocksClient::new(ch.clone());
            let answer = tokio::time::timeout(Duration::from_millis(300), async {
                let mut answers = c
                    .keep_alive(futures::stream::iter([req]))
                    .await?
                    .into_inner();
                answers.message().await
            })
            .await;
            if let Ok(Ok(Some(a))) = answer {
                if !a.expired && a.session_id == session {
                    let answered = now_ms();
                    note(
                        &record,
                        format!("asker: node {id} renewed session {session} (asked at {sent})"),
                    );
                    record.borrow_mut().renewals.push(Renewal {
                        session,
                        node: id,
                        sent,
                        answered,
                    });
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(PROBE_EVERY_MS)).await;
    }
    Ok(())
}

/// A hostile peer: every 2-6 s, 1-4 Raft messages no member sends
/// (`raftlock_testkit::hostile`: far-future terms, a snapshot beyond its
/// vote, garbage snapshots, gaps, another cluster's id, ...) to random
/// nodes, the leader half the time. The nodes must refuse them and live:
/// a panic ends the run, a stopped core is the health oracle's.
pub(super) async fn hostile_peer(stop_ms: u64, mut rng: StdRng, record: Shared) -> turmoil::Result {
    loop {
        let pause = rng.random_range(2_000..6_000);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        if now_ms() >= stop_ms {
            return Ok(());
        }
        let members = record.borrow().members.clone();
        let nodes: BTreeMap<u64, String> = members.iter().map(|id| (*id, addr(*id))).collect();
        let leader = record.borrow().leader.filter(|l| members.contains(l));
        for (kind, node, other) in raftlock_testkit::hostile::pick(&mut rng, &members, leader) {
            let answer =
                raftlock_testkit::hostile::send(&kind, channel(node), &nodes, other, &mut rng)
                    .await;
            let answer = match answer {
                raftlock_testkit::hostile::Answer::Refused(s) => format!("{:?}", s.code()),
                a => format!("{a:?}"),
            };
            note(
                &record,
                format!(
                    "hostile: {kind}{} to node {node}: {answer}",
                    if other.is_some() {
                        " (another cluster)"
                    } else {
                        ""
                    }
                ),
            );
        }
    }
}

/// The health prober: asks every node's gRPC health service (the
/// readiness service `""` and the liveness one in turn) every
/// [`PROBE_EVERY_MS`] and records each SERVING with the node's process
/// when asked and when answered; the oracle judges them against the times
/// the driver saw each process's Raft core stopped.
pub(super) async fn health_prober(stop_ms: u64, record: Shared) -> turmoil::Result {
    let mut chans = Channels::default();
    let mut round = 0u64;
    while now_ms() < stop_ms {
        round += 1;
        let service = if round.is_multiple_of(2) {
            String::new()
        } else {
            raftlock_node::leader::LIVENESS_SERVICE.to_string()
        };
        let asks = chans.of_members(&record).into_iter().map(|(id, ch)| {
            let (record, service) = (record.clone(), service.clone());
            let mut c = HealthClient::new(ch.clone());
            async move {
                let Some(incarnation_sent) = record.borrow().incarnation(id) else {
                    return;
                };
                let sent = now_ms();
                let req = tonic_health::pb::HealthCheckRequest { service };
                let answer = tokio::time::timeout(Duration::from_millis(200), c.check(req)).await;
                if let Ok(Ok(a)) = answer {
                    if a.into_inner().status == ServingStatus::Serving as i32 {
                        let incarnation_answered = record.borrow().incarnation(id).unwrap_or(0);
                        record.borrow_mut().servings.push(Serving {
                            node: id,
                            incarnation_sent,
                            incarnation_answered,
                            sent,
                        });
                    }
                }
            }
        });
        futures::future::join_all(asks.collect::<Vec<_>>()).await;
        tokio::time::sleep(Duration::from_millis(PROBE_EVERY_MS)).await;
    }
    Ok(())
}

/// A worker: sessions, and in each, lock / hold / release until `stop_ms`.
/// Every operation goes into the shared history too (`shared::History`),
/// as process `n`, then `n + workers`, `n + 2 * workers`, ... (a new one
/// after each operation of unknown outcome, as in the harness).
pub(super) async fn worker(
    n: usize,
    workers: usize,
    stop_ms: u64,
    mut rng: StdRng,
    record: Shared,
) -> turmoil::Result {
    until_ready(&record).await;
    let endpoints: Vec<String> = (1..=nodes()).map(addr).collect();
    let client = Client::with_options(endpoints, client_options())?;
    let mut process = n as u64;
    // Records an event of the current process; after an `info`, the
    // worker goes on as a new one.
    let mut history = |kind: Type, f: &str, value: serde_json::Value| {
        record
            .borrow_mut()
            .history
            .record(process, kind, f, value, now_ms());
        if kind == Type::Info {
            process += workers as u64;
        }
    };
    let error = |e: &raftlock_client::Error| json!({ "error": e.to_string() });
    while now_ms() < stop_ms {
        history(Type::Invoke, "open", json!({}));
        let session = match client.session(SESSION_TTL).await {
            Ok(s) => {
                history(Type::Ok, "open", json!({ "session": u64::from(s.id()) }));
                s
            }
            Err(e) => {
                history(shared::classify(&e), "open", error(&e));
                note(&record, format!("worker {n}: no session: {e}"));
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let sid = u64::from(session.id());
        let view = holders::View::of(&session);
        while now_ms() < stop_ms && session.is_valid() {
            let invoked = now_ms();
            let acquire = json!({"lock": LOCK, "mode": "exclusive", "session": sid});
            history(Type::Invoke, "acquire", acquire.clone());
            match session.lock_timeout(LOCK, Duration::from_secs(3)).await {
                Ok(guard) => {
                    let granted = now_ms();
                    let believed_from = believers::now_us();
                    let fence = u64::from(guard.fence());
                    let mut answer = acquire;
                    answer["fence"] = json!(fence);
                    history(Type::Ok, "acquire", answer);
                    let hold = rng.random_range(1..60);
                    tokio::time::sleep(Duration::from_millis(hold)).await;
                    let until = now_ms();
                    let valid = session.is_valid();
                    holders::believed(
                        &record,
                        &format!("worker {n}"),
                        "Rust client",
                        LOCK,
                        sid,
                        fence,
                        Held::Exclusive,
                        believed_from,
                        view.until(believers::now_us()),
                    );
                    note(
                        &record,
                        format!(
                            "worker {n}: fence {fence} asked {invoked} granted {granted} until \
                             {until} valid {valid}"
                        ),
                    );
                    record.borrow_mut().grants.push(Grant {
                        worker: n,
                        fence,
                        invoked,
                        granted,
                        until,
                        valid,
                    });
                    history(
                        Type::Invoke,
                        "release",
                        json!({"lock": LOCK, "fence": fence, "session": sid,
                               "lease_until_ns": lease_until_ns(&session)}),
                    );
                    match guard.release().await {
                        Ok(released) => {
                            history(Type::Ok, "release", json!({ "released": released }))
                        }
                        Err(e) => history(shared::classify(&e), "release", error(&e)),
                    }
                }
                Err(e) => {
                    history(shared::classify(&e), "acquire", error(&e));
                    note(&record, format!("worker {n}: lock failed: {e}"));
                    tokio::time::sleep(Duration::from_millis(rng.random_range(5..50))).await;
                }
            }
        }
        history(Type::Invoke, "close", json!({ "session": sid }));
        match session.close().await {
            Ok(()) => history(Type::Ok, "close", json!({ "session": sid })),
            // It ends at some unknown time (it expires: nobody renews it).
            Err(e) => history(Type::Info, "close", error(&e)),
        }
    }
    // Keep the client (and its connections) until the probe is done: a
    // client torn down meanwhile closed its connections at times that
    // varied from run to run of one seed.
    while record.borrow().probe_granted.is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// Waits until the workers may start.
pub(super) async fn until_ready(record: &Shared) {
    while !record.borrow().ready {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The client's own view of when its session's lease ends, in simulated
/// nanoseconds since the start of the run (0: it believes the lease gone),
/// as the harness records it on a release.
fn lease_until_ns(session: &raftlock_client::Session) -> u64 {
    match *session.lease().borrow() {
        raftlock_client::LeaseState::Valid(until) => {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            now_ms() * 1_000_000 + left.as_nanos() as u64
        }
        _ => 0,
    }
}

/// The liveness probe: once faults are off, a fresh session gets the lock
/// within [`LIVENESS_BOUND`].
pub(super) async fn probe(start_ms: u64, record: Shared) -> turmoil::Result {
    tokio::time::sleep(Duration::from_millis(start_ms.saturating_sub(now_ms()))).await;
    let endpoints: Vec<String> = record.borrow().members.iter().copied().map(addr).collect();
    let client = Client::with_options(endpoints, client_options())?;
    let started = now_ms();
    let deadline = tokio::time::Instant::now() + LIVENESS_BOUND;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err("liveness: no grant within the bound".into());
        }
        let attempt = async {
            let session = client.session(SESSION_TTL).await?;
            let guard = session.lock_timeout(LOCK, left).await?;
            Ok::<_, raftlock_client::Error>(u64::from(guard.fence()))
        };
        match tokio::time::timeout(left, attempt).await {
            Ok(Ok(fence)) => {
                note(
                    &record,
                    format!("probe: fence {fence} after {} ms", now_ms() - started),
                );
                record.borrow_mut().probe_granted = Some(fence);
                return Ok(());
            }
            Ok(Err(raftlock_client::Error::ResourceExhausted(e)))
                if record.borrow().restored_fence.is_some() && e.contains("largest fence") =>
            {
                // The refusal owed once fences have run out (the driver
                // checks that they had).
                note(&record, format!("probe: refused, fences ran out: {e}"));
                let mut r = record.borrow_mut();
                r.probe_exhausted = true;
                r.probe_granted = Some(0);
                return Ok(());
            }
            Ok(Err(e)) => {
                note(&record, format!("probe: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(_) => return Err("liveness: no grant within the bound".into()),
        }
    }
}

/// Starts the load: the lock workers, the keep-alive probers (an opener
/// per prober, an asker per node) and the health prober.
pub(super) fn start_workers(settings: &Settings, cluster: &mut Cluster<'_>) {
    let Cluster { sim, record, .. } = cluster;
    let stop_ms = settings.duration_ms;
    for n in 0..settings.workers {
        let rng = StdRng::seed_from_u64(settings.seed.wrapping_mul(31).wrapping_add(n as u64));
        sim.client(
            format!("w{n}"),
            worker(n, settings.workers, stop_ms, rng, record.clone()),
        );
    }
    for n in 0..PROBERS {
        sim.client(
            format!("opener{n}"),
            session_opener(n, stop_ms, record.clone()),
        );
    }
    for id in 1..=nodes() {
        sim.client(
            format!("asker{id}"),
            keepalive_asker(id, stop_ms, record.clone()),
        );
    }
    sim.client("health", health_prober(stop_ms, record.clone()));
}

/// Starts the belief oracle's clients on the paths `settings` drives.
pub(super) fn start_believers(settings: &Settings, cluster: &mut Cluster<'_>) {
    let Cluster { sim, record, .. } = cluster;
    let stop_ms = settings.duration_ms;
    // The clients of the belief oracle: every path of the lease rule.
    let paths: Vec<&'static str> = PATHS
        .iter()
        .copied()
        .filter(|p| settings.drives(p))
        .collect();
    let raw: Vec<&'static str> = paths
        .iter()
        .copied()
        .filter(|p| believers::RAW_PATHS.contains(p))
        .collect();
    if !raw.is_empty() {
        sim.client(
            "contender",
            believers::contender(
                stop_ms,
                StdRng::seed_from_u64(settings.seed ^ 0xc0_e7e4),
                record.clone(),
            ),
        );
        for n in 0..BELIEVERS {
            let rng = StdRng::seed_from_u64(settings.seed ^ (0xbe11_e7e0 + n as u64));
            sim.client(
                format!("b{n}"),
                believers::believer(n, stop_ms, raw.clone(), rng, record.clone()),
            );
        }
    }
    record.borrow_mut().round_trips_allowed = settings.drives("transfer");
    if settings.drives("transfer") {
        sim.client(
            "transferer",
            believers::transferer(
                stop_ms,
                StdRng::seed_from_u64(settings.seed ^ 0x7a45_fe7e),
                record.clone(),
            ),
        );
    }
    if settings.drives("revoke") {
        sim.client(
            "revoker",
            believers::revoker(
                stop_ms,
                StdRng::seed_from_u64(settings.seed ^ 0x7e70_6e7e),
                record.clone(),
            ),
        );
    }
    if settings.drives("bound") {
        // Two, so that one's session ending passes the name to the other;
        // only the first one's links are cut.
        for (n, name) in [BOUND_HOLDER, "e1"].into_iter().enumerate() {
            sim.client(
                name,
                holders::bound_holder(
                    name,
                    stop_ms,
                    StdRng::seed_from_u64(settings.seed ^ (0xb0_0d + n as u64)),
                    record.clone(),
                ),
            );
        }
    }
    if settings.drives("library") {
        // Two, so that reads of `U` meet: an upgrade then waits for the
        // other reader, and one withdrawn while waiting leaves the read
        // held (the client must say so only once the cluster shows it).
        for (n, host) in ["p0", "p1"].into_iter().enumerate() {
            sim.client(
                host,
                holders::path_holder(
                    n,
                    stop_ms,
                    StdRng::seed_from_u64(settings.seed ^ (0x9a_7400 + n as u64)),
                    record.clone(),
                ),
            );
        }
    }
}

/// Starts the hostile peer, the liveness probe (it waits for the end of
/// the faults), and a client that keeps the run going until every running
/// member has caught up.
pub(super) fn start_hostile_and_probe(settings: &Settings, cluster: &mut Cluster<'_>) {
    let Cluster { sim, record, .. } = cluster;
    let stop_ms = settings.duration_ms;
    let hostile_rng = StdRng::seed_from_u64(settings.seed ^ 0x0bad_9ee4);
    sim.client(
        "hostile",
        hostile_peer(stop_ms, hostile_rng, record.clone()),
    );
    // Registered now (it waits for the end of the faults): the run ends
    // when every client has.
    sim.client("probe", probe(stop_ms, record.clone()));
    // Keeps the run going until every running member has caught up (the
    // driver fails the run past CATCH_UP_BOUND).
    sim.client("catch-up", {
        let record = record.clone();
        async move {
            while !record.borrow().catch_up.is_some_and(|c| c.done) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok(())
        }
    });
}
