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
//! `peer_token` (every node's file carries the same one) or with a
//! certificate whose CN is listed in `peer_subjects`.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use serde::Deserialize;
use tonic::metadata::MetadataMap;

use crate::error::Error;
use crate::state::limits::MAX_OWNER_LEN;

/// Metadata key carrying the credentials.
pub const AUTHORIZATION: &str = "authorization";

/// Shortest `peer_token` accepted: a guessable peer token would let anyone
/// who reaches the port rewrite the Raft log.
pub const MIN_PEER_TOKEN_LEN: usize = 16;

/// What a rule allows, each level including the ones below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Permission {
    /// Describe, list, watch and check fences on matching names; cluster
    /// status and members.
    Read,
    /// Open sessions; acquire and release matching names.
    Lock,
    /// Everything on matching names; on the empty prefix also membership
    /// changes, backup and restore.
    Admin,
}

impl Permission {
    fn as_str(self) -> &'static str {
        match self {
            Permission::Read => "read",
            Permission::Lock => "lock",
            Permission::Admin => "admin",
        }
    }
}

/// The ACL file, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AclFile {
    peer_token: Option<String>,
    #[serde(default)]
    peer_subjects: Vec<String>,
    #[serde(default)]
    token: Vec<TokenEntry>,
    #[serde(default)]
    rule: Vec<RuleEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    identity: String,
    /// The token itself.
    token: Option<String>,
    /// Or its SHA-256, hex (so the file need not hold the secret).
    sha256: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleEntry {
    identity: String,
    allow: Permission,
    #[serde(default)]
    prefix: String,
}

/// A rule: `identity` (or `*`) has `allow` on names starting with `prefix`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// An identity, or `*` for all authenticated ones.
    pub identity: String,
    /// The permission granted.
    pub allow: Permission,
    /// Names it applies to (empty: all).
    pub prefix: String,
}

/// An ACL file that cannot be used, with the reason.
#[derive(Debug, thiserror::Error)]
#[error("access control file {path}: {reason}")]
pub struct AclError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong.
    pub reason: String,
}

