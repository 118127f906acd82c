//! The oracles the driver checks every tick on the running nodes
//! (`Watch`): what they applied, what their disks hold after a crash, and
//! the answers the probers, ghosts and dead processes were given.

use std::collections::BTreeMap;
use std::rc::Rc;

use raftlock_node::node::Node;
use raftlock_node::raft::log_store::MemDisk;
use raftlock_node::raft::WatchReceiver as _;
use raftlock_node::state::SessionId;

use super::{
    believers, fnv, note, CatchUp, Ghost, Shared, BELIEF_NAMES, CANCEL_IN_FLIGHT, CATCH_UP_BOUND,
    FNV_START,
};
use crate::belief::{self, Held};
use crate::oracle;

/// Oracles checked every tick on the running nodes.
#[derive(Default)]
pub(super) struct Watch {
    committed: oracle::Committed,
    replicas: oracle::Replicas,
    acknowledged: oracle::Acknowledged,
    exactly_once: oracle::ExactlyOnce,
    snapshot_files: oracle::SnapshotFiles,
    /// Per node: the snapshot files its disk had written when last looked
    /// at.
    files_seen: BTreeMap<u64, u64>,
    /// Per node: the disk's crashes already judged by `acknowledged`.
    crashes: BTreeMap<u64, u64>,
    pub(super) fences: oracle::Fences,
    ended: oracle::Ended,
    cores: oracle::Cores,
    /// The leader seen last (node id).
    pub(super) leader: Option<u64>,
    /// Per node and incarnation: applied entries already checked.
    checked: BTreeMap<(u64, u64), u64>,
    /// The last (term, leader) each node reported, to trace changes.
    seen: BTreeMap<u64, (u64, Option<u64>)>,
    /// The nodes seen to have themselves among the voters of the
    /// membership they use (in any process).
    pub(super) knew_voter: std::collections::BTreeSet<u64>,
    /// Per node: since when (ms) it has led in its current term, and that
    /// term (the ghost check needs a leader that did not change).
    terms_since: BTreeMap<u64, (u64, u64)>,
    /// The last tick (ms) at which no node led with its leases counting
    /// (no leader, or a leader that lost touch with its quorum): the
    /// liveness checks of ghosts and dead processes judge only what
    /// happened after (the leader must have been able to write).
    unsteady_at: u64,
}

impl Watch {
    /// From the liveness probe's grant on: every member that runs applies,
    /// within [`CATCH_UP_BOUND`], what the leader had committed at the
    /// grant (`applied`: each running node's last applied index).
    fn check_catch_up(
        &mut self,
        record: &Shared,
        applied: &BTreeMap<u64, u64>,
        leader_commit: Option<u64>,
        now: u64,
    ) -> Result<(), String> {
        let mut r = record.borrow_mut();
        if r.probe_granted.is_none() {
            return Ok(());
        }
        let CatchUp { target, by, done } = match r.catch_up {
            Some(c) => c,
            None => {
                let Some(target) = leader_commit else {
                    return Ok(());
                };
                let c = CatchUp {
                    target,
                    by: now + CATCH_UP_BOUND.as_millis() as u64,
                    done: false,
                };
                r.catch_up = Some(c);
                c
            }
        };
        if done {
            return Ok(());
        }
        let behind: Vec<(u64, u64)> = r
            .members
            .iter()
            .filter_map(|id| applied.get(id).map(|a| (*id, *a)))
            .filter(|(_, a)| *a < target)
            .collect();
        if behind.is_empty() {
            r.catch_up = Some(CatchUp {
                target,
                by,
                done: true,
            });
            drop(r);
            note(
                record,
                format!("every running member has applied index {target} (the leader's commit at the probe's grant)"),
            );
            return Ok(());
        }
        if now > by {
            return Err(format!(
                "liveness: members (node, applied) {behind:?} had not applied index {target}, the \
                 leader's commit at the liveness probe's grant, {CATCH_UP_BOUND:?} later"
            ));
        }
        Ok(())
    }

