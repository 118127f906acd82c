//! Property tests for the lock table.
//!
//! `random_histories_keep_every_rule` applies random histories (a few hundred
//! commands over four session slots, three locks and two semaphores: opens,
//! closes, expiries and reopens, acquires in every mode with and without a
//! timeout, releases with right and wrong fences, real and bogus
//! `CancelWait`s and `EndLockDelay`s, replays of earlier requests, bad
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
            graph
                .entry(w.session)
                .or_default()
                .extend(naive_blockers(info, pos, w.mode));
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

// ------------------------------------------------------------ histories

const SLOTS: usize = 4;
/// Three locks, then two semaphores (with their fixed capacities).
const NAMES: [(&str, Option<u32>); 5] = [
    ("l0", None),
    ("l1", None),
    ("l2", None),
    ("s0", Some(3)),
    ("s1", Some(2)),
];
const DELAYS: [u64; 4] = [0, 0, 50, 2_000];
const TIMEOUTS: [u64; 4] = [0, 1_000, 5_000, WAIT_FOREVER];

/// One step of a history, in terms of session slots and name numbers; it is
/// turned into a command against the history's current state.
#[derive(Clone, Debug)]
enum Op {
    /// Open a session in the first empty slot from `slot` on; if none is
    /// empty, retry `slot`'s open (same nonce).
    Open {
        slot: usize,
        delay: usize,
        nonce: bool,
    },
    Close {
        slot: usize,
    },
    Expire {
        slot: usize,
    },
    Acquire {
        slot: usize,
        target: usize,
        shared: bool,
        weight: u32,
        timeout: usize,
        value: u8,
    },
    Release {
        slot: usize,
        target: usize,
        pick: FencePick,
        n: Index,
    },
    /// Cancel a queued wait (`real`: the `n`th of all), or one that is not.
    Cancel {
        slot: usize,
        target: usize,
        real: bool,
        n: Index,
    },
    /// End a delay with the `since` learnt from events (`real`: the `n`th
    /// delay in force), or with a wrong one.
    EndDelay {
        target: usize,
        real: bool,
        n: Index,
    },
    /// Apply an earlier request again, as a client retry would.
    Replay {
        n: Index,
    },
    /// Input that must be refused.
    Bad {
        kind: u8,
        slot: usize,
        target: usize,
    },
}

/// Which grant a release names.
#[derive(Clone, Copy, Debug)]
enum FencePick {
    /// The slot's grant on the name, else any grant of the slot.
    Own,
    OtherHolders,
    Stale,
    Bogus,
}

fn op() -> impl Strategy<Value = Op> {
    let slot = 0..SLOTS;
    let target = 0..NAMES.len();
    let pick = prop_oneof![
        Just(FencePick::Own),
        Just(FencePick::OtherHolders),
        Just(FencePick::Stale),
        Just(FencePick::Bogus)
    ];
    prop_oneof![
        6 => (slot.clone(), 0..DELAYS.len(), any::<bool>())
            .prop_map(|(slot, delay, nonce)| Op::Open { slot, delay, nonce }),
        1 => slot.clone().prop_map(|slot| Op::Close { slot }),
        2 => slot.clone().prop_map(|slot| Op::Expire { slot }),
        14 => (slot.clone(), target.clone(), any::<bool>(), 0..3u32, 0..TIMEOUTS.len(), 0..3u8)
            .prop_map(|(slot, target, shared, weight, timeout, value)| Op::Acquire {
                slot,
                target,
                shared,
                weight,
                timeout,
                value,
            }),
        8 => (slot.clone(), target.clone(), pick, any::<Index>())
            .prop_map(|(slot, target, pick, n)| Op::Release { slot, target, pick, n }),
        3 => (slot.clone(), target.clone(), any::<bool>(), any::<Index>())
            .prop_map(|(slot, target, real, n)| Op::Cancel { slot, target, real, n }),
        3 => (target.clone(), any::<bool>(), any::<Index>())
            .prop_map(|(target, real, n)| Op::EndDelay { target, real, n }),
        3 => any::<Index>().prop_map(|n| Op::Replay { n }),
        2 => (0..12u8, slot, target).prop_map(|(kind, slot, target)| Op::Bad { kind, slot, target }),
    ]
}

/// A slot's open session.
#[derive(Clone, Copy, Debug)]
struct Slot {
    id: SessionId,
    nonce: u64,
}

/// A client request that was applied (not refused), for replays.
#[derive(Clone, Debug)]
struct Applied {
    command: Command,
    reply: Reply,
    session: SessionId,
    seq: u64,
}

/// The sequence numbers a session's replies are remembered for, as the
/// docs describe the window.
#[derive(Default)]
struct Window {
    seqs: BTreeSet<u64>,
    floor: Option<u64>,
}

/// A history being applied, and the model of the table built from what the
/// table said.
struct History {
    live: LockTable,
    /// A copy restored from a snapshot, fed the same commands.
    restored: Option<LockTable>,
    index: u64,
    seq: u64,
    slots: [Option<Slot>; SLOTS],
    /// The last session each slot had (for requests by gone sessions).
    gone: [SessionId; SLOTS],
    dead: BTreeSet<SessionId>,
    /// Queue order per name, from `Queued` events.
    queues: BTreeMap<String, VecDeque<(SessionId, u64)>>,
    /// Current grants, from `Granted` and `Ended` events.
    holders: BTreeMap<Fence, (String, SessionId, Mode)>,
    /// Every fence handed out, in order.
    fences: Vec<Fence>,
    /// Delays in force (name → since, length), from events.
    delays: BTreeMap<String, (u64, u64)>,
    /// The last `since` seen per name, in force or not.
    last_since: BTreeMap<String, u64>,
    /// Requests whose acquire was queued, and how each wait ended.
    queued: BTreeSet<(SessionId, u64)>,
    outcomes: BTreeMap<(SessionId, u64), Reply>,
    windows: BTreeMap<SessionId, Window>,
    history: Vec<Applied>,
}