/// A parsed, checked ACL.
#[derive(Debug)]
pub struct Acl {
    /// SHA-256 of each token → its identity.
    tokens: HashMap<[u8; 32], String>,
    rules: Vec<Rule>,
    peer_token: String,
    peer_subjects: BTreeSet<String>,
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// The SHA-256 of `token` in hex, as the ACL file's `sha256` wants it.
pub fn token_sha256_hex(token: &str) -> String {
    sha256(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn valid_identity(identity: &str) -> Result<(), String> {
    if identity.is_empty() || identity.len() > MAX_OWNER_LEN {
        return Err(format!(
            "identity {identity:?} must be 1..={MAX_OWNER_LEN} bytes"
        ));
    }
    Ok(())
}

impl Acl {
    /// Reads and checks the file at `path`.
    pub fn load(path: &Path) -> Result<Acl, AclError> {
        let text = std::fs::read_to_string(path).map_err(|e| AclError {
            path: path.to_path_buf(),
            reason: format!("cannot read: {e}"),
        })?;
        Acl::parse(&text).map_err(|reason| AclError {
            path: path.to_path_buf(),
            reason,
        })
    }

    /// Parses and checks an ACL file's text.
    pub fn parse(text: &str) -> Result<Acl, String> {
        let file: AclFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let peer_token = file.peer_token.unwrap_or_default();
        if peer_token.len() < MIN_PEER_TOKEN_LEN {
            return Err(format!(
                "peer_token must be set, at least {MIN_PEER_TOKEN_LEN} characters \
                 (the same on every node): nodes use it to authenticate to each other"
            ));
        }
        let mut tokens = HashMap::new();
        for (i, t) in file.token.iter().enumerate() {
            valid_identity(&t.identity).map_err(|e| format!("token #{}: {e}", i + 1))?;
            let hash = match (&t.token, &t.sha256) {
                (Some(token), None) if !token.is_empty() => sha256(token.as_bytes()),
                (None, Some(hex)) => parse_hex32(hex).ok_or_else(|| {
                    format!(
                        "token #{} ({}): sha256 must be 64 hex digits",
                        i + 1,
                        t.identity
                    )
                })?,
                _ => {
                    return Err(format!(
                        "token #{} ({}): give exactly one of a non-empty `token` or `sha256`",
                        i + 1,
                        t.identity
                    ))
                }
            };
            if hash == sha256(peer_token.as_bytes()) {
                return Err(format!(
                    "token #{} ({}) is the peer_token; give clients their own tokens",
                    i + 1,
                    t.identity
                ));
            }
            if let Some(other) = tokens.insert(hash, t.identity.clone()) {
                return Err(format!(
                    "token #{} ({}) is also the token of {other}: tokens must be unique",
                    i + 1,
                    t.identity
                ));
            }
        }
        let mut rules = Vec::with_capacity(file.rule.len());
        for (i, r) in file.rule.into_iter().enumerate() {
            if r.identity != "*" {
                valid_identity(&r.identity).map_err(|e| format!("rule #{}: {e}", i + 1))?;
            }
            rules.push(Rule {
                identity: r.identity,
                allow: r.allow,
                prefix: r.prefix,
            });
        }
        Ok(Acl {
            tokens,
            rules,
            peer_token,
            peer_subjects: file.peer_subjects.into_iter().collect(),
        })
    }

    /// The token nodes present to each other.
    pub fn peer_token(&self) -> &str {
        &self.peer_token
    }

    /// The rules, in file order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Who sent a request with `metadata` over a connection that presented
    /// `cert` (the leaf certificate, DER), if any.
    pub fn identify(&self, metadata: &MetadataMap, cert: Option<&[u8]>) -> Result<String, Error> {
        if let Some(token) = bearer(metadata)? {
            return self
                .tokens
                .get(&sha256(token.as_bytes()))
                .cloned()
                .ok_or_else(|| Error::Unauthenticated("unknown bearer token".into()));
        }
        match cert.map(subject_common_name) {
            Some(Some(cn)) if valid_identity(&cn).is_ok() => Ok(cn),
            Some(_) => Err(Error::Unauthenticated(
                "the client certificate has no usable subject common name (CN)".into(),
            )),
            None => Err(Error::Unauthenticated(
                "access control is on: send a bearer token (metadata `authorization: Bearer \
                 TOKEN`) or connect with a client certificate"
                    .into(),
            )),
        }
    }

    /// True if the request may call the Raft service: the peer token, or a
    /// certificate whose CN is a listed peer subject.
    pub fn is_peer(&self, metadata: &MetadataMap, cert: Option<&[u8]>) -> bool {
        match bearer(metadata) {
            Ok(Some(token)) => sha256(token.as_bytes()) == sha256(self.peer_token.as_bytes()),
            Ok(None) => cert
                .and_then(subject_common_name)
                .is_some_and(|cn| self.peer_subjects.contains(&cn)),
            Err(_) => false,
        }
    }

    fn rules_for<'a>(&'a self, identity: &'a str) -> impl Iterator<Item = &'a Rule> + 'a {
        self.rules
            .iter()
            .filter(move |r| r.identity == "*" || r.identity == identity)
    }

    /// True if `identity` has `need` (or more) on the name `name`. Also
    /// answers for every name starting with a prefix: a prefix is covered
    /// when some rule's prefix is a prefix of it.
    pub fn allows_name(&self, identity: &str, need: Permission, name: &str) -> bool {
        self.rules_for(identity)
            .any(|r| r.allow >= need && name.starts_with(&r.prefix))
    }

    /// True if `identity` has `need` on some names.
    pub fn allows_any(&self, identity: &str, need: Permission) -> bool {
        self.rules_for(identity).any(|r| r.allow >= need)
    }
}

/// The bearer token in `metadata`, if any; a malformed header is an error.
fn bearer(metadata: &MetadataMap) -> Result<Option<&str>, Error> {
    let Some(value) = metadata.get(AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| Error::Unauthenticated("authorization metadata is not ASCII".into()))?;
    match value.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() => {
            Ok(Some(token.trim()))
        }
        _ => Err(Error::Unauthenticated(
            "authorization metadata must be `Bearer TOKEN`".into(),
        )),
    }
}

/// The node's access control: `None` when off. The ACL inside can be
/// replaced at run time (`SIGHUP` reloads the file).
#[derive(Debug, Default)]
pub struct Auth {
    acl: RwLock<Option<Arc<Acl>>>,
}

impl Auth {
    /// Access control with `acl`, or off.
    pub fn new(acl: Option<Acl>) -> Auth {
        Auth {
            acl: RwLock::new(acl.map(Arc::new)),
        }
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
        Ok(())
    }

