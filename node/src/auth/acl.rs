//! The ACL file: tokens and their identities, rules, peer credentials.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tonic::metadata::MetadataMap;

use super::AuthError as Error;
use super::{subject_common_name, AUTHORIZATION, MIN_PEER_TOKEN_LEN};
use crate::state::limits::MAX_OWNER_LEN;

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
    pub(super) fn as_str(self) -> &'static str {
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
    /// Peer tokens accepted besides `peer_token` (during a rotation).
    #[serde(default)]
    accept_peer_tokens: Vec<String>,
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
    tokens: BTreeMap<[u8; 32], String>,
    rules: Vec<Rule>,
    /// The token this node sends its peers.
    peer_token: String,
    /// SHA-256 of every peer token this node accepts: `peer_token` and
    /// `accept_peer_tokens`.
    peer_tokens: Vec<[u8; 32]>,
    peer_subjects: BTreeSet<String>,
}

/// What a request authenticated with, kept to check it again when the ACL
/// is reloaded (long-lived streams).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credential {
    /// A bearer token, by its SHA-256.
    Token([u8; 32]),
    /// A client certificate with this subject common name (the TLS layer
    /// verified it when the connection was made).
    Certificate(String),
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
        let mut peer_tokens = vec![sha256(peer_token.as_bytes())];
        for (i, accepted) in file.accept_peer_tokens.iter().enumerate() {
            if accepted.len() < MIN_PEER_TOKEN_LEN {
                return Err(format!(
                    "accept_peer_tokens #{}: at least {MIN_PEER_TOKEN_LEN} characters, like \
                     peer_token",
                    i + 1
                ));
            }
            peer_tokens.push(sha256(accepted.as_bytes()));
        }
        let mut tokens = BTreeMap::new();
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
            if peer_tokens.contains(&hash) {
                return Err(format!(
                    "token #{} ({}) is a peer token (peer_token or accept_peer_tokens); give \
                     clients their own tokens",
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
            peer_tokens,
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
        self.identify_with(metadata, cert)
            .map(|(identity, _)| identity)
    }

    /// Like [`identify`](Self::identify), with the credential it used.
    pub fn identify_with(
        &self,
        metadata: &MetadataMap,
        cert: Option<&[u8]>,
    ) -> Result<(String, Credential), Error> {
        if let Some(token) = bearer(metadata)? {
            let hash = sha256(token.as_bytes());
            return self
                .tokens
                .get(&hash)
                .map(|identity| (identity.clone(), Credential::Token(hash)))
                .ok_or_else(|| Error::Unauthenticated("unknown bearer token".into()));
        }
        match cert.map(subject_common_name) {
            Some(Some(cn)) if valid_identity(&cn).is_ok() => {
                Ok((cn.clone(), Credential::Certificate(cn)))
            }
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

    /// True if `credential` still identifies `identity` under this ACL (a
    /// certificate's CN always does: the TLS layer vouched for it).
    pub fn still_identifies(&self, credential: &Credential, identity: &str) -> bool {
        match credential {
            Credential::Token(hash) => self.tokens.get(hash).is_some_and(|i| i == identity),
            Credential::Certificate(cn) => cn == identity,
        }
    }

    /// True if the request may call the Raft service: a peer token this
    /// node accepts (`peer_token` or one of `accept_peer_tokens`), or a
    /// certificate whose CN is a listed peer subject.
    pub fn is_peer(&self, metadata: &MetadataMap, cert: Option<&[u8]>) -> bool {
        self.peer_credential(metadata, cert)
            .is_some_and(|c| self.accepts_peer(&c))
    }

    /// What a peer's request authenticates with, if anything.
    pub fn peer_credential(
        &self,
        metadata: &MetadataMap,
        cert: Option<&[u8]>,
    ) -> Option<Credential> {
        match bearer(metadata) {
            Ok(Some(token)) => Some(Credential::Token(sha256(token.as_bytes()))),
            Ok(None) => cert
                .and_then(subject_common_name)
                .map(Credential::Certificate),
            Err(_) => None,
        }
    }

    /// True if `credential` authenticates a peer under this ACL.
    pub fn accepts_peer(&self, credential: &Credential) -> bool {
        match credential {
            Credential::Token(hash) => self.peer_tokens.contains(hash),
            Credential::Certificate(cn) => self.peer_subjects.contains(cn),
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
