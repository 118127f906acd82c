//! Keep-alive answers are credited to the ask they answer (review finding
//! 3). A fake `Locks` server holds the answer to one of session S's asks
//! until S has given up on it and asked again, then delivers it (and never
//! answers the new ask). Another session R on the same stream keeps it
//! alive meanwhile, as one client's sessions share it. Crediting the late
//! answer to the new ask would count S's lease from the new ask's send
//! time, beyond what the leader renewed; the client's view must never end
//! after the held ask's send time + ttl - margin.
//!
//! The same fake also plays a cluster whose answer to an `Upgrade` is lost
//! (`UpgradeFake`): the read's guard must not say it holds while nobody
//! knows whether the upgrade, granted and then withdrawn, took the read
//! with it.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;
use raftlock_client::proto as pb;
use raftlock_client::proto::locks_server::{Locks, LocksServer};
use raftlock_client::{Client, LeaseState, SessionOptions};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

/// The session whose second keep-alive answer is held.
const HELD_SESSION: u64 = 7;
/// The other session on the stream.
const OTHER_SESSION: u64 = 8;
const TTL_MS: u64 = 3_000;

#[derive(Default)]
struct State {
    /// Sessions opened so far (S first, then R).
    opened: Mutex<u64>,
    /// When the held ask arrived.
    held_at: Mutex<Option<Instant>>,
    /// The other fake: the first keep-alive stream answers its first ask
    /// only, every later stream answers everything.
    first_stream_goes_silent: bool,
    /// Streams opened so far (that fake).
    streams: Mutex<u32>,
    /// "answer K" and "closed K" for stream K, in order (that fake).
    events: Mutex<Vec<String>>,
    /// The third fake: every keep-alive is answered, an acquire grants a
    /// read, and every upgrade's answer is lost.
    upgrade: Option<UpgradeFake>,
}

/// What the upgrade fake answers and saw.
#[derive(Default)]
struct UpgradeFake {
    /// What `CheckFence` answers for the read after the withdrawal: true
    /// as if the upgrade had not been granted (the Cancel withdrew a
    /// wait), false as if it had (the Cancel released it, the read ended
    /// with the upgrade).
    read_survives: bool,
    /// Cancels and fence checks received.
    cancels: Mutex<u32>,
    checks: Mutex<u32>,
}

/// The fence of the read the upgrade fake grants.
const READ_FENCE: u64 = 41;

#[derive(Clone, Default)]
struct Fake(Arc<State>);

fn renewed(session_id: u64, ask_id: u64) -> pb::KeepAliveResponse {
    pb::KeepAliveResponse {
        session_id,
        ttl_ms: TTL_MS,
        expired: false,
        ask_id,
    }
}

