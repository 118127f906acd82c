//! The faults the driver injects from the seed (partitions, held links,
//! latency spikes, crashes with rot at rest, faulty disks, replacements),
//! how each is undone, and the driver loop's steps that inject and undo
//! them, restart exited nodes and replace refused ones (on [`Faults`]).

use std::collections::BTreeMap;
use std::time::Duration;

use raftlock_node::raft::log_store::MemDisk;
use raftlock_node::raft::WatchReceiver as _;
use rand::rngs::StdRng;
use rand::RngExt as _;

use super::clients::keepalive_asker;
use super::host::start_host;
use super::operator::operator;
use super::{fnv, host, note, Cluster, Settings, Shared, BOUND_HOLDER, FNV_START, MAX_LATENCY};

/// A fault in force, to be undone at a time.
pub(super) enum Undo {
    Repair(String, String),
    Release(String, String),
    Bounce(u64),
    /// The disk of a node works again (syncs succeed for the process
    /// opened after its next crash or exit; a sync error is sticky).
    Heal(u64),
    /// Messages from the first host reach the second again.
    RepairOneway(String, String),
    /// A link's latency is back to normal.
    Calm(String, String),
}

/// The nodes out of action: crashed or exited (until restarted), and the
/// one whose disk is faulty (until healed).
#[derive(Default)]
pub(super) struct Down {
    pub(super) crashed: std::collections::BTreeSet<u64>,
    pub(super) sick_disks: std::collections::BTreeSet<u64>,
}

impl Down {
    pub(super) fn is_empty(&self) -> bool {
        self.crashed.is_empty() && self.sick_disks.is_empty()
    }
}

pub(super) fn apply_undo(
    sim: &mut turmoil::Sim<'_>,
    record: &Shared,
    disks: &BTreeMap<u64, MemDisk>,
    u: Undo,
    down: &mut Down,
    now: u64,
) {
    match u {
        Undo::Repair(a, b) => {
            note(record, format!("repair {a} <-> {b}"));
            sim.repair(a.as_str(), b.as_str());
            record.borrow_mut().mend(&a, &b, false, now);
        }
        Undo::Release(a, b) => {
            note(record, format!("release {a} <-> {b}"));
            sim.release(a.as_str(), b.as_str());
            // Release heals both ways, a cut too.
            record.borrow_mut().mend(&a, &b, false, now);
        }
        Undo::Bounce(id) => {
            if record.borrow().retired.contains(&id) {
                note(record, format!("node {id} was removed: not restarted"));
                down.crashed.remove(&id);
                return;
            }
            note(record, format!("restart node {id}"));
            sim.bounce(host(id));
            // A node that refuses its damaged snapshot file or log stays
            // down until the operator has replaced it.
            let r = record.borrow();
            if !r.damaged.contains_key(&id) && !r.lost_log.contains_key(&id) {
                down.crashed.remove(&id);
            }
        }
        Undo::RepairOneway(a, b) => {
            note(record, format!("repair {a} -> {b}"));
            sim.repair_oneway(a.as_str(), b.as_str());
            record.borrow_mut().mend(&a, &b, true, now);
        }
        Undo::Calm(a, b) => {
            note(record, format!("calm {a} <-> {b}"));
            sim.set_link_max_message_latency(a.as_str(), b.as_str(), MAX_LATENCY);
        }
        Undo::Heal(id) => {
            note(record, format!("node {id}'s disk works again"));
            disks[&id].heal();
            disks[&id].set_sync_latency(Duration::ZERO);
            down.sick_disks.remove(&id);
        }
    }
}

