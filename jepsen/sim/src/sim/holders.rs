//! Lease beliefs of clients that use the Rust client library: what its
//! lease view (`Session::lease`) says, as the belief oracle counts it. The
//! workers record theirs through [`View`]; the holders here drive the
//! library's other paths: a session that ends with its process (whose
//! links to the cluster the driver holds for up to 14 s: a network cut
//! the leader notices only by its HTTP/2 pings), atomic multi-locks, and
//! upgrades and downgrades.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use raftlock_client::{Client, Error, Guard, LeaseState, Session, SessionOptions};
use rand::rngs::StdRng;
use rand::RngExt as _;

use super::believers::now_us;
use super::clients::until_ready;
use super::{addr, client_options, nodes, note, now_ms, Shared};
use crate::belief::{Belief, Held, AFTER_WITHDRAWN_UPGRADE};

/// The name the process-bound holder takes.
pub(super) const BOUND: &str = "E";
/// The names of the atomic requests.
pub(super) const PAIR: [&str; 2] = ["M1", "M2"];
/// The name taken shared and upgraded, or exclusive and downgraded.
pub(super) const UPGRADED: &str = "U";

/// The latest end a session's lease view showed, in simulated
/// microseconds (0: none yet), kept by a task that follows the view.
#[derive(Clone)]
pub(super) struct View {
    until: Arc<AtomicU64>,
    task: Arc<tokio::task::JoinHandle<()>>,
}

impl View {
    /// Follows `session`'s lease view.
    pub(super) fn of(session: &Session) -> View {
        let until = Arc::new(AtomicU64::new(0));
        let mut rx = session.lease();
        let task = tokio::spawn({
            let until = until.clone();
            async move {
                loop {
                    if let LeaseState::Valid(u) = *rx.borrow_and_update() {
                        let left = u.saturating_duration_since(tokio::time::Instant::now());
                        until.fetch_max(now_us() + left.as_micros() as u64, Ordering::Relaxed);
                    }
                    if rx.changed().await.is_err() {
                        return;
                    }
                }
            }
        });
        View {
            until,
            task: Arc::new(task),
        }
    }

    /// The end of the belief of a grant that stops being used at `end`:
    /// `end`, or where the lease view ran out, if sooner.
    pub(super) fn until(&self, end: u64) -> u64 {
        end.min(self.until.load(Ordering::Relaxed))
    }
}

impl Drop for View {
    fn drop(&mut self) {
        if Arc::strong_count(&self.task) == 1 {
            self.task.abort();
        }
    }
}

/// Records a belief.
#[allow(clippy::too_many_arguments)]
pub(super) fn believed(
    record: &Shared,
    client: &str,
    path: &str,
    name: &str,
    session: u64,
    fence: u64,
    held: Held,
    from: u64,
    until: u64,
) {
    record.borrow_mut().beliefs.push(Belief {
        client: client.into(),
        path: path.into(),
        name: name.into(),
        session,
        fence,
        held,
        from,
        until,
    });
}

