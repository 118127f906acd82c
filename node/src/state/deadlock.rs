//! Deadlock detection on the wait-for graph between sessions.
//!
//! Edges are *necessary* blockers only, so a cycle is a real deadlock and
//! never a guess: waiter `W` on name `n` has an edge to
//!
//! * every waiter queued ahead of it on `n` (FIFO without barging: `W`
//!   cannot be granted before them), and
//! * every holder of `n` whose release `W` cannot do without: for a lock,
//!   holders that conflict with `W` or with a waiter ahead of it; for a
//!   semaphore, holders whose weight alone keeps `W` (or a waiter ahead)
//!   from fitting, `weight(h) > capacity - weight(W)`.
//!
//! The model is that a session is one thread of control: while it waits, it
//! does not release what it holds. Clients that run independent work
//! concurrently use one session per task.
//!
//! The graph is acyclic before every acquire (each acquire that would close
//! a cycle is refused), and only a new wait adds edges that can close one,
//! so the search starts from the new wait's blockers and looks for the
//! requester. Each queue is scanned at most once per search (a waiter's
//! position is found by binary search on its queued index, and the prefix of
//! a queue already walked is remembered), so the cost is linear in the part
//! of the graph reachable from the request.

use std::collections::{BTreeMap, BTreeSet};

use super::command::{LockName, Mode, SessionId, WaitEdge};
use super::table::{Lock, LockTable};

/// How much of one name's blockers the search has pushed already.
#[derive(Default)]
struct Scanned {
    /// Waiters `queue[..prefix]` are pushed.
    prefix: usize,
    /// All holders are pushed.
    all_holders: bool,
    /// Exclusive holders are pushed.
    exclusive_holders: bool,
    /// Semaphore holders necessary for this weight are pushed.
    weight: u32,
}

impl LockTable {
    /// If `requester` queuing for `name` in `mode` would close a wait-for
    /// cycle, returns it, starting with the requester's new edge.
    pub(super) fn find_cycle(
        &self,
        requester: SessionId,
        name: &LockName,
        mode: Mode,
    ) -> Option<Vec<WaitEdge>> {
        let lock = self.locks.get(name)?;
        // A cycle through the requester needs someone blocked by it: a
        // waiter on a name it holds, or one queued behind it elsewhere. The
        // common case (a worker holding nothing, or nothing contended) is
        // settled here without a search.
        let session = self.sessions.get(&requester)?;
        let blocks_someone = session.held.keys().chain(session.waiting.keys()).any(|n| {
            self.locks.get(n).is_some_and(|l| !l.queue.is_empty())
                || self.upgrades.get(n).is_some_and(|u| u.session != requester)
        });
        if !blocks_someone {
            return None;
        }
        let mut scanned = BTreeMap::new();
        let first = blockers(
            lock,
            lock.queue.len(),
            mode,
            scanned.entry(name).or_default(),
            self.upgrader(name),
        );
        self.search(requester, name, first, scanned)
    }

    /// If `requester`, a shared holder of `name`, waiting to upgrade it
    /// would close a wait-for cycle, returns it, starting with the
    /// requester's new edge. An upgrade waits for every other holder.
    pub(super) fn find_upgrade_cycle(
        &self,
        requester: SessionId,
        name: &LockName,
    ) -> Option<Vec<WaitEdge>> {
        let lock = self.locks.get(name)?;
        let first = others(lock, requester);
        self.search(requester, name, first, BTreeMap::new())
    }

    /// If `holder`'s shared grant on `name` becoming exclusive now (an
    /// upgrade granted at once) would close a wait-for cycle, returns it,
    /// starting with the holder's own edge. Shared requests queued on
    /// `name` that did not need `holder` (they wait for something else: an
    /// atomic request's other names) would then: a cycle exists if
    /// `holder` already reaches one of them. Free when `holder` waits for
    /// nothing, the common case.
    pub(super) fn find_mode_change_cycle(
        &self,
        holder: SessionId,
        name: &LockName,
    ) -> Option<Vec<WaitEdge>> {
        let s = self.sessions.get(&holder)?;
        let waits = !s.waiting.is_empty() || self.upgrades.values().any(|u| u.session == holder);
        if !waits {
            return None;
        }
        let lock = self.locks.get(name)?;
        let mut tried = BTreeSet::new();
        for w in lock.queue.iter().filter(|w| w.session != holder) {
            if !tried.insert(w.session) {
                continue;
            }
            if let Some(mut cycle) = self.search(w.session, name, vec![holder], BTreeMap::new()) {
                let at = cycle.iter().position(|e| e.session == holder).unwrap_or(0);
                cycle.rotate_left(at);
                return Some(cycle);
            }
        }
        None
    }

    /// The session waiting to upgrade `name`, if any: everyone queued for
    /// `name` waits for it too.
    fn upgrader(&self, name: &LockName) -> Option<SessionId> {
        self.upgrades.get(name).map(|u| u.session)
    }