    /// Judges the ghost waiters gone 3 s ago or more: none of their
    /// sessions (told apart by their ttl) may hold the name they waited
    /// for on the node that leads, if it led in the same term from before
    /// the ghost's `Lock` was sent (the wait was queued on it, and so was
    /// the guard that closes its session when the call goes away) and
    /// steadily since the `Lock` was sent (a leader that loses its quorum
    /// in its term ends the parked call UNAVAILABLE, and its guard cannot
    /// write the close). A wait queued by an earlier leader
    /// had its guard on that leader: a caller gone while no node held its
    /// call leaves its session to its ttl (seed 711267: the ghost's `Lock`
    /// was queued on node 2, which left the cluster while the call hung).
    ///
    /// A `Lock` sent to a follower is forwarded to the leader over the
    /// follower's connection to it. If the way from the follower to the
    /// leader was cut while the call was in flight (or while its cancel
    /// was), the cancel was lost: turmoil never sends a dropped segment
    /// again, and every later one waits behind the gap, so the leader
    /// learns that the call is gone only when its HTTP/2 keep-alive gives
    /// the connection up. A grant made before then stands, as for a caller
    /// whose host vanished: the session (no grace) keeps the name for its
    /// ttl. Such a ghost is not judged (seed 3600294; the `Lock` rpc's
    /// comment in locks.proto says so; that the keep-alive withdraws a wait
    /// not granted yet is `node/tests/forwarded_wait.rs`).
    fn judge_ghosts(&mut self, record: &Shared, now: u64) -> Result<(), String> {
        let due: Vec<Ghost> = {
            let mut r = record.borrow_mut();
            let (due, later) = std::mem::take(&mut r.ghosts)
                .into_iter()
                .partition(|g| now * 1_000 >= g.gone + 3_000_000);
            r.ghosts = later;
            due
        };
        if due.is_empty() {
            return Ok(());
        }
        let Some(leader) = self.leader else {
            return Ok(());
        };
        let node = record.borrow().nodes.get(&leader).map(|(n, _)| n.clone());
        let Some(node) = node else {
            return Ok(());
        };
        for Ghost {
            name,
            via,
            sent,
            gone,
        } in due
        {
            let steady = self
                .terms_since
                .get(&leader)
                .is_some_and(|(since, _)| since * 1_000 <= sent)
                && self.unsteady_at * 1_000 < sent;
            // The cancel goes from `via` to the leader: lost if that way
            // was cut when it was sent, or while it was on its way (a cut
            // drops what is in flight or held on the link).
            let cut = via != leader
                && record.borrow().was_cut(
                    via,
                    leader,
                    sent / 1_000,
                    gone / 1_000 + CANCEL_IN_FLIGHT.as_millis() as u64,
                );
            if !steady || cut {
                continue;
            }
            let kept = node.shared.read(|a| {
                let name = raftlock_node::state::LockName::new(name.as_str()).ok()?;
                let info = a.table.describe(&name)?;
                info.holders.iter().find_map(|h| {
                    a.table
                        .session(h.session)
                        .filter(|s| s.ttl_ms == believers::GHOST_TTL_MS)
                        .map(|_| h.session.0)
                })
            });
            if let Some(session) = kept {
                return Err(format!(
                    "ghost: a waiting Lock on {name:?} whose caller went away at {gone} us was \
                     granted and its session {session} still holds it 3 s later on leader node \
                     {leader} (the same term since its Lock was sent at {sent} us)"
                ));
            }
        }
        Ok(())
    }

    /// Judges the sessions whose process died (every stream that renewed
    /// them ended, nothing closed them) 2 s past their grace: none may be
    /// open on the node that leads, if it led in the same term since
    /// before the death (a new leader counts only its ttl).
    fn judge_dead(&mut self, record: &Shared, now: u64) -> Result<(), String> {
        let due: Vec<(u64, u64, u64)> = {
            let mut r = record.borrow_mut();
            let (due, later) = std::mem::take(&mut r.dead)
                .into_iter()
                .partition(|(_, gone, grace)| now * 1_000 >= gone + (grace + 2_000) * 1_000);
            r.dead = later;
            due
        };
        let Some(leader) = self.leader else {
            return Ok(());
        };
        let node = record.borrow().nodes.get(&leader).map(|(n, _)| n.clone());
        let Some(node) = node else {
            return Ok(());
        };
        for (session, gone, grace) in due {
            let steady = self
                .terms_since
                .get(&leader)
                .is_some_and(|(since, _)| since * 1_000 <= gone)
                && self.unsteady_at * 1_000 < gone;
            if steady
                && node
                    .shared
                    .read(|a| a.table.session(SessionId(session)).is_some())
            {
                return Err(format!(
                    "process-bound session {session}: its last stream ended at {gone} us, its \
                     grace is {grace} ms, and leader node {leader} (same term throughout) still \
                     has it open at {} ms",
                    now
                ));
            }
        }
        Ok(())
    }

    /// Every snapshot file written since the last look agrees with the
    /// other files at its index (`oracle::SnapshotFiles`). A file the
    /// driver damaged fails its checksum and is not looked at.
    fn check_snapshot_files(
        &mut self,
        record: &Shared,
        disks: &BTreeMap<u64, MemDisk>,
    ) -> Result<(), String> {
        for (id, disk) in disks {
            let written = disk.snapshot_files_written();
            if self.files_seen.insert(*id, written).unwrap_or(0) == written
                || record.borrow().damaged.contains_key(id)
            {
                continue;
            }
            let Some(file) = disk.snapshot_file() else {
                continue;
            };
            if let Some(index) = raftlock_node::apply::state_machine::snapshot_file_index(&file) {
                self.snapshot_files
                    .observe(*id, index, fnv(&file, FNV_START))?;
            }
        }
        Ok(())
    }