type Answers = Pin<Box<dyn Stream<Item = Result<pb::KeepAliveResponse, Status>> + Send>>;
type Events = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Locks for Fake {
    async fn open_session(
        &self,
        _: Request<pb::OpenSessionRequest>,
    ) -> Result<Response<pb::OpenSessionResponse>, Status> {
        let mut opened = self.0.opened.lock().unwrap();
        *opened += 1;
        Ok(Response::new(pb::OpenSessionResponse {
            session_id: HELD_SESSION + *opened - 1,
            ttl_ms: TTL_MS,
            ..Default::default()
        }))
    }

    type KeepAliveStream = Answers;

    async fn keep_alive(
        &self,
        req: Request<Streaming<pb::KeepAliveRequest>>,
    ) -> Result<Response<Answers>, Status> {
        let mut inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(64);
        let fake = self.clone();
        if fake.0.first_stream_goes_silent {
            let k = {
                let mut streams = fake.0.streams.lock().unwrap();
                *streams += 1;
                *streams
            };
            let event = move |what: &str| fake.0.events.lock().unwrap().push(format!("{what} {k}"));
            tokio::spawn(async move {
                let mut answered = 0;
                while let Ok(Some(ask)) = inbound.message().await {
                    if k == 1 && answered == 1 {
                        continue;
                    }
                    answered += 1;
                    event("answer");
                    if tx
                        .send(Ok(renewed(ask.session_id, ask.ask_id)))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
                event("closed");
            });
            return Ok(Response::new(Box::pin(ReceiverStream::new(rx))));
        }
        tokio::spawn(async move {
            let mut asks: HashMap<u64, u32> = HashMap::new();
            let mut held = None;
            while let Ok(Some(ask)) = inbound.message().await {
                let n = asks.entry(ask.session_id).or_default();
                *n += 1;
                let answer = match (ask.session_id, *n) {
                    _ if fake.0.upgrade.is_some() => Some(renewed(ask.session_id, ask.ask_id)),
                    (HELD_SESSION, 1) => Some(renewed(ask.session_id, ask.ask_id)),
                    (HELD_SESSION, 2) => {
                        *fake.0.held_at.lock().unwrap() = Some(Instant::now());
                        held = Some(renewed(ask.session_id, ask.ask_id));
                        None
                    }
                    // The ask after the held one: the held answer arrives
                    // now, and this one is never answered.
                    (HELD_SESSION, 3) => held.take(),
                    (HELD_SESSION, _) => None,
                    _ => Some(renewed(ask.session_id, ask.ask_id)),
                };
                if let Some(a) = answer {
                    if tx.send(Ok(a)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn close_session(
        &self,
        _: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        if self.0.upgrade.is_none() {
            return Err(Status::unimplemented("fake"));
        }
        Ok(Response::new(pb::CloseSessionResponse::default()))
    }

    async fn acquire(
        &self,
        _: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::AcquireResponse>, Status> {
        if self.0.upgrade.is_none() {
            return Err(Status::unimplemented("fake"));
        }
        Ok(Response::new(pb::AcquireResponse {
            acquired: true,
            fence: READ_FENCE,
            mode: pb::Mode::Shared as i32,
            ..Default::default()
        }))
    }

    async fn release(
        &self,
        _: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        if self.0.upgrade.is_none() {
            return Err(Status::unimplemented("fake"));
        }
        Ok(Response::new(pb::ReleaseResponse::default()))
    }

    async fn cancel(
        &self,
        _: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelResponse>, Status> {
        let Some(u) = &self.0.upgrade else {
            return Err(Status::unimplemented("fake"));
        };
        *u.cancels.lock().unwrap() += 1;
        Ok(Response::new(pb::CancelResponse { cancelled: true }))
    }

    async fn describe(
        &self,
        _: Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::DescribeResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn list(
        &self,
        _: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn check_fence(
        &self,
        req: Request<pb::CheckFenceRequest>,
    ) -> Result<Response<pb::CheckFenceResponse>, Status> {
        let Some(u) = &self.0.upgrade else {
            return Err(Status::unimplemented("fake"));
        };
        *u.checks.lock().unwrap() += 1;
        let current = req.get_ref().fence == READ_FENCE && u.read_survives;
        Ok(Response::new(pb::CheckFenceResponse {
            current,
            ..Default::default()
        }))
    }

    async fn lock(
        &self,
        _: Request<pb::LockRequest>,
    ) -> Result<Response<pb::LockResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn unlock(
        &self,
        _: Request<pb::UnlockRequest>,
    ) -> Result<Response<pb::UnlockResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn set_session_ttl(
        &self,
        _: Request<pb::SetSessionTtlRequest>,
    ) -> Result<Response<pb::SetSessionTtlResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn upgrade(
        &self,
        _: Request<pb::UpgradeRequest>,
    ) -> Result<Response<pb::AcquireResponse>, Status> {
        if self.0.upgrade.is_none() {
            return Err(Status::unimplemented("fake"));
        }
        // Without `raftlock-not-leader`: it may have been applied.
        Err(Status::unavailable(
            "fake: the answer to this upgrade was lost",
        ))
    }

    async fn downgrade(
        &self,
        _: Request<pb::DowngradeRequest>,
    ) -> Result<Response<pb::DowngradeResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn acquire_all(
        &self,
        _: Request<pb::AcquireAllRequest>,
    ) -> Result<Response<pb::AcquireAllResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    type WatchStream = Events;

    async fn watch(&self, _: Request<pb::WatchRequest>) -> Result<Response<Events>, Status> {
        Err(Status::unimplemented("fake"))
    }
}

/// Serves `fake` on a free loopback port; its address.
async fn serve(fake: &Fake) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(LocksServer::new(fake.clone()))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_answer_is_never_credited_to_a_later_ask() {
    let fake = Fake::default();
    let addr = serve(&fake).await;
    let client = Client::connect([addr.to_string()]).await.expect("client");
    // Renewed on the ttl's cadence only (no end-on-disconnect grace: that
    // renews at once after opening, an ask this fake does not expect).
    let options = SessionOptions {
        ttl: Duration::from_millis(TTL_MS),
        end_on_disconnect: None,
        ..SessionOptions::default()
    };
    let margin = Duration::from_millis(TTL_MS).mul_f64(options.margin);
    let s = client.session_with(options.clone()).await.expect("S");
    assert_eq!(s.id().get(), HELD_SESSION);
    let r = client.session_with(options).await.expect("R");
    assert_eq!(r.id().get(), OTHER_SESSION);

    // Follow S's lease view until it is lost (or well past when the late
    // answer would have carried it).
    let mut lease = s.lease();
    let mut latest = None;
    let end = Instant::now() + Duration::from_millis(3 * TTL_MS);
    loop {
        match *lease.borrow_and_update() {
            LeaseState::Valid(until) => latest = Some(until),
            LeaseState::Lost | LeaseState::Closed => break,
        }
        if tokio::time::timeout_at(end, lease.changed()).await.is_err() {
            break;
        }
    }
    let held_at = fake
        .0
        .held_at
        .lock()
        .unwrap()
        .expect("S's second keep-alive reached the server");
    let latest = latest.expect("a valid lease was seen");
    let bound = held_at + Duration::from_millis(TTL_MS) - margin;
    assert!(
        latest <= bound,
        "S's lease view ran {:?} past the held ask's send time + ttl - margin: the late \
         answer was credited to a later ask",
        latest - bound
    );
    assert!(
        !s.is_valid(),
        "S's lease ran out: nothing renewed it after the held ask"
    );
}

/// A keep-alive stream that stops answering (a hung leader with the
/// connection up) is replaced, and stays open until the new stream has
/// renewed: closing it first would start the leader's end-on-disconnect
/// grace for every session it carried, and a leader that comes back before
/// a new stream renews them would end a live process's sessions (docs/clients/writing-a-client.md
/// duties: open a replacement stream before closing a silent one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_stream_stays_open_until_its_replacement_renews() {
    let fake = Fake(Arc::new(State {
        first_stream_goes_silent: true,
        ..State::default()
    }));
    let addr = serve(&fake).await;
    let client = Client::connect([addr.to_string()]).await.expect("client");
    // The defaults: a session that ends with its process (grace 0.75 s),
    // renewed at once after opening and then every 0.25 s.
    let s = client
        .session_with(SessionOptions {
            ttl: Duration::from_secs(30),
            ..SessionOptions::default()
        })
        .await
        .expect("session");
    let events = || fake.0.events.lock().unwrap().clone();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !events().iter().any(|e| e == "answer 2") {
        assert!(
            Instant::now() < deadline,
            "no second stream renewed within 20 s: {:?}",
            events()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen = events();
    let renewed_at = seen.iter().position(|e| e == "answer 2").expect("seen");
    if let Some(closed_at) = seen.iter().position(|e| e == "closed 1") {
        assert!(
            closed_at > renewed_at,
            "events {seen:?}: the silent stream was closed before its replacement renewed"
        );
    }
    assert!(
        matches!(*s.lease().borrow(), LeaseState::Valid(_)),
        "the session is not lost"
    );
}

/// An upgrade whose answer is lost (UNAVAILABLE without
/// `raftlock-not-leader`: it may have been granted) is withdrawn with
/// `Cancel`. If it had been granted, the Cancel released it and the read
/// ended with it, so the read's guard must stop saying it holds, from the
/// failed call on, until the cluster shows the read still held
/// (`CheckFence`); when it does not, the guard's grant has ended for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_whose_answer_is_lost_leaves_the_read_in_doubt_until_checked() {
    for read_survives in [false, true] {
        let fake = Fake(Arc::new(State {
            upgrade: Some(UpgradeFake {
                read_survives,
                ..UpgradeFake::default()
            }),
            ..State::default()
        }));
        let addr = serve(&fake).await;
        let client = Client::with_options(
            [addr.to_string()],
            raftlock_client::ClientOptions {
                retry_deadline: Duration::from_secs(1),
                ..raftlock_client::ClientOptions::default()
            },
        )
        .expect("client");
        let s = client
            .session_with(SessionOptions {
                ttl: Duration::from_secs(30),
                ..SessionOptions::default()
            })
            .await
            .expect("session");
        let read = s.read_lock("doc").await.expect("read");
        assert!(read.is_held(), "the read is held before the upgrade");
        let err = read
            .upgrade_timeout(Duration::ZERO)
            .await
            .expect_err("every upgrade answer is lost");
        assert!(
            matches!(
                err,
                raftlock_client::Error::Unavailable(_) | raftlock_client::Error::Unknown(_)
            ),
            "{err:?}"
        );
        assert!(
            !read.is_held(),
            "read_survives={read_survives}: is_held() right after an upgrade of unknown outcome: \
             the upgrade may have been granted, ending the read"
        );
        let u = fake.0.upgrade.as_ref().expect("upgrade fake");
        let deadline = Instant::now() + Duration::from_secs(20);
        while *u.checks.lock().unwrap() == 0 {
            assert!(Instant::now() < deadline, "no CheckFence after the Cancel");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(*u.cancels.lock().unwrap(), 1, "the upgrade was withdrawn");
        if read_survives {
            while !read.is_held() {
                assert!(
                    Instant::now() < deadline,
                    "the cluster showed the read held, but the guard never said so again"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        } else {
            assert!(
                !read.is_held(),
                "the read ended, and the guard says it holds"
            );
            let again = read.upgrade_timeout(Duration::ZERO).await;
            assert!(
                matches!(again, Err(raftlock_client::Error::InvalidArgument(_))),
                "a guard whose grant ended upgrades again: {again:?}"
            );
        }
    }
}
