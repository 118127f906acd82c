//! Every limit the lock table enforces, as a named constant.
//!
//! Each one is tested at its edge (the largest accepted value and the first
//! refused one) in `state::tests`. A request past a limit is refused with a
//! [`Refusal`](super::Refusal) and changes nothing.

/// Longest lock or semaphore name, in bytes of UTF-8.
pub const MAX_NAME_LEN: usize = 512;

/// Largest value a holder may attach to a grant, in bytes.
pub const MAX_VALUE_LEN: usize = 4096;

/// Shortest session ttl. Shorter leases would expire during an ordinary
/// leader election and make every failover cost every session.
pub const MIN_SESSION_TTL_MS: u64 = 1_000;

/// Longest identity a session may be bound to, in bytes (a token's
/// identity name or a certificate's common name).
pub const MAX_OWNER_LEN: usize = 256;

/// Longest session ttl (one hour). A dead client's locks stay held this long
/// at most.
pub const MAX_SESSION_TTL_MS: u64 = 3_600_000;

/// Longest grace a session may ask for between the end of its last
/// keep-alive stream and its expiry (`end_on_disconnect_ms`): one minute.
/// 0 turns the feature off; a grace at least as long as the ttl never ends
/// a session sooner than its ttl would.
pub const MAX_END_ON_DISCONNECT_MS: u64 = 60_000;

/// Longest lock-delay a session may ask for.
pub const MAX_LOCK_DELAY_MS: u64 = 60_000;

/// Largest semaphore capacity.
pub const MAX_CAPACITY: u32 = 1_000_000;

/// Most requests queued on one name.
pub const MAX_WAITERS_PER_NAME: usize = 10_000;

/// Most names one session may hold or wait for at once.
pub const MAX_LOCKS_PER_SESSION: usize = 10_000;

/// Most names one atomic request (`AcquireAll`) may take.
pub const MAX_NAMES_PER_REQUEST: usize = 64;

/// Most open sessions in the cluster.
pub const MAX_SESSIONS: usize = 250_000;

/// Most open sessions of one identity (with access control on; without
/// it, every session is the one anonymous caller's and only the cluster's
/// limits apply).
pub const MAX_SESSIONS_PER_IDENTITY: usize = 50_000;

/// Most entries in the table: grants held plus requests queued, over
/// every session. Each costs a node's memory on every replica (about
/// 0.7 KiB with a short name and no value, up to about 12.5 KiB with a
/// 512-byte name and a 4 KiB value): this is the bound on the table's
/// size that no caller can push past.
pub const MAX_ENTRIES: usize = 2_000_000;

/// Most entries (grants held plus requests queued) of one identity's
/// sessions together (with access control on, as
/// [`MAX_SESSIONS_PER_IDENTITY`]).
pub const MAX_ENTRIES_PER_IDENTITY: usize = 500_000;

/// How many settled replies each session remembers for exactly-once
/// retries: the newest this many by sequence number, plus every queued
/// acquire's until it is granted or cancelled. A retry of a request older
/// than the window is refused with `SequenceTooOld` rather than applied
/// twice; a client that keeps at most this many requests in flight on one
/// session always learns the outcome of a retry.
pub const MAX_REMEMBERED_REPLIES: usize = 256;

/// How many closed sessions the table remembers (the newest by id), so a
/// retried `CloseSession` is answered like the first instead of with
/// `NOT_FOUND`.
pub const MAX_REMEMBERED_CLOSES: usize = 10_000;

/// Largest part of a backup one `RestorePart` command carries (each part is
/// one log entry, which followers must take within a heartbeat).
pub const MAX_RESTORE_PART: usize = 64 * 1024;

/// Largest backup a restore may assemble.
pub const MAX_RESTORE_BYTES: usize = 1 << 30;

/// `timeout_ms` value meaning "wait without a timeout".
pub const WAIT_FOREVER: u64 = u64::MAX;