impl History {
    fn new() -> Self {
        History {
            live: LockTable::new(),
            restored: None,
            index: 0,
            seq: 0,
            slots: [None; SLOTS],
            gone: [SessionId(u64::MAX - 1); SLOTS],
            dead: BTreeSet::new(),
            queues: NAMES
                .iter()
                .map(|(n, _)| (n.to_string(), VecDeque::new()))
                .collect(),
            holders: BTreeMap::new(),
            fences: Vec::new(),
            delays: BTreeMap::new(),
            last_since: BTreeMap::new(),
            queued: BTreeSet::new(),
            outcomes: BTreeMap::new(),
            windows: BTreeMap::new(),
            history: Vec::new(),
        }
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn session_of(&self, slot: usize) -> SessionId {
        self.slots[slot].map_or(self.gone[slot], |s| s.id)
    }

    fn infos(table: &LockTable) -> Vec<LockInfo> {
        NAMES
            .iter()
            .filter_map(|(n, _)| table.describe(&lock_name(n)))
            .collect()
    }

    /// Snapshots the live table; from now on a restored copy follows along.
    fn restore_copy(&mut self) -> Result<(), TestCaseError> {
        let bytes = self.live.to_snapshot();
        let copy = LockTable::from_snapshot(&bytes)
            .map_err(|e| TestCaseError::fail(format!("restore failed: {e}")))?;
        prop_assert!(copy == self.live, "restored table differs");
        self.restored = Some(copy);
        Ok(())
    }

    /// Applies `command` at the next index (to the restored copy too) and
    /// checks every rule; returns the table as it was before.
    fn apply(&mut self, command: Command) -> Result<(LockTable, Response), TestCaseError> {
        let before = self.live.clone();
        self.index += 1;
        let r = self.live.apply(self.index, command.clone());
        if let Some(copy) = &mut self.restored {
            let r2 = copy.apply(self.index, command.clone());
            prop_assert_eq!(
                &r2,
                &r,
                "restored copy answered differently to {:?}",
                command
            );
            prop_assert!(
                *copy == self.live,
                "restored copy diverged after {:?}",
                command
            );
        }
        self.check_step(&command, &before, &r)?;
        Ok((before, r))
    }

    fn check_step(
        &mut self,
        command: &Command,
        before: &LockTable,
        r: &Response,
    ) -> Result<(), TestCaseError> {
        if let Err(e) = self.live.check_invariants() {
            return Err(TestCaseError::fail(format!(
                "invariant broken by {command:?}: {e}"
            )));
        }
        // Refusals and no-op answers change nothing; nothing changes a lock
        // without saying so in an event.
        let no_op = matches!(
            r.reply,
            Reply::Refused(_)
                | Reply::Expired { existed: false }
                | Reply::Cancelled { cancelled: false }
                | Reply::DelayEnded { ended: false }
        );
        if no_op {
            prop_assert!(
                r.events.is_empty(),
                "{:?} had events {:?}",
                r.reply,
                r.events
            );
            prop_assert!(self.live == *before, "{:?} changed the table", r.reply);
        }
        if r.events.is_empty() {
            prop_assert!(
                self.live.locks == before.locks,
                "silent change by {:?}",
                command
            );
        }
        if let Reply::Refused(Refusal::Deadlock { cycle }) = &r.reply {
            let Command::Acquire {
                session,
                name,
                mode,
                timeout_ms,
                ..
            } = command
            else {
                return Err(TestCaseError::fail("deadlock refusal of a non-acquire"));
            };
            prop_assert!(*timeout_ms > 0, "a try was refused as a deadlock");
            check_cycle(&Self::infos(before), cycle, Some((&lock_name(name), *mode)))?;
            prop_assert_eq!(cycle[0].session, *session);
        }
        self.follow_events(command, before, r)?;
        self.check_views()
    }

    /// Updates the model from the events, checking FIFO order, fences and
    /// that each event fits the command.
    fn follow_events(
        &mut self,
        command: &Command,
        before: &LockTable,
        r: &Response,
    ) -> Result<(), TestCaseError> {
        for e in &r.events {
            match e {
                Event::SessionOpened { session, .. } => {
                    prop_assert!(
                        matches!(command, Command::OpenSession { .. }),
                        "opened by {:?}",
                        command
                    );
                    prop_assert_eq!(*session, SessionId(self.index), "id is the log index");
                }
                Event::SessionEnded { session, expired } => {
                    let ended = match command {
                        Command::CloseSession { session, .. } => Some((*session, false)),
                        Command::ExpireSession { session } => Some((*session, true)),
                        _ => None,
                    };
                    prop_assert_eq!(ended, Some((*session, *expired)));
                    self.dead.insert(*session);
                    self.windows.remove(session);
                }
                Event::Granted {
                    name,
                    session,
                    seq,
                    fence,
                    mode,
                } => {
                    prop_assert!(
                        !self.delays.contains_key(name.as_str()),
                        "grant during a delay"
                    );
                    // One cluster-wide counter: larger than every fence before.
                    if let Some(last) = self.fences.last() {
                        prop_assert!(fence > last, "fence {:?} after {:?}", fence, last);
                    }
                    self.fences.push(*fence);
                    let queue = self.queues.get_mut(name.as_str()).expect("known name");
                    match queue.iter().position(|&w| w == (*session, *seq)) {
                        Some(pos) => {
                            prop_assert_eq!(
                                pos,
                                0,
                                "granted {:?} past {:?}",
                                (session, seq),
                                queue
                            );
                            queue.pop_front();
                        }
                        None => {
                            // An immediate grant: only of this very request,
                            // and never past anyone queued.
                            let this = matches!(command, Command::Acquire { session: s, seq: q, name: n, .. }
                                if s == session && q == seq && n == name.as_str());
                            prop_assert!(this, "grant of {:?} out of nowhere", (session, seq));
                            prop_assert!(queue.is_empty(), "{:?} barged past {:?}", session, queue);
                        }
                    }
                    prop_assert!(
                        self.live.session(*session).is_some(),
                        "grant to a gone session"
                    );
                    self.holders
                        .insert(*fence, (name.as_str().to_string(), *session, *mode));
                    self.outcomes.insert(
                        (*session, *seq),
                        Reply::Acquire(Acquired::Granted {
                            fence: *fence,
                            mode: *mode,
                            index: self.index,
                        }),
                    );
                }
                Event::Queued {
                    name,
                    session,
                    seq,
                    mode,
                    timeout_ms,
                } => {
                    prop_assert!(*timeout_ms > 0, "a try was queued");
                    let this = matches!(command, Command::Acquire { session: s, seq: q, name: n, mode: m, timeout_ms: t, .. }
                        if s == session && q == seq && n == name.as_str() && m == mode && t == timeout_ms);
                    prop_assert!(this, "queued {:?} by {:?}", (session, seq), command);
                    self.queues
                        .get_mut(name.as_str())
                        .expect("known name")
                        .push_back((*session, *seq));
                    self.queued.insert((*session, *seq));
                }
                Event::Cancelled {
                    name, session, seq, ..
                } => {
                    let queue = self.queues.get_mut(name.as_str()).expect("known name");
                    let pos = queue.iter().position(|&w| w == (*session, *seq));
                    prop_assert!(
                        pos.is_some(),
                        "cancelled {:?}, which was not queued",
                        (session, seq)
                    );
                    queue.remove(pos.unwrap_or_default());
                    self.outcomes
                        .insert((*session, *seq), Reply::Acquire(Acquired::NotAcquired));
                }
                Event::Ended {
                    name,
                    session,
                    fence,
                    mode,
                    ..
                } => {
                    let held = self.holders.remove(fence);
                    prop_assert_eq!(held, Some((name.as_str().to_string(), *session, *mode)));
                }
                Event::LockDelayStarted {
                    name,
                    delay_ms,
                    since,
                } => {
                    prop_assert!(
                        matches!(command, Command::ExpireSession { .. }),
                        "delay by {:?}",
                        command
                    );
                    prop_assert_eq!(*since, self.index);
                    // As long as the expired session's delay, and as what
                    // is left of a delay already in force.
                    let Command::ExpireSession { session } = command else {
                        unreachable!()
                    };
                    let own = before.session(*session).map_or(0, |s| s.lock_delay_ms);
                    let in_force = self.delays.get(name.as_str()).map_or(0, |d| d.1);
                    prop_assert!(own > 0, "delay started by a session without one");
                    prop_assert_eq!(
                        *delay_ms,
                        own.max(in_force),
                        "length of the delay on {}",
                        name
                    );
                    self.delays
                        .insert(name.as_str().to_string(), (*since, *delay_ms));
                    self.last_since.insert(name.as_str().to_string(), *since);
                }
                Event::LockDelayEnded { name } => {
                    prop_assert!(self.delays.remove(name.as_str()).is_some());
                }
            }
        }
        Ok(())
    }

    /// The views agree with the model, and every rule holds in them.
    fn check_views(&self) -> Result<(), TestCaseError> {
        let t = &self.live;
        let infos = Self::infos(t);
        let listed: Vec<LockName> = t
            .list("", None, usize::MAX)
            .into_iter()
            .map(|i| i.name)
            .collect();
        let described: Vec<LockName> = infos.iter().map(|i| i.name.clone()).collect();
        prop_assert_eq!(listed, described, "names outside the test's set");
        for (n, capacity) in NAMES {
            let info = t.describe(&lock_name(n));
            let holders: Vec<(Fence, SessionId, Mode)> = info
                .iter()
                .flat_map(|i| i.holders.iter().map(|h| (h.fence, h.session, h.mode)))
                .collect();
            let model: Vec<(Fence, SessionId, Mode)> = self
                .holders
                .iter()
                .filter(|(_, (hn, _, _))| hn == n)
                .map(|(f, (_, s, m))| (*f, *s, *m))
                .collect();
            prop_assert_eq!(holders, model, "holders of {}", n);
            let waiters: Vec<(SessionId, u64)> = info
                .iter()
                .flat_map(|i| i.waiters.iter().map(|w| (w.session, w.seq)))
                .collect();
            prop_assert_eq!(
                &waiters,
                &Vec::from(self.queues[n].clone()),
                "queue of {}",
                n
            );
            let Some(info) = info else {
                prop_assert!(
                    !self.delays.contains_key(n),
                    "{} delayed without an entry",
                    n
                );
                continue;
            };
            prop_assert_eq!(info.lock_delayed, self.delays.contains_key(n));
            prop_assert!(
                !info.holders.is_empty() || !info.waiters.is_empty() || info.lock_delayed,
                "idle entry for {}",
                n
            );
            // Mutual exclusion and capacity.
            match capacity {
                None => {
                    prop_assert_eq!(info.capacity, None);
                    let exclusive = info.holders.iter().filter(|h| h.mode == X).count();
                    prop_assert!(
                        exclusive == 0 || info.holders.len() == 1,
                        "{}: {:?}",
                        n,
                        info.holders
                    );
                    let modes = info
                        .holders
                        .iter()
                        .map(|h| h.mode)
                        .chain(info.waiters.iter().map(|w| w.mode));
                    for m in modes {
                        prop_assert!(!m.is_semaphore());
                    }
                }
                Some(cap) => {
                    prop_assert_eq!(info.capacity, Some(cap), "capacity of {} changed", n);
                    prop_assert!(held_weight(&info) <= u64::from(cap), "{} over capacity", n);
                    let modes = info
                        .holders
                        .iter()
                        .map(|h| h.mode)
                        .chain(info.waiters.iter().map(|w| w.mode));
                    for m in modes {
                        prop_assert!(
                            matches!(m, Mode::Semaphore { capacity, weight }
                            if capacity == cap && (1..=cap).contains(&weight)),
                            "{}: {:?}",
                            n,
                            m
                        );
                    }
                }
            }
            // A head that fits would have been granted.
            if let Some(head) = info.waiters.first() {
                prop_assert!(
                    info.lock_delayed || !fits(&info, head.mode),
                    "{}: head {:?} grantable",
                    n,
                    head
                );
            }
            // Fences only grow along a name's holders, and stay below the counter.
            for h in &info.holders {
                prop_assert!(h.fence <= t.last_fence());
                prop_assert_eq!(t.check_fence(&info.name, h.fence).0, true);
            }
        }
        prop_assert_eq!(
            t.last_fence(),
            self.fences.last().copied().unwrap_or(Fence(0))
        );
        // No wait-for cycle, by brute force.
        prop_assert!(
            !has_cycle(&naive_graph(&infos)),
            "wait-for cycle in {:?}",
            infos
        );
        // Gone sessions leave no trace.
        for d in &self.dead {
            prop_assert!(t.session(*d).is_none(), "{} still open", d);
            for info in &infos {
                prop_assert!(
                    info.holders.iter().all(|h| h.session != *d)
                        && info.waiters.iter().all(|w| w.session != *d),
                    "{} still in {:?}",
                    d,
                    info
                );
            }
        }
        let open: BTreeSet<SessionId> = t.sessions().map(|s| s.session).collect();
        let slots: BTreeSet<SessionId> = self.slots.iter().flatten().map(|s| s.id).collect();
        prop_assert_eq!(open, slots);
        let delays: BTreeMap<String, (u64, u64)> = t
            .delays()
            .map(|(n, since, ms)| (n.as_str().to_string(), (since, ms)))
            .collect();
        prop_assert_eq!(&delays, &self.delays);
        let stats = t.stats();
        prop_assert_eq!(stats.grants, self.holders.len() as u64);
        prop_assert_eq!(
            stats.waiters,
            self.queues.values().map(|q| q.len() as u64).sum::<u64>()
        );
        Ok(())
    }

    /// Records a client request's reply window and history.
    fn remember(&mut self, command: &Command, session: SessionId, seq: u64, reply: &Reply) {
        if matches!(reply, Reply::Refused(_)) {
            return;
        }
        let w = self.windows.entry(session).or_default();
        if w.seqs.insert(seq) {
            while w.seqs.len() > MAX_REMEMBERED_REPLIES {
                let old = w.seqs.pop_first().expect("non-empty");
                w.floor = Some(w.floor.map_or(old, |f| f.max(old)));
            }
            self.history.push(Applied {
                command: command.clone(),
                reply: reply.clone(),
                session,
                seq,
            });
        }
    }

    /// Applies a client request, then applies it once more as a duplicate:
    /// same reply, nothing changed.
    fn request(&mut self, command: Command) -> Result<(LockTable, Response), TestCaseError> {
        let (before, r) = self.apply(command.clone())?;
        let (again, dup) = self.apply(command.clone())?;
        prop_assert_eq!(&dup.reply, &r.reply, "duplicate of {:?}", command);
        prop_assert!(dup.events.is_empty());
        prop_assert!(
            self.live == again,
            "duplicate of {:?} changed the table",
            command
        );
        Ok((before, r))
    }

    fn run(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Open { slot, delay, nonce } => {
                let empty = (0..SLOTS)
                    .map(|i| (slot + i) % SLOTS)
                    .find(|&i| self.slots[i].is_none());
                self.open(empty.unwrap_or(slot), delay, nonce)?
            }
            Op::Close { slot } | Op::Expire { slot } => {
                let id = self.session_of(slot);
                let existed = self.slots[slot].is_some();
                let (command, expect) = if matches!(op, Op::Close { .. }) {
                    let seq = self.next_seq();
                    (
                        Command::CloseSession {
                            session: id,
                            seq,
                            caller: String::new(),
                        },
                        existed,
                    )
                } else {
                    (Command::ExpireSession { session: id }, existed)
                };
                if expect {
                    self.slots[slot] = None;
                    self.gone[slot] = id;
                }
                let (before, r) = self.apply(command)?;
                let ended = r
                    .events
                    .iter()
                    .filter(|e| matches!(e, Event::Ended { .. }))
                    .count();
                match r.reply {
                    Reply::Closed { released } => {
                        prop_assert!(expect);
                        prop_assert_eq!(released as usize, ended);
                    }
                    Reply::Expired { existed } => prop_assert_eq!(existed, expect),
                    Reply::Refused(Refusal::SessionNotFound { session }) => {
                        prop_assert!(!expect);
                        prop_assert_eq!(session, id);
                    }
                    ref other => prop_assert!(false, "{:?}", other),
                }
                if expect {
                    let held: usize = Self::infos(&before)
                        .iter()
                        .map(|i| i.holders.iter().filter(|h| h.session == id).count())
                        .sum();
                    prop_assert_eq!(held, ended, "not every grant of {} ended", id);
                }
            }
            Op::Acquire {
                slot,
                target,
                shared,
                weight,
                timeout,
                value,
            } => {
                let session = self.session_of(slot);
                let (n, capacity) = NAMES[target];
                let mode = match capacity {
                    None if shared => SH,
                    None => X,
                    Some(capacity) => Mode::Semaphore {
                        weight: 1 + weight % capacity,
                        capacity,
                    },
                };
                let timeout_ms = TIMEOUTS[timeout];
                let seq = self.next_seq();
                let command = Command::Acquire {
                    session,
                    seq,
                    name: n.to_string(),
                    mode,
                    timeout_ms,
                    value: vec![value; usize::from(value)],
                    caller: String::new(),
                };
                let (before, r) = self.request(command.clone())?;
                self.check_acquire(&before, &r, session, n, mode, timeout_ms)?;
                self.remember(&command, session, seq, &r.reply);
            }
            Op::Release {
                slot,
                target,
                pick,
                n: which,
            } => {
                let session = self.session_of(slot);
                let target = NAMES[target].0;
                let grants: Vec<(&str, Fence, SessionId)> = self
                    .holders
                    .iter()
                    .map(|(f, (n, s, _))| (n.as_str(), *f, *s))
                    .collect();
                let own = grants.iter().filter(|g| g.2 == session);
                let own = own.clone().find(|g| g.0 == target).or(own.clone().next());
                let other = grants.iter().find(|g| g.0 == target && g.2 != session);
                let stale =
                    (!self.fences.is_empty()).then(|| self.fences[which.index(self.fences.len())]);
                let bogus = Fence(self.live.last_fence().0 + 100);
                let (name, fence) = match pick {
                    FencePick::Own => own.map_or((target, bogus), |g| (g.0, g.1)),
                    FencePick::OtherHolders => {
                        (target, other.map(|g| g.1).or(stale).unwrap_or(bogus))
                    }
                    FencePick::Stale => (target, stale.unwrap_or(bogus)),
                    FencePick::Bogus => (target, bogus),
                };
                let name = name.to_string();
                // Owner-checked: only this session's grant with this fence.
                let released = self
                    .holders
                    .get(&fence)
                    .is_some_and(|(n, s, _)| *n == name && *s == session);
                let seq = self.next_seq();
                let command = Command::Release {
                    session,
                    seq,
                    name,
                    fence,
                    caller: String::new(),
                };
                let (_, r) = self.request(command.clone())?;
                if self.slots[slot].is_none() {
                    prop_assert_eq!(
                        &r.reply,
                        &Reply::Refused(Refusal::SessionNotFound { session })
                    );
                } else {
                    prop_assert_eq!(&r.reply, &Reply::Released { released });
                    if released {
                        prop_assert!(
                            matches!(&r.events[0], Event::Ended { fence: f, session: s, cause: EndCause::Released, .. }
                            if *f == fence && *s == session),
                            "{:?}",
                            r.events
                        );
                    } else {
                        prop_assert!(r.events.is_empty());
                    }
                }
                self.remember(&command, session, seq, &r.reply);
            }
            Op::Cancel {
                slot,
                target,
                real,
                n,
            } => {
                let waits: Vec<(&str, SessionId, u64)> = self
                    .queues
                    .iter()
                    .flat_map(|(name, q)| q.iter().map(move |&(s, seq)| (name.as_str(), s, seq)))
                    .collect();
                let (name, session, seq) = match (real, waits.is_empty()) {
                    (true, false) => waits[n.index(waits.len())],
                    _ => {
                        // The slot's own wait with a wrong seq, or no wait.
                        let session = self.session_of(slot);
                        let name = NAMES[target].0;
                        let wait = self.queues[name].iter().find(|w| w.0 == session);
                        (name, session, wait.map_or(self.seq, |w| w.1 + 1))
                    }
                };
                let cancelled = self.queues[name].contains(&(session, seq));
                let name = name.to_string();
                let (_, r) = self.apply(Command::CancelWait { session, name, seq })?;
                prop_assert_eq!(&r.reply, &Reply::Cancelled { cancelled });
                if cancelled {
                    prop_assert!(
                        matches!(
                            &r.events[0],
                            Event::Cancelled {
                                cause: CancelCause::TimedOut,
                                ..
                            }
                        ),
                        "{:?}",
                        r.events
                    );
                }
            }
            Op::EndDelay { target, real, n } => {
                let delays: Vec<(String, u64)> =
                    self.delays.iter().map(|(n, d)| (n.clone(), d.0)).collect();
                let (name, since) = match (real, delays.is_empty()) {
                    (true, false) => delays[n.index(delays.len())].clone(),
                    _ => {
                        // A delay that is over, superseded or never was.
                        let name = NAMES[target].0;
                        let since = self.last_since.get(name).map_or(self.index, |s| s + 1);
                        (name.to_string(), since)
                    }
                };
                let ended = self.delays.get(&name).map(|d| d.0) == Some(since);
                let (_, r) = self.apply(Command::EndLockDelay { name, since })?;
                prop_assert_eq!(r.reply, Reply::DelayEnded { ended });
            }
            Op::Replay { n } => {
                if self.history.is_empty() {
                    return Ok(());
                }
                let past = self.history[n.index(self.history.len())].clone();
                let (before, r) = self.apply(past.command.clone())?;
                prop_assert!(r.events.is_empty(), "a replay had events");
                prop_assert!(self.live == before, "a replay changed the table");
                let expected = self.replay_answer(&before, &past);
                prop_assert_eq!(r.reply, expected, "replay of {:?}", past);
            }
            Op::Bad { kind, slot, target } => {
                let session = self.session_of(slot);
                let seq = self.next_seq();
                let (n, capacity) = NAMES[target];
                let (sem, sem_cap) = NAMES[3 + target % 2];
                let exists = |name: &str| self.live.describe(&lock_name(name)).is_some();
                let acquire = |name: &str, mode: Mode, value: usize| Command::Acquire {
                    session,
                    seq,
                    name: name.to_string(),
                    mode,
                    timeout_ms: 1_000,
                    value: vec![0; value],
                    caller: String::new(),
                };
                let valid_mode = capacity.map_or(X, |capacity| Mode::Semaphore {
                    weight: 1,
                    capacity,
                });
                let command = match kind {
                    0 => acquire("", X, 0),
                    1 => acquire(&"b".repeat(MAX_NAME_LEN + 1), X, 0),
                    2 => acquire(n, valid_mode, MAX_VALUE_LEN + 1),
                    3 => Command::OpenSession {
                        ttl_ms: MIN_SESSION_TTL_MS - 1,
                        lock_delay_ms: 0,
                        nonce: 0,
                        owner: String::new(),
                    },
                    4 => Command::OpenSession {
                        ttl_ms: 10_000,
                        lock_delay_ms: MAX_LOCK_DELAY_MS + 1,
                        nonce: 0,
                        owner: String::new(),
                    },
                    5 if exists(sem) => {
                        let capacity = sem_cap.unwrap_or(1) + 1;
                        acquire(
                            sem,
                            Mode::Semaphore {
                                weight: 1,
                                capacity,
                            },
                            0,
                        )
                    }
                    6 if exists(n) => {
                        let other = if capacity.is_some() {
                            X
                        } else {
                            Mode::Semaphore {
                                weight: 1,
                                capacity: 2,
                            }
                        };
                        acquire(n, other, 0)
                    }
                    7 => acquire(
                        sem,
                        Mode::Semaphore {
                            weight: 0,
                            capacity: sem_cap.unwrap_or(1),
                        },
                        0,
                    ),
                    8 => {
                        let capacity = sem_cap.unwrap_or(1);
                        acquire(
                            sem,
                            Mode::Semaphore {
                                weight: capacity + 1,
                                capacity,
                            },
                            0,
                        )
                    }
                    9 => acquire(
                        sem,
                        Mode::Semaphore {
                            weight: 1,
                            capacity: 0,
                        },
                        0,
                    ),
                    10 => Command::Release {
                        session,
                        seq,
                        name: String::new(),
                        fence: Fence(1),
                        caller: String::new(),
                    },
                    11 => Command::Acquire {
                        session: SessionId(u64::MAX),
                        seq,
                        name: n.to_string(),
                        mode: valid_mode,
                        timeout_ms: 0,
                        value: Vec::new(),
                        caller: String::new(),
                    },
                    _ => return Ok(()),
                };
                let (_, r) = self.apply(command.clone())?;
                prop_assert!(
                    matches!(r.reply, Reply::Refused(_)),
                    "{:?} was not refused",
                    command
                );
            }
        }
        Ok(())
    }