/// An upgrade of `read` whose outcome is unknown, or whose future its
/// caller dropped (`why`), so the client withdrew it: the read is in
/// doubt (it ended if the upgrade had been granted), and the client says
/// it is held again only once the cluster shows it current
/// (`Guard::upgrade`). Right after the withdrawal `is_held`
/// must be false (a violation otherwise); if it turns true within 5 s,
/// the read is believed from then on, and the belief oracle checks it
/// against the grants ([`AFTER_WITHDRAWN_UPGRADE`]).
async fn withdrawn_upgrade(
    record: &Shared,
    who: &str,
    session: &Session,
    view: &View,
    read: &Guard,
    hold: Duration,
    why: String,
) {
    let fence = read.fence().get();
    note(
        record,
        format!("{who} upgrade of {UPGRADED} (fence {fence}) withdrawn: {why}"),
    );
    if read.is_held() {
        record.borrow_mut().violation.get_or_insert(format!(
            "{who}: the read of {UPGRADED} (fence {fence}) was still held right after its \
             upgrade was withdrawn ({why}); it is in doubt until the cluster shows it"
        ));
        return;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !read.is_held() && session.is_valid() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if !read.is_held() {
        return;
    }
    let from = now_us();
    note(
        record,
        format!("{who} read of {UPGRADED} (fence {fence}) held again after the withdrawal"),
    );
    let until = tokio::time::Instant::now() + hold;
    while read.is_held() && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    believed(
        record,
        who,
        AFTER_WITHDRAWN_UPGRADE,
        UPGRADED,
        session.id().get(),
        fence,
        Held::Shared,
        from,
        view.until(now_us()),
    );
}

/// Holds until `hold` has passed or the lease view says it may be lost.
async fn hold_while_valid(session: &Session, hold: Duration) {
    let until = tokio::time::Instant::now() + hold;
    while tokio::time::Instant::now() < until && session.is_valid() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn client() -> Result<Client, raftlock_client::Error> {
    let endpoints: Vec<String> = (1..=nodes()).map(addr).collect();
    Client::with_options(endpoints, client_options())
}

/// A holder whose sessions end with its process (ttl 15 s, grace 500 ms),
/// holding [`BOUND`] for up to 14 s at a time. The driver holds this
/// host's links at times, so the leader may end the session a grace after
/// its HTTP/2 pings go unanswered (about 10 s), long before the ttl.
pub(super) async fn bound_holder(
    who: &'static str,
    stop_ms: u64,
    mut rng: StdRng,
    record: Shared,
) -> turmoil::Result {
    until_ready(&record).await;
    let client = client()?;
    while now_ms() < stop_ms {
        let opened = client
            .session_with(SessionOptions {
                ttl: Duration::from_secs(15),
                end_on_disconnect: Some(Duration::from_millis(500)),
                ..SessionOptions::default()
            })
            .await;
        let Ok(session) = opened else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let view = View::of(&session);
        if let Ok(guard) = session.lock_timeout(BOUND, Duration::from_secs(3)).await {
            let from = now_us();
            // The one whose links get cut holds long (the cut may come
            // while it holds); the other mostly waits for it.
            let cut = who == super::BOUND_HOLDER;
            record.borrow_mut().bound_holding = cut;
            let hold = if cut {
                rng.random_range(10_000..14_000)
            } else {
                rng.random_range(100..1_000)
            };
            hold_while_valid(&session, Duration::from_millis(hold)).await;
            if cut {
                record.borrow_mut().bound_holding = false;
            }
            let until = view.until(now_us());
            note(
                &record,
                format!(
                    "{who}: believed {BOUND} fence {} until {until} us",
                    guard.fence().get()
                ),
            );
            believed(
                &record,
                who,
                "Rust client, end_on_disconnect",
                BOUND,
                session.id().get(),
                guard.fence().get(),
                Held::Exclusive,
                from,
                until,
            );
            let _ = guard.release().await;
        }
        let _ = session.close().await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(10..200))).await;
    }
    Ok(())
}

