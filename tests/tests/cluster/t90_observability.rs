//! Operators' view: Prometheus metrics and gRPC health checking.

use std::collections::BTreeMap;
use std::time::Duration;

use raftlock_node::node::{Node, NodeOptions};
use raftlock_testkit::{eventually, test_timing};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

async fn get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .expect("send");
    let mut body = String::new();
    s.read_to_string(&mut body).await.expect("read");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_and_health_on_a_single_node_cluster() {
    let dir = tempfile::tempdir().expect("dir");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let metrics = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let metrics_addr = metrics.local_addr().expect("addr").to_string();
    let node = Node::start_with_metrics(
        NodeOptions {
            id: 1,
            advertise: addr.clone(),
            peer_advertise: None,
            data_dir: dir.path().join("n1"),
            peers: BTreeMap::from([(1, raftlock_node::raft::NodeAddrs::shared(addr.clone()))]),
            init: true,
            timing: test_timing(),
            dial: BTreeMap::new(),
            tls: None,
            auth: Default::default(),
            storage_faults: Default::default(),
            prefix_labels: Default::default(),
            connector: None,
            storage: Default::default(),
            join: Vec::new(),
        },
        listener,
        Some(metrics),
    )
    .await
    .expect("starts");

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_lazy();
    let mut health = HealthClient::new(channel);
    eventually("health to answer SERVING", Duration::from_secs(20), || {
        let mut health = health.clone();
        async move {
            let r = health
                .check(HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .ok()?;
            (r.into_inner().status == ServingStatus::Serving as i32).then_some(())
        }
    })
    .await;
    let r = health
        .check(HealthCheckRequest {
            service: "raftlock.v1.Locks".into(),
        })
        .await
        .expect("locks service known");
    assert_eq!(r.into_inner().status, ServingStatus::Serving as i32);
    assert!(health
        .check(HealthCheckRequest {
            service: "nope".into()
        })
        .await
        .is_err());

    // Do some work, then scrape.
    let client = raftlock_client::Client::connect([addr.clone()])
        .await
        .expect("client");
    let session = client
        .session(Duration::from_secs(10))
        .await
        .expect("session");
    let g = session.lock("m").await.expect("lock");
    let body = get(&metrics_addr, "/metrics").await;
    assert!(
        body.starts_with("HTTP/1.0 200") || body.starts_with("HTTP/1.1 200"),
        "{body}"
    );
    for series in [
        "raftlock_term ",
        "raftlock_is_leader 1",
        "raftlock_leader_id 1",
        "raftlock_commit_index ",
        "raftlock_applied_index ",
        "raftlock_sessions 1",
        "raftlock_held_locks 1",
        "raftlock_waiters 0",
        "raftlock_grants_total 1",
        "raftlock_expiries_total 0",
        "# TYPE raftlock_raft_rpc_errors_total counter",
        "raftlock_request_duration_seconds_count{method=\"Acquire\"} 1",
        "raftlock_request_duration_seconds_bucket{method=\"Acquire\",le=\"+Inf\"} 1",
    ] {
        assert!(body.contains(series), "missing {series:?} in:\n{body}");
    }
    assert!(get(&metrics_addr, "/nope").await.contains("404"));
    // The write-stage breakdown: JSON with every stage; the acquire and the
    // session's open were timed; a reset empties it.
    let stages = get(&metrics_addr, "/debug/stages").await;
    assert!(stages.contains("application/json"), "{stages}");
    let json: serde_json::Value =
        serde_json::from_str(stages.split("\r\n\r\n").nth(1).expect("body")).expect("json");
    let count = |json: &serde_json::Value, stage: &str| {
        json.as_array()
            .expect("a list of stages")
            .iter()
            .find(|s| s["stage"] == stage)
            .unwrap_or_else(|| panic!("no {stage} in {json}"))["count"]
            .as_u64()
            .expect("count")
    };
    assert!(count(&json, "server_total") >= 2, "{json}");
    assert!(count(&json, "leader_append_sync") >= 2, "{json}");
    let mut s = TcpStream::connect(&metrics_addr).await.expect("connect");
    s.write_all(b"POST /debug/stages/reset HTTP/1.0\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        .await
        .expect("send");
    let mut answer = String::new();
    s.read_to_string(&mut answer).await.expect("read");
    assert!(answer.contains(" 200 "), "{answer}");
    let stages = get(&metrics_addr, "/debug/stages").await;
    let json: serde_json::Value =
        serde_json::from_str(stages.split("\r\n\r\n").nth(1).expect("body")).expect("json");
    assert_eq!(count(&json, "server_total"), 0, "{json}");
    g.release().await.expect("release");
    session.close().await.expect("close");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watches_past_the_limit_are_refused_and_the_node_stays_healthy() {
    use raftlock_client::proto::locks_client::LocksClient;
    use raftlock_client::proto::WatchRequest;
    use raftlock_node::api::locks::MAX_WATCHES;

    let cluster = raftlock_testkit::TestCluster::start(1).await;
    let addr = cluster.addr(1);
    // Several connections: one HTTP/2 connection carries at most
    // MAX_STREAMS_PER_CONNECTION streams.
    let channels: Vec<_> = (0..4)
        .map(|_| {
            tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .expect("endpoint")
                .connect_lazy()
        })
        .collect();
    let mut streams = Vec::new();
    for i in 0..MAX_WATCHES {
        let mut c = LocksClient::new(channels[i % channels.len()].clone());
        let s = c
            .watch(WatchRequest {
                name: String::new(),
                prefix: format!("w/{i}"),
            })
            .await
            .unwrap_or_else(|e| panic!("watch {i} refused: {e}"));
        streams.push(s.into_inner());
    }
    let mut c = LocksClient::new(channels[0].clone());
    let err = c
        .watch(WatchRequest {
            name: String::new(),
            prefix: "over".into(),
        })
        .await
        .expect_err("one watch too many");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);

    // The node still serves locks.
    let client = cluster.client().await;
    let session = client
        .session(Duration::from_secs(10))
        .await
        .expect("session");
    session
        .lock("still-fine")
        .await
        .expect("lock")
        .release()
        .await
        .expect("release");

    // Closing watches frees their slots.
    drop(streams.pop());
    eventually("a freed watch slot", Duration::from_secs(10), || {
        let mut c = c.clone();
        async move {
            c.watch(WatchRequest {
                name: String::new(),
                prefix: "again".into(),
            })
            .await
            .ok()
            .map(|_| ())
        }
    })
    .await;
    cluster.shutdown().await;
}

/// Every stage of a write is timed on a 3-node cluster: the leader's from
/// its handler to its reply, the followers' appends, a parked acquire's
/// wake-up (see `metrics::stages`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_writes_stages_are_timed_on_the_leader_and_the_followers() {
    use raftlock_node::metrics::stages::{Stage, StageReport};
    use raftlock_node::raft::WatchReceiver as _;
    let cluster = raftlock_testkit::TestCluster::start(3).await;
    let client = cluster.client().await;
    let a = client.session(Duration::from_secs(30)).await.expect("a");
    let b = client.session(Duration::from_secs(30)).await.expect("b");
    let term = |id: u64| {
        cluster
            .node(id)
            .raft
            .metrics()
            .borrow_watched()
            .current_term
    };
    let report = |id: u64| cluster.node(id).shared.metrics.stages.report();
    let count = |r: &[StageReport], stage: Stage| r[stage as usize].count;
    // The counts are per node: a leader change while the writes run (an
    // election on a loaded machine) spreads them over two leaders, and
    // the measurement is taken again (three tries at most).
    let mut attempt = 0;
    let (leader, on_leader) = loop {
        attempt += 1;
        let leader = cluster.leader().await;
        let term_before = term(leader);
        for id in cluster.running() {
            cluster.node(id).shared.metrics.stages.reset();
        }
        for i in 0..10 {
            let g = a.lock(&format!("s{attempt}/{i}")).await.expect("lock");
            g.release().await.expect("release");
        }
        // One acquire parked behind a holder, then woken by the release.
        let parked = format!("parked/{attempt}");
        let held = a.lock(&parked).await.expect("hold");
        let waiting = {
            let (b, parked) = (b.clone(), parked.clone());
            tokio::spawn(async move { b.lock(&parked).await.map(|g| g.fence()) })
        };
        eventually("b to be queued", Duration::from_secs(10), || async {
            let info = client.describe(&parked).await.ok().flatten()?;
            (!info.waiters.is_empty()).then_some(())
        })
        .await;
        held.release().await.expect("release");
        waiting.await.expect("task").expect("b granted");
        let stable = cluster.leader().await == leader && term(leader) == term_before;
        if stable || attempt == 3 {
            assert!(stable, "the leader changed in each of 3 tries");
            break (leader, report(leader));
        }
        eprintln!("the leader changed during try {attempt}: measuring again");
    };
    for stage in [
        Stage::Receive,
        Stage::BatchWait,
        Stage::Propose,
        Stage::LeaderAppend,
        Stage::ReplicationSend,
        Stage::ReplicationRoundTrip,
        Stage::Commit,
        Stage::Apply,
        Stage::Respond,
        Stage::Reply,
        Stage::Server,
    ] {
        // 23 writes; a busy machine can lower what a stage counts (writes
        // that wait together are proposed as one batch, and a write
        // retried after a late answer is answered from its session's
        // record), so half of them is the bar: every stage times writes.
        assert!(
            count(&on_leader, stage) >= 10,
            "{stage:?}: {} writes timed, want at least 10",
            count(&on_leader, stage)
        );
    }
    assert_eq!(
        count(&on_leader, Stage::WaiterWake),
        1,
        "one parked acquire woken: {on_leader:?}"
    );
    assert_eq!(
        count(&on_leader, Stage::FollowerAppend),
        0,
        "the leader appends as leader"
    );
    for id in cluster.running().into_iter().filter(|&id| id != leader) {
        let r = report(id);
        assert!(count(&r, Stage::FollowerAppend) > 0, "node {id}: {r:?}");
        assert_eq!(count(&r, Stage::Server), 0, "node {id} served no write");
    }
    cluster.shutdown().await;
}

/// The value of the series `series` (name and labels, exactly as exported)
/// in a Prometheus text exposition; `+Inf` is infinity.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The sum of every series of the family `prefix` starts (a metric name
/// and the first of its labels).
fn total(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Node-level metrics an SRE reads: a leader's per-peer replication lag and
/// time since contact follow its members (a killed follower's grow, its
/// failed RPCs are counted under its id; the live follower's stay small),
/// and every node exports its log-append and fsync latency, its data
/// directory's size and free space, process figures and its build.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_reports_each_peer_and_every_node_its_disk_and_process() {
    let mut cluster = raftlock_testkit::TestCluster::start(3).await;
    let leader = cluster.wait_for_leader().await;
    let mut followers = (1..=3).filter(|id| *id != leader);
    let (dead, live) = (
        followers.next().expect("one"),
        followers.next().expect("two"),
    );
    let client = cluster.client().await;
    let session = client
        .session(Duration::from_secs(10))
        .await
        .expect("session");
    session
        .lock("before")
        .await
        .expect("lock")
        .release()
        .await
        .expect("release");
    let metrics: BTreeMap<u64, String> = (1..=3).map(|id| (id, cluster.metrics_addr(id))).collect();
    let scrape = |id: u64| {
        let addr = metrics[&id].clone();
        async move {
            let (code, text) = raftlock_testkit::http(&addr, "GET", "/metrics", &[])
                .await
                .expect("metrics answer");
            assert_eq!(code, 200, "{text}");
            text
        }
    };
    for id in 1..=3 {
        let text = scrape(id).await;
        for (series, at_least) in [
            ("raftlock_fsync_duration_seconds_count", 1.0),
            ("raftlock_log_append_duration_seconds_count", 1.0),
            ("raftlock_data_size_bytes", 1.0),
            ("raftlock_disk_free_bytes", 1.0),
            ("raftlock_disk_size_bytes", 1.0),
            ("process_open_fds", 1.0),
            ("process_resident_memory_bytes", 1.0),
            ("process_cpu_seconds_total", 0.0),
            ("process_start_time_seconds", 1.0),
        ] {
            let v = value(&text, series).unwrap_or_else(|| panic!("node {id}: no {series}"));
            assert!(v >= at_least, "node {id}: {series} {v}");
        }
        assert!(text.contains("\nraftlock_build_info{version=\""), "{text}");
        let peer_series = text
            .lines()
            .any(|l| l.starts_with("raftlock_peer_last_contact_seconds{"));
        assert_eq!(
            peer_series,
            id == leader,
            "node {id}: per-peer series only on the leader"
        );
    }
    let healthy = scrape(leader).await;
    for peer in [dead, live] {
        let contact = value(
            &healthy,
            &format!("raftlock_peer_last_contact_seconds{{peer=\"{peer}\"}}"),
        )
        .unwrap_or_else(|| panic!("no contact series for {peer}:\n{healthy}"));
        assert!(contact < 1.0, "node {peer} was heard from {contact} s ago");
    }

    cluster.kill(dead).await;
    for i in 0..20 {
        session
            .lock(&format!("m{i}"))
            .await
            .expect("lock")
            .release()
            .await
            .expect("release");
    }
    let contact = |text: &str, peer: u64| {
        value(
            text,
            &format!("raftlock_peer_last_contact_seconds{{peer=\"{peer}\"}}"),
        )
    };
    let lag = |text: &str, peer: u64| {
        value(
            text,
            &format!("raftlock_peer_replication_lag_entries{{peer=\"{peer}\"}}"),
        )
    };
    let errors = |text: &str, peer: u64| {
        total(
            text,
            &format!("raftlock_raft_rpc_errors_total{{peer=\"{peer}\","),
        )
    };
    let text = eventually(
        "the leader to report the killed follower silent for over three seconds",
        Duration::from_secs(60),
        || async {
            let text = scrape(leader).await;
            (contact(&text, dead)? > 3.0).then_some(text)
        },
    )
    .await;
    assert!(
        lag(&text, dead).expect("lag") >= 40.0,
        "20 lock cycles behind:\n{text}"
    );
    assert!(
        errors(&text, dead) > 0.0,
        "failed RPCs to {dead} counted:\n{text}"
    );
    // The live follower was heard from since the dead one was (heartbeats
    // every tenth of a second on an idle machine; a comparison, not a
    // latency bound).
    assert!(
        contact(&text, live).expect("contact") < contact(&text, dead).expect("contact"),
        "{text}"
    );
    assert!(lag(&text, live).expect("lag") <= 2.0, "{text}");
    // Failed RPCs are counted under the peer they went to: the dead
    // follower's grow with every heartbeat, the live one's only when a
    // heartbeat was late (a loaded machine can make one or two late; a
    // comparison, not a count of zero).
    let new_dead = errors(&text, dead) - errors(&healthy, dead);
    let new_live = errors(&text, live) - errors(&healthy, live);
    println!(
        "failed RPCs since the kill: {new_dead} to the dead {dead}, {new_live} to the live {live}"
    );
    assert!(
        new_live < new_dead,
        "{new_live} new failed RPCs to the live {live}, {new_dead} to the dead {dead}:\n{text}"
    );
    session.close().await.expect("close");
}
