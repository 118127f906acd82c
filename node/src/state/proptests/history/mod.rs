//! Random histories against a model built from replies, events and views.

use super::*;

mod checks;
mod events;
mod run;

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
    Revoke {
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
    /// Upgrade the slot's grant on the name (`real`: its own shared
    /// grant if it has one; else a fence it does not hold shared).
    Upgrade {
        slot: usize,
        target: usize,
        real: bool,
        timeout: usize,
    },
    /// An atomic request for the names whose bits are set in `names` (at
    /// least one), shared where the lock allows and `shared` says.
    AcquireAll {
        slot: usize,
        names: u8,
        shared: bool,
        timeout: usize,
    },
    /// Downgrade the slot's grant on the name (`real` as for `Upgrade`).
    Downgrade {
        slot: usize,
        target: usize,
        real: bool,
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
        1 => slot.clone().prop_map(|slot| Op::Revoke { slot }),
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
        3 => (slot.clone(), 0..3usize, any::<bool>(), 0..TIMEOUTS.len())
            .prop_map(|(slot, target, real, timeout)| Op::Upgrade { slot, target, real, timeout }),
        2 => (slot.clone(), 0..3usize, any::<bool>())
            .prop_map(|(slot, target, real)| Op::Downgrade { slot, target, real }),
        5 => (slot.clone(), 1..32u8, any::<bool>(), 0..TIMEOUTS.len())
            .prop_map(|(slot, names, shared, timeout)| Op::AcquireAll { slot, names, shared, timeout }),
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
    /// The pending upgrade per name, from `Queued` events of upgrades.
    upgrades: BTreeMap<String, (SessionId, u64)>,
    /// Queued atomic requests and their names in order, from `Queued`
    /// events of `AcquireAll`.
    groups: BTreeMap<(SessionId, u64), Vec<String>>,
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
            upgrades: BTreeMap::new(),
            groups: BTreeMap::new(),
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
                | Reply::WaitTimedOut { ended: false }
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
        if let (Reply::Refused(Refusal::Deadlock { cycle }), Command::Upgrade(c)) =
            (&r.reply, command)
        {
            // An upgrade's cycle may go through edges it would add (the
            // shared requests queued on the name would need it): closed,
            // and starting with the upgrader.
            prop_assert!(!cycle.is_empty());
            prop_assert_eq!(cycle[0].session, c.session);
            for (i, e) in cycle.iter().enumerate() {
                prop_assert_eq!(e.blocker, cycle[(i + 1) % cycle.len()].session);
            }
        } else if let Reply::Refused(Refusal::Deadlock { cycle }) = &r.reply {
            // An upgrade waits as an exclusive request would, first in line.
            let (session, name, mode, timeout_ms) = match command {
                Command::Acquire(c) => (&c.session, &c.name, &c.mode, &c.timeout_ms),
                Command::AcquireAll(c) => {
                    let Some((name, mode)) = c
                        .locks
                        .iter()
                        .find(|(n, _)| cycle.first().is_some_and(|e| e.name == *n))
                    else {
                        return Err(TestCaseError::fail("a cycle on none of its names"));
                    };
                    (&c.session, name, mode, &c.timeout_ms)
                }
                _ => return Err(TestCaseError::fail("deadlock refusal of a non-acquire")),
            };
            prop_assert!(*timeout_ms > 0, "a try was refused as a deadlock");
            check_cycle(
                &Self::infos(before),
                cycle,
                Some((&lock_name(name.as_str()), *mode)),
            )?;
            prop_assert_eq!(cycle[0].session, *session);
        }
        self.follow_events(command, before, r)?;
        self.check_views()
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
            // A pending upgrade first, then the queue.
            let model: Vec<(SessionId, u64)> = self
                .upgrades
                .get(n)
                .into_iter()
                .copied()
                .chain(self.queues[n].iter().copied())
                .collect();
            prop_assert_eq!(&waiters, &model, "queue of {}", n);
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
            // A head that fits would have been granted (an atomic request
            // must fit all its names, checked by the table's invariants).
            if let Some(head) = info
                .waiters
                .first()
                .filter(|w| !self.groups.contains_key(&(w.session, w.seq)))
            {
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