/// Crashes node `id` (keeping a random prefix of its disk's unsynced
/// writes) and restarts it after `after` ms.
#[allow(clippy::too_many_arguments)]
pub(super) fn crash(
    sim: &mut turmoil::Sim<'_>,
    rng: &mut StdRng,
    ops: &mut StdRng,
    record: &Shared,
    disk: &MemDisk,
    id: u64,
    after: u64,
    undo: &mut Vec<(u64, Undo)>,
    down: &mut Down,
    now: u64,
) {
    // Rot at rest is a minority fault only while the others can outvote
    // this node without it (judged before it goes).
    let rot_allowed = others_outvote(record, id);
    let pending = disk.pending_writes();
    let keep = rng.random_range(0..=pending);
    note(
        record,
        format!(
            "crash node {id} (keeps {keep} of {pending} unsynced writes), restart in {after} ms"
        ),
    );
    record.borrow_mut().nodes.remove(&id);
    sim.crash(host(id));
    disk.crash(keep);
    // While a node is down for long, its snapshot file may rot: torn (the
    // disk lost its tail) or one bit flipped. One bit, as rot at rest
    // usually is: such a file often still decodes (a bit of a number, or
    // of an ASCII name that stays ASCII), and only the checksum refuses it.
    let mut rotted = false;
    if after >= 1_000 && ops.random_bool(0.3) && rot_allowed {
        if let Some(len) = disk.snapshot_file().map(|f| f.len()) {
            rotted = true;
            let how = if ops.random_bool(0.5) {
                let keep = ops.random_range(0..len);
                disk.tear_snapshot_file(keep);
                format!("torn to {keep} of {len} bytes")
            } else {
                let at = ops.random_range(0..len);
                let mask = 1u8 << ops.random_range(0..8);
                disk.corrupt_snapshot_file(at, mask);
                format!("corrupted (byte {at} of {len} xor {mask:#04x})")
            };
            note(record, format!("node {id}'s snapshot file is {how}"));
            record.borrow_mut().damaged.insert(id, how);
        }
    }
    // Or its log rots: sled keeps only what precedes damage in its file,
    // so the newest durable writes are gone; the mark beside the log is
    // not (a file of its own).
    // (Decided from the draws already made, not new ones, so that the
    // streams of every later fault stay as they were.)
    let bytes = [now.to_le_bytes(), id.to_le_bytes(), after.to_le_bytes()].concat();
    let draw = fnv(&bytes, FNV_START);
    if after >= 1_000 && !rotted && rot_allowed && draw.is_multiple_of(5) {
        let count = 1 + (draw >> 8) as usize % 8;
        let lost = disk.lose_newest(count);
        if lost > 0 {
            let how = format!("lost its newest {lost} durable write(s) at rest");
            note(record, format!("node {id}'s log {how}"));
            let mut r = record.borrow_mut();
            r.log_damage.insert(id, how);
            r.log_damaged_ever.insert(id);
        }
    }
    down.crashed.insert(id);
    undo.push((now + after, Undo::Bounce(id)));
}

/// Whether the cluster can lose node `id`'s data and go on: every other
/// running member uses a membership it has applied (so committed) whose
/// voters other than `id` are a majority of it. Rot on a node the others
/// need for a majority (the only voter, before the first nodes joined:
/// seed 3302566) is the loss of the majority, which only the disaster
/// recovery of docs/operations/backup-and-recovery.md undoes, not a
/// minority fault the cluster must survive by itself.
pub(super) fn others_outvote(record: &Shared, id: u64) -> bool {
    let r = record.borrow();
    let mut others = r.nodes.iter().filter(|(other, _)| **other != id).peekable();
    if others.peek().is_none() {
        return false;
    }
    others.all(|(_, (node, _))| {
        let m = node.raft.metrics().borrow_watched().clone();
        let config = &m.membership_config;
        let applied = m.last_applied.map_or(0, |l| l.index);
        let voters: Vec<u64> = config.voter_ids().collect();
        let without = voters.iter().filter(|v| **v != id).count();
        config.log_id().as_ref().map_or(0, |l| l.index) <= applied && 2 * without > voters.len()
    })
}