    /// Opens a session in `slot` if it is empty, else retries its open.
    fn open(&mut self, slot: usize, delay: usize, nonce: bool) -> Result<(), TestCaseError> {
        match self.slots[slot] {
            None => {
                let nonce = if nonce { 1_000_000 + self.index } else { 0 };
                let lock_delay_ms = DELAYS[delay];
                // The id is the log index; the slot holds it before the
                // step's checks compare open sessions with the slots.
                let id = SessionId(self.index + 1);
                self.slots[slot] = Some(Slot { id, nonce });
                let (_, r) = self.apply(Command::OpenSession {
                    ttl_ms: 10_000,
                    lock_delay_ms,
                    nonce,
                    owner: String::new(),
                })?;
                prop_assert_eq!(
                    r.reply,
                    Reply::Opened {
                        session: id,
                        ttl_ms: 10_000,
                        lock_delay_ms
                    }
                );
            }
            Some(Slot { id, nonce }) if nonce != 0 => {
                let (before, r) = self.apply(Command::OpenSession {
                    ttl_ms: 20_000,
                    lock_delay_ms: 0,
                    nonce,
                    owner: String::new(),
                })?;
                prop_assert!(
                    matches!(r.reply, Reply::Opened { session, .. } if session == id),
                    "{:?}",
                    r.reply
                );
                prop_assert!(self.live == before, "a retried open changed the table");
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// What a fresh acquire must answer, given the table before it.
    fn check_acquire(
        &self,
        before: &LockTable,
        r: &Response,
        session: SessionId,
        n: &str,
        mode: Mode,
        timeout_ms: u64,
    ) -> Result<(), TestCaseError> {
        if before.session(session).is_none() {
            prop_assert_eq!(
                &r.reply,
                &Reply::Refused(Refusal::SessionNotFound { session })
            );
            return Ok(());
        }
        let info = before.describe(&lock_name(n));
        let held = info
            .iter()
            .flat_map(|i| &i.holders)
            .find(|h| h.session == session);
        let waiting = info
            .iter()
            .flat_map(|i| &i.waiters)
            .find(|w| w.session == session);
        let other_mode = Reply::Refused(Refusal::OtherMode {
            session,
            name: lock_name(n),
        });
        match (held, waiting) {
            // Asking again (a new seq) for what it holds or waits for:
            // refused, naming the grant or wait, or OtherMode.
            (Some(h), _) if h.mode == mode => prop_assert_eq!(
                &r.reply,
                &Reply::Refused(Refusal::AlreadyHeld {
                    session,
                    name: lock_name(n),
                    fence: h.fence
                })
            ),
            (_, Some(w)) if w.mode == mode => prop_assert_eq!(
                &r.reply,
                &Reply::Refused(Refusal::AlreadyWaiting {
                    session,
                    name: lock_name(n),
                    seq: w.seq
                })
            ),
            (Some(_), _) | (_, Some(_)) => prop_assert_eq!(&r.reply, &other_mode),
            (None, None) if grantable_now(info.as_ref(), mode) => {
                let fence = Fence(before.last_fence().0 + 1);
                prop_assert_eq!(
                    &r.reply,
                    &Reply::Acquire(Acquired::Granted {
                        fence,
                        mode,
                        index: self.index - 1
                    })
                );
            }
            (None, None) if timeout_ms == 0 => {
                prop_assert_eq!(&r.reply, &Reply::Acquire(Acquired::NotAcquired))
            }
            (None, None) => prop_assert!(
                matches!(
                    r.reply,
                    Reply::Acquire(Acquired::Queued) | Reply::Refused(Refusal::Deadlock { .. })
                ),
                "busy wait answered {:?}",
                r.reply
            ),
        }
        Ok(())
    }

    /// What a replayed request must answer now.
    fn replay_answer(&self, before: &LockTable, past: &Applied) -> Reply {
        let (session, seq) = (past.session, past.seq);
        if before.session(session).is_none() {
            return Reply::Refused(Refusal::SessionNotFound { session });
        }
        let window = &self.windows[&session];
        if !window.seqs.contains(&seq) {
            let floor = window.floor.expect("forgotten, so a floor");
            return Reply::Refused(Refusal::SequenceTooOld {
                session,
                seq,
                floor,
            });
        }
        if past.reply != Reply::Acquire(Acquired::Queued) {
            return past.reply.clone();
        }
        if self.queued.contains(&(session, seq)) {
            // The wait's outcome, once decided.
            return self
                .outcomes
                .get(&(session, seq))
                .cloned()
                .unwrap_or(Reply::Acquire(Acquired::Queued));
        }
        // A repeated acquire of a wait in progress: where the session stands.
        let Command::Acquire { name, .. } = &past.command else {
            unreachable!("only acquires are queued")
        };
        let info = before.describe(&lock_name(name));
        if let Some(h) = info
            .iter()
            .flat_map(|i| &i.holders)
            .find(|h| h.session == session)
        {
            return Reply::Acquire(Acquired::Granted {
                fence: h.fence,
                mode: h.mode,
                index: h.index,
            });
        }
        if info
            .iter()
            .flat_map(|i| &i.waiters)
            .any(|w| w.session == session)
        {
            return Reply::Acquire(Acquired::Queued);
        }
        Reply::Acquire(Acquired::NotAcquired)
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_histories_keep_every_rule(
        ops in prop::collection::vec(op(), 100..300),
        split in any::<Index>(),
    ) {
        let mut h = History::new();
        for slot in 0..SLOTS {
            h.run(&Op::Open { slot, delay: slot, nonce: slot % 2 == 0 })?;
        }
        // Snapshot at a random step; the restored copy must then follow
        // every later command exactly as the live table.
        let split = split.index(ops.len() + 1);
        for (i, op) in ops.iter().enumerate() {
            if i == split {
                h.restore_copy()?;
            }
            h.run(op)?;
        }
        h.restore_copy()?;
    }
}

// --------------------------------------------------- wait-for situations

/// A session number and a mode number (see `situation_mode`).
type Entry = (u64, u8);

/// Grants and waits on each name, and one more request (session, name
/// number, mode number) to try against the acquire-time search.
#[derive(Clone, Debug)]
struct Situation {
    /// Per name: its holders, then its queue.
    names: Vec<(Vec<Entry>, Vec<Entry>)>,
    request: (u64, usize, u8),
}

const SITUATION_SESSIONS: u64 = 5;
/// Names of a situation: locks, then semaphores of capacity 4.
const SITUATION_LOCKS: usize = 3;
const SITUATION_NAMES: usize = 5;

fn situation() -> impl Strategy<Value = Situation> {
    let entry = (1..=SITUATION_SESSIONS, 0..4u8);
    let name = (
        prop::collection::vec(entry.clone(), 0..3),
        prop::collection::vec(entry, 0..4),
    );
    (
        prop::collection::vec(name, SITUATION_NAMES),
        (1..=SITUATION_SESSIONS, 0..SITUATION_NAMES, 0..4u8),
    )
        .prop_map(|(names, request)| Situation { names, request })
}

fn situation_mode(name: usize, m: u8) -> Mode {
    if name < SITUATION_LOCKS {
        if m == 0 {
            X
        } else {
            SH
        }
    } else {
        Mode::Semaphore {
            weight: 1 + u32::from(m),
            capacity: 4,
        }
    }
}

/// Builds the situation straight into a table: well-formed (one grant or
/// wait per session per name, exclusive alone, weights within capacity,
/// sessions listing their grants and waits), but with any wait-for graph,
/// cycles included.
fn build(s: &Situation) -> LockTable {
    let mut t = LockTable::new();
    for id in 1..=SITUATION_SESSIONS {
        t.sessions.insert(
            SessionId(id),
            Session {
                ttl_ms: 10_000,
                lock_delay_ms: 0,
                nonce: 0,
                owner: String::new(),
                held: BTreeMap::new(),
                waiting: BTreeMap::new(),
                replies: Default::default(),
            },
        );
    }
    let mut index = 100;
    for (i, (holders, waiters)) in s.names.iter().enumerate() {
        let name = lock_name(&format!("n{i}"));
        let mut lock = Lock {
            capacity: (i >= SITUATION_LOCKS).then_some(4),
            holders: Default::default(),
            held_weight: 0,
            queue: VecDeque::new(),
            delay: None,
        };
        let mut seen = BTreeSet::new();
        for &(session, m) in holders {
            let mode = situation_mode(i, m);
            let exclusive_clash = lock.capacity.is_none()
                && (mode == X || lock.holders.values().any(|h| h.mode == X))
                && !lock.holders.is_empty();
            let too_heavy =
                lock.capacity.is_some() && lock.held_weight + u64::from(mode.weight()) > 4;
            if exclusive_clash || too_heavy || !seen.insert(session) {
                continue;
            }
            t.last_fence += 1;
            let fence = Fence(t.last_fence);
            lock.held_weight += u64::from(mode.weight());
            lock.holders.insert(
                fence,
                Holder {
                    session: SessionId(session),
                    seq: 1,
                    mode,
                    value: Vec::new(),
                    index,
                },
            );
            t.sessions
                .get_mut(&SessionId(session))
                .unwrap()
                .held
                .insert(name.clone(), fence);
            index += 1;
        }
        for &(session, m) in waiters {
            if !seen.insert(session) {
                continue;
            }
            let mode = situation_mode(i, m);
            lock.queue.push_back(Waiter {
                session: SessionId(session),
                seq: 2,
                mode,
                value: Vec::new(),
                timeout_ms: 1_000,
                index,
            });
            t.sessions
                .get_mut(&SessionId(session))
                .unwrap()
                .waiting
                .insert(name.clone(), WaitRef { seq: 2, index });
            index += 1;
        }
        if !lock.holders.is_empty() || !lock.queue.is_empty() {
            t.locks.insert(name, lock);
        }
    }
    t
}

proptest! {
    #![proptest_config(ProptestConfig { cases: config().cases * 4, ..config() })]

    #[test]
    fn wait_cycle_matches_a_naive_search(s in situation()) {
        let t = build(&s);
        let infos: Vec<LockInfo> = t.list("", None, usize::MAX);
        let cyclic = has_cycle(&naive_graph(&infos));
        let found = t.wait_cycle();
        prop_assert_eq!(found.is_some(), cyclic, "checker vs brute force on {:?}", infos);
        if let Some(cycle) = &found {
            check_cycle(&infos, cycle, None)?;
            prop_assert!(t.check_invariants().is_err());
        }

        // On an acyclic table, the acquire-time search refuses exactly the
        // requests whose wait would close a cycle.
        let (session, name_no, m) = s.request;
        let session = SessionId(session);
        let name = lock_name(&format!("n{name_no}"));
        let mode = situation_mode(name_no, m);
        let involved = infos.iter().any(|i| {
            i.name == name
                && (i.holders.iter().any(|h| h.session == session)
                    || i.waiters.iter().any(|w| w.session == session))
        });
        if !cyclic && !involved {
            let mut graph = naive_graph(&infos);
            if let Some(info) = infos.iter().find(|i| i.name == name) {
                let blockers = naive_blockers(info, info.waiters.len(), mode);
                graph.entry(session).or_default().extend(blockers);
            }
            let refused = t.find_cycle(session, &name, mode);
            prop_assert_eq!(refused.is_some(), has_cycle(&graph), "request {:?} on {:?}", (session, &name, mode), infos);
            if let Some(cycle) = &refused {
                prop_assert_eq!(cycle[0].session, session);
                check_cycle(&infos, cycle, Some((&name, mode)))?;
            }
        }
    }
}
