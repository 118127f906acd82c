//! Every signal the CLI sends, receives or arranges, in one place; the
//! only `unsafe` in the client.

use nix::sys::signal::{self, SigHandler, Signal};
use nix::unistd::{getppid, Pid};

/// Restores the default action of SIGPIPE, so that `raftlock list | head`
/// ends quietly, like other command-line tools, instead of panicking in
/// `println!` (Rust ignores SIGPIPE by default).
#[allow(unsafe_code)]
pub fn default_sigpipe() {
    // SAFETY: called first thing in main, before any other thread exists
    // that could rely on SIGPIPE's disposition; SigDfl installs no handler.
    unsafe {
        signal::signal(Signal::SIGPIPE, SigHandler::SigDfl).ok();
    }
}

/// Arranges for `command`'s process to get SIGTERM when raftlock dies
/// (SIGKILL, OOM), so it cannot go on running as if it held the lock.
///
/// The kernel ties the signal to the thread that forks; tokio forks on a
/// runtime worker, which lives as long as raftlock.
#[allow(unsafe_code)]
pub fn terminate_with_parent(command: &mut tokio::process::Command) {
    let parent = Pid::this();
    // SAFETY: between fork and exec the closure makes only
    // async-signal-safe system calls (prctl, getppid, kill/raise) and
    // allocates nothing.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
            // raftlock died before the line above: act on it now.
            if getppid() != parent {
                signal::raise(Signal::SIGTERM)?;
            }
            Ok(())
        });
    }
}

/// Sends SIGTERM to a child we spawned and have not reaped yet.
pub fn terminate(child: &tokio::process::Child) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        signal::kill(Pid::from_raw(pid), Signal::SIGTERM).ok();
    }
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
