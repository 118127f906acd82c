//! The ACL, callers and reloads.

use std::sync::Arc;

use tonic::metadata::MetadataMap;

use super::AuthError as Error;
use super::*;
use crate::state::limits::MAX_OWNER_LEN;

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
        credential: None,
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
fn accepted_peer_tokens_authenticate_peers_and_are_no_client_tokens() {
    let other = "the-next-peer-token-000";
    let acl = Acl::parse(&format!(
        "peer_token = \"{PEER}\"\naccept_peer_tokens = [\"{other}\"]\n"
    ))
    .expect("valid");
    assert!(acl.is_peer(&metadata(&format!("Bearer {PEER}")), None));
    assert!(acl.is_peer(&metadata(&format!("Bearer {other}")), None));
    assert!(!acl.is_peer(&metadata("Bearer something-else-entirely"), None));
    assert_eq!(acl.peer_token(), PEER, "the one a node sends");
    // Short, or reused as a client token: refused like peer_token.
    let short = Acl::parse(&format!(
        "peer_token = \"{PEER}\"\naccept_peer_tokens = [\"short\"]\n"
    ));
    assert!(short.expect_err("short").contains("accept_peer_tokens #1"));
    let reused = Acl::parse(&format!(
        "peer_token = \"{PEER}\"\naccept_peer_tokens = [\"{other}\"]\n\
         [[token]]\nidentity = \"x\"\ntoken = \"{other}\"\n"
    ));
    assert!(reused.expect_err("reused").contains("is a peer token"));
}

#[test]
fn a_reload_revokes_the_credentials_it_drops() {
    let auth = Auth::new(Some(acl("")));
    let changes = auth.changes();
    let req = |token: &str| {
        let mut r = tonic::Request::new(());
        *r.metadata_mut() = metadata(&format!("Bearer {token}"));
        r
    };
    let billing = auth.caller(&req("tok-billing")).expect("billing");
    let ops = auth.caller(&req("tok-ops")).expect("ops");
    let peer = auth.peer_credential(&req(PEER));
    assert!(auth.recheck(&billing).is_ok() && auth.still_peer(peer.as_ref()));
    // billing's token goes; ops keeps its hash; a new peer token.
    let next_peer = "another-peer-secret-123";
    auth.replace(
        Acl::parse(&format!(
            "peer_token = \"{next_peer}\"\n\
             [[token]]\nidentity = \"billing\"\ntoken = \"tok-billing-2\"\n\
             [[token]]\nidentity = \"ops\"\nsha256 = \"{}\"\n",
            token_sha256_hex("tok-ops")
        ))
        .expect("valid"),
    )
    .expect("replace");
    assert!(changes.has_changed().expect("open"), "streams are told");
    let revoked = auth
        .recheck(&billing)
        .expect_err("billing's token was revoked");
    assert!(matches!(&revoked, Error::Unauthenticated(m) if m.contains("revoked")));
    assert_eq!(auth.recheck(&ops).expect("ops stays").identity, "ops");
    assert!(
        !auth.still_peer(peer.as_ref()),
        "the old peer token is gone"
    );
}
