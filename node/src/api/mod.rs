//! The gRPC services: request validation, proposals through Raft, reads
//! through read-index, and the one error → status mapping ([`crate::error`]).
//!
//! Leader routing: a follower forwards requests to the leader on the
//! client port ([`forward`]), and adds the leader's address to the answer
//! (metadata `raftlock-leader`) so a client can go there directly. A
//! request it cannot forward (no leader known, or access control by client
//! certificate) it answers with `UNAVAILABLE` carrying the leader's address
//! when known; clients retry there.

pub mod backup;
pub mod batcher;
pub mod cluster;
pub mod convert;
pub mod deadline;
pub mod forward;
pub mod http;
pub mod locks;
mod oneshot;
pub mod raft_service;

use std::sync::Arc;

use crate::apply::Raft;
use crate::apply::Shared;
use crate::auth::{Auth, Caller};
use crate::error::Error;
use crate::leader::Leadership;
use crate::metrics::stages::{between, Stage};
use crate::raft::NodeId;
use crate::state::cmd::{self, Request, RestoreProgress};
use crate::state::{Command, Reply};

/// Restore parts proposed at once, in one message to Raft (1 MiB of
/// [`MAX_RESTORE_PART`]s): one replication round and one sync for all of
/// them rather than one each. Proposed one at a time, a 250,000-session
/// backup (about 200 parts) took over a minute on a loaded test machine.
///
/// [`MAX_RESTORE_PART`]: crate::state::limits::MAX_RESTORE_PART
pub const RESTORE_PARTS_IN_FLIGHT: usize = 16;

/// State shared by the public services.
pub struct ApiInner {
    /// This node's id.
    pub id: NodeId,
    /// This node's advertised address.
    pub addr: String,
    /// The Raft handle.
    pub raft: Raft,
    /// Table, waiters, leases, watch.
    pub shared: Arc<Shared>,
    /// Answers every "may I" (write, read, renew, call myself leader).
    pub leadership: Arc<Leadership>,
    /// Groups concurrent writes into one log entry.
    batcher: batcher::Batcher,
    /// Open `Watch` streams.
    pub(crate) watches: Arc<std::sync::atomic::AtomicUsize>,
    /// Access control.
    pub auth: Arc<Auth>,
    /// The cluster's id (written into backups).
    pub cluster: Arc<crate::raft::identity::ClusterIdentity>,
    /// A backup found in the data directory at start is being restored
    /// (see `node::seed_from_backup`): client writes are refused until
    /// it is over, so none makes the cluster non-empty first, which would
    /// have the restore refused and the cluster run empty.
    pub restoring: std::sync::atomic::AtomicBool,
}

/// The public services (`Locks`, `Cluster`); cheap to clone.
#[derive(Clone)]
pub struct Api(pub Arc<ApiInner>);

