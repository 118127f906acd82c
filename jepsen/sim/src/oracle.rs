//! What must hold in every run. Pure: each oracle takes observations
//! (simulated milliseconds, ids, hashes) and says what it found wrong.
//!
//! * on the workers' history: mutual exclusion of holders whose client
//!   held its lease valid (the harness's checkers, fence order and
//!   linearizability among them, are `raftlock-check`'s: see
//!   `crate::shared`);
//! * every tick, on the nodes: committed entries never change, replicas at
//!   one applied index have one state, a node's fence never goes back
//!   within one run of its process;
//! * on the probers' answers: a `KeepAlive` answered "renewed" only for a
//!   session whose end no node had applied when the ask was sent, and
//!   health answered SERVING only by a node whose Raft core ran when the
//!   ask was sent.

use std::collections::BTreeMap;

use raftlock_node::raft::{Batch, Entry, EntryPayload, LogId, Vote};
use raftlock_node::state::Command;

/// One grant a worker was given, as the worker saw it (times in simulated
/// milliseconds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The worker (one session at a time).
    pub worker: usize,
    /// The grant's fencing token.
    pub fence: u64,
    /// When the worker asked for the lock.
    pub invoked: u64,
    /// When the grant reached it.
    pub granted: u64,
    /// When it stopped using the lock (sent its release, or gave up).
    pub until: u64,
    /// The client held the session's lease valid at `until` (and so over
    /// the whole grant: a lease that ends does not come back). Only such
    /// grants are owed mutual exclusion; the others are what fences are
    /// for.
    pub valid: bool,
}

/// No two grants a valid lease covered overlap in time.
pub fn mutual_exclusion(grants: &[Grant]) -> Result<(), String> {
    let mut valid: Vec<&Grant> = grants.iter().filter(|g| g.valid).collect();
    valid.sort_by_key(|g| (g.granted, g.until));
    for pair in valid.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.granted < a.until {
            return Err(format!(
                "mutual exclusion: worker {} held fence {} over {}..{} ms while worker {} held \
                 fence {} from {} ms, both with a valid lease",
                a.worker, a.fence, a.granted, a.until, b.worker, b.fence, b.granted
            ));
        }
    }
    Ok(())
}

/// A committed entry never changes: the first entry seen committed at an
/// index is the only one any node may ever have committed there.
#[derive(Debug, Default)]
pub struct Committed {
    at: BTreeMap<u64, (u64, u64)>,
}

impl Committed {
    /// Node `node` has applied (so committed) an entry hashing to `hash` at
    /// `index`.
    pub fn observe(&mut self, node: u64, index: u64, hash: u64) -> Result<(), String> {
        match first_differing(&mut self.at, node, index, hash) {
            Some((first_node, first)) => Err(format!(
                "committed entry {index} changed: node {first_node} applied {first:016x}, node \
                 {node} applied {hash:016x}"
            )),
            None => Ok(()),
        }
    }
}

/// Exactly once at the log: no command is applied that nobody proposed,
/// and none is in the committed log more often than it was proposed. A
/// command is noted where it starts on its way to the log
/// (`raftlock_node::proposals`: a client's request as the API takes it, a
/// restore's parts, the leader's expiries), so the batcher, Raft, the
/// codec and the log store all lie between the two counts. A client's
/// retry is a proposal of its own (the table answers it from the
/// remembered reply), so a request retried twice may be in the log twice.
/// Every committed index is looked at once, on the disk of a node that
/// has applied it; one that no disk holds any more (purged everywhere
/// between two looks) is counted in `unseen`, not judged.
#[derive(Debug, Default)]
pub struct ExactlyOnce {
    /// Per command (its encoding): times proposed, times seen committed.
    counts: BTreeMap<Vec<u8>, (u64, u64)>,
    /// The next log index to look at.
    next: u64,
    /// Committed indexes no disk held when looked at.
    pub unseen: u64,
}

impl ExactlyOnce {
    /// Commands proposed since the last call.
    pub fn proposed(&mut self, commands: Vec<Command>) {
        for c in commands {
            self.counts
                .entry(raftlock_node::codec::to_vec(&c))
                .or_default()
                .0 += 1;
        }
    }

