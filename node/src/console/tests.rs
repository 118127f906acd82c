//! Tests of the console: the side table's notes and tail, and query decoding.

use super::*;
use crate::state::{EndCause, Event};
use crate::state::{Fence, LockName, SessionId};

#[test]
fn notes_time_grants_and_waits_and_forget_them_when_they_end() {
    let notes = Notes::default();
    let x = LockName::new("x").expect("name");
    notes.record(
        3,
        &[
            Event::Granted {
                name: x.clone(),
                session: SessionId(1),
                seq: 1,
                fence: Fence(7),
                mode: Mode::Exclusive,
            },
            Event::Queued {
                name: x.clone(),
                session: SessionId(2),
                seq: 4,
                mode: Mode::Exclusive,
                timeout_ms: 1_000,
            },
        ],
        1_000,
    );
    assert_eq!(notes.grant_since("x", 7), Some(1_000));
    assert_eq!(notes.wait_since(2, "x", 4), Some(1_000));
    notes.record(
        4,
        &[
            Event::SessionRevoked {
                session: SessionId(1),
                by: "ops".into(),
                at_unix_ms: 1_500,
            },
            Event::Ended {
                name: x.clone(),
                session: SessionId(1),
                fence: Fence(7),
                mode: Mode::Exclusive,
                cause: EndCause::Revoked,
            },
            Event::Granted {
                name: x,
                session: SessionId(2),
                seq: 4,
                fence: Fence(8),
                mode: Mode::Exclusive,
            },
        ],
        2_000,
    );
    assert_eq!(notes.grant_since("x", 7), None);
    assert_eq!(notes.wait_since(2, "x", 4), None);
    assert_eq!(notes.grant_since("x", 8), Some(2_000));
    let tail = notes.tail();
    let kinds: Vec<_> = tail.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, vec!["granted", "queued", "revoked", "granted"]);
    assert_eq!(tail[2].revoked_by.as_deref(), Some("ops"));
    assert_eq!(tail[3].revoked_by, None);
    notes.forget();
    assert_eq!(notes.grant_since("x", 8), None);
}

#[test]
fn query_parameters_are_percent_decoded() {
    let q = Some("prefix=jobs%2Fa+b&session=42&bad=%zz&cut=%4");
    assert_eq!(query_param(q, "prefix").as_deref(), Some("jobs/a b"));
    assert_eq!(query_param(q, "session").as_deref(), Some("42"));
    assert_eq!(query_param(q, "bad"), None);
    assert_eq!(query_param(q, "cut"), None);
    assert_eq!(query_param(q, "missing"), None);
    assert_eq!(query_param(None, "prefix"), None);
}

#[test]
fn the_tail_keeps_the_latest_events_up_to_its_cap() {
    let notes = Notes::default();
    let x = LockName::new("x").expect("name");
    for i in 0..(MAX_CONSOLE_EVENTS as u64 + 5) {
        notes.record(i, &[Event::LockDelayEnded { name: x.clone() }], i);
    }
    let tail = notes.tail();
    assert_eq!(tail.len(), MAX_CONSOLE_EVENTS);
    assert_eq!(tail[0].index, 5);
    assert_eq!(
        tail.last().map(|e| e.index),
        Some(MAX_CONSOLE_EVENTS as u64 + 4)
    );
}