impl Api {
    /// Services for the node `id` at `addr`.
    pub fn new(
        id: NodeId,
        addr: String,
        raft: Raft,
        shared: Arc<Shared>,
        leadership: Arc<Leadership>,
        auth: Arc<Auth>,
        cluster: Arc<crate::raft::identity::ClusterIdentity>,
    ) -> Self {
        let metrics = shared.metrics.clone();
        Api(Arc::new(ApiInner {
            id,
            addr,
            raft: raft.clone(),
            shared,
            batcher: batcher::Batcher::start(raft, leadership.clone(), metrics),
            leadership,
            watches: Arc::default(),
            auth,
            cluster,
            restoring: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// Identifies the caller of `req` (see [`crate::auth`]).
    pub fn caller<T>(&self, req: &tonic::Request<T>) -> Result<Caller, Error> {
        Ok(self.0.auth.caller(req)?)
    }

    /// Proposes `command` and waits until it is applied here; returns its
    /// answer (refusals as errors). A reply of a kind the command never
    /// gets is a bug, answered `INTERNAL` from here.
    pub async fn write<C: Request>(&self, command: C) -> Result<C::Answer, Error> {
        Ok(self.write_indexed(command).await?.0)
    }

    /// As [`write`](Self::write), with the log index of the entry the
    /// command was applied in.
    pub async fn write_indexed<C: Request>(&self, command: C) -> Result<(C::Answer, u64), Error> {
        let (reply, index) = self.write_command(command.into()).await?;
        let answer = C::answer(reply).map_err(|other| {
            Error::Internal(format!(
                "a command was answered with {other:?}, which its kind never gets"
            ))
        })?;
        Ok((answer, index))
    }

    /// Proposes `command` and waits until it is applied here; returns the
    /// table's reply (refusals as errors) and the entry's log index.
    async fn write_command(&self, command: Command) -> Result<(Reply, u64), Error> {
        let received = tokio::time::Instant::now();
        if self.0.restoring.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Unavailable(
                "this node is restoring the backup found in its data directory; writes are \
                 refused until it is applied (nothing was proposed): retry"
                    .into(),
            ));
        }
        // A leader cut off from its quorum proposes nothing: it could not
        // commit, and another node may lead by now. Not proposed, so surely
        // not applied.
        self.0.leadership.may_write()?;
        let stages = &self.0.shared.metrics.stages;
        crate::proposals::note([&command]);
        let submit = async {
            stages.record(Stage::Receive, received.elapsed(), 1);
            self.0.batcher.submit(command).await
        };
        let (index, response, responded) = tokio::select! {
            done = submit => done?,
            _ = self.0.leadership.quorum_lost() => {
                return Err(Error::Timeout(
                    "this leader lost its quorum while the write was pending; the outcome is \
                     unknown (it may still commit): retry with the same session_id and seq"
                        .into(),
                ));
            }
        };
        let replied = tokio::time::Instant::now();
        stages.record(Stage::Reply, between(responded, replied), 1);
        stages.record(Stage::Server, between(received, replied), 1);
        match response.reply {
            Reply::Refused(refusal) => Err(refusal.into()),
            reply => Ok((reply, index)),
        }
    }

    /// Restores `backup` (a backup file, see [`backup::check`]) into the
    /// (empty) cluster: checks it, then proposes its lock table in parts of
    /// at most `MAX_RESTORE_PART` bytes, in order, [`RESTORE_PARTS_IN_FLIGHT`]
    /// at a time; the last part installs it, with its fence counter raised by `fence_bump` (`None`:
    /// the default, above the time of the restore by this node's clock,
    /// see [`default_restore_fence_bump`]). Returns the sessions
    /// restored and the fence counter.
    ///
    /// [`default_restore_fence_bump`]: crate::state::limits::default_restore_fence_bump
    pub async fn restore_backup(
        &self,
        file: &[u8],
        fence_bump: Option<u64>,
        restore_id: Option<u64>,
    ) -> Result<(u64, u64), Error> {
        use crate::state::limits::{MAX_RESTORE_BYTES, MAX_RESTORE_PART};
        if file.len() > MAX_RESTORE_BYTES {
            return Err(Error::InvalidArgument(format!(
                "a backup may be at most {MAX_RESTORE_BYTES} bytes, got {}",
                file.len()
            )));
        }
        // Refuse damaged files and garbage (checksum first), and a fence
        // bump past the fence bound, before they reach the log (the apply
        // checks the table and the bump again). Checking a large backup
        // takes a while: not on a runtime thread.
        let copy = file.to_vec();
        let (checked, copy) = crate::blocking::spawn(move || (backup::check(&copy), copy))
            .await
            .map_err(|e| Error::Internal(format!("backup check failed: {e}")))?;
        let checked =
            checked.map_err(|e| Error::InvalidArgument(format!("invalid backup: {e}")))?;
        let fence_bump = fence_bump.unwrap_or_else(|| checked.default_fence_bump_now());
        checked.table.fence_after_restore(fence_bump)?;
        // The parts carry the lock table alone, as the state machine reads
        // it; the checksum has done its work.
        let table = &copy[checked.table_range.clone()];
        drop(checked);
        // The caller's id for it (a retry names the restore it retries:
        // answered as that one was if it was installed), or one of ours.
        let restore = restore_id
            .filter(|id| *id != 0)
            .unwrap_or_else(crate::random::next_u64);
        let chunks: Vec<&[u8]> = if table.is_empty() {
            vec![table]
        } else {
            table.chunks(MAX_RESTORE_PART).collect()
        };
        let parts = u32::try_from(chunks.len())
            .map_err(|_| Error::InvalidArgument("backup too large".into()))?;
        let mut next = 0u32;
        for window in chunks.chunks(RESTORE_PARTS_IN_FLIGHT) {
            let first = next;
            next += window.len() as u32;
            let mut entries = Vec::with_capacity(window.len());
            for (bytes, part) in window.iter().zip(first..) {
                entries.push(crate::raft::Batch(vec![Command::RestorePart(
                    cmd::RestorePart {
                        restore,
                        part,
                        parts,
                        bytes: bytes.to_vec(),
                        fence_bump,
                    },
                )]));
            }
            crate::proposals::note(entries.iter().flat_map(|b| &b.0));
            let written = tokio::select! {
                written = self.write_in_order(entries) => written?,
                _ = self.0.leadership.quorum_lost() => {
                    return Err(Error::Timeout(
                        "this leader lost its quorum while the restore was under way; retry \
                         the restore with the same restore_id"
                            .into(),
                    ));
                }
            };
            for reply in written {
                match cmd::RestorePart::answer(reply) {
                    Ok(RestoreProgress::Restored {
                        sessions,
                        last_fence,
                    }) => return Ok((sessions, last_fence)),
                    Ok(RestoreProgress::Next(_)) => {}
                    Err(other) => {
                        return Err(Error::Internal(format!(
                            "a restore part was answered with {other:?}"
                        )))
                    }
                }
            }
        }
        Err(Error::Internal(
            "the last restore part did not install the backup".into(),
        ))
    }

    /// Proposes `entries` in one message to Raft, so they take log indexes
    /// in their order (the batcher's concurrent proposals may swap two
    /// batches), and waits until all are applied here. Returns each
    /// entry's single reply; the first refusal or failure as the error.
    async fn write_in_order(&self, entries: Vec<crate::raft::Batch>) -> Result<Vec<Reply>, Error> {
        use futures::StreamExt as _;
        use openraft::error::RaftError;
        self.0.leadership.may_write()?;
        self.0.leadership.wait_first_quorum().await;
        let mut results = self.0.raft.client_write_many(entries).await.map_err(|f| {
            Error::from(RaftError::<_, openraft::error::ClientWriteError<_>>::Fatal(
                f,
            ))
        })?;
        let mut replies = Vec::new();
        while let Some(result) = results.next().await {
            let written = result
                .map_err(|f| {
                    Error::from(RaftError::<_, openraft::error::ClientWriteError<_>>::Fatal(
                        f,
                    ))
                })?
                .map_err(|e| Error::from(RaftError::APIError(e)))?;
            match written.response.responses.into_iter().next() {
                Some(response) => match response.reply {
                    Reply::Refused(refusal) => return Err(refusal.into()),
                    reply => replies.push(reply),
                },
                None => {
                    return Err(Error::Internal(
                        "an entry was applied without a reply".into(),
                    ))
                }
            }
        }
        Ok(replies)
    }

    /// Fails at once if this node is stopping or its Raft core has
    /// stopped.
    pub fn check_running(&self) -> Result<(), Error> {
        self.0.leadership.check_running()
    }

    /// Waits until this node's table reflects every write committed before
    /// the call, unless `stale` (see [`Leadership::read_barrier`]).
    pub async fn read_barrier(&self, stale: bool) -> Result<(), Error> {
        self.0.leadership.read_barrier(stale).await
    }

    /// `NotLeader` with the leader this node knows of.
    pub fn not_leader(&self) -> Error {
        self.0.leadership.not_leader()
    }
}
