//! The history: every operation's invocation and completion, as Jepsen
//! records them (the harness writes them to `history.jsonl` as they
//! happen; the simulator keeps them in memory), and the operations the
//! checkers read, paired from them.
//!
//! An operation is a pair of events from one process: an `invoke` and then
//! an `ok` (it happened, with this result), a `fail` (it definitely did not
//! happen) or an `info` (the outcome is unknown: it may have happened, at
//! any time from its invocation on). A process whose operation ended in
//! `info` is retired and continues under a new process number, so every
//! process has at most one operation in flight and a pending one only at
//! its end, which is what the checkers assume.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who performed an event: a client process or the nemesis.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Process {
    /// A client process (worker slot + concurrency × generation).
    Client(u64),
    /// The fault injector; serialized as the string `"nemesis"`.
    Nemesis(NemesisTag),
}

/// The unit variant serialized as `"nemesis"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NemesisTag {
    /// The one nemesis.
    Nemesis,
}

impl Process {
    /// The nemesis process.
    pub const NEMESIS: Process = Process::Nemesis(NemesisTag::Nemesis);

    /// The client process number, if this is a client.
    pub fn client(&self) -> Option<u64> {
        match self {
            Process::Client(p) => Some(*p),
            Process::Nemesis(_) => None,
        }
    }
}

/// What an event says about its operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Type {
    /// The operation begins.
    Invoke,
    /// It completed and took effect.
    Ok,
    /// It completed and definitely did not take effect.
    Fail,
    /// Its outcome is unknown.
    Info,
}

/// One line of `history.jsonl`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Event {
    /// Who.
    pub process: Process,
    /// Invocation or completion.
    #[serde(rename = "type")]
    pub kind: Type,
    /// The operation's function (`acquire`, `release`, `describe`, `read`,
    /// `write`, `close`, nemesis operations ...).
    pub f: String,
    /// Arguments (on invoke) or results (on completion).
    pub value: Value,
    /// Nanoseconds since the start of the run: on the harness's monotonic
    /// clock, or the simulator's simulated one.
    pub time_ns: u64,
}

/// One client operation: an invocation paired with its completion (if any).
#[derive(Clone, Debug)]
pub struct Op {
    /// The client process.
    pub process: u64,
    /// The function.
    pub f: String,
    /// Arguments.
    pub invoke: Value,
    /// When it was invoked.
    pub invoke_ns: u64,
    /// How it ended: `Ok`, `Fail` or `Info`; `Info` too when the history
    /// has no completion (the run ended first).
    pub kind: Type,
    /// Results (or the error), `Null` if no completion.
    pub result: Value,
    /// When it completed; `None` for `Info` (unknown: treat as the end of
    /// time).
    pub complete_ns: Option<u64>,
    /// When the completion event was recorded, even for `Info`.
    pub recorded_ns: Option<u64>,
}

impl Op {
    /// A field of the invocation or, failing that, of the result.
    pub fn field(&self, key: &str) -> Option<&Value> {
        self.result
            .get(key)
            .filter(|v| !v.is_null())
            .or_else(|| self.invoke.get(key))
    }

    /// A string field.
    pub fn str(&self, key: &str) -> Option<&str> {
        self.field(key).and_then(Value::as_str)
    }

    /// An integer field.
    pub fn u64(&self, key: &str) -> Option<u64> {
        self.field(key).and_then(Value::as_u64)
    }

    /// A boolean field.
    pub fn bool(&self, key: &str) -> Option<bool> {
        self.field(key).and_then(Value::as_bool)
    }

    /// Latency in nanoseconds for completed operations.
    pub fn latency_ns(&self) -> Option<u64> {
        self.recorded_ns.map(|c| c.saturating_sub(self.invoke_ns))
    }
}

/// Pairs client invocations with their completions, in invocation order.
pub fn pair_ops(events: &[Event]) -> Vec<Op> {
    let mut open: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    let mut ops: Vec<Op> = Vec::new();
    for e in events {
        let Some(p) = e.process.client() else {
            continue;
        };
        match e.kind {
            Type::Invoke => {
                open.insert(p, ops.len());
                ops.push(Op {
                    process: p,
                    f: e.f.clone(),
                    invoke: e.value.clone(),
                    invoke_ns: e.time_ns,
                    kind: Type::Info,
                    result: Value::Null,
                    complete_ns: None,
                    recorded_ns: None,
                });
            }
            kind => {
                if let Some(i) = open.remove(&p) {
                    let op = &mut ops[i];
                    op.kind = kind;
                    op.result = e.value.clone();
                    op.recorded_ns = Some(e.time_ns);
                    op.complete_ns = (kind != Type::Info).then_some(e.time_ns);
                }
            }
        }
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn processes_serialize_as_numbers_or_nemesis() {
        assert_eq!(serde_json::to_value(Process::Client(3)).unwrap(), json!(3));
        assert_eq!(
            serde_json::to_value(Process::NEMESIS).unwrap(),
            json!("nemesis")
        );
        let e: Event = serde_json::from_value(json!({
            "process": "nemesis", "type": "info", "f": "start-kill", "value": null, "time_ns": 5
        }))
        .unwrap();
        assert_eq!(e.process, Process::NEMESIS);
    }

    #[test]
    fn pairs_invocations_with_completions() {
        let ev = |p: u64, kind, t| Event {
            process: Process::Client(p),
            kind,
            f: "acquire".into(),
            value: json!({"lock": "a"}),
            time_ns: t,
        };
        let ops = pair_ops(&[
            ev(0, Type::Invoke, 1),
            ev(1, Type::Invoke, 2),
            ev(0, Type::Ok, 3),
            ev(1, Type::Info, 4),
            ev(0, Type::Invoke, 5),
        ]);
        assert_eq!(ops.len(), 3);
        assert_eq!((ops[0].kind, ops[0].complete_ns), (Type::Ok, Some(3)));
        assert_eq!((ops[1].kind, ops[1].complete_ns), (Type::Info, None));
        assert_eq!((ops[2].kind, ops[2].complete_ns), (Type::Info, None));
    }
}
