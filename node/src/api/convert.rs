//! Conversions between the wire types (`raftlock.v1`) and the lock table's.

use raftlock_proto::v1 as pb;

use crate::error::Error;
use crate::raft::log_index_of;
use crate::state::{CancelCause, EndCause, Event, LockInfo, Mode};

/// The table's mode for an acquire request.
pub fn mode_from_request(req: &pb::AcquireRequest) -> Result<Mode, Error> {
    mode_from_parts(req.mode, req.weight, req.capacity)
}

/// The table mode of a request's `mode`, `weight` and `capacity` fields.
pub fn mode_from_parts(mode: i32, weight: u32, capacity: u32) -> Result<Mode, Error> {
    match pb::Mode::try_from(mode) {
        Ok(pb::Mode::Exclusive) => Ok(Mode::Exclusive),
        Ok(pb::Mode::Shared) => Ok(Mode::Shared),
        Ok(pb::Mode::Semaphore) => Ok(Mode::Semaphore { weight, capacity }),
        Err(_) => Err(Error::InvalidArgument(format!("unknown mode {mode}"))),
    }
}

/// The wire mode of a table mode.
pub fn mode_to_proto(mode: Mode) -> pb::Mode {
    match mode {
        Mode::Exclusive => pb::Mode::Exclusive,
        Mode::Shared => pb::Mode::Shared,
        Mode::Semaphore { .. } => pb::Mode::Semaphore,
    }
}

/// The wire form of one name's state.
pub fn lock_info(info: LockInfo) -> pb::LockInfo {
    pb::LockInfo {
        name: info.name.as_str().to_string(),
        semaphore: info.capacity.is_some(),
        capacity: info.capacity.unwrap_or(0),
        holders: info
            .holders
            .into_iter()
            .map(|h| pb::Holder {
                session_id: h.session.0,
                fence: h.fence.0,
                mode: mode_to_proto(h.mode) as i32,
                weight: h.mode.weight(),
                value: h.value,
                granted_index: log_index_of(h.index),
            })
            .collect(),
        waiters: info
            .waiters
            .into_iter()
            .map(|w| pb::Waiter {
                session_id: w.session.0,
                seq: w.seq,
                mode: mode_to_proto(w.mode) as i32,
                weight: w.mode.weight(),
                queued_index: log_index_of(w.index),
            })
            .collect(),
        lock_delayed: info.lock_delayed,
    }
}

/// The wire forms of one command's events, those watchers see: as
/// [`watch_event`], and a REVOKED event carries who revoked the session
/// and when (from the [`Event::SessionRevoked`] the revoke began with).
pub fn watch_events(index: u64, events: &[Event]) -> Vec<pb::WatchEvent> {
    let mut revoke: Option<(&str, u64)> = None;
    let mut out = Vec::with_capacity(events.len());
    for e in events {
        if let Event::SessionRevoked { by, at_unix_ms, .. } = e {
            revoke = Some((by, *at_unix_ms));
        }
        let Some(mut w) = watch_event(index, e) else {
            continue;
        };
        if let (pb::EventKind::Revoked, Some((by, at))) = (w.kind(), revoke) {
            w.revoked_by = by.to_string();
            w.revoked_at_unix_ms = at;
        }
        out.push(w);
    }
    out
}

