//! Unit tests of the workloads' shared parts.

use super::*;

/// A restore near the end of a run is still seen after the nemesis has
/// finished (and dropped its end of the channel): a worker busy against
/// the stopped cluster when the move came must still move (campaign c1
/// run 43, seed 24042: the second restore came at 25.3 s of 30, the
/// workers reached the top of their loop after the nemesis ended and
/// kept talking to the first restored cluster until the run's end).
#[test]
fn a_move_is_seen_after_the_nemesis_has_ended() {
    let addrs = |gen| ClusterAddrs {
        gen,
        nodes: [(1, format!("127.0.0.1:{}", 1000 + gen))].into(),
    };
    let (tx, rx) = tokio::sync::watch::channel(addrs(0));
    let worker = rx.clone();
    assert!(!restore_pending(&worker, 0), "nothing moved yet");
    tx.send_replace(addrs(1));
    assert!(restore_pending(&worker, 0));
    assert!(!restore_pending(&worker, 1), "the move was taken");
    tx.send_replace(addrs(2));
    drop(tx);
    assert!(
        restore_pending(&worker, 1),
        "the last move was lost when the nemesis ended"
    );
    assert!(!restore_pending(&worker, 2));
}

/// What a failed operation is recorded as: `fail` only when the
/// operation certainly had no effect.
#[test]
fn only_certain_refusals_are_recorded_as_fail() {
    // A retry that finds the session gone says nothing of an earlier
    // attempt: it may have been granted before the session expired
    // (campaign run-020: lock, client-link, seed 24020 — an acquire
    // granted fence 304, its answer lost, the retry refused NOT_FOUND
    // once the stalled session had expired).
    assert_eq!(classify(&Error::SessionNotFound("gone".into())), Type::Info);
    assert_eq!(classify(&Error::Unknown("timeout".into())), Type::Info);
    // These never apply anything.
    assert_eq!(
        classify(&Error::Unavailable("no leader".into())),
        Type::Fail
    );
    assert_eq!(
        classify(&Error::NotAcquired(Duration::from_millis(5))),
        Type::Fail
    );
    assert_eq!(classify(&Error::InvalidArgument("name".into())), Type::Fail);
}
