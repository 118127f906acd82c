//! Group commit: concurrent writes share one log entry.
//!
//! Every log entry costs an append on every node, a place in an
//! `AppendEntries`, an apply and a response; one entry per request would
//! pay that per request. The batcher instead collects every request that
//! arrives while earlier batches are in flight into one [`Batch`] entry.
//! (The log store's sync thread also groups concurrent appends into one
//! sync; see `raft::log_store`.) Under light load a batch is a single
//! command and nothing waits for company.

use std::sync::Arc;
use tokio::time::Instant;

use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::apply::Raft;
use crate::error::Error;
use crate::leader::Leadership;
use crate::metrics::stages::{between, Stage};
use crate::metrics::Metrics;
use crate::raft::WatchReceiver as _;
use crate::raft::{Batch, MAX_BATCH};
use crate::state::{Command, Response};

/// Most bytes (by [`command_bytes`]) in one entry: a batch is closed before
/// a command would take it past this (a single larger command still gets
/// an entry of its own). It bounds an `AppendEntries` of
/// `MAX_PAYLOAD_ENTRIES` entries to a few MiB, which a follower can take
/// within openraft's one-heartbeat RPC budget, and keeps entries under
/// sled's blob threshold (~128 KiB) in the common case. Without it 1000
/// acquires with 4 KiB values made a 5 MB entry and a 160 MB catch-up RPC.
pub const MAX_BATCH_BYTES: usize = 128 * 1024;

/// About how many bytes `command` takes in a log entry.
pub fn command_bytes(command: &Command) -> usize {
    const FIXED: usize = 64;
    FIXED
        + match command {
            Command::OpenSessionV0(c) => c.owner.len(),
            Command::OpenSession(c) => c.owner.len(),
            Command::Lock(c) => c.open.owner.len() + c.name.as_str().len() + c.value.len(),
            Command::SetTtl(c) => c.caller.len(),
            Command::CloseSession(c) => c.caller.len(),
            Command::Acquire(c) => c.name.as_str().len() + c.value.len() + c.caller.len(),
            Command::Release(c) => c.name.as_str().len() + c.caller.len(),
            Command::Cancel(c) => c.name.as_str().len() + c.caller.len(),
            Command::ExpireSession(_) => 0,
            Command::RevokeSession(c) => c.by.len(),
            Command::TimeoutWait(c) => c.name.as_str().len(),
            Command::EndLockDelay(c) => c.name.as_str().len(),
            Command::RestorePart(c) => c.bytes.len(),
            Command::Upgrade(c) => c.name.as_str().len() + c.caller.len(),
            Command::Downgrade(c) => c.name.as_str().len() + c.caller.len(),
            Command::AcquireAll(c) => {
                c.locks
                    .iter()
                    .map(|(n, _)| n.as_str().len() + 16)
                    .sum::<usize>()
                    + c.value.len()
                    + c.caller.len()
            }
        }
}

/// Whether a command of `next` bytes still fits a batch of `len` commands
/// and `bytes` bytes.
fn fits(len: usize, bytes: usize, next: usize) -> bool {
    len < MAX_BATCH && bytes + next <= MAX_BATCH_BYTES
}

/// Most batches proposed and not yet applied at once. While all are in
/// flight, new requests queue up and form the next, larger batch.
///
/// Measured under openraft 0.9, which flushed each proposal as its own
/// entry before replicating it: two in flight did best on the benchmark
/// machine (2 cores): against four, `uncontended` +20-28 % ops/s at ~25 %
/// less node CPU per cycle, with the contended hand-off unchanged; one in
/// flight gained as much uncontended but made the hand-off ~0.4 ms slower,
/// because a release then waits for the previous holder's re-queue entry
/// to commit first.
pub const MAX_IN_FLIGHT: usize = 2;

/// Requests waiting to be batched, at most.
pub const QUEUE_DEPTH: usize = 16 * MAX_BATCH;

struct Pending {
    command: Command,
    /// When it reached the batcher.
    queued: Instant,
    reply: oneshot::Sender<Result<Written, Error>>,
}

