//! What must hold in every run. Pure: each oracle takes observations
//! (simulated milliseconds, ids, hashes) and says what it found wrong.
//!
//! * on the workers' history: mutual exclusion of valid holders, and
//!   fences in real-time order;
//! * every tick, on the nodes: one leader per term, committed entries never
//!   change, a node's fence never goes back within one run of its process.

use std::collections::BTreeMap;

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

/// Fences are unique, and a grant that reached its worker before another
/// acquire was even asked for has the smaller fence (linearizable fence
/// order).
pub fn fence_order(grants: &[Grant]) -> Result<(), String> {
    let mut by_fence: BTreeMap<u64, &Grant> = BTreeMap::new();
    for g in grants {
        if let Some(other) = by_fence.insert(g.fence, g) {
            return Err(format!(
                "fence {} granted twice: to worker {} at {} ms and to worker {} at {} ms",
                g.fence, other.worker, other.granted, g.worker, g.granted
            ));
        }
    }
    for a in grants {
        for b in grants {
            if a.granted < b.invoked && a.fence >= b.fence {
                return Err(format!(
                    "fence order: worker {} got fence {} at {} ms, before worker {} asked at {} \
                     ms, and got the smaller fence {}",
                    a.worker, a.fence, a.granted, b.worker, b.invoked, b.fence
                ));
            }
        }
    }
    Ok(())
}

/// One leader per term, over everything any node ever reported.
#[derive(Debug, Default)]
pub struct Leaders {
    by_term: BTreeMap<u64, u64>,
}

impl Leaders {
    /// Node `node` says it leads `term`.
    pub fn observe(&mut self, term: u64, node: u64) -> Result<(), String> {
        match self.by_term.insert(term, node) {
            Some(other) if other != node => Err(format!(
                "two leaders in term {term}: node {other} and node {node}"
            )),
            _ => Ok(()),
        }
    }
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
        match self.at.get(&index) {
            Some(&(first_node, first)) if first != hash => Err(format!(
                "committed entry {index} changed: node {first_node} applied {first:016x}, node \
                 {node} applied {hash:016x}"
            )),
            Some(_) => Ok(()),
            None => {
                self.at.insert(index, (node, hash));
                Ok(())
            }
        }
    }
}

/// A node's last issued fence never goes back while its process runs
/// (each restart is a new incarnation: it replays its log from zero).
#[derive(Debug, Default)]
pub struct Fences {
    last: BTreeMap<(u64, u64), u64>,
}

impl Fences {
    /// In incarnation `incarnation` of node `node`, the table's last fence
    /// is `fence`.
    pub fn observe(&mut self, node: u64, incarnation: u64, fence: u64) -> Result<(), String> {
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
    fn fences_out_of_real_time_order_are_caught() {
        let ok = [grant(0, 5, 0, 10, 20), grant(1, 7, 15, 25, 30)];
        assert_eq!(fence_order(&ok), Ok(()));
        // Worker 1 asked after worker 0 had its grant, yet got less.
        let bad = [grant(0, 7, 0, 10, 20), grant(1, 5, 15, 25, 30)];
        assert!(fence_order(&bad)
            .expect_err("order")
            .contains("smaller fence 5"));
        // Concurrent acquires may be ordered either way.
        let concurrent = [grant(0, 7, 0, 10, 20), grant(1, 5, 5, 25, 30)];
        assert_eq!(fence_order(&concurrent), Ok(()));
        let twice = [grant(0, 5, 0, 10, 20), grant(1, 5, 0, 25, 30)];
        assert!(fence_order(&twice)
            .expect_err("dup")
            .contains("granted twice"));
    }

    #[test]
    fn two_leaders_in_one_term_are_caught() {
        let mut l = Leaders::default();
        assert_eq!(l.observe(3, 1), Ok(()));
        assert_eq!(l.observe(3, 1), Ok(()));
        assert_eq!(l.observe(4, 2), Ok(()));
        assert!(l.observe(3, 2).expect_err("two").contains("term 3"));
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
    }
}