    /// The next committed index to look at.
    pub fn next(&self) -> u64 {
        self.next.max(1)
    }

    /// The committed entry at `index` (the next one), as a disk holds it
    /// (`None`: no disk holds it any more).
    pub fn committed(&mut self, index: u64, entry: Option<&[u8]>) -> Result<(), String> {
        self.next = index + 1;
        let Some(bytes) = entry else {
            self.unseen += 1;
            return Ok(());
        };
        let entry: Entry = raftlock_node::codec::decode(bytes).map_err(|e| {
            format!("exactly once: the committed entry {index} does not decode: {e}")
        })?;
        let EntryPayload::Normal(Batch(commands)) = entry.payload else {
            return Ok(());
        };
        for c in commands {
            let key = raftlock_node::codec::to_vec(&c);
            let (proposed, committed) = self.counts.entry(key).or_default();
            *committed += 1;
            if *committed > *proposed {
                let mut what = format!("{c:?}");
                what.truncate(300);
                return Err(format!(
                    "exactly once: committed entry {index} holds {what}, now {committed} time(s) \
                     in the log but proposed {proposed} time(s)"
                ));
            }
        }
        Ok(())
    }
}

/// Records `hash` as the first seen at `index` (by `node`) if none was;
/// gives the first (node, hash) seen there when it differs from `hash`.
fn first_differing(
    at: &mut BTreeMap<u64, (u64, u64)>,
    node: u64,
    index: u64,
    hash: u64,
) -> Option<(u64, u64)> {
    let &mut (first_node, first) = at.entry(index).or_insert((node, hash));
    (first != hash).then_some((first_node, first))
}

/// Snapshot files agree: any two snapshot files that cover the same log
/// index, on any nodes and in any processes, are byte-for-byte the same
/// (issue 46). A snapshot file is the applied state's meta (last log id,
/// membership) and table, encoded deterministically and checksummed, so a
/// node that built or installed a different file at an index (state only
/// one process has, an encoding that depends on the process, a snapshot
/// of a state the log never produced) differs from the others there.
#[derive(Debug, Default)]
pub struct SnapshotFiles {
    /// Per covered index: the first node seen with a file there, and the
    /// file's hash.
    at: BTreeMap<u64, (u64, u64)>,
}

impl SnapshotFiles {
    /// Node `node` has a snapshot file covering up to `index`, hashing to
    /// `hash`.
    pub fn observe(&mut self, node: u64, index: u64, hash: u64) -> Result<(), String> {
        match first_differing(&mut self.at, node, index, hash) {
            Some((first_node, first)) => Err(format!(
                "snapshot files: node {node}'s file at index {index} hashes to {hash:016x}, node \
                 {first_node}'s to {first:016x}"
            )),
            None => Ok(()),
        }
    }
}

/// A node never forgets what it acknowledged (issue 46): the entries it
/// acknowledged in an AppendEntries answer, and the vote it answered them
/// under, survive its crashes. Observed through the leader: its
/// replication progress for a follower (openraft's `matched`) moves only
/// on that follower's answers, so a leader with vote V reporting `matched`
/// L for node F means F answered that it holds every entry up to L, and
/// V, on disk.
///
/// Checked on the disk a crash left: its vote must not be below V; and if
/// it is V (no later leader, which might have replaced entries that were
/// never committed), the entry at L's index must be L, unless the node's
/// snapshot or purge point covers that index. Only the newest
/// acknowledgement per node is kept: a node whose vote is still V holds
/// all of V's entries up to L when it holds L (logs that agree at an
/// index agree before it).
#[derive(Debug, Default)]
pub struct Acknowledged {
    /// Per node: the newest leader vote it acknowledged entries under, and
    /// the last log id it acknowledged under that vote.
    acked: BTreeMap<u64, (Vote, LogId)>,
}

impl Acknowledged {
    /// A leader with vote `vote` counts `matched` as acknowledged by node
    /// `node`.
    pub fn observe(&mut self, node: u64, vote: &Vote, matched: &LogId) {
        let newer = match self.acked.get(&node) {
            None => true,
            Some((v, l)) => vote > v || (vote == v && matched > l),
        };
        if newer {
            self.acked.insert(node, (*vote, *matched));
        }
    }

