//! Random wait-for situations against a brute-force cycle search.

use super::*;

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
                end_on_disconnect_ms: 0,
                lock_pending: false,
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
