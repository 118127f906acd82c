//! The simulation's clocks, wall and monotonic.
//!
//! Every decision in the node reads tokio's clock, which the simulation
//! drives, but code deeper in the stack reads the machine's clocks all the
//! same:
//!
//! * hyper puts a `date` header on every HTTP/2 response, cached per second
//!   of `SystemTime::now()`. Its encoded length varies with the digits
//!   (HPACK's Huffman code), so when the second turned over at a different
//!   simulated moment (a busier machine, a slower build), a frame was a
//!   byte longer or shorter and the run went another way: seed 14 gave two
//!   trace hashes, depending on the time of day it ran.
//! * h2 forgets a reset stream 1 s after the reset by `std::time::Instant`;
//!   a late frame for it is then answered with a `RST_STREAM` of its own,
//!   which takes a latency draw from the seed.
//! * tokio's paused clocks (one per simulated host) start from
//!   `std::time::Instant::now()` when the host's runtime is built.
//!
//! So this binary defines `clock_gettime` itself: the static link binds
//! every call in the executable (the Rust standard library's included) to
//! this one instead of libc's. The wall clocks (`CLOCK_REALTIME` and its
//! coarse and TAI variants) answer the simulated time counted from
//! [`EPOCH_SECS`]; the monotonic ones (`CLOCK_MONOTONIC`, coarse, raw) the
//! simulated time counted from the machine's monotonic clock when the
//! process first read it. `CLOCK_BOOTTIME` and the CPU-time clocks stay the
//! kernel's: [`real_time`] reads the first, for the driver's own figures
//! (seeds a minute, `--for-seconds`). They go on to libc's own
//! `clock_gettime` (found with `dlsym(RTLD_NEXT)` before the first run,
//! see [`init`]), which reads the vDSO.
//!
//! Both simulated clocks move only when the driver steps (1 ms). Nothing in
//! a simulated run waits on them in real time: tokio's paused clocks
//! advance instead of sleeping, and `--stall-real-time` sleeps with
//! `nanosleep`, which reads no clock here.

#[cfg(not(target_os = "linux"))]
compile_error!("the simulator's clocks are Linux's (clock ids, dlsym)");

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::time::Duration;

/// Where simulated wall time starts: 2026-01-01T00:00:00Z.
pub const EPOCH_SECS: u64 = 1_767_225_600;

/// Simulated milliseconds since the run started (set by the driver after
/// each step).
static SIMULATED_MS: AtomicU64 = AtomicU64::new(0);

/// The machine's monotonic clock (ns) when the process first read a
/// monotonic clock: where simulated monotonic time starts. 0: not yet.
static MONOTONIC_BASE_NS: AtomicU64 = AtomicU64::new(0);

type ClockGettime = unsafe extern "C" fn(libc::clockid_t, *mut libc::timespec) -> libc::c_int;

/// libc's `clock_gettime`, once looked up (null: not yet, or none).
static LIBC_CLOCK_GETTIME: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());

/// Looks libc's `clock_gettime` up and fixes the monotonic base. Call it
/// first thing in `main`: `dlsym` is then never reached from inside a
/// clock read (where anything it reads a clock with would recurse).
pub fn init() {
    if LIBC_CLOCK_GETTIME.load(Ordering::Relaxed).is_null() {
        // SAFETY: a lookup by a NUL-terminated name.
        let f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"clock_gettime".as_ptr()) };
        LIBC_CLOCK_GETTIME.store(f, Ordering::Relaxed);
    }
    monotonic_base_ns();
}

/// Moves both simulated clocks to `ms` simulated milliseconds into the run.
pub fn set_ms(ms: u64) {
    SIMULATED_MS.store(ms, Ordering::Relaxed);
}

