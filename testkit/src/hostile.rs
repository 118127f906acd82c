//! Raft messages from outside the cluster: what anyone who can reach a
//! node's peer port can send (the harness's `hostile-peer` nemesis and the
//! deterministic simulator both send them; this is their one copy). The
//! payloads are bincode of openraft 0.10's types, as the nodes' own
//! (`node/src/api/raft_service.rs`), built with the node's type
//! configuration, or bytes that are not:
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

use std::time::Duration;

use futures::StreamExt as _;
use raftlock_node::raft::{
    log_id, Entry, EntryPayload, NodeAddrs, SnapshotMeta, StoredMembership, TypeConfig, Vote,
};
use raftlock_proto::v1 as pb;
use raftlock_proto::v1::raft_client::RaftClient;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::RngExt;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

/// A node id no cluster of the harness has.
const STRANGER: u64 = 99;

/// How long one message may take to be answered.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// The message kinds.
pub const KINDS: [&str; 13] = [
    "vote-far-term",
    "vote-far-term-transfer",
    "vote-max-term",
    "snapshot-beyond-vote",
    "snapshot-garbage",
    "snapshot-truncated-head",
    "snapshot-aborted",
    "append-gap",
    "append-before-prev",
    "append-uncommitted",
    "stream-garbage",
    "malformed-vote",
    "malformed-append",
];

fn msg(data: Vec<u8>) -> pb::RaftMessage {
    pb::RaftMessage {
        data,
        error: Vec::new(),
        ..Default::default()
    }
}

fn bin<T: serde::Serialize>(v: &T) -> Vec<u8> {
    raftlock_node::codec::to_vec(v)
}

fn random_bytes(rng: &mut StdRng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.random::<u8>()).collect()
}

fn far_term(rng: &mut StdRng) -> u64 {
    (1 << 40) + rng.random_range(0..1_000_000u64)
}

fn blank(term: u64, index: u64) -> Entry {
    Entry {
        log_id: log_id(term, STRANGER, index),
        payload: EntryPayload::Blank,
    }
}

fn append(
    vote: Vote,
    prev: Option<(u64, u64)>,
    entries: Vec<Entry>,
) -> openraft::raft::AppendEntriesRequest<TypeConfig> {
    openraft::raft::AppendEntriesRequest {
        vote,
        prev_log_id: prev.map(|(t, i)| log_id(t, STRANGER, i)),
        entries,
        leader_commit: None,
    }
}

/// Adds another cluster's id to a request, if asked.
fn request<T>(body: T, other_cluster: Option<u64>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(body);
    if let Some(id) = other_cluster {
        let v: MetadataValue<_> = format!("{id:016x}").parse().expect("hex is ASCII");
        req.metadata_mut().insert("raftlock-cluster-id", v);
    }
    req
}

/// What became of one message.
#[derive(Debug)]
pub enum Answer {
    /// The node answered (a reply, or an openraft error inside the reply).
    Reply {
        /// Bytes of the reply.
        reply_bytes: usize,
        /// Bytes of the openraft error it carried.
        error_bytes: usize,
    },
    /// The node (or the transport) refused it with this status.
    Refused(tonic::Status),
    /// A `StreamAppend`: the replies read before the stream ended, and the
    /// status it ended with (`None`: it ended cleanly).
    Stream {
        /// Replies read.
        replies: usize,
        /// How it ended.
        ended: Option<tonic::Status>,
    },
    /// `snapshot-aborted`: the sender reset the stream before an answer.
    Aborted,
    /// No answer within the timeout.
    NoAnswer,
    /// A kind this module does not know.
    UnknownKind,
}

fn outcome(r: Result<tonic::Response<pb::RaftMessage>, tonic::Status>) -> Answer {
    match r {
        Ok(resp) => {
            let m = resp.into_inner();
            Answer::Reply {
                reply_bytes: m.data.len(),
                error_bytes: m.error.len(),
            }
        }
        Err(s) => Answer::Refused(s),
    }
}

