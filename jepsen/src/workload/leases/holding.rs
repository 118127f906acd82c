//! Beliefs: a grant a client believes it holds, and its count.

use std::sync::atomic::Ordering;

use serde_json::{json, Value};

use super::calls::Proc;
use super::{Shared, BELIEF_PROCESS_BASE};
use crate::beliefs::Held;
use crate::history::Type;

/// A grant a client believes it holds, and its count.
pub(super) struct Holding {
    pub(super) lock: String,
    held: Held,
    pub(super) session: u64,
    pub(super) fence: u64,
    pub(super) gen: u64,
    path: &'static str,
    /// Spans that ended when the count ran out (later restored).
    pub(super) lapsed: Vec<(u64, u64)>,
    /// When the current span began.
    pub(super) since: u64,
    /// The end of the count.
    pub(super) until: u64,
}

impl Holding {
    /// A grant answered at `now` by a request sent at `sent` that started
    /// a lease of `length_ns`; `None` if that count had run out by the
    /// time the answer came (held up on the way: never believed).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        path: &'static str,
        lock: &str,
        held: Held,
        session: u64,
        fence: u64,
        gen: u64,
        sent: u64,
        length_ns: u64,
        now: u64,
    ) -> Option<Holding> {
        (sent + length_ns > now).then(|| Holding {
            lock: lock.to_string(),
            held,
            session,
            fence,
            gen,
            path,
            lapsed: Vec::new(),
            since: now,
            until: sent + length_ns,
        })
    }

    pub(super) fn runs(&self, now: u64) -> bool {
        now < self.until
    }

    /// A lease-starting answer, arriving at `now`, to a request sent at
    /// `sent`, for a lease of `length_ns`: it extends the count, or, if
    /// the count had run out, restores the belief from `now`.
    pub(super) fn answered(&mut self, sent: u64, length_ns: u64, now: u64) {
        let end = sent + length_ns;
        if now < self.until {
            self.until = self.until.max(end);
        } else if end > now {
            self.lapsed.push((self.since, self.until));
            self.since = now;
            self.until = end;
        }
    }

    /// A `SetSessionTtl` to a shorter ttl is about to be sent (at `now` or
    /// later): the count ends at `now + length_ns` at the latest.
    pub(super) fn cut(&mut self, now: u64, length_ns: u64) {
        self.until = self.until.min((now + length_ns).max(self.since));
    }

    /// The belief ends at `end` (or where the count ran out, if sooner):
    /// recorded as a `belief` operation of process `process`.
    pub(super) fn finish(self, sh: &Shared, process: u64, end: u64, why: &str) {
        let mut spans = self.lapsed.clone();
        spans.push((self.since, end.min(self.until).max(self.since)));
        let spans: Vec<Value> = spans.iter().map(|(a, b)| json!([a, b])).collect();
        let n = sh.beliefs.fetch_add(1, Ordering::Relaxed);
        let mut p = Proc::new(&sh.rec, BELIEF_PROCESS_BASE + n, 0);
        p.invoke(
            "belief",
            json!({"lock": self.lock, "mode": self.held.as_str(), "session": self.session,
                   "fence": self.fence, "gen": self.gen, "path": self.path, "process": process,
                   "spans": spans, "end": why}),
        );
        p.complete(Type::Ok, json!({}));
    }
}

/// Nanoseconds in `ms` milliseconds.
pub(super) fn ms_ns(ms: u64) -> u64 {
    ms * 1_000_000
}