    /// Node `node` crashed, leaving `vote` on its disk, `log_id_at(i)` the
    /// entry at index `i`, and its snapshot or purge point at `covered`.
    pub fn check_crash(
        &self,
        node: u64,
        vote: Option<&Vote>,
        log_id_at: impl Fn(u64) -> Option<LogId>,
        covered: u64,
    ) -> Result<(), String> {
        let Some((acked_vote, entry)) = self.acked.get(&node) else {
            return Ok(());
        };
        if !vote.is_some_and(|v| v >= acked_vote) {
            return Err(format!(
                "acknowledged: node {node} answered appends under vote {acked_vote}, and after a \
                 crash its disk has vote {vote:?}"
            ));
        }
        if vote != Some(acked_vote) || entry.index <= covered {
            return Ok(());
        }
        match log_id_at(entry.index) {
            Some(found) if found == *entry => Ok(()),
            found => Err(format!(
                "acknowledged: node {node} answered that it held {entry} (vote {acked_vote}), and \
                 after a crash its disk has {found:?} at index {} (snapshot or purge point {covered})",
                entry.index
            )),
        }
    }
}

/// Replicas agree: the applied state (the lock table with its derived
/// indexes, the membership, the last log id) at a log index is the same on
/// every node and in every process, whichever way it got there (entries
/// applied one by one, a snapshot installed from the leader, or a
/// snapshot file loaded at start-up and the log replayed after it): the
/// state machine is deterministic, and every node applies one chain of
/// committed entries. Within one process the applied index never goes
/// back (no entry applied twice). A node whose snapshot dropped part of
/// the table, that replayed or skipped an entry, or that applied an entry
/// no other node has, differs from the others at some index.
#[derive(Debug, Default)]
pub struct Replicas {
    /// Per index: the first node seen there and its state's hash.
    at: BTreeMap<u64, (u64, u64)>,
    /// Per (node, incarnation): the applied index last observed.
    last: BTreeMap<(u64, u64), u64>,
}

impl Replicas {
    /// True unless process `incarnation` of `node` was already observed at
    /// `index` (its state there is checked once).
    pub fn wants(&self, node: u64, incarnation: u64, index: u64) -> bool {
        self.last.get(&(node, incarnation)) != Some(&index)
    }

    /// Process `incarnation` of node `node` has applied up to `index`, and
    /// its applied state hashes to `hash`.
    pub fn observe(
        &mut self,
        node: u64,
        incarnation: u64,
        index: u64,
        hash: u64,
    ) -> Result<(), String> {
        if let Some(&before) = self.last.get(&(node, incarnation)) {
            if index < before {
                return Err(format!(
                    "replicas: node {node}'s applied index went back from {before} to {index} \
                     (process {incarnation})"
                ));
            }
        }
        self.last.insert((node, incarnation), index);
        match first_differing(&mut self.at, node, index, hash) {
            Some((first_node, first)) => Err(format!(
                "replicas: at applied index {index} node {node} (process {incarnation}) has state \
                 {hash:016x}, node {first_node} had {first:016x}"
            )),
            None => Ok(()),
        }
    }
}

/// A node's last issued fence never goes back while its process runs
/// (each restart is a new incarnation: it loads its snapshot and replays
/// its log after it), and
/// never passes the bound that stores compare fences within
/// (`MAX_FENCE`, 2^63 - 1).
#[derive(Debug)]
pub struct Fences {
    last: BTreeMap<(u64, u64), u64>,
    bound: u64,
}

impl Default for Fences {
    fn default() -> Self {
        Fences::with_bound(raftlock_node::state::limits::MAX_FENCE)
    }
}

impl Fences {
    /// Fences may not pass `bound`.
    pub fn with_bound(bound: u64) -> Self {
        Fences {
            last: BTreeMap::new(),
            bound,
        }
    }