/// One fault, drawn from `rng`: a partition between two nodes (both ways
/// or one way), a held link, a latency spike on a link, a crash (losing a random prefix of the disk's unsynced
/// writes; the leader half the time) with a restart after 0-300 ms or
/// after a long downtime, or a faulty disk for a while: every sync fails
/// with EIO (a dying disk), every write fails with ENOSPC (a full one), or
/// syncs are slow.
#[allow(clippy::too_many_arguments)]
pub(super) fn inject(
    sim: &mut turmoil::Sim<'_>,
    rng: &mut StdRng,
    ops: &mut StdRng,
    record: &Shared,
    disks: &BTreeMap<u64, MemDisk>,
    undo: &mut Vec<(u64, Undo)>,
    down: &mut Down,
    leader: Option<u64>,
    now: u64,
) {
    let members = record.borrow().members.clone();
    let pick = rng.random_range(0..members.len());
    let id = members[pick];
    // The member after `id` (in id order, cyclically).
    let next = members[(pick + 1) % members.len()];
    match rng.random_range(0..6) {
        4 => {
            let other = next;
            let (a, b) = (host(id), host(other));
            let to = rng.random_range(20..300);
            let lasts = rng.random_range(500..3_000);
            note(
                record,
                format!("latency spike {a} <-> {b}: up to {to} ms for {lasts} ms"),
            );
            sim.set_link_max_message_latency(a.as_str(), b.as_str(), Duration::from_millis(to));
            undo.push((now + lasts, Undo::Calm(a, b)));
        }
        5 => {
            let other = members[rng.random_range(0..members.len())];
            if other == id {
                return;
            }
            let (a, b) = (host(id), host(other));
            let lasts = rng.random_range(100..3_000);
            note(
                record,
                format!("partition {a} -> {b} (one way) for {lasts} ms"),
            );
            sim.partition_oneway(a.as_str(), b.as_str());
            record.borrow_mut().cut(&a, &b, false, now);
            undo.push((now + lasts, Undo::RepairOneway(a, b)));
        }
        0 => {
            let other = next;
            let (a, b) = (host(id), host(other));
            let lasts = rng.random_range(100..3_000);
            note(record, format!("partition {a} <-> {b} for {lasts} ms"));
            sim.partition(a.as_str(), b.as_str());
            record.borrow_mut().cut(&a, &b, true, now);
            undo.push((now + lasts, Undo::Repair(a, b)));
        }
        1 => {
            let other = next;
            let (a, b) = (host(id), host(other));
            let lasts = rng.random_range(50..1_500);
            note(record, format!("hold {a} <-> {b} for {lasts} ms"));
            sim.hold(a.as_str(), b.as_str());
            // A held link keeps what is sent, a cut one no longer.
            record.borrow_mut().mend(&a, &b, false, now);
            undo.push((now + lasts, Undo::Release(a, b)));
        }
        2 => {
            if !down.is_empty() {
                return;
            }
            let id = match leader {
                Some(l) if rng.random_bool(0.5) => l,
                _ => id,
            };
            let after = if rng.random_bool(0.7) {
                rng.random_range(0..=300)
            } else {
                rng.random_range(1_000..8_000)
            };
            crash(
                sim,
                rng,
                ops,
                record,
                &disks[&id],
                id,
                after,
                undo,
                down,
                now,
            );
        }
        _ => {
            if !down.is_empty() {
                return;
            }
            let disk = &disks[&id];
            let lasts = rng.random_range(200..3_000);
            if rng.random_bool(0.6) {
                // Which of the three: from the draws already made (their
                // sum modulo 3), not a new draw, so that adding a kind does
                // not shift the stream of every later fault.
                if (lasts + now).is_multiple_of(3) {
                    note(
                        record,
                        format!("node {id}'s syncs fail (EIO, a dying disk) for {lasts} ms"),
                    );
                    disk.fail_syncs();
                } else if (lasts + now) % 3 == 1 {
                    note(
                        record,
                        format!(
                            "node {id}'s disk is full, said at the sync (ENOSPC from fsync) for \
                             {lasts} ms"
                        ),
                    );
                    disk.fill_at_sync();
                } else {
                    note(
                        record,
                        format!(
                            "node {id}'s disk is full (writes fail with ENOSPC) for {lasts} ms"
                        ),
                    );
                    disk.fill();
                }
            } else {
                let latency = rng.random_range(2..30);
                note(
                    record,
                    format!("node {id}'s syncs take {latency} ms for {lasts} ms"),
                );
                disk.set_sync_latency(Duration::from_millis(latency));
            }
            down.sick_disks.insert(id);
            undo.push((now + lasts, Undo::Heal(id)));
        }
    }
}

/// Starts replacing member `old` with a fresh node under the next unused
/// id (its host and disk, its keep-alive asker, and the operator who
/// removes `old` and adds it); returns (old, new).
#[allow(clippy::too_many_arguments)]
pub(super) fn replace(
    sim: &mut turmoil::Sim<'_>,
    record: &Shared,
    disks: &mut BTreeMap<u64, MemDisk>,
    old: u64,
    next_id: &mut u64,
    stop_ms: u64,
    why: &str,
) -> (u64, u64) {
    let new = *next_id;
    *next_id += 1;
    note(
        record,
        format!("operator: replace node {old} with node {new} ({why})"),
    );
    let disk = MemDisk::new();
    disks.insert(new, disk.clone());
    start_host(sim, new, disk, record);
    sim.client(
        format!("asker{new}"),
        keepalive_asker(new, stop_ms, record.clone()),
    );
    sim.client(
        format!("operator{new}"),
        operator(old, new, stop_ms, record.clone()),
    );
    (old, new)
}

