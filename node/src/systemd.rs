//! systemd's notification protocol (`sd_notify(3)`), written out: one
//! datagram of `KEY=VALUE` lines to the Unix socket named by
//! `NOTIFY_SOCKET`. A unit with `Type=notify` counts the node started at
//! `READY=1`; with `WatchdogSec=` it restarts the node when `WATCHDOG=1`
//! stops coming.
//!
//! Both come from the node's one view of itself ([`Leadership`]):
//! `READY=1` the first time the view says it can serve (its core runs and
//! it knows a leader, [`View::serving`](crate::leader::View::serving));
//! `WATCHDOG=1` every half watchdog interval while the view says the core
//! runs *and* the core answers a round trip within that half interval
//! ([`Leadership::core_responds`]), so a node whose core or runtime hangs
//! stops feeding the watchdog and is restarted. `STATUS=` follows the
//! view (role, term, leader), for `systemctl status`.

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::Arc;
use std::time::Duration;

use crate::leader::{Leadership, View};

/// Where the node's notifications go.
pub struct Notifier {
    socket: UnixDatagram,
    to: SocketAddr,
}

impl Notifier {
    /// The notifier `NOTIFY_SOCKET` names (`None` when it is not set: not
    /// started by systemd with `Type=notify`). An absolute path or, on
    /// Linux, `@name` for an abstract socket; anything else is an error
    /// naming the variable.
    pub fn from_env() -> Result<Option<Notifier>, String> {
        match std::env::var_os("NOTIFY_SOCKET") {
            None => Ok(None),
            Some(v) if v.is_empty() => Ok(None),
            Some(v) => Notifier::new(&v.to_string_lossy()).map(Some),
        }
    }

    /// A notifier that writes to the socket `name` (as in `NOTIFY_SOCKET`).
    pub fn new(name: &str) -> Result<Notifier, String> {
        let bad = |e: &dyn std::fmt::Display| format!("NOTIFY_SOCKET={name:?}: {e}");
        let to = if let Some(abstract_name) = name.strip_prefix('@') {
            #[cfg(target_os = "linux")]
            {
                use std::os::linux::net::SocketAddrExt as _;
                SocketAddr::from_abstract_name(abstract_name.as_bytes()).map_err(|e| bad(&e))?
            }
            #[cfg(not(target_os = "linux"))]
            {
                let _ = abstract_name;
                return Err(bad(&"abstract sockets exist on Linux only"));
            }
        } else if name.starts_with('/') {
            SocketAddr::from_pathname(name).map_err(|e| bad(&e))?
        } else {
            return Err(bad(
                &"not an absolute path or an @abstract name (systemd sets it so)",
            ));
        };
        let socket = UnixDatagram::unbound().map_err(|e| bad(&e))?;
        socket.set_nonblocking(true).map_err(|e| bad(&e))?;
        Ok(Notifier { socket, to })
    }

    /// Sends `state` (`KEY=VALUE` lines) in one datagram.
    pub fn send(&self, state: &str) -> io::Result<()> {
        self.socket
            .send_to_addr(state.as_bytes(), &self.to)
            .map(|_| ())
    }
}

/// The watchdog interval systemd asks for (`WATCHDOG_USEC`), if it is
/// meant for this process (`WATCHDOG_PID` unset or this process's id).
pub fn watchdog_from_env() -> Option<Duration> {
    if let Ok(pid) = std::env::var("WATCHDOG_PID") {
        if pid.trim() != std::process::id().to_string() {
            return None;
        }
    }
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.trim().parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec))
}

/// The `STATUS=` text of `view`.
fn status_text(view: &View) -> String {
    let leader = match view.leader {
        Some(id) => format!("leader {id}"),
        None => "no leader known".into(),
    };
    match &view.fatal {
        Some(cause) => format!("Raft core stopped: {cause}"),
        None => format!("{}, term {}, {leader}", view.status_role(), view.term),
    }
}

/// Tells systemd about `leadership` until the node is dropped: `READY=1`
/// once it can serve, `STATUS=` on every change, and, with `watchdog`,
/// `WATCHDOG=1` every half interval while its core runs and answers.
pub async fn notify(
    leadership: Arc<Leadership>,
    notifier: Arc<Notifier>,
    watchdog: Option<Duration>,
) {
    let mut views = leadership.watch();
    let mut ready = false;
    let mut status = String::new();
    // Told once each way, not at every tick.
    let mut starving = false;
    let period = watchdog.map(|w| w / 2);
    let mut tick = tokio::time::interval(period.unwrap_or(Duration::from_secs(3600)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let view = views.borrow_and_update().clone();
        let mut say = Vec::new();
        if !ready && view.serving() {
            ready = true;
            say.push("READY=1".to_string());
        }
        let now = status_text(&view);
        if now != status {
            status = now;
            say.push(format!("STATUS={status}"));
        }
        if !say.is_empty() {
            if let Err(e) = notifier.send(&say.join("\n")) {
                tracing::warn!(error = %e, "cannot notify systemd");
            }
        }
        tokio::select! {
            changed = views.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = tick.tick(), if period.is_some() => {
                let period = period.unwrap_or_default();
                let alive = leadership.view().alive()
                    && leadership.core_responds(period).await;
                if alive {
                    if starving {
                        tracing::info!("the Raft core answers again; feeding systemd's watchdog");
                        starving = false;
                    }
                    if let Err(e) = notifier.send("WATCHDOG=1") {
                        tracing::warn!(error = %e, "cannot notify systemd's watchdog");
                    }
                } else if !starving {
                    starving = true;
                    tracing::error!(
                        within = ?period,
                        "the Raft core does not run or does not answer; no longer feeding \
                         systemd's watchdog (systemd restarts the node when it runs out)"
                    );
                }
            }
        }
    }
}