    /// In incarnation `incarnation` of node `node`, the table's last fence
    /// is `fence`.
    pub fn observe(&mut self, node: u64, incarnation: u64, fence: u64) -> Result<(), String> {
        if fence > self.bound {
            return Err(format!(
                "node {node}'s last fence {fence} is beyond the bound {}",
                self.bound
            ));
        }
        let last = self.last.entry((node, incarnation)).or_insert(fence);
        if fence < *last {
            return Err(format!(
                "node {node}'s last fence went back from {last} to {fence} (incarnation \
                 {incarnation})"
            ));
        }
        *last = fence;
        Ok(())
    }

    /// The largest last fence seen on any node.
    pub fn highest(&self) -> u64 {
        self.last.values().copied().max().unwrap_or(0)
    }
}

/// How long a removed node may run on after its removal was answered
/// (simulated milliseconds; the bound `node/tests/removed_node.rs` gives).
pub const REMOVED_EXIT_MS: u64 = 15_000;

/// A removed node exits by itself: none of `removed_at` (node, when its
/// removal was answered) may still be `running` more than
/// [`REMOVED_EXIT_MS`] after. The first that is, by id, is the violation.
pub fn removed_nodes_exit(
    removed_at: &BTreeMap<u64, u64>,
    running: impl Fn(u64) -> bool,
    now: u64,
) -> Result<(), String> {
    match removed_at
        .iter()
        .find(|(id, at)| now > *at + REMOVED_EXIT_MS && running(**id))
    {
        Some((id, at)) => Err(format!(
            "removed node: node {id} still runs {} ms after its removal was answered at {at} ms",
            now - at
        )),
        None => Ok(()),
    }
}

/// A node whose log lost, at rest, what it had acknowledged (`lost`: how
/// the driver damaged it and what it forgot) must refuse to start; `Err`
/// if process `incarnation` of node `id` started all the same.
pub fn no_start_from_lost_log(id: u64, incarnation: u64, lost: Option<&str>) -> Result<(), String> {
    match lost {
        Some(how) => Err(format!(
            "damaged log: node {id} started (process {incarnation}) from a log that {how}; it \
             must refuse it"
        )),
        None => Ok(()),
    }
}

/// A refusal of a node's log as one that lost what it had made durable
/// (`refusal`: the start-up error) is right only on a disk the driver
/// damaged at rest (`damaged_ever`); `Err` after an ordinary crash.
pub fn log_refused_only_if_damaged(
    id: u64,
    damaged_ever: bool,
    refusal: &str,
) -> Result<(), String> {
    if damaged_ever {
        Ok(())
    } else {
        Err(format!(
            "damaged log: node {id} refused a log the driver never damaged (crashes only): \
             {refusal}"
        ))
    }
}

/// A node whose snapshot file the driver damaged (`damaged`: how) must
/// refuse to start; `Err` if process `incarnation` of node `id` started
/// all the same.
pub fn no_start_from_damaged(
    id: u64,
    incarnation: u64,
    damaged: Option<&str>,
) -> Result<(), String> {
    match damaged {
        Some(how) => Err(format!(
            "snapshot file: node {id} started (process {incarnation}) from a snapshot file the \
             driver had {how}; the checksum must refuse it"
        )),
        None => Ok(()),
    }
}

/// The log index of the entry that opened `session` (a session is named by
/// the command index of its open), on a table whose command indexes a
/// restore lifted by `index_floor` (0 before a restore). A table that has
/// not applied the restore yet has floor 0 and gets an index far beyond
/// its log. None for a session below the floor: its open is in the backup
/// cluster's log, not judged here (the simulator restores a backup of an
/// empty cluster, so no probed session is there).
pub fn open_entry(session: u64, index_floor: u64) -> Option<u64> {
    session
        .checked_sub(index_floor)
        .map(raftlock_node::raft::log_index_of)
}

/// A `KeepAlive` answered "renewed": the session, the node that answered,
/// and when the ask was sent (simulated milliseconds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Renewal {
    /// The session renewed.
    pub session: u64,
    /// The node that answered.
    pub node: u64,
    /// When the ask was sent.
    pub sent: u64,
    /// When the answer came.
    pub answered: u64,
}