    /// Every disk that crashed since the last call still holds what its
    /// node acknowledged (`oracle::Acknowledged`). A disk whose snapshot
    /// file the crash damaged is left out: that node must not start, and
    /// is replaced.
    pub(super) fn judge_crashes(
        &mut self,
        record: &Shared,
        disks: &BTreeMap<u64, MemDisk>,
    ) -> Result<(), String> {
        for (id, disk) in disks {
            let crashes = disk.crashes();
            if self.crashes.insert(*id, crashes).unwrap_or(0) == crashes
                || record.borrow().damaged.contains_key(id)
            {
                continue;
            }
            let snapshot = disk
                .snapshot_file()
                .and_then(|f| raftlock_node::apply::state_machine::snapshot_file_index(&f))
                .unwrap_or(0);
            let covered = snapshot.max(disk.purged_index());
            let judged = self.acknowledged.check_crash(
                *id,
                disk.vote().as_ref(),
                |i| disk.log_id(i),
                covered,
            );
            // A log the driver damaged at rest may have forgotten what it
            // acknowledged: then the node must refuse to start.
            let damage = record.borrow_mut().log_damage.remove(id);
            match (damage, judged) {
                (Some(how), Err(forgot)) => {
                    note(record, format!("node {id}'s damaged log forgot: {forgot}"));
                    record
                        .borrow_mut()
                        .lost_log
                        .insert(*id, format!("{how} ({forgot})"));
                }
                (_, judged) => judged?,
            }
        }
        Ok(())
    }

    /// Every committed index not looked at yet, on the disk of a node that
    /// has applied it, against the commands proposed so far
    /// (`oracle::ExactlyOnce`).
    fn check_exactly_once(
        &mut self,
        disks: &BTreeMap<u64, MemDisk>,
        applied: &BTreeMap<u64, u64>,
    ) -> Result<(), String> {
        self.exactly_once.proposed(raftlock_node::proposals::take());
        let top = applied.values().copied().max().unwrap_or(0);
        for index in self.exactly_once.next()..=top {
            let entry = applied
                .iter()
                .filter(|(_, a)| **a >= index)
                .find_map(|(id, _)| disks[id].log_entry(index));
            self.exactly_once.committed(index, entry.as_deref())?;
        }
        Ok(())
    }

    /// Judges the probers' answers not judged yet.
    pub(super) fn judge_answers(&mut self, record: &Shared) -> Result<(), String> {
        let (renewals, servings) = {
            let mut r = record.borrow_mut();
            (
                std::mem::take(&mut r.renewals),
                std::mem::take(&mut r.servings),
            )
        };
        renewals.iter().try_for_each(|r| self.ended.check(r))?;
        servings.iter().try_for_each(|s| self.cores.check(s))
    }

    /// One tick's judging: the running nodes (`tick`), then the probers'
    /// answers, the ghosts, the dead processes, and a violation a host
    /// found. Returns what `tick` does.
    pub(super) fn judge(
        &mut self,
        record: &Shared,
        disks: &BTreeMap<u64, MemDisk>,
        now: u64,
    ) -> Result<Vec<u64>, String> {
        let ended_on_leader = self.tick(record, disks, now)?;
        // The probers' answers so far, against what the nodes had applied
        // (an answer is judged by its ask's send time, and everything the
        // driver saw up to then is known by now).
        self.judge_answers(record)?;
        self.judge_ghosts(record, now)?;
        self.judge_dead(record, now)?;
        if let Some(v) = record.borrow_mut().violation.take() {
            return Err(v);
        }
        Ok(ended_on_leader)
    }

