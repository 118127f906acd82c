//! Fence checking for downstream stores (no network).
//!
//! A store that raftlock protects keeps, per resource, the largest fence it
//! has accepted, and refuses any write that carries a smaller one: the
//! write of a holder that was paused, partitioned or expired and has since
//! been superseded. Equal fences are accepted (the same holder writing
//! again: raftlock never gives one fence value to two grants).
//!
//! Across a disaster recovery: a cluster restored from a backup hands out
//! fences above the backup's counter plus the restore's fence bump (by
//! default, from 2^32 above the restore's time in microseconds since 1970
//! on), so a store keeps what it remembers and goes on working, as long
//! as no cluster granted a million locks a second and the restoring
//! nodes' clocks are right. After losing every node *without* a backup, a
//! new cluster starts again from 1: reset the store's remembered fences
//! then.
//!
//! ```
//! use raftlock_client::fence::FenceChecker;
//! use raftlock_client::Fence;
//!
//! let store = FenceChecker::new();
//! let (old, new) = (Fence::new(12), Fence::new(15)); // e.g. from guard.fence()
//! assert!(store.check("accounts/7", old).is_ok());
//! assert!(store.check("accounts/7", old).is_ok()); // same holder again
//! assert!(store.check("accounts/7", new).is_ok()); // a newer holder
//! let stale = store.check("accounts/7", old).unwrap_err(); // the old one, too late
//! assert_eq!((stale.fence, stale.latest), (old, new));
//! ```

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::types::Fence;

/// A write refused because a newer holder already wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("stale fence {fence}: the resource has already accepted fence {latest}")]
pub struct StaleFence {
    /// The fence the write carried.
    pub fence: Fence,
    /// The largest fence accepted so far.
    pub latest: Fence,
}

/// The largest fence accepted per resource. Thread-safe.
#[derive(Debug, Default)]
pub struct FenceChecker {
    latest: Mutex<BTreeMap<String, Fence>>,
}

impl FenceChecker {
    /// An empty checker.
    pub fn new() -> Self {
        Self::default()
    }

    /// Accepts `fence` for `resource` if it is at least the largest seen,
    /// and records it. Call it atomically with the write it guards (the
    /// check and the write must not interleave with another writer's).
    pub fn check(&self, resource: &str, fence: Fence) -> Result<(), StaleFence> {
        let mut latest = self.latest.lock().expect("fence lock poisoned");
        match latest.get_mut(resource) {
            Some(l) if fence < *l => Err(StaleFence { fence, latest: *l }),
            Some(l) => {
                *l = fence;
                Ok(())
            }
            None => {
                latest.insert(resource.to_string(), fence);
                Ok(())
            }
        }
    }

    /// Runs `write` only if `fence` is accepted for `resource`; the check
    /// and the write happen under one lock.
    pub fn guarded<T>(
        &self,
        resource: &str,
        fence: Fence,
        write: impl FnOnce() -> T,
    ) -> Result<T, StaleFence> {
        let mut latest = self.latest.lock().expect("fence lock poisoned");
        let l = latest.entry(resource.to_string()).or_insert(Fence::new(0));
        if fence < *l {
            return Err(StaleFence { fence, latest: *l });
        }
        *l = fence;
        Ok(write())
    }

    /// The largest fence accepted for `resource`.
    pub fn latest(&self, resource: &str) -> Option<Fence> {
        self.latest
            .lock()
            .expect("fence lock poisoned")
            .get(resource)
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(n: u64) -> Fence {
        Fence::new(n)
    }

    #[test]
    fn smaller_fences_are_refused_per_resource() {
        let c = FenceChecker::new();
        c.check("a", f(5)).expect("first");
        c.check("b", f(1)).expect("other resource is independent");
        assert_eq!(
            c.check("a", f(4)),
            Err(StaleFence {
                fence: f(4),
                latest: f(5)
            })
        );
        c.check("a", f(5)).expect("equal accepted");
        c.check("a", f(9)).expect("larger accepted");
        assert_eq!(c.latest("a"), Some(f(9)));
        assert_eq!(c.latest("zzz"), None);
    }

    #[test]
    fn guarded_writes_run_only_when_accepted() {
        let c = FenceChecker::new();
        let mut log = Vec::new();
        c.guarded("k", f(3), || log.push(3)).expect("accepted");
        assert!(c.guarded("k", f(2), || log.push(2)).is_err());
        assert_eq!(log, vec![3]);
    }
}
