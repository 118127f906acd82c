//! The machinery of the bad-input tables: requests of every kind, how far
//! a refusal may get, and the check that it changed nothing it may not.

use raftlock_client::proto::cluster_client::ClusterClient;
use raftlock_client::proto::locks_client::LocksClient;
use raftlock_client::proto::{
    AcquireRequest, AddNodeRequest, CheckFenceRequest, CloseSessionRequest, DescribeRequest,
    ListRequest, LockInfo, Mode, OpenSessionRequest, ReleaseRequest, RemoveNodeRequest,
    WatchRequest,
};
use raftlock_testkit::status_at;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// What a refused request must leave untouched: the leader's table (counts,
/// fence counter, every name) and, for requests refused before they reach
/// the log, the applied index too.
#[derive(Debug, PartialEq)]
pub struct Table {
    pub counts: (u64, u64, u64, u64),
    pub names: Vec<LockInfo>,
}

pub struct Probe {
    pub addr: String,
    pub locks: LocksClient<Channel>,
    pub admin: ClusterClient<Channel>,
}

impl Probe {
    pub async fn table(&mut self) -> (u64, Table) {
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

/// A request of any kind the tables send.
pub enum Req {
    Open(OpenSessionRequest),
    Close(CloseSessionRequest),
    Acquire(AcquireRequest),
    Release(ReleaseRequest),
    Describe(DescribeRequest),
    CheckFence(CheckFenceRequest),
    Watch(WatchRequest),
    List(ListRequest),
    AddNode(AddNodeRequest),
    RemoveNode(RemoveNodeRequest),
}

macro_rules! req_from {
    ($($variant:ident($ty:ty)),* $(,)?) => {$(
        impl From<$ty> for Req {
            fn from(r: $ty) -> Req {
                Req::$variant(r)
            }
        }
    )*};
}

req_from!(
    Open(OpenSessionRequest),
    Close(CloseSessionRequest),
    Acquire(AcquireRequest),
    Release(ReleaseRequest),
    Describe(DescribeRequest),
    CheckFence(CheckFenceRequest),
    Watch(WatchRequest),
    List(ListRequest),
    AddNode(AddNodeRequest),
    RemoveNode(RemoveNodeRequest),
);

/// How far a refused request may get.
#[derive(Clone, Copy, Debug)]
pub enum Refused {
    /// Before the log: nothing changes, not even the applied index.
    Early,
    /// By the lock table: the request may be logged, but the table (names,
    /// counts, fence counter) stays the same.
    ByTable,
}

/// One row of a table: a request, the code it must get, and how far it
/// may get.
pub struct Case {
    pub what: String,
    pub code: Code,
    pub refused: Refused,
    pub req: Req,
}

pub fn case(refused: Refused, code: Code, what: impl Into<String>, req: impl Into<Req>) -> Case {
    Case {
        what: what.into(),
        code,
        refused,
        req: req.into(),
    }
}

/// Sends `req`; on success, the answer printed (for the failure message).
pub async fn send(
    locks: &mut LocksClient<Channel>,
    admin: &mut ClusterClient<Channel>,
    req: Req,
) -> Result<String, Status> {
    send_as(locks, admin, req, false).await
}

/// `message` as a request; `forwarded`: marked as forwarded by another
/// node (`raftlock-forwarded-by`), which a follower answers itself rather
/// than forwarding again.
pub fn marked<T>(message: T, forwarded: bool) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    if forwarded {
        req.metadata_mut().insert(
            raftlock_proto::FORWARDED_KEY,
            tonic::metadata::MetadataValue::from_static("99"),
        );
    }
    req
}

/// As [`send`], marked as forwarded if `forwarded` (see [`marked`]).
pub async fn send_as(
    locks: &mut LocksClient<Channel>,
    admin: &mut ClusterClient<Channel>,
    req: Req,
    forwarded: bool,
) -> Result<String, Status> {
    fn shown<T: std::fmt::Debug>(r: tonic::Response<T>) -> String {
        format!("{:?}", r.into_inner())
    }
    match req {
        Req::Open(r) => locks.open_session(marked(r, forwarded)).await.map(shown),
        Req::Close(r) => locks.close_session(marked(r, forwarded)).await.map(shown),
        Req::Acquire(r) => locks.acquire(marked(r, forwarded)).await.map(shown),
        Req::Release(r) => locks.release(marked(r, forwarded)).await.map(shown),
        Req::Describe(r) => locks.describe(marked(r, forwarded)).await.map(shown),
        Req::CheckFence(r) => locks.check_fence(marked(r, forwarded)).await.map(shown),
        Req::Watch(r) => locks
            .watch(marked(r, forwarded))
            .await
            .map(|_| "a watch stream".into()),
        Req::List(r) => locks.list(marked(r, forwarded)).await.map(shown),
        Req::AddNode(r) => admin.add_node(marked(r, forwarded)).await.map(shown),
        Req::RemoveNode(r) => admin.remove_node(marked(r, forwarded)).await.map(shown),
    }
}

/// Sends each case to the leader, in order: each must be refused with its
/// code and change nothing it may not. Returns the statuses.
pub async fn expect_refused(p: &mut Probe, cases: Vec<Case>) -> Vec<Status> {
    let mut statuses = Vec::with_capacity(cases.len());
    for c in cases {
        let before = p.table().await;
        let (mut locks, mut admin) = (p.locks.clone(), p.admin.clone());
        let status = match send(&mut locks, &mut admin, c.req).await {
            Ok(answer) => panic!("{}: accepted, expected {:?}: {answer}", c.what, c.code),
            Err(s) => s,
        };
        assert_eq!(status.code(), c.code, "{}: {status:?}", c.what);
        let after = p.table().await;
        match c.refused {
            Refused::Early => assert_eq!(after, before, "{}: changed something", c.what),
            Refused::ByTable => assert_eq!(after.1, before.1, "{}: changed the table", c.what),
        }
        statuses.push(status);
    }
    statuses
}

pub fn acquire(session_id: u64, seq: u64, name: &str, mode: Mode) -> AcquireRequest {
    AcquireRequest {
        session_id,
        seq,
        name: name.into(),
        mode: mode as i32,
        timeout_ms: 0,
        ..Default::default()
    }
}

pub fn semaphore(
    session_id: u64,
    seq: u64,
    name: &str,
    weight: u32,
    capacity: u32,
) -> AcquireRequest {
    AcquireRequest {
        weight,
        capacity,
        ..acquire(session_id, seq, name, Mode::Semaphore)
    }
}

pub fn open(ttl_ms: u64, lock_delay_ms: u64) -> OpenSessionRequest {
    OpenSessionRequest {
        ttl_ms,
        lock_delay_ms,
        nonce: 0,
        end_on_disconnect_ms: 0,
    }
}

pub fn release(session_id: u64, seq: u64, name: &str, fence: u64) -> ReleaseRequest {
    ReleaseRequest {
        session_id,
        seq,
        name: name.into(),
        fence,
    }
}

/// Sequence numbers for one session.
pub struct Seq(pub u64);

impl Seq {
    pub fn next(&mut self) -> u64 {
        self.0 += 1;
        self.0
    }
}

pub async fn grant(locks: &mut LocksClient<Channel>, req: AcquireRequest) -> u64 {
    let what = format!("{req:?}");
    let r = locks
        .acquire(req)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e:?}"))
        .into_inner();
    assert!(r.acquired, "{what} is granted");
    r.fence
}

pub async fn free(locks: &mut LocksClient<Channel>, req: ReleaseRequest) {
    assert!(
        locks
            .release(req)
            .await
            .expect("release")
            .into_inner()
            .released
    );
}