/// The driver's faults as a run goes: their random streams, those in force
/// (with when to undo them) and the nodes out of action, the replacement
/// under way, and how many were injected.
pub(super) struct Faults {
    /// Partitions, holds, latency spikes, crashes, faulty disks, and the
    /// supervisor's restarts.
    pub(super) faults_rng: StdRng,
    /// Membership changes, snapshot damage and full disks on every node.
    pub(super) ops_rng: StdRng,
    /// The bound holder's links held.
    pub(super) links_rng: StdRng,
    /// Until when (ms) the bound holder's links are held.
    pub(super) links_held_until: u64,
    pub(super) undo: Vec<(u64, Undo)>,
    pub(super) down: Down,
    /// Faults injected.
    pub(super) count: usize,
    /// Faults are off: the liveness probe runs.
    pub(super) probing: bool,
    /// The replacement under way: (old, new).
    pub(super) replacing: Option<(u64, u64)>,
    /// The id of the next fresh node.
    pub(super) next_id: u64,
    /// When (ms) the load and the faults stop.
    pub(super) stop_ms: u64,
}

/// The operator's replacements: of a node that refused its damaged
/// snapshot file (or log), one at a time; and those finished.
pub(super) fn replacements(cluster: &mut Cluster<'_>, f: &mut Faults) {
    let Cluster { sim, record, disks } = cluster;
    // A node that refused its damaged snapshot file is replaced.
    let refused: Vec<u64> = record.borrow_mut().refused.drain(..).collect();
    for old in refused {
        if record.borrow().retired.contains(&old) {
            continue;
        }
        if f.replacing.is_some() {
            // One replacement at a time: this one waits its turn.
            record.borrow_mut().refused.push(old);
            continue;
        }
        f.replacing = Some(replace(
            sim,
            record,
            disks,
            old,
            &mut f.next_id,
            f.stop_ms,
            "its data cannot be trusted",
        ));
    }
    let replaced: Vec<(u64, u64)> = record.borrow_mut().replaced.drain(..).collect();
    for (old, new) in replaced {
        note(record, format!("operator: node {new} replaced node {old}"));
        f.down.crashed.remove(&old);
        f.replacing = None;
    }
}

/// The supervisor, restarting the nodes whose process ended.
pub(super) fn supervise(cluster: &mut Cluster<'_>, f: &mut Faults, now: u64) {
    let Cluster { sim, record, disks } = cluster;
    // The supervisor: a node whose process ended is restarted after
    // 100-1000 ms (it may fail again at once if its disk still fails).
    let exited: Vec<u64> = record.borrow_mut().exited.drain(..).collect();
    for id in exited {
        if record.borrow().retired.contains(&id) {
            note(
                record,
                format!("node {id} exited; it was removed: not restarted"),
            );
            sim.crash(host(id));
            continue;
        }
        let disk = &disks[&id];
        let pending = disk.pending_writes();
        let keep = f.faults_rng.random_range(0..=pending);
        let after = f.faults_rng.random_range(100..=1_000);
        note(
            record,
            format!(
                "node {id} exited (keeps {keep} of {pending} unsynced writes); the supervisor \
                 restarts it in {after} ms"
            ),
        );
        sim.crash(host(id));
        disk.crash(keep);
        f.down.crashed.insert(id);
        f.undo.push((now + after, Undo::Bounce(id)));
    }
}

/// Half the time, crashes the leader at a moment worth it.
pub(super) fn crash_at_a_moment(
    settings: &Settings,
    cluster: &mut Cluster<'_>,
    f: &mut Faults,
    leader: Option<u64>,
    ended_on_leader: &[u64],
    now: u64,
) {
    let Cluster { sim, record, disks } = cluster;
    // A moment worth a crash: the leader has just applied the end of a
    // session a prober is about to ask it to renew.
    if settings.faults && !f.probing && !ended_on_leader.is_empty() && f.down.is_empty() {
        let member = |l: &u64| record.borrow().members.contains(l);
        if let Some(leader) = leader
            .filter(|_| f.faults_rng.random_bool(0.5))
            .filter(member)
        {
            f.count += 1;
            let after = f.faults_rng.random_range(0..=300);
            crash(
                sim,
                &mut f.faults_rng,
                &mut f.ops_rng,
                record,
                &disks[&leader],
                leader,
                after,
                &mut f.undo,
                &mut f.down,
                now,
            );
        }
    }
}

/// Undoes the faults that are due.
pub(super) fn undo_due(cluster: &mut Cluster<'_>, f: &mut Faults, now: u64) {
    let Cluster { sim, record, disks } = cluster;
    // Undo faults that are due.
    let mut i = 0;
    while i < f.undo.len() {
        if f.undo[i].0 <= now {
            let (_, u) = f.undo.remove(i);
            apply_undo(sim, record, disks, u, &mut f.down, now);
        } else {
            i += 1;
        }
    }
}

