//! The `hostile-peer` nemesis: Raft messages from outside the cluster.
//!
//! A fault sends 1-4 messages to the internal `Raft` service of random
//! nodes (the leader half the time), as anyone who can reach a node's peer
//! port can. The messages are built and sent by
//! `raftlock_testkit::hostile` (shared with the deterministic simulator):
//!
//! * `vote-far-term` / `vote-far-term-transfer`: a vote request from a
//!   node that does not exist, in a term about 2^40 ahead, with a log far
//!   longer than anyone's (the second claims a leadership transfer, which
//!   skips the followers' leader lease);
//! * `vote-max-term`: the same in term 2^64 - 2, one step from the end of
//!   the counter;
//! * `snapshot-beyond-vote`: the review's `InstallSnapshot` (finding 5;
//!   67 bytes as built here): vote (term 1000, node 1, committed),
//!   snapshot meta up to log id (term 2000, node 1, index 5) with an empty
//!   membership and no data, which openraft asserts against;
//! * `snapshot-garbage`: a far-term snapshot with the cluster's real
//!   membership whose data is random bytes;
//! * `snapshot-truncated-head`: the first message cut in half;
//! * `snapshot-aborted`: a valid head and a chunk, then the stream is reset
//!   before it ends;
//! * `append-gap`: entries of a far-future term with a hole between them,
//!   after a previous log id far beyond every node's log (so a node that
//!   took them could not truncate anything);
//! * `append-before-prev`: entries whose indexes come before the previous
//!   log id they claim to follow;
//! * `append-uncommitted`: entries under a vote nobody granted;
//! * `stream-garbage`: a `StreamAppend` of one harmless request, then
//!   bytes that are no request;
//! * `malformed`: random bytes to `Vote` or `AppendEntries`.
//!
//! A quarter of the messages carry another cluster's id
//! (`raftlock-cluster-id`), which every node must refuse with
//! `FAILED_PRECONDITION` before it decodes anything. None is a log entry a
//! real leader could have sent (a forged leader that follows the protocol
//! can rewrite an unauthenticated cluster's log by design; that is what
//! peer authentication is for, and the nemesis leaves it out).
//!
//! With `--peer-auth` the cluster authenticates its peers and every
//! message must be refused with `UNAUTHENTICATED`; the `hostile-peer`
//! check fails otherwise. Without it, the answers are recorded and the
//! other checks judge the damage: a node that exits (`node-exits`), one
//! whose core stopped behind a green health check (`no-zombie`).

use raftlock_testkit::hostile::{self, Answer};
use rand::rngs::StdRng;
use serde_json::{json, Value};

pub use raftlock_testkit::hostile::{pick, KINDS};

fn status_value(s: &tonic::Status) -> Value {
    let transport = std::error::Error::source(s).is_some();
    let text: String = s.message().chars().take(300).collect();
    json!({"code": format!("{:?}", s.code()), "message": text, "transport": transport})
}

/// What became of one message, as the history records it.
fn answer_value(a: Answer) -> Value {
    match a {
        Answer::Reply {
            reply_bytes,
            error_bytes,
        } => json!({"code": "Ok", "reply_bytes": reply_bytes, "error_bytes": error_bytes}),
        Answer::Refused(s) => status_value(&s),
        Answer::Stream {
            replies,
            ended: None,
        } => json!({"code": "Ok", "replies": replies}),
        Answer::Stream {
            replies,
            ended: Some(s),
        } => {
            let mut v = status_value(&s);
            v["replies"] = json!(replies);
            v
        }
        Answer::Aborted => json!({"code": "aborted by the sender"}),
        Answer::NoAnswer => json!({"code": "no answer in time"}),
        Answer::UnknownKind => json!({"code": "unknown message kind"}),
    }
}

/// Sends one message of `kind` to the node at `addr` of the cluster whose
/// nodes are `nodes`; returns what it did.
pub async fn send(
    kind: &str,
    addr: &str,
    nodes: &std::collections::BTreeMap<u64, String>,
    other_cluster: Option<u64>,
    rng: &mut StdRng,
) -> Value {
    let channel = crate::raw::fresh_channel(addr);
    answer_value(hostile::send(kind, channel, nodes, other_cluster, rng).await)
}

/// The `hostile-peer` check over the history's `hostile-message` events:
/// with peer authentication every message is refused `UNAUTHENTICATED`;
/// without it, one carrying another cluster's id is refused
/// `FAILED_PRECONDITION`. A message the node could not be reached for
/// (a transport error) is counted, not judged.
pub fn check(events: &[crate::history::Event]) -> (Value, Vec<Value>) {
    use crate::history::Process;
    let mut anomalies = Vec::new();
    let mut codes: std::collections::BTreeMap<String, u64> = Default::default();
    let (mut sent, mut unreachable) = (0, 0);
    for e in events
        .iter()
        .filter(|e| e.process == Process::NEMESIS && e.f == "hostile-message")
    {
        sent += 1;
        let v = &e.value;
        let code = v["outcome"]["code"].as_str().unwrap_or("?").to_string();
        *codes.entry(code.clone()).or_default() += 1;
        if v["outcome"]["transport"] == true {
            unreachable += 1;
            continue;
        }
        let expected = if v["auth"] == true {
            Some("Unauthenticated")
        } else if v["other_cluster"] == true {
            Some("FailedPrecondition")
        } else {
            None
        };
        if let Some(want) = expected.filter(|w| *w != code) {
            anomalies.push(json!({
                "checker": "hostile-peer",
                "message": format!(
                    "node {} answered a {} message{} with {code}, not {want}",
                    v["node"], v["kind"].as_str().unwrap_or("?"),
                    if v["other_cluster"] == true { " from another cluster" } else { "" },
                ),
                "time_ns": e.time_ns, "event": v,
            }));
        }
    }
    (
        json!({"valid": anomalies.is_empty(), "messages": sent, "unreachable": unreachable,
               "answers": codes}),
        anomalies,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Event, Process, Type};

    fn ev(auth: bool, other: bool, code: &str) -> Event {
        Event {
            process: Process::NEMESIS,
            kind: Type::Info,
            f: "hostile-message".into(),
            value: json!({"node": 2, "kind": "snapshot-beyond-vote", "auth": auth,
                          "other_cluster": other, "outcome": {"code": code}}),
            time_ns: 1,
        }
    }

    #[test]
    fn an_authenticated_cluster_must_refuse_every_message() {
        let (r, _) = check(&[
            ev(true, false, "Unauthenticated"),
            ev(true, true, "Unauthenticated"),
        ]);
        assert_eq!(r["valid"], json!(true));
        let (r, found) = check(&[
            ev(true, false, "Unauthenticated"),
            ev(true, false, "InvalidArgument"),
        ]);
        assert_eq!(r["valid"], json!(false));
        assert_eq!(found.len(), 1);
        assert!(found[0]["message"]
            .as_str()
            .unwrap()
            .contains("not Unauthenticated"));
    }

    #[test]
    fn another_clusters_message_must_be_refused_before_it_is_read() {
        let (r, _) = check(&[
            ev(false, true, "FailedPrecondition"),
            ev(false, false, "Ok"),
        ]);
        assert_eq!(r["valid"], json!(true));
        let (r, found) = check(&[ev(false, true, "Ok")]);
        assert_eq!(r["valid"], json!(false));
        assert!(found[0]["message"]
            .as_str()
            .unwrap()
            .contains("from another cluster"));
    }
}
