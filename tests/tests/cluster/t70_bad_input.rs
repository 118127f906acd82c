//! (g) Bad input over raw gRPC: every refusal carries its documented status
//! code and changes nothing; every limit is accepted at its edge.

use std::time::Duration;

use raftlock_client::proto::cluster_client::ClusterClient;
use raftlock_client::proto::locks_client::LocksClient;
use raftlock_client::proto::{
    AcquireRequest, AddNodeRequest, CheckFenceRequest, CloseSessionRequest, DescribeRequest,
    KeepAliveRequest, ListRequest, LockInfo, MembersRequest, Mode, OpenSessionRequest,
    ReleaseRequest, RemoveNodeRequest, WatchRequest,
};
use raftlock_testkit::{cluster_at, eventually, locks_at, status_at, TestCluster};
use tonic::transport::Channel;
use tonic::{Code, Response, Status};

/// What a refused request must leave untouched: the leader's table (counts,
/// fence counter, every name) and, for requests refused before they reach
/// the log, the applied index too.
#[derive(Debug, PartialEq)]
struct Table {
    counts: (u64, u64, u64, u64),
    names: Vec<LockInfo>,
}

struct Probe {
    addr: String,
    locks: LocksClient<Channel>,
}

impl Probe {
    async fn table(&mut self) -> (u64, Table) {
        let s = status_at(&self.addr).await;
        let list = self
            .locks
            .list(ListRequest {
                prefix: String::new(),
                page_token: String::new(),
                limit: 1000,
                stale: false,
            })
            .await
            .expect("list")
            .into_inner();
        // The listing's index is the one its table reflects (Status's
        // applied_index comes from Raft metrics, which trail the table).
        (
            list.index,
            Table {
                counts: (s.sessions, s.grants, s.waiters, s.last_fence),
                names: list.locks,
            },
        )
    }
}

/// Asserts `result` failed with `code`; returns the status.
fn refused<T: std::fmt::Debug>(
    result: Result<Response<T>, Status>,
    code: Code,
    what: &str,
) -> Status {
    match result {
        Ok(r) => panic!("{what}: accepted, expected {code:?}: {:?}", r.into_inner()),
        Err(s) => {
            assert_eq!(s.code(), code, "{what}: {s:?}");
            s
        }
    }
}

/// Runs a request that must be refused with `code` before reaching the log:
/// nothing changes, not even the applied index.
macro_rules! refused_early {
    ($probe:expr, $code:expr, $what:expr, $call:expr) => {{
        let before = $probe.table().await;
        let status = refused($call.await, $code, $what);
        assert_eq!($probe.table().await, before, "{}: changed something", $what);
        status
    }};
}

/// Runs a request that must be refused with `code` (it may be logged, but
/// the table stays the same).
macro_rules! refused_by_table {
    ($probe:expr, $code:expr, $what:expr, $call:expr) => {{
        let before = $probe.table().await.1;
        let status = refused($call.await, $code, $what);
        assert_eq!(
            $probe.table().await.1,
            before,
            "{}: changed the table",
            $what
        );
        status
    }};
}

fn acquire(session_id: u64, seq: u64, name: &str, mode: Mode) -> AcquireRequest {
    AcquireRequest {
        session_id,
        seq,
        name: name.into(),
        mode: mode as i32,
        timeout_ms: 0,
        ..Default::default()
    }
}

fn semaphore(session_id: u64, seq: u64, name: &str, weight: u32, capacity: u32) -> AcquireRequest {
    AcquireRequest {
        weight,
        capacity,
        ..acquire(session_id, seq, name, Mode::Semaphore)
    }
}

fn open(ttl_ms: u64, lock_delay_ms: u64) -> OpenSessionRequest {
    OpenSessionRequest {
        ttl_ms,
        lock_delay_ms,
        nonce: 0,
    }
}

fn release(session_id: u64, seq: u64, name: &str, fence: u64) -> ReleaseRequest {
    ReleaseRequest {
        session_id,
        seq,
        name: name.into(),
        fence,
    }
}

/// Sequence numbers for one session.
struct Seq(u64);

impl Seq {
    fn next(&mut self) -> u64 {
        self.0 += 1;
        self.0
    }
}

