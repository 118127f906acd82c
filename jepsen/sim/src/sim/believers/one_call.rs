//! Believers on a one-call `Lock`: a `SetSessionTtl` sent just before the
//! count runs out, the `Lock` retried with its nonce while held, and a
//! ghost waiter that goes away a moment before the hand-off.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::RngExt as _;

use raftlock_proto::v1 as pb;

use super::{
    at_leader, lock, lock_within, note, now_us, set_ttl, sleep_until_us, take, unlock, Answer,
    Shared, GHOST_TTL_MS,
};

/// A waiting `Lock` whose caller goes away (the connection closes, as
/// when a worker is killed) a moment before the holder lets go: the
/// believer takes `name`, sends the ghost's `Lock` that waits for it, and
/// drops that call 0-8 ms before it unlocks. The ghost's session must not
/// keep the lock (the driver checks that no session with
/// [`GHOST_TTL_MS`] holds `name` 3 s after the ghost went).
pub(super) async fn ghost(client: &str, name: &str, http: bool, rng: &mut StdRng, record: &Shared) {
    let path = if http { "ghost over HTTP" } else { "ghost" };
    let Some((h, id, _)) = take(client, path, name, http, 3_000, 0, rng, record).await else {
        return;
    };
    let req = pb::LockRequest {
        name: name.into(),
        ttl_ms: GHOST_TTL_MS,
        wait: true,
        nonce: rng.random::<u64>() | 1,
        ..Default::default()
    };
    // It waits as long as it takes (until it is killed).
    let sent = now_us();
    let call =
        tokio::spawn(async move { lock_within(Duration::from_secs(60), id, http, req).await });
    // Long enough for the wait to be queued; then killed a moment before
    // the holder lets go (as the review's PHP workers were). A kill after
    // the release was sent may come after the grant's answer is on its
    // way: the same as a holder killed, for its ttl (or grace) to end.
    let hold = rng.random_range(50..1_500) * 1_000;
    sleep_until_us((h.from + hold).min(h.count.until)).await;
    kill_ghost(client, name, id, sent, &call, record);
    tokio::time::sleep(Duration::from_micros(rng.random_range(0..8_000))).await;
    let (end, session) = (now_us(), h.session);
    h.end(record, end);
    unlock(id, http, session).await;
}

/// Kills the ghost's call (its connection closes), and records when, if
/// it was still waiting (its `Lock` was sent to node `via` at `sent`).
fn kill_ghost(
    client: &str,
    name: &str,
    via: u64,
    sent: u64,
    call: &tokio::task::JoinHandle<Answer<pb::LockResponse>>,
    record: &Shared,
) {
    if call.is_finished() {
        // Its call was answered before (a leader change answers a waiting
        // `Lock` "outcome unknown"; the hand-off may have been answered
        // already): a caller that then gives up without retrying,
        // cancelling or unlocking does not follow the duties.
        note(
            record,
            format!("{client}: the ghost's call on {name} had ended: no ghost"),
        );
        return;
    }
    call.abort();
    let gone = now_us();
    record.borrow_mut().ghosts.push(super::super::Ghost {
        name: name.to_string(),
        via,
        sent,
        gone,
    });
    note(
        record,
        format!("{client}: ghost waiter on {name} gone at {gone} us"),
    );
}

/// `Lock`, then a `SetSessionTtl` sent a moment before the count runs out
/// (where the leader's expiry decision may race it), then hold on to the
/// new count for a while.
pub(super) async fn ttl_change(
    client: &str,
    name: &str,
    http: bool,
    rng: &mut StdRng,
    record: &Shared,
) {
    let ttl = rng.random_range(1_000..2_000);
    let path = if http {
        "Lock+SetSessionTtl over HTTP"
    } else {
        "Lock+SetSessionTtl"
    };
    let Some((mut h, id, _)) = take(client, path, name, http, ttl, 0, rng, record).await else {
        return;
    };
    // Around the leader's deadline, where its expiry decision may race the
    // change: the count's end plus the open's write (a change answered
    // after the count ran out restores the belief).
    sleep_until_us(h.count.until + rng.random_range(0..20_000) - 8_000).await;
    let new_ttl = rng.random_range(1_000..3_000);
    let sent = now_us();
    if new_ttl < ttl {
        // A shorter ttl: the count so far is cut at its send, and the
        // answer counts with it.
        h.count.cut(sent, new_ttl * 1_000);
    }
    let req = pb::SetSessionTtlRequest {
        session_id: h.session,
        seq: 2,
        ttl_ms: new_ttl,
    };
    let (answer, _) = at_leader(record, rng, |id| set_ttl(id, http, req)).await;
    let now = now_us();
    match answer {
        Answer::Ok(_) => h.answered(sent, new_ttl * 1_000, now),
        Answer::Refused(tonic::Code::NotFound) => {
            h.end(record, now);
            return;
        }
        _ => {}
    }
    let hold_until = now_us() + rng.random_range(0..new_ttl * 1_000);
    sleep_until_us(hold_until.min(h.count.until)).await;
    let (end, session) = (now_us(), h.session);
    h.end(record, end);
    unlock(id, http, session).await;
}

/// `Lock`, then the same `Lock` again with its nonce while held (as after
/// a transport error), counting from the retry's send if it is answered
/// `acquired`.
pub(super) async fn lock_retry(
    client: &str,
    name: &str,
    http: bool,
    rng: &mut StdRng,
    record: &Shared,
) {
    let ttl = rng.random_range(1_000..2_000);
    let path = if http {
        "Lock retried over HTTP"
    } else {
        "Lock retried"
    };
    let Some((mut h, id, nonce)) = take(client, path, name, http, ttl, 0, rng, record).await else {
        return;
    };
    let retry_at = h.from + rng.random_range(300..990) * ttl;
    sleep_until_us(retry_at.min(h.count.until)).await;
    let sent = now_us();
    let req = pb::LockRequest {
        name: name.into(),
        ttl_ms: ttl,
        timeout_ms: 1_500,
        nonce,
        ..Default::default()
    };
    let (again, at) = at_leader(record, rng, |id| lock(id, http, req.clone())).await;
    let now = now_us();
    note(
        record,
        format!(
            "{client}: {path}: retry of session {} sent at {sent} us to node {at}: {}",
            h.session,
            match &again {
                Answer::Ok(r) => format!("acquired {} fence {}", r.acquired, r.fence),
                Answer::Refused(c) => format!("{c:?}"),
                Answer::Unknown => "no answer".into(),
            }
        ),
    );
    if let Answer::Ok(r) = again {
        if r.acquired && r.session_id == h.session && r.fence == h.fence {
            h.answered(sent, ttl * 1_000, now);
        }
    }
    let hold_until = now_us() + rng.random_range(0..ttl * 1_000);
    sleep_until_us(hold_until.min(h.count.until)).await;
    let (end, session) = (now_us(), h.session);
    h.end(record, end);
    unlock(id, http, session).await;
}