/// The wire form of an event, if watchers see it (session open/close
/// events concern no name and are not streamed).
pub fn watch_event(index: u64, event: &Event) -> Option<pb::WatchEvent> {
    let mut out = pb::WatchEvent {
        index,
        ..Default::default()
    };
    let (kind, name) = match event {
        Event::SessionOpened { .. }
        | Event::SessionEnded { .. }
        | Event::SessionTtlChanged { .. }
        | Event::SessionRevoked { .. } => return None,
        Event::Granted {
            name,
            session,
            fence,
            mode,
            ..
        } => {
            out.session_id = session.0;
            out.fence = fence.0;
            out.mode = mode_to_proto(*mode) as i32;
            out.weight = mode.weight();
            (pb::EventKind::Granted, name)
        }
        Event::Queued {
            name,
            session,
            mode,
            ..
        } => {
            out.session_id = session.0;
            out.mode = mode_to_proto(*mode) as i32;
            out.weight = mode.weight();
            (pb::EventKind::Queued, name)
        }
        Event::Ended {
            name,
            session,
            fence,
            mode,
            cause,
        } => {
            out.session_id = session.0;
            out.fence = fence.0;
            out.mode = mode_to_proto(*mode) as i32;
            out.weight = mode.weight();
            let kind = match cause {
                EndCause::Released => pb::EventKind::Released,
                EndCause::SessionClosed | EndCause::SessionExpired => pb::EventKind::Expired,
                EndCause::Upgraded => pb::EventKind::Upgraded,
                EndCause::Revoked => pb::EventKind::Revoked,
            };
            (kind, name)
        }
        Event::Cancelled {
            name,
            session,
            mode,
            cause,
            ..
        } => {
            out.session_id = session.0;
            out.mode = mode_to_proto(*mode) as i32;
            out.weight = mode.weight();
            let _: CancelCause = *cause;
            (pb::EventKind::Cancelled, name)
        }
        Event::LockDelayStarted { name, .. } => (pb::EventKind::LockDelayStarted, name),
        Event::LockDelayEnded { name } => (pb::EventKind::LockDelayEnded, name),
        Event::Downgraded {
            name,
            session,
            fence,
        } => {
            out.session_id = session.0;
            out.fence = fence.0;
            out.mode = pb::Mode::Shared as i32;
            out.weight = 1;
            (pb::EventKind::Downgraded, name)
        }
    };
    out.kind = kind as i32;
    out.name = name.as_str().to_string();
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Fence, LockName, SessionId};

    #[test]
    fn unknown_mode_is_invalid_argument() {
        let req = pb::AcquireRequest {
            mode: 7,
            ..Default::default()
        };
        assert!(matches!(
            mode_from_request(&req),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn semaphore_mode_carries_weight_and_capacity() {
        let req = pb::AcquireRequest {
            mode: pb::Mode::Semaphore as i32,
            weight: 2,
            capacity: 5,
            ..Default::default()
        };
        assert_eq!(
            mode_from_request(&req).ok(),
            Some(Mode::Semaphore {
                weight: 2,
                capacity: 5
            })
        );
    }

    #[test]
    fn expiry_and_close_are_expired_events_release_is_released() {
        let name = LockName::new("a").expect("valid");
        let ended = |cause| Event::Ended {
            name: name.clone(),
            session: SessionId(1),
            fence: Fence(3),
            mode: Mode::Exclusive,
            cause,
        };
        let kind = |e: &Event| watch_event(5, e).map(|w| w.kind);
        assert_eq!(
            kind(&ended(EndCause::Released)),
            Some(pb::EventKind::Released as i32)
        );
        assert_eq!(
            kind(&ended(EndCause::SessionExpired)),
            Some(pb::EventKind::Expired as i32)
        );
        assert_eq!(
            kind(&ended(EndCause::SessionClosed)),
            Some(pb::EventKind::Expired as i32)
        );
        assert_eq!(
            kind(&Event::SessionOpened {
                session: SessionId(1),
                ttl_ms: 1000,
                end_on_disconnect_ms: 0,
            }),
            None
        );
        let w = watch_event(5, &ended(EndCause::Released)).expect("streamed");
        assert_eq!((w.index, w.fence, w.name.as_str()), (5, 3, "a"));
    }

    #[test]
    fn a_revoked_grant_is_a_revoked_event_saying_who_and_when() {
        let name = LockName::new("a").expect("valid");
        let events = [
            Event::SessionRevoked {
                session: SessionId(1),
                by: "ops".into(),
                at_unix_ms: 1_764_000_000_000,
            },
            Event::Ended {
                name: name.clone(),
                session: SessionId(1),
                fence: Fence(3),
                mode: Mode::Exclusive,
                cause: EndCause::Revoked,
            },
            Event::SessionEnded {
                session: SessionId(1),
                expired: false,
            },
            Event::Granted {
                name,
                session: SessionId(2),
                seq: 1,
                fence: Fence(4),
                mode: Mode::Exclusive,
            },
        ];
        let wire = watch_events(9, &events);
        let kinds: Vec<_> = wire.iter().map(|w| w.kind()).collect();
        assert_eq!(kinds, vec![pb::EventKind::Revoked, pb::EventKind::Granted]);
        assert_eq!(
            (wire[0].revoked_by.as_str(), wire[0].revoked_at_unix_ms),
            ("ops", 1_764_000_000_000)
        );
        assert_eq!(
            (wire[0].session_id, wire[0].fence, wire[0].index),
            (1, 3, 9)
        );
        // Only the revoked grant says who revoked it.
        assert_eq!(
            (wire[1].revoked_by.as_str(), wire[1].revoked_at_unix_ms),
            ("", 0)
        );
    }
}
