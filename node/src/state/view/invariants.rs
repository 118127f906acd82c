//! The table's invariant checker (invariants 1–7 of the state module's
//! docs), run on every decoded snapshot and by the tests.

use std::collections::BTreeSet;

use crate::state::command::Mode;
use crate::state::table::LockTable;

impl LockTable {
    /// Checks invariants 1–7 of the [module docs](crate::state); the first broken
    /// one is described in the error. Linear in the table's size.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.usage != crate::state::table::Usage::of(self) {
            return Err(format!(
                "the counted use {:?} is not the table's, {:?}",
                self.usage.total,
                crate::state::table::Usage::of(self).total
            ));
        }
        if self.last_fence > crate::state::limits::MAX_FENCE {
            return Err(format!(
                "fence counter {} is past the largest fence, {}",
                self.last_fence,
                crate::state::limits::MAX_FENCE
            ));
        }
        let mut fences = BTreeSet::new();
        for (name, lock) in &self.locks {
            let exclusive = lock
                .holders
                .values()
                .filter(|h| h.mode == Mode::Exclusive)
                .count();
            if exclusive > 1 || (exclusive == 1 && lock.holders.len() > 1) {
                return Err(format!("{name}: exclusive holder with other holders"));
            }
            let weight: u64 = lock
                .holders
                .values()
                .map(|h| u64::from(h.mode.weight()))
                .sum();
            if weight != lock.held_weight {
                return Err(format!(
                    "{name}: held weight {} != sum {weight}",
                    lock.held_weight
                ));
            }
            match lock.capacity {
                Some(cap) => {
                    if weight > u64::from(cap) {
                        return Err(format!("{name}: weight {weight} over capacity {cap}"));
                    }
                    let modes = lock
                        .holders
                        .values()
                        .map(|h| h.mode)
                        .chain(lock.queue.iter().map(|w| w.mode));
                    for m in modes {
                        // Weights outside 1..=cap never pass `apply`; in a
                        // corrupt snapshot they would underflow the deadlock
                        // search's `capacity - weight`.
                        if !matches!(m, Mode::Semaphore { capacity, weight }
                            if capacity == cap && (1..=cap).contains(&weight))
                        {
                            return Err(format!("{name}: {m:?} on semaphore of {cap}"));
                        }
                    }
                }
                None => {
                    if lock.holders.values().any(|h| h.mode.is_semaphore())
                        || lock.queue.iter().any(|w| w.mode.is_semaphore())
                    {
                        return Err(format!("{name}: semaphore mode on a lock"));
                    }
                }
            }
            // A pending upgrade goes ahead of the queue: the head waits
            // behind it whatever its mode.
            // So does an atomic request at the head that does not fit all
            // its names (checked with the groups below).
            let grouped =
                |w: &crate::state::table::Waiter| self.groups.contains_key(&(w.session, w.seq));
            if let Some(head) = lock
                .queue
                .front()
                .filter(|w| !self.upgrades.contains_key(name) && !grouped(w))
            {
                let mut probe = lock.clone();
                probe.queue.clear();
                if probe_compatible(&probe, head.mode) {
                    return Err(format!("{name}: head of queue is grantable"));
                }
            }
            if lock
                .queue
                .iter()
                .zip(lock.queue.iter().skip(1))
                .any(|(a, b)| a.index >= b.index)
            {
                return Err(format!("{name}: queue out of index order"));
            }
            if !lock.holders.is_sorted() {
                return Err(format!("{name}: holders out of fence order"));
            }
            if lock.holders.is_empty() && lock.queue.is_empty() && lock.delay.is_none() {
                return Err(format!("{name}: idle entry kept"));
            }
            for (fence, h) in &lock.holders {
                if fence.0 > self.last_fence || !fences.insert(*fence) {
                    return Err(format!(
                        "{name}: fence {} reused or ahead of counter",
                        fence.0
                    ));
                }
                let s = self
                    .sessions
                    .get(&h.session)
                    .ok_or(format!("{name}: holder's session gone"))?;
                if s.held.get(name) != Some(fence) {
                    return Err(format!("{name}: {} does not list its grant", h.session));
                }
            }
            let mut seen = BTreeSet::new();
            for w in &lock.queue {
                if !seen.insert(w.session) {
                    return Err(format!("{name}: {} queued twice", w.session));
                }
                let s = self
                    .sessions
                    .get(&w.session)
                    .ok_or(format!("{name}: waiter's session gone"))?;
                if s.waiting.get(name).map(|r| (r.seq, r.index)) != Some((w.seq, w.index)) {
                    return Err(format!("{name}: {} does not list its wait", w.session));
                }
                if w.timeout_ms == 0 {
                    return Err(format!("{name}: a try was queued"));
                }
            }
        }
        for (id, s) in &self.sessions {
            for (name, fence) in &s.held {
                let ok = self
                    .locks
                    .get(name)
                    .and_then(|l| l.holders.get(fence))
                    .is_some_and(|h| h.session == *id);
                if !ok {
                    return Err(format!(
                        "{id} lists a grant on {name} the lock does not have"
                    ));
                }
            }
            for (name, wait) in &s.waiting {
                if s.held.contains_key(name) {
                    return Err(format!("{id} both holds and waits for {name}"));
                }
                // Queues are in index order (checked above), so the wait is
                // found by binary search: a scan per wait would make this
                // quadratic in a queue's length.
                let listed = self.locks.get(name).is_some_and(|l| {
                    l.position(wait.index)
                        .is_some_and(|p| l.queue[p].session == *id)
                });
                if !listed {
                    return Err(format!(
                        "{id} lists a wait on {name} the queue does not have"
                    ));
                }
            }
            if s.nonce != 0 && self.nonces.get(&s.nonce) != Some(id) {
                return Err(format!("{id}: nonce not indexed"));
            }
        }
        if self.nonces.len() != self.sessions.values().filter(|s| s.nonce != 0).count() {
            return Err("stale nonce entries".into());
        }
        for (&(session, seq), names) in &self.groups {
            // 9. A queued atomic request has a place in the queue of each of
            // its names (and each once), its open session lists each wait,
            // and it does not fit all of them at the head (else it would
            // have been granted).
            let mut seen = BTreeSet::new();
            if names.is_empty() || names.len() > crate::state::limits::MAX_NAMES_PER_REQUEST {
                return Err(format!(
                    "{session}: atomic request {seq} of {} names",
                    names.len()
                ));
            }
            for name in names {
                if !seen.insert(name) {
                    return Err(format!(
                        "{session}: atomic request {seq} names {name} twice"
                    ));
                }
                let listed = self
                    .sessions
                    .get(&session)
                    .and_then(|s| s.waiting.get(name))
                    .is_some_and(|w| w.seq == seq);
                if !listed {
                    return Err(format!(
                        "{session}: atomic request {seq} not waiting for {name}"
                    ));
                }
            }
            if self.group_ready((session, seq)) {
                return Err(format!("{session}: atomic request {seq} is grantable"));
            }
        }
        for (name, u) in &self.upgrades {
            // 8. An upgrade is of a shared grant its open session holds on
            // a lock, and is not grantable (else it would have been
            // granted).
            let held = self
                .sessions
                .get(&u.session)
                .is_some_and(|s| s.held.get(name) == Some(&u.fence));
            let lock = self.locks.get(name);
            let shared = lock
                .and_then(|l| l.holders.get(&u.fence))
                .is_some_and(|h| h.session == u.session && h.mode == Mode::Shared);
            if !held || !shared {
                return Err(format!(
                    "{}: upgrade of a grant it does not hold shared on {name}",
                    u.session
                ));
            }
            if lock.is_some_and(|l| l.holders.len() == 1 && l.delay.is_none()) {
                return Err(format!("{name}: pending upgrade is grantable"));
            }
        }
        if let Some(cycle) = self.wait_cycle() {
            return Err(format!("wait-for cycle through {cycle:?}"));
        }
        Ok(())
    }
}

/// `Lock::compatible` without the queue, visible to the checker.
fn probe_compatible(lock: &crate::state::table::Lock, mode: Mode) -> bool {
    if lock.delay.is_some() {
        return false;
    }
    match (lock.capacity, mode) {
        (Some(cap), _) => lock.held_weight + u64::from(mode.weight()) <= u64::from(cap),
        (None, Mode::Shared) => lock.holders.values().all(|h| h.mode == Mode::Shared),
        (None, _) => lock.holders.is_empty(),
    }
}