/// Sessions whose end (expiry, close or revoke) some node had applied, and
/// the first time one was seen to have: once the end is committed, no
/// node may renew the session (a leader whose table lags what it
/// committed did, review finding 1).
#[derive(Debug, Default)]
pub struct Ended {
    at: BTreeMap<u64, (u64, u64)>,
}

impl Ended {
    /// Node `node` has applied the end of `session` (seen at `now`).
    pub fn observe(&mut self, session: u64, node: u64, now: u64) {
        self.at.entry(session).or_insert((now, node));
    }

    /// True once some node has applied the end of `session`.
    pub fn has_ended(&self, session: u64) -> bool {
        self.at.contains_key(&session)
    }

    /// Checks one "renewed" answer.
    pub fn check(&self, r: &Renewal) -> Result<(), String> {
        match self.at.get(&r.session) {
            Some(&(ended, by)) if ended <= r.sent => Err(format!(
                "keep-alive: node {} renewed session {} for an ask sent at {} ms (answered at {} \
                 ms), after node {by} had applied its end at {ended} ms",
                r.node, r.session, r.sent, r.answered
            )),
            _ => Ok(()),
        }
    }
}

/// A health check answered SERVING: the node, its incarnation when the
/// ask was sent and when the answer came, and the times.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Serving {
    /// The node that answered.
    pub node: u64,
    /// Its process (incarnation) when the ask was sent.
    pub incarnation_sent: u64,
    /// Its process when the answer came.
    pub incarnation_answered: u64,
    /// When the ask was sent.
    pub sent: u64,
}

/// No node answers SERVING while its Raft core has stopped (review finding
/// 2: a node whose disk filled kept a dead core and a green health check).
#[derive(Debug, Default)]
pub struct Cores {
    dead_since: BTreeMap<(u64, u64), u64>,
}

impl Cores {
    /// Node `node`, process `incarnation`, has a stopped core (seen at
    /// `now`); true the first time.
    pub fn observe_dead(&mut self, node: u64, incarnation: u64, now: u64) -> bool {
        let first = !self.dead_since.contains_key(&(node, incarnation));
        self.dead_since.entry((node, incarnation)).or_insert(now);
        first
    }

