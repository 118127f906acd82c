//! A node's log: its last line, and the line saying it was removed.

use std::path::Path;

/// The last non-empty line of `log`, without terminal colours.
pub fn last_log_line(log: &Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(log) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(16 * 1024)));
    let mut tail = Vec::new();
    let _ = f.read_to_end(&mut tail);
    let text = String::from_utf8_lossy(&tail);
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    strip_ansi(line)
}

/// What `raftlockd` says when it exits because the cluster removed it
/// (status 0, so that a supervisor leaves it stopped).
pub const REMOVED_TEXT: &str = "was removed from the cluster";

/// The line of `log` in which the node, since it last started, said it
/// was removed from the cluster and is exiting, if it did.
pub fn removal_line(log: &Path) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(log).ok()?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut tail = Vec::new();
    let _ = f.read_to_end(&mut tail);
    let text = String::from_utf8_lossy(&tail);
    text.lines()
        .rev()
        .take_while(|l| !l.contains("raftlockd serving"))
        .find(|l| l.contains(REMOVED_TEXT) && l.contains("exiting"))
        .map(strip_ansi)
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ ... final byte in @..~
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}