/// At the end of the load, faults off: every fault undone, the liveness
/// probe's phase begun (and a follower cut off for good, planted, with
/// `stranded_follower`).
pub(super) fn faults_off(
    settings: &Settings,
    cluster: &mut Cluster<'_>,
    f: &mut Faults,
    leader: Option<u64>,
    now: u64,
) {
    let Cluster { sim, record, disks } = cluster;
    if now >= f.stop_ms && !f.probing {
        // Faults off: heal everything, then the liveness probe.
        for (_, u) in f.undo.drain(..) {
            apply_undo(sim, record, disks, u, &mut f.down, now);
        }
        note(record, "faults off; the liveness probe starts".into());
        f.probing = true;
        if settings.stranded_follower {
            let stranded = {
                let r = record.borrow();
                r.members
                    .iter()
                    .rev()
                    .find(|id| Some(**id) != leader && r.nodes.contains_key(id))
                    .copied()
            };
            if let Some(f) = stranded {
                let members = record.borrow().members.clone();
                for other in members {
                    if other != f {
                        sim.partition(host(f).as_str(), host(other).as_str());
                        record.borrow_mut().cut(&host(f), &host(other), true, now);
                    }
                }
                note(
                    record,
                    format!("planted: node {f} is cut off from every node for good"),
                );
            }
        }
    }
}

/// Now and then, while the bound holder holds its name, its links to
/// every node held.
pub(super) fn hold_bound_links(
    settings: &Settings,
    cluster: &mut Cluster<'_>,
    f: &mut Faults,
    now: u64,
) {
    let Cluster { sim, record, .. } = cluster;
    // While the bound holder holds its name, its links to every node
    // are sometimes cut (held) for 11-14 s, past the ~10 s in which a
    // node's HTTP/2 pings give its connection up: the leader may then
    // end the session a grace later, long before its ttl.
    let bound_holding = record.borrow().bound_holding;
    if settings.faults
        && !f.probing
        && bound_holding
        && now >= f.links_held_until
        && now + 14_000 < f.stop_ms
        && f.links_rng.random_bool(0.005)
    {
        let lasts = f.links_rng.random_range(11_000..14_000);
        f.links_held_until = now + lasts;
        note(
            record,
            format!("hold {BOUND_HOLDER} <-> every node for {lasts} ms"),
        );
        for id in record.borrow().members.clone() {
            sim.hold(BOUND_HOLDER, host(id).as_str());
            f.undo
                .push((now + lasts, Undo::Release(BOUND_HOLDER.into(), host(id))));
        }
    }
}

/// About one tick in 500 while faults are on, one fault (`inject`).
pub(super) fn maybe_inject(
    settings: &Settings,
    cluster: &mut Cluster<'_>,
    f: &mut Faults,
    leader: Option<u64>,
    now: u64,
) {
    let Cluster { sim, record, disks } = cluster;
    if settings.faults && !f.probing && f.faults_rng.random_bool(0.002) {
        f.count += 1;
        inject(
            sim,
            &mut f.faults_rng,
            &mut f.ops_rng,
            record,
            disks,
            &mut f.undo,
            &mut f.down,
            leader,
            now,
        );
    }
}

/// Now and then, while no node is out of action, a planned replacement
/// or every node's disk full.
pub(super) fn replace_or_fill(
    settings: &Settings,
    cluster: &mut Cluster<'_>,
    f: &mut Faults,
    leader: Option<u64>,
    now: u64,
) {
    let Cluster { sim, record, disks } = cluster;
    // About once in 10 s: a member (the leader a third of the time)
    // replaced by a fresh node while it runs; about once in 20 s: every
    // node's disk full at once (the same workload fills every
    // replica).
    if settings.faults && !f.probing && f.down.is_empty() && f.replacing.is_none() {
        if f.ops_rng.random_bool(0.000_1) {
            f.count += 1;
            let members = record.borrow().members.clone();
            let old = match leader {
                Some(l) if f.ops_rng.random_bool(0.33) => l,
                _ => members[f.ops_rng.random_range(0..members.len())],
            };
            f.down.crashed.insert(old);
            f.replacing = Some(replace(
                sim,
                record,
                disks,
                old,
                &mut f.next_id,
                f.stop_ms,
                "a planned replacement",
            ));
        } else if f.ops_rng.random_bool(0.000_05) {
            f.count += 1;
            let lasts = f.ops_rng.random_range(200..1_500);
            note(
                record,
                format!("every node's disk is full (writes fail with ENOSPC) for {lasts} ms"),
            );
            for id in record.borrow().members.clone() {
                disks[&id].fill();
                f.down.sick_disks.insert(id);
                f.undo.push((now + lasts, Undo::Heal(id)));
            }
        }
    }
}
