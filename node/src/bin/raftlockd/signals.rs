//! Signals: SIGHUP reloads the ACL file and TLS; SIGINT and SIGTERM stop.

use std::path::PathBuf;
use std::sync::Arc;

use raftlock_node::auth::Auth;
use raftlock_node::config::Config;

/// What `SIGHUP` reloads.
pub(super) struct Reload {
    /// The node's access control.
    pub(super) auth: Arc<Auth>,
    /// The ACL file, if access control is on.
    pub(super) acl_file: Option<PathBuf>,
    /// The node's TLS, if on.
    pub(super) tls: Option<Arc<raftlock_node::tls::NodeTls>>,
    /// Where the TLS files are.
    pub(super) settings: Config,
}

/// SIGHUPs, caught from the moment this is made: made before the node
/// binds its ports, so that a reload sent as soon as the port answers
/// (a service manager's, right after a start) does not end the process.
pub(super) struct Hangups {
    #[cfg(unix)]
    signal: Option<tokio::signal::unix::Signal>,
}

impl Hangups {
    /// Catches SIGHUP from now on (the reloads wait until the node runs).
    pub(super) fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let signal = signal(SignalKind::hangup())
                .map_err(|e| {
                    tracing::warn!(%e, "cannot install a SIGHUP handler; nothing will be reloaded")
                })
                .ok();
            Hangups { signal }
        }
        #[cfg(not(unix))]
        Hangups {}
    }
}

/// On every SIGHUP: reloads the ACL file (a file that does not parse is
/// logged and the ACL in force stays; streams whose credentials the new one
/// drops end at once) and the TLS certificate, key and CA (files the node
/// would refuse at start are logged and the TLS in force stays; the new
/// ones apply to connections made from then on).
pub(super) async fn reload_on_sighup(hangups: Hangups, reload: Reload) {
    #[cfg(unix)]
    {
        let Some(mut hup) = hangups.signal else {
            return;
        };
        while hup.recv().await.is_some() {
            if let Some(path) = &reload.acl_file {
                match raftlock_node::auth::Acl::load(path) {
                    Ok(acl) => {
                        let rules = acl.rules().len();
                        match reload.auth.replace(acl) {
                            Ok(()) => tracing::info!(path = %path.display(), rules, "ACL reloaded"),
                            Err(e) => tracing::warn!(%e, "ACL not reloaded"),
                        }
                    }
                    Err(e) => {
                        tracing::error!(%e, "ACL not reloaded; the previous one stays in force")
                    }
                }
            }
            if let Some(tls) = &reload.tls {
                let loaded = match reload.settings.tls() {
                    Ok(Some(options)) => tls.reload(options),
                    Ok(None) => Err("the TLS settings are gone".into()),
                    Err(e) => Err(e.to_string()),
                };
                match loaded {
                    Ok(()) => tracing::info!(
                        "TLS reloaded: connections made from now on get the new certificate and CA"
                    ),
                    Err(e) => tracing::error!(
                        error = %e,
                        "TLS not reloaded; the certificate, key and CA in force stay"
                    ),
                }
            }
            if reload.acl_file.is_none() && reload.tls.is_none() {
                tracing::info!("SIGHUP: nothing to reload (no ACL file, no TLS)");
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (hangups, reload);
    }
}

pub(super) async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