    /// Checks the running nodes; returns the abandoned sessions whose end
    /// the leader applied this tick (a moment worth crashing it at).
    fn tick(
        &mut self,
        record: &Shared,
        disks: &BTreeMap<u64, MemDisk>,
        now: u64,
    ) -> Result<Vec<u64>, String> {
        self.check_snapshot_files(record, disks)?;
        let mut ended_on_leader = Vec::new();
        let mut counting = false;
        let abandoned: Vec<u64> = record
            .borrow()
            .abandoned
            .keys()
            .copied()
            .filter(|s| !self.ended.has_ended(*s))
            .collect();
        let nodes: Vec<(u64, Rc<Node>, u64)> = record
            .borrow()
            .nodes
            .iter()
            .map(|(id, (n, inc))| (*id, n.clone(), *inc))
            .collect();
        let mut applied: BTreeMap<u64, u64> = BTreeMap::new();
        let mut leader_commit = None;
        for (id, node, incarnation) in nodes {
            let m = node.raft.metrics().borrow_watched().clone();
            applied.insert(id, m.last_applied.map_or(0, |l| l.index));
            if m.state == openraft::ServerState::Leader {
                leader_commit = Some(m.cluster_committed.map_or(0, |c| c.index));
            }
            if self.seen.get(&id) != Some(&(m.current_term, m.current_leader)) {
                self.seen.insert(id, (m.current_term, m.current_leader));
                note(
                    record,
                    format!(
                        "node {id}: term {} leader {:?} ({:?})",
                        m.current_term, m.current_leader, m.state
                    ),
                );
            }
            if m.state == openraft::ServerState::Leader {
                // The leader's progress includes its own: what it counts
                // as on its own disk (its own appends count towards a
                // commit once synced).
                for (node, matched) in m.replication.iter().flatten() {
                    if let Some(matched) = matched {
                        self.acknowledged.observe(*node, &m.vote, matched);
                    }
                }
                self.leader = Some(id);
                record.borrow_mut().leader = Some(id);
                let leases = &node.shared.leases;
                counting |= leases.is_active() && !leases.is_paused();
                let same = self
                    .terms_since
                    .get(&id)
                    .is_some_and(|(_, term)| *term == m.current_term);
                if !same {
                    self.terms_since.insert(id, (now, m.current_term));
                }
            } else {
                self.terms_since.remove(&id);
            }
            if m.membership_config.voter_ids().any(|v| v == id) {
                self.knew_voter.insert(id);
            }
            if m.running_state.is_err() && self.cores.observe_dead(id, incarnation, now) {
                note(
                    record,
                    format!("node {id}'s Raft core has stopped (process {incarnation})"),
                );
            }
            // A session is named by the command index of its open (within
            // the log entry `open_entry` gives): a table that has applied
            // that entry and lacks the session has applied its end.
            let ended: Vec<u64> = node.shared.read(|a| {
                abandoned
                    .iter()
                    .copied()
                    .filter(|s| {
                        oracle::open_entry(*s, a.table.index_floor())
                            .is_some_and(|e| a.index() >= e)
                            && a.table.session(SessionId(*s)).is_none()
                    })
                    .collect()
            });
            for s in ended {
                if !self.ended.has_ended(s) {
                    note(record, format!("node {id} applied the end of session {s}"));
                    if m.state == openraft::ServerState::Leader {
                        ended_on_leader.push(s);
                    }
                }
                self.ended.observe(s, id, now);
            }
            let applied = m.last_applied.map_or(0, |l| l.index);
            let from = self.checked.get(&(id, incarnation)).map_or(1, |c| c + 1);
            for index in from..=applied {
                let Some(bytes) = disks[&id].log_entry(index) else {
                    continue;
                };
                self.committed.observe(id, index, fnv(&bytes, FNV_START))?;
            }
            self.checked
                .insert((id, incarnation), applied.max(from - 1));
            let fence = node.shared.read(|a| a.table.stats().last_fence);
            self.fences.observe(id, incarnation, fence)?;
            // The applied state, hashed once per process and index (its
            // Debug form: every field, the derived ones included, which a
            // snapshot must rebuild as applying the entries built them).
            let replicas = &self.replicas;
            let state = node.shared.read(|a| {
                let index = a.index();
                replicas.wants(id, incarnation, index).then(|| {
                    let state = format!("{:?}|{:?}|{:?}", a.last_applied, a.membership, a.table);
                    (index, fnv(state.as_bytes(), FNV_START))
                })
            });
            if let Some((index, hash)) = state {
                self.replicas.observe(id, incarnation, index, hash)?;
            }
            // Every grant of the belief names, first seen applied (so
            // committed) on any node.
            let held: Vec<(String, u64, u64, Held)> = node.shared.read(|a| {
                BELIEF_NAMES
                    .iter()
                    .filter_map(|n| raftlock_node::state::LockName::new(*n).ok())
                    .filter_map(|n| a.table.describe(&n))
                    .flat_map(|info| {
                        let name = info.name.as_str().to_string();
                        info.holders.into_iter().map(move |h| {
                            let held = match h.mode {
                                raftlock_node::state::Mode::Shared => Held::Shared,
                                _ => Held::Exclusive,
                            };
                            (name.clone(), h.fence.0, h.session.0, held)
                        })
                    })
                    .collect()
            });
            let mut r = record.borrow_mut();
            for (name, fence, session, held) in held {
                r.granted.entry((name, fence)).or_insert(belief::Granted {
                    session,
                    held,
                    seen: now * 1_000,
                });
            }
            drop(r);
        }
        if !counting {
            self.unsteady_at = now;
        }
        self.check_exactly_once(disks, &applied)?;
        self.check_catch_up(record, &applied, leader_commit, now)?;
        Ok(ended_on_leader)
    }
}
