//! The simulation's wall clock.
//!
//! Every decision in the node reads tokio's clock, which the simulation
//! drives, but some code in the stack reads the machine's wall clock all
//! the same: hyper puts a `date` header on every HTTP/2 response, cached
//! per second of `SystemTime::now()`. Its encoded length varies with the
//! digits (HPACK's Huffman code), so when the second turns over at a
//! different simulated moment (a busier machine, a slower build), a frame
//! is a byte longer or shorter and the run goes another way. Seed 14 gave
//! two trace hashes, depending on the time of day it ran.
//!
//! So this binary defines `clock_gettime` itself: the static link binds
//! every call in the executable (the Rust standard library's included) to
//! this one instead of libc's. The wall clocks (`CLOCK_REALTIME` and its
//! coarse and TAI variants) answer the simulated time, counted from
//! [`EPOCH_SECS`]; every other clock is the kernel's, so the driver still
//! measures seeds per minute in real time.

use std::sync::atomic::{AtomicU64, Ordering};

/// Where simulated wall time starts: 2026-01-01T00:00:00Z.
pub const EPOCH_SECS: u64 = 1_767_225_600;

/// Simulated milliseconds since the run started (set by the driver after
/// each step).
static SIMULATED_MS: AtomicU64 = AtomicU64::new(0);

/// Moves the wall clock to `ms` simulated milliseconds after the epoch.
pub fn set_ms(ms: u64) {
    SIMULATED_MS.store(ms, Ordering::Relaxed);
}

fn is_wall_clock(clock: libc::clockid_t) -> bool {
    matches!(
        clock,
        libc::CLOCK_REALTIME | libc::CLOCK_REALTIME_COARSE | libc::CLOCK_TAI
    )
}

/// The process's `clock_gettime` (see the module's documentation).
///
/// # Safety
///
/// `tp` must be valid for a write of one `timespec`, as for libc's.
#[no_mangle]
pub unsafe extern "C" fn clock_gettime(clock: libc::clockid_t, tp: *mut libc::timespec) -> i32 {
    if is_wall_clock(clock) && !tp.is_null() {
        let ms = SIMULATED_MS.load(Ordering::Relaxed);
        // SAFETY: the caller passes a pointer valid for one timespec.
        unsafe {
            (*tp).tv_sec = (EPOCH_SECS + ms / 1_000) as libc::time_t;
            (*tp).tv_nsec = ((ms % 1_000) * 1_000_000) as libc::c_long;
        }
        return 0;
    }
    // SAFETY: the system call takes the same arguments as the function.
    unsafe { libc::syscall(libc::SYS_clock_gettime, clock, tp) as i32 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    #[test]
    fn the_wall_clock_is_the_simulated_one_and_the_monotonic_clock_is_real() {
        set_ms(61_250);
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        assert_eq!(wall, Duration::from_millis(EPOCH_SECS * 1_000 + 61_250));
        set_ms(0);
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        assert_eq!(wall, Duration::from_secs(EPOCH_SECS));
        // The kernel's monotonic clock still moves.
        let a = std::time::Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        assert!(a.elapsed() >= Duration::from_millis(2));
    }
}
