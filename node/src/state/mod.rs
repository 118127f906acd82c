//! The lock table: raftlock's whole semantics as a pure, deterministic
//! state machine.
//!
//! Every node applies the same committed [`Command`]s in log order to its own
//! [`LockTable`] and so holds the same table. That only works if `apply` is a
//! function of (table, index, command) alone, hence the **determinism
//! contract** of this module:
//!
//! * no clock: time-based decisions (lease expiry, wait timeouts, lock-delay)
//!   are made by the leader on its monotonic clock and arrive here as
//!   commands (`ExpireSession`, `TimeoutWait`, `EndLockDelay`);
//! * no I/O, no randomness, no async, no threads; nothing from tokio, tonic,
//!   openraft or sled is imported here;
//! * no iteration over hash-ordered collections where the order could reach
//!   the table or a response (the table uses ordered maps throughout);
//! * a refusal is a value ([`Reply::Refused`]) and changes nothing; the
//!   storage layer around this module treats its own I/O failures as fatal.
//!
//! **Invariants** (checked after every step by the property tests, and by
//! [`LockTable::check_invariants`]):
//!
//! 1. A lock has at most one exclusive holder, and never an exclusive and a
//!    shared holder together.
//! 2. A semaphore's holders' weights add up to at most its capacity, which
//!    is fixed while the semaphore exists.
//! 3. Queues are FIFO with head-of-line blocking and no barging: a request
//!    is granted only when everything queued ahead of it was granted, and
//!    the head of a non-empty queue is never grantable (else it would have
//!    been granted).
//! 4. Fences come from one cluster-wide counter: every grant gets a value
//!    larger than all before it, so successive holders of a name see
//!    strictly increasing fences, never above
//!    [`MAX_FENCE`](limits::MAX_FENCE): at the bound grants stop, they never
//!    wrap.
//! 5. Holders, waiters and sessions agree: each grant and wait belongs to an
//!    open session that lists it, and a session holds at most one grant and
//!    at most one wait per name.
//! 6. The wait-for graph between sessions has no cycle (see [`deadlock`]).
//! 7. A name with no holder, waiter or lock-delay has no entry.
//! 8. A pending upgrade is of a shared grant its session holds, at most
//!    one per lock, and is not grantable (its grant is not the lock's only
//!    one, or a lock-delay is in force); while it pends, nothing queued
//!    on the name is granted.
//! 9. A queued atomic request (`AcquireAll`) waits in the queue of every
//!    name it names, and is not grantable as a whole (at the head of every
//!    one of them, fitting each): it is granted all at once or not at all.

pub mod cmd;
mod command;
pub mod deadlock;
pub mod limits;
mod table;
mod view;

pub use command::{
    Acquired, AcquiredAll, CancelCause, Command, EndCause, Event, Fence, LockName, Mode, Refusal,
    Reply, Response, SessionId, WaitEdge, LOCK_SEQ, UNLOCK_SEQ,
};
pub use table::LockTable;
pub use view::{HolderInfo, LockInfo, SessionInfo, SnapshotError, Stats, WaitInfo};

#[cfg(test)]
mod tests;

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod encoding_tests {
    use serde::{Deserialize, Serialize};

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Plain(Vec<u8>);

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Blob(#[serde(with = "serde_bytes")] Vec<u8>);

    /// Values, restore parts and backups are `serde_bytes` blobs: bincode
    /// must write them byte for byte like the plain `Vec<u8>` that log
    /// entries and snapshots of earlier versions hold.
    #[test]
    fn bincode_bytes_are_the_same_as_a_plain_vec() {
        let data: Vec<u8> = (0..=255).collect();
        let plain = crate::codec::encode(&Plain(data.clone())).expect("encode");
        let blob = crate::codec::encode(&Blob(data.clone())).expect("encode");
        assert_eq!(plain, blob);
        let back: Blob = crate::codec::decode(&plain).expect("decode");
        assert_eq!(back.0, data);
        // JSON still round-trips.
        let json = serde_json::to_string(&Blob(vec![1, 2, 3])).expect("json");
        let back: Blob = serde_json::from_str(&json).expect("json back");
        assert_eq!(back.0, vec![1, 2, 3]);
        let truncated = &plain[..plain.len() - 1];
        assert!(crate::codec::decode::<Blob>(truncated).is_err());
    }
}
