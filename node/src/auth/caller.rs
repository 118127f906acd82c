//! The caller of a request: who it is (token or certificate) and what the
//! ACL lets it do.

use std::sync::{Arc, RwLock};

use super::acl::Credential;
use super::AuthError as Error;
use super::{Acl, Permission};

/// The node's access control: `None` when off. The ACL inside can be
/// replaced at run time (`SIGHUP` reloads the file); long-lived streams
/// watch [`changes`](Auth::changes) and check their credentials again.
#[derive(Debug)]
pub struct Auth {
    acl: RwLock<Option<Arc<Acl>>>,
    /// Bumped on every replacement.
    generation: tokio::sync::watch::Sender<u64>,
}

impl Default for Auth {
    fn default() -> Self {
        Auth::new(None)
    }
}

impl Auth {
    /// Access control with `acl`, or off.
    pub fn new(acl: Option<Acl>) -> Auth {
        Auth {
            acl: RwLock::new(acl.map(Arc::new)),
            generation: tokio::sync::watch::channel(0).0,
        }
    }

    /// A receiver that sees every replacement of the ACL.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// The current ACL, or `None` if access control is off.
    pub fn current(&self) -> Option<Arc<Acl>> {
        self.acl.read().expect("acl lock poisoned").clone()
    }

    /// Replaces the ACL (only when access control is on: it cannot be
    /// switched on or off at run time).
    pub fn replace(&self, acl: Acl) -> Result<(), String> {
        let mut current = self.acl.write().expect("acl lock poisoned");
        if current.is_none() {
            return Err("access control is off on this node; restart it to turn it on".into());
        }
        *current = Some(Arc::new(acl));
        drop(current);
        self.generation.send_modify(|g| *g += 1);
        Ok(())
    }

    /// `caller` again under the ACL in force now: the same identity, with
    /// the current rules, if the credential it authenticated with still
    /// names it; `UNAUTHENTICATED` if it was revoked (for streams opened
    /// before a reload).
    pub fn recheck(&self, caller: &Caller) -> Result<Caller, Error> {
        let Some(acl) = self.current() else {
            return Ok(caller.clone());
        };
        match &caller.credential {
            Some(c) if acl.still_identifies(c, &caller.identity) => Ok(Caller {
                identity: caller.identity.clone(),
                acl: Some(acl),
                credential: caller.credential.clone(),
            }),
            _ => Err(Error::Unauthenticated(format!(
                "the credentials this stream was opened with were revoked (the ACL was reloaded \
                 and no longer gives them identity {:?})",
                caller.identity
            ))),
        }
    }

    /// What a request to the Raft service authenticates with (`None`
    /// without access control, or without credentials).
    pub fn peer_credential<T>(&self, req: &tonic::Request<T>) -> Option<Credential> {
        let acl = self.current()?;
        with_leaf_cert(req, |leaf| acl.peer_credential(req.metadata(), leaf))
    }

    /// Whether a Raft stream opened with `credential` may go on under the
    /// ACL in force now.
    pub fn still_peer(&self, credential: Option<&Credential>) -> bool {
        match (self.current(), credential) {
            (None, _) => true,
            (Some(acl), Some(c)) => acl.accepts_peer(c),
            (Some(_), None) => false,
        }
    }

    /// Identifies the caller of a request.
    pub fn caller<T>(&self, req: &tonic::Request<T>) -> Result<Caller, Error> {
        let Some(acl) = self.current() else {
            return Ok(Caller::unrestricted());
        };
        let (identity, credential) =
            with_leaf_cert(req, |leaf| acl.identify_with(req.metadata(), leaf))?;
        Ok(Caller {
            identity,
            acl: Some(acl),
            credential: Some(credential),
        })
    }

    /// Checks that a request on the Raft service comes from a peer.
    pub fn check_peer<T>(&self, req: &tonic::Request<T>) -> Result<(), Error> {
        let Some(acl) = self.current() else {
            return Ok(());
        };
        if with_leaf_cert(req, |leaf| acl.is_peer(req.metadata(), leaf)) {
            Ok(())
        } else {
            Err(Error::Unauthenticated(
                "the Raft service is for cluster nodes: present the peer_token or a peer \
                 certificate"
                    .into(),
            ))
        }
    }
}

/// Runs `f` with the DER of the certificate the request's connection
/// presented, if any (mTLS). None for a request another node forwarded
/// (`raftlock-forwarded-by`): the certificate on its connection is that
/// node's, not the client's, so only its bearer token may identify it.
fn with_leaf_cert<T, R>(req: &tonic::Request<T>, f: impl FnOnce(Option<&[u8]>) -> R) -> R {
    if req.metadata().contains_key(raftlock_proto::FORWARDED_KEY) {
        return f(None);
    }
    let certs = req.peer_certs();
    f(certs.as_ref().and_then(|c| c.first()).map(|c| c.as_ref()))
}

/// An identified caller. Without access control its identity is empty and
/// it may do everything.
#[derive(Clone, Debug)]
pub struct Caller {
    /// The identity (empty without access control).
    pub identity: String,
    pub(super) acl: Option<Arc<Acl>>,
    /// What it authenticated with (`None` without access control).
    pub(super) credential: Option<Credential>,
}

impl Caller {
    /// A caller with every permission (access control off).
    pub fn unrestricted() -> Caller {
        Caller {
            identity: String::new(),
            acl: None,
            credential: None,
        }
    }

    fn denied(&self, need: Permission, what: &str) -> Error {
        Error::PermissionDenied(format!(
            "identity {:?} has no `{}` permission on {what}",
            self.identity,
            need.as_str()
        ))
    }

    /// Needs `need` on the name `name`.
    pub fn require_name(&self, need: Permission, name: &str) -> Result<(), Error> {
        match &self.acl {
            Some(acl) if !acl.allows_name(&self.identity, need, name) => {
                Err(self.denied(need, &format!("{name:?}")))
            }
            _ => Ok(()),
        }
    }

    /// Needs `need` on every name starting with `prefix`.
    pub fn require_prefix(&self, need: Permission, prefix: &str) -> Result<(), Error> {
        match &self.acl {
            Some(acl) if !acl.allows_name(&self.identity, need, prefix) => {
                Err(self.denied(need, &format!("every name starting with {prefix:?}")))
            }
            _ => Ok(()),
        }
    }

    /// Needs `need` on some names.
    pub fn require_any(&self, need: Permission) -> Result<(), Error> {
        match &self.acl {
            Some(acl) if !acl.allows_any(&self.identity, need) => {
                Err(self.denied(need, "any name"))
            }
            _ => Ok(()),
        }
    }

    /// Needs `admin` on everything (cluster operations).
    pub fn require_admin(&self) -> Result<(), Error> {
        match &self.acl {
            Some(acl) if !acl.allows_name(&self.identity, Permission::Admin, "") => {
                Err(Error::PermissionDenied(format!(
                    "identity {:?} needs `admin` on the empty prefix (every name) for cluster \
                     operations",
                    self.identity
                )))
            }
            _ => Ok(()),
        }
    }
}
