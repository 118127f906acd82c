//! Conversions between the wire types (`raftlock.v1`) and the lock table's.

use raftlock_proto::v1 as pb;

use crate::error::Error;
use crate::raft::log_index_of;
use crate::state::{CancelCause, EndCause, Event, LockInfo, Mode};

/// The table's mode for an acquire request.
pub fn mode_from_request(req: &pb::AcquireRequest) -> Result<Mode, Error> {
    match pb::Mode::try_from(req.mode) {
        Ok(pb::Mode::Exclusive) => Ok(Mode::Exclusive),
        Ok(pb::Mode::Shared) => Ok(Mode::Shared),
        Ok(pb::Mode::Semaphore) => Ok(Mode::Semaphore {
            weight: req.weight,
            capacity: req.capacity,
        }),
        Err(_) => Err(Error::InvalidArgument(format!("unknown mode {}", req.mode))),
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
        | Event::SessionTtlChanged { .. } => return None,
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
}