/// Command indexes a restore leaves free above the largest one in the
/// backup (2^48, about 2.7e11 log entries): the backup's cluster may have
/// gone on opening sessions and queueing requests after the backup was
/// taken, and a client of that cluster must never find its old session id
/// or queue position given to someone else. See `LockTable::index_floor`.
pub const RESTORE_INDEX_BUMP: u64 = 1 << 48;

/// The largest fence a cluster hands out: 2^63 - 1, the largest signed
/// 64-bit integer, so that every fence fits a PostgreSQL `bigint`, a Java
/// `long` or a PHP `int`. A restore whose fence bump would take the counter
/// past it is refused; once the counter reaches it, acquires are refused
/// (`RESOURCE_EXHAUSTED`) and waits end without a grant, instead of
/// handing out a fence that wraps to 0. (At a million grants a second the
/// counter reaches it after about 290,000 years; only a restore can bring
/// it near.)
pub const MAX_FENCE: u64 = i64::MAX as u64;

/// The least a restore skips by default above the backup's counter (2^32):
/// grants the backup's cluster made after the backup was taken had fences
/// above the backup's counter, and stores may have accepted them. Restored
/// clusters hand out fences above `last_fence + bump`, so such fences are
/// never handed out again as long as the old cluster made fewer than
/// `bump` grants after the backup. The default bump may be larger
/// ([`default_restore_fence_bump`]); a restore can name its own.
pub const DEFAULT_RESTORE_FENCE_BUMP: u64 = 1 << 32;

/// The fence rate no cluster reaches: a million grants a second (one a
/// microsecond). The default restore bump leans on it: a restored cluster's
/// fences start above the restore's time in microseconds, and then grow
/// more slowly than that time does.
pub const RESTORE_FENCES_PER_SECOND: u64 = 1_000_000;

/// The default fence bump of a restore of a backup whose fence counter is
/// `last_fence`, taken at `created_unix_secs` (`None`: a backup from before
/// the header), applied at `now_unix_micros` (the restoring leader's
/// clock): enough that new fences start above `now_unix_micros` +
/// [`DEFAULT_RESTORE_FENCE_BUMP`], the *time floor*, and above the
/// backup's counter.
///
/// Every cluster's fences stay below the current time in microseconds plus
/// 2^32: one never restored counts from 1 (it would need 1.8e15 grants to
/// get there), and a restored one starts at its restore's time floor and
/// then grants fewer than [`RESTORE_FENCES_PER_SECOND`]. So a backup's
/// counter is below any later time floor, every restore starts at its own
/// time floor, and a later restore, of the same file or of any other (an
/// older one included), starts above every fence any earlier cluster handed
/// out. (Adding a constant to the backup's counter instead, as the flat
/// 2^32 default did, climbs by that constant with each restore of a restored
/// cluster's backup, and an older backup restored after it reissues its
/// fences.)
///
/// This leans on the clocks of the nodes that apply the restores: if a
/// later restore's clock is `d` seconds behind an earlier one's, the two
/// must be more than `d` seconds apart. A clock behind the one that stamped
/// the backup is plainly wrong: then (and for a backup without a stamp) the
/// bump is also at least [`DEFAULT_RESTORE_FENCE_BUMP`], the old default,
/// which covers fewer than 2^32 grants by the backup's cluster after it.
pub fn default_restore_fence_bump(
    last_fence: u64,
    created_unix_secs: Option<u64>,
    now_unix_micros: u64,
) -> u64 {
    let time_floor = now_unix_micros.saturating_add(DEFAULT_RESTORE_FENCE_BUMP);
    let bump = time_floor.saturating_sub(last_fence).max(1);
    let clock_behind =
        created_unix_secs.is_none_or(|c| now_unix_micros < c.saturating_mul(1_000_000));
    if clock_behind {
        bump.max(DEFAULT_RESTORE_FENCE_BUMP)
    } else {
        bump
    }
}
