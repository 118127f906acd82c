//! Property tests for the lock table.
//!
//! `random_histories_keep_every_rule` applies random histories (a few hundred
//! commands over four session slots, three locks and two semaphores: opens,
//! closes, expiries and reopens, acquires in every mode with and without a
//! timeout, releases with right and wrong fences, real and bogus
//! `TimeoutWait`s and `EndLockDelay`s, replays of earlier requests, bad
//! input) and after every step checks each rule of the [module
//! docs](super) against a model built only from replies, events and the read
//! views, never from the table's internals. At a random step the table is
//! snapshotted and restored, and the copy must then answer every later
//! command exactly as the live table does.
//!
//! `wait_cycle_matches_a_naive_search` builds random wait-for situations
//! directly (cycles included, which `apply` never lets happen) and checks the
//! invariant checker's cycle search, and the acquire-time search, against a
//! brute-force one.
//!
//! `PROPTEST_CASES` overrides the number of cases (64 by default, to keep
//! `cargo test` quick on a small machine).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;

use super::limits::*;
use super::table::{Holder, Lock, Session, WaitRef, Waiter};
use super::*;

mod history;
mod situations;

const X: Mode = Mode::Exclusive;
const SH: Mode = Mode::Shared;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(64);
    // No regression files in the source tree: a failure prints its shrunk
    // history, which belongs in a unit test in `tests.rs`.
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ------------------------------------------------------ independent rules
//
// The rules spelled out again from the docs, over the read views only, so a
// bug in the table's own helpers cannot hide itself.

fn lock_name(n: &str) -> LockName {
    LockName::new(n).expect("valid test name")
}

fn held_weight(info: &LockInfo) -> u64 {
    info.holders
        .iter()
        .map(|h| u64::from(h.mode.weight()))
        .sum()
}

/// Whether `mode` fits beside the current holders (queue and delay aside).
fn fits(info: &LockInfo, mode: Mode) -> bool {
    match info.capacity {
        Some(cap) => held_weight(info) + u64::from(mode.weight()) <= u64::from(cap),
        None if mode == SH => info.holders.iter().all(|h| h.mode == SH),
        None => info.holders.is_empty(),
    }
}

/// Whether a new request in `mode` must be granted at once.
fn grantable_now(info: Option<&LockInfo>, mode: Mode) -> bool {
    info.is_none_or(|i| !i.lock_delayed && i.waiters.is_empty() && fits(i, mode))
}

/// The sessions a waiter at `pos` in `mode` (or a new request, with `pos ==
/// waiters.len()`) cannot be granted without: everyone queued ahead (no
/// barging), and every holder whose release it or a waiter ahead needs,
/// however the other holders behave.
fn naive_blockers(info: &LockInfo, pos: usize, mode: Mode) -> BTreeSet<SessionId> {
    let ahead = &info.waiters[..pos];
    let mut out: BTreeSet<SessionId> = ahead.iter().map(|w| w.session).collect();
    let mut modes = ahead.iter().map(|w| w.mode).chain([mode]);
    match info.capacity {
        None => {
            let exclusive = modes.any(|m| m == X);
            out.extend(
                info.holders
                    .iter()
                    .filter(|h| exclusive || h.mode == X)
                    .map(|h| h.session),
            );
        }
        Some(cap) => {
            let heaviest = modes.map(Mode::weight).max().unwrap_or(0);
            out.extend(
                info.holders
                    .iter()
                    .filter(|h| u64::from(h.mode.weight()) + u64::from(heaviest) > u64::from(cap))
                    .map(|h| h.session),
            );
        }
    }
    out
}

/// The whole wait-for graph, edge by edge.
fn naive_graph(infos: &[LockInfo]) -> BTreeMap<SessionId, BTreeSet<SessionId>> {
    let mut graph: BTreeMap<SessionId, BTreeSet<SessionId>> = BTreeMap::new();
    for info in infos {
        for (pos, w) in info.waiters.iter().enumerate() {
            // A pending upgrade is listed first among the waiters of a lock
            // its session holds: it waits for the other holders, not itself.
            let mut blockers = naive_blockers(info, pos, w.mode);
            blockers.remove(&w.session);
            graph.entry(w.session).or_default().extend(blockers);
        }
    }
    graph
}

fn has_cycle(graph: &BTreeMap<SessionId, BTreeSet<SessionId>>) -> bool {
    // Repeatedly drop sessions that wait for no one still present; what
    // remains (if anything) lies on or leads into a cycle.
    let mut left: BTreeMap<SessionId, BTreeSet<SessionId>> = graph.clone();
    loop {
        let free: Vec<SessionId> = left
            .iter()
            .filter(|(_, out)| out.iter().all(|b| !left.contains_key(b)))
            .map(|(s, _)| *s)
            .collect();
        if free.is_empty() {
            return !left.is_empty();
        }
        for s in free {
            left.remove(&s);
        }
    }
}

/// Checks that `cycle` is a closed chain of real wait-for edges in `infos`,
/// the first of which may be a new request (`first`: name, mode).
fn check_cycle(
    infos: &[LockInfo],
    cycle: &[WaitEdge],
    first: Option<(&LockName, Mode)>,
) -> Result<(), TestCaseError> {
    prop_assert!(!cycle.is_empty());
    for (i, e) in cycle.iter().enumerate() {
        let next = &cycle[(i + 1) % cycle.len()];
        prop_assert_eq!(e.blocker, next.session, "cycle {:?} is not closed", cycle);
        let info = infos.iter().find(|info| info.name == e.name);
        let blockers = match (i, first) {
            (0, Some((name, mode))) => {
                prop_assert_eq!(&e.name, name);
                match info {
                    Some(info) => naive_blockers(info, info.waiters.len(), mode),
                    None => BTreeSet::new(),
                }
            }
            _ => {
                let info = info.ok_or_else(|| TestCaseError::fail("edge on an idle name"))?;
                let pos = info
                    .waiters
                    .iter()
                    .position(|w| w.session == e.session)
                    .ok_or_else(|| TestCaseError::fail(format!("{e:?}: no such wait")))?;
                naive_blockers(info, pos, info.waiters[pos].mode)
            }
        };
        prop_assert!(
            blockers.contains(&e.blocker),
            "{:?} is not a wait-for edge",
            e
        );
    }
    Ok(())
}