/// The machine's time since boot (`CLOCK_BOOTTIME`, never simulated): for
/// the driver's own measures of real time.
pub fn real_time() -> Duration {
    let t = kernel(libc::CLOCK_BOOTTIME);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// `clock` as the kernel (through libc's vDSO path, or the system call
/// before [`init`] or without a dynamic libc) tells it.
fn kernel(clock: libc::clockid_t) -> libc::timespec {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid pointer to one timespec.
    unsafe { kernel_into(clock, &mut t) };
    t
}

/// libc's `clock_gettime` if [`init`] found it, else the system call.
///
/// # Safety
///
/// `tp` must be valid for a write of one `timespec`.
unsafe fn kernel_into(clock: libc::clockid_t, tp: *mut libc::timespec) -> i32 {
    let f = LIBC_CLOCK_GETTIME.load(Ordering::Relaxed);
    if f.is_null() {
        // SAFETY: the system call takes the function's arguments.
        unsafe { libc::syscall(libc::SYS_clock_gettime, clock, tp) as i32 }
    } else {
        // SAFETY: `f` is libc's clock_gettime, of this signature.
        let f = unsafe { std::mem::transmute::<*mut libc::c_void, ClockGettime>(f) };
        // SAFETY: the caller's pointer.
        unsafe { f(clock, tp) }
    }
}

fn monotonic_base_ns() -> u64 {
    let base = MONOTONIC_BASE_NS.load(Ordering::Relaxed);
    if base != 0 {
        return base;
    }
    let t = kernel(libc::CLOCK_MONOTONIC);
    let now = (t.tv_sec as u64) * 1_000_000_000 + t.tv_nsec as u64;
    // The first reader fixes it (a second one keeps the first's).
    match MONOTONIC_BASE_NS.compare_exchange(0, now.max(1), Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => now.max(1),
        Err(first) => first,
    }
}

/// The process's `clock_gettime` (see the module's documentation).
///
/// # Safety
///
/// `tp` must be valid for a write of one `timespec`, as for libc's.
#[no_mangle]
pub unsafe extern "C" fn clock_gettime(clock: libc::clockid_t, tp: *mut libc::timespec) -> i32 {
    let ms = SIMULATED_MS.load(Ordering::Relaxed);
    let simulated_ns = match clock {
        libc::CLOCK_REALTIME | libc::CLOCK_REALTIME_COARSE | libc::CLOCK_TAI => {
            Some(EPOCH_SECS * 1_000_000_000 + ms * 1_000_000)
        }
        libc::CLOCK_MONOTONIC | libc::CLOCK_MONOTONIC_COARSE | libc::CLOCK_MONOTONIC_RAW => {
            Some(monotonic_base_ns() + ms * 1_000_000)
        }
        _ => None,
    };
    match simulated_ns {
        Some(ns) if !tp.is_null() => {
            // SAFETY: the caller passes a pointer valid for one timespec.
            unsafe {
                (*tp).tv_sec = (ns / 1_000_000_000) as libc::time_t;
                (*tp).tv_nsec = (ns % 1_000_000_000) as libc::c_long;
            }
            0
        }
        // SAFETY: the caller's pointer, valid as for libc's.
        _ => unsafe { kernel_into(clock, tp) },
    }
}

#[cfg(test)]
// std's Instant is what this test is about (clippy.toml refuses it
// elsewhere: decisions read tokio's clock).
#[allow(clippy::disallowed_types)]
mod tests {
    use super::*;
    use std::time::{Instant, SystemTime, UNIX_EPOCH};

    /// Both simulated clocks move with the driver and only with it; the
    /// boot-time clock, the driver's, moves with the machine.
    #[test]
    fn the_wall_and_monotonic_clocks_are_simulated_and_boot_time_is_real() {
        init();
        set_ms(61_250);
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        assert_eq!(wall, Duration::from_millis(EPOCH_SECS * 1_000 + 61_250));
        let a = Instant::now();
        let real = real_time();
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(a.elapsed(), Duration::ZERO, "no simulated time passed");
        assert!(real_time() - real >= Duration::from_millis(5));
        set_ms(61_253);
        assert_eq!(a.elapsed(), Duration::from_millis(3));
        set_ms(0);
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        assert_eq!(wall, Duration::from_secs(EPOCH_SECS));
    }
}
