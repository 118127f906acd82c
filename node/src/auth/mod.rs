//! Access control: who is calling, and what they may do.
//!
//! Off unless a node is started with an ACL file (`acl_file`). When on,
//! every request on the public services carries an identity:
//!
//! - a bearer token (`authorization: Bearer TOKEN` metadata) listed in the
//!   file, which names its identity; or
//! - without a token, the common name (CN) of the client certificate the
//!   connection presented (mTLS: the TLS layer has already verified it
//!   against the CA).
//!
//! Rules grant `read`, `lock` or `admin` on name prefixes; each permission
//! includes the ones before it. A rule's identity `*` means every
//! authenticated identity. Everything no rule allows is refused:
//! `UNAUTHENTICATED` when the request carries no valid credentials,
//! `PERMISSION_DENIED` when it does. Cluster operations (membership,
//! backup, restore) need `admin` on the empty prefix, i.e. on everything.
//!
//! Sessions belong to the identity that opened them; the lock table checks
//! that every request on a session comes from that identity (see
//! `Refusal::NotOwner`).
//!
//! Nodes authenticate to each other's Raft service with the file's
//! `peer_token` (every node's file carries the same one; a node also
//! accepts those in `accept_peer_tokens`, for a rotation) or with a
//! certificate whose CN is listed in `peer_subjects`.
//!
//! A reload ([`Auth::replace`]) applies to every request after it, and to
//! the streams already open: they watch [`Auth::changes`] and end at once
//! (`UNAUTHENTICATED`) when the credentials they were opened with no longer
//! hold ([`Auth::recheck`], [`Auth::still_peer`]).

mod acl;
mod caller;
mod cert;
#[cfg(test)]
mod tests;

pub use acl::{token_sha256_hex, Acl, AclError, Credential, Permission, Rule};
pub use caller::{Auth, Caller};
pub use cert::subject_common_name;

/// Why access control refused a request. Its own type, mapped to the node's
/// error at the edge (`crate::error`), so that this module depends on
/// nothing above it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No valid credentials (no or unknown bearer token, no usable client
    /// certificate): `UNAUTHENTICATED`.
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller is known but no rule allows the request:
    /// `PERMISSION_DENIED`.
    #[error("{0}")]
    PermissionDenied(String),
}

/// Metadata key carrying the credentials.
pub const AUTHORIZATION: &str = "authorization";

/// Shortest `peer_token` accepted: a guessable peer token would let anyone
/// who reaches the port rewrite the Raft log.
pub const MIN_PEER_TOKEN_LEN: usize = 16;
