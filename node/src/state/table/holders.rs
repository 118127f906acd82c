//! A name's grants, in fence order.

use serde::{Deserialize, Serialize};

use super::Holder;
use crate::state::command::Fence;

/// A name's grants in ascending fence order: a map from fence to holder,
/// kept as a sorted `Vec`.
///
/// A name nearly always has one holder, and with a million held names the
/// holder collection is most of the table's memory: a `BTreeMap`'s first
/// insert allocates a whole 11-slot leaf (~800 bytes), this one slot (72).
/// Grants get ever larger fences, so an insert is a push; lookups and
/// removals are binary searches. Serialized as a sequence of `(fence,
/// holder)` pairs, which bincode writes byte for byte like the
/// `BTreeMap<Fence, Holder>` it replaces, so snapshots are unchanged. A
/// decoded sequence out of order is caught by
/// [`check_invariants`](LockTable::check_invariants).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub(in crate::state) struct Holders(Vec<(Fence, Holder)>);

impl Holders {
    pub(in crate::state) fn search(&self, fence: &Fence) -> Result<usize, usize> {
        self.0.binary_search_by_key(fence, |(f, _)| *f)
    }

    /// Adds a grant (replacing one with the same fence, which `apply`
    /// never makes).
    pub(in crate::state) fn insert(&mut self, fence: Fence, holder: Holder) {
        match self.search(&fence) {
            Ok(pos) => self.0[pos].1 = holder,
            Err(pos) => {
                if self.0.capacity() == 0 {
                    // `push` would allocate room for four; most names only
                    // ever have one holder.
                    self.0.reserve_exact(1);
                }
                self.0.insert(pos, (fence, holder));
            }
        }
    }

    /// Removes and returns the grant with `fence`.
    pub(in crate::state) fn remove(&mut self, fence: &Fence) -> Option<Holder> {
        let pos = self.search(fence).ok()?;
        Some(self.0.remove(pos).1)
    }

    /// The grant with `fence`.
    pub(in crate::state) fn get(&self, fence: &Fence) -> Option<&Holder> {
        self.search(fence).ok().map(|pos| &self.0[pos].1)
    }

    /// The grant with `fence`, to change.
    pub(in crate::state) fn get_mut(&mut self, fence: &Fence) -> Option<&mut Holder> {
        self.search(fence).ok().map(|pos| &mut self.0[pos].1)
    }

    /// Whether a grant with `fence` is current.
    pub(in crate::state) fn contains_key(&self, fence: &Fence) -> bool {
        self.search(fence).is_ok()
    }

    /// Grants in fence order.
    pub(in crate::state) fn iter(&self) -> impl DoubleEndedIterator<Item = (&Fence, &Holder)> + '_ {
        self.0.iter().map(|(f, h)| (f, h))
    }

    /// Fences in ascending order.
    pub(in crate::state) fn keys(&self) -> impl DoubleEndedIterator<Item = &Fence> + '_ {
        self.0.iter().map(|(f, _)| f)
    }

    /// Holders in fence order, to change (tests corrupt tables with it).
    #[cfg(test)]
    pub(in crate::state) fn values_mut(&mut self) -> impl Iterator<Item = &mut Holder> + '_ {
        self.0.iter_mut().map(|(_, h)| h)
    }

    /// Holders in fence order.
    pub(in crate::state) fn values(&self) -> impl DoubleEndedIterator<Item = &Holder> + '_ {
        self.0.iter().map(|(_, h)| h)
    }

    pub(in crate::state) fn len(&self) -> usize {
        self.0.len()
    }

    pub(in crate::state) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether fences strictly ascend (a decoded snapshot may not).
    pub(in crate::state) fn is_sorted(&self) -> bool {
        self.0.windows(2).all(|w| w[0].0 < w[1].0)
    }
}

impl<'a> IntoIterator for &'a Holders {
    type Item = (&'a Fence, &'a Holder);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (Fence, Holder)>,
        fn(&'a (Fence, Holder)) -> (&'a Fence, &'a Holder),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(f, h)| (f, h))
    }
}

#[cfg(test)]
mod holders_tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::state::cmd;
    use crate::state::command::{Command, LockName, Mode, SessionId};
    use crate::state::LockTable;

    fn holder(session: u64) -> Holder {
        Holder {
            session: SessionId(session),
            seq: 1,
            mode: Mode::Shared,
            value: Vec::new(),
            index: session,
        }
    }

    #[test]
    fn holders_keep_fence_order_and_one_slot_for_one_holder() {
        let mut h = Holders::default();
        h.insert(Fence(5), holder(5));
        assert_eq!(h.0.capacity(), 1, "a lone holder takes one slot");
        h.insert(Fence(9), holder(9));
        h.insert(Fence(2), holder(2));
        assert!(h.is_sorted());
        assert_eq!(
            h.keys().copied().collect::<Vec<_>>(),
            [Fence(2), Fence(5), Fence(9)]
        );
        assert_eq!(h.get(&Fence(5)).map(|x| x.session), Some(SessionId(5)));
        assert!(h.contains_key(&Fence(9)) && !h.contains_key(&Fence(6)));
        assert_eq!(h.remove(&Fence(5)).map(|x| x.session), Some(SessionId(5)));
        assert_eq!(h.remove(&Fence(5)), None);
        assert_eq!(h.len(), 2);
        assert_eq!(h.keys().next_back(), Some(&Fence(9)));
    }

    #[test]
    fn holders_encode_like_the_map_they_replace() {
        let mut h = Holders::default();
        let mut map = BTreeMap::new();
        for f in [3, 4, 17] {
            h.insert(Fence(f), holder(f));
            map.insert(Fence(f), holder(f));
        }
        let bytes = crate::codec::encode(&h).expect("encodes");
        assert_eq!(bytes, crate::codec::encode(&map).expect("encodes"));
        assert_eq!(crate::codec::decode::<Holders>(&bytes).expect("decodes"), h);
    }

    #[test]
    fn snapshot_with_holders_out_of_order_is_refused() {
        let mut t = LockTable::new();
        for (index, nonce) in [(1, 11), (2, 12)] {
            t.apply(
                index,
                Command::OpenSessionV0(cmd::OpenSessionV0 {
                    ttl_ms: 10_000,
                    lock_delay_ms: 0,
                    nonce,
                    owner: String::new(),
                }),
            );
        }
        for (index, session) in [(3, 1), (4, 2)] {
            t.apply(
                index,
                Command::Acquire(cmd::Acquire {
                    session: SessionId(session),
                    seq: 1,
                    name: LockName::new("x").expect("valid name"),
                    mode: Mode::Shared,
                    timeout_ms: 0,
                    value: Vec::new(),
                    caller: String::new(),
                }),
            );
        }
        let x = LockName::new("x").expect("valid");
        assert_eq!(t.locks[&x].holders.len(), 2);
        assert!(LockTable::from_snapshot(&t.to_snapshot()).is_ok());
        t.locks.get_mut(&x).expect("held").holders.0.reverse();
        let err = LockTable::from_snapshot(&t.to_snapshot()).expect_err("refused");
        assert!(err.to_string().contains("out of fence order"), "{err}");
    }
}