/// The cluster's membership as a snapshot would carry it (every node of
/// `nodes` a voter).
fn membership(term: u64, nodes: &std::collections::BTreeMap<u64, String>) -> StoredMembership {
    let voters: std::collections::BTreeSet<u64> = nodes.keys().copied().collect();
    let addrs: std::collections::BTreeMap<u64, NodeAddrs> = nodes
        .iter()
        .map(|(&id, a)| (id, NodeAddrs::shared(a.clone())))
        .collect();
    let m = openraft::Membership::<u64, NodeAddrs>::new(vec![voters], addrs)
        .expect("every voter has an address");
    StoredMembership::new(Some(log_id(term, STRANGER, 1)), m)
}

/// Sends one message of `kind` over `channel` (to a node of the cluster
/// whose nodes are `nodes`, by id and address); returns what it did.
pub async fn send(
    kind: &str,
    channel: Channel,
    nodes: &std::collections::BTreeMap<u64, String>,
    other_cluster: Option<u64>,
    rng: &mut StdRng,
) -> Answer {
    let mut raft = RaftClient::new(channel);
    let term = far_term(rng);
    let fut = async {
        match kind {
            "vote-far-term" | "vote-far-term-transfer" | "vote-max-term" => {
                let term = if kind == "vote-max-term" {
                    u64::MAX - 1
                } else {
                    term
                };
                let mut v = openraft::raft::VoteRequest::<TypeConfig>::new(
                    Vote::new(term, STRANGER),
                    Some(log_id(term, STRANGER, 1 << 40)),
                );
                v.leadership_transfer = kind == "vote-far-term-transfer";
                outcome(raft.vote(request(msg(bin(&v)), other_cluster)).await)
            }
            "malformed-vote" => {
                let n = rng.random_range(1..64);
                outcome(
                    raft.vote(request(msg(random_bytes(rng, n)), other_cluster))
                        .await,
                )
            }
            "malformed-append" => {
                let n = rng.random_range(1..256);
                outcome(
                    raft.append_entries(request(msg(random_bytes(rng, n)), other_cluster))
                        .await,
                )
            }
            "append-gap" => {
                let base = 1u64 << 50;
                let r = append(
                    Vote::new_committed(term, STRANGER),
                    Some((term, base)),
                    vec![blank(term, base + 1), blank(term, base + 3)],
                );
                outcome(
                    raft.append_entries(request(msg(bin(&r)), other_cluster))
                        .await,
                )
            }
            "append-before-prev" => {
                let base = 1u64 << 50;
                let r = append(
                    Vote::new_committed(term, STRANGER),
                    Some((term, base)),
                    vec![blank(term, 5), blank(term, 6)],
                );
                outcome(
                    raft.append_entries(request(msg(bin(&r)), other_cluster))
                        .await,
                )
            }
            "append-uncommitted" => {
                let base = 1u64 << 50;
                let r = append(
                    Vote::new(term, STRANGER),
                    Some((term, base)),
                    vec![blank(term, base + 1)],
                );
                outcome(
                    raft.append_entries(request(msg(bin(&r)), other_cluster))
                        .await,
                )
            }
            "snapshot-beyond-vote"
            | "snapshot-garbage"
            | "snapshot-truncated-head"
            | "snapshot-aborted" => {
                let (vote, meta) = if kind == "snapshot-beyond-vote" {
                    (
                        Vote::new_committed(1000, 1),
                        SnapshotMeta {
                            last_log_id: Some(log_id(2000, 1, 5)),
                            last_membership: StoredMembership::default(),
                        },
                    )
                } else {
                    (
                        Vote::new_committed(term, STRANGER),
                        SnapshotMeta {
                            last_log_id: Some(log_id(term, STRANGER, 1 << 40)),
                            last_membership: membership(term, nodes),
                        },
                    )
                };
                let mut head = bin(&(vote, meta));
                if kind == "snapshot-truncated-head" {
                    head.truncate(head.len() / 2);
                }
                let mut messages = vec![msg(head)];
                if kind != "snapshot-beyond-vote" {
                    let n = rng.random_range(16..4096);
                    messages.push(msg(random_bytes(rng, n)));
                }
                if kind == "snapshot-aborted" {
                    // The stream never ends: the call is dropped (the
                    // HTTP/2 stream reset) once the node has had a moment
                    // to read what was sent.
                    let stream = futures::stream::iter(messages).chain(futures::stream::pending());
                    let call = raft.install_snapshot(request(stream, other_cluster));
                    match tokio::time::timeout(Duration::from_millis(300), call).await {
                        Ok(r) => outcome(r),
                        Err(_) => Answer::Aborted,
                    }
                } else {
                    let stream = futures::stream::iter(messages);
                    outcome(raft.install_snapshot(request(stream, other_cluster)).await)
                }
            }
            "stream-garbage" => {
                // A heartbeat under the smallest vote (every node rejects
                // it as stale), then bytes that are not a request.
                let first = append(Vote::new_committed(0, STRANGER), None, Vec::new());
                let n = rng.random_range(1..128);
                let messages = vec![msg(bin(&first)), msg(random_bytes(rng, n))];
                match raft
                    .stream_append(request(futures::stream::iter(messages), other_cluster))
                    .await
                {
                    Ok(answers) => {
                        let mut answers = answers.into_inner();
                        let mut replies = 0;
                        loop {
                            match answers.message().await {
                                Ok(Some(_)) => replies += 1,
                                Ok(None) => {
                                    break Answer::Stream {
                                        replies,
                                        ended: None,
                                    }
                                }
                                Err(s) => {
                                    break Answer::Stream {
                                        replies,
                                        ended: Some(s),
                                    }
                                }
                            }
                        }
                    }
                    Err(s) => Answer::Refused(s),
                }
            }
            _ => Answer::UnknownKind,
        }
    };
    match tokio::time::timeout(ANSWER_TIMEOUT, fut).await {
        Ok(v) => v,
        Err(_) => Answer::NoAnswer,
    }
}