    /// The names `session` (holding `held`) waits to upgrade.
    fn upgrades_by<'a>(
        &'a self,
        session: SessionId,
        held: impl Iterator<Item = &'a LockName> + 'a,
    ) -> impl Iterator<Item = &'a LockName> + 'a {
        held.filter(move |n| self.upgrades.get(*n).is_some_and(|u| u.session == session))
    }

    /// Any cycle in the whole wait-for graph (for the invariant checker,
    /// which runs on every snapshot restore).
    ///
    /// One depth-first search over all sessions, linear in the number of
    /// waits and holders (a [`search`](Self::search) per waiter would be
    /// quadratic in a queue's length). It walks a thinned graph with the
    /// same reachability: a waiter's edges to everyone queued ahead become
    /// one edge to the waiter directly ahead, who reaches the rest, and its
    /// edges to holders shrink to those the waiters ahead did not already
    /// need. Every thinned edge is a real one, so a cycle found is real, and
    /// every real edge is a thinned path, so none is missed.
    pub(super) fn wait_cycle(&self) -> Option<Vec<WaitEdge>> {
        let needs: BTreeMap<&LockName, Vec<Vec<SessionId>>> = self
            .locks
            .iter()
            .filter(|(_, l)| !l.queue.is_empty())
            .map(|(n, l)| (n, newly_needed_holders(l)))
            .collect();
        let edges = |s: SessionId| -> Vec<(SessionId, &LockName)> {
            let mut out = Vec::new();
            let Some(session) = self.sessions.get(&s) else {
                return out;
            };
            for (n, wait) in &session.waiting {
                let (Some(l), Some(needs)) = (self.locks.get(n), needs.get(n)) else {
                    continue;
                };
                let Some(pos) = l.position(wait.index) else {
                    continue;
                };
                if pos > 0 {
                    out.push((l.queue[pos - 1].session, n));
                }
                out.extend(needs[pos].iter().map(|&h| (h, n)));
                out.extend(self.upgrader(n).map(|u| (u, n)));
            }
            for n in self.upgrades_by(s, session.held.keys()) {
                if let Some(l) = self.locks.get(n) {
                    out.extend(others(l, s).into_iter().map(|h| (h, n)));
                }
            }
            out
        };
        // false: on the current path; true: finished, on no cycle.
        let mut done: BTreeMap<SessionId, bool> = BTreeMap::new();
        // Only a waiting session can be on a cycle; idle ones cost nothing.
        let waiting = self
            .locks
            .values()
            .flat_map(|l| l.queue.iter().map(|w| w.session))
            .chain(self.upgrades.values().map(|u| u.session));
        for root in waiting {
            if done.contains_key(&root) {
                continue;
            }
            done.insert(root, false);
            let mut path = vec![(root, edges(root), 0usize)];
            while let Some(top) = path.last_mut() {
                let Some(&(b, _)) = top.1.get(top.2) else {
                    done.insert(top.0, true);
                    path.pop();
                    continue;
                };
                top.2 += 1;
                match done.get(&b) {
                    Some(true) => {}
                    Some(false) => {
                        // `b` is on the path: from it to here, and back.
                        let from = path.iter().position(|(p, _, _)| *p == b).unwrap_or(0);
                        let cycle = path[from..]
                            .iter()
                            .map(|(p, out, next)| {
                                let (blocker, name) = out[next - 1];
                                WaitEdge {
                                    session: *p,
                                    name: name.clone(),
                                    blocker,
                                }
                            })
                            .collect();
                        return Some(cycle);
                    }
                    None => {
                        done.insert(b, false);
                        path.push((b, edges(b), 0));
                    }
                }
            }
        }
        None
    }

    /// Depth-first search from `first`, the blockers of `requester`'s new
    /// wait on `name`, back to `requester`.
    fn search<'a>(
        &'a self,
        requester: SessionId,
        name: &'a LockName,
        first: Vec<SessionId>,
        mut scanned: BTreeMap<&'a LockName, Scanned>,
    ) -> Option<Vec<WaitEdge>> {
        let mut visited: BTreeSet<SessionId> = BTreeSet::new();
        // How each visited session was reached: (waiter, name it waits for).
        let mut parent: BTreeMap<SessionId, (SessionId, &LockName)> = BTreeMap::new();
        let mut stack: Vec<SessionId> = Vec::new();
        let mut found: Option<(SessionId, &LockName)> = None;

        visited.insert(requester);
        for b in first {
            if b == requester {
                found = Some((requester, name));
                break;
            }
            if visited.insert(b) {
                parent.insert(b, (requester, name));
                stack.push(b);
            }
        }

        while found.is_none() {
            let Some(s) = stack.pop() else { break };
            let Some(session) = self.sessions.get(&s) else {
                continue;
            };
            let queued = session.waiting.iter().filter_map(|(n, wait)| {
                let l = self.locks.get(n)?;
                let pos = l.position(wait.index)?;
                Some((n, l, Some(pos)))
            });
            let upgrading = self
                .upgrades_by(s, session.held.keys())
                .filter_map(|n| Some((n, self.locks.get(n)?, None)));
            for (n, l, pos) in queued.chain(upgrading) {
                let next = match pos {
                    Some(pos) => {
                        let m = l.queue[pos].mode;
                        blockers(l, pos, m, scanned.entry(n).or_default(), self.upgrader(n))
                    }
                    None => others(l, s),
                };
                for b in next {
                    if b == requester {
                        found = Some((s, n));
                        break;
                    }
                    if visited.insert(b) {
                        parent.insert(b, (s, n));
                        stack.push(b);
                    }
                }
                if found.is_some() {
                    break;
                }
            }
        }

        // Walk back from the edge that reached the requester.
        let (mut waiter, mut on) = found?;
        let mut blocker = requester;
        let mut cycle = Vec::new();
        loop {
            cycle.push(WaitEdge {
                session: waiter,
                name: on.clone(),
                blocker,
            });
            if waiter == requester {
                break;
            }
            blocker = waiter;
            (waiter, on) = *parent.get(&waiter)?;
        }
        cycle.reverse();
        Some(cycle)
    }
}

