//! Command supervision: hold a lock, semaphore or leadership while a
//! command runs, stop the command when the lease may be lost, and give back
//! what was held afterwards.

use std::time::Duration;

use raftlock_client::{Client, Error, Fence, Guard, Session, SessionOptions};

use crate::cli::HoldArgs;

/// Exit code: the lock was not granted in time.
pub const NOT_ACQUIRED: u8 = 3;
/// Exit code: the lease may have been lost while the command ran.
pub const LEASE_LOST: u8 = 4;

pub fn timeout(hold: &HoldArgs) -> Option<Duration> {
    hold.timeout.map(|t| Duration::from_secs_f64(t.max(0.0)))
}

pub async fn open(client: &Client, hold: &HoldArgs) -> Result<Session, Error> {
    if !(hold.end_on_disconnect.is_finite() && (0.0..=60.0).contains(&hold.end_on_disconnect)) {
        return Err(Error::InvalidArgument(format!(
            "--end-on-disconnect must be 0..=60 seconds, got {}",
            hold.end_on_disconnect
        )));
    }
    if !(hold.ttl.is_finite() && hold.ttl > 0.0) {
        return Err(Error::InvalidArgument(format!(
            "--ttl must be positive, got {}",
            hold.ttl
        )));
    }
    client
        .session_with(SessionOptions {
            ttl: Duration::from_secs_f64(hold.ttl),
            end_on_disconnect: (hold.end_on_disconnect > 0.0)
                .then(|| Duration::from_secs_f64(hold.end_on_disconnect)),
            ..SessionOptions::default()
        })
        .await
}

pub async fn not_acquired(e: Error, name: &str, session: &Session) -> Result<u8, Error> {
    session.close().await.ok();
    match e {
        Error::NotAcquired(t) => {
            eprintln!(
                "raftlock: {name} not acquired within {:.1} s",
                t.as_secs_f64()
            );
            Ok(NOT_ACQUIRED)
        }
        e => Err(e),
    }
}

pub async fn hold_and_run(
    session: Session,
    guard: Result<Guard, Error>,
    name: &str,
    hold: &HoldArgs,
) -> Result<u8, Error> {
    let guard = match guard {
        Ok(g) => g,
        Err(e) => return not_acquired(e, name, &session).await,
    };
    let code = run_child(&session, name, guard.fence(), &hold.command, &[]).await;
    finish(&session, Some(guard)).await;
    code
}

/// As [`hold_and_run`] with the guards of one atomic request: the first
/// name and fence in `RAFTLOCK_NAME` and `RAFTLOCK_FENCE`, every grant in
/// `RAFTLOCK_FENCES` ("FENCE NAME", one per line, in the order given).
pub async fn hold_all_and_run(
    session: Session,
    guards: Result<Vec<Guard>, Error>,
    names: &[String],
    hold: &HoldArgs,
) -> Result<u8, Error> {
    let all = names.join(", ");
    let guards = match guards {
        Ok(g) if !g.is_empty() => g,
        Ok(_) => return Err(Error::InvalidArgument("no lock name".into())),
        Err(e) => return not_acquired(e, &all, &session).await,
    };
    let fences: String = guards
        .iter()
        .map(|g| format!("{} {}\n", g.fence(), g.name()))
        .collect();
    let code = run_child(
        &session,
        guards[0].name(),
        guards[0].fence(),
        &hold.command,
        &[("RAFTLOCK_FENCES", fences)],
    )
    .await;
    if session.is_valid() {
        for g in guards {
            g.release().await.ok();
        }
    }
    finish(&session, None).await;
    code
}

/// Gives back what was held, unless the lease is already gone (then the
/// cluster has released it, or will at expiry, and there may be nobody to
/// answer).
pub async fn finish(session: &Session, guard: Option<Guard>) {
    if !session.is_valid() {
        return;
    }
    if let Some(g) = guard {
        g.release().await.ok();
    }
    session.close().await.ok();
}

/// Runs the command with the fence in its environment. If the lease may
/// be lost meanwhile, says so and sends the command SIGTERM.
pub async fn run_child(
    session: &Session,
    name: &str,
    fence: Fence,
    command: &[String],
    extra_env: &[(&str, String)],
) -> Result<u8, Error> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| Error::InvalidArgument("no command".into()))?;
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env("RAFTLOCK_FENCE", fence.to_string())
        .env("RAFTLOCK_NAME", name)
        .env("RAFTLOCK_SESSION", session.id().to_string())
        .envs(extra_env.iter().map(|(k, v)| (*k, v.as_str())));
    crate::signals::terminate_with_parent(&mut command);
    let mut child = command
        .spawn()
        .map_err(|e| Error::InvalidArgument(format!("cannot run {program}: {e}")))?;
    let mut lost = false;
    let status = tokio::select! {
        status = child.wait() => status,
        // Not held (jeopardy included): a child cannot be told to pause,
        // so it is stopped at the first doubt.
        _ = session.invalid() => {
            lost = true;
            eprintln!("raftlock: lease on {name} may be lost; sending SIGTERM to {program}");
            crate::signals::terminate(&child);
            child.wait().await
        }
        _ = crate::signals::shutdown() => {
            crate::signals::terminate(&child);
            child.wait().await
        }
    }
    .map_err(|e| Error::Internal(format!("waiting for {program}: {e}")))?;
    if lost {
        return Ok(LEASE_LOST);
    }
    Ok(exit_code(status))
}

pub fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(s)) => 128u8.wrapping_add(s as u8),
        _ => 1,
    }
}
