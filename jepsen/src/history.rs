//! The history: every operation's invocation and completion, as Jepsen
//! records them, written to `history.jsonl` as it happens and kept in
//! memory for the checkers.
//!
//! The types and the pairing of invocations with completions are
//! `raftlock-check`'s (shared with the simulator), re-exported here; the
//! recorder and the file are the harness's.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::Value;

pub use raftlock_check::history::*;

/// Appends events to `history.jsonl` and keeps them for the checkers.
/// Cheap to clone.
#[derive(Clone)]
pub struct Recorder {
    inner: Arc<Mutex<RecorderInner>>,
    start: Instant,
}

struct RecorderInner {
    file: BufWriter<File>,
    events: Vec<Event>,
}

impl Recorder {
    /// A recorder writing to `path`, counting time from `start`.
    pub fn create(path: &Path, start: Instant) -> anyhow::Result<Recorder> {
        let file = File::create(path)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", path.display()))?;
        Ok(Recorder {
            inner: Arc::new(Mutex::new(RecorderInner {
                file: BufWriter::new(file),
                events: Vec::new(),
            })),
            start,
        })
    }

    /// Nanoseconds since the start of the run.
    pub fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// The instant the run started.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// Records an event stamped now. Timestamps are taken under the lock,
    /// so the file is in time order.
    pub fn record(&self, process: Process, kind: Type, f: &str, value: Value) -> u64 {
        let mut inner = self.inner.lock().expect("history lock poisoned");
        let time_ns = self.now_ns();
        let event = Event {
            process,
            kind,
            f: f.to_string(),
            value,
            time_ns,
        };
        if let Ok(line) = serde_json::to_string(&event) {
            // A full disk must not stop the run; the in-memory copy is what
            // the checkers read.
            let _ = writeln!(inner.file, "{line}");
        }
        inner.events.push(event);
        time_ns
    }

    /// Flushes the file.
    pub fn flush(&self) {
        let mut inner = self.inner.lock().expect("history lock poisoned");
        let _ = inner.file.flush();
    }

    /// A copy of every event so far.
    pub fn events(&self) -> Vec<Event> {
        self.inner
            .lock()
            .expect("history lock poisoned")
            .events
            .clone()
    }
}

/// Reads a `history.jsonl` file.
pub fn read_history(path: &Path) -> anyhow::Result<Vec<Event>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| anyhow::anyhow!("{} line {}: {e}", path.display(), i + 1))
        })
        .collect()
}