async fn grant(locks: &mut LocksClient<Channel>, req: AcquireRequest) -> u64 {
    let what = format!("{req:?}");
    let r = locks
        .acquire(req)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e:?}"))
        .into_inner();
    assert!(r.acquired, "{what} is granted");
    r.fence
}

async fn free(locks: &mut LocksClient<Channel>, req: ReleaseRequest) {
    assert!(
        locks
            .release(req)
            .await
            .expect("release")
            .into_inner()
            .released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_requests_get_documented_codes_and_change_nothing() {
    let cluster = TestCluster::start(3).await;
    let leader = cluster.leader().await;
    let addr = cluster.addr(leader);
    let mut locks = locks_at(&addr);
    let mut p = Probe {
        addr: addr.clone(),
        locks: locks.clone(),
    };

    let s = locks
        .open_session(open(60_000, 0))
        .await
        .expect("open")
        .into_inner()
        .session_id;
    let t = locks
        .open_session(open(60_000, 0))
        .await
        .expect("open")
        .into_inner()
        .session_id;
    let (mut ss, mut ts) = (Seq(0), Seq(0));
    let held = grant(
        &mut locks,
        acquire(s, ss.next(), "bad/held", Mode::Exclusive),
    )
    .await;
    grant(&mut locks, semaphore(s, ss.next(), "bad/sem", 1, 3)).await;

    // Names: 1..=512 bytes of UTF-8.
    let n512 = "n".repeat(512);
    let n513 = "n".repeat(513);
    let e512 = "é".repeat(256); // 512 bytes in 256 characters
    let e513 = format!("{e512}x");
    refused_early!(
        p,
        Code::InvalidArgument,
        "empty name",
        locks.acquire(acquire(s, ss.next(), "", Mode::Exclusive))
    );
    refused_early!(
        p,
        Code::InvalidArgument,
        "513-byte name",
        locks.acquire(acquire(s, ss.next(), &n513, Mode::Exclusive))
    );
    refused_early!(
        p,
        Code::InvalidArgument,
        "513-byte UTF-8 name",
        locks.acquire(acquire(s, ss.next(), &e513, Mode::Shared))
    );
    refused_early!(
        p,
        Code::InvalidArgument,
        "release of an empty name",
        locks.release(release(s, ss.next(), "", held))
    );
    refused_early!(
        p,
        Code::InvalidArgument,
        "release of a 513-byte name",
        locks.release(release(s, ss.next(), &n513, held))
    );
    refused_early!(
        p,
        Code::InvalidArgument,
        "describe of an empty name",
        locks.describe(DescribeRequest {
            name: String::new(),
            stale: false
        })
    );
    refused_early!(
        p,
        Code::InvalidArgument,
        "check_fence on a 513-byte name",
        locks.check_fence(CheckFenceRequest {
            name: n513.clone(),
            fence: held,
            stale: false
        })
    );
    refused_early!(
        p,
        Code::InvalidArgument,
        "watch of a 513-byte name",
        locks.watch(WatchRequest {
            name: n513.clone(),
            prefix: String::new()
        })
    );
    refused_early!(
        p,
        Code::InvalidArgument,
        "list limit 1001",
        locks.list(ListRequest {
            prefix: String::new(),
            page_token: String::new(),
            limit: 1001,
            stale: false
        })
    );
    for name in [&n512, &e512] {
        let fence = grant(&mut locks, acquire(s, ss.next(), name, Mode::Exclusive)).await;
        free(&mut locks, release(s, ss.next(), name, fence)).await;
    }

    // Holder values: at most 4096 bytes.
    let big = AcquireRequest {
        value: vec![7; 4097],
        ..acquire(s, ss.next(), "bad/v", Mode::Exclusive)
    };
    refused_early!(
        p,
        Code::InvalidArgument,
        "value of 4097 bytes",
        locks.acquire(big)
    );
    let fits = AcquireRequest {
        value: vec![7; 4096],
        ..acquire(s, ss.next(), "bad/v", Mode::Exclusive)
    };
    let fence = grant(&mut locks, fits).await;
    let info = locks
        .describe(DescribeRequest {
            name: "bad/v".into(),
            stale: false,
        })
        .await
        .expect("describe");
    assert_eq!(
        info.into_inner().info.expect("held").holders[0].value.len(),
        4096
    );
    free(&mut locks, release(s, ss.next(), "bad/v", fence)).await;

    // Session ttl 1000..=3_600_000 ms; lock-delay at most 60_000 ms.
    for (ttl, delay) in [
        (999, 0),
        (3_600_001, 0),
        (0, 0),
        (u64::MAX, 0),
        (10_000, 60_001),
    ] {
        refused_early!(
            p,
            Code::InvalidArgument,
            &format!("ttl {ttl} / lock-delay {delay}"),
            locks.open_session(open(ttl, delay))
        );
    }
    for (ttl, delay) in [(1_000, 0), (3_600_000, 60_000)] {
        let r = locks
            .open_session(open(ttl, delay))
            .await
            .expect("edge accepted")
            .into_inner();
        assert_eq!((r.ttl_ms, r.lock_delay_ms), (ttl, delay));
        locks
            .close_session(CloseSessionRequest {
                session_id: r.session_id,
                seq: 1,
            })
            .await
            .expect("close");
    }

    // Semaphores: capacity 1..=1_000_000, weight 1..=capacity.
    for (weight, capacity) in [(0, 3), (4, 3), (1, 0), (0, 0), (1, 1_000_001)] {
        refused_early!(
            p,
            Code::InvalidArgument,
            &format!("weight {weight} of capacity {capacity}"),
            locks.acquire(semaphore(s, ss.next(), "bad/sem2", weight, capacity))
        );
    }
    let fence = grant(
        &mut locks,
        semaphore(s, ss.next(), "bad/sem2", 1_000_000, 1_000_000),
    )
    .await;
    free(&mut locks, release(s, ss.next(), "bad/sem2", fence)).await;
    refused_by_table!(
        p,
        Code::FailedPrecondition,
        "capacity mismatch",
        locks.acquire(semaphore(t, ts.next(), "bad/sem", 1, 4))
    );
    refused_by_table!(
        p,
        Code::FailedPrecondition,
        "a lock on a semaphore",
        locks.acquire(acquire(t, ts.next(), "bad/sem", Mode::Exclusive))
    );
    refused_by_table!(
        p,
        Code::FailedPrecondition,
        "a semaphore on a lock",
        locks.acquire(semaphore(t, ts.next(), "bad/held", 1, 3))
    );
    refused_by_table!(
        p,
        Code::FailedPrecondition,
        "the holder asking again in another mode",
        locks.acquire(acquire(s, ss.next(), "bad/held", Mode::Shared))
    );

    // Modes: unknown numbers are refused.
    for mode in [3, 7, -1] {
        let req = AcquireRequest {
            mode,
            ..acquire(s, ss.next(), "bad/m", Mode::Exclusive)
        };
        refused_early!(
            p,
            Code::InvalidArgument,
            &format!("mode {mode}"),
            locks.acquire(req)
        );
    }

    // Unknown sessions.
    let ghost = 999_999;
    refused_by_table!(
        p,
        Code::NotFound,
        "acquire on an unknown session",
        locks.acquire(acquire(ghost, 1, "bad/g", Mode::Exclusive))
    );
    refused_by_table!(
        p,
        Code::NotFound,
        "release on an unknown session",
        locks.release(release(ghost, 2, "bad/held", held))
    );
    refused_by_table!(
        p,
        Code::NotFound,
        "close of an unknown session",
        locks.close_session(CloseSessionRequest {
            session_id: ghost,
            seq: 3
        })
    );
    let mut ka = locks
        .keep_alive(futures::stream::iter([KeepAliveRequest {
            session_id: ghost,
        }]))
        .await
        .expect("keep-alive stream")
        .into_inner();
    // An unknown session gets its own answer on the stream: expired.
    let answer = ka
        .message()
        .await
        .expect("an answer")
        .expect("not the end of the stream");
    assert_eq!(
        (answer.session_id, answer.ttl_ms, answer.expired),
        (ghost, 0, true)
    );

    // Releases that do not match a grant are answered, not refused.
    let before = p.table().await.1;
    let r = locks
        .release(release(s, ss.next(), "bad/held", held + 1000))
        .await
        .expect("wrong fence");
    assert!(!r.into_inner().released, "a wrong fence releases nothing");
    let r = locks
        .release(release(t, ts.next(), "bad/held", held))
        .await
        .expect("not the owner");
    assert!(
        !r.into_inner().released,
        "another session cannot release s's grant"
    );
    let r = locks
        .release(release(s, ss.next(), "bad/nothing", 1))
        .await
        .expect("nothing held");
    assert!(!r.into_inner().released);
    assert_eq!(
        p.table().await.1,
        before,
        "non-matching releases changed the table"
    );
    let check = locks.check_fence(CheckFenceRequest {
        name: "bad/held".into(),
        fence: held,
        stale: false,
    });
    assert!(
        check.await.expect("check").into_inner().current,
        "s still holds bad/held"
    );

    // Deadlock: s holds d1 and waits for d2; t holds d2 and asks for d1.
    let d1 = grant(&mut locks, acquire(s, ss.next(), "bad/d1", Mode::Exclusive)).await;
    let d2 = grant(&mut locks, acquire(t, ts.next(), "bad/d2", Mode::Exclusive)).await;
    let s_waits = tokio::spawn({
        let mut locks = locks.clone();
        let req = AcquireRequest {
            timeout_ms: 30_000,
            ..acquire(s, ss.next(), "bad/d2", Mode::Exclusive)
        };
        async move { locks.acquire(req).await }
    });
    eventually("s to queue for bad/d2", Duration::from_secs(10), || {
        let mut locks = locks.clone();
        async move {
            let info = locks
                .describe(DescribeRequest {
                    name: "bad/d2".into(),
                    stale: false,
                })
                .await
                .ok()?;
            (info.into_inner().info?.waiters.len() == 1).then_some(())
        }
    })
    .await;
    let req = AcquireRequest {
        timeout_ms: 30_000,
        ..acquire(t, ts.next(), "bad/d1", Mode::Exclusive)
    };
    let status = refused_by_table!(p, Code::Aborted, "deadlock", locks.acquire(req));
    for session in [s, t] {
        assert!(
            status.message().contains(&format!("session {session}")),
            "cycle names {session}: {status:?}"
        );
    }
    free(&mut locks, release(t, ts.next(), "bad/d2", d2)).await;
    let r = s_waits
        .await
        .expect("join")
        .expect("s granted bad/d2")
        .into_inner();
    assert!(r.acquired && r.fence > d2);
    free(&mut locks, release(s, ss.next(), "bad/d2", r.fence)).await;
    free(&mut locks, release(s, ss.next(), "bad/d1", d1)).await;

    // Requests larger than the node accepts are refused without harm.
    // tonic's decoder refuses them with OUT_OF_RANGE before any handler
    // runs; the proto's error model does not list that code, and the client
    // maps it to InvalidArgument, so either is accepted here.
    let huge = "h".repeat(100 * 1024);
    let before = p.table().await;
    let st = locks
        .acquire(acquire(s, ss.next(), &huge, Mode::Exclusive))
        .await
        .expect_err("a 100 KiB request");
    assert!(
        matches!(st.code(), Code::OutOfRange | Code::InvalidArgument),
        "{st:?}"
    );
    assert_eq!(
        p.table().await,
        before,
        "a 100 KiB request changed something"
    );

    // Retries older than the remembered window are refused, not re-applied.
    let u = locks
        .open_session(open(60_000, 0))
        .await
        .expect("open")
        .into_inner()
        .session_id;
    let first = locks
        .release(release(u, 1, "bad/nothing", 1))
        .await
        .expect("release")
        .into_inner();
    assert!(!first.released);
    let window: Vec<_> = (2..=300)
        .map(|seq| {
            let mut locks = locks.clone();
            async move { locks.release(release(u, seq, "bad/nothing", 1)).await }
        })
        .collect();
    for r in futures::future::join_all(window).await {
        assert!(!r.expect("release").into_inner().released);
    }
    let replay = locks
        .release(release(u, 300, "bad/nothing", 1))
        .await
        .expect("a recent retry is answered");
    assert!(!replay.into_inner().released);
    refused_by_table!(
        p,
        Code::FailedPrecondition,
        "a retry older than the window",
        locks.release(release(u, 1, "bad/nothing", 1))
    );
    locks
        .close_session(CloseSessionRequest {
            session_id: u,
            seq: 301,
        })
        .await
        .expect("close");

    // Followers refuse writes and linearizable reads, naming the leader.
    let follower = cluster
        .running()
        .into_iter()
        .find(|id| *id != leader)
        .expect("follower");
    let mut flocks = locks_at(&cluster.addr(follower));
    let check_hint = |status: Status, what: &str| {
        assert_eq!(status.code(), Code::Unavailable, "{what}: {status:?}");
        let md = status.metadata();
        assert_eq!(
            md.get("raftlock-leader").and_then(|v| v.to_str().ok()),
            Some(addr.as_str()),
            "{what}: {status:?}"
        );
        assert_eq!(
            md.get("raftlock-leader-id").and_then(|v| v.to_str().ok()),
            Some(leader.to_string().as_str()),
            "{what}"
        );
        // The machine-readable "not the leader, not applied" marker.
        assert_eq!(
            md.get(raftlock_proto::NOT_LEADER_KEY)
                .and_then(|v| v.to_str().ok()),
            Some("1"),
            "{what}"
        );
    };
    let st = refused_early!(
        p,
        Code::Unavailable,
        "open on a follower",
        flocks.open_session(open(10_000, 0))
    );
    check_hint(st, "open on a follower");
    let st = refused_early!(
        p,
        Code::Unavailable,
        "acquire on a follower",
        flocks.acquire(acquire(s, ss.next(), "bad/f", Mode::Exclusive))
    );
    check_hint(st, "acquire on a follower");
    let st = refused_early!(
        p,
        Code::Unavailable,
        "release on a follower",
        flocks.release(release(s, ss.next(), "bad/held", held))
    );
    check_hint(st, "release on a follower");
    let st = refused(
        flocks
            .describe(DescribeRequest {
                name: "bad/held".into(),
                stale: false,
            })
            .await,
        Code::Unavailable,
        "linearizable read on a follower",
    );
    check_hint(st, "linearizable read on a follower");
    let mut fka = flocks
        .keep_alive(futures::stream::iter([KeepAliveRequest { session_id: s }]))
        .await
        .expect("keep-alive stream")
        .into_inner();
    check_hint(
        fka.message().await.expect_err("keep-alive on a follower"),
        "keep-alive on a follower",
    );
    let stale = flocks
        .describe(DescribeRequest {
            name: "bad/held".into(),
            stale: true,
        })
        .await
        .expect("stale read");
    assert_eq!(
        stale.into_inner().info.expect("held").holders[0].fence,
        held
    );

    // Membership changes with bad arguments.
    let mut admin: ClusterClient<Channel> = cluster_at(&addr);
    let members = admin
        .members(MembersRequest {})
        .await
        .expect("members")
        .into_inner()
        .members;
    let good = "127.0.0.1:7999";
    let bad_adds = [
        (0, good, ""),
        (9, "", ""),
        (9, "not-an-address", ""),
        (9, "127.0.0.1", ""),
        (9, ":7999", ""),
        (9, "127.0.0.1:0", ""),
        (9, "127.0.0.1:99999", ""),
        (9, "a:1/b:2", ""),
        (9, good, "not-an-address"),
        (9, good, "127.0.0.1:0"),
        (9, good, " "),
    ];
    for (id, a, peer) in bad_adds {
        let what = format!("add node {id} at {a:?} (peers: {peer:?})");
        refused_early!(
            p,
            Code::InvalidArgument,
            &what,
            admin.add_node(AddNodeRequest {
                id,
                addr: a.into(),
                peer_addr: peer.into(),
                learner_only: false,
                catch_up_timeout_ms: 0,
            })
        );
    }
    let taken = AddNodeRequest {
        id: leader,
        addr: "127.0.0.1:1".into(),
        peer_addr: String::new(),
        learner_only: false,
        catch_up_timeout_ms: 0,
    };
    refused_early!(
        p,
        Code::FailedPrecondition,
        "add an existing id at another address",
        admin.add_node(taken)
    );
    refused_early!(
        p,
        Code::NotFound,
        "remove a non-member",
        admin.remove_node(RemoveNodeRequest { id: 77 })
    );
    let after = admin
        .members(MembersRequest {})
        .await
        .expect("members")
        .into_inner()
        .members;
    assert_eq!(after, members, "membership unchanged");

    // After all that, the leader still holds exactly the original state.
    let (_, end) = p.table().await;
    assert_eq!(end.counts.0, 2, "sessions s and t");
    assert_eq!(end.counts.1, 2, "bad/held and bad/sem");
    assert_eq!(
        end.names
            .iter()
            .map(|i| i.name.as_str())
            .collect::<Vec<_>>(),
        ["bad/held", "bad/sem"]
    );
    cluster.shutdown().await;
}
