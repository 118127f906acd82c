//! Every signal the CLI sends, receives or arranges, in one place; the
//! only `unsafe` in the client.

use nix::sys::signal::{self, SigHandler, Signal};
use nix::unistd::{getppid, Pid};

/// Writes `args` and a newline to stdout. If stdout is closed
/// (`raftlock list | head`), the process ends as other command-line tools
/// do on a write to a closed pipe: by SIGPIPE's default action, raised for
/// stdout only. SIGPIPE itself stays ignored (Rust's default), so a node
/// that drops a connection mid-write is an error the CLI reports, never a
/// silent death (exit 141 with no output, before issue 31).
pub fn write_stdout(args: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let written = out
        .write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => die_of_sigpipe(),
        Err(e) => {
            eprintln!("raftlock: cannot write to stdout: {e}");
            std::process::exit(1);
        }
    }
}

/// Ends the process by SIGPIPE, as a write to a closed pipe ends a process
/// that does not ignore it.
#[allow(unsafe_code)]
fn die_of_sigpipe() -> ! {
    // SAFETY: SigDfl installs no handler; the process is ending, and any
    // other thread's write to a closed socket from now on ends it the same
    // way.
    unsafe {
        signal::signal(Signal::SIGPIPE, SigHandler::SigDfl).ok();
    }
    signal::raise(Signal::SIGPIPE).ok();
    std::process::exit(128 + Signal::SIGPIPE as i32)
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