/// A command's outcome: the log index of its entry, the table's response,
/// and when openraft handed it back (to time the reply).
pub type Written = (u64, Response, Instant);

/// Hands commands to Raft in batches.
#[derive(Clone)]
pub struct Batcher {
    tx: mpsc::Sender<Pending>,
}

impl Batcher {
    /// Starts the batching task for `raft`, timing writes into `metrics`.
    pub fn start(raft: Raft, leadership: Arc<Leadership>, metrics: Arc<Metrics>) -> Batcher {
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        tokio::spawn(run(raft, leadership, metrics, rx));
        Batcher { tx }
    }

    /// Proposes `command`; resolves with the log index of its entry and the
    /// table's response once it is applied on this node.
    pub async fn submit(&self, command: Command) -> Result<Written, Error> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Pending {
                command,
                queued: Instant::now(),
                reply,
            })
            .await
            .map_err(|_| Error::Unavailable("node shutting down".into()))?;
        rx.await
            .map_err(|_| Error::Unavailable("node shutting down".into()))?
    }
}

async fn run(
    raft: Raft,
    leadership: Arc<Leadership>,
    metrics: Arc<Metrics>,
    mut rx: mpsc::Receiver<Pending>,
) {
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    // A request that did not fit the last batch starts the next.
    let mut carry: Option<Pending> = None;
    loop {
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let first = match carry.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        let mut bytes = command_bytes(&first.command);
        let mut batch = vec![first];
        while let Ok(p) = rx.try_recv() {
            let next = command_bytes(&p.command);
            if !fits(batch.len(), bytes, next) {
                carry = Some(p);
                break;
            }
            bytes += next;
            batch.push(p);
        }
        let raft = raft.clone();
        let leadership = leadership.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let proposed = Instant::now();
            let stages = &metrics.stages;
            let mut commands = Vec::with_capacity(batch.len());
            let mut replies = Vec::with_capacity(batch.len());
            for p in batch {
                stages.record(Stage::BatchWait, between(p.queued, proposed), 1);
                commands.push(p.command);
                replies.push(p.reply);
            }
            leadership.wait_first_quorum().await;
            match raft.client_write(Batch(commands)).await {
                Ok(resp) => {
                    let responded = Instant::now();
                    let index = resp.data.index;
                    if let Some(stamps) = stages.take(index) {
                        let voters = raft
                            .metrics()
                            .borrow_watched()
                            .membership_config
                            .membership()
                            .voter_ids()
                            .count();
                        let n = replies.len() as u64;
                        stages.record_entry(&stamps, proposed, responded, voters / 2, n);
                    }
                    for (response, reply) in resp.data.responses.into_iter().zip(replies) {
                        let _ = reply.send(Ok((index, response, responded)));
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "a batch was not written");
                    let e = Error::from(e);
                    for reply in replies {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
            }
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_close_at_their_count_and_byte_limits() {
        // By count.
        assert!(fits(MAX_BATCH - 1, 0, 64));
        assert!(!fits(MAX_BATCH, 0, 64));
        // By bytes: up to the limit exactly, not one byte more.
        assert!(fits(1, MAX_BATCH_BYTES - 100, 100));
        assert!(!fits(1, MAX_BATCH_BYTES - 100, 101));
        // An acquire with a 4 KiB value: ~26 per batch instead of 1000.
        let big = Command::Acquire(crate::state::cmd::Acquire {
            session: crate::state::SessionId(1),
            seq: 1,
            name: crate::state::LockName::new("n".repeat(512)).expect("valid"),
            mode: crate::state::Mode::Exclusive,
            timeout_ms: 0,
            value: vec![0; 4096],
            caller: String::new(),
        });
        let each = command_bytes(&big);
        let mut n = 1;
        let mut bytes = each;
        while fits(n, bytes, each) {
            n += 1;
            bytes += each;
        }
        assert_eq!(n, MAX_BATCH_BYTES / each);
        assert!(n * each <= MAX_BATCH_BYTES);
    }
}