/// For each waiter in `lock`'s queue, the holders it cannot be granted
/// without (as in [`blockers`]) that no waiter ahead of it needed already.
/// Linear in the queue plus the holders (sorted once, for semaphores).
fn newly_needed_holders(lock: &Lock) -> Vec<Vec<SessionId>> {
    let mut out = vec![Vec::new(); lock.queue.len()];
    match lock.capacity {
        None => {
            // A shared prefix of the queue needs the exclusive holders; from
            // the first exclusive waiter on, every holder.
            let mut exclusive_ahead = false;
            for (pos, w) in lock.queue.iter().enumerate() {
                let exclusive = exclusive_ahead || w.mode == Mode::Exclusive;
                if pos == 0 || exclusive != exclusive_ahead {
                    out[pos] = lock
                        .holders
                        .values()
                        .filter(|h| {
                            let needed = exclusive || h.mode == Mode::Exclusive;
                            let before = pos > 0 && h.mode == Mode::Exclusive;
                            needed && !before
                        })
                        .map(|h| h.session)
                        .collect();
                }
                exclusive_ahead = exclusive;
            }
        }
        Some(capacity) => {
            // Heaviest first, so the holders a waiter needs (weight above
            // `capacity - heaviest weight so far`) are a growing prefix.
            let mut by_weight: Vec<(u32, SessionId)> = lock
                .holders
                .values()
                .map(|h| (h.mode.weight(), h.session))
                .collect();
            by_weight.sort_by_key(|&(w, s)| (std::cmp::Reverse(w), s));
            let (mut heaviest, mut taken) = (0, 0);
            for (pos, w) in lock.queue.iter().enumerate() {
                heaviest = heaviest.max(w.mode.weight());
                let room = capacity.saturating_sub(heaviest);
                let needed = by_weight.partition_point(|&(w, _)| w > room);
                if needed > taken {
                    out[pos] = by_weight[taken..needed].iter().map(|&(_, s)| s).collect();
                    taken = needed;
                }
            }
        }
    }
    out
}

/// The holders of `lock` other than `session`: whom an upgrade by
/// `session` waits for.
fn others(lock: &Lock, session: SessionId) -> Vec<SessionId> {
    lock.holders
        .values()
        .map(|h| h.session)
        .filter(|&h| h != session)
        .collect()
}

/// The sessions a waiter at `pos` in `lock`'s queue (or a new one, with
/// `pos == queue.len()`) cannot be granted without, minus what this search
/// already pushed for the same name; with the session waiting to upgrade
/// the lock (`upgrader`), which goes ahead of everyone queued.
fn blockers(
    lock: &Lock,
    pos: usize,
    mode: Mode,
    scanned: &mut Scanned,
    upgrader: Option<SessionId>,
) -> Vec<SessionId> {
    let mut out: Vec<SessionId> = upgrader.into_iter().collect();
    let start = scanned.prefix.min(pos);
    let ahead = lock.queue.range(start..pos);
    match lock.capacity {
        None => {
            let mut exclusive = mode == Mode::Exclusive;
            for w in ahead {
                exclusive |= w.mode == Mode::Exclusive;
                out.push(w.session);
            }
            if exclusive && !scanned.all_holders {
                out.extend(lock.holders.values().map(|h| h.session));
                scanned.all_holders = true;
            } else if !scanned.all_holders && !scanned.exclusive_holders {
                out.extend(
                    lock.holders
                        .values()
                        .filter(|h| h.mode == Mode::Exclusive)
                        .map(|h| h.session),
                );
                scanned.exclusive_holders = true;
            }
        }
        Some(capacity) => {
            let mut weight = mode.weight();
            for w in ahead {
                weight = weight.max(w.mode.weight());
                out.push(w.session);
            }
            if weight > scanned.weight {
                let room = capacity - weight;
                out.extend(
                    lock.holders
                        .values()
                        .filter(|h| h.mode.weight() > room)
                        .map(|h| h.session),
                );
                scanned.weight = weight;
            }
        }
    }
    scanned.prefix = scanned.prefix.max(pos);
    out
}
