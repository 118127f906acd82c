//! What the commands print: text for people, `--json` for programs.

use raftlock_client::proto::{self as pb, EventKind, LockInfo};
use serde_json::json;

pub fn mode_name(mode: i32) -> &'static str {
    match pb::Mode::try_from(mode) {
        Ok(pb::Mode::Exclusive) => "exclusive",
        Ok(pb::Mode::Shared) => "shared",
        Ok(pb::Mode::Semaphore) => "semaphore",
        Err(_) => "unknown",
    }
}

pub fn info_json(i: &LockInfo) -> serde_json::Value {
    json!({
        "name": i.name,
        "semaphore": i.semaphore,
        "capacity": i.capacity,
        "lock_delayed": i.lock_delayed,
        "holders": i.holders.iter().map(|h| json!({
            "session": h.session_id, "fence": h.fence, "mode": mode_name(h.mode),
            "weight": h.weight, "value": String::from_utf8_lossy(&h.value), "index": h.granted_index,
        })).collect::<Vec<_>>(),
        "waiters": i.waiters.iter().map(|w| json!({
            "session": w.session_id, "seq": w.seq, "mode": mode_name(w.mode),
            "weight": w.weight, "index": w.queued_index,
        })).collect::<Vec<_>>(),
    })
}

pub fn print_info(i: &LockInfo) {
    let kind = if i.semaphore {
        format!("semaphore (capacity {})", i.capacity)
    } else {
        "lock".into()
    };
    let delayed = if i.lock_delayed {
        ", lock-delay in force"
    } else {
        ""
    };
    println!("{} — {kind}{delayed}", printable(&i.name));
    for h in &i.holders {
        let value = if h.value.is_empty() {
            String::new()
        } else {
            format!(" value {:?}", String::from_utf8_lossy(&h.value))
        };
        println!(
            "  held by session {} fence {} {} weight {}{value}",
            h.session_id,
            h.fence,
            mode_name(h.mode),
            h.weight
        );
    }
    for (n, w) in i.waiters.iter().enumerate() {
        println!(
            "  #{} waiting: session {} {} weight {}",
            n + 1,
            w.session_id,
            mode_name(w.mode),
            w.weight
        );
    }
}

/// A name as printed on a terminal: control characters (newlines, escape
/// sequences, NUL) escaped, so a lock name cannot rewrite the screen or
/// forge output lines. JSON output escapes them already.
pub fn printable(name: &str) -> std::borrow::Cow<'_, str> {
    if name.chars().any(char::is_control) {
        std::borrow::Cow::Owned(name.chars().flat_map(char::escape_default).collect())
    } else {
        std::borrow::Cow::Borrowed(name)
    }
}

pub fn print_event(e: &pb::WatchEvent, json: bool) {
    let kind = match EventKind::try_from(e.kind) {
        Ok(EventKind::Granted) => "granted",
        Ok(EventKind::Queued) => "queued",
        Ok(EventKind::Released) => "released",
        Ok(EventKind::Expired) => "expired",
        Ok(EventKind::Cancelled) => "cancelled",
        Ok(EventKind::LockDelayStarted) => "lock-delay-started",
        Ok(EventKind::LockDelayEnded) => "lock-delay-ended",
        _ => "unknown",
    };
    if json {
        println!(
            "{}",
            json!({"index": e.index, "kind": kind, "name": e.name, "session": e.session_id,
                   "fence": e.fence, "mode": mode_name(e.mode), "weight": e.weight})
        );
    } else {
        println!(
            "{} {kind} {} session {} fence {}",
            e.index,
            printable(&e.name),
            e.session_id,
            e.fence
        );
    }
}

pub fn member_json(m: &pb::Member) -> serde_json::Value {
    json!({"id": m.id, "addr": m.addr, "peer_addr": m.peer_addr, "voter": m.voter})
}

pub fn print_members(members: &[pb::Member]) {
    for m in members {
        let peer = if m.peer_addr.is_empty() || m.peer_addr == m.addr {
            String::new()
        } else {
            format!(" (peers: {})", m.peer_addr)
        };
        println!(
            "  {} {}{peer} {}",
            m.id,
            m.addr,
            if m.voter { "voter" } else { "learner" }
        );
    }
}

pub fn status_json(s: &pb::StatusResponse) -> serde_json::Value {
    json!({
        "id": s.id, "addr": s.addr, "role": s.role, "term": s.term,
        "leader_id": s.leader_id, "leader_addr": s.leader_addr,
        "commit_index": s.commit_index, "applied_index": s.applied_index,
        "last_log_index": s.last_log_index, "sessions": s.sessions, "grants": s.grants,
        "waiters": s.waiters, "last_fence": s.last_fence,
        "members": s.members.iter().map(member_json).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn names_with_control_characters_are_escaped() {
        assert_eq!(printable("jobs/nightly"), "jobs/nightly");
        assert_eq!(printable("a\nb\u{1b}[2J\0"), "a\\nb\\u{1b}[2J\\u{0}");
        assert!(!printable("x\ry").contains('\r'));
    }
}