    /// Checks one SERVING answer: an answer from one process to an ask
    /// sent after that process's core was seen stopped is a lie.
    pub fn check(&self, s: &Serving) -> Result<(), String> {
        if s.incarnation_sent != s.incarnation_answered {
            return Ok(());
        }
        match self.dead_since.get(&(s.node, s.incarnation_sent)) {
            Some(&dead) if dead <= s.sent => Err(format!(
                "health: node {} (process {}) answered SERVING to an ask sent at {} ms; its Raft \
                 core had stopped at {dead} ms",
                s.node, s.incarnation_sent, s.sent
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(worker: usize, fence: u64, invoked: u64, granted: u64, until: u64) -> Grant {
        Grant {
            worker,
            fence,
            invoked,
            granted,
            until,
            valid: true,
        }
    }

    /// Two nodes at one index with different states, in any order of
    /// processes, are caught; the same state at the same index, or a node
    /// observed twice at an index, is not; a process whose applied index
    /// goes back is.
    #[test]
    fn replicas_that_differ_at_an_index_are_caught() {
        let mut r = Replicas::default();
        assert!(r.wants(1, 0, 5));
        r.observe(1, 0, 5, 0xaa).expect("first at 5");
        assert!(!r.wants(1, 0, 5), "checked once per process and index");
        r.observe(2, 0, 5, 0xaa).expect("the same state");
        r.observe(2, 0, 7, 0xbb).expect("first at 7");
        // A restarted node 1 (process 1), back at 5 from its snapshot and
        // log: the same state is fine, another is not.
        assert!(r.wants(1, 1, 5));
        r.observe(1, 1, 5, 0xaa)
            .expect("the same state after a restart");
        let err = r.observe(3, 0, 7, 0xcc).expect_err("diverged");
        assert!(
            err.contains("at applied index 7 node 3") && err.contains("node 2 had"),
            "{err}"
        );
        let err = r.observe(2, 0, 6, 0xdd).expect_err("went back");
        assert!(err.contains("went back from 7 to 6"), "{err}");
    }

    #[test]
    fn snapshot_files_that_differ_at_an_index_are_caught() {
        let mut files = SnapshotFiles::default();
        assert!(files.observe(1, 200, 0xaa).is_ok());
        assert!(files.observe(2, 200, 0xaa).is_ok());
        assert!(files.observe(2, 400, 0xbb).is_ok());
        let e = files.observe(3, 200, 0xab).unwrap_err();
        assert!(e.contains("index 200"), "{e}");
    }

    #[test]
    fn a_forgotten_acknowledgement_is_caught() {
        use raftlock_node::raft::log_id;
        let vote = Vote::new_committed(3, 1);
        let mut acks = Acknowledged::default();
        // Nothing acknowledged yet: any disk will do.
        assert!(acks.check_crash(2, None, |_| None, 0).is_ok());
        acks.observe(2, &vote, &log_id(3, 1, 10));
        acks.observe(2, &vote, &log_id(3, 1, 8)); // an older answer, kept behind
        let holds = |i| (i <= 10).then(|| log_id(3, 1, i));
        assert!(acks.check_crash(2, Some(&vote), holds, 0).is_ok());
        // The vote lost, the tail lost, the entry replaced under the same
        // vote: each is caught.
        let lost_vote = acks.check_crash(2, Some(&Vote::new_committed(2, 3)), holds, 0);
        assert!(lost_vote.unwrap_err().contains("vote"));
        let short = |i| (i <= 9).then(|| log_id(3, 1, i));
        let lost_tail = acks.check_crash(2, Some(&vote), short, 0);
        assert!(lost_tail.unwrap_err().contains("held"));
        let other = |i| Some(log_id(2, 3, i));
        assert!(acks.check_crash(2, Some(&vote), other, 0).is_err());
        // Covered by its snapshot, or a later leader's vote (which may
        // replace entries never committed): not this oracle's to judge.
        assert!(acks.check_crash(2, Some(&vote), short, 10).is_ok());
        assert!(acks
            .check_crash(2, Some(&Vote::new_committed(4, 3)), short, 0)
            .is_ok());
        // Another node's acknowledgements are its own.
        assert!(acks.check_crash(3, None, |_| None, 0).is_ok());
    }

    #[test]
    fn a_removed_node_running_past_the_bound_is_caught() {
        let removed = BTreeMap::from([(2, 1_000), (4, 3_000)]);
        let running = |id: u64| id == 2 || id == 4;
        // At the bound itself: still allowed.
        assert_eq!(
            removed_nodes_exit(&removed, running, 1_000 + REMOVED_EXIT_MS),
            Ok(())
        );
        // One millisecond past it, node 2 (still running) is caught.
        let e = removed_nodes_exit(&removed, running, 1_001 + REMOVED_EXIT_MS).unwrap_err();
        assert!(e.contains("node 2 still runs 15001 ms"), "{e}");
        // A removed node that has exited is fine however late it is.
        assert_eq!(removed_nodes_exit(&removed, |id| id == 4, 17_000), Ok(()));
        // Node 4, removed later, is caught past its own bound.
        let e = removed_nodes_exit(&removed, |id| id == 4, 18_001).unwrap_err();
        assert!(e.contains("node 4"), "{e}");
    }

    #[test]
    fn a_node_started_from_a_damaged_snapshot_file_is_caught() {
        assert_eq!(no_start_from_damaged(3, 2, None), Ok(()));
        let e = no_start_from_damaged(3, 2, Some("torn to 10 of 6366 bytes")).unwrap_err();
        assert!(
            e.starts_with("snapshot file: node 3 started (process 2)") && e.contains("torn to 10"),
            "{e}"
        );
    }

    #[test]
    fn a_session_opened_after_a_restore_is_found_in_its_entry() {
        let slots = raftlock_node::raft::BATCH_SLOTS;
        // Before any restore: the command index is the log index times the
        // slots, plus the position.
        assert_eq!(open_entry(7 * slots + 3, 0), Some(7));
        // After a restore that set the floor F, the same entry's command
        // index is F + 7 * slots + 3 (found at 7, not past the log).
        let floor = (1 << 48) + 12_345;
        assert_eq!(open_entry(floor + 7 * slots + 3, floor), Some(7));
        // A table that has not applied the restore cannot have applied
        // the entry either.
        assert!(open_entry(floor + 7 * slots + 3, 0).unwrap() > 1 << 37);
        // A session below the floor was opened in the backup's cluster.
        assert_eq!(open_entry(floor - 1, floor), None);
    }

    #[test]
    fn overlapping_valid_holders_are_caught() {
        let ok = [grant(0, 1, 0, 10, 20), grant(1, 2, 5, 20, 30)];
        assert_eq!(mutual_exclusion(&ok), Ok(()));
        let bad = [grant(0, 1, 0, 10, 20), grant(1, 2, 5, 19, 30)];
        let e = mutual_exclusion(&bad).expect_err("overlap");
        assert!(e.contains("worker 0") && e.contains("worker 1"), "{e}");
        // A holder whose lease had ended is owed nothing.
        let mut expired = bad.clone();
        expired[0].valid = false;
        assert_eq!(mutual_exclusion(&expired), Ok(()));
    }

    #[test]
    fn a_changed_committed_entry_is_caught() {
        let mut c = Committed::default();
        assert_eq!(c.observe(1, 7, 0xabc), Ok(()));
        assert_eq!(c.observe(2, 7, 0xabc), Ok(()));
        assert!(c
            .observe(3, 7, 0xdef)
            .expect_err("changed")
            .contains("entry 7"));
    }

    #[test]
    fn a_fence_going_back_is_caught() {
        let mut f = Fences::default();
        assert_eq!(f.observe(1, 0, 4), Ok(()));
        assert_eq!(f.observe(1, 0, 6), Ok(()));
        // A restart replays from zero: a new incarnation starts afresh.
        assert_eq!(f.observe(1, 1, 0), Ok(()));
        assert!(f
            .observe(1, 0, 5)
            .expect_err("back")
            .contains("from 6 to 5"));
        // The bound, at its edge.
        let mut f = Fences::with_bound(10);
        assert_eq!(f.observe(1, 0, 10), Ok(()));
        assert!(f
            .observe(2, 0, 11)
            .expect_err("beyond")
            .contains("beyond the bound 10"));
        assert_eq!(
            Fences::default().bound,
            raftlock_node::state::limits::MAX_FENCE
        );
    }

    #[test]
    fn a_renewal_after_the_end_was_applied_is_caught() {
        let mut e = Ended::default();
        let r = |sent| Renewal {
            session: 9,
            node: 2,
            sent,
            answered: sent + 3,
        };
        // Renewals before any node applied the end are the leader's call.
        assert_eq!(e.check(&r(100)), Ok(()));
        e.observe(9, 1, 150);
        e.observe(9, 3, 170);
        assert!(e.has_ended(9) && !e.has_ended(8));
        assert_eq!(e.check(&r(149)), Ok(()));
        let bad = e.check(&r(150)).expect_err("renewed after the end");
        assert!(
            bad.contains("node 2 renewed session 9") && bad.contains("node 1"),
            "{bad}"
        );
        // Other sessions are not affected.
        assert_eq!(
            e.check(&Renewal {
                session: 8,
                ..r(500)
            }),
            Ok(())
        );
    }

    #[test]
    fn serving_with_a_stopped_core_is_caught() {
        let mut c = Cores::default();
        let s = |inc_sent, inc_answered, sent| Serving {
            node: 1,
            incarnation_sent: inc_sent,
            incarnation_answered: inc_answered,
            sent,
        };
        assert_eq!(c.check(&s(1, 1, 100)), Ok(()));
        c.observe_dead(1, 1, 200);
        assert_eq!(c.check(&s(1, 1, 199)), Ok(()));
        let bad = c.check(&s(1, 1, 200)).expect_err("zombie");
        assert!(bad.contains("node 1 (process 1)"), "{bad}");
        // The next process answered: its core is its own.
        assert_eq!(c.check(&s(1, 2, 300)), Ok(()));
        assert_eq!(c.check(&s(2, 2, 300)), Ok(()));
    }
}