/// A holder of the library's other paths: atomic requests on [`PAIR`],
/// and [`UPGRADED`] taken shared and upgraded, or exclusive and
/// downgraded.
pub(super) async fn path_holder(
    n: usize,
    stop_ms: u64,
    mut rng: StdRng,
    record: Shared,
) -> turmoil::Result {
    until_ready(&record).await;
    let client = client()?;
    let who = format!("path holder {n}");
    while now_ms() < stop_ms {
        let Ok(session) = client.session(Duration::from_secs(2)).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let view = View::of(&session);
        let sid = session.id().get();
        for _ in 0..rng.random_range(1..5) {
            if !session.is_valid() || now_ms() >= stop_ms {
                break;
            }
            let hold = Duration::from_millis(rng.random_range(1..300));
            match rng.random_range(0..3) {
                0 => {
                    let Ok(guards) = session.acquire_all(&PAIR, Duration::from_secs(2)).await
                    else {
                        continue;
                    };
                    let from = now_us();
                    hold_while_valid(&session, hold).await;
                    let until = view.until(now_us());
                    for (g, name) in guards.iter().zip(PAIR) {
                        believed(
                            &record,
                            &who,
                            "Rust client, AcquireAll",
                            name,
                            sid,
                            g.fence().get(),
                            Held::Exclusive,
                            from,
                            until,
                        );
                    }
                    for g in guards {
                        let _ = g.release().await;
                    }
                }
                1 => {
                    let Ok(read) = session
                        .lock_with(UPGRADED, true, Some(Duration::from_secs(2)), Vec::new())
                        .await
                    else {
                        continue;
                    };
                    let from = now_us();
                    hold_while_valid(&session, hold).await;
                    // A third of the upgrades are dropped by their caller
                    // after a few ms: withdrawn (`Cancel`) whether or not
                    // granted meanwhile, the read then in doubt.
                    let drop_after = (rng.random_range(0..3) == 0)
                        .then(|| Duration::from_millis(rng.random_range(1..40)));
                    let upgrade = read.upgrade_timeout(Duration::from_secs(1));
                    let upgraded = match drop_after {
                        None => Some(upgrade.await),
                        Some(after) => tokio::time::timeout(after, upgrade).await.ok(),
                    };
                    // The shared grant is believed until the upgrade is
                    // answered (it ends with the exclusive grant).
                    let answered = now_us();
                    believed(
                        &record,
                        &who,
                        "Rust client, shared",
                        UPGRADED,
                        sid,
                        read.fence().get(),
                        Held::Shared,
                        from,
                        view.until(answered),
                    );
                    match upgraded {
                        Some(Ok(write)) => {
                            hold_while_valid(&session, hold).await;
                            believed(
                                &record,
                                &who,
                                "Rust client, upgraded",
                                UPGRADED,
                                sid,
                                write.fence().get(),
                                Held::Exclusive,
                                answered,
                                view.until(now_us()),
                            );
                            let _ = write.release().await;
                        }
                        Some(Err(e)) => {
                            if matches!(
                                e,
                                Error::Unavailable(_) | Error::Unknown(_) | Error::Internal(_)
                            ) {
                                let why = format!("outcome unknown: {e}");
                                withdrawn_upgrade(&record, &who, &session, &view, &read, hold, why)
                                    .await;
                            }
                            let _ = read.release().await;
                        }
                        None => {
                            let why = format!("dropped after {drop_after:?}");
                            withdrawn_upgrade(&record, &who, &session, &view, &read, hold, why)
                                .await;
                            let _ = read.release().await;
                        }
                    }
                }
                _ => {
                    let Ok(write) = session.lock_timeout(UPGRADED, Duration::from_secs(2)).await
                    else {
                        continue;
                    };
                    let from = now_us();
                    hold_while_valid(&session, hold).await;
                    // Exclusive until the downgrade is sent; shared from
                    // its answer.
                    let sent = now_us();
                    believed(
                        &record,
                        &who,
                        "Rust client, exclusive",
                        UPGRADED,
                        sid,
                        write.fence().get(),
                        Held::Exclusive,
                        from,
                        view.until(sent),
                    );
                    if let Ok(read) = write.downgrade().await {
                        let answered = now_us();
                        hold_while_valid(&session, hold).await;
                        believed(
                            &record,
                            &who,
                            "Rust client, downgraded",
                            UPGRADED,
                            sid,
                            read.fence().get(),
                            Held::Shared,
                            answered,
                            view.until(now_us()),
                        );
                        let _ = read.release().await;
                    } else {
                        let _ = write.release().await;
                    }
                }
            }
        }
        let _ = session.close().await;
    }
    Ok(())
}