/// Picks the messages of one fault: `(kind, target, another cluster's id)`.
pub fn pick(
    rng: &mut StdRng,
    members: &[u64],
    leader: Option<u64>,
) -> Vec<(String, u64, Option<u64>)> {
    let n = rng.random_range(1..=4);
    (0..n)
        .map(|_| {
            let kind = *KINDS.choose(rng).expect("non-empty");
            let target = match leader {
                Some(l) if rng.random_bool(0.5) => l,
                _ => *members.choose(rng).expect("members"),
            };
            let other = rng.random_bool(0.25).then(|| rng.random::<u64>() | 1);
            (kind.to_string(), target, other)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The messages decode as the node decodes them (bincode of its own
    /// openraft types).
    #[test]
    fn the_messages_are_what_the_node_reads() {
        let head = bin(&(
            Vote::new_committed(1000, 1),
            SnapshotMeta {
                last_log_id: Some(log_id(2000, 1, 5)),
                last_membership: StoredMembership::default(),
            },
        ));
        assert!(head.len() < 100, "one small message: {} bytes", head.len());
        let (vote, meta): (Vote, SnapshotMeta) = raftlock_node::codec::decode(&head).unwrap();
        assert!(vote.committed);
        assert_eq!(meta.last_log_id.unwrap().index, 5);
        let r = append(
            Vote::new_committed(7, STRANGER),
            Some((7, 10)),
            vec![blank(7, 11), blank(7, 13)],
        );
        let back: openraft::raft::AppendEntriesRequest<TypeConfig> =
            raftlock_node::codec::decode(&bin(&r)).unwrap();
        assert_eq!(back.entries.len(), 2);
    }
}