    /// Identifies the caller of a request.
    pub fn caller<T>(&self, req: &tonic::Request<T>) -> Result<Caller, Error> {
        let Some(acl) = self.current() else {
            return Ok(Caller {
                identity: String::new(),
                acl: None,
            });
        };
        let identity = with_leaf_cert(req, |leaf| acl.identify(req.metadata(), leaf))?;
        Ok(Caller {
            identity,
            acl: Some(acl),
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
/// presented, if any (mTLS).
fn with_leaf_cert<T, R>(req: &tonic::Request<T>, f: impl FnOnce(Option<&[u8]>) -> R) -> R {
    let certs = req.peer_certs();
    f(certs.as_ref().and_then(|c| c.first()).map(|c| c.as_ref()))
}

/// An identified caller. Without access control its identity is empty and
/// it may do everything.
#[derive(Clone, Debug)]
pub struct Caller {
    /// The identity (empty without access control).
    pub identity: String,
    acl: Option<Arc<Acl>>,
}

impl Caller {
    /// A caller with every permission (access control off).
    pub fn unrestricted() -> Caller {
        Caller {
            identity: String::new(),
            acl: None,
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

// ---- A minimal DER reader: just enough to find a certificate's subject CN.

/// Reads one DER element at the front of `input`: (tag, contents, rest).
fn der_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
/// 2.5.4.3, id-at-commonName.
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];

/// The first common name (CN) in a DER certificate's subject.
pub fn subject_common_name(cert: &[u8]) -> Option<String> {
    let (SEQUENCE, certificate, _) = der_element(cert)? else {
        return None;
    };
    let (SEQUENCE, tbs, _) = der_element(certificate)? else {
        return None;
    };
    let mut rest = tbs;
    // Optional [0] version, then serial, signature, issuer, validity, subject.
    let (tag, _, after) = der_element(rest)?;
    if tag == 0xa0 {
        rest = after;
    }
    for _ in 0..4 {
        rest = der_element(rest)?.2;
    }
    let (SEQUENCE, mut subject, _) = der_element(rest)? else {
        return None;
    };
    while !subject.is_empty() {
        let (SET, mut rdn, next) = der_element(subject)? else {
            return None;
        };
        subject = next;
        while !rdn.is_empty() {
            let (SEQUENCE, attribute, next) = der_element(rdn)? else {
                return None;
            };
            rdn = next;
            let (OID, oid, value) = der_element(attribute)? else {
                return None;
            };
            if oid == OID_COMMON_NAME {
                let (tag, text, _) = der_element(value)?;
                // UTF8String, PrintableString, IA5String.
                if matches!(tag, 0x0c | 0x13 | 0x16) {
                    return String::from_utf8(text.to_vec()).ok();
                }
                return None;
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: &str = "peer-secret-0123456789";

    fn acl(rules: &str) -> Acl {
        Acl::parse(&format!(
            "peer_token = \"{PEER}\"\npeer_subjects = [\"node\"]\n\
             [[token]]\nidentity = \"billing\"\ntoken = \"tok-billing\"\n\
             [[token]]\nidentity = \"ops\"\nsha256 = \"{}\"\n{rules}",
            token_sha256_hex("tok-ops")
        ))
        .expect("valid acl")
    }

    fn metadata(auth: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert(AUTHORIZATION, auth.parse().expect("ascii"));
        m
    }

    #[test]
    fn tokens_identify_by_plain_value_or_hash() {
        let acl = acl("");
        assert_eq!(
            acl.identify(&metadata("Bearer tok-billing"), None)
                .expect("known"),
            "billing"
        );
        assert_eq!(
            acl.identify(&metadata("bearer tok-ops"), None)
                .expect("known"),
            "ops"
        );
        for bad in ["Bearer nope", "Basic tok-ops", "Bearer", "tok-ops"] {
            assert!(
                matches!(
                    acl.identify(&metadata(bad), None),
                    Err(Error::Unauthenticated(_))
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            acl.identify(&MetadataMap::new(), None),
            Err(Error::Unauthenticated(_))
        ));
        // The peer token is not a client identity.
        assert!(acl
            .identify(&metadata(&format!("Bearer {PEER}")), None)
            .is_err());
        assert!(acl.is_peer(&metadata(&format!("Bearer {PEER}")), None));
        assert!(!acl.is_peer(&metadata("Bearer tok-ops"), None));
        assert!(!acl.is_peer(&MetadataMap::new(), None));
    }

    #[test]
    fn permissions_nest_and_prefixes_bound_them() {
        let acl = acl(
            "[[rule]]\nidentity = \"billing\"\nallow = \"lock\"\nprefix = \"billing/\"\n\
             [[rule]]\nidentity = \"*\"\nallow = \"read\"\nprefix = \"public/\"\n\
             [[rule]]\nidentity = \"ops\"\nallow = \"admin\"\n",
        );
        use Permission::*;
        assert!(acl.allows_name("billing", Lock, "billing/invoice"));
        assert!(acl.allows_name("billing", Read, "billing/invoice"));
        assert!(!acl.allows_name("billing", Admin, "billing/invoice"));
        assert!(!acl.allows_name("billing", Lock, "shipping/x"));
        assert!(!acl.allows_name("billing", Lock, "billing"));
        // `*` applies to every identity, but only what it grants.
        assert!(acl.allows_name("billing", Read, "public/a"));
        assert!(acl.allows_name("someone", Read, "public/a"));
        assert!(!acl.allows_name("someone", Lock, "public/a"));
        // Listing needs the whole prefix covered.
        assert!(acl.allows_name("billing", Read, "billing/"));
        assert!(acl.allows_name("billing", Read, "billing/2026"));
        assert!(!acl.allows_name("billing", Read, "bill"));
        assert!(!acl.allows_name("billing", Read, ""));
        assert!(acl.allows_any("billing", Lock));
        assert!(!acl.allows_any("someone", Lock));
        assert!(acl.allows_name("ops", Admin, ""));
        assert!(acl.allows_name("ops", Lock, "anything"));
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        let cases = [
            ("", "peer_token"),
            ("peer_token = \"short\"", "peer_token"),
            (
                &format!("peer_token = \"{PEER}\"\n[[token]]\nidentity = \"a\"\n"),
                "exactly one",
            ),
            (
                &format!(
                    "peer_token = \"{PEER}\"\n[[token]]\nidentity = \"a\"\ntoken = \"t\"\nsha256 = \"00\"\n"
                ),
                "exactly one",
            ),
            (
                &format!("peer_token = \"{PEER}\"\n[[token]]\nidentity = \"a\"\nsha256 = \"zz\"\n"),
                "64 hex",
            ),
            (
                &format!(
                    "peer_token = \"{PEER}\"\n[[token]]\nidentity = \"a\"\ntoken = \"t\"\n\
                     [[token]]\nidentity = \"b\"\ntoken = \"t\"\n"
                ),
                "unique",
            ),
            (
                &format!("peer_token = \"{PEER}\"\n[[token]]\nidentity = \"a\"\ntoken = \"{PEER}\"\n"),
                "peer_token",
            ),
            (
                &format!("peer_token = \"{PEER}\"\n[[token]]\nidentity = \"\"\ntoken = \"t\"\n"),
                "identity",
            ),
            (
                &format!("peer_token = \"{PEER}\"\n[[rule]]\nidentity = \"a\"\nallow = \"write\"\n"),
                "allow",
            ),
            (&format!("peer_token = \"{PEER}\"\nsurprise = 1\n"), "surprise"),
        ];
        for (text, needle) in cases {
            let err = Acl::parse(text).expect_err(text);
            assert!(err.contains(needle), "{text:?}: {err}");
        }
        let longest = "i".repeat(MAX_OWNER_LEN);
        assert!(Acl::parse(&format!(
            "peer_token = \"{PEER}\"\n[[token]]\nidentity = \"{longest}\"\ntoken = \"t\"\n"
        ))
        .is_ok());
        assert!(Acl::parse(&format!(
            "peer_token = \"{PEER}\"\n[[token]]\nidentity = \"{longest}i\"\ntoken = \"t\"\n"
        ))
        .is_err());
    }

    #[test]
    fn callers_are_checked_only_when_access_control_is_on() {
        let open = Caller::unrestricted();
        assert!(open.require_admin().is_ok());
        assert!(open.require_name(Permission::Lock, "x").is_ok());
        let caller = Caller {
            identity: "billing".into(),
            acl: Some(Arc::new(acl(
                "[[rule]]\nidentity = \"billing\"\nallow = \"lock\"\nprefix = \"billing/\"\n",
            ))),
        };
        assert!(caller.require_name(Permission::Lock, "billing/a").is_ok());
        assert!(matches!(
            caller.require_name(Permission::Lock, "x"),
            Err(Error::PermissionDenied(_))
        ));
        assert!(matches!(
            caller.require_admin(),
            Err(Error::PermissionDenied(_))
        ));
        assert!(matches!(
            caller.require_prefix(Permission::Read, ""),
            Err(Error::PermissionDenied(_))
        ));
        assert!(caller.require_any(Permission::Lock).is_ok());
        assert!(caller.require_any(Permission::Admin).is_err());
    }

    #[test]
    fn reload_needs_access_control_on() {
        let off = Auth::new(None);
        assert!(off.replace(acl("")).is_err());
        assert!(off.current().is_none());
        let on = Auth::new(Some(acl("")));
        assert!(on
            .replace(acl("[[rule]]\nidentity = \"a\"\nallow = \"read\"\n"))
            .is_ok());
        assert_eq!(on.current().expect("on").rules().len(), 1);
    }

    #[test]
    fn the_subject_common_name_is_read_from_a_certificate() {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).expect("params");
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "acme");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "billing-worker");
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("cert");
        assert_eq!(
            subject_common_name(cert.der()).as_deref(),
            Some("billing-worker")
        );
        // No CN at all.
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).expect("params");
        params.distinguished_name = rcgen::DistinguishedName::new();
        let cert = params.self_signed(&key).expect("cert");
        assert_eq!(subject_common_name(cert.der()), None);
        // Garbage and truncations never panic.
        let der = cert.der().to_vec();
        for cut in 0..der.len() {
            let _ = subject_common_name(&der[..cut]);
        }
        assert_eq!(
            subject_common_name(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]),
            None
        );
        assert_eq!(subject_common_name(&[]), None);
    }
}
