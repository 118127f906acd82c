//! Loopback ports for servers started in another process (a `raftlockd`,
//! PostgreSQL, Redis, Prometheus): the one place tests and the harness get
//! them from.
//!
//! The usual trick, bind port 0 and release it for the server to take,
//! has two races, and both have failed runs on a busy machine:
//!
//! * the kernel picks port 0 from the ephemeral range (32768-60999 on
//!   Linux by default), the range every outgoing connection's source port
//!   comes from too; between the release and the server's own bind, a
//!   connection any test makes can take the port ("Address already in
//!   use" in `node/tests/graceful_leader.rs` under
//!   `scripts/test-under-load.sh`);
//! * two test processes (cargo runs binaries one after another, but CI
//!   runs two `cargo test` commands and the harness side by side) can be
//!   handed the same released port.
//!
//! So ports come from below the ephemeral range ([`FIRST`]..[`END`]),
//! where the kernel never picks one on its own, and each is reserved for
//! the life of the process that took it: a byte-range lock (`fcntl`) on
//! byte `port` of one file in the temporary directory, which every process
//! using this module checks and which the kernel drops when the process
//! ends, however it ends. Within a process, ports are handed out in turn
//! from a start that depends on the process id. A port something else
//! listens on fails the bind check and is skipped.

use std::fs::File;
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use nix::fcntl::{fcntl, FcntlArg};
use nix::libc;

/// The first port handed out.
pub const FIRST: u16 = 20_000;
/// One past the last port handed out: the start of Linux's default
/// ephemeral range.
pub const END: u16 = 32_768;

/// The file whose bytes are the ports' locks (none of its bytes is ever
/// written). Opened once and never closed: POSIX record locks belong to
/// the process and go when any of its descriptors of the file closes.
fn lock_file() -> Option<&'static File> {
    static FILE: OnceLock<Option<File>> = OnceLock::new();
    FILE.get_or_init(|| {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(std::env::temp_dir().join("raftlock-test-ports.lock"))
            .ok()
    })
    .as_ref()
}

/// Reserves `port` for this process, unless another process holds it.
/// Without the lock file (an unwritable temporary directory) every port
/// counts as reserved, and the bind check is all there is.
fn reserve(port: u16) -> bool {
    let Some(file) = lock_file() else {
        return true;
    };
    let lock = libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: libc::off_t::from(port),
        l_len: 1,
        l_pid: 0,
    };
    fcntl(file.as_raw_fd(), FcntlArg::F_SETLK(&lock)).is_ok()
}

/// The next port of this process's turn, reserved and free to bind at the
/// moment of asking, with a listener bound to it.
fn next() -> (u16, TcpListener) {
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let count = u32::from(END - FIRST);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7_919) % count,
        Ordering::AcqRel,
        Ordering::Acquire,
    );
    take(FIRST, END, &NEXT).unwrap_or_else(|| panic!("no free loopback port in {FIRST}..{END}"))
}

/// The first port of `first..end` from `cursor` on (in turn, wrapping)
/// that this process could reserve and bind.
fn take(first: u16, end: u16, cursor: &AtomicU32) -> Option<(u16, TcpListener)> {
    let count = u32::from(end - first);
    (0..count).find_map(|_| {
        let port = first + (cursor.fetch_add(1, Ordering::AcqRel) % count) as u16;
        if !reserve(port) {
            return None;
        }
        Some((port, TcpListener::bind(("127.0.0.1", port)).ok()?))
    })
}

/// A loopback port for a server another process starts: free now, and
/// given to nobody else that asks this module while this process lives.
pub fn free_port() -> u16 {
    next().0
}

/// A listener on a port [`free_port`] could have given: for a caller that
/// holds the port until its server is about to start (the harness holds
/// every node's port while it starts the others and its proxies).
pub fn listener() -> TcpListener {
    next().1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ports are distinct, below the ephemeral range, and bindable once
    /// handed out.
    #[test]
    fn ports_are_distinct_below_the_ephemeral_range_and_free() {
        let ports: Vec<u16> = (0..200).map(|_| free_port()).collect();
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "a port was handed out twice");
        assert!(ports.iter().all(|p| (FIRST..END).contains(p)), "{ports:?}");
        for p in &ports[..10] {
            TcpListener::bind(("127.0.0.1", *p)).expect("a handed-out port is free");
        }
    }

    /// A port another process holds is skipped, and is free again once
    /// that process is killed: a child process takes three ports of a
    /// window of four, and only the fourth can be had until it dies.
    #[test]
    fn a_port_another_process_holds_is_skipped_until_it_dies() {
        if lock_file().is_none() {
            eprintln!("no lock file in the temporary directory: nothing to check");
            return;
        }
        // A window the allocator's turn (from the process id) is unlikely
        // to reach while this runs; the test needs only that the child's
        // three ports are not this process's own already.
        let (first, end) = (END - 4, END);
        let script = format!(
            "import fcntl, sys\n\
             f = open({path:?}, 'r+')\n\
             for p in range({first}, {last}):\n\
             \x20   fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, p)\n\
             print('held', flush=True)\n\
             sys.stdin.read()\n",
            path = std::env::temp_dir().join("raftlock-test-ports.lock"),
            last = end - 1,
        );
        let mut child = std::process::Command::new("python3")
            .args(["-c", &script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().expect("stdout")),
            &mut line,
        )
        .expect("the child's answer");
        assert_eq!(line.trim(), "held", "the child could not lock its ports");
        let (port, held) = take(first, end, &AtomicU32::new(0)).expect("the fourth port");
        assert_eq!(port, end - 1, "a port the child holds was handed out");
        drop(held);
        // Killed, not asked: the kernel drops the locks of a process that
        // ends however it ends.
        child.kill().expect("kill");
        child.wait().expect("wait");
        let (port, _held) = take(first, end, &AtomicU32::new(0)).expect("a port");
        assert_eq!(port, first, "the dead child's port is free again");
    }
}
