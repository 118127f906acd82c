//! What the commands print: text for people, `--json` for programs.
//!
//! The JSON keeps the .proto's field names and numbers: an absent fence or
//! leader is 0, an absent peer address "".

use raftlock_client::{Fence, LockInfo, LockKind, Member, NodeStatus, WatchEvent};
use serde_json::json;

/// A fence as printed: 0 for none.
fn fence(f: Option<Fence>) -> u64 {
    f.map_or(0, Fence::get)
}

pub fn info_json(i: &LockInfo) -> serde_json::Value {
    let (semaphore, capacity) = match i.kind {
        LockKind::Lock => (false, 0),
        LockKind::Semaphore { capacity } => (true, capacity),
    };
    json!({
        "name": i.name,
        "semaphore": semaphore,
        "capacity": capacity,
        "lock_delayed": i.lock_delayed,
        "holders": i.holders.iter().map(|h| json!({
            "session": h.session.get(), "fence": h.fence.get(), "mode": h.mode.as_str(),
            "weight": h.weight, "value": String::from_utf8_lossy(&h.value), "index": h.granted_index,
        })).collect::<Vec<_>>(),
        "waiters": i.waiters.iter().map(|w| json!({
            "session": w.session.get(), "seq": w.seq, "mode": w.mode.as_str(),
            "weight": w.weight, "index": w.queued_index,
        })).collect::<Vec<_>>(),
    })
}

pub fn print_info(i: &LockInfo) {
    let kind = match i.kind {
        LockKind::Semaphore { capacity } => format!("semaphore (capacity {capacity})"),
        LockKind::Lock => "lock".into(),
    };
    let delayed = if i.lock_delayed {
        ", lock-delay in force"
    } else {
        ""
    };
    out!("{} — {kind}{delayed}", printable(&i.name));
    for h in &i.holders {
        let value = if h.value.is_empty() {
            String::new()
        } else {
            format!(" value {:?}", String::from_utf8_lossy(&h.value))
        };
        out!(
            "  held by session {} fence {} {} weight {}{value}",
            h.session,
            h.fence,
            h.mode,
            h.weight
        );
    }
    for (n, w) in i.waiters.iter().enumerate() {
        out!(
            "  #{} waiting: session {} {} weight {}",
            n + 1,
            w.session,
            w.mode,
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

pub fn print_event(e: &WatchEvent, json: bool) {
    let session = e.session.map_or(0, |s| s.get());
    if json {
        let mut line = json!({"index": e.index, "kind": e.kind.as_str(), "name": e.name, "session": session,
                   "fence": fence(e.fence), "mode": e.mode.as_str(), "weight": e.weight});
        if let Some((by, at)) = &e.revoked {
            line["revoked_by"] = json!(by);
            line["revoked_at_unix_ms"] = json!(at);
        }
        out!("{line}");
    } else {
        let revoked = match &e.revoked {
            Some((by, at)) => format!(" revoked by {} at {at} ms since the epoch", printable(by)),
            None => String::new(),
        };
        out!(
            "{} {} {} session {session} fence {}{revoked}",
            e.index,
            e.kind,
            printable(&e.name),
            fence(e.fence)
        );
    }
}

pub fn member_json(m: &Member) -> serde_json::Value {
    json!({"id": m.id, "addr": m.addr, "peer_addr": m.peer_addr.as_deref().unwrap_or(""), "voter": m.voter})
}

pub fn print_members(members: &[Member]) {
    for m in members {
        let peer = match &m.peer_addr {
            Some(p) if *p != m.addr => format!(" (peers: {p})"),
            _ => String::new(),
        };
        out!(
            "  {} {}{peer} {}",
            m.id,
            m.addr,
            if m.voter { "voter" } else { "learner" }
        );
    }
}

/// The leader as printed: (0, "") for none.
pub fn leader(s: &NodeStatus) -> (u64, &str) {
    s.leader
        .as_ref()
        .map_or((0, ""), |(id, addr)| (*id, addr.as_str()))
}

pub fn status_json(s: &NodeStatus) -> serde_json::Value {
    let (leader_id, leader_addr) = leader(s);
    json!({
        "id": s.id, "addr": s.addr, "role": s.role.as_str(), "term": s.term,
        "leader_id": leader_id, "leader_addr": leader_addr,
        "commit_index": s.commit_index, "applied_index": s.applied_index,
        "last_log_index": s.last_log_index, "sessions": s.sessions, "grants": s.grants,
        "waiters": s.waiters, "last_fence": fence(s.last_fence),
        "members": s.members.iter().map(member_json).collect::<Vec<_>>(),
    })
}

pub fn print_status(s: &NodeStatus) {
    out!(
        "node {} at {} is {} (term {})",
        s.id,
        s.addr,
        s.role,
        s.term
    );
    let (leader_id, leader_addr) = leader(s);
    out!("leader: {leader_id} {leader_addr}");
    out!(
        "commit {} applied {} last log {}",
        s.commit_index,
        s.applied_index,
        s.last_log_index
    );
    out!(
        "sessions {} grants {} waiters {} last fence {}",
        s.sessions,
        s.grants,
        s.waiters,
        fence(s.last_fence)
    );
    print_members(&s.members);
}

/// The last fence of a backup or restore as printed: 0 for none.
pub fn last_fence(f: Option<Fence>) -> u64 {
    fence(f)
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
